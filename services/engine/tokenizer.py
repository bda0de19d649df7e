"""Tokenizer and chat template from a Hugging Face-format model directory (torch-free)."""

from __future__ import annotations

import copy
import json
from datetime import datetime
from pathlib import Path
from typing import Any

from kvmesh.engine.bytelevel import ByteLevelDetokenizer, byte_table
from kvmesh.engine.config import ModelLoadError

_CONTEXT_TOKENS = 5  # prompt tokens kept as left context when decoding output incrementally


class Tokenizer:
    """`tokenizers` tokenizer + jinja2 chat template + special token ids."""

    def __init__(
        self,
        hf_tokenizer: Any,
        chat_template: str | None,
        bos_token: str | None,
        eos_token: str | None,
        eos_token_ids: frozenset[int],
        bos_token_id: int | None,
    ) -> None:
        self._tok = hf_tokenizer
        # NOTE: `encode_batch_fast` (tokenizers >= 0.20) is `encode` without each token's character
        # offsets, which nothing here reads: half the CPU of a chat prompt's encode (~10 against ~21
        # µs for bench/tokcost.py's prompts), paid by the gateway on every request. A one-prompt
        # batch runs on the calling thread (no rayon pool, so no fork warning later).
        self._encode_fast = getattr(hf_tokenizer, "encode_batch_fast", None)
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.eos_token_ids = eos_token_ids
        self.bos_token_id = bos_token_id
        self._template: Any = None
        self._byte_tables: dict[bool, list[bytes] | None] = {}

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        from tokenizers import Tokenizer as HFTokenizer

        path = Path(path)
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise ModelLoadError(f"{tok_file}: file not found; expected a `tokenizers` tokenizer.json")
        try:
            hf = HFTokenizer.from_file(str(tok_file))
        except Exception as exc:  # tokenizers raises a bare Exception on bad files
            raise ModelLoadError(f"{tok_file}: cannot be parsed as a tokenizers tokenizer.json ({exc})") from exc
        tok_cfg = _json_or_empty(path / "tokenizer_config.json")
        bos = _token_str(tok_cfg.get("bos_token"))
        eos = _token_str(tok_cfg.get("eos_token"))
        eos_ids = set(_model_eos_ids(path))
        if eos is not None and hf.token_to_id(eos) is not None:
            eos_ids.add(hf.token_to_id(eos))
        bos_id = hf.token_to_id(bos) if bos is not None else None
        if bos_id is None:
            bos_id = _json_or_empty(path / "config.json").get("bos_token_id")
        return cls(hf, _chat_template(path, tok_cfg), bos, eos, frozenset(eos_ids), bos_id)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self._encode_fast is not None:
            return self._encode_fast([text], add_special_tokens=add_special_tokens)[0].ids
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def byte_table(self, skip_special_tokens: bool = True) -> list[bytes] | None:
        """Each token id's bytes for a byte-level BPE tokenizer, None for any other (see
        `bytelevel.byte_table`); built on first use (the gateway's at start-up) and kept."""
        if skip_special_tokens not in self._byte_tables:
            self._byte_tables[skip_special_tokens] = byte_table(self._tok, skip_special_tokens)
        return self._byte_tables[skip_special_tokens]

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """Render the model's chat template (from tokenizer_config.json) with jinja2."""
        if self.chat_template is None:
            raise ValueError("this model has no chat template (tokenizer_config.json has no 'chat_template')")
        if self._template is None:
            self._template = _compile_template(self.chat_template)
        return self._template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            **kwargs,
        )


