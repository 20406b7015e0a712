"""The pure core (restart intensity, exit actions, restart plans) against a small model of
OTP's supervisor.erl, transcribed naively: children kept newest first as OTP keeps them,
the restart history never pruned, the strategies written the way Erlang writes them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from offbroadway.supervision.intensity import RestartIntensity
from offbroadway.supervision.spec import Restart, Strategy
from offbroadway.supervision.strategy import (
    ChildView,
    ExitAction,
    exit_action,
    plan_restart,
)

times = st.lists(st.floats(min_value=0, max_value=5, allow_nan=False), max_size=40).map(
    lambda steps: [sum(steps[:i + 1]) for i in range(len(steps))])


# -- intensity ------------------------------------------------------------------------------
@given(max_r=st.integers(0, 6), period=st.floats(0.1, 20), ts=times)
def test_intensity_matches_otp(max_r, period, ts):
    """OTP: a restart at Now is refused when more than MaxR restarts (itself included) lie
    in [Now - Period, Now]."""
    impl = RestartIntensity(max_r, period)
    history: list[float] = []
    for now in ts:
        history.append(now)
        in_window = [t for t in history if t >= now - period]
        assert impl.add(now) == (len(in_window) <= max_r)


@given(period=st.floats(0.1, 20), now=st.floats(0, 1e6))
def test_max_restarts_zero_refuses_the_first(period, now):
    assert RestartIntensity(0, period).add(now) is False


def test_intensity_rejects_bad_settings_and_time_going_back():
    with pytest.raises(ValueError):
        RestartIntensity(-1, 5)
    with pytest.raises(ValueError):
        RestartIntensity(1, 0)
    r = RestartIntensity(3, 5)
    r.add(10.0)
    with pytest.raises(ValueError):
        r.add(9.0)


# -- exit actions ---------------------------------------------------------------------------
@pytest.mark.parametrize("restart, normal, action", [
    (Restart.PERMANENT, True, ExitAction.RESTART), (Restart.PERMANENT, False, ExitAction.RESTART),
    (Restart.TRANSIENT, True, ExitAction.KEEP), (Restart.TRANSIENT, False, ExitAction.RESTART),
    (Restart.TEMPORARY, True, ExitAction.DELETE), (Restart.TEMPORARY, False, ExitAction.DELETE),
])
def test_exit_action_is_otps_do_restart(restart, normal, action):
    assert exit_action(restart, normal) is action


# -- restart plans --------------------------------------------------------------------------
def otp_plan(strategy, children, failed):
    """supervisor.erl's restart/3 on a child list kept newest first."""
    newest_first = list(reversed(children))
    if strategy is Strategy.ONE_FOR_ONE:
        target = [c for c in newest_first if c.id == failed]
    elif strategy is Strategy.ONE_FOR_ALL:
        target = newest_first
    else:  # rest_for_one: split_child → {ChAfter, ChBefore}; ChAfter is the failed one and
        # every child started after it
        idx = [c.id for c in newest_first].index(failed)
        target = newest_first[:idx + 1]
    terminated, deleted = [], []
    for c in target:  # terminate_children walks the list newest first
        if c.alive:
            terminated.append(c.id)
        if c.restart is Restart.TEMPORARY and c.id != failed:
            deleted.append(c.id)
    # start_children walks it oldest first
    started = [c.id for c in reversed(target) if c.id not in deleted]
    return terminated, deleted, started


child_lists = st.lists(
    st.tuples(st.booleans(), st.sampled_from(list(Restart))), min_size=1, max_size=8
).map(lambda cs: [ChildView(f"c{i}", alive, r) for i, (alive, r) in enumerate(cs)])


@given(strategy=st.sampled_from(list(Strategy)), children=child_lists, data=st.data())
def test_plan_matches_otp(strategy, children, data):
    failed = data.draw(st.sampled_from([c.id for c in children]))
    plan = plan_restart(strategy, children, failed)
    assert (list(plan.terminate), list(plan.delete), list(plan.start)) == otp_plan(
        strategy, children, failed)


