"""Backend choice, the Triton backend inside the model (interpreted on CPU), and the decode-graph
buffers (bucket choice, padding, persistent inputs) run eagerly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvmesh.engine.attention import resolve_backend
from kvmesh.engine.config import ModelArgs
from kvmesh.engine.runner import ModelRunner
from kvmesh.engine.sampling import SamplingParams
from kvmesh.engine.scheduler import ScheduledSeq
from kvmesh.engine.sequence import Sequence

pytest.importorskip("triton")
from kvmesh.engine.cuda_graphs import bucket_for, graph_buckets  # noqa: E402

CPU = torch.device("cpu")


def test_auto_backend_follows_the_device_and_can_be_forced() -> None:
    assert resolve_backend("auto", CPU) == "torch"
    assert resolve_backend("auto", torch.device("cuda")) == "triton"
    assert resolve_backend("triton", CPU) == "triton" and resolve_backend("torch", torch.device("cuda")) == "torch"
    with pytest.raises(ValueError, match="attention_backend"):
        resolve_backend("flash", CPU)


def test_graph_buckets_cover_every_batch_size_up_to_max_num_seqs() -> None:
    assert graph_buckets(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert graph_buckets(20) == [1, 2, 4, 8, 16, 20]
    assert graph_buckets(1) == [1]
    buckets = graph_buckets(64)
    assert [bucket_for(n, buckets) for n in (1, 3, 8, 9, 33, 64)] == [1, 4, 8, 16, 48, 64]
    assert bucket_for(65, buckets) is None


def runner(path: Path, backend: str, num_blocks: int = 32) -> ModelRunner:
    return ModelRunner(path, ModelArgs.from_dir(path), torch.float32, CPU, num_blocks, 16, 256, backend)


def seq(tokens: list[int], table: list[int]) -> Sequence:
    s = Sequence(f"r{tokens[0]}-{len(tokens)}", tokens, len(tokens), SamplingParams())
    s.block_table = table
    return s


def mixed_step(r: ModelRunner) -> torch.Tensor:
    """Fill two contexts, then one step with two decode rows, a prefix-hit extend and a fresh prefill."""
    a = seq(list(range(1, 41)), [7, 2, 11])  # shuffled, non-contiguous tables
    b = seq(list(range(100, 118)), [5, 30])
    c = seq(list(range(60, 95)), [9, 1, 20])
    d = seq(list(range(200, 209)), [14])
    r.execute([ScheduledSeq(a, 0, 39), ScheduledSeq(b, 0, 17), ScheduledSeq(c, 0, 16)], [False] * 3)
    step = [ScheduledSeq(c, 16, 19), ScheduledSeq(a, 39, 1), ScheduledSeq(d, 0, 9), ScheduledSeq(b, 17, 1)]
    return r.execute(step, [True] * 4, all_logits=True)  # [T, V]


def test_triton_backend_matches_the_torch_reference_in_the_model(tiny_dir: Path) -> None:
    ref = mixed_step(runner(tiny_dir, "torch"))
    out = mixed_step(runner(tiny_dir, "triton"))
    err = float((out - ref).norm() / ref.norm())
    print(f"model logits, triton vs torch backend: rel err {err:.2e}")
    assert err < 1e-5


def decode_rows(r: ModelRunner) -> tuple[list[ScheduledSeq], list[Sequence]]:
    rows = [seq(list(range(1 + 7 * i, 12 + 9 * i)), [3 * i, 3 * i + 1, 3 * i + 2]) for i in range(3)]
    r.execute([ScheduledSeq(s, 0, s.num_tokens - 1) for s in rows], [False] * 3)
    return [ScheduledSeq(s, s.num_tokens - 1, 1) for s in rows], rows


def test_decode_graph_buffers_pad_to_the_bucket_and_match_eager(tiny_dir: Path) -> None:
    eager = runner(tiny_dir, "triton")
    step, _ = decode_rows(eager)
    want = eager.execute(step, [True, False, True])  # [2, V]
    graphed = runner(tiny_dir, "triton")
    step, rows = decode_rows(graphed)
    graphed.capture_graphs(max_num_seqs=6, max_model_len=256, capture=False)
    g = graphed.graphs
    g.seq_lens.fill_(99)  # stale values from an earlier, larger step
    g.slot_mapping.fill_(5)
    before = graphed.kv_cache.clone()
    batch = graphed._prepare(step, [True, False, True])
    assert g.supports(batch) and bucket_for(3, g.buckets) == 4
    got = graphed.execute(step, [True, False, True])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)  # padding changes the split-K factor and GEMM shapes
    assert g.seq_lens[3].item() == 0 and g.slot_mapping[3].item() == -1  # the padding row
    changed = (graphed.kv_cache != before).flatten(0, 1).any(0).any(-1).any(-1).nonzero().flatten().tolist()  # slots
    assert changed == sorted(s.block_table[(s.num_tokens - 1) // 16] * 16 + (s.num_tokens - 1) % 16 for s in rows)


def test_prefill_steps_do_not_use_the_graphs(tiny_dir: Path) -> None:
    r = runner(tiny_dir, "triton")
    r.capture_graphs(max_num_seqs=4, max_model_len=256, capture=False)
    s = seq(list(range(1, 20)), [0, 1])
    assert not r.graphs.supports(r._prepare([ScheduledSeq(s, 0, 19)], [True]))
    too_many = [ScheduledSeq(seq([i + 1, i + 2], [i]), 1, 1) for i in range(5)]
    assert not r.graphs.supports(r._prepare(too_many, [True] * 5))


def test_graphs_need_the_triton_backend(tiny_dir: Path) -> None:
    with pytest.raises(ValueError, match="triton"):
        runner(tiny_dir, "torch").capture_graphs(4, 256, capture=False)
