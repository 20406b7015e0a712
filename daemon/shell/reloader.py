"""Carrying out a reload on the running pipeline: the shell of :mod:`..core.reload`'s plan.

SIGHUP and ``offbroadway reload`` come here.  The pure planner (:mod:`..core.reload`) says what
changed and refuses what cannot change live; this applies it: the rate limit and the log
level at once, a batcher's batching by a command to that batcher, a ``concurrency`` by a
resize (:mod:`.resizer`), and every new value to the stages started from now on by
adopting the new pipeline (:func:`..core.pipeline.adopt`: the tree takes the new specs, as on a
resize), so there is one way new values reach a restarted stage.
"""

from __future__ import annotations

import logging

from offbroadway.stages.wire import commands
from offbroadway.supervision import SupervisionError

from ..config.load import ConfigError, load_config
from ..config.names import batcher_id
from ..core import reload as reload_mod
from ..core import resize as resize_mod
from ..core.pipeline import PipelineState, Shell, TreeHandle, adopt
from ..core.reactions import Send
from .resizer import Resizer

log = logging.getLogger("offbroadway.daemon")


async def reload(state: PipelineState, tree: TreeHandle, shell: Shell, resizer: Resizer,
                 why: str) -> dict:
    """Re-read the config file; apply what may change live, or refuse it all (one line
    naming the key) and leave the pipeline untouched (:mod:`..core.reload`)."""
    path = state.config.path
    try:
        from_file = load_config(path).config
        # a live `scale` outlives a reload that did not change that key in the file
        new = reload_mod.keep_live(state.file_config, from_file, state.config)
        changes = reload_mod.plan(state.config, new)
    except (ConfigError, reload_mod.ReloadRefused) as exc:
        log.error("%s refused: %s", why, exc)
        return {"ok": False, "error": f"reload refused: {exc}"}
    except OSError as exc:
        log.error("%s refused: cannot read %s: %s", why, path, exc)
        return {"ok": False, "error": f"reload refused: cannot read {path}: {exc}"}
    resizes = resize_mod.requests(state.config, new)
    if resizes and (shell.stopping or state.terminator.draining):
        log.error("%s refused: the pipeline is stopping", why)
        return {"ok": False, "error": "reload refused: the pipeline is stopping"}
    batchers: set[str] = set()
    for key, _old, value in changes.changes:
        if key.endswith(".concurrency"):
            continue              # a resize, below
        if key == "producer.rate_limit":
            assert shell.rate_limit is not None
            shell.rate_limit.set(value)
        elif key == "runtime.log_level":
            logging.getLogger().setLevel(value.upper())
            log.log(logging.getLevelName(value.upper()), "log level %s (%s)", value, why)
            shell.send([Send(sid, commands.LogLevel(value)) for sid in state.topology.stages])
        else:                     # batchers.<key>.batch_size / batch_timeout
            batchers.add(key.split(".")[1])
    shell.send([Send(batcher_id(key), commands.Batching(
        new.batchers[key].batch_size, new.batchers[key].batch_timeout))
        for key in sorted(batchers)])
    if resizes:
        # the resize adopts the new pipeline, with every reloaded value in its specs
        done = await resizer.resize(new, why)
        if not done["ok"]:
            return {"ok": False, "error": f"reload: {done['error']}"}
    else:
        try:
            # stages restarted from now on start with the new values
            await adopt(state, tree, new)
        except SupervisionError:
            state.adopt(new)      # the tree is stopping: nothing starts again
    state.file_config = from_file
    log.info("%s: %s", why, changes.describe())
    return {"ok": True, "applied": changes.describe()}