@given(strategy=st.sampled_from(list(Strategy)), children=child_lists, data=st.data())
def test_plan_invariants(strategy, children, data):
    ids = [c.id for c in children]
    failed = data.draw(st.sampled_from(ids))
    plan = plan_restart(strategy, children, failed)
    alive = {c.id for c in children if c.alive}
    # orders: terminate newest first, start oldest first
    assert list(plan.terminate) == sorted(plan.terminate, key=ids.index, reverse=True)
    assert list(plan.start) == sorted(plan.start, key=ids.index)
    assert failed in plan.start and set(plan.terminate) <= alive
    touched = set(plan.terminate) | set(plan.start) | set(plan.delete)
    later = set(ids[ids.index(failed):])
    if strategy is Strategy.ONE_FOR_ONE:
        assert touched == {failed}
    if strategy is Strategy.REST_FOR_ONE:
        assert touched <= later and set(plan.start) | set(plan.delete) == later
    if strategy is Strategy.ONE_FOR_ALL:
        assert set(plan.start) | set(plan.delete) == set(ids)
    assert not set(plan.start) & set(plan.delete)
    assert all(children[ids.index(d)].restart is Restart.TEMPORARY for d in plan.delete)


# -- a sequence of crashes through the whole pure core -----------------------------------
class OtpSupervisorModel:
    """OTP's decisions for a run of exits, with nothing shared with the implementation."""

    def __init__(self, strategy, specs, max_r, period):
        self.strategy, self.max_r, self.period = strategy, max_r, period
        self.children = [ChildView(cid, True, r) for cid, r in specs]
        self.history: list[float] = []
        self.log: list[tuple[str, str]] = []
        self.gave_up = False

    def exit(self, cid, normal, now):
        child = next(c for c in self.children if c.id == cid)
        self._set(cid, alive=False)
        if child.restart is Restart.TEMPORARY:
            self.children = [c for c in self.children if c.id != cid]
            return
        if child.restart is Restart.TRANSIENT and normal:
            return
        self.history.append(now)
        threshold = now - self.period  # OTP: keep Restart >= Now - Period
        if len([t for t in self.history if t >= threshold]) > self.max_r:
            for c in reversed(self.children):
                if c.alive:
                    self.log.append(("stop", c.id))
            self.children = [ChildView(c.id, False, c.restart) for c in self.children]
            self.gave_up = True
            return
        terminated, deleted, started = otp_plan(self.strategy, self.children, cid)
        self.log += [("stop", t) for t in terminated] + [("start", s) for s in started]
        self.children = [c for c in self.children if c.id not in deleted]
        for s in started:
            self._set(s, alive=True)
        for t in terminated:
            if t not in started:
                self._set(t, alive=False)

    def _set(self, cid, alive):
        self.children = [ChildView(c.id, alive, c.restart) if c.id == cid else c
                         for c in self.children]


class PureCore:
    """The implementation's pure pieces, composed as supervisor.py composes them."""

    def __init__(self, strategy, specs, max_r, period):
        self.strategy = strategy
        self.views = [ChildView(cid, True, r) for cid, r in specs]
        self.intensity = RestartIntensity(max_r, period)
        self.log: list[tuple[str, str]] = []
        self.gave_up = False

    def exit(self, cid, normal, now):
        view = next(v for v in self.views if v.id == cid)
        self.views = [ChildView(v.id, v.alive and v.id != cid, v.restart) for v in self.views]
        action = exit_action(view.restart, normal)
        if action is ExitAction.DELETE:
            self.views = [v for v in self.views if v.id != cid]
            return
        if action is ExitAction.KEEP:
            return
        if not self.intensity.add(now):
            self.log += [("stop", v.id) for v in reversed(self.views) if v.alive]
            self.views = [ChildView(v.id, False, v.restart) for v in self.views]
            self.gave_up = True
            return
        plan = plan_restart(self.strategy, self.views, cid)
        self.log += [("stop", t) for t in plan.terminate] + [("start", s) for s in plan.start]
        started = set(plan.start)
        self.views = [ChildView(v.id, v.id in started or (v.alive and v.id not in plan.terminate),
                                v.restart) for v in self.views if v.id not in plan.delete]


@settings(max_examples=300)
@given(strategy=st.sampled_from(list(Strategy)),
       restarts=st.lists(st.sampled_from(list(Restart)), min_size=1, max_size=6),
       max_r=st.integers(0, 5), period=st.floats(0.5, 10), data=st.data())
def test_crash_sequences_match_otp(strategy, restarts, max_r, period, data):
    specs = [(f"c{i}", r) for i, r in enumerate(restarts)]
    model = OtpSupervisorModel(strategy, specs, max_r, period)
    core = PureCore(strategy, specs, max_r, period)
    now = 0.0
    for _ in range(data.draw(st.integers(0, 25))):
        alive = [c.id for c in model.children if c.alive]
        if not alive or model.gave_up:
            break
        cid = data.draw(st.sampled_from(alive))
        normal = data.draw(st.booleans())
        now += data.draw(st.floats(0, 3))
        model.exit(cid, normal, now)
        core.exit(cid, normal, now)
        assert core.log == model.log
        assert core.gave_up == model.gave_up
        assert core.views == model.children
