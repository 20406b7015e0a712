"""``python -m offbroadway``: the ``offbroadway`` command, for when the console script is not
on ``PATH`` (a venv not activated, ``python3 -m offbroadway run CONFIG``)."""

from __future__ import annotations

import sys

from offbroadway.daemon.cli import main

if __name__ == "__main__":
    sys.exit(main())
