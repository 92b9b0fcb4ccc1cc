"""What `cdt cut-ready` chose, read back from a card's record."""

from training.evaluation.cut_ready_record import served_verdict


def test_the_verdict_is_the_chosen_holds_and_names_the_floor_where_cuts_are_missed() -> None:
    record = {
        "episodes_per_row": 40, "cut": [40.0, 10.0], "finished": True,
        "chosen": {"cut_ready_from": None},
        "candidates": [
            {"cut_ready_from": None, "worst_share_over": 0.1, "cut_share_over": 1.0},
            {"cut_ready_from": 0.0, "worst_share_over": 0.05, "cut_share_over": 0.025},
        ],
    }  # fmt: skip
    verdict = served_verdict({"cut_ready": record}) or ""
    assert "at most 10% over any reported budget" in verdict
    assert "100% over 10 after a cut from 40" in verdict and "`cut_floor`" in verdict
    record["chosen"] = {"cut_ready_from": 0.0}
    verdict = served_verdict({"cut_ready": record}) or ""
    assert "at most 5% over" in verdict and "2% over 10" in verdict and "cut_floor" not in verdict
    assert served_verdict({"cut_ready": record | {"finished": False}}) is None
    assert served_verdict({}) is None
