"""The systemd suite's handler: the example's Orders, plus a handle_batch that hangs
while ``<state_dir>/hang`` exists (a write that never returns), saying so in a warning of
its own first, and a warning logged for each failed message, so that ``journalctl -p
warning`` has something of the handler's to show."""

from __future__ import annotations

import logging
import os
import time

from examples.orders import Orders

log = logging.getLogger("svc_handler")


class Svc(Orders):
    def handle_batch(self, batcher, messages, batch_info, context):
        flag = context.get("hang_flag")
        if flag and os.path.exists(flag):
            # the handler's own line: the journal must carry it with its level
            log.warning("order %s: handle_batch hangs (%s exists)", messages[0].id, flag)
            with open(flag + ".hanging", "w") as f:
                f.write(str(os.getpid()))
            while True:            # a write that never returns, SIGTERM or not
                time.sleep(3600)
        return super().handle_batch(batcher, messages, batch_info, context)

    def handle_failed(self, messages, context):
        for m in messages:
            log.warning("order %s failed: %s", m.id, m.status)
        return messages
