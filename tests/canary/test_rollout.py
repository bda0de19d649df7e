"""The rollout core: plans, holding, advancing, rolling back with the failing figure, resuming."""

import pytest

from kvmesh.canary.compare import Comparison, Outcome
from kvmesh.canary.rollout import Rollout, RolloutPlan, RolloutState, StepFigures, StepState
from kvmesh.canary.verdict import Thresholds
from kvmesh.canary.window import ServedCounts

T = Thresholds(min_samples=1, max_agreement_drop=0.05, max_error_rate_increase=0.1, latency_slack_s=0.0)
PLAN = RolloutPlan((0.1, 0.5, 1.0), min_samples=2)


def ok(tokens, ttft=0.1, tpot=0.01):
    return Outcome(tuple(tokens), ttft, tpot)


def figures(pairs, served=None, noise_floor=1.0):
    c = Comparison()
    for production, candidate in pairs:
        c.add_candidate(production, candidate)
    return StepFigures(c.summary(), noise_floor, 4, served or ServedCounts())


SAME = [(ok([1, 2, 3]), ok([1, 2, 3]))] * 2


def started(plan=PLAN, now=0.0, latency_comparable=True):
    rollout = Rollout.start(plan, now, latency_comparable)
    rollout.begin_step(now)
    return rollout


@pytest.mark.parametrize(("steps", "message"), [
    ((1.0,), "2 to 20 steps"),
    ((0.5, 0.2, 1.0), "must increase"),
    ((0.0, 1.0), "in (0, 1]"),
    ((0.1, 0.5), "last step must be 1.0"),
])
def test_bad_plans_are_refused(steps, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("]", r"\]")):
        RolloutPlan(steps, min_samples=1)


def test_a_step_holds_until_its_window_has_enough_samples_served_and_time():
    plan = RolloutPlan((0.1, 1.0), min_samples=2, min_seconds=10, min_served=1)
    rollout = started(plan)
    assert not rollout.judge(figures(SAME[:1]), T, now=1.0)
    assert rollout.current.reason == "holding: 1/2 samples, 0/1 served by the candidate, 1/10 s"
    assert not rollout.judge(figures(SAME, ServedCounts(candidate=1)), T, now=9.0)
    assert rollout.current.reason == "holding: 9/10 s"
    assert (rollout.current.state, rollout.current.samples, rollout.current.served) == (StepState.HOLDING, 2, 1)


def test_passing_steps_advance_and_the_last_is_the_whole_promote():
    rollout = started()
    assert rollout.judge(figures(SAME), T, now=1.0)
    assert (rollout.index, rollout.desired_weight, rollout.applied) == (1, 0.5, False)
    assert rollout.steps[0].state is StepState.PASSED
    assert not rollout.judge(figures(SAME), T, now=2.0)  # step 2 is not holding until its weight took effect
    rollout.begin_step(2.0)
    assert rollout.judge(figures(SAME), T, now=3.0)
    assert (rollout.state, rollout.desired_weight) == (RolloutState.COMPLETED, 1.0)
    assert [s.state for s in rollout.steps] == [StepState.PASSED] * 3


def test_different_tokens_roll_back_with_the_agreement_figure():
    rollout = started()
    different = [(ok([1, 2, 3, 4]), ok([1, 9, 9, 9]))] * 2
    assert rollout.judge(figures(different), T, now=1.0)
    assert (rollout.state, rollout.desired_weight, rollout.index) == (RolloutState.ROLLED_BACK, 0.0, 0)
    assert rollout.reason == "step 1 (0.1) failed: token agreement 0.250 < 0.950 (noise floor 1.000 - 0.05)"
    [agreement] = [c for c in rollout.steps[0].checks if c.name == "token_agreement"]
    assert (agreement.value, agreement.limit, agreement.passed) == (0.25, 0.95, False)


def test_errors_and_the_candidates_own_5xx_roll_back():
    rollout = started()
    failing = [(ok([1, 2]), Outcome((), 0.0, 0.0, "generate: INTERNAL"))] * 2
    rollout.judge(figures(failing), T, now=1.0)
    assert rollout.reason == "step 1 (0.1) failed: error rate 1.000 vs production 0.000 (+1.000 > 0.1)"

    rollout = started()
    served = ServedCounts(candidate=4, candidate_5xx=1, production=40, production_5xx=0)
    rollout.judge(figures(SAME, served), T, now=1.0)
    assert rollout.reason == "step 1 (0.1) failed: candidate 5xx rate 0.250 vs production 0.000 (+0.250 > 0.1)"


def test_latency_at_reduced_cpu_priority_is_shown_but_not_judged_unless_asked():
    slow = [(ok([1, 2, 3], ttft=0.1), ok([1, 2, 3], ttft=1.0))] * 2
    rollout = started(latency_comparable=False)
    assert rollout.judge(figures(slow), T, now=1.0)
    assert rollout.state is RolloutState.RUNNING
    assert rollout.steps[0].reason.startswith("passed (latency not comparable")
    [ttft] = [c for c in rollout.steps[0].checks if c.name == "ttft_p99_delta_s"]
    assert (ttft.passed, ttft.comparable, ttft.value) == (False, False, pytest.approx(0.9))

    asked = RolloutPlan((0.1, 1.0), min_samples=2, judge_latency=True)
    rollout = started(asked, latency_comparable=False)
    rollout.judge(figures(slow), T, now=1.0)
    assert rollout.state is RolloutState.ROLLED_BACK
    assert "TTFT p99 1000.0 ms > 150.0 ms" in rollout.reason


def test_abort_and_resume():
    rollout = started()
    rollout.judge(figures(SAME), T, now=1.0)
    rollout.begin_step(1.0)
    rollout.resume(now=5.0)
    assert (rollout.resumed, rollout.applied, rollout.current.state) == (1, False, StepState.PENDING)
    assert rollout.desired_weight == 0.5
    rollout.begin_step(6.0)
    assert (rollout.current.state, rollout.current.started_at) == (StepState.HOLDING, 6.0)
    rollout.abort("aborted by the operator", now=7.0)
    assert (rollout.state, rollout.desired_weight, rollout.reason) == (RolloutState.ABORTED, 0.0, "aborted by the operator")
