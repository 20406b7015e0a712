"""The multiprocess metrics dir, kept bounded however many stage processes die.

prometheus-client's multiprocess mode gives every process that ever wrote a metric its own
files (``counter_<pid>.db``, ``histogram_<pid>.db``, ``gauge_livesum_<pid>.db``) and its
docs say to keep a dead process's counters: they are summed into every scrape.  A daemon
that runs for weeks restarts stages thousands of times, so that dir, and the time a scrape
takes reading it, would grow with every restart (measured: 133 files after 20 restarts of
a small pipeline).

Here, when a stage process has exited, its counters and histograms are *added into one
archive file per type* (``counter_archive.db``, ``histogram_archive.db``, ...; the
collector takes the type from the name's first part and ignores the rest for everything
but gauges) and its files are removed; its gauges are dropped (a dead process has no
current value: the ``live*`` modes already mean that, and ``mark_process_dead`` is called
as the library documents).  The sums a scrape returns are unchanged by a compaction, and
the dir holds at most one file per metric type per live process plus one archive per
counter-like type.  The archive's size grows with the label sets (stages, batchers), not
with restarts.

A scrape and a compaction never interleave: both run in the daemon process (the scrape on
the HTTP server's threads, the compaction on the loop), under one lock per dir, so a scrape
never sees a dead process's counts twice (archive and file) or not at all; either would
make Prometheus read a counter reset.  A daemon killed in the middle of a compaction
loses nothing that matters: the dir is wiped when the daemon starts.
"""

from __future__ import annotations

import json
import logging
import os
import re
import struct
import threading
from collections.abc import Iterable, Mapping

import psutil

log = logging.getLogger("offbroadway.daemon.observe.metrics")

#: ``counter_123.db``, ``histogram_123.db``, ``gauge_livesum_123.db``...
_FILE = re.compile(r"^(?P<typ>[a-z]+)_(?:(?P<mode>[a-z]+)_)?(?P<pid>\d+)\.db$")
ARCHIVE = "archive"

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def lock_for(path: str) -> threading.Lock:
    """The lock a scrape and a compaction of ``path`` share (one per dir, per process)."""
    key = os.path.realpath(path)
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


def archive_path(path: str, typ: str) -> str:
    return os.path.join(path, f"{typ}_{ARCHIVE}.db")


def pids_with_files(path: str) -> set[int]:
    """The pids that have a file in the dir (archives excluded)."""
    out = set()
    for name in _listdir(path):
        m = _FILE.match(name)
        if m:
            out.add(int(m["pid"]))
    return out


def compact(pid: int, path: str, unpublished: Mapping[str, float] | None = None) -> int:
    """Fold the files of the dead process ``pid`` into the archives; returns how many
    files were removed.  Call only once ``pid`` has exited (its supervisor reaped it):
    a live process would go on writing into a file that is gone.  ``unpublished``:
    counts the process made after its last flush, by sample name
    (``offbroadway_messages_acked_total``), added to its counters of that name."""
    from prometheus_client import multiprocess

    removed = 0
    with lock_for(path):
        try:
            multiprocess.mark_process_dead(pid, path)   # the live gauges, as documented
        except OSError:
            pass
        for name in _listdir(path):
            m = _FILE.match(name)
            if m is None or int(m["pid"]) != pid:
                continue
            file = os.path.join(path, name)
            if m["typ"] != "gauge":
                _add_into(archive_path(path, m["typ"]), file,
                          (unpublished or {}) if m["typ"] == "counter" else {})
            try:
                os.remove(file)
                removed += 1
            except FileNotFoundError:
                pass
    return removed


def sweep(path: str, live: Iterable[int] = ()) -> int:
    """Compact the files of every pid that no longer exists (a process whose exit was
    never reported, e.g. one that died while the daemon was busy restarting its tree);
    ``live`` are pids known to be running, skipped without asking the kernel."""
    keep = set(live)
    removed = 0
    for pid in pids_with_files(path) - keep:
        if not psutil.pid_exists(pid):
            removed += compact(pid, path)
    return removed


def _add_into(archive: str, file: str, extra: Mapping[str, float]) -> None:
    """Add every value of ``file`` to the same key in ``archive`` (created 0600), and
    ``extra[sample name]`` to the values of that sample."""
    from prometheus_client.mmap_dict import MmapedDict

    try:
        if os.path.getsize(file) == 0:    # killed while prometheus-client created it
            return
        values = list(MmapedDict.read_all_values_from_file(file))
    except FileNotFoundError:
        return
    except (ValueError, struct.error, UnicodeDecodeError) as exc:   # torn by a crash
        log.warning("metrics: cannot read %s of a dead process (%s); its counts are dropped",
                    file, exc)
        return
    if not values:
        return
    os.close(os.open(archive, os.O_CREAT | os.O_RDWR, 0o600))
    target = MmapedDict(archive)
    try:
        for key, value, timestamp, _ in values:
            old = target.read_value(key)   # (value, timestamp) in the versions we need
            if extra:
                value += extra.get(_sample(key)[0], 0)
            target.write_value(key, old[0] + value, timestamp)
    finally:
        target.close()


def credit(path: str, sample: str, child: str, n: float) -> bool:
    """Add ``n`` to the archived counter ``sample`` of the stage ``child``: counts a dead
    process made that the daemon learnt of only later (the acks in doubt of a killed
    producer that the broker got, known when the drain completes).  False if that counter
    has no archived series (the process never counted it)."""
    from prometheus_client.mmap_dict import MmapedDict

    archive = archive_path(path, "counter")
    with lock_for(path):
        try:
            values = list(MmapedDict.read_all_values_from_file(archive))
        except (OSError, ValueError, struct.error, UnicodeDecodeError):
            return False
        for key, value, timestamp, _ in values:
            name, labels = _sample(key)
            if name == sample and labels.get("child") == child:
                target = MmapedDict(archive)
                try:
                    target.write_value(key, value + n, timestamp)
                finally:
                    target.close()
                return True
    return False


def _sample(key: str) -> tuple[str, dict]:
    """The sample's name and labels in a multiprocess file's key (JSON: metric name,
    sample name, labels, help); ("", {}) for a key not of that shape."""
    try:
        parts = json.loads(key)
    except ValueError:
        return "", {}
    if not (isinstance(parts, list) and len(parts) > 2):
        return "", {}
    name, labels = parts[1], parts[2]
    return (name if isinstance(name, str) else "", labels if isinstance(labels, dict) else {})


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


class CompactedCollector:
    """prometheus-client's MultiProcessCollector, reading under the dir's lock.

    It also skips a file still empty: a stage starting creates its file and then sizes
    it, and the library's reader fails on the empty file in between (the whole scrape
    answered 500 when it landed in that window)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = lock_for(path)

    def collect(self) -> Iterable[object]:
        from prometheus_client.multiprocess import MultiProcessCollector

        with self._lock:
            files = []
            for name in _listdir(self.path):
                file = os.path.join(self.path, name)
                try:
                    if name.endswith(".db") and os.path.getsize(file) >= 8:
                        files.append(file)
                except FileNotFoundError:   # a live gauge of a process that just ended
                    pass
            return list(MultiProcessCollector.merge(files, accumulate=True))
