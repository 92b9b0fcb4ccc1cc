"""Fuzz the model repository and the runtime loaders with corrupted model folders.

    CDT_LEDGER=off .venv/bin/python bench/fuzz_models.py --seed 0 --cases 300
    CDT_LEDGER=off .venv/bin/python bench/fuzz_models.py --seed 0 --case 17 --keep /tmp/fuzz

Each case copies `--source` (a shipped model folder) into a temporary models folder, starts the
service in-process on it (`service.main.create_app`, memory store, no tokens), starts an episode
on the good model, then corrupts the folder with one seeded corruption and asks the admin reload
route to rescan. Card corruptions: missing, extra and wrongly typed fields, NaN/Infinity, huge
and negative numbers, empty lists, dims that contradict the graph, bad action bounds, absurd
`context_len`/`max_episode_len`, bad names and versions (path-like, unicode, control
characters), a duplicate name in a second folder, truncated JSON, bytes that are not UTF-8, JSON
that is no object. File corruptions, of `model.onnx` and of `cost_critic.onnx` (a critic of
`--critic-source`, the only shipped kind that has one): truncated, flipped bytes, zeros, empty, a
valid graph of another model (`--other`, other dims), missing; and for every file: symlinks
(dangling, a loop, to `--other`'s file, to `/dev/zero`, to a FIFO), no read permission (no
effect when run as root), a folder in its place. Most corruptions bump the card's version, so
that the reload loads the folder anew; the others must be refused as changed files.

The invariants. (a) The reload answers 200 (the folder loaded) or 422 (refused, each reason one
line); a loaded model answers episodes; the previously loaded version serves on (new episodes
and its running episode; a folder whose `model.json` is gone is a removed model, as the
repository defines it, and only its running episode must go on); no request answers 500, and no
action is non-finite or out of the served card's bounds. (b) `read_card`, `Policy.load` and
`CostCritic.load` load the folder or raise the project's user errors (`UserError`,
`PolicyLoadError`, `CostCriticLoadError`) with one line; a loaded policy answers finite outputs
for the empty window and in-bounds actions. (c) A case answers within `CASE_SECONDS` (each runs
in a forked child with a memory limit: a hang or a crash is one violation). The summary counts
outcomes per corruption kind and names each violation with its reproducer. Writes nothing
outside its temporary folder (and `--keep`); never touches `models/`.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import multiprocessing
import os
import resource
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere in the repo
from fastapi.testclient import TestClient

from bench.fuzz_cases import Case, Result, violation_lines
from runtime.card import read_card
from runtime.context import sample_action
from runtime.cost_critic import CostCritic, CostCriticLoadError
from runtime.files import CARD_FILE, COST_CRITIC_FILE, ONNX_FILE
from runtime.policy import Policy, PolicyLoadError
from runtime.user_errors import UserError
from service.config import Settings
from service.main import create_app

CASE_SECONDS = 60.0
"""A case whose child runs longer is a hang (each takes about a second)."""
MEMORY_LIMIT = 6 * 2**30
"""Address space of a case's child: a reader that never stops (`/dev/zero`) fails, not the host."""
STEPS = 3
"""Steps of each episode a case runs."""
USER_ERRORS = (UserError, PolicyLoadError, CostCriticLoadError)

Card = dict[str, Any]


# ---------------------------------------------------------------- corruptions

