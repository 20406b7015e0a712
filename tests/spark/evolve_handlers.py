"""A handler whose output grows: ``c`` appears when ``context["add_c"]``; ``b`` turns from a
string into an int when ``context["b_int"]`` (a changed type)."""

from __future__ import annotations

import time

from offbroadway import Message, Pipeline


class Evolving(Pipeline):
    def handle_message(self, processor: str, message: Message, context) -> Message:
        seq = message.data["seq"]
        row = {"seq": seq, "a": seq * 2, "b": seq if context.get("b_int") else f"b{seq}"}
        if context.get("add_c"):
            row["c"] = seq * 0.5
        if context.get("slow"):
            time.sleep(context["slow"])
        return message.put_data(row).put_batcher("default")
