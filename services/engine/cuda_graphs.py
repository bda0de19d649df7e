"""CUDA graphs for decode steps: one graph per padded batch-size bucket over persistent inputs.

A decode step (every row has one new token, Triton backend) is padded up to the smallest bucket
that holds it. Its inputs are copied into persistent buffers that the captured graph reads; the
padding rows get slot -1 (the K/V write skips them) and context length 0 (attention writes
zeros), so they touch nothing. Block tables keep a fixed width (blocks of `max_model_len`); columns
past a row's length are never read. The split-K factor depends on the bucket only, so one graph
serves every context length. Prefill and mixed steps run eagerly.

`capture=False` keeps the buffers and the padding but runs the model eagerly on them instead of
replaying a graph (how the buffer wiring is tested without a GPU).
"""

from __future__ import annotations

from typing import Any

import torch

from kvmesh.engine.attention_triton import TritonMeta, num_splits_for
from kvmesh.engine.model import ForwardBatch


def graph_buckets(max_num_seqs: int) -> list[int]:
    """Batch sizes to capture: 1, 2, 4, 8, then every 16, ending exactly at max_num_seqs."""
    small = [b for b in (1, 2, 4, 8) if b < max_num_seqs]
    return small + list(range(16, max_num_seqs, 16)) + [max_num_seqs]


def bucket_for(n: int, buckets: list[int]) -> int | None:
    """The smallest bucket holding n rows (None: too many rows for any graph)."""
    return next((b for b in buckets if b >= n), None)


class DecodeGraphs:
    def __init__(
        self, model: Any, kv_cache: torch.Tensor, max_num_seqs: int, max_blocks_per_seq: int, device: torch.device,
        capture: bool = True,
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.buckets = graph_buckets(max_num_seqs)
        n = self.buckets[-1]
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)  # [N]
        self.positions = torch.zeros(n, dtype=torch.long, device=device)  # [N]
        self.slot_mapping = torch.full((n,), -1, dtype=torch.long, device=device)  # [N]
        self.block_tables = torch.zeros((n, max_blocks_per_seq), dtype=torch.long, device=device)  # [N, W]
        self.seq_lens = torch.zeros(n, dtype=torch.long, device=device)  # [N]
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}  # bucket → logits [bucket, V] written by its graph
        if capture:
            self._capture_all()

    def _batch(self, b: int) -> ForwardBatch:
        hkv = self.model.args.num_kv_heads
        meta = TritonMeta(b, self.block_tables[:b], self.seq_lens[:b], num_splits_for(b, hkv), None)
        return ForwardBatch(self.input_ids[:b], self.positions[:b], self.slot_mapping[:b], meta, None)

    def _capture_all(self) -> None:
        # NOTE: largest bucket first, so the smaller graphs reuse its memory pool. During capture
        # every slot is -1 and every length 0, so capturing writes nothing to the KV cache.
        pool = None
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for b in reversed(self.buckets):
                batch = self._batch(b)
                self.model.forward(batch, self.kv_cache)  # compile the kernels outside the capture
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    self.outputs[b] = self.model.forward(batch, self.kv_cache)
                pool = graph.pool()
                self.graphs[b] = graph
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()

    def supports(self, batch: ForwardBatch) -> bool:
        meta = batch.attn
        return (
            isinstance(meta, TritonMeta) and meta.extend is None and meta.num_decode > 0
            and bucket_for(meta.num_decode, self.buckets) is not None
            and meta.decode_tables.shape[1] <= self.block_tables.shape[1]
        )

    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits [S, V] of a decode batch (`supports(batch)` must hold), through its bucket's graph."""
        meta: TritonMeta = batch.attn
        n = meta.num_decode
        b = bucket_for(n, self.buckets)
        assert b is not None
        w = meta.decode_tables.shape[1]
        self.input_ids[:n].copy_(batch.input_ids, non_blocking=True)
        self.positions[:n].copy_(batch.positions, non_blocking=True)
        self.slot_mapping[:n].copy_(batch.slot_mapping, non_blocking=True)
        self.slot_mapping[n:b].fill_(-1)
        self.block_tables[:n, :w].copy_(meta.decode_tables, non_blocking=True)
        self.seq_lens[:n].copy_(meta.seq_lens, non_blocking=True)
        self.seq_lens[n:b].zero_()
        if b in self.graphs:
            self.graphs[b].replay()
            logits = self.outputs[b]
        else:
            logits = self.model.forward(self._batch(b), self.kv_cache)
        logits = logits[:n]  # [n, V]
        return logits if batch.logits_index is None else logits.index_select(0, batch.logits_index)
