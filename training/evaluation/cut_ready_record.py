"""What `cdt cut-ready` chose, read back from a card's record: the verdict `cdt pipeline` prints
and the worst share over a reported budget as served (`training/evaluation/cut_ready.py` writes
the record)."""

from __future__ import annotations

from typing import Any

from runtime.budget_guard import CUT_TARGET_SHARE_OVER, GUARD_TARGET_SHARE_OVER
from training.evaluation.cut_ready import Hold


def _served_row(evaluation: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """A card's `cut_ready` record and its chosen candidate (the shield's choice with the hold
    chosen by `cdt cut-ready`), None where it has not finished on the card."""
    record = evaluation.get("cut_ready") or {}
    if not record.get("finished"):
        return None
    chosen = _recorded_hold(record["chosen"])
    return record, next(each for each in record["candidates"] if _recorded_hold(each) == chosen)


def _recorded_hold(entry: dict[str, Any]) -> Hold:
    """The hold a record's candidate or choice names (records of before the guidance, the
    shield or the margin while held name none: the card's, the floor told)."""
    return (
        entry["cut_ready_from"],
        entry.get("cut_ready_guidance"),
        entry.get("shield_risk"),
        entry.get("cut_ready_margin"),
    )


def served_worst_share_over(evaluation: dict[str, Any]) -> float | None:
    """The largest share of selection episodes over a reported budget, as served (None where
    this command has not finished on the card)."""
    served = _served_row(evaluation)
    return None if served is None else float(served[1]["worst_share_over"])


def served_verdict(evaluation: dict[str, Any]) -> str | None:
    """What the guard as served did on the selection seeds, from a card's `evaluation`; None
    where this command has not finished on the card."""
    served = _served_row(evaluation)
    if served is None:
        return None
    record, row = served
    high, low = record["cut"]
    verdict = (
        f"as served, on {record['episodes_per_row']} selection episodes per budget and action "
        f"mode: at most {row['worst_share_over']:.0%} over any reported budget (the guard's "
        f"target: {GUARD_TARGET_SHARE_OVER:.0%}); {row['cut_share_over']:.0%} over {low:g} after "
        f"a cut from {high:g} at mid-episode (target: {CUT_TARGET_SHARE_OVER:.0%})"
    )
    if row["cut_share_over"] > CUT_TARGET_SHARE_OVER:
        verdict += "; a controller that cuts can say so: `cut_floor` at the episode's creation"
    return verdict