REQUIRED = ("name", "version", "task", "observation_dim", "action_dim", "action_low")
REQUIRED += ("action_high", "context_len", "max_episode_len")
NUMBERS = ("observation_dim", "action_dim", "context_len", "max_episode_len", "reward_scale")
NUMBERS += ("cost_scale", "budget_scale", "onnx_opset")
NESTED = (
    ("default_targets", 0, "reward"),
    ("default_targets", 0, "cost"),
    ("cost_curve", 0, "actual_cost"),
    ("mean_action_budget_scales", 0, "scale"),
    ("validated_cost_range", 0),
    ("dataset", "reward_return_min"),
    ("dataset", "reward_return_max"),
    ("action_low", 0),
    ("action_high", 1),
    ("budget_guard", "shield_margin"),
    ("cost_guidance", "weight"),
)
WRONG_TYPES: list[Any] = ["7", 7.5, True, None, [], {}, [7], "", -0.0]
HUGE: list[Any] = [10**20, 2**63, -(2**63), 1e308, -1e308, 3.5e38, 1e-320, 0, -1, -1e9]
NAMES: list[Any] = ["../evil", "a/b", "/abs", "", " ", "ünïcødé", "x" * 200, "name\nx", ".hidden"]
NAMES += ["con", "a" * 128, "-dash", "x\x00y", 7, None]
VERSIONS: list[Any] = ["", "../../x", "v\n2", "\x00", "ü", "x" * 500, "💥", 7, None, " "]
VERSIONS += ["a/b", "x\r\nSet-Cookie: a=b", "\u202eevil", "v" * 128]


def _pick(rng: np.random.Generator, values: list[Any] | tuple[Any, ...]) -> Any:
    return values[int(rng.integers(len(values)))]


def _set_nested(card: Card, path: tuple[Any, ...], value: Any) -> bool:
    """Set `card[path]` where the parents exist (and create the `dataset` dict); False: none."""
    target: Any = card
    for key in path[:-1]:
        if isinstance(target, dict) and key not in target and key == "dataset":
            target[key] = {}
        try:
            target = target[key]
        except (KeyError, IndexError, TypeError):
            return False
    if isinstance(target, dict) or (isinstance(target, list) and path[-1] < len(target)):
        target[path[-1]] = value
        return True
    return False


def _missing_field(rng, card, other):
    field = _pick(rng, [*REQUIRED, *REQUIRED, *[k for k in card if k not in REQUIRED]])
    card.pop(field, None)
    return f"no {field}"


def _extra_field(rng, card, other):
    value = _pick(rng, [1, "x", math.nan, [1, {"a": None}], {"deep": [[[]]]}, "é" * 50, 10**30])
    key = _pick(rng, ["extra", "", "__proto__", "ünï", "x" * 300, "model_config", "guard"])
    card[key] = value
    return f"extra {key!r:.20} = {value!r:.30}"


def _wrong_type(rng, card, other):
    field = _pick(rng, [*REQUIRED, *NUMBERS, "default_targets", "budget_guard", "cost_critic"])
    value = _pick(rng, WRONG_TYPES)
    card[field] = value
    return f"{field} = {value!r}"


def _set_somewhere(rng, card, value, top_share: float) -> str:
    """Set `value` on a top-level number field (with probability `top_share`) or a nested one."""
    if rng.random() < top_share:
        field = _pick(rng, NUMBERS)
        card[field] = value
        return f"{field} = {value!r}"
    path = _pick(rng, NESTED)
    set_ = _set_nested(card, path, value)
    return f"{'.'.join(map(str, path))} = {value!r}" + ("" if set_ else " (no such field)")


def _non_finite(rng, card, other):
    return _set_somewhere(rng, card, _pick(rng, [math.nan, math.inf, -math.inf]), 0.4)


def _huge_negative(rng, card, other):
    return _set_somewhere(rng, card, _pick(rng, HUGE), 0.5)


def _empty_list(rng, card, other):
    field = _pick(rng, ["action_low", "action_high", "default_targets", "cost_curve"])
    field = _pick(rng, [field, "mean_action_budget_scales", "budget_guard_measured"])
    card[field] = [] if rng.random() < 0.8 else {}
    return f"{field} empty"


def _dims(rng, card, other):
    field = _pick(rng, ["observation_dim", "action_dim", "context_len"])
    value = max(1, int(card[field]) + int(_pick(rng, [-1, 1, 5, -100, 1000])))
    card[field] = value
    if field == "action_dim" and rng.random() < 0.7:  # bounds that agree with the new dim
        card["action_low"], card["action_high"] = [-1.0] * value, [1.0] * value
    return f"{field} = {value} (graph: {other['graph_dims'][field]})"


