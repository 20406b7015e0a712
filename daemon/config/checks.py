"""What ``run`` would refuse at start, checked before anything starts.

``offbroadway check`` runs :func:`preflight` after validating the file, and so does
``run`` before it creates anything: the source's own options (the source validates them,
so errors name ``producer.options.<key>``), the directories, the handler (imported the way
a stage imports it), and Spark's prerequisites.  Unlike :mod:`.load`, these look at the
machine and import user code.
"""

from __future__ import annotations

import os
from typing import Any

from offbroadway.stages.runtime.redact import mask_url

from .load import ConfigError
from .records import SOURCES, Config


def check_source(config: Config) -> list[str]:
    """Let the source validate its options, so ``check`` names ``producer.options.<key>``,
    and check what it can of them without connecting (:meth:`Source.preflight`).

    Returns the source's notes on what only a live connection can tell.
    """
    from offbroadway.stages.sources import UnknownSourceError, get_source
    from offbroadway.stages.sources.base import SourceOptionError

    name = config.producer.source
    try:
        cls = get_source(name)
    except (ImportError, UnknownSourceError) as exc:
        raise ConfigError(f"producer.source: {exc}") from None
    try:
        cls.validate_options(config.producer.options)
        if name not in SOURCES:
            _construct_source(cls, config)
        return list(cls.preflight(config.producer.options))
    except ConfigError:
        raise
    except ValueError as exc:   # SourceOptionError names the option; others may not
        option = exc.option if isinstance(exc, SourceOptionError) else None
        key = f"producer.options.{option}" if option else "producer.options"
        raise ConfigError(f"{key}: {exc}") from None
    except ImportError as exc:
        raise ConfigError(f"producer.source: {exc}") from None
    except Exception as exc:    # a user's source whose checks themselves fail
        raise ConfigError(f"producer.source: checking the options of {name} raised "
                          f"{type(exc).__name__}: {exc}") from None


def source_refused(config: Config) -> str | None:
    """For ``run``, before anything starts: the one line saying the source's server refuses
    it as configured (a wrong password, no such queue), found with one connection
    (:meth:`Source.refused`), or None.  Not part of ``check``, which never connects."""
    from offbroadway.stages.sources import get_source

    return get_source(config.producer.source).refused(config.producer.options,
                                                      pipeline=config.pipeline.name)


def nothing_to_read(config: Config) -> str | None:
    """Why ``run --until-idle`` has nothing to do, when the source can tell without
    connecting (a spool with no file to read: a second run), else None; then nothing is
    started, not even the Spark server (:meth:`Source.nothing_to_read`)."""
    from offbroadway.stages.sources import get_source

    return get_source(config.producer.source).nothing_to_read(config.producer.options)


def _construct_source(cls: type, config: Config) -> None:
    """Build one instance of a user's source the way a producer does (the Source API says a
    constructor only validates and stores), so a constructor that cannot be called with the
    producer's arguments, or that raises, is found by ``check``, not by a crash loop."""
    from offbroadway.stages.sources.base import SourceOptionError

    try:
        cls(dict(config.producer.options), pipeline=config.pipeline.name, producer_index=0,
            producer_count=config.producer.concurrency, state_dir=config.runtime.state_dir)
    except SourceOptionError:
        raise
    except Exception as exc:
        raise ConfigError(f"producer.source: {config.producer.source}(options, ...) raised "
                          f"{type(exc).__name__}: {exc}") from None


def _check_dir(key: str, path: str) -> None:
    """``path`` is a directory we can use, or can be created as one (nothing is created)."""
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        what = "is a file, not a directory" if probe == path else \
            f"cannot be created: {probe!r} is a file, not a directory"
        raise ConfigError(f"{key}: {path!r} {what}")
    if not os.access(probe, os.W_OK | os.X_OK):
        what = "is not writable" if probe == path else \
            f"cannot be created: no write permission on {probe!r}"
        raise ConfigError(f"{key}: {path!r} {what} (uid {os.getuid()})")


