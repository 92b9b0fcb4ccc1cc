"""Fuzz the clients against a hostile or broken policy server (`bench/hostile_server.py`).

    .venv/bin/python bench/fuzz_clients.py --seed 0 --cases 300
    .venv/bin/python bench/fuzz_clients.py --seed 0 --case 17   # one case again (a reproducer)

Each case draws, with `--seed`, one misbehaviour and one client path: a `PolicyClient` or
`AsyncPolicyClient` call (REST), a `StreamClient` call (websocket), or a three-episode
`cdt rollout` (`clients.rollout.main`, on a tiny toy env: `tests/runtime/toy_env.py`) whose Nth
request meets the misbehaviour. The server answers with wrong or truncated JSON, missing, extra
or mistyped fields, NaN/Infinity/huge/wrong-length/out-of-bounds actions, error bodies without
the `{code, detail, field}` shape, unknown status codes, 5xx storms, odd `Retry-After` values
(negative, huge, garbage, HTTP dates), redirects and redirect loops, dripped, cut, undecodable,
huge or endless bodies, garbage status lines, closes without answer, or no answer at all; on the
websocket, garbage text and binary frames, replies of the wrong type or for another episode,
odd error frames, closes with odd codes, aborts, silence and refused handshakes.

The invariants, per case: the call returns valid data (an action finite, of the card's length and
within its bounds) or raises a documented `PolicyClientError` subclass whose message is one clear
line; it ends within its configured timeouts (each case has a hard limit, `case_limit`); it sends
at most `1 + retries` attempts; `cdt rollout` never shows a traceback, reports each episode in
one line (finished or failed), keeps the episodes that finished, and its env never receives a bad
action. Prints the outcomes per misbehaviour kind, then each violation with its reproducer. Exit
status 1 when an invariant was broken.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import logging
import math
import random
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere in the repo
import bench.hostile_server as hostile
from bench.hostile_server import CARD, HostileServer
from bench.hostile_wire import KINDS, WS_KINDS, draw_frames, draw_script
from clients import rollout
from clients.client import AsyncPolicyClient, PolicyClient, PolicyClientError
from clients.retry import RetryPolicy
from clients.stream import connect_stream
from service.schemas import ModelPublic, StepResponse
from tests.runtime.toy_env import ToyEnv

TIMEOUT = 0.4
"""The clients' timeout (connect, read, write; a websocket's open and reply timeouts)."""
RETRY = RetryPolicy(retries=2, max_wait_s=0.3, backoff_s=0.02)
ATTEMPTS = 1 + RETRY.retries
CASE_LIMIT = ATTEMPTS * (3 * TIMEOUT + RETRY.max_wait_s) + 2.0
"""Seconds one call may take at most: every attempt at its timeouts, every wait, some slack."""
ROLLOUT_EPISODES = 3
SURFACES = ("rest", "ws", "rollout")
REST_CALLS = ("list_models", "create", "step", "step_unnumbered", "budget", "get", "close",
              "readyz", "reload")  # fmt: skip
WS_CALLS = ("start", "step", "step_unnumbered", "budget", "end")
STEP_CALLS = frozenset({"create", "step", "step_unnumbered", "start"})


@dataclass
class Result:
    kind: str
    outcome: str
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0


def action_problem(action: list[float]) -> str | None:
    """Why `action` must not reach the caller (None: it may)."""
    if len(action) != CARD["action_dim"]:
        return f"action of length {len(action)}"
    for value, low, high in zip(action, CARD["action_low"], CARD["action_high"], strict=True):
        if not math.isfinite(value) or not low - 1e-6 <= value <= high + 1e-6:
            return f"action {action} (bounds [-1, 1])"
    return None


def value_problem(value: Any, expected: type | None, call: str) -> str | None:
    """Why a call's return value must not reach the caller (None: it may)."""
    if expected is not None and not isinstance(value, expected):
        return f"returned {type(value).__name__}, not {expected.__name__}"
    episode = getattr(value, "episode_id", None)
    if call not in ("create", "start") and episode not in (None, "ep-1"):
        return f"returned an answer about episode {episode!r}, not 'ep-1'"
    if isinstance(value, StepResponse):
        problem = action_problem(value.action)
        return f"returned the {problem} silently" if problem else None
    return None