def _bounds(rng, card, other):
    low, high = list(card["action_low"]), list(card["action_high"])
    choice = int(rng.integers(8))
    if choice == 0:
        low, high = high, low
    elif choice == 1:
        low, high = [0.3] * len(low), [0.3] * len(high)
    elif choice == 2:
        low = low[:-1]
    elif choice == 3:
        high = [*high, 1.0]
    elif choice == 4:
        low, high = [-1e39] * len(low), [1e39] * len(high)
    elif choice == 5:
        low, high = [-1e308] * len(low), [1e308] * len(high)
    elif choice == 6:
        low, high = [5.0] * len(low), [6.0] * len(high)
    else:
        low, high = [-1e-30] * len(low), [1e-30] * len(high)
    card["action_low"], card["action_high"] = low, high
    return f"bounds {low!r:.30} .. {high!r:.30}"


def _lengths(rng, card, other):
    field = _pick(rng, ["context_len", "max_episode_len"])
    value = _pick(rng, [1, 2, 10**6, 10**9, 2**31, 2**63 - 1, 2**64])
    card[field] = value
    return f"{field} = {value}"


def _name_version(rng, card, other):
    field = "name" if rng.random() < 0.5 else "version"
    value = _pick(rng, NAMES if field == "name" else VERSIONS)
    card[field] = value
    return f"{field} = {value!r:.40}"


CardCorruption = Callable[[np.random.Generator, Card, dict[str, Any]], str]
CARD_KINDS: dict[str, CardCorruption] = {
    "card missing field": _missing_field,
    "card extra field": _extra_field,
    "card wrong type": _wrong_type,
    "card NaN/Infinity": _non_finite,
    "card huge/negative": _huge_negative,
    "card empty list": _empty_list,
    "card dims vs graph": _dims,
    "card action bounds": _bounds,
    "card absurd lengths": _lengths,
    "card name/version": _name_version,
}
FILE_KINDS = ("truncated", "flipped bytes", "zero bytes", "other model", "missing")
FILE_KINDS += ("symlink", "unreadable", "directory")
KINDS = (
    *CARD_KINDS,
    "duplicate name",
    "card truncated JSON",
    "card not UTF-8",
    "card not an object",
    *(f"card {kind}" for kind in FILE_KINDS[4:]),
    *(f"onnx {kind}" for kind in FILE_KINDS),
    *(f"critic {kind}" for kind in FILE_KINDS),
)


def _write_card(path: Path, card: Any) -> None:
    path.unlink(missing_ok=True)
    path.write_text(json.dumps(card, indent=2, allow_nan=True, ensure_ascii=False) + "\n")


def _corrupt_bytes(rng: np.random.Generator, kind: str, path: Path, other: Path) -> str:
    data = bytearray(path.read_bytes())
    if kind == "truncated":
        size = int(rng.integers(0, len(data)))
        path.write_bytes(bytes(data[:size]))
        return f"{size} of {len(data)} bytes"
    if kind == "flipped bytes":
        flips = int(rng.integers(1, 50))
        for offset in rng.integers(0, len(data), size=flips):
            data[int(offset)] ^= 1 << int(rng.integers(8))
        path.write_bytes(bytes(data))
        return f"{flips} flipped bits"
    if kind == "zero bytes":
        size = _pick(rng, [0, 1, 64, len(data)])
        path.write_bytes(bytes(size))
        return f"{size} zero bytes"
    if kind == "other model":
        shutil.copy(other, path)
        return f"the graph of {other.parent.name}/{other.name}"
    if kind == "missing":
        path.unlink()
        return "removed"
    if kind == "unreadable":
        path.chmod(0)
        return "mode 000" + (" (root reads it anyway)" if os.geteuid() == 0 else "")
    if kind == "directory":
        path.unlink()
        path.mkdir()
        (path / "inside").write_text("x")
        return "a folder"
    path.unlink()  # symlink
    choice = int(rng.integers(len(SYMLINKS)))
    if choice == 3:
        os.mkfifo(path.with_name("fifo"))
    target = [Path("nowhere"), path, other, path.with_name("fifo"), Path("/dev/zero")][choice]
    path.symlink_to(target)
    return SYMLINKS[choice]


SYMLINKS = ("dangling symlink", "symlink loop", "symlink to another model's file")
SYMLINKS += ("symlink to a FIFO", "symlink to /dev/zero")


