"""A handler whose output the daemon fails in each of the ways a unit test used to miss:
a value the wire codec cannot carry (a ``set``, an object of its own) and a value that does
not fit the dataset's schema.  ``handle_failed`` records each failure (the line's ``seq``
and the reason) in ``context["failed_log"]``, so a run of the daemon can be compared with
:mod:`offbroadway.testing` on the same lines."""

from __future__ import annotations

import json
import os

from offbroadway import Message, Pipeline


class Thing:
    """Not something the codec carries."""


class Parity(Pipeline):
    def handle_message(self, processor: str, message: Message, context) -> Message:
        d = dict(message.data)
        kind = d.pop("kind", "ok")
        if kind == "set":
            d["tags"] = {"a", "b"}
        elif kind == "object":
            d["tags"] = Thing()
        elif kind == "tuple":
            d["tags"] = ("a", "b")        # crosses as a list
        else:
            d["tags"] = ["x"]
        return message.put_data(d).put_batcher("spark")

    def handle_failed(self, messages: list[Message], context) -> list[Message]:
        path = context.get("failed_log")
        if path:
            with open(path, "a") as f:
                for m in messages:
                    f.write(json.dumps({"seq": m.data["seq"] if isinstance(m.data, dict)
                                        else None, "status": m.status}) + "\n")
                f.flush()
                os.fsync(f.fileno())
        return messages
