"""The ``offbroadway`` command line: argument handling, output, and the client side of the
control socket.  Nothing else in the package imports this room; the console script
(``offbroadway.daemon.cli:main``), ``python -m offbroadway`` and
``python -m offbroadway.daemon.cli`` start here."""

from .commands import main  # noqa: F401  (the console script's entry point)
