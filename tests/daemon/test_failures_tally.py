"""The failure tally: one line per interval with counts per reason, never one per message."""

from __future__ import annotations

from offbroadway.stages.runtime.failures import KEPT, FailureTally


def test_one_line_per_interval_with_counts_per_reason() -> None:
    t = FailureTally(interval=10.0)
    assert t.line(0.0, "p") is None                   # nothing failed: nothing to say
    t.add(["unknown batcher 'x'"] * 498 + ["boom", "boom"])
    line = t.line(1.0, "processor_default_0")
    assert line is not None
    assert line.startswith("processor_default_0: 500 messages failed")
    assert "498 x unknown batcher 'x'" in line and "2 x boom" in line
    t.add(["boom"])
    assert t.line(5.0, "p") is None                    # rate-limited
    line = t.line(11.0, "p")
    assert line is not None and "1 messages failed since the last report (501 in all)" in line
    assert t.line(30.0, "p") is None                   # said it all


def test_many_distinct_reasons_stay_bounded() -> None:
    t = FailureTally()
    t.add(f"bad id {i}" for i in range(10 * KEPT))
    assert len(t.counts) == KEPT + 1
    line = t.line(0.0, "p")
    assert line is not None and "more reasons" in line and len(line) < 1000
