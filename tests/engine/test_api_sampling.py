"""Engine-level request fields: logit_bias, min_tokens, penalties, grammars, prompt logprobs."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch

from kvmesh.engine.grammar import GrammarError
from kvmesh.engine.llm import EngineConfig, LLMEngine
from kvmesh.engine.runner import ModelRunner
from kvmesh.engine.sampling import SamplingParams
from kvmesh.engine.scheduler import ScheduledSeq
from kvmesh.engine.sequence import Sequence
from kvmesh.engine.tiny import EOS_ID

PROMPT = [256, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 32, 72, 111, 119, 32, 97, 114, 101]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "ok": {"type": "boolean"},
        "size": {"enum": ["S", "M", "L"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
    },
    "required": ["name", "ok", "size", "tags"],
}


@pytest.fixture(scope="module")
def engine(tiny_dir: Path) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(tiny_dir), num_kv_blocks=64))


def run_one(engine: LLMEngine, prompt: list[int], params: SamplingParams) -> list:
    """All outputs of one request, stepping the engine to the end."""
    rid = f"r{id(params)}"
    engine.add_request(rid, prompt, params)
    outs = []
    while not (outs and outs[-1].finished):
        outs += [o for o in engine.step() if o.request_id == rid]
    return outs


def test_logit_bias_100_makes_every_token_that_token(engine: LLMEngine) -> None:
    out = engine.generate([PROMPT], SamplingParams(temperature=1.0, seed=3, max_tokens=12, logit_bias=((88, 100.0),)))[0]
    assert out.token_ids == [88] * 12


def test_min_tokens_holds_back_eos(engine: LLMEngine) -> None:
    params = SamplingParams(temperature=1.0, seed=1, max_tokens=10, min_tokens=4, logit_bias=((EOS_ID, 100.0),))
    out = engine.generate([PROMPT], params)[0]
    assert len(out.token_ids) == 5 and out.token_ids[-1] == EOS_ID and out.finish_reason == "stop"


def test_presence_penalty_moves_greedy_off_a_repeated_token(engine: LLMEngine) -> None:
    greedy = engine.generate([PROMPT], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0].token_ids
    penalized = engine.generate([PROMPT], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, presence_penalty=2.0,
                                                         frequency_penalty=2.0))[0].token_ids
    assert len(set(greedy)) < len(greedy), "the tiny model repeats itself when greedy"
    assert penalized != greedy and len(set(penalized)) > len(set(greedy))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_json_schema_output_validates_with_random_weights(engine: LLMEngine, seed: int) -> None:
    params = SamplingParams(temperature=1.0, seed=seed, max_tokens=200, structured=("json", json.dumps(SCHEMA)))
    out = engine.generate([PROMPT], params)[0]
    assert out.finish_reason == "stop"
    jsonschema.validate(json.loads(out.text), SCHEMA)


def test_regex_and_choice_grammars(engine: LLMEngine) -> None:
    regex = engine.generate([PROMPT], SamplingParams(temperature=1.0, seed=5, max_tokens=20, structured=("regex", r"[0-9]{3}-[a-c]{2}")))[0]
    assert regex.text[:3].isdigit() and regex.text[3] == "-" and set(regex.text[4:]) <= set("abc") and len(regex.text) == 6
    choice = engine.generate([PROMPT], SamplingParams(temperature=1.0, seed=5, max_tokens=20, structured=("grammar", 'root ::= "red" | "green"')))[0]
    assert choice.text in ("red", "green")


def test_bad_grammar_is_refused_at_add(engine: LLMEngine) -> None:
    with pytest.raises(GrammarError, match="invalid regex"):
        engine.add_request("bad", PROMPT, SamplingParams(structured=("regex", "((")))


def reference_prompt_logprobs(tiny_dir: Path, engine: LLMEngine, tokens: list[int]) -> torch.Tensor:
    runner = ModelRunner(tiny_dir, engine.model_args, torch.float32, torch.device("cpu"), num_blocks=8, block_size=16, max_len=512)
    seq = Sequence("ref", list(tokens), len(tokens), SamplingParams())
    seq.block_table = list(range(-(-len(tokens) // 16)))
    lp = torch.log_softmax(runner.execute([ScheduledSeq(seq, 0, len(tokens))], [True], all_logits=True), dim=-1)  # [T, V]
    return lp[torch.arange(len(tokens) - 1), torch.tensor(tokens[1:])]  # [T-1]


def test_prompt_logprobs_with_max_tokens_zero_match_one_full_forward(tiny_dir: Path) -> None:
    # NOTE: an 8-token budget prefills in chunks; the prompt's first blocks are also in the cache
    # from an earlier request, which a prompt-logprobs request must not use.
    engine = LLMEngine(EngineConfig(model=str(tiny_dir), num_kv_blocks=64, max_num_batched_tokens=8, block_size=4))
    engine.generate([PROMPT], SamplingParams(temperature=0, max_tokens=1))
    outs = run_one(engine, PROMPT, SamplingParams(temperature=0, max_tokens=0, prompt_logprobs=2))
    assert all(o.new_token_ids == [] for o in outs) and outs[-1].finish_reason == "length"
    entries = outs[-1].prompt_logprobs
    assert [e.token_id for e in entries] == PROMPT[1:]
    assert all(len(e.top_logprobs) == 2 for e in entries)
    ref = reference_prompt_logprobs(tiny_dir, engine, PROMPT)
    torch.testing.assert_close(torch.tensor([e.logprob for e in entries]), ref, atol=1e-4, rtol=1e-4)


def test_prompt_logprobs_come_once_with_the_first_token(engine: LLMEngine) -> None:
    outs = run_one(engine, PROMPT[:6], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, prompt_logprobs=0))
    assert len(outs[0].prompt_logprobs) == 5 and all(o.prompt_logprobs is None for o in outs[1:])
