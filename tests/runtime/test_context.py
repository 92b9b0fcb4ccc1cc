"""EpisodeContext: Algorithm 2 budgets, left-padded windows, budget changes, copies."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.context import EpisodeContext, sample_action, stack_windows


def make_context(seed: int = 0, context_len: int = 3) -> EpisodeContext:
    return EpisodeContext.start(
        [1.0, 2.0], 100.0, 10.0, context_len=context_len, action_dim=1, seed=seed
    )


def test_start_left_pads_the_first_observation() -> None:
    window = make_context().window()
    np.testing.assert_array_equal(window["padding_mask"], [True, True, False])
    np.testing.assert_array_equal(window["states"], [[0, 0], [0, 0], [1, 2]])
    np.testing.assert_array_equal(window["returns_to_go"], [0, 0, 100])
    np.testing.assert_array_equal(window["costs_to_go"], [0, 0, 10])
    assert window["states"].dtype == np.float32 and window["time_steps"].dtype == np.int64
    assert window["padding_mask"].dtype == np.bool_


def test_advance_subtracts_reward_and_clamps_cost_at_zero() -> None:
    context = make_context()
    context.record_action([0.5])
    context.advance(reward=3.0, cost=4.0, observation=[3.0, 4.0])
    context.advance(reward=2.0, cost=9.0, observation=[5.0, 6.0])
    window = context.window()
    np.testing.assert_array_equal(window["returns_to_go"], [100, 97, 95])
    np.testing.assert_array_equal(window["costs_to_go"], [10, 6, 0])
    np.testing.assert_array_equal(window["time_steps"], [0, 1, 2])
    np.testing.assert_array_equal(window["actions"][:, 0], [0.5, 0, 0])
    assert context.budget_exhausted and context.total_cost == 13.0 and context.step == 2


def test_advance_keeps_only_the_last_k_steps() -> None:
    context = make_context(context_len=2)
    for t in range(1, 5):
        context.advance(1.0, 0.0, [float(t), 0.0])
    window = context.window()
    np.testing.assert_array_equal(window["states"][:, 0], [3, 4])
    np.testing.assert_array_equal(window["time_steps"], [3, 4])
    assert not window["padding_mask"].any()


def test_advance_wrong_observation_shape_raises_and_changes_nothing() -> None:
    context = make_context()
    before = context.copy()
    with pytest.raises(ValueError):
        context.advance(1.0, 1.0, [1.0, 2.0, 3.0])
    for name, value in context.window().items():
        np.testing.assert_array_equal(value, before.window()[name])
    assert (context.step, context.total_reward, context.total_cost) == (0, 0.0, 0.0)


def test_set_budget_cost_limit_subtracts_spent_cost_and_shifts_the_window() -> None:
    context = make_context()
    context.advance(0.0, 2.0, [0.0, 0.0])  # C: 10 -> 8
    context.set_budget(cost_limit=5.0)  # 5 - 2 spent = 3 left, delta -5
    np.testing.assert_array_equal(context.window()["costs_to_go"], [0, 5, 3])
    assert context.target_cost == 5.0 and context.remaining_cost == 3.0


def test_set_budget_below_spent_cost_leaves_nothing_and_never_goes_negative() -> None:
    context = make_context()
    context.advance(0.0, 2.0, [0.0, 0.0])  # [0, 10, 8]
    context.set_budget(cost_limit=1.0)  # nothing left: delta -8 for every real entry
    np.testing.assert_array_equal(context.window()["costs_to_go"], [0, 2, 0])
    assert context.budget_exhausted


def test_set_budget_remaining_cost_and_reward_set_what_is_left() -> None:
    context = make_context()
    context.advance(4.0, 1.0, [0.0, 0.0])
    context.set_budget(remaining_cost=20.0, target_reward=50.0)
    window = context.window()
    np.testing.assert_array_equal(window["costs_to_go"], [0, 21, 20])
    np.testing.assert_array_equal(window["returns_to_go"], [0, 50, 46])
    assert context.target_cost == 21.0 and context.target_reward == 50.0


def test_a_budget_of_minus_zero_answers_zero() -> None:
    for budgets in ({"cost_limit": -0.0}, {"remaining_cost": -0.0}):
        context = make_context()
        context.set_budget(**budgets)
        assert str(context.remaining_cost) == str(context.target_cost) == "0.0"  # not "-0.0"
    opened = EpisodeContext.start([1.0, 2.0], 100.0, -0.0, context_len=3, action_dim=1, seed=0)
    assert str(opened.remaining_cost) == str(opened.target_cost) == "0.0"


def test_set_budget_both_cost_forms_raises() -> None:
    with pytest.raises(ValueError):
        make_context().set_budget(cost_limit=1.0, remaining_cost=1.0)


def test_copy_is_independent() -> None:
    context = make_context()
    copy = context.copy()
    copy.advance(1.0, 1.0, [0.0, 0.0])
    copy.rng.standard_normal()
    assert context.step == 0
    assert context.rng.bit_generator.state != copy.rng.bit_generator.state


def test_stack_windows_adds_a_batch_axis() -> None:
    windows = stack_windows([make_context(), make_context()])
    assert windows["states"].shape == (2, 3, 2)
    assert windows["actions"].shape == (2, 3, 1)
    assert windows["padding_mask"].shape == (2, 3)


def test_stack_windows_scales_each_episodes_cost_to_go_and_nothing_else() -> None:
    first, second = make_context(), make_context()
    first.advance(1.0, 0.5, [0.0, 0.0])
    plain = stack_windows([first, second])
    scaled = stack_windows([first, second], [1.0, 0.5])
    np.testing.assert_array_equal(scaled["costs_to_go"][0], plain["costs_to_go"][0])
    np.testing.assert_allclose(scaled["costs_to_go"][1], 0.5 * plain["costs_to_go"][1])
    assert np.any(plain["costs_to_go"][1] != 0)
    for name in plain.keys() - {"costs_to_go"}:
        np.testing.assert_array_equal(scaled[name], plain[name])
    assert second.costs_to_go[-1] == plain["costs_to_go"][1, -1]  # the context is not changed


def test_sample_action_stays_within_bounds_and_is_seeded() -> None:
    mean, log_std = np.array([0.9, -0.9]), np.array([1.0, 1.0])
    first = [sample_action(mean, log_std, np.random.default_rng(1), [-1, -1], [1, 1], False)]
    again = [sample_action(mean, log_std, np.random.default_rng(1), [-1, -1], [1, 1], False)]
    np.testing.assert_array_equal(first, again)
    samples = np.stack(
        [sample_action(mean, log_std, np.random.default_rng(s), [-1, -1], [1, 1], False)
         for s in range(200)]
    )  # fmt: skip
    assert samples.min() >= -1 and samples.max() <= 1


def test_sample_action_deterministic_uses_the_mean_without_drawing() -> None:
    rng = np.random.default_rng(3)
    state = rng.bit_generator.state
    action = sample_action(np.array([2.0]), np.array([0.0]), rng, [-1.0], [1.0], True)
    np.testing.assert_array_equal(action, [1.0])
    assert rng.bit_generator.state == state
