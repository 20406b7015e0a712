"""The control vocabulary between the daemon and the stages: every command and report, once.

The daemon commands stages and stages report to it over the hub, in COMMAND and REPORT
frames (:func:`command`, :func:`report`; the frame is :mod:`.frames`').  Each command and
each report is a frozen record here, with its arguments typed; both sides import this
module (it lives under ``stages/`` because stages must not import the daemon), so a
command the daemon sends is a command a stage knows, with the arguments it takes, or the
type checker says so.  A stage accepts the commands of its role
(:meth:`offbroadway.stages.runtime.stage.Stage.accept`); a command it does not accept, or
one whose arguments do not check (a daemon of another version), is logged and ignored,
never a crash.

Adding a command (``scale``, say): a record below with its ``NAME`` and fields, an
``accept`` in the stages that take it, and the daemon sends it with ``hub.send``.

Commands (daemon → stage):

==================  ==================  ==============================================
record              to                  why
==================  ==================  ==============================================
Shutdown            producers           the drain: stop fetching, flush, cancel consumers
NoResubscribe       producers' consumers  the drain: a restarted producer is not
                                        subscribed to again (Broadway's terminator)
Resubscribe         a stage's consumers  that upstream restarted: subscribe afresh (the
                                        one path; in the drain, it is done instead)
Requeue             producers           a crash cascade lost what it held: hand every
                                        message in flight back to the source (with the
                                        crash's :class:`Blame`, if any)
Redelivery          committers          the sources take back what was in flight (a
                                        producer restarts, the live ones requeue, or a
                                        source lost its broker connection):
                                        copies of committed messages may come again
ReleaseSuspects     producers           the processors are back: quarantined suspects
                                        may run
Pause / Resume      producers           the operator's pause (``offbroadway drain``) / resume
Flush               batchers            the operator's pause: partial batches now
Batching            batchers            reload: new batch_size / batch_timeout
LogLevel            every stage         reload: new runtime.log_level
Leave               processors, batch   a resize removes it: cancel its subscriptions,
                    processors          finish what it holds, report Left
Subscribe           batchers            a resize added a processor: subscribe to it
Window              producers           a resize changed the auto prefetch window
Reconcile           producers           messages in its source's failure books were
                                        settled, or failed again, on a sibling producer
==================  ==================  ==============================================

Reports (stage → daemon): :class:`Hello` (up, with its pid), :class:`Stats` (every tick),
:class:`Idle` (a producer's source has nothing more, or again), :class:`Done` (a stage
that finishes messages has finished everything: the drain's first wait), :class:`Settled`
(a draining producer has nothing in flight: the drain's second wait), :class:`Left` (a
stage a resize removes has finished and forwarded everything it held: it may be stopped),
:class:`TakenBack` (a producer's source took back what was in flight: a lost broker
connection).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

from .frames import COMMAND, REPORT, frame

#: field positions in a decoded COMMAND or REPORT frame
COMMAND_NAME, COMMAND_ARGS = 1, 2
REPORT_NAME, REPORT_BODY = 1, 2


def command(name: str, args: dict | None = None) -> bytes:
    """COMMAND (daemon → stage): a command's name and its arguments."""
    return frame(COMMAND, name, args or {})


def report(name: str, body: dict | None = None) -> bytes:
    """REPORT (stage → daemon): a report's name and its body (``stats``, ``idle``…)."""
    return frame(REPORT, name, body or {})


class BadCommand(ValueError):
    """A command or report that is not of this vocabulary, or whose arguments do not check."""


# -- the poison contract ------------------------------------------------------------------
class Suspect(NamedTuple):
    """One message a dead processor was running: the index of the producer that emitted
    it, its token there (per delivery) and its id (what survives a redelivery)."""

    producer: int
    token: int
    id: str


@dataclass(frozen=True)
class Blame:
    """What a processor that died on its own was running: the one record of that fact, from
    the processor's blame file (:mod:`offbroadway.stages.poison.blame`, where ``child`` and
    ``how`` are not known yet) through the daemon (which adds them and gives each producer
    its own suspects, :meth:`of`) to the producer's strike table
    (:mod:`offbroadway.stages.poison.guard`).

    ``kind`` is the callback it died in (``handle_message``: one message is struck;
    ``prepare_messages``: the frame's messages each run alone next time); ``frame_size``
    may exceed ``len(suspects)`` when a frame's ids did not all fit the blame record;
    ``child`` is the processor and ``how`` how it ended (``killed by SIGSEGV``).
    """

    kind: str
    suspects: tuple[Suspect, ...]
    frame_size: int
    child: str = ""
    how: str = ""

    def crashed(self, child: str, how: str) -> Blame:
        """This record, said of the processor ``child`` that ended ``how``."""
        return dataclasses.replace(self, child=child, how=how)

    def of(self, producer: int) -> Blame:
        """The part of this blame that concerns one producer (its own suspects)."""
        return dataclasses.replace(
            self, suspects=tuple(s for s in self.suspects if s.producer == producer))

    def to_wire(self) -> dict[str, Any]:
        """Every field by name (suspects too), so neither side depends on an order."""
        return {"child": self.child, "how": self.how, "kind": self.kind,
                "frame_size": self.frame_size,
                "suspects": [s._asdict() for s in self.suspects]}

    @classmethod
    def from_wire(cls, raw: object) -> Blame:
        """The record :meth:`to_wire` sent; a suspect that does not check is left out, a
        blame that does not check raises :class:`BadCommand`."""
        if not isinstance(raw, dict):
            raise BadCommand("blame is not a map")
        try:
            child, how, kind = str(raw["child"]), str(raw["how"]), str(raw["kind"])
            frame_size, suspects = raw["frame_size"], raw["suspects"]
        except KeyError as exc:
            raise BadCommand(f"blame without {exc}") from None
        if not isinstance(frame_size, int) or not isinstance(suspects, list):
            raise BadCommand("blame's frame_size or suspects of the wrong type")
        return cls(kind, tuple(s for s in map(_suspect, suspects) if s is not None),
                   frame_size, child, how)


