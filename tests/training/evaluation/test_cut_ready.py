"""`cdt cut-ready`: the choice of a hold for budget cuts, the card's record, a short real run."""

from pathlib import Path
from typing import Any

import pytest

from runtime.budget_guard import BudgetGuard
from runtime.card import CostCriticCard, CostGuidance, read_card, update_card
from runtime.policy import Policy
from tests.runtime.toy_critic import write_test_critic
from tests.training.evaluation.guard_rows import (
    CRITIC,
    record_measured_rows,
    steady_rows,
    write_selection_toy,
)
from training.evaluation import cut_ready as cut_ready_module
from training.evaluation.cut_ready import (
    CutCandidate,
    CutRow,
    choose,
    held_guard,
    holds,
    main,
    measure,
)
from training.evaluation.cut_ready_record import served_verdict
from training.evaluation.served_rows import served_selection_rows
from training.evaluation.shield import copy_with_guard


def candidate(
    ready_from: float | None,
    share_over: float,
    reward: float,
    cut_over: float,
    guidance: float | None = None,
    shield_risk: float | None = None,
    margin: float | None = None,
) -> CutCandidate:
    rows = steady_rows(share_over, reward)
    cut_rows = [CutRow(mode, 20, cut_over, 8.0, reward) for mode in (False, True)]
    return CutCandidate(rows, cut_rows, ready_from, guidance, shield_risk, margin)


def test_choose_holds_only_where_it_keeps_more_cuts_within_the_reward_bar() -> None:
    unheld = candidate(None, 0.0, 60.0, 0.6)
    costly, cheap = candidate(0.0, 0.0, 50.0, 0.0), candidate(30.0, 0.0, 59.0, 0.05)
    assert choose([unheld, costly, cheap], 0.025, 3.0) is cheap  # costly gives up 10 points
    assert choose([unheld, costly], 0.025, 3.0) is unheld  # no hold within the bar
    kept_anyway = candidate(None, 0.0, 60.0, 0.0)
    assert choose([kept_anyway, cheap], 0.025, 3.0) is kept_anyway  # nothing to gain
    riskier = candidate(30.0, 0.05, 60.0, 0.0)
    assert choose([unheld, riskier], 0.025, 3.0) is unheld  # steady budgets come first
    both = [unheld, candidate(0.0, 0.0, 58.0, 0.05), candidate(30.0, 0.0, 59.0, 0.05)]
    assert choose(both, 0.025, 3.0) is both[2]  # equal cuts: the higher reward


def test_held_guard_sets_the_floor_and_where_it_starts() -> None:
    guard = BudgetGuard(shield_margin=15.0)
    held = held_guard(guard, 30.0)
    assert (held.cut_floor, held.cut_ready_from, held.shield_margin) == (10.0, 30.0, 15.0)
    assert held.cut_ready_to == 40.0  # the cut's start: larger limits are not measured
    assert not held.holds_limit(60.0)
    assert (held_guard(held, None).cut_floor, held_guard(held, None).cut_ready_to) == (0.0, 0.0)
    assert held_guard(guard, 30.0, 0.0).cut_ready_guidance == 0.0
    assert held_guard(held_guard(guard, 30.0, 0.0), None).cut_ready_guidance is None
    shielded = held_guard(guard, 30.0, 0.0, 1.5)
    assert (shielded.shield_margin, shielded.shield_risk, shielded.cut_floor) == (40.0, 1.5, 10.0)
    assert held.cut_ready_tells_floor and held.cut_ready_margin is None
    own = held_guard(guard, 30.0, None, None, 6.0)
    assert (own.cut_ready_tells_floor, own.cut_ready_margin, own.cut_floor) == (False, 6.0, 10.0)
    assert held_guard(own, None).cut_ready_tells_floor  # no hold: the card's own hold undone


@pytest.fixture
def toy_policy(tmp_path: Path) -> Path:
    return write_selection_toy(tmp_path / "toy")


