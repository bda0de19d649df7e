"""The canary state: intake validation, jobs, promote/rollback generations, the report."""

import pytest

from kvmesh.canary.buffer import Admission, MirrorBuffer
from kvmesh.canary.compare import Outcome
from kvmesh.canary.records import check_record, content_key, production_outcome, record_size
from kvmesh.canary.state import CanaryState, Pools
from kvmesh.canary.verdict import Thresholds, Verdict
from kvmesh.runtime.pb import events_pb2

from .records import mirror_record

POOLS = Pools(production="production", candidate="candidate")


def new_state(max_records=8, min_samples=2):
    return CanaryState(POOLS, Thresholds(min_samples=min_samples), MirrorBuffer(1 << 20, max_records))


def test_record_checks():
    assert check_record(mirror_record()) is None
    assert check_record(mirror_record(request_id="")) == "missing request_id"
    assert check_record(mirror_record(prompt=())) == "empty prompt"
    no_sampling = mirror_record()
    no_sampling.ClearField("sampling")
    assert check_record(no_sampling) == "missing sampling parameters"


def test_content_key_covers_prompt_and_sampling_only():
    assert content_key(mirror_record("a")) == content_key(mirror_record("b", output=(9,)))
    assert content_key(mirror_record(prompt=(1, 2))) != content_key(mirror_record(prompt=(1, 3)))
    assert content_key(mirror_record(seed=1)) != content_key(mirror_record(seed=2))


def test_record_size_and_production_outcome():
    record = mirror_record()
    assert record_size(record) == record.ByteSize() + 256
    assert production_outcome(record) == Outcome((4, 5, 6), 0.1, 0.01, "")


def test_malformed_records_are_counted_and_dropped():
    state = new_state()
    assert state.offer(events_pb2.MirrorRecord()) is None
    assert state.offer(mirror_record(prompt=())) is None
    report = state.report(undecodable=3)
    assert (report.received, report.malformed, report.buffered) == (2, 5, 0)


def test_jobs_carry_pools_and_production_outcome():
    state = new_state()
    assert state.offer(mirror_record("a")) is Admission.ACCEPTED
    job = state.next_job()
    assert (job.pools, job.generation, job.production.token_ids) == (POOLS, 0, (4, 5, 6))
    assert state.next_job() is None


def test_full_buffer_drops_are_in_the_report():
    state = new_state(max_records=1)
    state.offer(mirror_record("a", prompt=(1,)))
    assert state.offer(mirror_record("b", prompt=(2,))) is Admission.FULL
    assert state.offer(mirror_record("a", prompt=(1,))) is Admission.DUPLICATE
    report = state.report()
    assert (report.received, report.dropped, report.duplicates, report.buffered) == (3, 1, 1, 1)


def test_verdict_follows_recorded_outcomes():
    state = new_state(min_samples=2)
    for rid, prompt in (("a", (1,)), ("b", (2,))):
        state.offer(mirror_record(rid, prompt=prompt))
        job = state.next_job()
        assert state.record_candidate(job, Outcome((4, 5, 6), 0.1, 0.01))
    report = state.report()
    assert (report.decision.verdict, report.summary.samples, report.summary.token_agreement) == (Verdict.PASS, 2, 1.0)


def test_promote_swaps_pools_and_starts_over():
    state = new_state(min_samples=1)
    state.offer(mirror_record("a"))
    stale = state.next_job()
    state.record_candidate(stale, Outcome((4, 5, 6), 0.1, 0.01))
    assert state.promote() == Pools(production="candidate", candidate="production")
    report = state.report()
    assert (report.decision.verdict, report.summary.samples) == (Verdict.COLLECTING, 0)
    assert state.record_candidate(stale, Outcome((4,), 0.1, 0.01)) is False
    assert state.record_noise(stale, Outcome((4,), 0.1, 0.01)) is False


def test_rollback_restores_configured_pools():
    state = new_state()
    state.promote()
    assert state.rollback() == POOLS
    assert state.generation == 2
    assert state.rollback() == POOLS
    assert state.generation == 2  # already there: nothing restarts


def test_pools_must_differ():
    with pytest.raises(ValueError, match="must differ"):
        CanaryState(Pools("p", "p"), Thresholds(), MirrorBuffer(10, 1))


def test_stepwise_promote_keeps_pools_and_comparison_and_skips_what_the_candidate_served():
    state = new_state(min_samples=1)
    state.offer(mirror_record("a"))
    job = state.next_job()
    assert state.promote(0.3) == POOLS
    assert state.record_candidate(job, Outcome((4, 5, 6), 0.1, 0.01))  # same generation: still counts
    served = mirror_record("b", prompt=(9,))
    served.pool = "candidate"
    assert state.offer(served) is None
    production = mirror_record("c", prompt=(8,))
    production.pool = "production"
    assert state.offer(production) is Admission.ACCEPTED
    report = state.report()
    assert (report.promoted_weight, report.candidate_served, report.malformed, report.summary.samples) == (0.3, 1, 0, 1)
    assert state.promote(1.0) == Pools(production="candidate", candidate="production")
    assert (state.report().promoted_weight, state.generation) == (0.0, 1)


def test_rollback_of_a_stepwise_promote_keeps_the_comparison():
    state = new_state()
    state.promote(0.5)
    assert state.rollback() == POOLS
    assert (state.weight, state.generation) == (0.0, 0)


@pytest.mark.parametrize("weight", [0.0, -0.5, 1.01])
def test_promote_weights_outside_zero_to_one_are_refused(weight):
    state = new_state()
    with pytest.raises(ValueError, match=r"promote weight must be in \(0, 1\]"):
        state.promote(weight)
    assert (state.pools, state.weight) == (POOLS, 0.0)


def test_the_first_replays_after_start_and_after_a_switch_only_warm_the_candidate_up():
    state = CanaryState(POOLS, Thresholds(min_samples=1), MirrorBuffer(1 << 20, 8), warmup_replays=2)
    outcomes = []
    for rid, prompt in (("a", (1,)), ("b", (2,)), ("c", (3,))):
        state.offer(mirror_record(rid, prompt=prompt))
        outcomes.append(state.record_candidate(state.next_job(), Outcome((4, 5, 6), 0.1, 0.01)))
    assert outcomes == [False, False, True]
    assert (state.report().summary.samples, state.report().warmup_left) == (1, 0)
    state.promote()
    assert state.report().warmup_left == 2
    state.promote(0.5)  # a stepwise promote keeps the candidate: no new warm-up
    assert state.report().warmup_left == 2
