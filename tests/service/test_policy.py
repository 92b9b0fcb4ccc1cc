"""Policy loading against docs/ARTIFACT.md and the model repository's reload rules."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from runtime.context import EpisodeContext, stack_windows
from runtime.policy import Policy, PolicyLoadError
from service.errors import EpisodeGoneError, ModelNotFoundError, VersionElsewhereError
from service.repository import ModelRepository
from tests.service.toy_policy import LOG_STD, build_test_graph, write_test_policy


def edit_card(directory: Path, **changes: object) -> None:
    card = json.loads((directory / "model.json").read_text())
    card.update(changes)
    (directory / "model.json").write_text(json.dumps(card))


def test_policy_load_predicts_mean_and_log_std(tmp_path: Path) -> None:
    policy = Policy.load(write_test_policy(tmp_path / "toy"))
    context = EpisodeContext.start([0.1, 0.2, 0.3], 50.0, 10.0, context_len=4, action_dim=2)
    mean, log_std = policy.predict(stack_windows([context, context]))
    assert mean.shape == (2, 2) and log_std.shape == (2, 2)
    np.testing.assert_allclose(log_std, LOG_STD)
    assert policy.card.validated_cost_range == (5.0, 40.0)
    assert policy.card.training_config == {"seed": 0} and policy.card.model_extra == {}


def _plain_and_guided(
    directory: Path, budgets: tuple[float, ...]
) -> tuple[Policy, Policy, dict[str, np.ndarray]]:
    """The toy policy without and with guidance (weight 2, shift 40), and one window per
    budget."""
    write_test_policy(directory, cost_weight=0.02)
    plain = Policy.load(directory)
    edit_card(directory, cost_guidance={"weight": 2.0, "shift": 40.0})
    contexts = [
        EpisodeContext.start([0.1, 0.2, 0.3], 50.0, budget, context_len=4, action_dim=2)
        for budget in budgets
    ]
    return plain, Policy.load(directory), stack_windows(contexts)


def test_cost_guidance_pushes_the_mean_away_from_more_cost_to_go(tmp_path: Path) -> None:
    directory = tmp_path / "toy"
    plain, guided, windows = _plain_and_guided(directory, (0.0, 10.0, 40.0))
    own, log_std = plain.predict(windows)
    more = dict(windows)
    more["costs_to_go"] = windows["costs_to_go"] + np.float32(40.0) * ~windows["padding_mask"]
    away, _ = plain.predict(more)
    mean, guided_log_std = guided.predict(windows)
    np.testing.assert_allclose(mean, np.clip(own + 2.0 * (own - away), -1, 1), atol=1e-6)
    np.testing.assert_array_equal(guided_log_std, log_std)  # the spread is the policy's own
    assert not np.allclose(mean, own)  # the toy's action grows with the cost-to-go: guided lower
    assert (mean <= own + 1e-6).all()
    edit_card(directory, cost_guidance={"weight": 0.0, "shift": 40.0})
    np.testing.assert_array_equal(Policy.load(directory).predict(windows)[0], own)


def test_each_row_may_weigh_the_guidance_its_own_way(tmp_path: Path) -> None:
    """The budget guard's `cut_ready_guidance`: a held episode's row, not its batch's."""
    plain, guided, windows = _plain_and_guided(tmp_path / "toy", (10.0, 10.0, 40.0))
    card_weight, _ = guided.predict(windows)
    mean, _ = guided.predict(windows, [0.0, None, 0.5])
    np.testing.assert_array_equal(mean[0], plain.predict(windows)[0][0])  # weight 0: the model
    np.testing.assert_array_equal(mean[1], card_weight[1])  # None: the card's
    assert not np.allclose(mean[2], card_weight[2])
    np.testing.assert_array_equal(guided.predict(windows, [None] * 3)[0], card_weight)
    np.testing.assert_array_equal(guided.predict(windows, [0.0] * 3)[0], plain.predict(windows)[0])
    with pytest.raises(ValueError, match="2 guidance weights for 3 windows"):
        guided.predict(windows, [0.0, 0.0])
    no_guidance = plain.predict(windows, [0.5, None, 3.0])[0]  # nothing to weigh
    np.testing.assert_array_equal(no_guidance, plain.predict(windows)[0])


def test_cost_guidance_outside_its_range_is_refused(tmp_path: Path) -> None:
    directory = write_test_policy(tmp_path / "toy")
    edit_card(directory, cost_guidance={"weight": -1.0, "shift": 40.0})
    with pytest.raises(PolicyLoadError, match=r"cost_guidance\.weight"):
        Policy.load(directory)


def test_policy_load_missing_required_key_is_refused(tmp_path: Path) -> None:
    directory = write_test_policy(tmp_path / "toy")
    card = json.loads((directory / "model.json").read_text())
    del card["context_len"]
    (directory / "model.json").write_text(json.dumps(card))
    with pytest.raises(PolicyLoadError, match="context_len"):
        Policy.load(directory)


def test_policy_load_card_disagreeing_with_graph_is_refused(tmp_path: Path) -> None:
    directory = write_test_policy(tmp_path / "toy")
    edit_card(directory, observation_dim=5)
    with pytest.raises(PolicyLoadError, match="states"):
        Policy.load(directory)


