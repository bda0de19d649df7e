"""The torch attention backend's one-row prefill (no padding, no gathers; causal mask left to SDPA
when nothing is cached before it) gives what the padded many-row group gives for the same row."""

from __future__ import annotations

from pathlib import Path

import torch

from kvmesh.engine.config import ModelArgs
from kvmesh.engine.runner import ModelRunner
from kvmesh.engine.sampling import SamplingParams
from kvmesh.engine.scheduler import ScheduledSeq
from kvmesh.engine.sequence import Sequence


def runner(path: Path) -> ModelRunner:
    return ModelRunner(path, ModelArgs.from_dir(path), torch.float32, torch.device("cpu"), 32, 16, 256, "torch")


def seq(tokens: list[int], table: list[int]) -> Sequence:
    s = Sequence(f"r{tokens[0]}-{len(tokens)}", tokens, len(tokens), SamplingParams())
    s.block_table = table
    return s


def logits_of_row(path: Path, start: int, alone: bool) -> torch.Tensor:
    """Logits of every new token of one prompt row (tokens `start:` new, `:start` cached first), in
    a step beside two decode rows, alone in its prefill group or beside another prefill row."""
    r = runner(path)
    row = seq(list(range(3, 40)), [7, 2, 11])  # 37 tokens, a shuffled table
    other = seq(list(range(100, 121)), [5, 30])
    decodes = [seq(list(range(50 + 9 * i, 60 + 9 * i)), [20 + i]) for i in range(2)]
    warm = [ScheduledSeq(s, 0, s.num_tokens - 1) for s in decodes] + ([ScheduledSeq(row, 0, start)] if start else [])
    r.execute(warm, [False] * len(warm))
    step = [ScheduledSeq(s, s.num_tokens - 1, 1) for s in decodes] + [ScheduledSeq(row, start, row.num_tokens - start)]
    if not alone:
        step.append(ScheduledSeq(other, 0, other.num_tokens))
    out = r.execute(step, [True] * len(step), all_logits=True)  # [T, V]: decode rows first, then prefill rows in order
    return out[len(decodes) : len(decodes) + row.num_tokens - start]


def test_a_fresh_prompt_alone_matches_the_padded_group(tiny_dir: Path) -> None:
    alone, padded = logits_of_row(tiny_dir, 0, True), logits_of_row(tiny_dir, 0, False)
    assert alone.shape == padded.shape == (37, alone.shape[1])
    torch.testing.assert_close(alone, padded, rtol=1e-5, atol=1e-5)


def test_a_prompt_after_cached_tokens_alone_matches_the_padded_group(tiny_dir: Path) -> None:
    alone, padded = logits_of_row(tiny_dir, 16, True), logits_of_row(tiny_dir, 16, False)
    assert alone.shape == padded.shape == (21, alone.shape[1])
    torch.testing.assert_close(alone, padded, rtol=1e-5, atol=1e-5)


def test_the_one_row_group_has_no_gathers_and_no_mask_without_a_cached_prefix(tiny_dir: Path) -> None:
    from kvmesh.engine.attention import BatchLayout
    from kvmesh.engine.staging import Staging

    r = runner(tiny_dir)
    fresh = r.attention.build(BatchLayout([4, 0], [1, 9], BatchLayout.pad_tables([[1], [2]]), 1), Staging(r.device))({})
    assert fresh[1].single and fresh[1].mask is None and fresh[1].q_index is None and fresh[1].out_index is None
    assert (fresh[1].start, fresh[1].end, fresh[1].context_len) == (1, 10, 9)
    extend = r.attention.build(BatchLayout([4, 16], [1, 5], BatchLayout.pad_tables([[1], [2, 3]]), 1), Staging(r.device))({})
    assert extend[1].single and extend[1].mask.shape == (1, 1, 5, 21)
    assert extend[1].mask[0, 0, 0, :17].all() and not extend[1].mask[0, 0, 0, 17:].any()  # query 0 is token 16
