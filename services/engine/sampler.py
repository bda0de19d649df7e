"""Token sampling on the logits' device, vectorized over the rows of a step.

For logits [S, V] (fp32), one call of `Sampler`:
1. **Logits processors** (`Sampler(processors=...)`): each is `fn(logits [S, V], params) -> [S, V]`
   and runs, in order, on every row before anything else here. This is where penalties,
   `logit_bias` and grammar masks plug in; a processor may return a new tensor or edit in place,
   and masks tokens with `-inf`. Logprobs are reported from the logits *before* processing (the
   model's own distribution).
2. **Greedy** rows (`temperature == 0`) take the argmax of the processed logits.
3. **Random** rows: divide by the temperature, softmax, keep the top-k tokens, then the smallest
   set whose probability (renormalised over the top-k) reaches top_p, then drop tokens below
   min_p × the most likely token's probability; draw one token by inverting the kept tokens' CDF
   with one uniform number per row.
4. **Top-N logprobs** for the rows that ask.

The uniform of a row comes from a counter-based hash of (seed, step), with step = the number of
tokens the request has generated: a seeded request gets the same tokens whatever else is in the
batch, and no global generator is advanced. Requests without a seed get one drawn by the engine.

Only the chosen ids and the requested logprobs leave the device: one small copy per step (into
pinned memory on CUDA), which is the step's one host sync.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence

import torch

from kvmesh.engine.outputs import TokenLogprob
from kvmesh.engine.sampling import SamplingParams

LogitsProcessor = Callable[[torch.Tensor, Sequence[SamplingParams]], torch.Tensor]


def row_uniform(seed: int, step: int) -> float:
    """A uniform number in (0, 1) from (seed, step) alone: 24 bits, exact in fp32."""
    digest = hashlib.blake2b(struct.pack("<QQ", seed, step), digest_size=8).digest()
    bits = int.from_bytes(digest, "little") >> 40  # 24 bits
    return (bits + 0.5) / (1 << 24)


class Sampler:
    """Picks one token per row (see the module docstring for the order of operations)."""

    def __init__(self, processors: Sequence[LogitsProcessor] = ()) -> None:
        self.processors = list(processors)

    def __call__(
        self, logits: torch.Tensor, params: Sequence[SamplingParams], seeds: Sequence[int], steps: Sequence[int]
    ) -> tuple[list[int], list[TokenLogprob | None]]:
        """logits [S, V] fp32 on any device; seeds/steps per row. Returns token ids and optional logprobs."""
        raw = logits
        for fn in self.processors:
            logits = fn(logits, params)
        tokens = logits.argmax(dim=-1)  # [S]
        random_rows = [i for i, p in enumerate(params) if not p.greedy]
        if random_rows:
            rows = _index(random_rows, logits.device)
            picked = sample_rows(logits.index_select(0, rows), [params[i] for i in random_rows],
                                 [row_uniform(seeds[i], steps[i]) for i in random_rows])
            tokens = tokens.index_copy(0, rows, picked)
        wanted = [i for i, p in enumerate(params) if p.logprobs is not None]
        top_n = max((params[i].logprobs or 0 for i in wanted), default=0)
        parts = [tokens.double()]
        if wanted:
            rows = _index(wanted, logits.device)
            lp = torch.log_softmax(raw.index_select(0, rows), dim=-1)  # [W, V]
            parts.append(lp.gather(1, tokens.index_select(0, rows).unsqueeze(1)).double().flatten())  # [W]
            if top_n:
                top_lp, top_ids = torch.topk(lp, top_n, dim=-1)  # [W, N]
                parts += [top_ids.double().flatten(), top_lp.double().flatten()]
        host = _to_host(torch.cat(parts))
        return _unpack(host, params, wanted, top_n)


def sample_rows(logits: torch.Tensor, params: Sequence[SamplingParams], uniforms: Sequence[float]) -> torch.Tensor:
    """One token per row of logits [R, V] (random rows only); returns ids [R] on the same device."""
    dev = logits.device
    vocab = logits.shape[-1]
    knobs = torch.tensor(
        [[p.temperature, p.top_k if 0 < p.top_k < vocab else vocab, p.top_p, p.min_p, u] for p, u in zip(params, uniforms)],
        dtype=torch.float32,
    )  # [R, 5]
    knobs = knobs.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else knobs
    temp, top_k, top_p, min_p, u = knobs.unbind(1)  # [R] each
    probs = torch.softmax(logits / temp[:, None], dim=-1)  # [R, V]
    order = None
    if any(0 < p.top_k < vocab or p.top_p < 1.0 for p in params):
        probs, order = torch.sort(probs, dim=-1, descending=True)  # [R, V], most likely first
        rank = torch.arange(vocab, device=dev, dtype=torch.float32)  # [V]
        probs = probs.masked_fill(rank[None, :] >= top_k[:, None], 0.0)
        renorm = probs / probs.sum(dim=-1, keepdim=True)
        # NOTE: drop a token when the tokens ranked above it already cover top_p (keeps at least one).
        probs = probs.masked_fill((torch.cumsum(renorm, dim=-1) - renorm) >= top_p[:, None], 0.0)
    peak = probs.amax(dim=-1, keepdim=True)  # [R, 1]
    probs = probs.masked_fill(probs < min_p[:, None] * peak, 0.0)
    cdf = torch.cumsum(probs, dim=-1)  # [R, V], non-decreasing
    target = (u * cdf[:, -1]).unsqueeze(1)  # [R, 1], in (0, total]
    pos = torch.searchsorted(cdf, target).clamp_max(vocab - 1)  # [R, 1]: first token whose CDF reaches it
    return (pos if order is None else order.gather(1, pos)).squeeze(1)


def _index(rows: list[int], device: torch.device) -> torch.Tensor:
    # NOTE: indexing a CUDA tensor with a Python list copies from pageable memory, which syncs.
    t = torch.tensor(rows, dtype=torch.long)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t


def _to_host(packed: torch.Tensor) -> list[float]:
    if packed.device.type != "cuda":
        return packed.tolist()
    host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
    host.copy_(packed, non_blocking=True)
    torch.cuda.current_stream(packed.device).synchronize()
    return host.tolist()


def _unpack(
    host: list[float], params: Sequence[SamplingParams], wanted: list[int], top_n: int
) -> tuple[list[int], list[TokenLogprob | None]]:
    s, w = len(params), len(wanted)
    tokens = [int(t) for t in host[:s]]
    logprobs: list[TokenLogprob | None] = [None] * s
    chosen = host[s : s + w]
    ids = host[s + w : s + w + w * top_n]
    vals = host[s + w + w * top_n :]
    for j, i in enumerate(wanted):
        n = params[i].logprobs or 0
        top = [(int(ids[j * top_n + k]), vals[j * top_n + k]) for k in range(n)]
        logprobs[i] = TokenLogprob(token_id=tokens[i], logprob=chosen[j], top_logprobs=top)
    return tokens, logprobs
