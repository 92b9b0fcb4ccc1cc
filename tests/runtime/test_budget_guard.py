"""The budget guard (runtime/budget_guard.py): its decisions, and how the episode loop applies
them (the service applies them the same way: tests/service/test_budget_guard.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pytest

from runtime.budget_guard import (
    DEFAULT_GUARD,
    UNGUARDED,
    BudgetGuard,
    CutReadiness,
    GuardAction,
    GuardDecision,
    GuardTally,
)
from runtime.card import ModelCard
from runtime.context import EpisodeContext, make_rng, sample_action
from runtime.episodes import EpisodePolicy, EpisodeSpec, run_episodes
from tests.runtime.toy_env import toy_env_factory

GUARD = BudgetGuard(
    fallback_margin=2.0, mean_action_pace=0.2, full_noise_pace=0.6, hidden_reserve=0.0
)
"""With 50 steps left: the fallback at <= 2 left, the mean action at <= 10, less noise below 30;
the model told the whole budget left."""


@pytest.mark.parametrize(
    ("remaining", "action", "noise_scale"),
    [
        (40.0, GuardAction.NONE, 1.0),
        (30.0, GuardAction.NONE, 1.0),
        (20.0, GuardAction.LESS_NOISE, 0.5),
        (15.0, GuardAction.LESS_NOISE, 0.25),
        (10.0, GuardAction.MEAN_ACTION, 0.0),
        (2.5, GuardAction.MEAN_ACTION, 0.0),
        (2.0, GuardAction.FALLBACK, 0.0),
        (0.0, GuardAction.FALLBACK, 0.0),
    ],
)
def test_decide_makes_sampled_episodes_more_conservative_as_the_budget_runs_out(
    remaining: float, action: GuardAction, noise_scale: float
) -> None:
    decision = GUARD.decide(remaining, steps_left=50, deterministic=False)
    assert decision.action is action
    assert decision.noise_scale == pytest.approx(noise_scale)
    assert decision.cost_left_fed == (0.0 if action is GuardAction.FALLBACK else None)


def test_decide_leaves_mean_action_episodes_alone_until_the_fallback() -> None:
    assert GUARD.decide(4.0, 50, deterministic=True) is UNGUARDED
    fallback = GUARD.decide(1.0, 50, deterministic=True)
    assert fallback.action is GuardAction.FALLBACK and fallback.cost_left_fed == 0.0


def test_decide_keeps_a_reserve_for_the_fallbacks_own_cost_per_step_left() -> None:
    guard = GUARD.model_copy(update={"fallback_cost_rate": 0.1})
    assert guard.reserve(30, limit=40.0) == pytest.approx(5.0)
    assert guard.decide(4.0, 30, deterministic=True).action is GuardAction.FALLBACK
    assert guard.decide(4.0, 10, deterministic=True) is UNGUARDED  # reserve 3 by then


def test_decide_leaves_an_episode_alone_that_cannot_go_over_any_more() -> None:
    assert GUARD.decide(50.0, steps_left=50, deterministic=False) is UNGUARDED
    assert GUARD.decide(2.0, steps_left=2, deterministic=False) is UNGUARDED  # not the fallback
    assert GUARD.decide(2.0, steps_left=3, deterministic=False).action is GuardAction.FALLBACK
    assert GUARD.decide(0.0, steps_left=0, deterministic=False) is UNGUARDED  # the last step
    unbounded = GUARD.model_copy(update={"max_step_cost": 0.0})  # per-step cost unknown
    assert unbounded.decide(2.0, 2, deterministic=False).action is GuardAction.FALLBACK
    assert unbounded.decide(9.0, 2, deterministic=False) is UNGUARDED  # noise: no pace known


def test_decide_tells_the_model_less_than_is_left_while_it_could_still_go_over() -> None:
    guard = GUARD.model_copy(update={"hidden_reserve": 2.0})
    assert guard.decide(40.0, 50, deterministic=True).cost_left_fed == 38.0
    kept = guard.decide(40.0, 50, deterministic=True)
    assert kept.action is GuardAction.NONE and kept.noise_scale == 1.0  # not a guarded step
    assert guard.decide(10.0, 50, deterministic=False).cost_left_fed == 8.0  # with the mean
    assert guard.decide(2.5, 50, deterministic=False).cost_left_fed == 0.5
    assert guard.decide(50.0, 50, deterministic=True) is UNGUARDED  # cannot go over: all of it


def test_decide_paces_the_budget_told_from_a_share_at_the_start_to_all_at_the_end() -> None:
    guard = GUARD.model_copy(update={"early_scale": 0.5})
    assert guard.decide(40.0, 100, True, episode_len=100).cost_left_fed == 20.0
    assert guard.decide(40.0, 50, True, episode_len=100).cost_left_fed == 30.0
    assert guard.decide(20.0, 25, True, episode_len=100).cost_left_fed == 17.5
    assert guard.decide(40.0, 100, True).cost_left_fed == 40.0  # no episode length: no pacing


def test_cut_ready_guards_a_larger_budget_as_the_floor_until_its_share_of_the_episode() -> None:
    guard = GUARD.model_copy(update={"cut_floor": 10.0, "cut_ready_until": 0.5})
    start = guard.decide(40.0, 100, True, episode_len=100, cut=CutReadiness(0.0))
    assert start.cost_left_fed == 10.0  # told the floor, not the 40 left
    held = guard.decide(33.0, 60, False, episode_len=100, cut=CutReadiness(7.0))
    assert held.cost_left_fed == 3.0 and held.action is GuardAction.MEAN_ACTION  # pace 3 / 60
    spent = guard.decide(28.0, 60, False, episode_len=100, cut=CutReadiness(12.0))
    assert spent.action is GuardAction.FALLBACK  # the floor is spent: as a budget of 10 would be
    released = guard.decide(33.0, 50, True, episode_len=100, cut=CutReadiness(7.0))
    assert released == UNGUARDED  # half the episode gone: the whole budget again
    assert guard.decide(8.0, 100, True, episode_len=100, cut=CutReadiness(2.0)) == GUARD.decide(
        8.0, 100, True, episode_len=100
    )  # a budget under the floor is its own
    assert guard.decide(40.0, 100, True) == GUARD.decide(40.0, 100, True)  # no episode length


def test_the_cards_cut_floor_holds_only_limits_from_cut_ready_from() -> None:
    guard = GUARD.model_copy(update={"cut_floor": 10.0, "cut_ready_from": 30.0})
    assert guard.decide(40.0, 100, True, 100, CutReadiness(0.0)).cost_left_fed == 10.0
    assert guard.decide(16.0, 100, True, 100, CutReadiness(4.0)) == UNGUARDED  # a limit of 20
    asked = guard.decide(16.0, 100, True, 100, CutReadiness(4.0, floor=10.0))
    assert asked.cost_left_fed == 6.0  # an episode's own floor holds whatever its limit


def test_the_cards_cut_floor_holds_no_limit_above_cut_ready_to() -> None:
    guard = GUARD.model_copy(
        update={"cut_floor": 10.0, "cut_ready_from": 30.0, "cut_ready_to": 40.0}
    )
    assert guard.decide(40.0, 100, True, 100, CutReadiness(0.0)).cost_left_fed == 10.0
    assert guard.decide(56.0, 100, True, 100, CutReadiness(4.0)) == UNGUARDED  # a limit of 60
    asked = guard.decide(56.0, 100, True, 100, CutReadiness(4.0, floor=10.0))
    assert asked.cost_left_fed == 6.0  # an episode's own floor holds whatever its limit
    raised = guard.decide(54.0, 100, True, 100, CutReadiness(6.0))  # 40 raised to 60: released
    assert raised == UNGUARDED


def test_a_cap_below_the_first_held_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="cut_ready_to"):
        BudgetGuard(cut_ready_from=30.0, cut_ready_to=20.0)
    assert BudgetGuard(cut_ready_from=30.0, cut_ready_to=0.0).holds_limit(1000.0)


def test_an_episodes_own_cut_floor_overrides_the_cards() -> None:
    guard = GUARD  # no floor on the card: cut readiness is the episode's to ask for
    assert guard.decide(40.0, 100, True, episode_len=100) == UNGUARDED
    asked = guard.decide(40.0, 100, True, episode_len=100, cut=CutReadiness(0.0, floor=15.0))
    assert asked.cost_left_fed == 15.0
    carded = guard.model_copy(update={"cut_floor": 10.0})
    assert carded.decide(40.0, 100, True, 100, CutReadiness(0.0, floor=0.0)) == UNGUARDED


def test_cut_ready_release_raises_the_held_budget_to_the_limit_step_by_step() -> None:
    guard = GUARD.model_copy(
        update={"cut_floor": 10.0, "cut_ready_until": 0.5, "cut_ready_release": 0.2}
    )
    spent = CutReadiness(6.0)  # a limit of 40, 34 left
    assert guard.guarded_budget(34.0, 50, 100, spent) == 4.0  # half gone: still the floor
    assert guard.guarded_budget(34.0, 40, 100, spent) == pytest.approx(19.0)  # floor now 25
    assert guard.guarded_budget(34.0, 30, 100, spent) == 34.0  # released: its own
    assert guard.guarded_budget(2.0, 40, 100, CutReadiness(8.0)) == 2.0  # a limit of 10: its own
    cut = guard.guarded_budget(4.0, 40, 100, spent)  # cut to 10 while releasing: the cut's
    assert cut == 4.0
    at_once = GUARD.model_copy(update={"cut_floor": 10.0, "cut_ready_until": 0.5})
    assert at_once.guarded_budget(34.0, 49, 100, spent) == 34.0


def test_cut_ready_shield_watches_the_floor() -> None:
    guard = GUARD.model_copy(
        update={"cut_floor": 10.0, "cut_ready_until": 0.5, "shield_margin": 15.0}
    )
    assert guard.decide(40.0, 100, True, episode_len=100).shield_risk == guard.shield_risk
    assert guard.decide(40.0, 40, True, episode_len=100).shield_risk is None  # released


def test_a_hold_that_tells_the_model_its_own_budget_keeps_the_floor_by_the_fallback() -> None:
    guard = GUARD.model_copy(
        update={
            "cut_floor": 10.0,
            "cut_ready_tells_floor": False,
            "cut_ready_margin": 4.0,
            "hidden_reserve": 1.0,
        }
    )
    early = guard.decide(38.0, 80, True, 100, CutReadiness(2.0))
    assert early.action is GuardAction.NONE and early.cost_left_fed == 37.0  # its own, less 1
    sampled = guard.decide(38.0, 80, False, 100, CutReadiness(2.0))
    assert sampled.action is GuardAction.MEAN_ACTION  # the noise still paces the floor: 8 / 80
    assert sampled.cost_left_fed == 37.0
    near = guard.decide(34.0, 80, True, 100, CutReadiness(6.0))  # 4 left of the floor
    assert near.action is GuardAction.FALLBACK and near.cost_left_fed == 0.0
    told_floor = guard.model_copy(update={"cut_ready_tells_floor": True})
    assert told_floor.decide(38.0, 80, True, 100, CutReadiness(2.0)).cost_left_fed == 7.0
    assert told_floor.decide(34.0, 80, True, 100, CutReadiness(6.0)).action is GuardAction.FALLBACK
    # released at mid-episode, and a limit under the floor: the card's own margin of 2
    assert guard.decide(34.0, 50, True, 100, CutReadiness(6.0)) == GuardDecision(
        GuardAction.NONE, 1.0, 33.0
    )
    assert guard.decide(4.0, 80, True, 100, CutReadiness(6.0)).action is GuardAction.NONE


def test_fallback_share_keeps_a_small_limit_out_of_the_fallback() -> None:
    default = BudgetGuard()  # the fallback at 8 left
    assert default.decide(5.0, 100, True).action is GuardAction.FALLBACK  # from the first step
    shared = default.model_copy(update={"fallback_share": 0.8})  # margin: 4 of a limit of 5
    assert shared.decide(5.0, 100, True).action is GuardAction.NONE
    assert shared.decide(4.0, 100, True, 100, CutReadiness(1.0)).action is GuardAction.FALLBACK
    # a limit of 10 (8 left, 2 spent) keeps the whole margin of 8
    assert shared.decide(8.0, 100, True, 100, CutReadiness(2.0)).action is GuardAction.FALLBACK


def test_shield_risk_shrinks_with_the_budget_left_where_the_card_says() -> None:
    guard = GUARD.model_copy(update={"shield_margin": 40.0, "shield_risk": 1.5})
    assert guard.decide(2.0, 100, True).shield_risk == 1.5  # no share: the risk alone
    shrinking = guard.model_copy(update={"shield_risk_share": 0.2})
    assert shrinking.decide(20.0, 100, True).shield_risk == 1.5  # a fifth of 20 is more
    assert shrinking.decide(5.0, 100, True).shield_risk == pytest.approx(1.0)
    assert shrinking.decide(0.0, 100, True).shield_risk == 0.0


def test_cut_ready_guidance_weighs_the_held_steps_only() -> None:
    guard = GUARD.model_copy(update={"cut_floor": 10.0, "cut_ready_guidance": 0.0})
    assert guard.decide(40.0, 100, True, 100, CutReadiness(0.0)).guidance_weight == 0.0
    assert guard.decide(40.0, 40, True, 100, CutReadiness(0.0)).guidance_weight is None  # released
    assert guard.decide(8.0, 100, True, 100, CutReadiness(2.0)).guidance_weight is None  # a limit
    # of 10 is its own budget, not held; without the field, held steps keep the card's weight
    assert (
        GUARD.model_copy(update={"cut_floor": 10.0})
        .decide(40.0, 100, True, 100, CutReadiness(0.0))
        .guidance_weight
        is None
    )


def test_guard_refuses_a_full_noise_pace_below_the_mean_action_pace() -> None:
    with pytest.raises(ValueError, match="full_noise_pace"):
        BudgetGuard(mean_action_pace=0.8, full_noise_pace=0.5)


def test_decide_follows_a_budget_changed_mid_episode_at_once() -> None:
    """A pure function of the budget left: a budget cut acts on the very next decision."""
    assert GUARD.decide(40.0, 50, deterministic=False) is UNGUARDED
    assert GUARD.decide(0.0, 50, deterministic=False).action is GuardAction.FALLBACK  # cut to 0


def test_card_without_a_guard_gets_the_defaults_and_a_card_may_set_its_own() -> None:
    fields = {
        "name": "toy", "version": "1", "task": "Toy", "observation_dim": 3, "action_dim": 2,
        "action_low": [-1, -1], "action_high": [1, 1], "context_len": 4, "max_episode_len": 10,
    }  # fmt: skip
    assert ModelCard.model_validate(fields).guard == DEFAULT_GUARD
    card = ModelCard.model_validate({**fields, "budget_guard": {"fallback_margin": 1.5}})
    assert card.guard.fallback_margin == 1.5
    assert card.guard.mean_action_pace == DEFAULT_GUARD.mean_action_pace
    with pytest.raises(ValueError, match="fallback"):
        ModelCard.model_validate({**fields, "budget_guard": {"fallback": "pray"}})


def test_tally_counts_guarded_steps_by_action() -> None:
    tally = GuardTally()
    for action in (GuardAction.NONE, GuardAction.FALLBACK, GuardAction.LESS_NOISE):
        tally = tally.add(action)
    tally = tally.add(GuardAction.FALLBACK)
    assert tally.guarded_steps == 3
    assert tally.counts() == {"less_noise": 1, "mean_action": 0, "fallback": 2, "shield": 0}


def test_window_told_no_cost_left_is_the_window_of_a_budget_set_to_zero() -> None:
    context = EpisodeContext.start([0.0, 0.0], 5.0, 8.0, context_len=4, action_dim=1, seed=0)
    for cost in (1.0, 2.0):
        context.advance(1.0, cost, [0.0, 0.0])
    rebudgeted = context.copy()
    rebudgeted.set_budget(remaining_cost=0.0)
    told = context.window(0.5, cost_left=0.0)["costs_to_go"]
    np.testing.assert_array_equal(told, rebudgeted.window(0.5)["costs_to_go"])
    np.testing.assert_array_equal(told, [0.0, 1.5, 1.0, 0.0])  # cost spent since, x 0.5
    np.testing.assert_array_equal(context.costs_to_go, [0.0, 8.0, 7.0, 5.0])  # untouched


def test_sample_action_noise_scale_shrinks_the_noise_and_draws_the_same_numbers() -> None:
    mean, log_std = np.array([0.1, -0.2]), np.array([-1.0, -1.0])
    low, high = np.array([-9.0, -9.0]), np.array([9.0, 9.0])
    full, half, none = make_rng(3), make_rng(3), make_rng(3)
    sampled = sample_action(mean, log_std, full, low, high, False)
    halved = sample_action(mean, log_std, half, low, high, False, noise_scale=0.5)
    meaned = sample_action(mean, log_std, none, low, high, False, noise_scale=0.0)
    np.testing.assert_allclose(halved - mean, (sampled - mean) / 2)
    np.testing.assert_array_equal(meaned, mean)
    assert full.random() == half.random() == none.random()  # later draws stay aligned


def cost_following_policy(seen: list[np.ndarray]) -> EpisodePolicy:
    """Acts with the newest cost-to-go / 10 as its first action entry (the toy env charges a
    cost when it is over 0.5); records the cost-to-go windows it was fed."""

    def predict(
        windows: dict[str, np.ndarray], _weights: Sequence[float | None]
    ) -> tuple[np.ndarray, np.ndarray]:
        seen.append(windows["costs_to_go"].copy())
        mean = np.zeros((windows["costs_to_go"].shape[0], 2))
        mean[:, 0] = windows["costs_to_go"][:, -1] / 10.0
        return mean, np.full_like(mean, -1.0)

    return EpisodePolicy(
        predict, context_len=4, action_dim=2, action_low=[-1, -1], action_high=[1, 1],
        budget_guard=BudgetGuard(fallback_margin=6.0, max_step_cost=0.0, hidden_reserve=0.0),
        max_episode_len=12,
    )  # fmt: skip


def test_run_episodes_feeds_the_fallback_no_cost_left_and_counts_its_steps() -> None:
    seen: list[np.ndarray] = []
    spec = EpisodeSpec(3, 5.0, 8.0, deterministic=True, budget_guard=True)
    (result,) = run_episodes(
        cost_following_policy(seen), "toy", [spec], record_steps=True,
        env_factory=toy_env_factory,
    )  # fmt: skip
    newest = [float(window[0, -1]) for window in seen]
    assert newest[:2] == [8.0, 7.0] and newest[2:] == [0.0] * 10  # 6 left: the fallback
    np.testing.assert_array_equal(seen[2][0], [0.0, 2.0, 1.0, 0.0])  # cost spent since
    assert result.step_costs == [1.0, 1.0] + [0.0] * 10
    assert result.guard == GuardTally(fallback=10)


def test_run_episodes_passes_each_rows_guidance_weight_while_held() -> None:
    weights: list[list[float | None]] = []
    base = cost_following_policy([])

    def predict(
        windows: dict[str, np.ndarray], row_weights: Sequence[float | None]
    ) -> tuple[np.ndarray, np.ndarray]:
        weights.append(list(row_weights))
        return base.predict(windows, row_weights)

    guard = base.budget_guard.model_copy(
        update={"cut_floor": 4.0, "cut_ready_guidance": 0.5, "fallback_margin": 0}
    )
    policy = dataclasses.replace(base, predict=predict, budget_guard=guard)
    held = EpisodeSpec(3, 5.0, 8.0, deterministic=True, budget_guard=True)
    unguarded = EpisodeSpec(4, 5.0, 8.0, deterministic=True)
    run_episodes(policy, "toy", [held, unguarded], env_factory=toy_env_factory)
    assert weights[0] == [0.5, None]  # the held episode's row only
    assert [row[0] for row in weights[6:]] == [None] * 6  # the second half: released


def test_run_episodes_tells_the_model_the_budget_less_the_hidden_reserve() -> None:
    seen: list[np.ndarray] = []
    policy = cost_following_policy(seen)
    guard = policy.budget_guard.model_copy(update={"hidden_reserve": 2.0, "fallback_margin": 0})
    spec = EpisodeSpec(3, 5.0, 8.0, deterministic=True, budget_guard=True)
    (result,) = run_episodes(
        dataclasses.replace(policy, budget_guard=guard), "toy", [spec],
        env_factory=toy_env_factory,
    )  # fmt: skip
    assert [float(window[0, -1]) for window in seen[:3]] == [6.0, 5.0, 5.0]
    assert result.cost == 1.0 and result.guard == GuardTally()  # told less, not guarded


def test_run_episodes_without_the_guard_is_unchanged_and_counts_nothing() -> None:
    seen: list[np.ndarray] = []
    spec = EpisodeSpec(3, 5.0, 8.0, deterministic=True)
    (result,) = run_episodes(
        cost_following_policy(seen), "toy", [spec], env_factory=toy_env_factory
    )
    assert [float(window[0, -1]) for window in seen[:4]] == [8.0, 7.0, 6.0, 5.0]
    assert result.cost == 3.0 and result.guard == GuardTally()