def _suspect(raw: object) -> Suspect | None:
    """A suspect off the wire, read by name; None if it does not check."""
    if not isinstance(raw, dict):
        return None
    producer, token, msg_id = raw.get("producer"), raw.get("token"), raw.get("id")
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in (producer, token)):
        return None
    if not isinstance(msg_id, str):
        return None
    return Suspect(producer, token, msg_id)  # type: ignore[arg-type]


# -- commands ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Command:
    """A command of the vocabulary (subclasses name it and type its arguments)."""

    NAME: ClassVar[str] = ""

    def args(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def encode(self) -> bytes:
        return command(self.NAME, self.args())

    @classmethod
    def from_args(cls, args: dict) -> Command:
        return cls(**_checked(cls, args))


@dataclass(frozen=True)
class Shutdown(Command):
    NAME: ClassVar[str] = "shutdown"


@dataclass(frozen=True)
class NoResubscribe(Command):
    NAME: ClassVar[str] = "no_resubscribe"


@dataclass(frozen=True)
class Resubscribe(Command):
    NAME: ClassVar[str] = "resubscribe"
    upstream: str


@dataclass(frozen=True)
class Requeue(Command):
    NAME: ClassVar[str] = "requeue"
    reason: str = ""
    #: the crash that lost these messages names one of this producer's (None: no blame)
    blame: Blame | None = None
    #: keep suspects back until :class:`ReleaseSuspects` (the processors are restarting)
    quarantine: bool = False

    def args(self) -> dict[str, Any]:
        return {"reason": self.reason, "quarantine": self.quarantine,
                "blame": self.blame.to_wire() if self.blame is not None else None}

    @classmethod
    def from_args(cls, args: dict) -> Command:
        raw = dict(args)
        blame = raw.pop("blame", None)
        checked = _checked(cls, raw, skip=("blame",))
        return cls(blame=Blame.from_wire(blame) if blame is not None else None, **checked)


@dataclass(frozen=True)
class Redelivery(Command):
    """The sources take back what was in flight (a producer restarts: its source takes
    back what it held; or the live producers requeue what a crash lost), while the stages
    that live on may still hold copies of some of it: a committer puts what it committed
    lately, and what it commits next, in doubt (docs/design-spark.md §5)."""

    NAME: ClassVar[str] = "redelivery"
    reason: str = ""


@dataclass(frozen=True)
class ReleaseSuspects(Command):
    NAME: ClassVar[str] = "release_suspects"


@dataclass(frozen=True)
class Pause(Command):
    NAME: ClassVar[str] = "pause"


@dataclass(frozen=True)
class Resume(Command):
    NAME: ClassVar[str] = "resume"


@dataclass(frozen=True)
class Flush(Command):
    NAME: ClassVar[str] = "flush"


@dataclass(frozen=True)
class Batching(Command):
    NAME: ClassVar[str] = "batching"
    batch_size: int
    batch_timeout: float

    def __post_init__(self) -> None:
        if self.batch_size <= 0 or self.batch_timeout <= 0:
            raise BadCommand("batch_size and batch_timeout must be > 0")


@dataclass(frozen=True)
class LogLevel(Command):
    NAME: ClassVar[str] = "log_level"
    level: str

    def __post_init__(self) -> None:
        if self.level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise BadCommand(f"unknown log level {self.level!r}")


@dataclass(frozen=True)
class Leave(Command):
    NAME: ClassVar[str] = "leave"


@dataclass(frozen=True)
class Subscribe(Command):
    NAME: ClassVar[str] = "subscribe"
    upstream: str


@dataclass(frozen=True)
class Window(Command):
    """The source's window of unsettled messages (``auto_prefetch``) for the new shape."""

    NAME: ClassVar[str] = "window"
    prefetch: int

    def __post_init__(self) -> None:
        if self.prefetch < 1:
            raise BadCommand("prefetch must be at least 1")


#: kinds of a source's failure-book note (``Source.take_notes``), carried in a producer's
#: report as ``stats["notes"]``: ``[kind, digest, when]``
NOTE_FAILED, NOTE_SETTLED = 0, 1


@dataclass(frozen=True)
class Reconcile(Command):
    """What left a producer's failure books on a sibling producer, as ``[digest, when]``
    pairs (``when``: ``time.monotonic()``, one clock for the processes of a host):
    ``settled`` messages were acked or rejected there since, ``moved`` ones failed again
    there (still failing, counted by the sibling)."""

    NAME: ClassVar[str] = "reconcile"
    settled: list = field(default_factory=list)
    moved: list = field(default_factory=list)

    def __post_init__(self) -> None:
        for pairs in (self.settled, self.moved):
            if not isinstance(pairs, list) or not all(
                    isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], int)
                    and isinstance(p[1], (int, float)) for p in pairs):
                raise BadCommand("reconcile: settled and moved are [digest, when] pairs")


