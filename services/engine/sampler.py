"""Token sampling: greedy, temperature, top-k, top-p, per-request seeds, top-N logprobs."""

from __future__ import annotations

import torch

from kvmesh.engine.outputs import TokenLogprob
from kvmesh.engine.sampling import SamplingParams


def make_generator(seed: int | None, fallback: torch.Generator) -> torch.Generator:
    """One generator per seeded request, so its tokens do not depend on its batch neighbours."""
    if seed is None:
        return fallback
    gen = torch.Generator()
    gen.manual_seed(seed)
    return gen


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]
) -> tuple[list[int], list[TokenLogprob | None]]:
    """Pick one token per row of `logits` [S, V] (fp32); return tokens and optional logprobs."""
    logits = logits.cpu()
    greedy = logits.argmax(dim=-1).tolist()  # [S]
    tokens = [greedy[i] if p.greedy else _sample_row(logits[i], p, generators[i]) for i, p in enumerate(params)]
    logprobs: list[TokenLogprob | None] = [None] * len(params)
    wanted = [i for i, p in enumerate(params) if p.logprobs is not None]
    if wanted:
        lp = torch.log_softmax(logits[wanted], dim=-1)  # [W, V]
        for row, i in enumerate(wanted):
            logprobs[i] = _token_logprob(lp[row], tokens[i], params[i].logprobs or 0)
    return tokens, logprobs


def _sample_row(row: torch.Tensor, p: SamplingParams, gen: torch.Generator) -> int:
    row = row / p.temperature  # [V]
    if 0 < p.top_k < row.shape[0]:
        kth = torch.topk(row, p.top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = torch.sort(row, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # NOTE: drop a token when the tokens ranked above it already cover top_p (keeps at least one).
        drop = (torch.cumsum(probs, dim=-1) - probs) >= p.top_p
        row = row.scatter(0, order[drop], float("-inf"))
    probs = torch.softmax(row, dim=-1)
    return int(torch.multinomial(probs, 1, generator=gen))


def _token_logprob(lp: torch.Tensor, token: int, top_n: int) -> TokenLogprob:
    top: list[tuple[int, float]] = []
    if top_n > 0:
        values, ids = torch.topk(lp, top_n)
        top = list(zip(ids.tolist(), values.tolist()))
    return TokenLogprob(token_id=token, logprob=float(lp[token]), top_logprobs=top)
