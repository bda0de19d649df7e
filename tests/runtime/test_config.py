import pytest
from pydantic_settings import SettingsConfigDict

from kvmesh.runtime.config import MeshSettings, settings_from_argv


class DemoSettings(MeshSettings):
    model_config = SettingsConfigDict(env_prefix="KVMESH_DEMO_", populate_by_name=True, extra="ignore")
    port: int = 1
    ratio: float = 0.5
    verbose: bool = False


def test_env_then_flags(monkeypatch):
    monkeypatch.setenv("KVMESH_DEMO_PORT", "7")
    monkeypatch.setenv("KVMESH_MODEL", "/models/qwen")
    monkeypatch.setenv("KVMESH_NATS_URL", "nats://127.0.0.1:1")
    settings = settings_from_argv(DemoSettings, ["--ratio", "0.25", "--verbose", "--block-size", "32"], "demo")
    assert (settings.port, settings.ratio, settings.verbose, settings.block_size) == (7, 0.25, True, 32)
    assert settings.model == "/models/qwen" and settings.nats_url == "nats://127.0.0.1:1"
    assert settings.served_model_name() == "qwen"


def test_service_prefix_does_not_read_other_services_vars(monkeypatch):
    monkeypatch.setenv("KVMESH_OTHER_PORT", "9")
    assert DemoSettings().port == 1


def test_bad_flag_value_exits_with_usage():
    with pytest.raises(SystemExit):
        settings_from_argv(DemoSettings, ["--port", "not-a-number"], "demo")