def error_problem(error: BaseException) -> str | None:
    """Why `error` is not a documented, clear client error (None: it is)."""
    if not isinstance(error, PolicyClientError):
        return f"untyped {type(error).__name__}: {str(error)[:200]!r}"
    text = str(error)
    if "\n" in text or "\r" in text or len(text) > 1000:
        return f"{type(error).__name__} message is not one line ({len(text)} chars)"
    if not error.detail.strip():
        return f"{type(error).__name__} without detail: {text!r}"
    return None


def _rest_call(name: str, client: Any) -> tuple[Any, type | None]:
    """The coroutine or value of REST call `name`, and the type it must return."""
    observation = [0.1, 0.2, 0.3]
    calls: dict[str, tuple[Callable[[], Any], type | None]] = {
        "list_models": (lambda: client.list_models(), list),
        "create": (lambda: client.create_episode("toy", 10.0, 5.0, observation), StepResponse),
        "step": (lambda: client.step("ep-1", observation, 1.0, 0.0, step=3), StepResponse),
        "step_unnumbered": (lambda: client.step("ep-1", observation, 1.0, 0.0), StepResponse),
        "budget": (lambda: client.update_budget("ep-1", cost_limit=4.0), None),
        "get": (lambda: client.get_episode("ep-1"), None),
        "close": (lambda: client.close_episode("ep-1"), None),
        "readyz": (lambda: client.readyz(), None),
        "reload": (lambda: client.reload_models(), None),
    }
    build, expected = calls[name]
    return build(), expected


def run_rest(server: HostileServer, call: str, use_async: bool) -> tuple[Any, type | None]:
    if not use_async:
        with PolicyClient(server.http_url, timeout=TIMEOUT, retry=RETRY) as client:
            if call in STEP_CALLS:
                client.list_models()  # the client learns the card (a valid answer)
                server.requests.clear()
            return _rest_call(call, client)

    async def run() -> tuple[Any, type | None]:
        async with AsyncPolicyClient(server.http_url, timeout=TIMEOUT, retry=RETRY) as client:
            if call in STEP_CALLS:
                await client.list_models()
                server.requests.clear()
            coroutine, expected = _rest_call(call, client)
            return await coroutine, expected

    return asyncio.run(run())


def run_ws(server: HostileServer, call: str, url: str) -> tuple[Any, type | None]:
    observation = [0.1, 0.2, 0.3]
    card = ModelPublic.model_validate(CARD)

    async def run() -> tuple[Any, type | None]:
        async with connect_stream(
            url, open_timeout=TIMEOUT, reply_timeout=TIMEOUT, retry=RETRY, cards=[card]
        ) as stream:
            if call == "start":
                return await stream.start("toy", 10.0, 5.0, observation), StepResponse
            if call == "step":
                return await stream.step("ep-1", observation, 1.0, 0.0, step=2), StepResponse
            if call == "step_unnumbered":
                return await stream.step("ep-1", observation, 1.0, 0.0), StepResponse
            if call == "budget":
                return await stream.update_budget("ep-1", cost_limit=4.0), None
            return await stream.end("ep-1"), None

    return asyncio.run(run())


