"""Handler for the light-load end-to-end test: each message is a job that sleeps
``context["job_seconds"]`` and records its start, end and pid (fsync'd before returning)."""

from __future__ import annotations

import json
import os
import time

from offbroadway import Message, Pipeline


class Sleeper(Pipeline):
    def handle_message(self, processor: str, message: Message, context) -> Message:
        start = time.time()
        time.sleep(context["job_seconds"])
        record = {"id": message.id, "pid": os.getpid(), "start": start, "end": time.time()}
        with open(os.path.join(context["out"], f"jobs-{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return message


def read_jobs(out_dir: str) -> list[dict]:
    jobs = []
    for name in sorted(os.listdir(out_dir)):
        if name.startswith("jobs-"):
            with open(os.path.join(out_dir, name)) as f:
                jobs.extend(json.loads(line) for line in f if line.strip())
    return jobs


class SlowBatch(Pipeline):
    """A slow sink: ``handle_batch`` takes ``context["batch_seconds"]`` (a database, an
    HTTP API), or ``context["slow_seconds"]`` for a batch with a message whose data says
    ``slow``, and records its start, end, size and pid (fsync'd before returning)."""

    def handle_message(self, processor: str, message: Message, context) -> Message:
        return message

    def handle_batch(self, batcher: str, messages: list[Message], batch_info, context):
        start = time.time()
        slow = any(m.data.get("slow") for m in messages if isinstance(m.data, dict))
        time.sleep(context["slow_seconds"] if slow else context["batch_seconds"])
        record = {"pid": os.getpid(), "start": start, "end": time.time(),
                  "size": len(messages)}
        with open(os.path.join(context["out"], f"jobs-{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return messages
