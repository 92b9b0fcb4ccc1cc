"""`cdt dataset` end to end on a seven-episode file whose frontiers are known by hand."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import cdt_cli
from tests.training.data.synthetic_dsrl import make_episode, raw_arrays, write_raw
from training.data.cli import add_outliers, main, reduce_dataset
from training.data.dataset import load_dataset, save_dataset
from training.data.summary import plot_returns, summarise_dataset, write_summary

LENGTH = 50
COSTS = [0, 5, 10, 12, 20, 30, 45]  # as in test_frontiers: PF(10)=150, IPF(10)=400, RF(10)=140
# epsilon = PF - IPF (the paper's sign): -250 at 10, as the best episode (400, cost 30) is unsafe
REWARDS = [100.0, 150.0, 140.0, 300.0, 250.0, 400.0, 390.0]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def dataset_path(tmp_path: Path) -> Path:
    episodes = []
    for cost, reward in zip(COSTS, REWARDS, strict=True):
        costs = np.zeros(LENGTH)
        costs[:cost] = 1.0  # `cost` unit costs, so cost returns are step counts as in the sim
        episodes.append(make_episode(np.full(LENGTH, reward / LENGTH), costs))
    return save_dataset(tmp_path / "in.hdf5", episodes, {"env_id": "SafetyCarRun-v0"})


@pytest.fixture
def bad_path(tmp_path: Path) -> Path:
    arrays = raw_arrays()
    del arrays["costs"]
    return write_raw(tmp_path / "bad.hdf5", arrays)


def test_inspect_prints_and_writes_the_hand_computed_summary(dataset_path, tmp_path, capsys):
    out_json, out_png = tmp_path / "out" / "s.json", tmp_path / "out" / "s.png"
    main(["inspect", str(dataset_path), "--json", str(out_json), "--plot", str(out_png)])
    printed = capsys.readouterr().out
    assert re.search(r"^episodes +7$", printed, re.MULTILINE)
    assert re.search(r"^transitions +350$", printed, re.MULTILINE)
    assert "SafetyCarRun-v0" in printed
    summary = json.loads(out_json.read_text())
    assert (summary["episodes"], summary["transitions"]) == (7, 350)
    assert summary["reward_return"]["max"] == pytest.approx(400.0, rel=1e-5)
    assert (summary["cost_return"]["min"], summary["cost_return"]["max"]) == (0.0, 45.0)
    assert summary["pareto_episodes"] == 4
    at_10, at_20, at_40 = summary["frontiers"]
    assert at_10["threshold"] == 10.0 and at_10["safe_episodes"] == 3
    assert at_10["pareto_frontier"] == pytest.approx(150.0, rel=1e-5)
    assert at_10["inverse_pareto_frontier"] == pytest.approx(400.0, rel=1e-5)
    assert at_10["reward_frontier"] == pytest.approx(140.0, rel=1e-5)
    assert at_10["epsilon"] == pytest.approx(-250.0, rel=1e-5)
    assert at_10["normalised_epsilon"] == pytest.approx(-0.625, rel=1e-5)
    assert at_20["epsilon"] == pytest.approx(-100.0, rel=1e-5)
    assert at_40["epsilon"] == pytest.approx(10.0, rel=1e-4)
    table = {line.split()[0]: line.split() for line in printed.splitlines() if line[:2] == "  "}
    assert table["10"][1:6] == ["150.00", "400.00", "140.00", "-250.00", "-0.625"]
    assert "epsilon = PF - IPF" in printed
    assert out_png.read_bytes().startswith(PNG_MAGIC)
    assert sorted(p.name for p in out_json.parent.iterdir()) == ["s.json", "s.png"]


def test_inspect_writes_null_for_an_undefined_frontier(dataset_path, tmp_path, capsys):
    out_json = tmp_path / "s.json"
    main(["inspect", str(dataset_path), "--thresholds", "50", "--json", str(out_json)])
    (row,) = json.loads(out_json.read_text())["frontiers"]
    assert row["inverse_pareto_frontier"] is None and row["epsilon"] is None
    assert row["reward_frontier"] is None
    assert "NaN" not in out_json.read_text()
    (table_row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert table_row.split()[:5] == ["50", "400.00", "-", "-", "-"]  # threshold PF IPF RF eps


@pytest.mark.parametrize(
    "command",
    [
        ["inspect", "{bad}", "--json", "{out}", "--plot", "{out}.png"],
        ["reduce", "{bad}", "--out", "{out}", "--threshold", "5"],
        ["add-outliers", "{bad}", "--out", "{out}", "--fraction", "0.1", "--seed", "0"],
        ["filter", "{bad}", "--out", "{out}", "--max-per-cell", "2"],
    ],
)
def test_bad_file_is_one_line_exit_2_and_nothing_written(bad_path, tmp_path, capsys, command):
    out_dir = tmp_path / "out"
    argv = [part.format(bad=bad_path, out=out_dir / "result") for part in command]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.err == f"cdt dataset {command[0]}: missing key 'costs' (a DSRL file needs " + (
        "observations, next_observations, actions, rewards, costs, terminals, timeouts)\n"
    )
    assert "Traceback" not in captured.err
    assert not out_dir.exists()


def test_missing_file_through_the_cdt_dispatcher(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cdt_cli.main(["dataset", "inspect", str(tmp_path / "absent.hdf5")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_reduce_drops_unsafe_episodes_above_rf_and_records_it(dataset_path, tmp_path, capsys):
    out = tmp_path / "reduced.hdf5"
    main(["reduce", str(dataset_path), "--out", str(out), "--threshold", "10"])
    reduced = load_dataset(out)
    # every safe episode stays; the unsafe ones reach RF(10) = 140 or more, so all of them go
    np.testing.assert_allclose(reduced.reward_returns, [100, 150, 140], rtol=1e-5)
    np.testing.assert_array_equal(reduced.cost_returns, [0, 5, 10])
    assert reduced.attrs["env_id"] == "SafetyCarRun-v0"
    assert reduced.attrs["processing"] == [
        {"op": "reduce", "threshold": 10.0, "reward_level": pytest.approx(140.0), "removed": 4}
    ]
    printed = capsys.readouterr().out
    assert "PF 150.00 -> 150.00, IPF 400.00 -> 140.00" in printed
    assert "epsilon = PF - IPF -250.00 -> 10.00, normalised epsilon -0.625 -> 0.067" in printed
    assert "removed 4 unsafe episodes (cost return > 10) with reward return >= RF(10)" in printed
    (row,) = summarise_dataset(reduced, [10.0])["frontiers"]
    assert row["pareto_frontier"] > row["inverse_pareto_frontier"] and row["epsilon"] > 0


def test_reduce_at_another_threshold_keeps_the_safe_episodes_above_rf(dataset_path):
    # threshold 20: RF(20) = 250 (cost 20), PF(20) = 300 (cost 12, kept though above RF);
    # the unsafe episodes (400 at cost 30, 390 at 45) go; epsilon = 300 - 250
    dataset = load_dataset(dataset_path)
    reduced = reduce_dataset(dataset, 20.0)
    np.testing.assert_array_equal(reduced.cost_returns, [0, 5, 10, 12, 20])
    (row,) = summarise_dataset(reduced, [20.0])["frontiers"]
    assert row["epsilon"] == pytest.approx(50.0, rel=1e-5)


def test_reduce_refuses_a_dataset_without_safe_episodes(dataset_path, tmp_path, capsys):
    dataset = load_dataset(dataset_path)
    with pytest.raises(ValueError, match="no episode has cost return <= -1"):
        reduce_dataset(dataset, -1.0)
    out = tmp_path / "none.hdf5"
    with pytest.raises(SystemExit) as exit_info:
        main(["reduce", str(dataset_path), "--out", str(out), "--threshold", "-1"])
    assert exit_info.value.code == 2 and not out.exists()
    assert capsys.readouterr().err.count("\n") == 1


def test_add_outliers_relabels_high_cost_episodes_as_low_cost(dataset_path, tmp_path):
    out = tmp_path / "noisy.hdf5"
    argv = ["add-outliers", str(dataset_path), "--out", str(out), "--fraction", "0.3"]
    main([*argv, "--seed", "1"])
    noisy = load_dataset(out)
    # candidates: unsafe, cost >= 45 / 2 and reward >= 400 / 2 -> episodes 5 and 6; 0.3 * 7 -> 2
    assert noisy.attrs["processing"][0]["outliers"] == [5, 6]
    np.testing.assert_allclose(noisy.reward_returns[5:], [600.0, 585.0], rtol=1e-5)
    assert np.all(noisy.cost_returns[5:] < 10)
    for episode in noisy.episodes[5:]:
        assert set(np.unique(episode.costs).tolist()) <= {0.0, 1.0}
    original = load_dataset(dataset_path)
    np.testing.assert_array_equal(noisy.cost_returns[:5], original.cost_returns[:5])
    np.testing.assert_array_equal(noisy.episodes[5].observations, original.episodes[5].observations)
    again = tmp_path / "again.hdf5"
    main(
        ["add-outliers", str(dataset_path), "--out", str(again), "--fraction", "0.3", "--seed", "1"]
    )
    for first, second in zip(noisy.episodes, load_dataset(again).episodes, strict=True):
        np.testing.assert_array_equal(first.costs, second.costs)


def test_add_outliers_refuses_more_than_the_candidates(dataset_path, tmp_path):
    with pytest.raises(ValueError, match="only 2 high-cost"):
        add_outliers(load_dataset(dataset_path), 0.5, np.random.default_rng(0))
    # at threshold 30 the episode with cost 30 is safe, so only episode 6 may become an outlier
    with pytest.raises(ValueError, match="only 1 high-cost"):
        add_outliers(load_dataset(dataset_path), 0.3, np.random.default_rng(0), threshold=30.0)
    out = tmp_path / "noisy.hdf5"
    with pytest.raises(SystemExit) as exit_info:
        main(["add-outliers", str(dataset_path), "--out", str(out), "--fraction", "0.5"])
    assert exit_info.value.code == 2 and not out.exists()


def test_filter_keeps_at_most_n_per_cell_reproducibly(dataset_path, tmp_path):
    outs = [tmp_path / "a.hdf5", tmp_path / "b.hdf5"]
    for out in outs:
        grid = ["--cost-bins", "1", "--reward-bins", "1", "--max-per-cell", "3", "--seed", "4"]
        main(["filter", str(dataset_path), "--out", str(out), *grid])
    first, second = (load_dataset(out) for out in outs)
    assert len(first.episodes) == 3
    np.testing.assert_array_equal(first.reward_returns, second.reward_returns)
    assert first.attrs["processing"][0]["op"] == "grid-filter"


@pytest.mark.parametrize("command", ["inspect", "reduce", "add-outliers", "filter"])
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert f"usage: cdt dataset {command}" in capsys.readouterr().out


def test_bad_arguments_exit_2(dataset_path, tmp_path):
    for argv in (
        ["add-outliers", str(dataset_path), "--out", str(tmp_path / "x"), "--fraction", "1.5"],
        ["reduce", str(dataset_path), "--out", str(tmp_path / "x"), "--threshold", "nan"],
        # the old, inverted reduce's band; the paper's reduction has no such parameter
        ["reduce", str(dataset_path), "--out", str(tmp_path / "x"), "--epsilon", "50"],
        [],
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2


def test_write_summary_and_plot_returns_as_the_collector_calls_them(dataset_path, tmp_path):
    dataset = load_dataset(dataset_path)
    summary = write_summary(dataset, tmp_path / "d.json")
    assert json.loads(summary.read_text())["task"] == "SafetyCarRun-v0"
    plot = plot_returns(dataset, tmp_path / "d.png", thresholds=(10.0, 20.0, 40.0))
    assert plot.read_bytes().startswith(PNG_MAGIC)


def test_outputs_are_replaced_only_with_force_and_never_the_input(dataset_path, tmp_path, capsys):
    out = tmp_path / "reduced.hdf5"
    out.write_text("earlier work")
    argv = ["reduce", str(dataset_path), "--out", str(out), "--threshold", "10"]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2 and out.read_text() == "earlier work"
    assert "exists already" in capsys.readouterr().err
    main([*argv, "--force"])
    assert len(load_dataset(out).episodes) == 3
    link = tmp_path / "link.hdf5"
    link.symlink_to(dataset_path)
    before = dataset_path.read_bytes()
    for same in (dataset_path, link):  # the input itself, even with --force
        with pytest.raises(SystemExit) as exit_info:
            main(["filter", str(dataset_path), "--out", str(same), "--force"])
        assert exit_info.value.code == 2
        assert "is the input file" in capsys.readouterr().err
    assert dataset_path.read_bytes() == before


def test_add_outliers_refuses_a_nan_reward_scale_before_writing(dataset_path, tmp_path, capsys):
    out = tmp_path / "noisy.hdf5"
    argv = ["add-outliers", str(dataset_path), "--out", str(out), "--fraction", "0.3"]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--reward-scale", "nan"])
    assert exit_info.value.code == 2 and not out.exists()
    assert capsys.readouterr().err.count("\n") == 1
