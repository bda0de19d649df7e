"""Model runner: the only place that touches torch devices. Owns the model and the KV cache."""

from __future__ import annotations

from pathlib import Path

import torch

from kvmesh.engine.config import ModelArgs
from kvmesh.engine.model import AttentionGroup, ForwardBatch
from kvmesh.engine.scheduler import ScheduledSeq
from kvmesh.engine.weights import load_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, args: ModelArgs, device: torch.device) -> torch.dtype:
    if dtype != "auto":
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be 'auto' or one of {sorted(DTYPES)}, got {dtype!r}")
        return DTYPES[dtype]
    # NOTE: fp16 matmuls are slow or missing on CPU; use fp32 there.
    if device.type == "cpu" and args.torch_dtype == "float16":
        return torch.float32
    return DTYPES[args.torch_dtype]


class ModelRunner:
    def __init__(
        self, path: Path, args: ModelArgs, dtype: torch.dtype, device: torch.device, num_blocks: int, block_size: int, max_len: int
    ) -> None:
        self.args = args
        self.dtype = dtype
        self.device = device
        self.block_size = block_size
        self.model = load_model(path, args, dtype, device, max_len)
        # [2, L, num_blocks * block_size, Hkv, D]: block b holds slots b*block_size ... (b+1)*block_size-1
        self.kv_cache = torch.zeros(
            (2, args.num_layers, num_blocks * block_size, args.num_kv_heads, args.head_dim), dtype=dtype, device=device
        )

    @staticmethod
    def bytes_per_block(args: ModelArgs, block_size: int, dtype: torch.dtype) -> int:
        return 2 * args.num_layers * block_size * args.kv_size * torch.empty((), dtype=dtype).element_size()

    def execute(self, scheduled: list[ScheduledSeq], sample: list[bool], all_logits: bool = False) -> torch.Tensor:
        """Forward the scheduled chunks; logits [S, V] (fp32) for rows where `sample` is True, in order.

        `all_logits=True` returns logits for every new token instead (decode rows first), for tests.
        """
        batch = self._prepare(scheduled, sample)
        if all_logits:
            batch.logits_index = torch.arange(batch.input_ids.shape[0], device=self.device)
        return self.model.forward(batch, self.kv_cache).float()

    def _prepare(self, scheduled: list[ScheduledSeq], sample: list[bool]) -> ForwardBatch:
        # NOTE: decode rows (one new token) first, then prefill chunks; each is one attention group.
        order = sorted(range(len(scheduled)), key=lambda i: scheduled[i].num_new_tokens > 1)
        ids: list[int] = []
        positions: list[int] = []
        logits_rows: list[int] = [0] * sum(sample)
        row_of = {i: r for r, i in enumerate(i for i in range(len(scheduled)) if sample[i])}
        for i in order:
            s = scheduled[i]
            ids.extend(s.seq.token_ids[s.start : s.start + s.num_new_tokens])
            positions.extend(range(s.start, s.start + s.num_new_tokens))
            if sample[i]:
                logits_rows[row_of[i]] = len(ids) - 1
        bs = self.block_size
        pos_t = torch.tensor(positions, dtype=torch.long)
        tables = [scheduled[i].seq.block_table for i in order]
        width = max(len(t) for t in tables)
        bt = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long)  # [B, W]
        row = torch.repeat_interleave(
            torch.arange(len(order)), torch.tensor([scheduled[i].num_new_tokens for i in order])
        )  # [T]
        slot_mapping = bt[row, pos_t // bs] * bs + pos_t % bs  # [T]
        n_dec = sum(1 for i in order if scheduled[i].num_new_tokens == 1)
        groups = []
        if n_dec:
            groups.append(self._decode_group([scheduled[i] for i in order[:n_dec]], bt[:n_dec]))
        if n_dec < len(order):
            groups.append(self._prefill_group([scheduled[i] for i in order[n_dec:]], bt[n_dec:], n_dec))
        dev = self.device
        return ForwardBatch(
            input_ids=torch.tensor(ids, dtype=torch.long).to(dev, non_blocking=True),
            positions=pos_t.to(dev, non_blocking=True),
            slot_mapping=slot_mapping.to(dev, non_blocking=True),
            groups=groups,
            logits_index=torch.tensor(logits_rows, dtype=torch.long).to(dev, non_blocking=True),
        )

    def _context_slots(self, bt: torch.Tensor, ctx: int) -> torch.Tensor:
        pos = torch.arange(ctx)
        return (bt[:, pos // self.block_size] * self.block_size + pos % self.block_size).flatten()  # [B*C]

    def _decode_group(self, rows: list[ScheduledSeq], bt: torch.Tensor) -> AttentionGroup:
        ctx = torch.tensor([s.start + 1 for s in rows])  # [B]
        c = int(ctx.max())
        mask = (torch.arange(c)[None, :] < ctx[:, None])[:, None, None, :]  # [B, 1, 1, C]
        dev = self.device
        return AttentionGroup(0, len(rows), len(rows), c, self._context_slots(bt, c).to(dev), mask.to(dev), None, None)

    def _prefill_group(self, rows: list[ScheduledSeq], bt: torch.Tensor, offset: int) -> AttentionGroup:
        n = torch.tensor([s.num_new_tokens for s in rows])  # [B]
        start = torch.tensor([s.start for s in rows])  # [B]
        q_len, c = int(n.max()), int((start + n).max())
        j = torch.arange(q_len)[None, :]  # [1, Q]
        first = offset + torch.cumsum(n, 0) - n  # [B] flat index of each row's first token
        j_clamped = torch.minimum(j, (n - 1)[:, None])  # [B, Q]; padded queries repeat the last token
        q_index = first[:, None] + j_clamped  # [B, Q]
        q_pos = start[:, None] + j_clamped  # [B, Q]
        mask = (torch.arange(c)[None, None, :] <= q_pos[:, :, None])[:, None]  # [B, 1, Q, C]
        out_index = (torch.arange(len(rows))[:, None] * q_len + j)[j < n[:, None]]  # [T_prefill]
        dev = self.device
        total = int(n.sum())
        return AttentionGroup(
            offset, offset + total, len(rows), c, self._context_slots(bt, c).to(dev), mask.to(dev),
            q_index.flatten().to(dev), out_index.to(dev),
        )

    # ---- KV movement (wire layout [2, L, tokens, Hkv, D], CPU tensors) ----

    def _slots(self, block_table: list[int], start: int, end: int) -> torch.Tensor:
        pos = torch.arange(start, end)
        bt = torch.tensor(block_table, dtype=torch.long)
        return (bt[pos // self.block_size] * self.block_size + pos % self.block_size).to(self.device)

    def read_kv(self, block_table: list[int], start: int, end: int) -> torch.Tensor:
        return self.kv_cache.index_select(2, self._slots(block_table, start, end)).cpu()  # [2, L, end-start, Hkv, D]

    def write_kv(self, block_table: list[int], start: int, kv: torch.Tensor) -> None:
        slots = self._slots(block_table, start, start + kv.shape[2])
        self.kv_cache.index_copy_(2, slots, kv.to(device=self.device, dtype=self.dtype))

    def read_block(self, block_id: int) -> torch.Tensor:
        bs = self.block_size
        return self.kv_cache[:, :, block_id * bs : (block_id + 1) * bs].cpu().clone()  # [2, L, bs, Hkv, D]

    def write_block(self, block_id: int, kv: torch.Tensor) -> None:
        bs = self.block_size
        self.kv_cache[:, :, block_id * bs : (block_id + 1) * bs] = kv.to(device=self.device, dtype=self.dtype)
