"""Prompt logprobs (completions `echo` + `logprobs`, what eval harnesses score with).

In a step where a sequence that asked for them computes prompt tokens, the runner returns the
logits of every new token (`all_logits`, decode rows first, then the other rows in schedule
order). The logits at position q give the logprob of the prompt token at q + 1, so a prompt of
n tokens gets n - 1 entries (the first token has none), each with its top-N alternatives. The
rows the sampler needs are picked out of the same tensor. Such sequences never take prefix-cache
hits or imported KV (the scheduler and engine see to that): every prompt token is computed here.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from kvmesh.engine.outputs import TokenLogprob
from kvmesh.engine.scheduler import ScheduledSeq


def wants_prompt_logprobs(scheduled: Seq[ScheduledSeq]) -> bool:
    return any(s.seq.params.prompt_logprobs is not None and s.start + 1 < s.seq.num_prompt_tokens for s in scheduled)


def split_all_logits(
    scheduled: Seq[ScheduledSeq], do_sample: Seq[bool], all_logits: torch.Tensor
) -> torch.Tensor:
    """From logits [T, V] of every new token, record prompt logprobs on the sequences that asked,
    and return the rows to sample [S, V] (the last token of each sampling row, in schedule order)."""
    order = sorted(range(len(scheduled)), key=lambda i: scheduled[i].num_new_tokens > 1)  # the runner's row order
    first_row = [0] * len(scheduled)
    row = 0
    for i in order:
        first_row[i] = row
        row += scheduled[i].num_new_tokens
    for i, s in enumerate(scheduled):
        if s.seq.params.prompt_logprobs is not None:
            _record(s, all_logits[first_row[i] : first_row[i] + s.num_new_tokens])
    last = [first_row[i] + s.num_new_tokens - 1 for i, s in enumerate(scheduled) if do_sample[i]]
    return all_logits[torch.tensor(last, dtype=torch.long, device=all_logits.device)]  # [S, V]


def _record(s: ScheduledSeq, chunk: torch.Tensor) -> None:
    """Logprobs of prompt tokens start+1 .. from the chunk's logits [n, V]."""
    seq = s.seq
    # NOTE: entry k is for position k; a recomputation after preemption records nothing twice.
    begin = max(s.start, len(seq.prompt_logprobs))
    end = min(s.start + s.num_new_tokens, seq.num_prompt_tokens - 1)  # positions whose next token is prompt
    if end <= begin:
        return
    lp = torch.log_softmax(chunk[begin - s.start : end - s.start].float(), dim=-1)  # [m, V]
    targets = torch.tensor(seq.token_ids[begin + 1 : end + 1], dtype=torch.long, device=lp.device)  # [m]
    chosen = lp.gather(1, targets[:, None]).squeeze(1).tolist()  # [m]
    top_n = seq.params.prompt_logprobs or 0
    top_vals, top_ids = torch.topk(lp, top_n, dim=-1) if top_n else (lp[:, :0], lp[:, :0].long())  # [m, N]
    ids, vals = top_ids.tolist(), top_vals.tolist()
    for j, token in enumerate(targets.tolist()):
        seq.prompt_logprobs.append(TokenLogprob(token, chosen[j], list(zip(ids[j], vals[j]))))
