"""The rollout's file: a round trip, atomic writes, and an unusable file refused."""

import json

import pytest

from kvmesh.canary.compare import Comparison, Outcome
from kvmesh.canary.rollout import Rollout, RolloutPlan, StepFigures
from kvmesh.canary.rolloutstore import RolloutStore, rollout_to_json
from kvmesh.canary.verdict import Thresholds
from kvmesh.canary.window import ServedCounts


def judged_rollout():
    rollout = Rollout.start(RolloutPlan((0.1, 0.5, 1.0), min_samples=1, min_seconds=2.5, judge_latency=True), 10.0)
    rollout.begin_step(10.0)
    c = Comparison()
    c.add_candidate(Outcome((1, 2), 0.1, 0.01), Outcome((1, 2), 0.1, 0.01))
    rollout.judge(StepFigures(c.summary(), 1.0, 0, ServedCounts(candidate=3)), Thresholds(), now=13.0)
    return rollout


def test_round_trip(tmp_path):
    store = RolloutStore(str(tmp_path / "canary" / "rollout.json"))
    assert store.load() is None
    rollout = judged_rollout()
    store.save(rollout)
    loaded = store.load()
    assert loaded == rollout
    assert rollout_to_json(loaded)["steps"][0]["checks"][0]["name"] == "error_rate_delta"
    assert [p.name for p in (tmp_path / "canary").iterdir()] == ["rollout.json"]


def test_empty_path_keeps_nothing(tmp_path):
    store = RolloutStore("")
    store.save(judged_rollout())
    assert store.load() is None


@pytest.mark.parametrize("text", ["{not json", json.dumps({"version": 99}), json.dumps({"version": 1, "steps": []})])
def test_an_unusable_file_is_refused_and_set_aside(tmp_path, text):
    path = tmp_path / "rollout.json"
    path.write_text(text)
    store = RolloutStore(str(path))
    with pytest.raises(ValueError, match="is unusable"):
        store.load()
    assert store.set_aside() == tmp_path / "rollout.json.unusable"
    assert store.load() is None
