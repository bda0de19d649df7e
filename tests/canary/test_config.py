"""Canary settings: defaults, environment, flags, thresholds."""

import pydantic
import pytest

from kvmesh.canary.config import CanarySettings
from kvmesh.runtime.config import settings_from_argv


def test_defaults_bind_loopback():
    s = CanarySettings()
    assert (s.host, s.port, s.http_port, s.scheduler) == ("127.0.0.1", 50091, 8091, "127.0.0.1:50051")
    assert (s.production_pool, s.candidate_pool, s.noise_sample) == ("production", "candidate", 0.1)


def test_environment_and_flags(monkeypatch):
    monkeypatch.setenv("KVMESH_CANARY_MIN_SAMPLES", "7")
    monkeypatch.setenv("KVMESH_NATS_URL", "nats://127.0.0.1:4999")
    s = settings_from_argv(CanarySettings, ["--candidate-pool", "int8", "--max-ttft-p99-regression", "1.2"], "canary")
    assert (s.min_samples, s.nats_url, s.candidate_pool) == (7, "nats://127.0.0.1:4999", "int8")
    assert s.thresholds().max_ttft_p99_regression == 1.2
    assert s.thresholds().min_samples == 7


def test_noise_sample_is_a_fraction():
    with pytest.raises(pydantic.ValidationError):
        CanarySettings(noise_sample=1.5)
