"""Handlers for the end-to-end tests: they record what reached each callback in files
(fsync'd before returning, so a record exists iff the callback completed).  A batch record
carries the message's delivery envelope too, its ``origin`` and ``token``: which producer
incarnation delivered it (a producer's tokens start at its start time in nanoseconds).
The envelope is the runtime's, not a handler's to read: these handlers, being the tests'
own, read it through the codec (``protocol.envelope_of``)."""

from __future__ import annotations

import json
import os

from offbroadway import Message, Pipeline
from offbroadway.stages.runtime.spec import STAGE_ENV
from offbroadway.stages.wire.protocol import envelope_of


def _append(path: str, records: list[dict]) -> None:
    with open(path, "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))
        f.flush()
        os.fsync(f.fileno())


class Recorder(Pipeline):
    """Routes each message by ``data["route"]`` (default the first batcher in context) and
    ``data["key"]``, fails messages with ``data["fail"]``, raises on ``data["raise"]``."""

    def handle_message(self, processor: str, message: Message, context) -> Message:
        data = message.data
        if isinstance(data, dict):
            if data.get("raise"):
                raise RuntimeError("boom on purpose")
            if data.get("fail"):
                return message.failed("failed on purpose")
            if context.get("slow"):
                import time
                time.sleep(context["slow"])
            message.put_batcher(data.get("route", context.get("batcher", "default")))
            message.put_batch_key(data.get("key", "default"))
        return message

    def handle_batch(self, batcher: str, messages: list[Message], batch_info, context):
        _append(os.path.join(context["out"], f"batch-{os.getpid()}.jsonl"), [{
            "id": m.id, "batcher": batcher, "batch_key": batch_info.batch_key,
            "size": batch_info.size, "trigger": batch_info.trigger, "msg_batcher": m.batcher,
            "msg_key": m.batch_key, "origin": envelope_of(m)[0], "token": envelope_of(m)[1]}
            for m in messages])
        return messages

    def handle_failed(self, messages: list[Message], context):
        _append(os.path.join(context["out"], f"failed-{os.getpid()}.jsonl"),
                [{"id": m.id, "reason": m.status} for m in messages])
        return messages


class NoBatch(Recorder):
    """For pipelines without batchers: record in handle_message itself."""

    def handle_message(self, processor: str, message: Message, context) -> Message:
        message = super().handle_message(processor, message, context)
        if message.status is None:
            _append(os.path.join(context["out"], f"handled-{os.getpid()}.jsonl"),
                    [{"id": message.id}])
        return message


def read_records(out_dir: str, prefix: str) -> list[dict]:
    """Every complete record so far.  Read while the pipeline runs, a file's last line can
    be half written (a reader may see part of a write in progress): it is left for the
    next read, not parsed."""
    records = []
    for name in sorted(os.listdir(out_dir)):
        if name.startswith(prefix):
            with open(os.path.join(out_dir, name)) as f:
                records.extend(json.loads(line) for line in f
                               if line.endswith("\n") and line.strip())
    return records


class CrashesProcess(Recorder):
    """Kills its own process on every message: a poison no callback-level catch can stop."""

    def handle_message(self, processor: str, message: Message, context) -> Message:
        os._exit(3)


class CrashesAtStart(Recorder):
    """Cannot be made in a stage process (say, a resource only the service's runtime
    lacks).  Made anywhere else (``offbroadway check``, which makes one to catch an
    ``__init__`` that always fails) it is fine: the stage's own failure is the point."""

    def __init__(self) -> None:
        if STAGE_ENV in os.environ:
            raise SystemExit(4)


class SpawnsSubprocesses(Recorder):
    """Starts ``sleep`` subprocesses from handle_message, as a handler shelling out might:
    one in the stage's process group, one in a session of its own.  Their pids go to
    ``children-<stage pid>.json`` once, so a test can look for them after the daemon dies."""

    started = False

    def handle_message(self, processor: str, message: Message, context) -> Message:
        if not self.started:
            import subprocess

            type(self).started = True
            pids = [subprocess.Popen(["sleep", "600"]).pid,
                    subprocess.Popen(["sleep", "600"], start_new_session=True).pid]
            path = os.path.join(context["out"], f"children-{os.getpid()}.json")
            with open(path + ".tmp", "w") as f:
                json.dump(pids, f)
            os.rename(path + ".tmp", path)
        return super().handle_message(processor, message, context)


class SpawnsEveryKind(Recorder):
    """Starts ``sleep`` processes from handle_message in every way a handler might, once per
    stage process: in a process group of its own, in a session of its own, as a grandchild
    under a shell that waits for it, and daemonized (a shell backgrounds ``setsid sleep``
    and exits: the sleep is orphaned at once, in a session of its own, no descendant of the
    stage any more).  ``children-<stage pid>.json`` maps each kind to its pid."""

    started = False

    def handle_message(self, processor: str, message: Message, context) -> Message:
        if not self.started:
            import subprocess

            type(self).started = True
            quiet = {"stdin": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
            grandparent = subprocess.Popen(["sh", "-c", "sleep 600 & echo $!; wait"],
                                           stdout=subprocess.PIPE, **quiet)
            daemonized = subprocess.run(
                ["sh", "-c", "setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $!"],
                capture_output=True, check=True, stdin=subprocess.DEVNULL)
            pids = {
                "own_group": subprocess.Popen(["sleep", "600"], process_group=0,
                                              **quiet).pid,
                "own_session": subprocess.Popen(["sleep", "600"], start_new_session=True,
                                                **quiet).pid,
                "grandchild": int(grandparent.stdout.readline()),
                "daemonized": int(daemonized.stdout),
            }
            path = os.path.join(context["out"], f"children-{os.getpid()}.json")
            with open(path + ".tmp", "w") as f:
                json.dump(pids, f)
            os.rename(path + ".tmp", path)
        return super().handle_message(processor, message, context)


class Contract(Recorder):
    """Broadway's callback contract, tried the way its own tests try it.

    ``data["drop"]``: prepare_messages leaves that message out of what it returns;
    ``data["exit_in"]``: ``sys.exit()`` in that callback (``prepare_messages``,
    ``handle_message``, ``handle_batch``, ``handle_failed``) when the message is in its group.
    ``context["batch_slow"]``: seconds handle_batch sleeps (a drain that lasts).
    """

    def prepare_messages(self, messages: list[Message], context) -> list[Message]:
        import sys

        if any(_exit_in(m, "prepare_messages") for m in messages):
            sys.exit(3)
        return [m for m in messages if not (isinstance(m.data, dict) and m.data.get("drop"))]

    def handle_message(self, processor: str, message: Message, context) -> Message:
        import sys

        if _exit_in(message, "handle_message"):
            sys.exit(4)
        return super().handle_message(processor, message, context)

    def handle_batch(self, batcher: str, messages: list[Message], batch_info, context):
        import sys
        import time

        if any(_exit_in(m, "handle_batch") for m in messages):
            sys.exit(5)
        if context.get("batch_slow"):
            time.sleep(context["batch_slow"])
        return super().handle_batch(batcher, messages, batch_info, context)

    def handle_failed(self, messages: list[Message], context):
        import sys

        messages = super().handle_failed(messages, context)
        if any(_exit_in(m, "handle_failed") for m in messages):
            sys.exit(6)
        return messages


def _exit_in(message: Message, callback: str) -> bool:
    return isinstance(message.data, dict) and message.data.get("exit_in") == callback


class Rebuilds(Recorder):
    """Returns messages it built itself, as users do: ``prepare_messages`` rebuilds those
    with ``data["rebuild_in"] == "prepare"``, ``handle_message`` every other one."""

    def prepare_messages(self, messages: list[Message], context) -> list[Message]:
        return [Message(m.id, {**m.data, "prepared": True}, m.metadata)
                if m.data.get("rebuild_in") == "prepare" else m for m in messages]

    def handle_message(self, processor: str, message: Message, context) -> Message:
        message = super().handle_message(processor, message, context)
        if message.data.get("rebuild_in") == "prepare":
            return message
        return (Message(message.id, {**message.data, "rebuilt": True})
                .put_batcher(message.batcher).put_batch_key(message.batch_key))
