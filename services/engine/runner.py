"""Model runner: the only place that touches torch devices. Owns the model and the KV cache.

A step's inputs are built on the host and reach the device in one copy (`Staging`); nothing in
`execute` waits for the device. Decode-only steps replay a captured CUDA graph when the runner
has them (`capture_graphs`); prefill and mixed steps run eagerly.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from kvmesh.engine.attention import BatchLayout, make_backend
from kvmesh.engine.config import ModelArgs
from kvmesh.engine.model import ForwardBatch
from kvmesh.engine.scheduler import ScheduledSeq
from kvmesh.engine.staging import Staging
from kvmesh.engine.weights import load_model

if TYPE_CHECKING:
    from kvmesh.engine.cuda_graphs import DecodeGraphs

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
    """Loads the weights; `num_blocks=0` defers the KV cache to `allocate_kv_cache` (after memory profiling)."""

    def __init__(
        self, path: Path, args: ModelArgs, dtype: torch.dtype, device: torch.device, num_blocks: int, block_size: int,
        max_len: int, attention_backend: str = "auto", row_buckets: bool = True,
    ) -> None:
        self.args = args
        self.dtype = dtype
        self.device = device
        self.block_size = block_size
        self.attention = make_backend(attention_backend, args, block_size, device)
        self.model = load_model(path, args, dtype, device, max_len, self.attention, row_buckets)
        self.kv_cache = torch.empty(0, dtype=dtype, device=device)
        self.graphs: DecodeGraphs | None = None
        if num_blocks:
            self.allocate_kv_cache(num_blocks)

    @staticmethod
    def bytes_per_block(args: ModelArgs, block_size: int, dtype: torch.dtype) -> int:
        return 2 * args.num_layers * block_size * args.kv_size * torch.empty((), dtype=dtype).element_size()

    def allocate_kv_cache(self, num_blocks: int) -> None:
        # [2, L, num_blocks * block_size, Hkv, D]: block b holds slots b*block_size ... (b+1)*block_size-1
        a = self.args
        self.kv_cache = torch.zeros(
            (2, a.num_layers, num_blocks * self.block_size, a.num_kv_heads, a.head_dim), dtype=self.dtype, device=self.device
        )

    def capture_graphs(self, max_num_seqs: int, max_model_len: int, capture: bool = True) -> None:
        """Decode graphs for batch buckets up to `max_num_seqs` (Triton backend only; see cuda_graphs)."""
        if self.attention.name != "triton":
            raise ValueError("CUDA graphs need the triton attention backend")
        from kvmesh.engine.cuda_graphs import DecodeGraphs  # noqa: PLC0415 - imports triton

        max_blocks = -(-max_model_len // self.block_size)
        self.graphs = DecodeGraphs(self.model, self.kv_cache, max_num_seqs, max_blocks, self.device, capture)

    def execute(self, scheduled: list[ScheduledSeq], sample: list[bool], all_logits: bool = False) -> torch.Tensor:
        """Forward the scheduled chunks; logits [S, V] (fp32) for rows where `sample` is True, in order.

        `all_logits=True` returns logits for every new token instead (decode rows first), for tests.
        """
        batch = self._prepare(scheduled, sample)
        if all_logits:
            batch.logits_index = None
        if self.graphs is not None and self.graphs.supports(batch):
            return self.graphs.replay(batch).float()
        return self.model.forward(batch, self.kv_cache).float()

    def profile_forward(self, num_tokens: int, num_rows: int) -> torch.Tensor:
        """A one-sequence prefill of `num_tokens` tokens, logits for its last `num_rows` tokens
        (for memory profiling: it must run before the KV cache exists, so it uses a scratch one)."""
        bs = self.block_size
        table = list(range(-(-num_tokens // bs)))
        saved, self.kv_cache = self.kv_cache, self.kv_cache.new_empty(0)
        self.allocate_kv_cache(len(table))
        try:
            staging = Staging(self.device)
            staging.add("input_ids", [0] * num_tokens)
            staging.add("positions", list(range(num_tokens)))
            staging.add("slot_mapping", list(range(num_tokens)))
            staging.add("logits_index", list(range(num_tokens - num_rows, num_tokens)))
            finish = self.attention.build(BatchLayout([0], [num_tokens], BatchLayout.pad_tables([table]), 0), staging)
            up = staging.upload()
            batch = ForwardBatch(up["input_ids"], up["positions"], up["slot_mapping"], finish(up), up["logits_index"])
            return self.model.forward(batch, self.kv_cache).float()
        finally:
            self.kv_cache = saved

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
        layout = BatchLayout(
            starts=[scheduled[i].start for i in order],
            num_new=[scheduled[i].num_new_tokens for i in order],
            block_tables=BatchLayout.pad_tables([scheduled[i].seq.block_table for i in order]),
            num_decode=sum(1 for i in order if scheduled[i].num_new_tokens == 1),
        )
        bs = self.block_size
        pos_t = torch.tensor(positions, dtype=torch.long)
        bt = layout.block_tables  # [B, W]
        row = torch.repeat_interleave(torch.arange(len(order)), torch.tensor(layout.num_new))  # [T]
        staging = Staging(self.device)
        staging.add("input_ids", ids)
        staging.add("positions", pos_t)
        staging.add("slot_mapping", bt[row, pos_t // bs] * bs + pos_t % bs)  # [T]
        staging.add("logits_index", logits_rows)
        finish = self.attention.build(layout, staging)
        up = staging.upload()
        return ForwardBatch(up["input_ids"], up["positions"], up["slot_mapping"], finish(up), up["logits_index"])

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

    def read_blocks(self, block_ids: list[int]) -> torch.Tensor:
        """Blocks `[n, 2, L, bs, Hkv, D]`, contiguous on CPU: one gather and one device-to-host copy
        for all of them (a copy per block cost ~4 µs each on CPU, and a sync each on CUDA)."""
        a, bs = self.args, self.block_size
        cache = self.kv_cache.view(2, a.num_layers, -1, bs, a.num_kv_heads, a.head_dim)
        ids = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        return cache.index_select(2, ids).permute(2, 0, 1, 3, 4, 5).contiguous().cpu()

    def write_block(self, block_id: int, kv: torch.Tensor) -> None:
        bs = self.block_size
        self.kv_cache[:, :, block_id * bs : (block_id + 1) * bs] = kv.to(device=self.device, dtype=self.dtype)
