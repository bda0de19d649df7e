"""`LLMEngine`: continuous batching over a paged KV cache, with KV import/export for workers."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from kvmesh.engine.batchstats import BatchCounters
from kvmesh.engine.block_manager import BlockManager
from kvmesh.engine.config import ModelArgs
from kvmesh.engine.constraints import StepConstraints
from kvmesh.engine.memory import CudaMemory, DeviceMemory, MemoryProfile, kv_bytes_from_profile, plan_kv_cache
from kvmesh.engine.promptlogprobs import split_all_logits, wants_prompt_logprobs
from kvmesh.engine.outputs import Completion, ContextLengthError, EngineStats, RequestOutput
from kvmesh.engine.request_state import RequestState
from kvmesh.engine.runner import ModelRunner, resolve_device, resolve_dtype
from kvmesh.engine.sampler import Sampler
from kvmesh.engine.sampling import SamplingParams
from kvmesh.engine.scheduler import Scheduler, SchedulerOutput
from kvmesh.engine.sequence import Sequence, SequenceStatus
from kvmesh.engine.tiny import resolve_model
from kvmesh.engine.tokenizer import Tokenizer
from kvmesh.runtime.blockhash import BlockHasher

log = logging.getLogger(__name__)


@dataclass(slots=True)
class EngineConfig:
    model: str = "tiny"  # a Hugging Face-format directory, or "tiny"
    dtype: str = "auto"
    device: str = "auto"
    block_size: int = 16
    num_kv_blocks: int | None = None  # None = size from free device memory (CUDA) or kv_cache_memory_bytes (CPU)
    kv_cache_memory_bytes: int = 256 * 1024 * 1024  # the KV budget on CPU
    gpu_memory_utilization: float = 0.9  # share of the device's memory this engine may use (CUDA)
    attention_backend: str = "auto"  # auto (triton on CUDA, torch elsewhere) | torch | triton
    enforce_eager: bool = False  # no CUDA graphs for decode
    cpu_row_buckets: bool = True  # CPU: packed linears pad a step's rows to a few counts, so their kernels stay cached (linear.py)
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    model_id: str | None = None  # block-hash model id; default "tiny" or the directory name
    seed: int = 0  # for requests without their own seed


class LLMEngine:
    """`memory`: where KV sizing reads free memory from (default: the CUDA device; none on CPU,
    which uses `kv_cache_memory_bytes`); tests pass a fake to size a cache from set figures."""

    def __init__(self, config: EngineConfig, memory: DeviceMemory | None = None) -> None:
        if config.block_size < 1 or config.max_num_seqs < 1 or config.max_num_batched_tokens < 1:
            raise ValueError("block_size, max_num_seqs and max_num_batched_tokens must be >= 1")
        path = resolve_model(config.model)
        self.config = config
        self.model_args = ModelArgs.from_dir(path)
        self.tokenizer = Tokenizer.from_dir(path)
        self.block_size = config.block_size
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.model_args, self.device)
        model_max = self.model_args.max_position_embeddings
        rope_len = min(config.max_model_len or model_max, model_max)
        self.runner = ModelRunner(
            path, self.model_args, self.dtype, self.device, 0, self.block_size, rope_len, config.attention_backend,
            config.cpu_row_buckets,
        )
        self.sampler = Sampler()
        block_bytes = ModelRunner.bytes_per_block(self.model_args, self.block_size, self.dtype)
        if memory is None and self.device.type == "cuda" and not config.num_kv_blocks:
            memory = CudaMemory(self.device)
        if config.num_kv_blocks:
            kv_bytes = config.num_kv_blocks * block_bytes
        elif memory is not None:
            kv_bytes = kv_bytes_from_profile(self._profile(memory, rope_len), config.gpu_memory_utilization)
        else:
            kv_bytes = config.kv_cache_memory_bytes
        # NOTE: one sequence must always fit the cache on its own, or preemption could not make progress.
        plan = plan_kv_cache(kv_bytes, block_bytes, self.block_size, model_max, config.max_model_len)
        num_blocks = plan.num_blocks
        self.max_model_len = plan.max_model_len
        self.runner.allocate_kv_cache(num_blocks)
        log.info("KV cache: %d blocks of %d tokens (%.2f GiB), max_model_len %d, attention %s",
                 num_blocks, self.block_size, num_blocks * block_bytes / 2**30, self.max_model_len, self.runner.attention.name)
        if self.device.type == "cuda" and self.runner.attention.name == "triton" and not config.enforce_eager:
            self.runner.capture_graphs(config.max_num_seqs, self.max_model_len)
        model_id = config.model_id or ("tiny" if config.model == "tiny" else path.resolve().name)
        self.hasher = BlockHasher(model_id, str(self.dtype).removeprefix("torch."), self.block_size)
        self.eos_token_ids = frozenset(self.model_args.eos_token_ids) | self.tokenizer.eos_token_ids
        self.constraints = StepConstraints(path, self.model_args.vocab_size, self.eos_token_ids)
        self.sampler.processors.append(self.constraints)  # grammar masks, penalties, logit_bias, min_tokens
        self.block_manager = BlockManager(num_blocks, self.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, self.hasher.extend, config.max_num_seqs, config.max_num_batched_tokens)
        self._requests: dict[str, RequestState] = {}
        self._pending: list[RequestOutput] = []  # abort outputs, reported by the next step()
        self._held: dict[str, RequestState] = {}  # requests whose tokens step(hold=True) kept (take_held)
        self.last_step_ran = False  # the last step() ran the model (its outputs may all be held)
        self._generator = torch.Generator()
        self._generator.manual_seed(config.seed)
        self._prompt_tokens_computed = 0
        self._generated_tokens = 0
        self._batches = BatchCounters()

    def _profile(self, memory: DeviceMemory, max_len: int) -> MemoryProfile:
        """One forward pass at the full token budget (and a sampling pass over its logits) to
        measure the activation peak before the KV cache is allocated."""
        c = self.config
        tokens = min(c.max_num_batched_tokens, max_len)
        rows = min(c.max_num_seqs, tokens)
        memory.reset_peak()
        logits = self.runner.profile_forward(tokens, rows)  # [rows, V]
        params = [SamplingParams(temperature=1.0, top_p=0.9, top_k=50, logprobs=5)] * rows
        self.sampler(logits, params, [0] * rows, [0] * rows)
        del logits
        peak = memory.peak_allocated() - memory.allocated()
        free, total = memory.mem_get_info()
        return MemoryProfile(total=total, free=free, activation_peak=max(0, peak))

    # ---- requests ----

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        computed_kv: torch.Tensor | None = None,
        prefill_only: bool = False,
        detokenize: bool = True,
    ) -> None:
        """Queue a request. Raises ContextLengthError (prompt too long) or ValueError (bad input).

        `detokenize=False`: outputs carry token ids only (no text, stop strings not checked)."""
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        params.validate()
        prompt = [int(t) for t in prompt_token_ids]
        if not prompt:
            raise ValueError("prompt_token_ids must not be empty")
        if len(prompt) >= self.max_model_len:
            raise ContextLengthError(len(prompt), self.max_model_len)
        vocab = self.model_args.vocab_size
        if any(t < 0 or t >= vocab for t in prompt):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        if computed_kv is not None:
            computed_kv = self._check_kv(computed_kv, len(prompt) - 1, "computed_kv")
        if params.prompt_logprobs is not None:
            computed_kv = None  # NOTE: every prompt token's logits are needed: compute them here
        seq = Sequence(request_id, prompt, len(prompt), params, prefill_only=prefill_only, computed_kv=computed_kv)
        self.constraints.start(seq)
        seed = params.seed if params.seed is not None else int(torch.randint(0, 2**62, (1,), generator=self._generator))
        self._requests[request_id] = RequestState.create(seq, self.tokenizer, seed, detokenize)
        self.scheduler.add(seq)

    def _check_kv(self, kv: torch.Tensor, max_tokens: int, what: str) -> torch.Tensor:
        a = self.model_args
        shape = tuple(kv.shape)
        if len(shape) != 5 or shape[:2] != (2, a.num_layers) or shape[3:] != (a.num_kv_heads, a.head_dim):
            raise ValueError(f"{what} has shape {shape}; expected [2, {a.num_layers}, k, {a.num_kv_heads}, {a.head_dim}]")
        if shape[2] > max_tokens:
            raise ValueError(f"{what} covers {shape[2]} tokens; at most {max_tokens} (all but the last prompt token)")
        return kv

    def abort_request(self, request_id: str) -> None:
        """Stop a request now; the next step() reports it with finish_reason "abort"."""
        state = self._requests.pop(request_id, None)
        if state is None:
            return
        if state.seq.status == SequenceStatus.PREFILLED:
            self.scheduler.free_blocks(state.seq)
            return
        self.scheduler.finish(state.seq, "abort")
        self._held.pop(request_id, None)
        self._pending.append(state.take_output(True, "abort"))

    def release(self, request_id: str) -> None:
        """Free the blocks of a prefill-finished request (no-op for unknown ids)."""
        state = self._requests.get(request_id)
        if state is not None and state.seq.status == SequenceStatus.PREFILLED:
            del self._requests[request_id]
            self.scheduler.free_blocks(state.seq)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_work()

    def num_unfinished_requests(self) -> int:
        """Requests running or waiting (`stats()`'s two counts, without the rest of it)."""
        return len(self.scheduler.running) + len(self.scheduler.waiting)

    def stats(self) -> EngineStats:
        c = self.scheduler.counters
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_free_blocks=self.block_manager.num_free_blocks,
            num_total_blocks=self.block_manager.num_blocks,
            prefix_query_tokens=c.prefix_query_tokens,
            prefix_hit_tokens=c.prefix_hit_tokens,
            num_preemptions=c.num_preemptions,
            num_prompt_tokens_computed=self._prompt_tokens_computed,
            num_generated_tokens=self._generated_tokens,
            **self._batches.as_fields(),
        )

    def take_kv_events(self) -> list[tuple[str, list[bytes], bytes | None]]:
        """Prefix-cache changes since the last call: ("stored", hashes, parent) / ("removed", hashes, None) /
        ("cleared", [], None), hashes in chain order. Call from the thread that steps the engine."""
        return self.block_manager.take_events()

    # ---- the step loop ----

    def step(self, hold: bool = False) -> list[RequestOutput]:
        """One continuous-batching iteration; outputs for every sequence that advanced.

        With `hold`, a request that has sent output before keeps this step's tokens in its state
        and makes no output: `take_held` returns them, all it made since, when the caller lets
        them go (`worker/outputhold.py`). Its first output and its end still come at once. A held
        step builds no output object per request, which a step per token otherwise does."""
        outputs, self._pending = self._pending, []
        self.last_step_ran = False
        sched = self.scheduler.schedule()
        for seq, start, end in sched.kv_imports:
            self.runner.write_kv(seq.block_table, start, seq.computed_kv[:, :, start:end])
            seq.computed_kv = None  # NOTE: in the cache now; a preempted sequence recomputes (or hits the prefix cache)
        for seq in sched.prefilled:
            self.scheduler.commit_blocks(seq)
            self._finish(seq, "prefill", outputs)
        if not sched.scheduled:
            return outputs
        self.last_step_ran = True
        started, cpu_started = time.perf_counter(), time.thread_time()
        self._batches.started(started)
        for s in sched.scheduled:
            if s.start < s.seq.num_prompt_tokens:  # NOTE: a request's first step computes prompt tokens; decode rows never
                state = self._requests[s.seq.request_id]
                if state.first_step_at is None:
                    state.first_step_at = started
        self._run_step(sched, outputs, hold)
        ended = time.perf_counter()
        self._batches.add(sched.scheduled, ended - started, time.thread_time() - cpu_started)
        self._batches.finished(ended, self.scheduler.has_work())
        return outputs

    def take_held(self) -> list[RequestOutput]:
        """One output a request that `step(hold=True)` kept tokens of: every token (and its text and
        logprobs) made since its last output; none for a request with nothing new since."""
        held, self._held = self._held, {}
        return [state.take_output(False, None) for state in held.values() if state.new_token_ids or state.new_text]

    @property
    def num_held(self) -> int:
        """Requests whose tokens a held step kept (some may have sent them since, unheld)."""
        return len(self._held)

    def _run_step(self, sched: SchedulerOutput, outputs: list[RequestOutput], hold: bool = False) -> None:
        do_sample = [s.start + s.num_new_tokens == s.seq.num_tokens and not s.seq.prefill_only for s in sched.scheduled]
        if wants_prompt_logprobs(sched.scheduled):
            logits = split_all_logits(sched.scheduled, do_sample, self.runner.execute(sched.scheduled, do_sample, all_logits=True))
        else:
            logits = self.runner.execute(sched.scheduled, do_sample)
        sampled = [s.seq for s, d in zip(sched.scheduled, do_sample) if d]
        states = [self._requests[seq.request_id] for seq in sampled]
        self.constraints.bind(sampled)
        tokens, logprobs = self.sampler(
            logits, [s.params for s in sampled], [st.generator for st in states], [seq.num_output_tokens for seq in sampled]
        )
        self.constraints.accept(sampled, tokens)
        for s in sched.scheduled:
            seq = s.seq
            self._prompt_tokens_computed += max(0, min(s.start + s.num_new_tokens, seq.num_prompt_tokens) - s.start)
            seq.num_computed_tokens += s.num_new_tokens
            self.scheduler.commit_blocks(seq)
        sampled_ids = {id(seq): i for i, seq in enumerate(sampled)}
        for s in sched.scheduled:
            seq = s.seq
            state = self._requests[seq.request_id]
            i = sampled_ids.get(id(seq))
            if i is not None and seq.params.max_tokens == 0:  # prompt logprobs only
                self._finish(seq, "length", outputs)
                continue
            if i is not None:
                self._generated_tokens += 1
                reason = state.append_token(tokens[i], logprobs[i], self.eos_token_ids, self.max_model_len)
                if reason is not None:
                    self._finish(seq, reason, outputs)
                    continue
            elif seq.prefill_only and seq.num_computed_tokens >= seq.target_len:
                self._finish(seq, "prefill", outputs)
                continue
            if hold and seq.num_output_tokens > len(state.new_token_ids):  # NOTE: it sent output before
                self._held[seq.request_id] = state
                continue
            outputs.append(state.take_output(False, None))

    def _finish(self, seq: Sequence, reason: str, outputs: list[RequestOutput]) -> None:
        keep = reason == "prefill"
        self.scheduler.finish(seq, reason, keep_blocks=keep)
        self._held.pop(seq.request_id, None)
        state = self._requests[seq.request_id] if keep else self._requests.pop(seq.request_id)
        outputs.append(state.take_output(True, reason))

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[Completion]:
        """Run prompts to completion (a convenience for tests, benchmarks and scripts)."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        ids = [f"generate-{id(self)}-{i}" for i in range(len(prompts))]
        for rid, prompt, p in zip(ids, prompts, plist):
            self.add_request(rid, prompt, p)
        tokens: dict[str, list[int]] = {rid: [] for rid in ids}
        texts: dict[str, list[str]] = {rid: [] for rid in ids}
        logprobs: dict[str, list] = {rid: [] for rid in ids}
        done: dict[str, str | None] = {}
        while len(done) < len(ids):
            outputs = self.step()
            if not outputs and not self.scheduler.running:
                raise RuntimeError("engine cannot make progress: the KV cache is held by prefilled requests awaiting release")
            for out in outputs:
                if out.request_id not in tokens:
                    continue
                tokens[out.request_id].extend(out.new_token_ids)
                texts[out.request_id].append(out.new_text)
                logprobs[out.request_id].extend(out.logprobs or [])
                if out.finished:
                    done[out.request_id] = out.finish_reason
        return [
            Completion(tokens[r], "".join(texts[r]), done[r], logprobs[r] if p.logprobs is not None else None)
            for r, p in zip(ids, plist)
        ]

    # ---- KV movement ----

    def export_kv(self, request_id: str, start: int, end: int) -> torch.Tensor:
        """KV of tokens [start, end) of a live or prefilled request: [2, L, end-start, Hkv, D] on CPU."""
        state = self._requests.get(request_id)
        if state is None:
            raise KeyError(f"unknown request id {request_id!r}")
        seq = state.seq
        if not 0 <= start <= end <= seq.num_computed_tokens:
            raise ValueError(f"range [{start}, {end}) outside the {seq.num_computed_tokens} computed tokens of {request_id!r}")
        return self.runner.read_kv(seq.block_table, start, end)

    def cached_prefix_blocks(self, token_ids: list[int]) -> int:
        """How many leading full blocks of `token_ids` this engine holds in its prefix cache."""
        return len(self.block_manager.match_prefix(self.hasher.hashes(token_ids), token_ids))

    def export_cached_blocks(self, token_ids: list[int], start_block: int = 0) -> list[torch.Tensor]:
        """KV of cached full blocks from `start_block` on, each [2, L, block_size, Hkv, D] (CPU)."""
        hits = self.block_manager.match_prefix(self.hasher.hashes(token_ids), token_ids)[start_block:]
        return list(self.runner.read_blocks(hits).unbind(0))

    def pin_cached_blocks(self, token_ids: list[int], start_block: int = 0) -> list[int]:
        """Ids of the cached full blocks of `token_ids` from `start_block` on, referenced so they
        are neither evicted nor overwritten until `unpin_blocks`: another thread may then copy
        them with `read_blocks` while this engine keeps stepping."""
        hits = self.block_manager.match_prefix(self.hasher.hashes(token_ids), token_ids)[start_block:]
        self.block_manager.take(hits)
        return hits

    def unpin_blocks(self, block_ids: list[int]) -> None:
        """Drop the references `pin_cached_blocks` took (call from the engine's thread)."""
        self.block_manager.free(block_ids)

    def read_blocks(self, block_ids: list[int]) -> torch.Tensor:
        """KV of pinned blocks as one tensor [n, 2, L, block_size, Hkv, D] on CPU (block i of it is
        `block_ids[i]`); safe off the engine thread."""
        return self.runner.read_blocks(block_ids)

    def import_cached_blocks(self, token_ids: list[int], blocks: list[torch.Tensor], start_block: int = 0) -> int:
        """Insert blocks computed elsewhere as cached free blocks.

        Block i holds tokens of block `start_block + i` of `token_ids`. Returns how many of the
        given blocks are now in the cache (stored now or already there), stopping at the first
        that cannot be stored (no evictable block).
        """
        hashes = self.hasher.hashes(token_ids)
        bs = self.block_size
        stored = 0
        for i, kv in enumerate(blocks):
            idx = start_block + i
            if idx >= len(hashes):
                raise ValueError(f"block {idx} is not a full block of the given {len(token_ids)} tokens")
            self._check_kv(kv, bs, f"block {idx}")
            if kv.shape[2] != bs:
                raise ValueError(f"block {idx} holds {kv.shape[2]} tokens; expected {bs}")
            block_tokens = token_ids[idx * bs : (idx + 1) * bs]
            if self.block_manager.lookup(hashes[idx], block_tokens) is None:
                parent = hashes[idx - 1] if idx else None
                block_id = self.block_manager.import_block(hashes[idx], block_tokens, parent)
                if block_id is None:
                    break
                self.runner.write_block(block_id, kv)
            stored += 1
        return stored
