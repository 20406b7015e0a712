"""Finding the user's handler from its ``package.module:ClassName`` reference.

Every stage that runs user code loads the handler here, and ``offbroadway check``
(:func:`offbroadway.daemon.checks.check_handler`) resolves the reference the same way, so a
reference that passes ``check`` is one every stage can load.
"""

from __future__ import annotations

import importlib
from typing import Any

from offbroadway import Pipeline


def resolve(ref: str) -> Any:
    """The object ``package.module:Name`` (or ``:Outer.Inner``) names, imported with the
    process's ``sys.path`` (so ``PYTHONPATH`` is honoured)."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ValueError(f"handler {ref!r} is not 'package.module:ClassName'")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def load_handler(ref: str) -> Pipeline:
    """The handler a stage runs: :func:`resolve`, instantiated if it is a class (once per
    stage process)."""
    obj = resolve(ref)
    return obj() if isinstance(obj, type) else obj
