"""Tokenizer, chat template, incremental detokenization, stop strings and the tiny model files."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from kvmesh.engine.stops import StopStringMatcher
from kvmesh.engine.tiny import ensure_tiny_model, resolve_model
from kvmesh.engine.tokenizer import IncrementalDetokenizer, Tokenizer, detokenizer


def test_byte_level_round_trip_with_bos(tiny_dir: Path) -> None:
    tok = Tokenizer.from_dir(tiny_dir)
    ids = tok.encode("héllo 世界")
    assert ids[0] == tok.bos_token_id == 256
    assert ids[1:] == list("héllo 世界".encode())
    assert tok.decode(ids) == "héllo 世界"
    assert tok.encode("hi", add_special_tokens=False) == [104, 105]
    assert tok.vocab_size == 264 and tok.eos_token_ids == frozenset({257, 262})


def test_chat_template_renders_with_jinja(tiny_dir: Path) -> None:
    tok = Tokenizer.from_dir(tiny_dir)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(messages)
    assert text == "<|system|>be brief<|end|><|user|>hi<|end|><|assistant|>"
    assert tok.encode(text, add_special_tokens=False)[:1] == [259]  # <|system|> is one special token
    assert not tok.apply_chat_template(messages, add_generation_prompt=False).endswith("<|assistant|>")


TEMPLATE_FEATURES = (
    "{%- set ns = namespace(n=0) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'skip' %}{% continue %}{% endif -%}"
    "{%- set ns.n = ns.n + 1 -%}<{{ m['role'] }}>{{ m['content'] | trim }}{{ eos_token }}"
    "{%- if m.get('tool_calls') %}{{ m['tool_calls'] | tojson }}{% endif %}{%- endfor -%}"
    "{{ ns.n }}{% for i in range(2) %}.{% endfor %}{{ strftime_now('%Y')[:2] }}"
    "{%- if add_generation_prompt %}<assistant>{% endif %}"
    "{%- if messages | length > 3 %}{{ raise_exception('too many messages') }}{% endif %}"
)


def test_chat_template_renders_as_jinjas_own_render_does(tiny_dir: Path) -> None:
    """The template's globals are copied once (not on every render): the text, and the errors, are jinja2's own."""
    import jinja2
    import pytest

    tok = Tokenizer.from_dir(tiny_dir)
    tok.chat_template, tok._template = TEMPLATE_FEATURES, None
    messages = [{"role": "user", "content": " hi "}, {"role": "skip", "content": "x"},
                {"role": "assistant", "content": "ok", "tool_calls": [{"name": "f", "arguments": "{}"}]}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True)
    jinja_text = tok._template.template.render(messages=messages, add_generation_prompt=True, bos_token=tok.bos_token or "",
                                               eos_token=tok.eos_token or "")
    assert text == jinja_text and text.startswith("<user>hi") and "2..20" in text and text.endswith("<assistant>")
    with pytest.raises(jinja2.TemplateError, match="too many messages"):
        tok.apply_chat_template(messages * 2)
    no_content = [{"role": "user"}]  # an undefined value renders as jinja2 renders it
    assert tok.apply_chat_template(no_content) == tok._template.template.render(
        messages=no_content, add_generation_prompt=True, bos_token=tok.bos_token or "", eos_token=tok.eos_token or "")


@pytest.mark.parametrize("make", [detokenizer, IncrementalDetokenizer], ids=["byte table", "DecodeStream"])
def test_incremental_detokenizer_never_splits_characters(tiny_dir: Path, make) -> None:
    tok = Tokenizer.from_dir(tiny_dir)
    text = "añb 世界 ok"
    detok = make(tok, tok.encode("prompt"))
    deltas = [detok.push(t) for t in tok.encode(text, add_special_tokens=False)]
    assert "".join(deltas) == text
    assert "\ufffd" not in "".join(deltas)
    assert detok.push(257) == ""  # special tokens are skipped


def test_stop_matcher_cuts_and_holds_back() -> None:
    m = StopStringMatcher(("STOP", "\n\n"))
    assert m.add("hello S") == ("hello ", False)  # "S" could start "STOP": held back
    assert m.add("T") == ("", False)
    assert m.add("ay") == ("STay", False)
    assert m.add(" then ST") == (" then ", False)
    assert m.add("OP and more") == ("", True)
    assert m.text == "hello STay then "


def test_stop_matcher_flush_releases_held_text() -> None:
    m = StopStringMatcher(("abc",))
    assert m.add("xxab") == ("xx", False)
    assert m.flush() == "ab"
    assert StopStringMatcher(()).add("anything") == ("anything", False)


def test_tiny_model_is_deterministic_and_written_once(tmp_path: Path) -> None:
    a = ensure_tiny_model(tmp_path / "a")
    b = ensure_tiny_model(tmp_path / "b")
    assert ensure_tiny_model(tmp_path / "a") == a
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert hashlib.sha256((a / name).read_bytes()).digest() == hashlib.sha256((b / name).read_bytes()).digest()
    assert sorted(p.name for p in a.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"
    ]
    assert resolve_model(str(a)) == a


def test_resolve_tiny_uses_model_cache_env(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("KVMESH_MODEL_CACHE", str(tmp_path))
    assert resolve_model("tiny") == tmp_path / "tiny-v1"


def test_torch_free_modules_do_not_import_torch() -> None:
    code = (
        "import sys; import kvmesh.engine, kvmesh.engine.config, kvmesh.engine.tokenizer, kvmesh.engine.tiny, "
        "kvmesh.engine.sampling, kvmesh.engine.outputs, kvmesh.engine.block_manager, kvmesh.engine.scheduler; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_encode_gives_the_ids_of_a_full_encode_on_a_bpe_with_merges(tmp_path: Path) -> None:
    """`Tokenizer.encode` skips the offsets (`encode_batch_fast`); the ids are a full encode's."""
    from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, processors, trainers

    hf = HFTokenizer(models.BPE(unk_token=None))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    corpus = ["the sky is blue because of rayleigh scattering", "héllo 世界, the sky", "why is the sky blue?"] * 20
    hf.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "<|user|>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", hf.token_to_id("<s>"))])
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer.from_dir(tmp_path)
    texts = ["", " ", "why is the sky blue?", "<|user|>the sky (#17)", "héllo 世界\n\ttabs  and  spaces", "x" * 300]
    for text in texts:
        for special in (True, False):
            assert tok.encode(text, add_special_tokens=special) == hf.encode(text, add_special_tokens=special).ids
    assert tok.encode("the sky")[0] == hf.token_to_id("<s>") and len(tok.encode("the sky")) < 1 + len("the sky")
