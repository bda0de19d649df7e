"""The served model as the gateway sees it: tokenizer, chat template, context length, block hashes.

Torch-free: only the tokenizer and config.json are loaded. `prepare` turns a validated request
into prompt token ids, the chained block hashes of the prompt, and the resolved max_tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from kvmesh.engine.config import ModelArgs
from kvmesh.engine.tiny import resolve_model
from kvmesh.engine.tokenizer import Tokenizer
from kvmesh.runtime.blockhash import BlockHasher, resolve_dtype

from .config import GatewaySettings
from .errors import ApiError, invalid
from .protocol import Endpoint, GenerationRequest


@dataclass(frozen=True, slots=True)
class PreparedPrompt:
    token_ids: list[int]
    block_hashes: list[bytes]
    max_tokens: int


@dataclass(slots=True)
class ServedModel:
    name: str
    tokenizer: Tokenizer
    hasher: BlockHasher
    max_model_len: int
    vocab_size: int
    created: int

    @classmethod
    def load(cls, settings: GatewaySettings) -> ServedModel:
        path = resolve_model(settings.model)
        args = ModelArgs.from_dir(path)
        name = settings.served_model_name()
        hasher = BlockHasher(name, resolve_dtype(settings.dtype, args.torch_dtype), settings.block_size)
        max_model_len = settings.max_model_len or args.max_position_embeddings
        tokenizer = Tokenizer.from_dir(path)
        tokenizer.byte_table()  # NOTE: built here, not by the first request (~0.2 s for a 150k vocabulary)
        return cls(name, tokenizer, hasher, max_model_len, args.vocab_size, int(time.time()))

    def prepare(self, request: GenerationRequest, default_max_tokens: int) -> PreparedPrompt:
        """Tokenize, check the context length, resolve max_tokens, hash the prompt's full blocks."""
        token_ids = self.tokenize(request)
        max_tokens = resolve_max_tokens(
            len(token_ids), request.max_tokens, self.max_model_len, default_max_tokens, _prompt_param(request)
        )
        bad = [t for t in request.sampling.stop_token_ids if t >= self.vocab_size]
        if bad:
            raise invalid(f"stop_token_ids must be below the vocabulary size {self.vocab_size}, got {bad[0]}.", "stop_token_ids")
        bad = [t for t, _ in request.sampling.logit_bias if t >= self.vocab_size]
        if bad:
            raise invalid(f"logit_bias names token {bad[0]}, outside the vocabulary (size {self.vocab_size}).", "logit_bias")
        return PreparedPrompt(token_ids, self.hasher.hashes(token_ids), max_tokens)

    def tokenize(self, request: GenerationRequest) -> list[int]:
        if request.prompt_token_ids is not None:
            bad = [t for t in request.prompt_token_ids if t >= self.vocab_size]
            if bad:
                raise invalid(f"Token id {bad[0]} is out of vocabulary (size {self.vocab_size}).", "prompt")
            return list(request.prompt_token_ids)
        if request.messages is not None:
            tools = [t.as_dict() for t in request.tools] if request.tools else None
            return self.encode_rendered(self.render_chat(list(request.messages), tools))
        return self.tokenizer.encode(request.prompt or "", add_special_tokens=True)

    def render_chat(self, messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = True) -> str:
        """The chat template's text for `messages`, with `tools` passed to the template (as HF does)."""
        try:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tools=tools)
        except Exception as exc:  # noqa: BLE001 - a template raising on user input is a 400
            raise invalid(f"The chat template cannot render these messages: {exc}", "messages") from exc

    def encode_rendered(self, text: str) -> list[int]:
        # NOTE: templates that already start with the BOS token must not get a second one; for
        # the others (e.g. tiny's) the tokenizer adds it as it does for plain prompts.
        bos = self.tokenizer.bos_token
        return self.tokenizer.encode(text, add_special_tokens=not (bos and text.startswith(bos)))

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)


def _prompt_param(request: GenerationRequest) -> str:
    return "messages" if request.endpoint is Endpoint.CHAT else "prompt"


def resolve_max_tokens(
    num_prompt_tokens: int, max_tokens: int | None, max_model_len: int, default_max_tokens: int, param: str = "messages"
) -> int:
    """max_tokens for the decode worker, or a 400 with vLLM's context-length message."""
    if num_prompt_tokens >= max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{num_prompt_tokens} input tokens. Please reduce the length of the input messages.",
            param,
            "context_length_exceeded",
        )
    if max_tokens is None:
        return min(max_model_len - num_prompt_tokens, default_max_tokens)
    if num_prompt_tokens + max_tokens > max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the messages, {max_tokens} in the "
            "completion). Please reduce the length of the messages or completion.",
            param,
            "context_length_exceeded",
        )
    return max_tokens
