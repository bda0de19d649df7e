"""`kvmesh sim replay`: prompts built from hash ids, and the figures of a replay (no mesh here)."""

import asyncio
import json
import math

from kvmesh.runtime.blockhash import BlockHasher
from kvmesh.scheduler.sim.client import sse_lines
from kvmesh.scheduler.sim.replay import VOCAB, prompt_token_ids, replay_summary
from kvmesh.scheduler.sim.report import Outcome
from kvmesh.scheduler.sim.trace import TraceRequest, without_output_blocks

HASHER = BlockHasher("tiny", "float32", 16)


def request(request_id: str, hash_ids: tuple[int, ...], prompt_tokens: int, arrival_s: float = 0.0) -> TraceRequest:
    return TraceRequest(arrival_s, request_id, "", prompt_tokens, 8, hash_ids)


def test_identical_hash_ids_build_identical_prefixes_and_different_ids_different_ones():
    a = prompt_token_ids(request("a", (1, 2, 3), 3 * 16 + 5))
    b = prompt_token_ids(request("b", (1, 2, 4), 3 * 16 + 5))
    assert len(a) == len(b) == 53 and all(VOCAB[0] <= t < VOCAB[1] for t in a + b)
    assert a[:32] == b[:32] and a[32:48] != b[32:48]
    assert a[48:] != b[48:]  # the tail past the last hash id is the request's own
    ha, hb = HASHER.hashes(a), HASHER.hashes(b)  # the mesh's own block hashes see the same sharing
    assert ha[:2] == hb[:2] and ha[2] != hb[2]


def test_a_different_first_hash_id_shares_nothing_and_the_same_request_builds_the_same_prompt():
    a = prompt_token_ids(request("a", (1, 2), 32))
    c = prompt_token_ids(request("c", (2, 1), 32))
    assert HASHER.hashes(a)[0] != HASHER.hashes(c)[0] and HASHER.hashes(a)[1] != HASHER.hashes(c)[1]
    assert prompt_token_ids(request("a", (1, 2), 32)) == a


def test_a_salt_gives_every_block_and_tail_other_tokens_and_keeps_the_sharing_within_it():
    a, b = request("a", (1, 2, 3), 3 * 16 + 5), request("b", (1, 2, 4), 3 * 16 + 5)
    sa, sb = prompt_token_ids(a, salt="run2"), prompt_token_ids(b, salt="run2")
    plain = prompt_token_ids(a)
    ha, hplain = HASHER.hashes(sa), HASHER.hashes(plain)
    assert not set(ha) & set(hplain) and sa[48:] != plain[48:]  # nothing an unsalted replay cached
    assert sa[:32] == sb[:32] and sa[32:48] != sb[32:48]  # shared hash ids still share, within the salt
    assert prompt_token_ids(a, salt="run2") == sa and prompt_token_ids(a, salt="run3") != sa


def test_mooncake_blocks_of_512_tokens_share_as_whole_blocks_and_the_last_one_is_cut():
    a = prompt_token_ids(request("a", (10, 11), 700), block_tokens=512)
    b = prompt_token_ids(request("b", (10, 12), 600), block_tokens=512)
    assert len(a) == 700 and len(b) == 600
    assert a[:512] == b[:512] and a[512:600] != b[512:600]


def test_a_trace_without_output_blocks_keeps_everything_else():
    r = TraceRequest(1.0, "r", "s", 40, 8, (1, 2), (3,))
    (stripped,) = without_output_blocks([r])
    assert stripped.output_hash_ids == () and (stripped.hash_ids, stripped.session_id) == ((1, 2), "s")


def test_replay_figures_count_errors_by_status_and_goodput_under_the_slo():
    trace = [request(f"r{i}", (), 32, arrival_s=float(i)) for i in range(4)]
    outcomes = [
        Outcome(0.0, 32, 8, 0.1, 0.8, 16),      # TTFT 0.1 s, ITL 0.1 s
        Outcome(1.0, 32, 8, 1.9, 2.6, 0),       # TTFT 0.9 s: served, misses the SLO
        Outcome(2.0, 32, 8, math.nan, 2.1, 0, 429),
        Outcome(3.0, 32, 8, math.nan, 33.0, 0, 504),
    ]
    summary = replay_summary("real", 1, trace, outcomes, slo_ttft_s=0.5)
    assert summary.errors == ((429, 1), (504, 1))
    assert summary.ttft_p50_s == 0.1 and math.isclose(summary.ttft_p99_s, 0.9)
    assert math.isclose(summary.itl_p50_s, 0.1) and summary.hit_rate == 16 / 64
    assert math.isclose(summary.goodput, 1 / 3.0, rel_tol=1e-6)  # one request in the 3 s window met the SLO


def test_event_stream_lines_end_only_at_newlines_not_at_unicode_line_separators():
    chunk = {"choices": [{"text": "a\u2028b\x85c\u2029"}]}
    body = ("data: " + json.dumps(chunk, ensure_ascii=False) + "\r\n\ndata: [DONE]\n").encode()

    async def pieces():  # cut inside the multi-byte separator and between \r and \n
        for i in range(0, len(body), 7):
            yield body[i:i + 7]

    async def lines():
        return [line async for line in sse_lines(pieces())]

    got = [line for line in asyncio.run(lines()) if line]
    assert got == ["data: " + json.dumps(chunk, ensure_ascii=False), "data: [DONE]"]
    assert json.loads(got[0][6:]) == chunk
