"""The live page: the running pipeline drawn as Broadway draws it, on the metrics listener.

``GET /`` is a page (HTML, JS and CSS shipped in the package, :data:`ASSETS`; nothing is
fetched from anywhere else, so it works on a machine without internet) that draws
producers → processors → batchers → batch processors → committers → Spark with each
stage's state, pid, restarts, memory and CPU, each subscription's rate and outstanding
demand, the pipeline's totals and a timeline of restarts and reloads.  It updates itself
from ``GET /api/events`` (server-sent events: one state per second, and at once when the
tree changes); ``GET /api/state`` is the same state once, as JSON.  Every other path is
the Prometheus endpoint as before.

Read-only on purpose: commands stay on the control socket, where the service user's file
permissions guard them; this listener binds localhost unless the config says otherwise,
and the state is ``status`` (URLs masked by the sources, as ``status`` shows them) plus
figures derived from it.

What it shows is what ``status --json`` answers (:meth:`Daemon.status`, computed on the
daemon's loop, where the tree lives), plus a few figures only the page needs, read from
the same places: the topology's edges and memory limits, the age of each stage's last
report (:class:`..core.status.Board`), and :mod:`.timeline`.  The HTTP threads never touch the
tree: they ask the loop (:func:`asyncio.run_coroutine_threadsafe`), and one answer serves
every viewer for :data:`FRESH` seconds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from importlib import resources
from typing import TYPE_CHECKING

from offbroadway.supervision.tree import snapshot_nodes, workers_under

from ..config.names import committer_id
from .timeline import Timeline

if TYPE_CHECKING:
    from ..core.pipeline import PipelineState

log = logging.getLogger("offbroadway.daemon.observe.web")

#: the page's files: name -> content type (nothing else is served from the package)
ASSETS = {"index.html": "text/html; charset=utf-8", "page.js": "text/javascript",
          "page.css": "text/css"}
#: seconds one computed state serves every request (several viewers cost one status)
FRESH = 0.25
#: seconds between pushes while nothing changes
PUSH_EVERY = 1.0
#: a running stage whose last report is older than this is drawn as silent (they report
#: once a second)
SILENT_AFTER = 5.0
#: nothing from outside: scripts, styles and requests only from this listener
HEADERS = [("Content-Security-Policy", "default-src 'self'; img-src 'self' data:"),
           ("X-Content-Type-Options", "nosniff"), ("Referrer-Policy", "no-referrer")]


def _asset(name: str) -> bytes:
    return resources.files("offbroadway.daemon.observe").joinpath("webpage", name).read_bytes()


def page_state(status: Callable[[], dict], state: PipelineState, timeline: Timeline) -> dict:
    """``status()`` plus what the page draws from it and the running pipeline's ``state``:
    the graph's columns and edges (with each subscription's counters as the consumer
    reported them), the totals, memory limits, report ages and the timeline.  Runs on the
    daemon's loop."""
    st = status()
    topo = state.topology
    now = time.time()
    by_id = {n["id"]: n for n in snapshot_nodes(st["tree"])}

    def msgs(sid: str) -> dict:
        return by_id.get(sid, {}).get("messages") or {}

    # the Spark server goes under the committers it serves: six columns would not fit
    columns = [("producers", topo.producers), ("processors", topo.processors),
               ("batchers", topo.batchers), ("batch processors", topo.batch_processors),
               ("committers · Spark" if topo.spark else "committers",
                topo.committers + ([topo.spark] if topo.spark else []))]
    edges = []
    for sid, spec in topo.specs.items():
        reported = msgs(sid).get("edges") or {}
        for up in spec.upstream:
            handled, demand = (reported.get(up) or [None, None])[:2]
            # into a batch processor the unit is a batch: its messages are its own "in"
            edges.append({"from": up, "to": sid, "count": handled, "demand": demand,
                          "unit": "batches" if sid in topo.batch_processors else "messages"})
    for key, bps in topo.by_batcher.items():
        committer = committer_id(key)
        if committer in topo.committers:
            edges += [{"from": bp, "to": committer, "count": msgs(bp).get("out"),
                       "demand": None, "unit": "messages"} for bp in bps]
            if topo.spark:
                edges.append({"from": committer, "to": topo.spark,
                              "count": msgs(committer).get("out"), "demand": None,
                              "unit": "rows"})
    limits = {w.id: w.memory_limit for w in workers_under(topo.root) if w.memory_limit}
    ages = {sid: round(now - s["at"], 1) for sid, s in state.board.stats.items()
            if sid in by_id}
    producers = [msgs(p) for p in topo.producers]
    sources = [p.get("source") or {} for p in producers]
    commits = [msgs(c) for c in topo.committers]
    last = max((c["last_commit"] for c in commits if c.get("last_commit")),
               key=lambda c: c["at"], default=None)
    totals = {
        "fetched": state.board.sum(topo.producers, "in"),
        "acked": st["acked"], "failed": st["failed"],
        "inflight": sum(int(p.get("inflight") or 0) for p in producers),
        "dead_letters": sum(int(s.get("dead_lettered", s.get("failed")) or 0)
                            for s in sources),
        "dead_letters_to": st.get("failed_to") or "",
        "poison_strikes": sum(int(p.get("poison_strikes") or 0) for p in producers),
        "poison_failed": sum(int(p.get("poison_failed") or 0) for p in producers),
        "commits": sum(int(c.get("commits") or 0) for c in commits) if commits else None,
        "commit_failures": sum(int(c.get("commit_failures") or 0) for c in commits),
        "last_commit": None if last is None else {
            "age": round(now - last["at"], 1), "rows": last["rows"],
            "seconds": round(last["seconds"], 3)},
    }
    return {"status": st, "now": now, "columns": [{"title": t, "ids": list(ids)}
                                                  for t, ids in columns if ids],
            "spark": topo.spark,
            "edges": edges, "limits": limits, "ages": ages, "silent_after": SILENT_AFTER,
            "totals": totals, "events": timeline.events()}