def prepare(index: int, models: Path, source: Path, critic_source: Path) -> tuple[str, Path]:
    """Copy the folder case `index` corrupts into `models`: (its corruption kind, the copy)."""
    kind = KINDS[index % len(KINDS)]
    origin = critic_source if kind.startswith("critic ") else source
    folder = models / origin.name
    shutil.copytree(origin, folder)
    return kind, folder


def corrupt(seed: int, index: int, kind: str, folder: Path, other: Path) -> str:
    """Apply case `index`'s corruption to `folder`; `other` is a folder of another model."""
    rng = np.random.default_rng([seed, index])
    card_path = folder / CARD_FILE
    card: Card = json.loads(card_path.read_text())
    bump = rng.random() < 0.85  # else the reload must notice changed files of the same version
    if bump:
        card["version"] = f"{card['version']}+fuzz{index}"
    if kind in CARD_KINDS:
        own = read_card(folder)
        dims = {"observation_dim": own.observation_dim, "action_dim": own.action_dim}
        dims["context_len"] = own.context_len
        variant = CARD_KINDS[kind](rng, card, {"graph_dims": dims})
        _write_card(card_path, card)
        return variant
    _write_card(card_path, card)
    if kind == "duplicate name":
        twin = folder.with_name(f"{folder.name}-twin")
        shutil.copytree(folder, twin)
        if rng.random() < 0.5:
            card["version"] = f"{card['version']}-twin"
            _write_card(twin / CARD_FILE, card)
            return "a second folder, same name, other version"
        return "a second folder, same name and version"
    if kind == "card truncated JSON":
        data = card_path.read_bytes()
        size = int(rng.integers(0, len(data)))
        card_path.write_bytes(data[:size])
        return f"{size} of {len(data)} bytes"
    if kind == "card not UTF-8":
        choice = int(rng.integers(4))
        text = card_path.read_text()
        encoded = [
            text.replace(card["task"], card["task"] + "\udcff").encode("utf-8", "surrogateescape"),
            text.encode("utf-16"),
            text.replace('"task"', '"t\u00e4sk"').encode("latin-1"),
            b"\xff\xfe\x00" + text.encode(),
        ][choice]
        card_path.write_bytes(encoded)
        return ["a \\xff byte in task", "UTF-16", "latin-1 key", "garbage prefix"][choice]
    if kind == "card not an object":
        nested = "[" * 100_000 + "]" * 100_000
        value = _pick(rng, [[], None, "card", 42, [card], nested])
        card_path.write_text(nested if value is nested else json.dumps(value))
        return "deeply nested list" if value is nested else f"{value!r:.30}"
    file_kind, file_name = kind.split(" ", 1)[1], CARD_FILE
    if kind.startswith("onnx "):
        file_name = ONNX_FILE
    elif kind.startswith("critic "):
        file_name = COST_CRITIC_FILE
    other_file = other / file_name  # a card, a graph or a critic of other dims
    if file_name == COST_CRITIC_FILE and not other_file.exists():
        other_file = other / ONNX_FILE  # a policy graph in the critic's place
    return f"{file_name}: " + _corrupt_bytes(rng, file_kind, folder / file_name, other_file)


# ---------------------------------------------------------------- checks


def _strict_json(text: str) -> Any:
    def refuse(name: str) -> None:
        raise ValueError(f"{name} in JSON")

    return json.loads(text, parse_constant=refuse)


def _answer(check: str, response: Any, ok: tuple[int, ...] = (200, 201)) -> tuple[Result, Any]:
    """The outcome of one request: a 5xx or non-JSON body is a violation; a 4xx, refused."""
    try:
        body = _strict_json(response.text)
    except ValueError as error:
        return Result(check, "violation", f"{response.status_code}: not JSON: {error}"), None
    if response.status_code in ok:
        return Result(check, "ok", ""), body
    if response.status_code >= 500:
        return Result(check, "violation", f"{response.status_code}: {response.text[:300]}"), body
    return Result(check, "refused", f"{response.status_code}: {response.text[:200]}"), body


