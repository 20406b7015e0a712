from offbroadway.daemon.core.totals import StageTotals


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


def test_a_late_last_report_of_the_previous_incarnation_is_added_not_taken_as_current() -> None:
    t = StageTotals()
    t.report("producer_0", {"pid": 1, "acked": 2, "source": {"rejected": 1, "failures": 3}})
    assert t.report("producer_0", {"pid": 2, "acked": 1})
    # the first incarnation's last report, sent as it exited, arrives after its successor's
    assert not t.report("producer_0", {"pid": 1, "acked": 4,
                                       "source": {"rejected": 2, "failures": 5}})
    assert t.total("producer_0", "acked") == 5
    assert t.total("producer_0", "source.rejected") == 2
    assert t.total("producer_0", "source.failures") == 5
    assert t.report("producer_0", {"pid": 2, "acked": 3})
    assert t.total("producer_0", "acked") == 7


def test_a_pid_that_comes_back_much_later_is_a_new_incarnation() -> None:
    t = StageTotals()
    t.report("p", {"pid": 1, "acked": 2})
    for n in range(1, 6):
        t.report("p", {"pid": 2, "acked": n})
    assert t.report("p", {"pid": 1, "acked": 1})      # the pid reused by a third process
    assert t.total("p", "acked") == 2 + 5 + 1
