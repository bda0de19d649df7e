"""kvmesh engine: torch model, checkpoint + tokenizer loading, paged KV cache, sampler, step loop.

This package root stays torch-free; import `kvmesh.engine.llm` for the engine itself.
"""

from __future__ import annotations

from kvmesh.engine.config import ModelArgs, ModelLoadError
from kvmesh.engine.outputs import Completion, ContextLengthError, EngineStats, RequestOutput, TokenLogprob
from kvmesh.engine.sampling import SamplingParams

__all__ = [
    "Completion",
    "ContextLengthError",
    "EngineConfig",
    "EngineStats",
    "LLMEngine",
    "ModelArgs",
    "ModelLoadError",
    "RequestOutput",
    "SamplingParams",
    "TokenLogprob",
]


def __getattr__(name: str):
    # NOTE: lazy so that importing kvmesh.engine never pulls in torch.
    if name in ("LLMEngine", "EngineConfig"):
        from kvmesh.engine import llm

        return getattr(llm, name)
    raise AttributeError(f"module 'kvmesh.engine' has no attribute {name!r}")
