"""`kvmesh sim --scale-up`: workers joining mid-trace, pre-warmed by the real Router and Prewarmer."""

from kvmesh.scheduler.prewarm import PrewarmConfig
from kvmesh.scheduler.sim import sim_main
from kvmesh.scheduler.sim.cluster import SimConfig
from kvmesh.scheduler.sim.scaleup import scale_up
from kvmesh.scheduler.sim.trace import SyntheticConfig, synthetic

TRACE = synthetic(SyntheticConfig(duration_s=6.0, num_system_prompts=3, system_prompt_tokens=(256, 512),
                                  user_tokens=(16, 48), output_tokens=(4, 8), think_time_s=0.5), rate=40.0)
CONFIG = SimConfig(num_workers=6)


def test_prewarmed_joiners_hold_the_hot_prefixes_and_serve_them_from_cache():
    off = scale_up("round_robin", CONFIG, TRACE, joining=2, join_at_s=3.0, window_s=3.0, prewarm=None)
    on = scale_up("round_robin", CONFIG, TRACE, joining=2, join_at_s=3.0, window_s=3.0,
                  prewarm=PrewarmConfig(budget_blocks=64))
    assert (off.prewarm, off.prewarmed_blocks) == (False, 0)
    assert 0 < on.prewarmed_blocks <= 2 * 64
    assert on.joiners_hit_rate > off.joiners_hit_rate
    assert on.joiners_ttft_p50_s < off.joiners_ttft_p50_s


def test_the_cli_prints_both_rows(capsys):
    assert sim_main(["--workers", "4", "--scale-up", "1", "--duration-s", "4", "--warmup-s", "2", "--rate", "4",
                     "--system-prompts", "2", "--policy", "round_robin"]) == 0
    out = capsys.readouterr().out
    assert "| 3 → 4 | off |" in out and "| 3 → 4 | on |" in out
