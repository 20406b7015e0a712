"""``python -m offbroadway.daemon.cli``: the ``offbroadway`` command."""

import sys

from offbroadway.daemon.cli.commands import main

if __name__ == "__main__":
    sys.exit(main())