def _action_problem(action: Any, low: list[float], high: list[float]) -> str | None:
    values = np.asarray(action, dtype=np.float64)
    if values.shape != (len(low),):
        return f"action {action!r:.80} has not {len(low)} entries"
    if not np.isfinite(values).all():
        return f"non-finite action {action!r:.80}"
    if (values < np.asarray(low)).any() or (values > np.asarray(high)).any():
        return f"action {action!r:.80} outside [{low!r:.40}, {high!r:.40}]"
    return None


def run_episode(
    client: TestClient, model: dict[str, Any], rng: np.random.Generator
) -> tuple[list[Result], str | None]:
    """Start an episode on `model` (as `GET /v1/models` shows it) and step it; (results, id)."""
    check = f"episode {model['name']}"
    targets = model.get("default_targets") or [{"reward": 100.0, "cost": 10.0}]
    observation = rng.normal(size=model["observation_dim"]).tolist()
    body = {"model": model["name"], "target_reward": targets[0]["reward"]}
    body |= {"target_cost": max(0.0, targets[0]["cost"]), "observation": observation, "seed": 1}
    result, answer = _answer(check, client.post("/v1/episodes", json=body))
    if result.outcome != "ok":
        return [result], None
    problem = _action_problem(answer["action"], model["action_low"], model["action_high"])
    if problem:
        return [Result(check, "violation", problem)], answer["episode_id"]
    results = [result]
    for _ in range(STEPS):
        results.append(step_episode(client, answer["episode_id"], model, rng))
        if results[-1].outcome != "ok":
            break
    return results, answer["episode_id"]


def step_episode(
    client: TestClient, episode: str, model: dict[str, Any], rng: np.random.Generator
) -> Result:
    """One step of `episode` of `model`, its action checked against the model's bounds."""
    check = f"step {model['name']}"
    body = {"observation": rng.normal(size=model["observation_dim"]).tolist()}
    body |= {"reward": 1.0, "cost": 0.0}
    result, answer = _answer(check, client.post(f"/v1/episodes/{episode}/step", json=body), (200,))
    if result.outcome == "ok":
        problem = _action_problem(answer["action"], model["action_low"], model["action_high"])
        if problem:
            return Result(check, "violation", problem)
    return result


def check_reload(client: TestClient) -> tuple[Result, dict[str, Any]]:
    """The admin reload: 200 (all loaded) or 422 (refused, each reason one clear line)."""
    response = client.post("/v1/admin/reload")
    result, body = _answer("reload", response, (200, 422))
    if result.outcome == "violation" or body is None:
        return result, {}
    for failure in body.get("failed", []):
        reason = str(failure.get("error", ""))
        if not reason.strip() or "\n" in reason or "\r" in reason or len(reason) > 2000:
            detail = f"refusal reason not one line: {reason!r:.300}"
            return Result("reload", "violation", detail), body
    if body.get("failed"):
        reasons = "; ".join(str(f["error"]) for f in body["failed"])
        return Result("reload", "refused", reasons[:400]), body
    if not body.get("loaded") and not body.get("unchanged"):
        return Result("reload", "removed", json.dumps(body.get("removed"))), body
    return Result("reload", "ok", ""), body


def check_service(
    client: TestClient, good: dict[str, Any], episode: str, rng: np.random.Generator, kind: str
) -> list[Result]:
    """After the reload: the models list, the good model's name (served on, unless its card is
    gone: a folder without `model.json` is a removed model), its running episode, every newly
    loaded model and `/readyz`."""
    reload, body = check_reload(client)
    results = [reload]
    listed, models = _answer("GET /v1/models", client.get("/v1/models"))
    results.append(listed)
    served = {model["name"]: model for model in (models or {}).get("models", [])}
    if good["name"] not in served and kind != "card missing":
        results.append(Result("serves on", "violation", f"{good['name']} is no longer served"))
    names = {good["name"], *(ref["name"] for ref in body.get("loaded", []))}
    for name in sorted(names & set(served)):
        one, model = _answer(f"GET /v1/models/{name}", client.get(f"/v1/models/{name}"))
        results.append(one)
        if one.outcome == "ok":
            results += run_episode(client, model, rng)[0]
    results.append(step_episode(client, episode, good, rng))  # pinned to the good version
    results.append(_answer("readyz", client.get("/readyz"), (200, 503))[0])
    return results