def _module_available(name: str) -> bool:
    import importlib.util
    import sys

    if name in sys.modules:
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def find_java() -> str | None:
    """The ``java`` the local Spark server will exec (``$JAVA_HOME/bin/java``, else PATH)."""
    import shutil

    home = os.environ.get("JAVA_HOME")
    if home:
        java = os.path.join(home, "bin", "java")
        return java if os.access(java, os.X_OK) else None
    return shutil.which("java")


def check_spark(config: Config) -> list[str]:
    """pyspark importable, and Java for a local server: the batch processors and the Spark
    child fail at start without them."""
    if config.spark is None:
        return []
    if not _module_available("pyspark"):
        raise ConfigError("spark: pyspark is not installed (pip install 'offbroadway[spark]')")
    if config.spark.remote:
        return [f"Spark Connect at {mask_url(config.spark.remote)} is not contacted by "
                f"check: whether it is reachable shows only when the daemon runs"]
    if find_java() is None:
        where = (f"JAVA_HOME={os.environ['JAVA_HOME']} has no bin/java"
                 if os.environ.get("JAVA_HOME") else "no java on PATH and JAVA_HOME is unset")
        raise ConfigError(f"spark: the local Spark server needs Java 17 or later ({where})")
    return []


def _check_private(key: str, path: str) -> None:
    """An existing runtime dir must be ours and closed to others: the sockets that steer
    the daemon live there (the daemon refuses it at start too, ``runlock.prepare_private_dir``)."""
    import stat

    if not os.path.isdir(path):
        return
    st = os.stat(path)
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(f"{key}: {path!r} is writable by group/others (mode "
                          f"{stat.S_IMODE(st.st_mode):o}); refusing to start: chmod 700 it")
    if st.st_uid != os.getuid():
        raise ConfigError(f"{key}: {path!r} belongs to uid {st.st_uid}, not {os.getuid()}")


def preflight(config: Config) -> list[str]:
    """Everything ``run`` would refuse at start that can be known without starting it,
    in the order ``run`` meets it: ``check`` runs this, and so does ``run`` before it
    creates anything.  Returns notes on what only a running daemon can tell."""
    _check_dir("runtime.dir", config.runtime.dir)
    _check_private("runtime.dir", config.runtime.dir)
    _check_dir("runtime.state_dir", config.runtime.state_dir)
    notes = check_source(config)
    _check_spool_not_in_its_state(config)
    check_handler(config)
    notes += check_spark(config)
    return notes


def _check_spool_not_in_its_state(config: Config) -> None:
    """A spool reading ``<state_dir>/spool`` would read its own ``dead-letter.jsonl`` (and
    ack records) back as input: every failed line failed again, forever."""
    if config.producer.source != "spool" or not isinstance(config.producer.options.get("path"),
                                                           str):
        return
    path = os.path.abspath(config.producer.options["path"])
    own = os.path.join(os.path.abspath(config.runtime.state_dir), "spool")
    if path == own:
        raise ConfigError(f"producer.options.path: {path!r} is where the spool keeps its own "
                          f"records and dead-letter.jsonl (runtime.state_dir + '/spool'); "
                          f"use another directory for the input")


def check_handler(config: Config) -> None:
    """Import ``pipeline.handler`` the way a stage will, so ``check`` catches a typo."""
    from offbroadway.stages.runtime.handler import resolve

    ref = config.pipeline.handler
    try:
        obj: Any = resolve(ref)
    except Exception as exc:
        raise ConfigError(f"pipeline.handler: cannot load {ref!r}: "
                          f"{type(exc).__name__}: {exc}") from None
    if not callable(getattr(obj, "handle_message", None)):
        raise ConfigError(f"pipeline.handler: {ref!r} has no handle_message")
    if isinstance(obj, type):
        # every stage makes one (offbroadway.stages.runtime.handler.load_handler): an __init__ that
        # raises would crash them all in a restart loop
        try:
            obj()
        except (Exception, SystemExit) as exc:    # sys.exit() in __init__ too
            raise ConfigError(f"pipeline.handler: {ref}() raised {type(exc).__name__}: "
                              f"{exc}") from None
