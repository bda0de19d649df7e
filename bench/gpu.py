"""The engine on a GPU against the hardware's limits and HF `generate`, all measured in one run.

    python bench/gpu.py            # CUDA: about 5-8 minutes on an H200
    python bench/gpu.py --smoke    # CPU: toy sizes, kernels in Triton's interpreter (a check, not a figure)

Needs only torch (with triton), transformers, safetensors, tokenizers, jinja2 and numpy; no network
and no install of kvmesh (it imports the engine from this checkout when kvmesh is not installed).
Prints: copy bandwidth; the Triton kernels against the gather + SDPA reference; per model shape
(random bf16 weights in Qwen2.5-0.5B and Llama-3-8B shapes), decode tok/s at batch 1/32/64 for
the engine and HF `generate` on the same weights, their ratio and the fraction of the bandwidth
bound (batch × bandwidth ÷ bytes read per step); prefill tok/s of a 4,096-token prompt against
the bf16 FLOP bound.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHAPES = {
    "qwen2.5-0.5b": dict(arch="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1000000.0),
    "llama-3-8b": dict(arch="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False, rope_theta=500000.0),
    "toy": dict(arch="llama", vocab_size=264, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False, rope_theta=10000.0),
}


def import_kvmesh() -> None:
    """Use the installed kvmesh, or map this checkout's services/ to the `kvmesh` package."""
    try:
        import kvmesh.engine  # noqa: F401, PLC0415
    except ImportError:
        spec = importlib.util.spec_from_file_location(
            "kvmesh", HERE.parent / "services" / "__init__.py", submodule_search_locations=[str(HERE.parent / "services")]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules["kvmesh"] = module
        spec.loader.exec_module(module)


def sync(torch) -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def copy_bandwidth(torch, device, nbytes: int) -> float:
    """Device-to-device copy, bytes read + written per second (best of 10)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(10):
        sync(torch)
        t0 = time.perf_counter()
        dst.copy_(src)
        sync(torch)
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best


def build_checkpoint(torch, shape: str, root: Path, device, dtype, max_len: int):
    """Random HF model on `device` (kept for `generate`) and its safetensors dir for the engine."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM  # noqa: PLC0415

    from kvmesh.engine.tiny import ensure_tiny_model  # noqa: PLC0415

    spec = dict(SHAPES[shape])
    arch = spec.pop("arch")
    cfg_cls, model_cls = (LlamaConfig, LlamaForCausalLM) if arch == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    config = cfg_cls(**spec, max_position_embeddings=max_len, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = model_cls(config).eval()
    finally:
        torch.set_default_dtype(default)
    path = root / shape
    model.save_pretrained(str(path))
    tiny = ensure_tiny_model(root / "cache")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny / name, path / name)
    return model, path


def time_hf(torch, model, prompts, new_tokens: int) -> float:
    ids = torch.tensor(prompts, device=model.device)
    sync(torch)
    t0 = time.perf_counter()
    with torch.inference_mode():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                       do_sample=False, eos_token_id=None, pad_token_id=0)
    sync(torch)
    return time.perf_counter() - t0


def time_ours(torch, engine, prompts, new_tokens: int) -> float:
    from kvmesh.engine.sampling import SamplingParams  # noqa: PLC0415

    sync(torch)
    t0 = time.perf_counter()
    out = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True))
    sync(torch)
    if any(len(c.token_ids) != new_tokens for c in out):
        raise RuntimeError("engine produced the wrong number of tokens")
    return time.perf_counter() - t0


def decode_rate(timer, batch: int, new_tokens: int, rounds: int) -> float:
    """batch × (N − 1) ÷ (t(N tokens) − t(1 token)): prefill excluded; best of rounds."""
    timer(2)
    t1 = min(timer(1) for _ in range(rounds))
    tn = min(timer(new_tokens) for _ in range(rounds))
    return batch * (new_tokens - 1) / (tn - t1)


def step_bytes(args, weight_bytes: int, embed_bytes: int, batch: int, context: int, elem: int) -> float:
    """Bytes one decode step reads: every weight but the embedding rows not looked up, plus the KV of each row."""
    kv = 2 * args.num_layers * args.kv_size * elem * context * batch
    return weight_bytes - (embed_bytes if not args.tie_word_embeddings else 0) + kv