def _runtime(check: str, call: Callable[[], Any]) -> tuple[Result, Any]:
    """A runtime loader: a value, or one of the project's user errors in one line."""
    try:
        return Result(check, "ok", ""), call()
    except USER_ERRORS as error:
        text = str(error).strip()
        if not text or "\n" in text:
            return Result(check, "violation", f"not one line: {text!r:.300}"), None
        return Result(check, "refused", text[:300]), None
    except Exception as error:
        detail = f"traceback: {type(error).__name__}: {error}"
        return Result(check, "violation", " ".join(detail.split())[:400]), None


def check_runtime(folder: Path, rng: np.random.Generator, send: Callable[..., None]) -> None:
    """`read_card`, `Policy.load` and `CostCritic.load` on the folder as the CLI loads it."""
    send("start", "read_card")
    result, card = _runtime("read_card", lambda: read_card(folder))
    send("result", result)
    send("start", "Policy.load")
    result, policy = _runtime("Policy.load", lambda: Policy.load(folder))
    if policy is not None:
        low, high = policy.action_bounds
        mean, log_std = policy.predict(policy.empty_windows())
        if not (np.isfinite(mean).all() and np.isfinite(log_std).all()):
            result = Result("Policy.load", "violation", "loaded, non-finite for an empty window")
        windows = policy.empty_windows()  # other inputs may give NaN: the service answers 422
        windows["states"] = rng.normal(size=windows["states"].shape).astype(np.float32)
        mean, log_std = policy.predict(windows)
        mean, log_std = np.nan_to_num(mean), np.nan_to_num(log_std)
        for deterministic in (True, False):
            action = sample_action(
                mean[0], log_std[0], np.random.default_rng(0), low, high, deterministic
            )
            problem = _action_problem(action.tolist(), low.tolist(), high.tolist())
            if problem and result.outcome == "ok":
                result = Result("Policy.load", "violation", f"sample_action: {problem}")
    send("result", result)
    if os.path.lexists(folder / COST_CRITIC_FILE) and card is not None:
        send("start", "CostCritic.load")
        dims = (card.observation_dim, card.action_dim)
        send("result", _runtime("CostCritic.load", lambda: CostCritic.load(folder, *dims))[0])


# ---------------------------------------------------------------- cases


