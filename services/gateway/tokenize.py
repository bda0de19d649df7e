"""POST /tokenize and /detokenize in vLLM's shapes (pure over the served model's tokenizer).

/tokenize takes either `prompt` (text; `add_special_tokens` default true) or chat `messages`
(`add_generation_prompt` default true, optional `tools`; by default the ids a chat completion
would get) and
answers `{"count", "max_model_len", "tokens", "token_strs"}`; /detokenize takes `tokens` and
answers `{"prompt"}`.
"""

from __future__ import annotations

from typing import Any

from .errors import invalid, model_not_found
from .messages import chat_messages
from .prompt import ServedModel
from .protocol import Body, ChatMessage
from .structured import parse_tools

MAX_TOKENS_IN = 1_000_000


class _Body(Body):
    model: str | None = None


class TokenizeBody(_Body):
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    return_token_strs: bool = False
    tools: list[dict[str, Any]] | None = None


class DetokenizeBody(_Body):
    tokens: list[int]


def tokenize(model: ServedModel, body: TokenizeBody) -> dict[str, Any]:
    _check_model(model, body.model)
    if (body.prompt is None) == (body.messages is None):
        raise invalid("Give exactly one of 'prompt' or 'messages'.", "prompt")
    if body.messages is not None:
        tools = [t.as_dict() for t in parse_tools(body.tools)] or None
        text = model.render_chat(list(chat_messages(body.messages)), tools, body.add_generation_prompt)
        # NOTE: by default the same ids a chat completion would use (BOS only where the template lacks it).
        if body.add_special_tokens is None:
            ids = model.encode_rendered(text)
        else:
            ids = model.tokenizer.encode(text, add_special_tokens=body.add_special_tokens)
    else:
        special = True if body.add_special_tokens is None else body.add_special_tokens
        ids = model.tokenizer.encode(body.prompt or "", add_special_tokens=special)
    strs = [model.token_text(t) for t in ids] if body.return_token_strs else None
    return {"count": len(ids), "max_model_len": model.max_model_len, "tokens": ids, "token_strs": strs}


def detokenize(model: ServedModel, body: DetokenizeBody) -> dict[str, Any]:
    _check_model(model, body.model)
    if len(body.tokens) > MAX_TOKENS_IN:
        raise invalid(f"At most {MAX_TOKENS_IN} tokens can be detokenized at once.", "tokens")
    bad = [t for t in body.tokens if not 0 <= t < model.vocab_size]
    if bad:
        raise invalid(f"Token id {bad[0]} is out of vocabulary (size {model.vocab_size}).", "tokens")
    return {"prompt": model.tokenizer.decode(body.tokens)}


def _check_model(model: ServedModel, name: str | None) -> None:
    if name is not None and name != model.name:
        raise model_not_found(name)
