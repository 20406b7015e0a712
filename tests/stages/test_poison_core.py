"""The pure parts of poison isolation: the strike table and the blame record.

The record is tested through a real file and mapping (it is the one thing that must
survive a process dying mid-write), including a child process that dies by SIGSEGV with a
record written: the reader gets the message it was running.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from offbroadway import Message
from offbroadway.stages.poison import blame
from offbroadway.stages.poison.guard import StrikeTable
from offbroadway.stages.wire import events as ev
from offbroadway.stages.wire import protocol
from offbroadway.stages.wire.commands import Blame, Suspect


def crash(child: str, how: str, *suspects: tuple[int, str], kind: str = "handle_message",
          frame_size: int = 1) -> Blame:
    """The blame the daemon sends a producer (index 0) after ``child`` ended ``how``."""
    return Blame(kind, tuple(Suspect(0, t, i) for t, i in suspects), frame_size, child, how)


def test_a_message_is_poison_at_the_limit_and_not_before() -> None:
    t = StrikeTable(limit=3)
    assert t.strike("m1", crash("processor_default_0", "exited with code 3")) == 1
    assert t.strike("m1", crash("processor_default_1", "killed by SIGSEGV")) == 2
    assert t.verdict("m1") is None
    assert t.strike("m1", crash("processor_default_1", "killed by SIGSEGV")) == 3
    assert t.verdict("m1") == ("poison message: killed a processor 3 times "
                               "(last: processor_default_1 killed by SIGSEGV)")
    assert t.verdict("m2") is None


def test_settled_ids_are_forgotten_and_limit_zero_records_nothing() -> None:
    t = StrikeTable(limit=2)
    t.strike("m1", crash("p", "x"))
    t.forget("m1")
    assert "m1" not in t and len(t) == 0 and not t
    t.forget("never seen")
    off = StrikeTable(limit=0)
    assert off.strike("m1", crash("p", "x")) == 0
    assert not off and off.verdict("m1") is None


def test_the_table_is_capped_oldest_first() -> None:
    t = StrikeTable(limit=3, cap=3)
    for i in range(3):
        t.strike(f"m{i}", crash("p", "x"))
    t.strike("m0", crash("p", "x"))           # m0 is now the most recent
    t.strike("m3", crash("p", "x"))           # evicts m1, the oldest
    assert set(["m0", "m2", "m3"]) == {m for m in ["m0", "m1", "m2", "m3"] if m in t}
    assert t.evicted == 1 and t.crashes("m0") == 2


@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.booleans()), max_size=200),
       st.integers(1, 4), st.integers(1, 6))
def test_counts_match_a_model_within_the_cap(ops: list[tuple[str, bool]], limit: int,
                                             cap: int) -> None:
    t = StrikeTable(limit=limit, cap=cap)
    model: dict[str, int] = {}
    for msg_id, settle in ops:
        if settle:
            t.forget(msg_id)
            model.pop(msg_id, None)
        else:
            t.strike(msg_id, crash("p", "x"))
            model[msg_id] = model.pop(msg_id, 0) + 1
            while len(model) > cap:
                del model[next(iter(model))]
        assert len(t) <= cap
        assert {m: t.crashes(m) for m in model} == model
        for m, n in model.items():
            assert (t.verdict(m) is not None) == (n >= limit)


def _msg(msg_id: str, origin: int = 0, token: int = 1) -> Message:
    """A message with a delivery envelope, as the codec gives one (the envelope is the
    runtime's: no argument of ``Message``)."""
    return protocol.address(Message(msg_id, None), origin, token)


def test_a_record_round_trips_and_idle_blames_nobody(tmp_path: Path) -> None:
    path = blame.path(str(tmp_path), "processor_default_0")
    rec = blame.BlameRecorder(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    rec.message(_msg("spool.jsonl:7", origin=2, token=1_763_000_000_000_000_123))
    got = blame.parse(Path(path).read_bytes())
    assert got == blame.Blame("handle_message", (
        blame.Suspect(2, 1_763_000_000_000_000_123, "spool.jsonl:7"),), 1)
    rec.idle()
    assert blame.parse(Path(path).read_bytes()) is None
    frame = [_msg(f"id-{i}-é", token=i) for i in range(5)]
    rec.frame(frame)
    got = blame.take(path)
    assert got is not None and got.kind == "prepare_messages" and got.frame_size == 5
    assert [s.id for s in got.suspects] == [m.id for m in frame]
    assert not os.path.exists(path), "take removes the record"
    assert blame.take(path) is None


def test_what_cannot_be_recorded_is_not_blamed(tmp_path: Path) -> None:
    path = blame.path(str(tmp_path), "p")
    rec = blame.BlameRecorder(path)
    rec.message(_msg("x" * blame.SIZE))             # an id too long for the page
    assert blame.parse(Path(path).read_bytes()) is None
    rec.message(_msg("ok", token=-1))               # a token off the wire out of range
    assert blame.parse(Path(path).read_bytes()) is None
    big = [_msg(f"{i:0100d}", token=i) for i in range(100)]
    rec.frame(big)                                  # only as many ids as fit
    got = blame.parse(Path(path).read_bytes())
    assert got is not None and got.frame_size == 100 and 0 < len(got.suspects) < 100


@given(st.binary(max_size=blame.SIZE))
def test_parse_never_raises_on_garbage(raw: bytes) -> None:
    blame.parse(raw)
    blame.parse(blame.MAGIC + raw)


def test_the_record_survives_a_segfault(tmp_path: Path) -> None:
    path = blame.path(str(tmp_path), "p")
    code = ("import ctypes, sys\n"
            "from offbroadway import Message\n"
            "from offbroadway.stages.poison import blame\n"
            "from offbroadway.stages.wire.protocol import address\n"
            "rec = blame.BlameRecorder(sys.argv[1])\n"
            "rec.message(address(Message('the-poison', None), 0, 42))\n"
            "ctypes.string_at(0)\n")
    proc = subprocess.run([sys.executable, "-c", code, path], capture_output=True, timeout=60)
    assert proc.returncode == -11, proc.stderr
    got = blame.take(path)
    assert got is not None and got.suspects == (blame.Suspect(0, 42, "the-poison"),)


def test_a_packed_frame_record_names_the_running_message_alone(tmp_path: Path) -> None:
    """A frame's packed events copied once, then a position per message: the blame is
    still one message, the one running, and a message that is not the frame's (made by
    prepare_messages) falls back to a record of its own."""
    path = blame.path(str(tmp_path), "p")
    rec = blame.BlameRecorder(path)
    evs = [[1, 1_763_000_000_000_000_000 + i, f"line-{i}", {"seq": i}, {}] for i in range(30)]
    packed = protocol.decode(protocol.events(ev.encode_rows(evs)))[3]
    messages = protocol.to_messages(protocol.open_events(packed))
    rec.events(packed, messages)
    assert blame.parse(Path(path).read_bytes()) is None       # nothing runs yet
    for i in (0, 1, 17, 29):
        rec.message(messages[i])
        assert blame.parse(Path(path).read_bytes()) == blame.Blame("handle_message", (
            blame.Suspect(1, 1_763_000_000_000_000_000 + i, f"line-{i}"),), 1)
    rec.message(_msg("made-by-prepare", origin=3, token=5))
    assert blame.parse(Path(path).read_bytes()) == blame.Blame("handle_message", (
        blame.Suspect(3, 5, "made-by-prepare"),), 1)
    rec.idle()
    assert blame.take(path) is None


def test_a_packed_frame_record_by_index_names_the_running_message(tmp_path: Path) -> None:
    """The processor's usual path: the frame's own messages in order, each one's place
    written into the record's index store (no call per message); another list of messages
    (prepare_messages made new ones, or some were dropped as failed) gets no store."""
    path = blame.path(str(tmp_path), "p")
    rec = blame.BlameRecorder(path)
    evs = [[2, 900 + i, f"line-{i}", {"seq": i}, {}] for i in range(10)]
    packed = protocol.decode(protocol.events(ev.encode_rows(evs)))[3]
    messages = protocol.to_messages(protocol.open_events(packed))
    rec.events(packed, messages)
    assert rec.indexes(list(messages)) is None               # not the frame's own list
    store = rec.indexes(messages)
    assert blame.parse(Path(path).read_bytes()) == blame.Blame("handle_message", (
        blame.Suspect(2, 900, "line-0"),), 1)
    for i in (3, 9):
        store[0] = i
        assert blame.parse(Path(path).read_bytes()) == blame.Blame("handle_message", (
            blame.Suspect(2, 900 + i, f"line-{i}"),), 1)
    rec.idle()
    assert blame.parse(Path(path).read_bytes()) is None
    assert rec.indexes(messages) is None                     # idle: the frame is over


@given(st.binary(max_size=256), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_a_torn_packed_record_blames_nobody_or_parses(body: bytes, n: int, index: int
                                                       ) -> None:
    head = blame.HEADER.pack(blame.MAGIC, blame.PACKED_MESSAGE, 0, 0)
    raw = head.ljust(blame.SIZE, b"\0") + blame.PACKED.pack(n, index) + body
    got = blame.parse(raw)
    assert got is None or len(got.suspects) == 1


def test_the_guard_strikes_isolates_quarantines_and_forgets() -> None:
    """The producer's poison core (:class:`PoisonGuard`) on the typed blame the daemon
    sends: a handle_message crash strikes its message; a redelivered suspect runs alone,
    or is kept back while quarantined; at the limit it is emitted failed; settling forgets
    it and counts the poison once."""
    from offbroadway.stages.poison.guard import PoisonGuard
    guard = PoisonGuard(max_crashes=2)
    ours = {10, 11, 12}.__contains__
    segv = crash("processor_default_0", "killed by SIGSEGV", (11, "m-b"), (99, "not-ours"))
    verdict = guard.blame(segv, ours)
    assert verdict is not None and (verdict.what, verdict.msg_id, verdict.crashes) == \
        ("struck", "m-b", 1)
    assert guard.blame(crash("p", "x", (99, "m-z")), ours) is None
    guard.requeued(quarantine=True)

    events = protocol.new_events(0, 20, [("m-a", {}, {}, "h"), ("m-b", {}, {}, "h"),
                                         ("m-c", {}, {}, "h")])
    failed: dict[int, str] = {}
    assert guard.active
    guard.mark(events, failed)
    assert guard.watch == {21: "m-b"} and failed == {}
    rest, alone, kept = guard.split(events, failed)
    assert [protocol.event_id(e) for e in rest] == ["m-a", "m-c"]
    assert alone == [] and [protocol.event_id(e) for e in kept] == ["m-b"]
    guard.release()
    rest, alone, kept = guard.split(events, failed)
    assert [protocol.event_id(e) for e in alone] == ["m-b"] and kept == []

    # the second crash on it: poison, emitted failed on its next delivery
    verdict = guard.blame(crash("processor_default_1", "exited with code 3", (12, "m-b")),
                          ours)
    assert verdict is not None and verdict.what == "poison" and verdict.crashes == 2
    guard.requeued(quarantine=False)
    again = protocol.new_events(0, 30, [("m-b", {}, {}, "h")])
    guard.mark(again, failed)
    assert failed[30].startswith("poison message: killed a processor 2 times")
    rest, alone, kept = guard.split(again, failed)
    assert len(rest) == 1 and alone == [] and kept == []      # failed: not run, not alone
    assert guard.settled([], [[30, failed[30]]], lambda t: True) == 1
    assert not guard.active and guard.watch == {} and len(guard) == 0

    # a prepare_messages frame: every message of ours isolated, none struck
    verdict = guard.blame(crash("processor_default_0", "killed", (10, "m-x"), (11, "m-y"),
                                kind="prepare_messages", frame_size=3), ours)
    assert verdict is not None and verdict.what == "isolated"
    assert guard.isolate == {"m-x", "m-y"} and not guard.strikes
    # off (max_crashes 0): nothing recorded
    assert PoisonGuard(max_crashes=0).blame(segv, ours) is None


def test_the_books_carry_a_guards_strikes_and_isolated_ids_to_its_successor(
        tmp_path: Path) -> None:
    """What a producer's crashes taught, written to its books and read by the next
    incarnation: counts, the last crash's names for the verdict, isolated ids.  A file
    that does not read is no books; the daemon's start clears them (books are per run)."""
    from offbroadway.stages.poison import books
    from offbroadway.stages.poison.guard import PoisonGuard

    guard = PoisonGuard(max_crashes=3)
    ours = {1, 2, 3}.__contains__
    guard.blame(crash("processor_default_1", "killed by SIGSEGV", (1, "m-a")), ours)
    guard.blame(crash("processor_default_0", "exited with code 3", (2, "m-a")), ours)
    guard.blame(crash("processor_default_0", "killed", (3, "m-x"), (1, "m-y"),
                      kind="prepare_messages", frame_size=2), ours)
    assert guard.revision == 3
    path = books.path(str(tmp_path), "producer_0")
    books.save(path, guard.books())
    assert os.stat(path).st_mode & 0o777 == 0o600

    successor = PoisonGuard(max_crashes=3)
    assert successor.restore(books.load(path)) == 3
    assert successor.strikes.crashes("m-a") == 2 and successor.isolate == {"m-x", "m-y"}
    successor.blame(crash("processor_default_1", "killed by SIGKILL", (7, "m-a")), {7}.__contains__)
    assert successor.strikes.verdict("m-a") == (
        "poison message: killed a processor 3 times (last: processor_default_1 killed by "
        "SIGKILL)")
    # off: nothing taken; garbage: no books, never an error
    assert PoisonGuard(max_crashes=0).restore(books.load(path)) == 0
    assert PoisonGuard(max_crashes=3).restore(
        {"strikes": [["m-a"], [1, 2, "k", "c", "h"], ["m-b", -1, "k", "c", "h"]],
         "isolate": [3, "m-z"]}) == 1
    Path(path).write_text("{not json")
    assert books.load(path) == {}
    Path(path).write_text("[1, 2]")
    assert books.load(path) == {}
    books.save(path, PoisonGuard(max_crashes=3).books())     # no books: no file
    assert not os.path.exists(path) and books.load(path) == {}
    books.save(path, guard.books())
    books.clear(str(tmp_path))
    assert not os.path.exists(path)


def test_the_producer_calls_the_guard_at_five_fixed_points(caplog) -> None:
    """The hooks the producer calls unconditionally: pass-throughs while nothing is
    suspect; a blame logs and counts itself; quarantine, release, poison and its
    settling go through the same five points."""
    import logging

    from offbroadway.stages.poison.guard import POISON_REASON, PoisonGuard

    def ours(token: object) -> bool:
        return True

    guard = PoisonGuard(max_crashes=2, stage_id="producer_0")
    failed: dict[int, str] = {}
    evs = [[0, 10, "m-a", 1, {}], [0, 11, "m-b", 2, {}]]
    guard.on_fetched(evs, failed)
    assert guard.on_dispatch(evs, failed) == (evs, [], [])
    guard.on_settled([10, 11], [], lambda t: True)
    assert (guard.struck, guard.failed, failed) == (0, 0, {})

    killed = crash("processor_default_0", "was killed", (11, "m-b"))
    with caplog.at_level(logging.WARNING, logger="offbroadway.producer"):
        guard.on_requeue(killed, True, ours)
    assert guard.struck == 1 and "message m-b was running" in caplog.text
    again = [[0, 20, "m-a", 1, {}], [0, 21, "m-b", 2, {}]]
    guard.on_fetched(again, failed)
    assert guard.on_dispatch(again, failed) == ([again[0]], [], [again[1]])   # kept back
    guard.on_release()
    assert guard.on_dispatch(again, failed) == ([again[0]], [again[1]], [])   # alone

    guard.on_requeue(crash("processor_default_0", "was killed", (21, "m-b")), False, ours)
    third = [[0, 30, "m-b", 2, {}]]
    guard.on_fetched(third, failed)
    assert failed[30].startswith(POISON_REASON) and guard.struck == 2
    guard.on_settled([], [[30, failed[30]]], lambda t: True)
    assert guard.failed == 1 and len(guard) == 0


def test_the_blame_crosses_the_wire_by_name() -> None:
    """The one blame record goes to a producer inside its requeue and comes back equal,
    every field read by name; a suspect that does not check is left out, not a crash."""
    from offbroadway.stages.wire import commands

    sent = commands.Requeue("processor_default_0 died", crash(
        "processor_default_0", "killed by SIGKILL", (7, "m7"), (8, "m8"),
        kind="prepare_messages", frame_size=4), True)
    args = sent.args()
    assert args["blame"]["suspects"][0] == {"producer": 0, "token": 7, "id": "m7"}
    assert commands.parse_command("requeue", args) == sent
    args["blame"]["suspects"].append({"producer": 0, "token": "8", "id": "m9"})
    assert commands.parse_command("requeue", args) == sent