def _case_child(index: int, seed: int, work: Path, paths: tuple[Path, Path, Path], sender: Any):
    """One case, in a forked child: every message goes to the parent as soon as it is known."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    logging.disable(logging.CRITICAL)

    def send(what: str, value: Any) -> None:
        sender.send((what, value))

    source, critic_source, other = paths
    rng = np.random.default_rng([seed, index, 1])
    try:
        models = work / "models"
        models.mkdir(parents=True)
        kind, folder = prepare(index, models, source, critic_source)
        settings = Settings(_env_file=None, models_dir=models, redis_url=None)
        settings = settings.model_copy(update={"api_tokens": frozenset()})
        send("start", "service")
        with TestClient(create_app(settings), raise_server_exceptions=False) as client:
            _, good = _answer("good", client.get(f"/v1/models/{read_card(folder).name}"))
            results, episode = run_episode(client, good, rng)
            if episode is None or any(r.outcome != "ok" for r in results):
                send("result", Result("good model", "violation", f"{results}"))
                return
            send("variant", corrupt(seed, index, kind, folder, other))
            for result in check_service(client, good, episode, rng, kind):
                send("result", result)
        check_runtime(folder, rng, send)
    except Exception:
        send("result", Result("fuzzer", "violation", traceback.format_exc()[-600:]))
    finally:
        send("done", None)


def run_case(
    seed: int,
    index: int,
    folder: Path,
    paths: tuple[Path, Path, Path],
    seconds: float = CASE_SECONDS,
) -> Case:
    """Case `index` of `seed` in a forked child under `folder/case<index>`: a crash or a hang is
    a violation of the check running then."""
    work = folder / f"case{index}"
    kind = KINDS[index % len(KINDS)]
    receiver, sender = multiprocessing.Pipe(duplex=False)
    arguments = (index, seed, work, paths, sender)
    child = multiprocessing.get_context("fork").Process(target=_case_child, args=arguments)
    child.start()
    sender.close()
    results: list[Result] = []
    variant, running, deadline = "", "setup", time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not receiver.poll(left):
            child.kill()
            results.append(Result(running, "violation", f"hang: no answer within {seconds:g} s"))
            break
        try:
            what, value = receiver.recv()
        except EOFError:
            child.join(5)
            results.append(Result(running, "violation", f"crashed (exit code {child.exitcode})"))
            break
        if what == "done":
            break
        if what == "variant":
            variant = value
        elif what == "start":
            running = value
        else:
            results.append(value)
    child.join(5)
    return Case(index, kind, variant, results)


# ---------------------------------------------------------------- report


def format_summary(cases: list[Case], seed: int, source: Path) -> str:
    """Outcomes per corruption kind (reload, runtime) and every violation with a reproducer."""
    lines = [f"fuzz_models: seed {seed}, {len(cases)} cases, source {source}", ""]
    header = f"{'corruption kind':<30}{'cases':>6}{'loaded':>8}{'refused':>9}{'removed':>9}"
    lines.append(header + f"{'policy ok':>11}{'policy refused':>16}{'violations':>12}")
    for kind in KINDS:
        chosen = [case for case in cases if case.kind == kind]
        if not chosen:
            continue
        reload = Counter(r.outcome for c in chosen for r in c.results if r.check == "reload")
        policy = Counter(r.outcome for c in chosen for r in c.results if r.check == "Policy.load")
        bad = sum(any(r.outcome == "violation" for r in case.results) for case in chosen)
        counts = f"{len(chosen):>6}{reload['ok']:>8}{reload['refused']:>9}{reload['removed']:>9}"
        lines.append(f"{kind:<30}{counts}{policy['ok']:>11}{policy['refused']:>16}{bad:>12}")
    lines += violation_lines(
        cases,
        lambda case: (
            f"CDT_LEDGER=off python bench/fuzz_models.py --seed {seed} "
            f"--case {case.index} --source {source} --keep /tmp/fuzz-models"
        ),
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="seed of every corruption")
    parser.add_argument("--cases", type=int, default=len(KINDS) * 5, help="cases to run")
    parser.add_argument("--case", type=int, help="run only this case (a reproducer)")
    parser.add_argument("--source", type=Path, default=Path("models/cdt-carrun-cpu"))
    parser.add_argument(
        "--critic-source",
        type=Path,
        default=Path("models/cdt-carcircle"),
        help="the folder whose cost critic the critic corruptions corrupt",
    )
    parser.add_argument(
        "--other",
        type=Path,
        default=Path("models/cdt-dronecircle"),
        help="a model of other dims: its graphs replace the source's in `other model` cases",
    )
    parser.add_argument("--keep", type=Path, help="copy each case's models folder here")
    args = parser.parse_args(argv)
    os.environ["CDT_LEDGER"] = "off"
    paths = (args.source.resolve(), args.critic_source.resolve(), args.other.resolve())
    indices = [args.case] if args.case is not None else list(range(args.cases))
    cases = []
    with tempfile.TemporaryDirectory(prefix="fuzz-models-") as folder:
        for index in indices:
            cases.append(run_case(args.seed, index, Path(folder), paths))
            if args.keep is not None:
                kept = args.keep / f"case{index}"
                shutil.rmtree(kept, ignore_errors=True)
                shutil.copytree(Path(folder) / f"case{index}", kept, symlinks=True)
            _chmod_back(Path(folder) / f"case{index}")
    print(format_summary(cases, args.seed, args.source))
    return 1 if any(r.outcome == "violation" for c in cases for r in c.results) else 0


def _chmod_back(folder: Path) -> None:
    """Make unreadable files readable again, so the temporary folder can be removed."""
    for path in folder.rglob("*"):
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)


if __name__ == "__main__":
    raise SystemExit(main())