def detokenizer(tokenizer: Tokenizer, prompt_token_ids: list[int] = (), skip_special_tokens: bool = True) -> Detokenizer:
    """A request's incremental detokenizer: by the byte table for a byte-level BPE tokenizer
    (`Tokenizer.byte_table`), else by `tokenizers`' DecodeStream."""
    table = tokenizer.byte_table(skip_special_tokens)
    if table is not None:
        return ByteLevelDetokenizer(table)
    return IncrementalDetokenizer(tokenizer, prompt_token_ids, skip_special_tokens)


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas, never splitting a multi-byte character.

    `tokenizers`' DecodeStream does the work (in Rust, O(1) per token), primed with the last few
    prompt tokens so a leading space or merge renders as it would in the full text. `push_many`
    takes the tokens that arrived together in one call: the gateway gets a request's tokens a few
    at a time (the worker's stream interval), and a step of DecodeStream costs two decodes however
    many tokens it takes. A byte-level BPE tokenizer's requests use `ByteLevelDetokenizer`
    instead (`detokenizer`), which has the same methods.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int] = (), skip_special_tokens: bool = True) -> None:
        from tokenizers.decoders import DecodeStream

        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._stream = DecodeStream(list(prompt_token_ids[-_CONTEXT_TOKENS:]), skip_special_tokens=skip_special_tokens)
        self._held: list[int] = []  # tokens of a character not yet complete

    def push(self, token_id: int) -> str:
        """Add one token; return the newly completed text (possibly empty)."""
        text = self._stream.step(self._tokenizer._tok, token_id)
        if text is None:
            self._held.append(token_id)
            return ""
        self._held.clear()
        return text

    def push_many(self, token_ids: list[int]) -> str:
        """Add several tokens; return the newly completed text: what `push` of each would have
        returned, joined, and with the same tokens held back (those of an incomplete character)."""
        if len(token_ids) == 1:
            return self.push(token_ids[0])
        before = copy.copy(self._stream)  # NOTE: a copy of the stream's state (~0.2 µs): a few ids and a string
        text = self._stream.step(self._tokenizer._tok, token_ids)
        if text is not None:
            self._held.clear()
            return text
        # NOTE: the tokens end inside a character: one by one, so the characters before it go out now
        # and only the incomplete one's tokens are held (what `flush` decodes on its own). Rare in
        # text; `tiny`'s random bytes do it in ~40% of its calls, and gain nothing from batching.
        self._stream = before
        return "".join([self.push(t) for t in token_ids])

    def snapshot(self) -> tuple[Any, list[int]]:
        """The state, for `restore`: text made from here on can be made again."""
        return copy.copy(self._stream), list(self._held)

    def restore(self, state: tuple[Any, list[int]]) -> None:
        self._stream, held = state
        self._held = list(held)

    def held_text(self) -> str:
        """What `flush` would return now, without taking it."""
        return self._tokenizer.decode(self._held, self._skip) if self._held else ""

    def flush(self) -> str:
        """Text of tokens still held back (an incomplete character decodes to U+FFFD)."""
        if not self._held:
            return ""
        text, self._held = self._tokenizer.decode(self._held, self._skip), []
        return text


Detokenizer = ByteLevelDetokenizer | IncrementalDetokenizer  # what `detokenizer` gives


class _ChatTemplate:
    """A compiled chat template; `render(**vars)` as jinja2's `Template.render`, less its per-call
    copy of the template's globals.

    NOTE: `Template.render` builds each call's context as `dict(template.globals, **vars)`, and
    `template.globals` is a ChainMap over the environment's: iterating it was ~6 of the ~8 µs of
    rendering a short chat (~35 µs in a loaded gateway, one in every request's path). The globals
    are fixed once the template is compiled, so they are copied to a dict here once, and a call's
    context is that dict and its own vars."""

    __slots__ = ("template", "_globals", "_new_context")

    def __init__(self, template: Any) -> None:
        from jinja2.runtime import new_context

        self.template = template
        self._globals = dict(template.globals)
        self._new_context = new_context

    def render(self, **variables: Any) -> str:
        t = self.template
        context = self._new_context(t.environment, t.name, t.blocks, {**self._globals, **variables}, True, self._globals)
        try:
            return t.environment.concat(t.root_render_func(context))
        except Exception:
            t.environment.handle_exception()  # raises (as Template.render does: a TemplateError stays one)
            raise


def _compile_template(source: str) -> _ChatTemplate:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    def tojson(value: Any, indent: int | None = None) -> str:
        return json.dumps(value, ensure_ascii=False, indent=indent)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return _ChatTemplate(env.from_string(source))


def _chat_template(path: Path, tok_cfg: dict[str, Any]) -> str | None:
    jinja_file = path / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = tok_cfg.get("chat_template")
    if isinstance(template, list):  # named templates: pick "default"
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None


def _token_str(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _model_eos_ids(path: Path) -> list[int]:
    for name in ("generation_config.json", "config.json"):
        value = _json_or_empty(path / name).get("eos_token_id")
        if value is not None:
            return [int(v) for v in (value if isinstance(value, list) else [value])]
    return []


def _json_or_empty(file: Path) -> dict[str, Any]:
    if not file.is_file():
        return {}
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{file}: not valid JSON ({exc})") from exc