def test_policy_load_corrupt_onnx_is_refused(tmp_path: Path) -> None:
    directory = write_test_policy(tmp_path / "toy")
    (directory / "model.onnx").write_bytes(b"not a graph")
    with pytest.raises(PolicyLoadError):
        Policy.load(directory)


def test_policy_load_wrong_output_names_is_refused(tmp_path: Path) -> None:
    directory = write_test_policy(tmp_path / "toy")
    graph = build_test_graph(3, 2, 4)
    graph.graph.output[0].name = "mean"
    for node in graph.graph.node:
        node.output[:] = ["mean" if name == "action_mean" else name for name in node.output]
        node.input[:] = ["mean" if name == "action_mean" else name for name in node.input]
    (directory / "model.onnx").write_bytes(graph.SerializeToString())
    with pytest.raises(PolicyLoadError, match="action_mean"):
        Policy.load(directory)


def test_card_action_bounds_must_match_action_dim(tmp_path: Path) -> None:
    directory = write_test_policy(tmp_path / "toy")
    edit_card(directory, action_low=[-1.0])
    with pytest.raises(PolicyLoadError, match="action_dim"):
        Policy.load(directory)


def test_repository_serves_models_by_card_name(tmp_path: Path) -> None:
    write_test_policy(tmp_path / "dir-a", name="alpha")
    write_test_policy(tmp_path / "dir-b", name="beta", observation_dim=5)
    repository = ModelRepository(tmp_path)
    result = repository.reload()
    assert {ref.name for ref in result.loaded} == {"alpha", "beta"}
    assert repository.current("beta").card.observation_dim == 5
    with pytest.raises(ModelNotFoundError):
        repository.current("gamma")


def test_repository_reload_refuses_broken_file_and_keeps_old_version(tmp_path: Path) -> None:
    directory = write_test_policy(tmp_path / "toy", version="1")
    repository = ModelRepository(tmp_path)
    repository.reload()
    edit_card(directory, version="2")
    (directory / "model.onnx").write_bytes(b"broken")
    result = repository.reload()
    assert len(result.failed) == 1 and not result.loaded and not result.removed
    assert repository.current("toy").card.version == "1"


def test_repository_reload_broken_card_keeps_old_version(tmp_path: Path) -> None:
    directory = write_test_policy(tmp_path / "toy", version="1")
    repository = ModelRepository(tmp_path)
    repository.reload()
    (directory / "model.json").write_text("{not json")
    result = repository.reload()
    assert len(result.failed) == 1
    assert repository.current("toy").card.version == "1"


def test_repository_reload_new_version_keeps_old_one_for_pinned_episodes(tmp_path: Path) -> None:
    directory = write_test_policy(tmp_path / "toy", version="1")
    repository = ModelRepository(tmp_path, keep_versions=2)
    repository.reload()
    write_test_policy(directory, version="2", cost_weight=0.5)
    result = repository.reload()
    assert [ref.version for ref in result.loaded] == ["2"]
    assert repository.current("toy").card.version == "2"
    assert repository.pinned("toy", "1").card.version == "1"


def test_repository_keeps_at_most_keep_versions(tmp_path: Path) -> None:
    directory = tmp_path / "toy"
    repository = ModelRepository(tmp_path, keep_versions=1)
    for version in ("1", "2"):
        write_test_policy(directory, version=version)
        repository.reload()
    with pytest.raises(EpisodeGoneError):
        repository.pinned("toy", "1")
    with pytest.raises(VersionElsewhereError) as elsewhere:  # never loaded here: a deploy rolling
        repository.pinned("toy", "3")
    assert elsewhere.value.status_code == 503 and elsewhere.value.retry_after == 1


def test_repository_unchanged_version_is_not_reloaded(tmp_path: Path) -> None:
    write_test_policy(tmp_path / "toy")
    repository = ModelRepository(tmp_path)
    repository.reload()
    first = repository.current("toy")
    result = repository.reload()
    assert [ref.version for ref in result.unchanged] == ["1"]
    assert repository.current("toy") is first


def test_repository_changed_files_without_version_bump_are_refused(tmp_path: Path) -> None:
    directory = write_test_policy(tmp_path / "toy")
    repository = ModelRepository(tmp_path)
    repository.reload()
    write_test_policy(directory, cost_weight=0.9)
    result = repository.reload()
    assert "version bump" in result.failed[0].error


def test_repository_duplicate_names_refuse_the_second(tmp_path: Path) -> None:
    write_test_policy(tmp_path / "a", name="toy")
    write_test_policy(tmp_path / "b", name="toy", version="2")
    repository = ModelRepository(tmp_path)
    result = repository.reload()
    assert len(result.loaded) == 1 and "duplicate" in result.failed[0].error


def test_repository_removed_directory_stops_new_episodes(tmp_path: Path) -> None:
    directory = write_test_policy(tmp_path / "toy")
    repository = ModelRepository(tmp_path)
    repository.reload()
    (directory / "model.json").unlink()
    result = repository.reload()
    assert [ref.name for ref in result.removed] == ["toy"]
    with pytest.raises(ModelNotFoundError):
        repository.current("toy")
    assert repository.pinned("toy", "1").card.name == "toy"
