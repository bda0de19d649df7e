"""Logits processors, vectorized over the batch, on the logits' own device.

Applied to the fp32 logits [S, V] of the rows about to be sampled, before temperature, in vLLM's
order and with its definitions:

1. `min_tokens`: while a row has produced fewer tokens, its EOS and `stop_token_ids` are -inf.
2. `logit_bias`: added to the named tokens' logits.
3. penalties (vLLM `apply_penalties`):
   - repetition `r` over prompt + output tokens: a seen token's logit `l` becomes `l / r` when
     `l > 0`, else `l * r` (r > 1 discourages repeats; 1 = off);
   - frequency `f` and presence `p` over output tokens: `l -= f * count + p * (count > 0)`.

(`min_p`, temperature, top-k and top-p are the sampler's.) A row every token of which ends up at -inf (say min_tokens hides the only token a grammar
allows) gets its input logits back, so sampling never sees NaNs.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from kvmesh.engine.sampling import SamplingParams


def needs_processing(params: SamplingParams) -> bool:
    return bool(
        params.min_tokens
        or params.logit_bias
        or params.presence_penalty
        or params.frequency_penalty
        or params.repetition_penalty != 1.0
    )


def apply_logits_processors(
    logits: torch.Tensor,
    params: Seq[SamplingParams],
    token_ids: Seq[Seq[int]],
    num_prompt_tokens: Seq[int],
    eos_token_ids: frozenset[int],
) -> torch.Tensor:
    """Processed logits [S, V] (a new tensor when anything applies; `logits` itself otherwise).

    `token_ids[i]` is row i's prompt + output so far; its first `num_prompt_tokens[i]` are prompt.
    """
    rows = [i for i, p in enumerate(params) if needs_processing(p)]
    if not rows:
        return logits
    original = logits
    logits = logits.clone()
    vocab, dev = logits.shape[1], logits.device
    outputs = [list(token_ids[i][num_prompt_tokens[i] :]) for i in range(len(params))]
    _min_tokens(logits, params, outputs, eos_token_ids, vocab)
    _logit_bias(logits, params, vocab)
    _penalties(logits, params, token_ids, outputs, vocab)
    dead = torch.isneginf(logits.max(dim=-1).values)  # [S]
    return torch.where(dead[:, None], original, logits)


def _min_tokens(logits: torch.Tensor, params: Seq[SamplingParams], outputs: list[list[int]], eos: frozenset[int], vocab: int) -> None:
    rows, cols = [], []
    for i, p in enumerate(params):
        if len(outputs[i]) < p.min_tokens:
            stops = set(p.stop_token_ids) | (set() if p.ignore_eos else eos)
            ids = [t for t in stops if t < vocab]
            rows.extend([i] * len(ids))
            cols.extend(ids)
    if rows:
        logits[_to(rows, torch.long, logits.device), _to(cols, torch.long, logits.device)] = float("-inf")


def _logit_bias(logits: torch.Tensor, params: Seq[SamplingParams], vocab: int) -> None:
    rows, cols, values = [], [], []
    for i, p in enumerate(params):
        for token, bias in p.logit_bias:
            if token < vocab:
                rows.append(i)
                cols.append(token)
                values.append(bias)
    if rows:
        dev = logits.device
        index = (_to(rows, torch.long, dev), _to(cols, torch.long, dev))
        logits.index_put_(index, _to(values, torch.float32, dev), accumulate=True)


def _penalties(
    logits: torch.Tensor, params: Seq[SamplingParams], token_ids: Seq[Seq[int]], outputs: list[list[int]], vocab: int
) -> None:
    s, dev = logits.shape[0], logits.device
    rep = [p.repetition_penalty for p in params]
    freq = [p.frequency_penalty for p in params]
    pres = [p.presence_penalty for p in params]
    if any(r != 1.0 for r in rep):
        seen = _token_counts([token_ids[i] if rep[i] != 1.0 else () for i in range(s)], vocab, dev) > 0  # [S, V]
        r = _to(rep, torch.float32, dev)[:, None]  # [S, 1]
        penalized = torch.where(logits > 0, logits / r, logits * r)
        logits.copy_(torch.where(seen, penalized, logits))
    if any(freq) or any(pres):
        counts = _token_counts([outputs[i] if freq[i] or pres[i] else () for i in range(s)], vocab, dev)  # [S, V]
        logits -= _to(freq, torch.float32, dev)[:, None] * counts
        logits -= _to(pres, torch.float32, dev)[:, None] * (counts > 0).float()


def _token_counts(rows: list[Seq[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """counts [S, V] (fp32): how often each token occurs in each row's list."""
    width = max((len(r) for r in rows), default=0)
    counts = torch.zeros((len(rows), vocab + 1), dtype=torch.float32, device=device)  # [S, V+1]; column V = padding
    if width == 0:
        return counts[:, :vocab]
    padded = _to([[min(t, vocab) for t in r] + [vocab] * (width - len(r)) for r in rows], torch.long, device)  # [S, W]
    counts.scatter_add_(1, padded, torch.ones(padded.shape, dtype=torch.float32, device=device))
    return counts[:, :vocab]


def _to(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list as a tensor on `device`; on CUDA through pinned memory, so the copy does not sync."""
    t = torch.tensor(values, dtype=dtype)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t
