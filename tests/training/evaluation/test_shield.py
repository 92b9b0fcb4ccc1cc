"""`cdt shield`: the choice of the guard's shield, what the card records, a short real run."""

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from runtime.card import read_card
from runtime.evaluation_protocol import BudgetRow
from runtime.policy import Policy
from tests.runtime.toy_critic import write_test_critic
from tests.service.toy_policy import write_test_policy
from tests.training.evaluation.guard_rows import (
    CRITIC,
    record_measured_rows,
    steady_rows,
    write_selection_toy,
)
from training.evaluation import shield as shield_module
from training.evaluation.shield import ShieldCandidate, choose, main, measure_shields


def candidate(margin: float, share_over: float, reward: float) -> ShieldCandidate:
    rows = steady_rows(share_over, reward)
    return ShieldCandidate(rows, margin, 1.0)


def test_choose_keeps_budgets_first_then_reward_within_the_reward_bar() -> None:
    unshielded = candidate(0.0, 0.15, 60.0)
    close, costly = candidate(15.0, 0.05, 58.0), candidate(25.0, 0.0, 50.0)
    assert choose([unshielded, close, costly], 0.05, 3.0) is close
    assert choose([unshielded, costly], 0.05, 3.0) is costly  # none within 3: safety first
    assert choose([candidate(0.0, 0.0, 60.0), close], 0.05, 3.0).margin == 0.0  # not needed
    assert choose([unshielded, candidate(15.0, 0.1, 61.0)], 0.05, 3.0).margin == 15.0


def test_reward_given_up_compares_rows_of_the_same_budget_and_mode_in_any_order() -> None:
    unshielded = candidate(0.0, 0.15, 60.0)
    sampled_ten = dataclasses.replace(unshielded.rows[0], normalised_reward=50.0)
    unshielded = ShieldCandidate([sampled_ten, *unshielded.rows[1:]], 0.0, 0.0)
    rows = [dataclasses.replace(row, normalised_reward=row.normalised_reward - 1.0)
            for row in unshielded.rows]  # fmt: skip
    shuffled = ShieldCandidate(rows[::-1], 15.0, 1.0)  # as the workers finished
    assert shuffled.reward_given_up(unshielded) == pytest.approx(1.0)  # not 60 - 49 = 11
    with pytest.raises(ValueError, match="different rows"):
        ShieldCandidate(rows[1:], 15.0, 1.0).reward_given_up(unshielded)


@pytest.fixture
def critic_policy(tmp_path: Path) -> Path:
    directory = write_selection_toy(tmp_path / "toy", cost_critic=CRITIC)
    write_test_critic(directory, observation_dim=7, action_dim=2)  # cost = 2 a_0 + 0.1 s_0
    return directory


def test_measure_shields_runs_the_guard_with_each_shield_on_the_selection_seeds(
    critic_policy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    card = Policy.load(critic_policy).card
    plain, shielded = measure_shields(critic_policy, card, [(40.0, 0.0)], 1, 1)
    assert (plain.margin, shielded.margin) == (0.0, 40.0) and len(shielded.rows) == 6
    assert plain.worst_share_over > 0  # (else no shield would be run: below)
    # the toy's action grows with the cost-to-go; a shield that calls every a_0 > 0 costly moves it
    assert [row.reward_mean for row in plain.rows] != [row.reward_mean for row in shielded.rows]
    ran: list[str] = []

    def kept(*args: Any) -> list[BudgetRow]:
        ran.append(args[4])
        return [dataclasses.replace(row, share_over_budget=0.0) for row in plain.rows]

    monkeypatch.setattr(shield_module, "served_selection_rows", kept)
    (alone,) = measure_shields(critic_policy, card, [(15.0, 1.0), (25.0, 1.0)], 1, 1)
    assert (alone.margin, ran) == (0.0, ["no shield"])  # nothing went over: no shield tried


def test_a_budget_within_two_margins_is_measured_once_per_risk(
    critic_policy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    card = Policy.load(critic_policy).card
    ran = record_measured_rows(monkeypatch, shield_module)
    _, narrow, wide, other_risk = measure_shields(
        critic_policy, card, [(20.0, 0.0), (40.0, 0.0), (40.0, 5.0)], 1, 1
    )
    assert [budgets for _, budgets in ran] == [[10, 20, 40], [10, 20, 40], [40], [10, 20, 40]]
    alone = measure_shields(critic_policy, card, [(40.0, 0.0)], 1, 1)[1]
    assert wide.rows == alone.rows  # the rows it took from the narrow margin are its own episodes
    assert [row for row in wide.rows if row.target_cost <= 20] == [
        row for row in narrow.rows if row.target_cost <= 20
    ]
    assert wide.rows != narrow.rows  # at 40 the margins differ
    assert len(other_risk.rows) == 6 and other_risk.rows != wide.rows  # another risk: run anew


def test_cdt_shield_records_every_candidate_and_sets_the_chosen_guard(
    critic_policy: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    measured = [candidate(0.0, 0.2, 60.0), candidate(15.0, 0.0, 59.0), candidate(25.0, 0.0, 55.0)]
    monkeypatch.setattr(shield_module, "measure_shields", lambda *args, **kw: measured)
    main([str(critic_policy), "--margins", "15", "25", "--risks", "1"])
    card = read_card(critic_policy)
    assert (card.guard.shield_margin, card.guard.shield_risk) == (15.0, 1.0)
    record = (card.evaluation or {})["shield"]
    assert [entry["shield_margin"] for entry in record["candidates"]] == [0.0, 15.0, 25.0]
    assert record["candidates"][1]["reward_given_up"] == pytest.approx(1.0)
    assert "margin 15, risk 1 (worst share over 0%)" in capsys.readouterr().out


def test_cdt_shield_refuses_a_model_without_a_cost_critic(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = write_test_policy(tmp_path / "toy", observation_dim=7, action_dim=2)
    with pytest.raises(SystemExit) as exit_info:
        main([str(directory)])
    assert exit_info.value.code == 2 and "cdt critic" in capsys.readouterr().err
