from offbroadway.daemon.totals import StageTotals


def test_counts_survive_a_restart() -> None:
    t = StageTotals()
    t.report("bp", {"pid": 1, "out": 10})
    t.report("bp", {"pid": 1, "out": 25})
    t.report("bp", {"pid": 2, "out": 4})     # restarted: counts from zero again
    t.report("bp", {"pid": 2, "out": 7})
    t.report("other", {"pid": 3, "out": 1})
    assert t.total("bp", "out") == 32
    assert t.sum(["bp", "other"], "out") == 33
    assert t.total("missing", "out") == 0
