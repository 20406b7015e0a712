"""A handler for the resize tests: one chosen processor blocks in ``handle_message`` while
a flag file exists, so a test can hold it in the middle of leaving the pipeline."""

from __future__ import annotations

import json
import os
import time

from offbroadway import Message
from offbroadway.stages.runtime.spec import STAGE_ENV

from tests.e2e.handlers import Recorder


class HangsWhileFlagged(Recorder):
    """``context["hang_stage"]`` blocks while ``context["hang_flag"]`` exists, after saying
    so in ``<hang_flag>.hung``."""

    def __init__(self) -> None:
        self.stage = json.loads(os.environ[STAGE_ENV])["id"] if STAGE_ENV in os.environ \
            else ""

    def handle_message(self, processor: str, message: Message, context) -> Message:
        flag = context.get("hang_flag")
        if flag and self.stage == context.get("hang_stage") and os.path.exists(flag):
            with open(flag + ".hung", "w") as f:
                f.write(self.stage)
            while os.path.exists(flag):
                time.sleep(0.02)
        return super().handle_message(processor, message, context)
