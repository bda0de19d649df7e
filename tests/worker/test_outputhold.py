"""OutputHold: under load a request's tokens leave every `interval` engine steps, all requests'
on the same step; its first output and its end go at once; below the load nothing is held."""

from __future__ import annotations

from kvmesh.engine.outputs import RequestOutput, TokenLogprob
from kvmesh.worker.outputhold import OutputHold


def out(rid: str, tokens: list[int], n_out: int, finished: bool = False, logprobs=None, **kw) -> RequestOutput:
    return RequestOutput(rid, list(tokens), "".join(chr(97 + t % 26) for t in tokens), finished,
                         "length" if finished else None, logprobs, 5, n_out, 0, 5 + n_out, **kw)


def run(hold: OutputHold, steps: list[list[RequestOutput]], in_engine: int, first_step: int = 1) -> list[list[tuple]]:
    """What goes out at each step, as (request id, token ids, finished)."""
    return [[(o.request_id, o.new_token_ids, o.finished) for o in hold.take(outs, in_engine, first_step + i)]
            for i, outs in enumerate(steps)]


def test_under_load_tokens_leave_every_interval_steps_all_together_and_first_and_end_at_once() -> None:
    hold = OutputHold(interval=4, hold_from=2)
    steps = [
        [out("a", [1], 1, queue_s=0.1, prefill_s=0.2), out("b", [10], 1)],  # step 1: both first tokens
        [out("a", [2], 2), out("b", [11], 2)],  # the hold begins
        [out("a", [3], 3), out("b", [12], 3)],
        [out("a", [4], 4), out("b", [13], 4)],
        [out("a", [5], 5), out("b", [14], 5)],  # its fourth step: everything held goes
        [out("a", [6], 6), out("b", [15], 6, finished=True)],  # b's end goes at once, a is held
        [out("a", [7], 7)],
    ]
    sent = run(hold, steps, in_engine=2)
    assert sent[0] == [("a", [1], False), ("b", [10], False)]
    assert sent[1] == sent[2] == sent[3] == []
    assert sent[4] == [("a", [2, 3, 4, 5], False), ("b", [11, 12, 13, 14], False)]
    assert sent[5] == [("b", [15], True)]
    assert sent[6] == [] and len(hold) == 1


def test_below_its_load_nothing_is_held_and_what_was_held_goes_at_once() -> None:
    hold = OutputHold(interval=4, hold_from=3)
    assert run(hold, [[out("a", [1], 1)], [out("a", [2], 2)]], in_engine=2) == [[("a", [1], False)], [("a", [2], False)]]
    run(hold, [[out("a", [3], 3), out("b", [9], 1)]], in_engine=3, first_step=1)  # a's 3 held, b's first goes
    assert len(hold) == 1
    # the load falls: a's held token and this step's leave merged; c (held, nothing this step) too
    run(hold, [[out("c", [7], 1)], [out("c", [8], 2)]], in_engine=3, first_step=2)
    sent = run(hold, [[out("a", [4], 4)]], in_engine=2)
    assert sorted(sent[0]) == [("a", [3, 4], False), ("c", [8], False)] and len(hold) == 0


def test_merged_outputs_keep_every_token_logprob_text_and_the_latest_counts() -> None:
    hold = OutputHold(interval=4, hold_from=1)
    lp = [TokenLogprob(t, -0.5 * t, [(t, -0.5 * t)]) for t in range(1, 6)]
    hold.take([out("a", [1], 1, logprobs=lp[:1])], 1, 1)
    hold.take([out("a", [2], 2, logprobs=lp[1:2])], 1, 2)
    hold.take([out("a", [3], 3, logprobs=lp[2:3])], 1, 3)
    assert hold.take([out("a", [4], 4, logprobs=lp[3:4])], 1, 4) == []
    (merged,) = hold.take([out("a", [5], 5, logprobs=lp[4:5])], 1, 5)  # the hold's fourth step
    assert merged.new_token_ids == [2, 3, 4, 5] and merged.logprobs == lp[1:5]
    assert merged.new_text == "cdef" and merged.num_output_tokens == 5 and merged.num_computed_tokens == 10


def test_an_interval_of_one_passes_every_output_through_unchanged() -> None:
    hold = OutputHold()
    outs = [out("a", [1], 1), out("b", [2], 7)]
    assert hold.take(outs, 64, 3) is outs and len(hold) == 0


def test_a_failed_step_drops_what_was_held() -> None:
    hold = OutputHold(interval=4, hold_from=1)
    hold.take([out("a", [1], 1)], 1, 1)
    hold.take([out("a", [2], 2)], 1, 2)
    assert len(hold) == 1
    hold.drop_all()
    assert len(hold) == 0 and hold.take([], 1, 4) == []


def test_held_tokens_go_once_the_oldest_waited_max_hold_s_even_before_the_interval() -> None:
    hold = OutputHold(interval=8, hold_from=1, max_hold_s=0.03)
    sent = [[(o.request_id, o.new_token_ids) for o in hold.take(outs, 2, step, now)] for step, outs, now in [
        (1, [out("a", [1], 1), out("b", [9], 1)], 0.00),  # first tokens: at once
        (2, [out("a", [2], 2), out("b", [10], 2)], 0.02),  # held from 0.02
        (3, [out("a", [3], 3)], 0.04),  # 20 ms: still held
        (4, [out("a", [4], 4), out("b", [11], 3)], 0.05),  # 30 ms: every held token goes
        (5, [out("a", [5], 5)], 0.06),  # held anew from 0.06
    ]]
    assert sent[0] == [("a", [1]), ("b", [9])] and sent[1] == sent[2] == []
    assert sorted(sent[3]) == [("a", [2, 3, 4]), ("b", [10, 11])]
    assert sent[4] == [] and len(hold) == 1


def test_without_a_time_bound_only_the_interval_lets_held_tokens_go() -> None:
    hold = OutputHold(interval=8, hold_from=1)
    hold.take([out("a", [1], 1)], 1, 1, 0.0)
    assert hold.take([out("a", [2], 2)], 1, 2, 10.0) == [] and len(hold) == 1


def test_a_hold_the_time_bound_let_go_is_not_followed_by_a_short_one() -> None:
    # NOTE: 3.5 ms steps: 20 ms pass on the hold's seventh step, before its eighth. Counted from step
    # numbers that are multiples of 8, a hold of one step followed each such one (7 tokens, then 1).
    hold = OutputHold(interval=8, hold_from=1, max_hold_s=0.020)
    sizes = [len(o.new_token_ids) for step in range(1, 50)
             for o in hold.take([out("a", [step], step, finished=step == 49)], 1, step, step * 0.0035)]
    assert sizes == [1, 7, 7, 7, 7, 7, 7, 6]  # the first token, then 7 at a time (24.5 ms: the last, its end)