class Page:
    """The page's WSGI app in front of the metrics app.  Build it on the daemon's loop."""

    def __init__(self, status: Callable[[], dict], state: PipelineState, timeline: Timeline,
                 metrics_app: Callable) -> None:
        self.status = status
        self.pipeline = state
        self.timeline = timeline
        self.metrics_app = metrics_app
        self.loop = asyncio.get_running_loop()
        self._lock = threading.Lock()
        #: (when, timeline version, JSON): reused while fresh and nothing happened since
        self._cached: tuple[float, int, bytes] | None = None

    async def _compute(self) -> bytes:
        state = page_state(self.status, self.pipeline, self.timeline)
        return json.dumps(state, default=str).encode()

    def state(self) -> bytes:
        """The current state as JSON (computed on the loop, shared for :data:`FRESH` s
        unless the tree changed meanwhile)."""
        with self._lock:
            now, version = time.monotonic(), self.timeline.version
            cached = self._cached
            if cached is not None and now - cached[0] < FRESH and cached[1] == version:
                return cached[2]
            body = asyncio.run_coroutine_threadsafe(self._compute(), self.loop).result(10)
            self._cached = (time.monotonic(), version, body)
            return body

    def _stream(self) -> Iterator[bytes]:
        """Server-sent events: the state now, then every second or at once on a change,
        until the daemon stops (the browser reconnects by itself to a new one)."""
        seen = self.timeline.version
        yield b"retry: 1000\n\n"
        while not self.timeline.closed:
            try:
                body = self.state()
            except Exception:     # the loop is gone or too busy: end; the browser retries
                return
            yield b"data: " + body + b"\n\n"
            seen = self.timeline.wait(seen, PUSH_EVERY)

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD"), *HEADERS])
            return [b"read-only\n"]
        name = "index.html" if path in ("/", "/index.html") else path.removeprefix("/page/")
        if name in ASSETS and (path.startswith("/page/") or name == "index.html"):
            body = _asset(name)
            start_response("200 OK", [("Content-Type", ASSETS[name]),
                                      ("Content-Length", str(len(body))),
                                      ("Cache-Control", "no-cache"), *HEADERS])
            return [body]
        if path == "/api/state":
            try:
                body = self.state()
            except Exception as exc:
                start_response("503 Service Unavailable", [("Content-Type", "text/plain"),
                                                           *HEADERS])
                return [f"the daemon did not answer: {exc}\n".encode()]
            start_response("200 OK", [("Content-Type", "application/json"),
                                      ("Content-Length", str(len(body))),
                                      ("Cache-Control", "no-store"), *HEADERS])
            return [body]
        if path == "/api/events":
            start_response("200 OK", [("Content-Type", "text/event-stream"),
                                      ("Cache-Control", "no-store"), *HEADERS])
            return self._stream()
        return self.metrics_app(environ, start_response)
