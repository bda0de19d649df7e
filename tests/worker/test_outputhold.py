"""OutputHold, the policy: under load requests' tokens wait in the engine and leave every
`interval` engine steps, all requests' on the same step, or once the hold is `max_hold_s` old;
below the load nothing is held. (The engine's side, `step(hold=True)` and `take_held`, is tested
on the real engine in tests/engine/test_engine.py.)"""

from __future__ import annotations

from kvmesh.worker.outputhold import OutputHold
from tests.worker.holdengine import CountingEngine


def run(hold: OutputHold, engine: CountingEngine, steps: int, step_s: float = 0.0) -> list[list[tuple]]:
    """What goes out at each step, as (request id, token ids, finished)."""
    clock = [0.0]

    def now() -> float:
        return clock[0]

    sent = []
    for step in range(1, steps + 1):
        clock[0] = step * step_s
        outputs, _ = hold.step(engine, step, now)
        sent.append([(o.request_id, o.new_token_ids, o.finished) for o in outputs])
    return sent


def test_under_load_tokens_leave_every_interval_steps_all_together_and_first_and_end_at_once() -> None:
    sent = run(OutputHold(interval=4, hold_from=2), CountingEngine(2, 6), 6)
    assert sent[0] == [("r0", [1], False), ("r1", [1], False)]  # first tokens: at once
    assert sent[1] == sent[2] == sent[3] == []  # the hold begins on step 2
    assert sent[4] == [("r0", [2, 3, 4, 5], False), ("r1", [2, 3, 4, 5], False)]  # its fourth step
    assert sent[5] == [("r0", [6], True), ("r1", [6], True)]  # the ends: at once


def test_below_its_load_nothing_is_held() -> None:
    sent = run(OutputHold(interval=4, hold_from=3), CountingEngine(2, 3), 3)
    assert sent == [[("r0", [1], False), ("r1", [1], False)], [("r0", [2], False), ("r1", [2], False)],
                    [("r0", [3], True), ("r1", [3], True)]]


def test_what_was_held_goes_at_once_when_the_load_falls() -> None:
    hold = OutputHold(interval=4, hold_from=3)
    assert hold.holds(3) and not hold.holds(2)
    assert not hold.due(2, True, 1, 0.0)  # held on step 1 under load
    assert hold.due(2, False, 2, 0.0)  # the load fell: it goes


def test_an_interval_of_one_steps_the_engine_plainly() -> None:
    class Plain:  # no hold API at all
        def step(self) -> list:
            return ["an output"]

    outputs, made = OutputHold().step(Plain(), 1, lambda: 0.0)
    assert outputs == ["an output"] and made


def test_a_step_whose_tokens_are_all_held_still_made_something() -> None:
    hold, engine = OutputHold(interval=4, hold_from=1), CountingEngine(1, 9)
    hold.step(engine, 1, lambda: 0.0)
    assert hold.step(engine, 2, lambda: 0.0) == ([], True)


def test_held_tokens_go_once_the_hold_is_max_hold_s_old_even_before_the_interval() -> None:
    hold = OutputHold(interval=8, hold_from=1, max_hold_s=0.03)
    assert not hold.due(2, True, 2, 0.02)  # the hold begins at 0.02
    assert not hold.due(2, True, 3, 0.04)  # 20 ms: still held
    assert hold.due(2, True, 4, 0.05)  # 30 ms: everything held goes
    assert not hold.due(1, True, 5, 0.06)  # held anew from 0.06


def test_without_a_time_bound_only_the_interval_lets_held_tokens_go() -> None:
    hold = OutputHold(interval=8, hold_from=1)
    assert not hold.due(1, True, 2, 0.0) and not hold.due(1, True, 3, 10.0)
    assert hold.due(1, True, 9, 10.0)


def test_nothing_held_ends_the_hold() -> None:
    hold = OutputHold(interval=4, hold_from=1)
    assert not hold.due(1, True, 2, 0.0)
    assert not hold.due(0, True, 3, 0.0)  # what was held went with its end
    assert not hold.due(1, True, 4, 0.0) and hold.due(1, True, 7, 0.0)  # a hold of its own, from step 4


def test_a_hold_the_time_bound_let_go_is_not_followed_by_a_short_one() -> None:
    # NOTE: 3.5 ms steps: 20 ms pass on the hold's seventh step, before its eighth. Counted from step
    # numbers that are multiples of 8, a hold of one step followed each such one (7 tokens, then 1).
    sent = run(OutputHold(interval=8, hold_from=1, max_hold_s=0.020), CountingEngine(1, 49), 49, step_s=0.0035)
    assert [len(tokens) for step in sent for _, tokens, _ in step] == [1, 7, 7, 7, 7, 7, 7, 6]