class ThreadOutput(io.TextIOBase):
    """`sys.stdout`/`sys.stderr` while fuzzing: what a rollout thread writes goes to its own
    buffer (`contextlib.redirect_stdout` is process-wide: a hung case would steal the output)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.buffers: dict[int, io.StringIO] = {}

    def write(self, text: str) -> int:
        buffer = self.buffers.get(threading.get_ident())
        return (buffer if buffer is not None else self.real).write(text)

    def flush(self) -> None:
        self.real.flush()

    def isatty(self) -> bool:
        return False


class FuzzEnv(ToyEnv):
    """The toy env with the gymnasium attributes `cdt rollout` reads; checks every action."""

    bad_actions: list[str] = []  # noqa: RUF012  (shared on purpose: any env's bad action counts)

    def __init__(self) -> None:
        super().__init__(observation_dim=3, action_dim=2, length=6)
        self.observation_space = type("Box", (), {"shape": (3,)})()
        self.spec = type("Spec", (), {"max_episode_steps": 6})()

    def step(self, action: Any) -> Any:
        problem = action_problem([float(value) for value in action])
        if problem:
            FuzzEnv.bad_actions.append(problem)
        return super().step(action)


def run_rollout(server: HostileServer) -> tuple[int | str, str, str]:
    """`cdt rollout` against the server: its exit status, stdout and stderr."""

    def fast_client(server_url: str, **options: Any) -> PolicyClient:
        return PolicyClient(server_url, token=options.get("token"), timeout=TIMEOUT, retry=RETRY)

    argv = ["--server", server.http_url, "--model", "toy", "--episodes", str(ROLLOUT_EPISODES)]
    argv += ["--cost-schedule", "0:10,3:5"]
    out, err = io.StringIO(), io.StringIO()
    thread = threading.get_ident()
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch("runtime.sim.make_env", lambda task: FuzzEnv()))
        stack.enter_context(mock.patch("runtime.sim.check_task", lambda task: None))
        stack.enter_context(mock.patch("runtime.sim.seed_simulator", lambda seed: None))
        stack.enter_context(mock.patch.object(rollout, "PolicyClient", fast_client))
        for stream, buffer in ((sys.stdout, out), (sys.stderr, err)):
            if isinstance(stream, ThreadOutput):
                stream.buffers[thread] = buffer
                stack.callback(stream.buffers.pop, thread, None)
        try:
            rollout.main(argv)
            status: int | str = 0
        except SystemExit as exit_:
            status = exit_.code if isinstance(exit_.code, int) else str(exit_.code)
    return status, out.getvalue(), err.getvalue()


def rollout_problems(
    status: int | str, out: str, err: str, fault_at: int, closed: list[int]
) -> list[str]:
    """What `cdt rollout` got wrong: tracebacks, lost or unreported episodes, a bad exit."""
    problems = []
    if "Traceback" in out + err:
        problems.append("traceback: " + (out + err).strip().splitlines()[-1][:200])
    lines = out.splitlines()
    finished = [line for line in lines if line.startswith("seed ") and ": steps " in line]
    if status == 2:  # stopped before the first episode: one line on stderr
        errors = [line for line in err.splitlines() if line.startswith("cdt rollout:")]
        if len(errors) != 1:
            problems.append(f"stopped with {len(errors)} error lines")
        if any(index < fault_at for index in closed):
            problems.append("stopped, losing episodes that had finished")
        return problems
    for seed in range(ROLLOUT_EPISODES):
        count = sum(line.startswith(f"seed {seed}:") for line in lines)
        if count != 1:
            problems.append(f"episode {seed} reported in {count} lines")
    if len(finished) < sum(index < fault_at for index in closed):
        problems.append(f"kept {len(finished)} episodes, {len(closed)} had finished")
    if status not in (0, 1) or (status == 0) != (len(finished) == ROLLOUT_EPISODES):
        problems.append(f"exit status {status} with {len(finished)} episodes finished")
    if FuzzEnv.bad_actions:
        problems.append(f"the env received an {FuzzEnv.bad_actions[0]}")
    return problems


def run_case(server: HostileServer, seed: int, index: int) -> Result:
    rng = random.Random(f"{seed}:{index}")
    surface = rng.choice(SURFACES)
    use_async = rng.random() < 0.3
    kinds = WS_KINDS if surface == "ws" else KINDS
    kind = rng.choice(kinds)
    call = rng.choice(WS_CALLS if surface == "ws" else REST_CALLS)
    if kind.endswith("bad action") and surface != "rollout":
        call = rng.choice(["start", "step"] if surface == "ws" else ["create", "step"])
    url = server.ws_url
    if surface == "ws":
        frames, label = draw_frames(kind, rng)
        script = []
        if kind == "ws handshake":
            script, label = draw_script(rng.choice(KINDS), rng, "GET", call)
            url, frames = server.http_url, []
        server.arm(script, frames)
    else:
        script, label = draw_script(kind, rng, "POST", call)
        fault_at = rng.randrange(ROLLOUT_EPISODES * 9) if surface == "rollout" else 0
        primed = surface == "rest" and call in STEP_CALLS  # `run_rest` lists the models first
        server.arm([hostile.valid] * (fault_at + primed) + script)
    name = f"{surface} {kind}"
    where = (
        f"{'async ' if use_async else ''}{call}" if surface != "rollout" else f"request {fault_at}"
    )
    reproducer = f"--seed {seed} --case {index}  # {name}: {label} at {where}"
    box: dict[str, Any] = {}
    FuzzEnv.bad_actions = []

    def target() -> None:
        try:
            if surface == "rollout":
                box["rollout"] = run_rollout(server)
            elif surface == "ws":
                box["value"] = run_ws(server, call, url)
            else:
                box["value"] = run_rest(server, call, use_async)
        except BaseException as error:
            box["error"] = error

    started = time.monotonic()
    limit = CASE_LIMIT * (ROLLOUT_EPISODES + 1) if surface == "rollout" else CASE_LIMIT
    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(limit)
    elapsed = time.monotonic() - started
    result = Result(name, "", seconds=elapsed)
    if worker.is_alive():
        result.outcome = "hang"
        result.violations.append(f"no outcome after {limit:.1f} s; {reproducer}")
        return result
    attempts = len(server.requests)
    if surface == "rollout":
        closed = list(server.closed_ok)
        status, out, err = box.get("rollout", ("crash", "", repr(box.get("error"))))
        result.outcome = f"exit {status}"
        problems = rollout_problems(status, out, err, fault_at, closed)
        if "error" in box:
            problems.append(f"escaped {type(box['error']).__name__}: {box['error']}"[:300])
    else:
        problems = []
        if "error" in box:
            error = box["error"]
            result.outcome = type(error).__name__
            problem = error_problem(error)
        else:
            value, expected = box["value"]
            result.outcome = "ok"
            problem = value_problem(value, expected, call)
        problems += [problem] if problem else []
        if attempts > ATTEMPTS:
            problems.append(f"{attempts} attempts (at most {ATTEMPTS})")
        if elapsed > CASE_LIMIT:
            problems.append(f"took {elapsed:.1f} s (limit {CASE_LIMIT:.1f} s)")
    result.violations = [f"{problem}; {reproducer}" for problem in problems]
    return result


def fuzz(seed: int, cases: Iterable[int]) -> list[Result]:
    logging.getLogger("websockets").setLevel(logging.WARNING)  # `cdt rollout` logs at INFO
    server = HostileServer().start()
    real = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = ThreadOutput(real[0]), ThreadOutput(real[1])
    try:
        return [run_case(server, seed, index) for index in cases]
    finally:
        sys.stdout, sys.stderr = real
        server.stop()


def report(results: list[Result]) -> str:
    table: dict[str, Counter[str]] = defaultdict(Counter)
    slowest: dict[str, float] = defaultdict(float)
    for result in results:
        table[result.kind][result.outcome] += 1
        slowest[result.kind] = max(slowest[result.kind], result.seconds)
    lines = [f"{'kind':30} cases  max s  outcomes"]
    for kind in sorted(table):
        counts = table[kind]
        outcomes = ", ".join(f"{name} {count}" for name, count in counts.most_common())
        lines.append(f"{kind:30} {sum(counts.values()):5}  {slowest[kind]:5.1f}  {outcomes}")
    violations = [violation for result in results for violation in result.violations]
    lines.append(f"{len(results)} cases, {len(violations)} violations")
    lines += [f"VIOLATION {violation}" for violation in violations]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="seed of every case")
    parser.add_argument("--cases", type=int, default=300, help="cases to run")
    parser.add_argument("--case", type=int, help="run only this case (a reproducer)")
    parser.add_argument("--json", type=Path, help="also write the outcome counts here")
    args = parser.parse_args(argv)
    cases = range(args.case, args.case + 1) if args.case is not None else range(args.cases)
    started = time.monotonic()
    results = fuzz(args.seed, cases)
    print(report(results))
    print(f"seed {args.seed}: {len(results)} cases in {time.monotonic() - started:.0f} s")
    if args.json:
        counts = Counter(result.kind for result in results)
        args.json.write_text(json.dumps({"cases": dict(counts), "violations": [
            v for result in results for v in result.violations]}, indent=2))  # fmt: skip
    return 1 if any(result.violations for result in results) else 0


if __name__ == "__main__":
    sys.exit(main())