def run_shape(torch, shape: str, opts, device, bandwidth: float, root: Path) -> None:
    from kvmesh.engine.config import ModelArgs  # noqa: PLC0415
    from kvmesh.engine.llm import EngineConfig, LLMEngine  # noqa: PLC0415

    dtype = torch.float32 if opts.smoke else torch.bfloat16
    elem = torch.empty((), dtype=dtype).element_size()
    max_len = max(opts.prompt_len + opts.new_tokens, opts.prefill_len) + 16
    hf, path = build_checkpoint(torch, shape, root, device, dtype, max_len)
    args = ModelArgs.from_dir(path)
    weight_bytes = sum(p.numel() for p in hf.parameters()) * elem
    embed_bytes = args.vocab_size * args.hidden_size * elem
    gen = torch.Generator().manual_seed(1)
    prompts = {b: torch.randint(0, args.vocab_size, (b, opts.prompt_len), generator=gen).tolist() for b in opts.batches}
    hf_rates = {b: decode_rate(lambda n, b=b: time_hf(torch, hf, prompts[b], n), b, opts.new_tokens, opts.rounds)
                for b in opts.batches}
    del hf
    if device.type == "cuda":
        torch.cuda.empty_cache()
    engine = LLMEngine(EngineConfig(
        model=str(path), dtype=str(dtype).removeprefix("torch."), device=device.type, enable_prefix_caching=False,
        max_num_seqs=max(opts.batches), max_num_batched_tokens=max(opts.prefill_len, 2048),
        # NOTE: the smoke run times the CPU reference backend: interpreted kernels take seconds a step.
        attention_backend="auto", enforce_eager=opts.enforce_eager, gpu_memory_utilization=0.85,
    ))
    print(f"\n{shape}: {weight_bytes / 1e9:.2f} GB of weights ({dtype}), {args.num_layers} layers, "
          f"KV cache {engine.block_manager.num_blocks} blocks, max_model_len {engine.max_model_len}")
    print(f"{'batch':>5} {'ours tok/s':>11} {'HF tok/s':>9} {'ratio':>7} {'bound tok/s':>12} {'of bound':>9}")
    context = opts.prompt_len + opts.new_tokens // 2
    for b in opts.batches:
        ours = decode_rate(lambda n, b=b: time_ours(torch, engine, prompts[b], n), b, opts.new_tokens, opts.rounds)
        bound = b * bandwidth / step_bytes(args, weight_bytes, embed_bytes, b, context, elem)
        print(f"{b:>5} {ours:>11.1f} {hf_rates[b]:>9.1f} {ours / hf_rates[b]:>6.1f}x {bound:>12.0f} {ours / bound:>8.1%}", flush=True)
    prefill = [torch.randint(0, args.vocab_size, (opts.prefill_len,), generator=gen).tolist()]
    t = min(time_ours(torch, engine, prefill, 1) for _ in range(opts.rounds))
    flops = 2 * (weight_bytes // elem - embed_bytes // elem) * opts.prefill_len + \
        2 * args.num_layers * args.num_heads * args.head_dim * opts.prefill_len ** 2  # matmuls + causal attention
    rate, bound = opts.prefill_len / t, opts.prefill_len / (flops / (opts.peak_tflops * 1e12))
    print(f"prefill {opts.prefill_len} tokens: {rate:.0f} tok/s; FLOP bound {bound:.0f} tok/s "
          f"at {opts.peak_tflops:.0f} TFLOP/s: {rate / bound:.1%}")
    del engine
    shutil.rmtree(path, ignore_errors=True)
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="CPU check at toy sizes (kernels interpreted)")
    ap.add_argument("--shapes", nargs="+", default=None, choices=sorted(SHAPES))
    ap.add_argument("--batches", type=int, nargs="+", default=None)
    ap.add_argument("--prompt-len", type=int, default=None)
    ap.add_argument("--new-tokens", type=int, default=None)
    ap.add_argument("--prefill-len", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=None, help="best of this many timings (default 2; smoke 1)")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H200 SXM: 989)")
    ap.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    opts = ap.parse_args()
    if opts.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
    import torch  # noqa: PLC0415

    if not opts.smoke and not torch.cuda.is_available():
        print("bench/gpu.py needs a CUDA device (torch.cuda.is_available() is False); "
              "run `python bench/gpu.py --smoke` for the CPU check.", file=sys.stderr)
        return 2
    smoke = dict(shapes=["toy"], batches=[1, 2], prompt_len=16, new_tokens=4, prefill_len=64, rounds=1)
    full = dict(shapes=["qwen2.5-0.5b", "llama-3-8b"], batches=[1, 32, 64], prompt_len=512, new_tokens=128, prefill_len=4096,
                rounds=2)
    for key, value in (smoke if opts.smoke else full).items():
        if getattr(opts, key) is None:
            setattr(opts, key, value)
    import_kvmesh()
    from kernels_check import check_kernels  # noqa: PLC0415

    device = torch.device("cpu" if opts.smoke else "cuda")
    bandwidth = copy_bandwidth(torch, device, (64 << 20) if opts.smoke else (4 << 30))
    print(f"device {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu (smoke)'}; torch {torch.__version__}")
    print(f"copy bandwidth (read + write): {bandwidth / 1e9:.0f} GB/s")
    check_kernels(torch, device, small=opts.smoke)
    root = Path(tempfile.mkdtemp(prefix="kvmesh-gpu-bench-"))
    try:
        for shape in opts.shapes:
            run_shape(torch, shape, opts, device, bandwidth, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
