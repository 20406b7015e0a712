"""Handlers with long calls, for tests/e2e/test_long_handler.py.

``data["sleep"]``: seconds ``handle_message`` waits in ``time.sleep`` (an external call:
the GIL is released, the process is alive).  ``data["hold_gil"]``: seconds it spends in
libc's ``sleep`` through ``ctypes.PyDLL``, which keeps the GIL: no thread of the process
can run, the process is hung as far as anyone can tell.  Other messages are recorded as
handled, as :class:`tests.e2e.handlers.NoBatch` does.
"""

from __future__ import annotations

import ctypes
import os
import time

from offbroadway import Message

from tests.e2e.handlers import NoBatch, _append


class Slow(NoBatch):
    def handle_message(self, processor: str, message: Message, context) -> Message:
        data = message.data
        if isinstance(data, dict) and (data.get("sleep") or data.get("hold_gil")):
            _append(os.path.join(context["out"], "slow-started.jsonl"),
                    [{"id": message.id, "pid": os.getpid(), "at": time.time()}])
            if data.get("hold_gil"):
                ctypes.PyDLL(None).sleep(int(data["hold_gil"]))
            else:
                time.sleep(data["sleep"])
        return super().handle_message(processor, message, context)