COMMANDS: dict[str, type[Command]] = {c.NAME: c for c in (
    Shutdown, NoResubscribe, Resubscribe, Requeue, Redelivery, ReleaseSuspects, Pause,
    Resume, Flush, Batching, LogLevel, Leave, Subscribe, Window, Reconcile)}


def parse_command(name: object, args: object) -> Command:
    """The command a COMMAND frame carries, or :class:`BadCommand`."""
    cls = COMMANDS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise BadCommand(f"unknown command {name!r}")
    if not isinstance(args, dict):
        raise BadCommand(f"command {name!r}: arguments are not a map")
    return cls.from_args(args)


# -- reports ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Report:
    """A report of the vocabulary."""

    NAME: ClassVar[str] = ""

    def encode(self) -> bytes:
        return report(self.NAME, {f.name: getattr(self, f.name)
                                  for f in dataclasses.fields(self)})

    @classmethod
    def from_body(cls, body: dict) -> Report:
        return cls(**_checked(cls, body))


@dataclass(frozen=True)
class Hello(Report):
    """The stage is up (sent before it tells its supervisor it is ready)."""

    NAME: ClassVar[str] = "hello"
    pid: int


@dataclass(frozen=True)
class Stats(Report):
    """The stage's counters, every tick (what ``status`` and the totals show)."""

    NAME: ClassVar[str] = "stats"
    stats: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Idle(Report):
    """A producer's source has nothing more to give (or has again): ``--until-idle``."""

    NAME: ClassVar[str] = "idle"
    idle: bool


@dataclass(frozen=True)
class Done(Report):
    """A finisher (a stage that acks and that nothing consumes: a processor without
    batchers, a batch processor) has seen every upstream cancel and finished everything it
    held: its final counters.  The drain's terminator waits for it; a stage with consumers
    says nothing, its cancel to them carries the end on."""

    NAME: ClassVar[str] = "done"
    stats: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Settled(Report):
    """A draining producer has nothing in flight any more: its final counters."""

    NAME: ClassVar[str] = "settled"
    stats: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Left(Report):
    """A stage a resize removes cancelled its subscriptions, finished what it held and sent
    it on: the daemon may stop it (a planned stop, nothing requeued).  Its final counters."""

    NAME: ClassVar[str] = "left"
    stats: dict = field(default_factory=dict)


@dataclass(frozen=True)
class TakenBack(Report):
    """A producer's source took back every message it had in flight on its own, the
    producer living on (a lost broker connection: the broker delivers again whatever was
    unacknowledged), while copies of some are still on their way downstream: the daemon
    tells the committers (:class:`Redelivery`), as when a producer restarts."""

    NAME: ClassVar[str] = "taken_back"
    reason: str


REPORTS: dict[str, type[Report]] = {r.NAME: r for r in (Hello, Stats, Idle, Done, Settled,
                                                          Left, TakenBack)}


def parse_report(name: object, body: object) -> Report:
    """The report a REPORT frame carries, or :class:`BadCommand`."""
    cls = REPORTS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise BadCommand(f"unknown report {name!r}")
    if not isinstance(body, dict):
        raise BadCommand(f"report {name!r}: body is not a map")
    return cls.from_body(body)


# -- checking ---------------------------------------------------------------------------------
_SIMPLE = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,),
           "dict": (dict,)}


def _checked(cls: type, args: dict, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """``args`` if they are exactly ``cls``'s fields, each of its declared simple type."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in skip}
    unknown = set(args) - set(fields)
    if unknown:
        raise BadCommand(f"{cls.NAME}: unknown arguments {sorted(unknown)}")
    for name, f in fields.items():
        if name not in args:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise BadCommand(f"{cls.NAME}: missing argument {name!r}")
            continue
        types = _SIMPLE.get(str(f.type))
        value = args[name]
        if types is not None and (not isinstance(value, types) or
                                  (bool not in types and isinstance(value, bool))):
            raise BadCommand(f"{cls.NAME}: {name} must be {f.type}, not {value!r}")
    return args