def test_measure_runs_only_what_each_hold_changes(
    toy_policy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    card = Policy.load(toy_policy).card
    ran = record_measured_rows(monkeypatch, cut_ready_module)
    unheld, from_0, from_30, own_0, own_30 = measure(toy_policy, card, [0.0, 30.0], 1, 1)
    told_own = ", told its own budget, fallback from 6 left"
    assert ran == [
        ("no hold", [10.0, 20.0, 40.0]),
        ("hold to 10 from limit 0", [20.0, 40.0]),
        ("hold to 10 from limit 30", [40.0]),
        (f"hold to 10 from limit 0{told_own}", [20.0, 40.0]),
        (f"hold to 10 from limit 30{told_own}", [40.0]),
    ]
    assert (own_0.margin, own_30.margin, from_30.margin) == (6.0, 6.0, None)
    assert [held.ready_from for held in (unheld, from_0, from_30)] == [None, 0.0, 30.0]
    assert len(from_30.rows) == 6 and [row.deterministic for row in from_30.cut_rows] == [
        False,
        True,
    ]
    # the toy's action follows the cost-to-go it is told: held to 10, it acts otherwise at 40
    assert unheld.rows[4].reward_mean != from_0.rows[4].reward_mean
    assert from_0.rows[:2] == unheld.rows[:2] and from_30.rows[:4] == unheld.rows[:4]


def test_a_hold_runs_the_budgets_it_leaves_alone_as_no_hold_does(
    toy_policy: Path, tmp_path: Path
) -> None:
    """What `measure` takes for granted, on real episodes: at the floor (10), and below the
    limit a hold starts from (20 under a hold from 30), the held guard's rows are no hold's."""
    card = Policy.load(toy_policy).card
    unheld = served_selection_rows(toy_policy, card, 2, 1, "no hold", [10.0, 20.0])
    for ready_from, budgets in ((0.0, [10.0]), (30.0, [10.0, 20.0])):
        copy = copy_with_guard(
            toy_policy, tmp_path / f"from-{ready_from:g}", held_guard(card.guard, ready_from)
        )
        held = served_selection_rows(copy, card, 2, 1, "held", budgets)
        assert held == unheld[: len(held)]
    moved = copy_with_guard(toy_policy, tmp_path / "moved", held_guard(card.guard, 0.0))
    assert served_selection_rows(moved, card, 2, 1, "held", [20.0]) != unheld[2:]  # it can differ


def test_no_hold_is_measured_without_the_hold_a_card_already_has(
    toy_policy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    update_card(toy_policy, budget_guard=held_guard(BudgetGuard(), 30.0).model_dump())
    floors: list[tuple[str, float]] = []

    def recorded(*args: Any) -> Any:
        floors.append((args[4], read_card(args[0]).guard.cut_floor))
        return served_selection_rows(*args)

    monkeypatch.setattr(cut_ready_module, "served_selection_rows", recorded)
    measure(toy_policy, Policy.load(toy_policy).card, [30.0], 1, 1, margins=[])
    assert floors == [("no hold", 0.0), ("hold to 10 from limit 30", 10.0)]


def test_no_hold_that_keeps_every_cut_is_measured_alone(
    toy_policy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept = [CutRow(mode, 1, 0.0, 4.0, 50.0) for mode in (False, True)]
    monkeypatch.setattr(cut_ready_module, "cut_rows", lambda *args: kept)
    (unheld,) = measure(toy_policy, Policy.load(toy_policy).card, [0.0, 30.0], 1, 1)
    assert unheld.ready_from is None and unheld.cut_share_over == 0.0


def test_cdt_cut_ready_records_every_candidate_and_sets_the_chosen_guard(
    toy_policy: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    measured = [candidate(None, 0.0, 60.0, 0.5), candidate(0.0, 0.0, 50.0, 0.0)]
    measured.append(candidate(30.0, 0.0, 59.0, 0.05))
    monkeypatch.setattr(cut_ready_module, "measure", lambda *args, **kw: measured)
    main([str(toy_policy)])
    card = read_card(toy_policy)
    assert (card.guard.cut_floor, card.guard.cut_ready_from) == (10.0, 30.0)
    record = (card.evaluation or {})["cut_ready"]
    assert [entry["cut_ready_from"] for entry in record["candidates"]] == [None, 0.0, 30.0]
    assert record["candidates"][2]["reward_given_up"] == pytest.approx(1.0)
    assert record["chosen"] == {
        "cut_ready_from": 30.0,
        "cut_ready_guidance": None,
        "shield_risk": None,
        "cut_ready_margin": None,
    }
    assert record["finished"] and card.guard.cut_ready_guidance is None
    assert "hold to 10 from limit 30 (5% over after the cut 40 -> 10)" in capsys.readouterr().out


def test_a_hold_with_its_own_guidance_weight_is_chosen_and_served_as_measured(
    toy_policy: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    measured = [candidate(None, 0.0, 60.0, 1.0), candidate(30.0, 0.0, 50.0, 0.0)]
    measured.append(candidate(30.0, 0.0, 61.0, 0.05, guidance=0.0))  # within the reward bar
    monkeypatch.setattr(cut_ready_module, "measure", lambda *args, **kw: measured)
    main([str(toy_policy)])
    card = read_card(toy_policy)
    assert (card.guard.cut_ready_from, card.guard.cut_ready_guidance) == (30.0, 0.0)
    record = (card.evaluation or {})["cut_ready"]
    assert record["chosen"] == {
        "cut_ready_from": 30.0,
        "cut_ready_guidance": 0.0,
        "shield_risk": None,
        "cut_ready_margin": None,
    }
    assert "5% over 10 after a cut from 40" in (served_verdict(card.evaluation or {}) or "")
    out = capsys.readouterr().out
    assert "hold to 10 from limit 30, guidance 0 while held (5% over after the cut" in out


def test_holds_weigh_the_guidance_while_held_only_on_a_card_with_guidance(
    toy_policy: Path,
) -> None:
    card = Policy.load(toy_policy).card
    # the toy has no guidance and no critic
    assert holds(card, [0.0, 30.0], margins=[]) == [
        (0.0, None, None, None),
        (30.0, None, None, None),
    ]
    guided = card.model_copy(update={"cost_guidance": CostGuidance(weight=1.5, shift=40.0)})
    assert holds(guided, [30.0], [0.0, 0.5], margins=[]) == [
        (30.0, None, None, None),
        (30.0, 0.0, None, None),
        (30.0, 0.5, None, None),
    ]
    assert holds(guided, [30.0], [1.5], margins=[]) == [(30.0, None, None, None)]  # the card's
    unweighted = card.model_copy(update={"cost_guidance": CostGuidance(weight=0.0, shift=40.0)})
    assert holds(unweighted, [30.0], margins=[]) == [(30.0, None, None, None)]


def test_holds_tell_the_model_its_own_budget_once_per_setting_and_margin(
    toy_policy: Path,
) -> None:
    card = Policy.load(toy_policy).card
    guided = card.model_copy(update={"cost_guidance": CostGuidance(weight=1.5, shift=40.0)})
    assert holds(guided, [0.0, 30.0], [0.0], [], [4.0, 6.0]) == [
        (0.0, None, None, None),
        (30.0, None, None, None),
        (0.0, 0.0, None, None),
        (30.0, 0.0, None, None),
        (0.0, None, None, 4.0),
        (30.0, None, None, 4.0),
        (0.0, None, None, 6.0),
        (30.0, None, None, 6.0),
    ]  # the card's guidance and shield only


def test_holds_try_a_shield_from_the_largest_budget_only_on_a_card_with_a_critic(
    toy_policy: Path,
) -> None:
    card = Policy.load(toy_policy).card
    critic = CostCriticCard.model_validate(CRITIC)
    criticised = card.model_copy(update={"cost_critic": critic})
    assert holds(criticised, [30.0], [], [1.5, 1.0], []) == [
        (30.0, None, None, None),
        (30.0, None, 1.5, None),
        (30.0, None, 1.0, None),
    ]
    shielded = held_guard(card.guard, None, None, 1.5)  # the card's shield already is one
    already = criticised.model_copy(update={"budget_guard": shielded})
    assert holds(already, [30.0], [], [1.5, 1.0], []) == [
        (30.0, None, None, None),
        (30.0, None, 1.0, None),
    ]


def test_a_hold_with_its_own_shield_runs_every_budget_and_is_served_as_chosen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = write_selection_toy(tmp_path / "toy", cost_critic=CRITIC)
    write_test_critic(directory, observation_dim=7, action_dim=2)
    card = Policy.load(directory).card
    ran = record_measured_rows(monkeypatch, cut_ready_module)
    measure(directory, card, [30.0], 1, 1, [], [1.5], [])
    assert ran == [
        ("no hold", [10.0, 20.0, 40.0]),
        ("hold to 10 from limit 30", [40.0]),
        ("hold to 10 from limit 30, shield from 40 at risk 1.5", [10.0, 20.0, 40.0]),
    ]
    measured = [candidate(None, 0.0, 60.0, 1.0), candidate(30.0, 0.0, 59.0, 0.1)]
    measured.append(candidate(30.0, 0.0, 59.0, 0.0, shield_risk=1.5))
    monkeypatch.setattr(cut_ready_module, "measure", lambda *args, **kw: measured)
    main([str(directory)])
    chosen = read_card(directory)
    assert (chosen.guard.shield_margin, chosen.guard.shield_risk) == (40.0, 1.5)
    assert (chosen.evaluation or {})["cut_ready"]["chosen"]["shield_risk"] == 1.5
    assert "0% over 10 after a cut from 40" in (served_verdict(chosen.evaluation or {}) or "")
    assert "shield from 40 at risk 1.5 (0% over after the cut" in capsys.readouterr().out


def test_a_hold_that_tells_the_model_its_own_budget_is_chosen_and_served_as_measured(
    toy_policy: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    measured = [candidate(None, 0.0, 60.0, 0.15), candidate(30.0, 0.0, 55.0, 0.0)]
    measured.append(candidate(30.0, 0.0, 59.0, 0.025, margin=6.0))  # the told floor costs 5
    monkeypatch.setattr(cut_ready_module, "measure", lambda *args, **kw: measured)
    main([str(toy_policy)])
    card = read_card(toy_policy)
    guard = card.guard
    assert (guard.cut_ready_from, guard.cut_ready_tells_floor, guard.cut_ready_margin) == (
        30.0,
        False,
        6.0,
    )
    assert (card.evaluation or {})["cut_ready"]["chosen"]["cut_ready_margin"] == 6.0
    assert "2% over 10 after a cut from 40" in (served_verdict(card.evaluation or {}) or "")
    assert "told its own budget, fallback from 6 left (2% over" in capsys.readouterr().out


def test_cdt_cut_ready_refuses_a_folder_without_a_model_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "nothing")])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and "has no model.json" in error and error.count("\n") == 1
