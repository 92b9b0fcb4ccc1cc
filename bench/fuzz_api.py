"""Fuzzing the API from outside: seeded random and adversarial requests to every route.

    python bench/fuzz_api.py --seed 1 --cases 3000

Starts `cdt serve` (in-memory store, the shipped `models/`, a free port of 127.0.0.1; or uses
`--server URL`) and sends `--cases` requests, drawn with `--seed`, to every REST route and over
the websocket: malformed JSON, wrong types, missing and extra fields, NaN, Infinity, 1e308, -0.0,
huge integers, wrong observation lengths, nested junk, long and odd unicode strings, odd episode
ids, steps out of order and repeated, budget changes to odd values, binary and garbage websocket
frames, wrong content types and bodies over the size limit. Each answer is checked against the
service's contract (docs/serving.md):

- no 5xx but the documented 503s; every 4xx and 5xx body is the `{code, detail, field}` error
  shape with a documented code and a readable detail; websocket error frames likewise, and a
  socket is only ever closed with a documented close code (1000, 1001, 1008, 1009);
- every answer comes within `--timeout` seconds, and `GET /livez` answers 200 throughout;
- a valid episode stepped meanwhile (a thread of its own, with invalid requests on its id between
  its steps, which must change nothing) ends with the numbers it was sent, and replayed on a
  fresh episode afterwards gets the same actions;
- the server it started logged no traceback and no ERROR line.

Prints the cases per route with their status counts, then each violation with a reproducer (the
request as a Python call). Figures only, no timing. Exit status 1 when an invariant was broken.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import sys
import tempfile
import threading
import urllib.parse
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere in the repo

import httpx
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from bench.api_fuzz_values import (
    Raw,
    encode,
    junk_value,
    mutate_object,
    odd_episode_id,
    odd_header_value,
    odd_number,
    odd_step_index,
    odd_string,
)
from bench.local_server import running_server
from runtime.arguments import positive_int

ROOT = Path(__file__).resolve().parents[1]
ERROR_CODES = frozenset(
    {
        "unauthorized", "forbidden", "model_not_found", "episode_not_found", "not_found",
        "method_not_allowed", "request_timeout", "step_out_of_order", "step_conflict",
        "episode_busy", "episode_gone", "revision_mismatch", "deadline_passed",
        "payload_too_large", "validation_error", "invalid_input", "non_finite_action",
        "models_refused", "too_many_episodes", "episode_quota_exceeded", "socket_episode_limit",
        "store_unavailable", "model_version_unavailable", "too_many_connections", "model_error",
        "record_format", "internal_error",
    }
)  # fmt: skip
"""The codes docs/serving.md's error table lists."""
DOCUMENTED_5XX = frozenset({"store_unavailable", "model_version_unavailable"})
"""The only 5xx answers a healthy in-memory server may give (documented 503s)."""
WS_CLOSE_CODES = frozenset({1000, 1001, 1008, 1009})
MAX_BODY_BYTES = 262_144
JSON = {"content-type": "application/json"}
CONTROL_MODEL = "cdt-carrun-cpu"


@dataclass(frozen=True)
class Request:
    """One REST case, as sent."""

    route: str
    """The route template it exercises, e.g. `POST /v1/episodes/{id}/step`."""
    method: str
    path: str
    content: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    note: str = ""

    def sent_headers(self) -> dict[str, str]:
        """The headers sent: JSON's content type for a body, unless the case names another."""
        json_body = {"content-type": "application/json"} if self.content is not None else {}
        return json_body | self.headers

    def reproducer(self, url: str) -> str:
        content = self.content
        shown = repr(content) if content is None or len(content) <= 400 else _long(content)
        return (
            f"httpx.request({self.method!r}, {url + self.path!r}, content={shown}, "
            f"headers={self.sent_headers()!r})  # {self.note}"
        )


def _long(content: bytes) -> str:
    return f"{content[:200]!r} + ... ({len(content)} bytes) ... + {content[-60:]!r}"


@dataclass
class Report:
    """What the run saw: status counts per route and the broken invariants."""

    url: str
    statuses: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    violations: list[tuple[str, str, str]] = field(default_factory=list)
    details: dict[tuple[int, str, str], str] = field(default_factory=dict)
    """One detail per (status, code, field) seen, for `--details`."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, route: str, status: str) -> None:
        with self.lock:
            self.statuses[route][status] += 1

    def note_detail(self, status: int, body: dict[str, Any]) -> None:
        key = (status, body["code"], str(body.get("field")))
        with self.lock:
            self.details.setdefault(key, body["detail"])

    def violate(self, route: str, problem: str, reproducer: str) -> None:
        with self.lock:
            self.violations.append((route, problem, reproducer))


def error_problem(status: int, body: Any) -> str | None:
    """Why an error answer's body breaks the documented shape, or None when it is fine."""
    if not isinstance(body, dict):
        return f"{status} body is not a JSON object: {str(body)[:200]!r}"
    code, detail, fld = body.get("code"), body.get("detail"), body.get("field", None)
    if not isinstance(code, str) or code not in ERROR_CODES:
        return f"{status} with undocumented code {code!r}: {str(body)[:300]}"
    if not isinstance(detail, str) or not detail.strip():
        return f"{status} {code} without a detail"
    if "Traceback" in detail or "object at 0x" in detail or len(detail) > 2100:
        return f"{status} {code} detail is not a readable message: {detail[:200]!r}"
    if fld is not None and not isinstance(fld, str):
        return f"{status} {code} field is not a string: {fld!r}"
    if status >= 500 and code not in DOCUMENTED_5XX:
        return f"{status} {code}: {detail[:300]}"
    return None


def check_answer(report: Report, request: Request, response: httpx.Response) -> None:
    """Count one REST answer and check it against the contract."""
    status = response.status_code
    report.count(request.route, str(status))
    repro = request.reproducer(report.url)
    if status >= 500 and status != 503:
        report.violate(request.route, f"{status}: {response.text[:300]}", repro)
    if status == 405 and not response.headers.get("allow"):
        report.violate(request.route, "405 without the methods allowed (Allow)", repro)
    if status < 400 or request.method == "HEAD":
        return
    try:
        body = response.json()
    except ValueError:
        report.violate(request.route, f"{status} body is not JSON: {response.text[:200]!r}", repro)
        return
    problem = error_problem(status, body)
    if problem is not None:
        report.violate(request.route, problem, repro)
    else:
        report.note_detail(status, body)


# ---- the valid episode run alongside ----------------------------------------------------------


@dataclass
class Lap:
    """One control episode: what it was sent and what it was answered."""

    start: dict[str, Any]
    sent: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    actions: list[list[float]] = field(default_factory=list)


class Control:
    """Steps valid episodes over REST in a thread of its own, pokes each with invalid requests
    between steps (which must change nothing), and checks its numbers; `replay` reruns them."""

    def __init__(self, url: str, report: Report, seed: int, obs_dim: int, timeout: float) -> None:
        self.client = httpx.Client(base_url=url, timeout=timeout)
        self.report = report
        self.rng = random.Random(seed + 7919)
        self.obs_dim = obs_dim
        self.laps: list[Lap] = []
        self.stop = threading.Event()
        self.steps = 0

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.lap(steps=60)
        except Exception as error:  # a broken invariant ends the control run, reported
            self.report.violate("control", f"control episode failed: {error!r}", "")
        finally:
            self.client.close()

    def observation(self) -> list[float]:
        return [round(self.rng.uniform(-2, 2), 3) for _ in range(self.obs_dim)]

    def lap(self, steps: int) -> None:
        start = {
            "model": CONTROL_MODEL, "target_reward": 300.0, "target_cost": 20.0,
            "observation": self.observation(), "seed": self.rng.randrange(2**32),
        }  # fmt: skip
        lap = Lap(start)
        self.laps.append(lap)
        answer = self.expect(201, "POST", "/v1/episodes", start)
        episode, lap.actions = answer["episode_id"], [answer["action"]]
        reward = cost = 0.0
        target_cost, revision = 20.0, answer["revision"]
        for index in range(1, steps + 1):
            if self.stop.is_set() and index > 3:
                break
            self.poke(episode, index, revision)
            if index % 17 == 0:
                target_cost = self.rng.choice([5.0, 12.5, 40.0])
                body = {"cost_limit": target_cost}
                lap.sent.append(("budget", body))
                revision = self.expect(200, "PATCH", f"/v1/episodes/{episode}/budget", body)[
                    "revision"
                ]
            step = {
                "observation": self.observation(), "reward": round(self.rng.uniform(0, 3), 3),
                "cost": self.rng.choice([0.0, 0.0, 1.0]), "step": index,
            }  # fmt: skip
            lap.sent.append(("step", step))
            answer = self.expect(200, "POST", f"/v1/episodes/{episode}/step", step)
            reward += step["reward"]
            cost += step["cost"]
            lap.actions.append(answer["action"])
            revision = answer["revision"]
            self.steps += 1
            if answer["step"] != index or not all(map(math.isfinite, answer["action"])):
                raise AssertionError(f"step {index} answered {answer}")
            if not math.isclose(answer["remaining_cost"], max(target_cost - cost, 0.0)):
                raise AssertionError(f"remaining_cost {answer['remaining_cost']} at {cost}")
        state = self.expect(200, "GET", f"/v1/episodes/{episode}", None)
        summary = self.expect(200, "DELETE", f"/v1/episodes/{episode}", None)
        for name, value in (("total_reward", reward), ("total_cost", cost)):
            if not math.isclose(state[name], value, rel_tol=1e-9, abs_tol=1e-9):
                raise AssertionError(f"{name} {state[name]} != {value} sent")
            if not math.isclose(summary[name], value, rel_tol=1e-9, abs_tol=1e-9):
                raise AssertionError(f"summary {name} {summary[name]} != {value} sent")

    def poke(self, episode: str, index: int, revision: int) -> None:
        """Requests on the episode that must fail, then a read that must show it unchanged."""
        path = f"/v1/episodes/{episode}"
        good = {"observation": self.observation(), "reward": 1.0, "cost": 0.0, "step": index}
        bad = self.rng.choice(
            [
                ("POST", "/step", {**good, "observation": good["observation"][:-1]}),
                ("POST", "/step", {**good, "step": index + 1 + self.rng.randrange(5)}),
                ("POST", "/step", {**good, "step": index - 2}),
                ("POST", "/step", {**good, "cost": -1.0}),
                ("POST", "/step", {**good, "reward": Raw("NaN")}),
                ("POST", "/step", {**good, "extra": 1}),
                ("PATCH", "/budget", {"cost_limit": -3.0}),
                ("PATCH", "/budget", {"cost_limit": 1e308}),
                ("PATCH", "/budget", {"cost_limit": 5, "remaining_cost": 5}),
                ("PATCH", "/budget", {}),
            ]
        )
        method, suffix, body = bad
        response = self.client.request(method, path + suffix, content=encode(body), headers=JSON)
        request = Request(f"control {method} {suffix}", method, path + suffix, encode(body))
        check_answer(self.report, request, response)
        if not 400 <= response.status_code < 500:
            self.report.violate(request.route, "an invalid change was not refused", repr(body))
        state = self.expect(200, "GET", path, None)
        if state["revision"] != revision or state["step"] != index - 1:
            raise AssertionError(f"a refused change changed the episode: {state}")

    def expect(self, status: int, method: str, path: str, body: Any) -> dict[str, Any]:
        content = None if body is None else encode(body)
        response = self.client.request(method, path, content=content, headers=JSON)
        if response.status_code != status:
            raise AssertionError(
                f"{method} {path} answered {response.status_code}: {response.text}"
            )
        answer: dict[str, Any] = response.json()
        return answer

    def replay(self, url: str, timeout: float) -> int:
        """Rerun every finished lap on fresh episodes; returns the actions that differed."""
        differed = 0
        with httpx.Client(base_url=url, timeout=timeout) as client:
            for lap in self.laps:
                actions = [
                    client.post("/v1/episodes", content=encode(lap.start), headers=JSON).json()
                ]
                episode = actions[0]["episode_id"]
                for kind, body in lap.sent:
                    if kind == "budget":
                        client.patch(
                            f"/v1/episodes/{episode}/budget", content=encode(body), headers=JSON
                        )
                    else:
                        path = f"/v1/episodes/{episode}/step"
                        actions.append(client.post(path, content=encode(body), headers=JSON).json())
                client.delete(f"/v1/episodes/{episode}")
                replayed = [answer["action"] for answer in actions]
                differed += sum(a != b for a, b in zip(replayed, lap.actions, strict=False))
        return differed


# ---- the fuzz cases ---------------------------------------------------------------------------


class Fuzzer:
    """Draws and sends the cases; keeps a few episodes of its own to aim steps and budgets at."""

    def __init__(self, url: str, report: Report, seed: int, timeout: float) -> None:
        self.url = url
        self.report = report
        self.rng = random.Random(seed)
        self.timeout = timeout
        self.client = httpx.Client(base_url=url, timeout=timeout)
        models = self.client.get("/v1/models").json()["models"]
        self.models = {model["name"]: model for model in models}
        self.episodes: list[tuple[str, str, int]] = []  # (id, model, step)
        self.socket: ClientConnection | None = None
        self.sockets = contextlib.ExitStack()
        self.ws_episodes: list[str] = []

    def close(self) -> None:
        self.client.close()
        with contextlib.suppress(Exception):
            self.sockets.close()

    # -- valid bodies, then broken ones

    def start_body(self, name: str | None = None) -> dict[str, Any]:
        name = name or self.rng.choice(sorted(self.models))
        model = self.models[name]
        body: dict[str, Any] = {
            "model": name,
            "target_reward": self.rng.choice([0.0, 100.0, 500.0]),
            "target_cost": self.rng.choice([0.0, 5.0, 20.0, 80.0]),
            "observation": [self.rng.uniform(-1, 1) for _ in range(model["observation_dim"])],
        }
        for key, value in (("seed", 7), ("deterministic", True), ("budget_guard", False)):
            if self.rng.random() < 0.3:
                body[key] = value
        if self.rng.random() < 0.2:
            body["cut_floor"] = self.rng.choice([0.0, 3.0, 10.0])
        return body

    def step_body(self, model: str, step: int) -> dict[str, Any]:
        dim = self.models[model]["observation_dim"]
        return {
            "observation": [self.rng.uniform(-3, 3) for _ in range(dim)],
            "reward": self.rng.uniform(-1, 2),
            "cost": self.rng.choice([0.0, 0.5, 1.0]),
            "step": step,
        }

    def budget_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        pick = self.rng.random()
        if pick < 0.5:
            body[self.rng.choice(["cost_limit", "remaining_cost"])] = self.rng.choice(
                [0.0, -0.0, 1.0, 10.0, 1e9, 1e-300]
            )
        if pick > 0.3:
            body[self.rng.choice(["target_reward", "remaining_reward"])] = self.rng.choice(
                [0.0, -1e9, 1e9, 5.5]
            )
        return body

    def broken(self, body: dict[str, Any]) -> tuple[Any, str]:
        """`body` mutated at random (or left valid one time in eight)."""
        if self.rng.random() < 0.125:
            return body, "valid"
        return mutate_object(self.rng, body)

    def episode(self) -> tuple[str, str, int]:
        """One of the fuzzer's own episodes, started when it has too few."""
        if len(self.episodes) < 4:
            body = self.start_body()
            answer = self.client.post("/v1/episodes", json=body)
            if answer.status_code == 201:
                self.episodes.append((answer.json()["episode_id"], body["model"], 0))
        if not self.episodes:
            return odd_episode_id(self.rng), CONTROL_MODEL, 0
        return self.rng.choice(self.episodes)

    def forget(self, episode: str) -> None:
        self.episodes = [entry for entry in self.episodes if entry[0] != episode]

    def advanced(self, episode: str, step: int) -> None:
        self.episodes = [
            (eid, model, step if eid == episode else old) for eid, model, old in self.episodes
        ]

    # -- the cases

    def rest_case(self) -> Request:
        kind = self.rng.choices(
            ["create", "step", "budget", "get", "delete", "model", "plain", "raw", "method"],
            weights=[14, 22, 12, 5, 4, 4, 4, 12, 3],
        )[0]
        if kind == "create":
            body, note = self.broken(self.start_body())
            return self.with_headers(
                Request("POST /v1/episodes", "POST", "/v1/episodes", encode(body), note=note)
            )
        if kind in {"step", "budget"}:
            episode, model, step = self.episode()
            if self.rng.random() < 0.15:
                episode = odd_episode_id(self.rng)
            if kind == "step":
                body = self.step_body(
                    model,
                    self.rng.choice([step + 1, step + 1, step, odd_step_index(self.rng, step)]),
                )
                body, note = self.broken(body)
                path, method, route = (
                    f"/v1/episodes/{episode}/step",
                    "POST",
                    "POST /v1/episodes/{id}/step",
                )
            else:
                body, note = self.broken(self.budget_body())
                path, method, route = (
                    f"/v1/episodes/{episode}/budget",
                    "PATCH",
                    "PATCH /v1/episodes/{id}/budget",
                )
            return self.with_headers(Request(route, method, path, encode(body), note=note))
        if kind in {"get", "delete"}:
            episode = self.episode()[0] if self.rng.random() < 0.5 else odd_episode_id(self.rng)
            method = kind.upper()
            return Request(
                f"{method} /v1/episodes/{{id}}",
                method,
                f"/v1/episodes/{episode}",
                note=episode[:40],
            )
        if kind == "model":
            name = self.rng.choice([*self.models, odd_string(self.rng)])
            return Request(
                "GET /v1/models/{name}", "GET", f"/v1/models/{_quote(name)}", note=name[:40]
            )
        if kind == "plain":
            path = self.rng.choice(
                [
                    "/livez",
                    "/readyz",
                    "/metrics",
                    "/v1/models",
                    "/openapi.json",
                    "/docs",
                    "/v1/admin/reload",
                ]
            )
            method = "POST" if path == "/v1/admin/reload" else "GET"
            return Request(f"{method} {path}", method, path)
        if kind == "method":
            path = self.rng.choice(
                [
                    "/v1/episodes",
                    "/v1/models",
                    "/livez",
                    f"/v1/episodes/{odd_episode_id(self.rng)}",
                    "/v1/stream",
                    "/nope/" + _quote(odd_string(self.rng)),
                ]
            )
            method = self.rng.choice(
                ["PUT", "OPTIONS", "TRACE", "PATCH", "DELETE", "POST", "HEAD", "GET"]
            )
            return Request("other routes and methods", method, path)
        return self.raw_case()

    def raw_case(self) -> Request:
        """Bodies that are not JSON objects, odd content types, oversized bodies."""
        episode = self.episode()[0]
        method, path, route = self.rng.choice(
            [
                ("POST", "/v1/episodes", "POST /v1/episodes"),
                ("POST", f"/v1/episodes/{episode}/step", "POST /v1/episodes/{id}/step"),
                ("PATCH", f"/v1/episodes/{episode}/budget", "PATCH /v1/episodes/{id}/budget"),
            ]
        )
        valid = encode(self.start_body() if route == "POST /v1/episodes" else self.budget_body())
        depth = self.rng.choice([64, 1000, 20_000, 100_000])
        choices: list[tuple[str, Callable[[], bytes]]] = [
            ("truncated JSON", lambda: valid[: self.rng.randrange(1, max(2, len(valid)))]),
            ("not UTF-8", lambda: b'{"model": "\xff\xfe\xc3"}'),
            ("empty body", lambda: b""),
            ("JSON scalar", lambda: encode(junk_value(self.rng, 2))),
            (f"nested {depth} deep", lambda: b"[" * depth + b"]" * depth),
            (f"object nested {depth} deep", lambda: b'{"a":' * depth + b"1" + b"}" * depth),
            ("over the size limit", lambda: b'{"model": "' + b"x" * (MAX_BODY_BYTES + 10) + b'"}'),
            ("just under the size limit", lambda: _padded(valid, MAX_BODY_BYTES - 100)),
            ("BOM and JSON", lambda: b"\xef\xbb\xbf" + valid),
            ("duplicate keys", lambda: valid[:-1] + b', "model": 1}'),
            ("NUL bytes", lambda: valid.replace(b":", b":\x00", 1)),
        ]
        note, make = self.rng.choice(choices)
        headers = {"content-type": self.rng.choice(CONTENT_TYPES)}
        return Request(route, method, path, make(), headers, note=note)

    def with_headers(self, request: Request) -> Request:
        """The request with odd precondition or content-type headers, now and then."""
        pick = self.rng.random()
        if pick < 0.1:
            headers = {"If-Match": odd_header_value(self.rng)}
        elif pick < 0.2:
            headers = {"X-Request-Deadline": odd_header_value(self.rng, numeric=True)}
        elif pick < 0.28:
            headers = {"content-type": self.rng.choice(CONTENT_TYPES)}
        else:
            return request
        return Request(
            request.route, request.method, request.path, request.content, headers, request.note
        )

    def send(self, request: Request) -> None:
        try:
            response = self.client.request(
                request.method,
                request.path,
                content=request.content,
                headers=request.sent_headers(),
            )
        except httpx.TimeoutException:
            self.report.violate(
                request.route, f"no answer within {self.timeout} s", request.reproducer(self.url)
            )
            return
        except httpx.TransportError as error:
            if request.content is not None and len(request.content) > MAX_BODY_BYTES:
                self.report.count(request.route, "closed")  # 413 may come before the body is read
                return
            self.report.violate(
                request.route, f"connection failed: {error!r}", request.reproducer(self.url)
            )
            return
        check_answer(self.report, request, response)
        self.track(request, response)

    def track(self, request: Request, response: httpx.Response) -> None:
        """Follow the fuzzer's episodes: steps taken, episodes ended."""
        parts = request.path.split("/")
        if len(parts) < 4 or parts[2] != "episodes":
            return
        episode = parts[3]
        if response.status_code in {404, 410} or (
            request.method == "DELETE" and response.is_success
        ):
            self.forget(episode)
        elif request.method == "POST" and response.status_code == 201:
            answer = response.json()
            self.episodes.append((answer["episode_id"], answer["model"], 0))
        elif request.route.endswith("/step") and response.status_code == 200:
            self.advanced(episode, response.json()["step"])
            if response.json()["step"] > 400:
                self.forget(episode)

    # -- the websocket

    def socket_limit(self, most: int = 300) -> None:
        """Start episodes over one socket until its limit refuses one, end one of them over
        REST, and start again: a place must have freed (the limit counts live episodes)."""
        route = "WS socket limit"
        body = {"type": "start", **self.start_body(CONTROL_MODEL)}
        started: list[str] = []
        with connect(self.ws_url(), open_timeout=self.timeout) as sock:
            for _ in range(most):
                sock.send(encode(body).decode())
                answer = json.loads(sock.recv(timeout=self.timeout))
                if answer["type"] != "action":
                    break
                started.append(answer["episode_id"])
            else:
                self.report.count(route, "no limit met")
                return
            self.report.count(route, f"limit at {len(started)}")
            self.client.delete(f"/v1/episodes/{started.pop()}")
            sock.send(encode(body).decode())
            answer = json.loads(sock.recv(timeout=self.timeout))
            if answer["type"] != "action":
                problem = f"an episode ended over REST still counts: {answer.get('code')}"
                self.report.violate(route, problem, f"{len(started) + 1} starts, 1 REST DELETE")
            else:
                started.append(answer["episode_id"])
        for episode in started:
            self.client.delete(f"/v1/episodes/{episode}")

    def ws_url(self) -> str:
        return "ws" + self.url.removeprefix("http") + "/v1/stream"

    def ws_case(self) -> None:
        route = "WS /v1/stream"
        frame, note = self.ws_frame()
        repro = f"ws.send({_short(frame)})  # {note}"
        try:
            sock = self.ws()
            if isinstance(frame, str):  # lone surrogates go out as the bytes they stand for
                frame, text = frame.encode("utf-8", errors="surrogatepass"), True
            else:
                text = note == "text frame, not UTF-8"
            sock.send(frame, text=text)
            reply = sock.recv(timeout=self.timeout)
        except TimeoutError:
            self.report.violate(route, f"no reply within {self.timeout} s", repro)
            self.drop_socket()
            return
        except ConnectionClosed as closed:
            self.drop_socket()
            code = closed.rcvd.code if closed.rcvd is not None else None
            self.report.count(route, f"close {code}")
            if code not in WS_CLOSE_CODES:
                reason = closed.rcvd.reason if closed.rcvd is not None else ""
                self.report.violate(route, f"socket closed with {code} {reason!r}", repro)
            return
        self.ws_reply(reply, repro)

    def ws_reply(self, reply: str | bytes, repro: str) -> None:
        route = "WS /v1/stream"
        try:
            answer = json.loads(reply)
        except ValueError:
            self.report.violate(route, f"reply is not JSON: {_short(reply)}", repro)
            return
        kind = answer.get("type") if isinstance(answer, dict) else None
        if kind == "error":
            self.report.count(route, f"error {answer.get('status')}")
            problem = error_problem(int(answer.get("status", 0)), answer)
            if problem is not None:
                self.report.violate(route, problem, repro)
            else:
                self.report.note_detail(int(answer["status"]), answer)
        elif kind in {"action", "state", "ended"}:
            self.report.count(route, kind)
            if kind == "action" and answer["step"] == 0:
                self.ws_episodes = [*self.ws_episodes[-7:], answer["episode_id"]]
        else:
            self.report.violate(route, f"reply of unknown type: {_short(reply)}", repro)

    def ws(self) -> ClientConnection:
        if self.socket is None:
            self.socket = self.sockets.enter_context(
                connect(self.ws_url(), open_timeout=self.timeout, max_size=None)
            )
        return self.socket

    def drop_socket(self) -> None:
        if self.socket is not None:
            with contextlib.suppress(Exception):
                self.socket.close()
        self.socket = None

    def ws_frame(self) -> tuple[str | bytes, str]:
        kind = self.rng.choices(
            ["start", "step", "budget", "end", "junk"], weights=[5, 8, 4, 2, 6]
        )[0]
        episode = (
            self.rng.choice(self.ws_episodes)
            if self.ws_episodes and self.rng.random() < 0.8
            else odd_episode_id(self.rng)
        )
        if kind == "junk":
            return self.rng.choice(
                [
                    (
                        bytes(self.rng.randrange(256) for _ in range(self.rng.randrange(1, 64))),
                        "binary frame",
                    ),
                    (b'{"type": "start", "model": "\xff"}', "text frame, not UTF-8"),
                    (encode({"type": "start"})[:-1], "truncated JSON"),
                    (encode(junk_value(self.rng, 3)).decode(), "JSON junk"),
                    ("[" * 5000 + "]" * 5000, "nested 5000 deep"),
                    ("", "empty text frame"),
                    (odd_string(self.rng), "odd string"),
                    (encode({"type": odd_string(self.rng)}).decode(), "odd type"),
                    ("x" * (MAX_BODY_BYTES + 1), "over the size limit"),
                ]
            )
        name = self.rng.choice(sorted(self.models))
        body: dict[str, Any] = {"type": kind}
        if kind == "start":
            body |= self.start_body(name)
        elif kind == "step":
            body |= {"episode_id": episode, **self.step_body(name, self.rng.randrange(1, 4))}
        elif kind == "budget":
            body |= {"episode_id": episode, **self.budget_body()}
        else:
            body["episode_id"] = episode
        for key, value in (
            ("request_id", odd_string(self.rng)),
            ("revision", odd_number(self.rng)),
            ("deadline", odd_number(self.rng)),
        ):
            if self.rng.random() < 0.15:
                body[key] = value
        mutated, note = self.broken(body)
        return encode(mutated).decode(errors="surrogateescape"), f"{kind}: {note}"


CONTENT_TYPES = (
    "application/json", "text/plain", "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x", "application/json; charset=latin-1",
    "application/vnd.api+json", "", "application/xml", "json",
)  # fmt: skip


def _padded(valid: bytes, size: int) -> bytes:
    return valid[:-1] + b" " * max(0, size - len(valid)) + b"}"


def _quote(text: str) -> str:
    return urllib.parse.quote(text.encode("utf-8", errors="surrogatepass"), safe="")


def _short(frame: str | bytes) -> str:
    return repr(frame) if len(frame) <= 300 else f"{frame[:200]!r} + ... ({len(frame)} long)"


# ---- the run ----------------------------------------------------------------------------------


def fuzz(url: str, seed: int, cases: int, timeout: float = 10.0) -> tuple[Report, dict[str, int]]:
    """Run `cases` cases against the server at `url`; returns the report and control figures."""
    report = Report(url)
    fuzzer = Fuzzer(url, report, seed, timeout)
    obs_dim = fuzzer.models[CONTROL_MODEL]["observation_dim"]
    control = Control(url, report, seed, obs_dim, timeout)
    thread = threading.Thread(target=control.run, daemon=True)
    thread.start()
    try:
        fuzzer.socket_limit()
        for index in range(cases):
            if fuzzer.rng.random() < 0.3:
                fuzzer.ws_case()
            else:
                fuzzer.send(fuzzer.rest_case())
            if index % 50 == 49:
                live(report, fuzzer.client)
    finally:
        control.stop.set()
        thread.join(timeout=60)
        fuzzer.close()
    with httpx.Client(base_url=url, timeout=timeout) as client:
        live(report, client)
    finished = [lap for lap in control.laps if lap.sent]
    control.laps = finished
    differed = control.replay(url, timeout)
    if differed:
        report.violate("control", f"{differed} replayed actions differ from the run's", "")
    figures = {"control_laps": len(finished), "control_steps": control.steps, "differed": differed}
    return report, figures


def live(report: Report, client: httpx.Client) -> None:
    try:
        status = client.get("/livez").status_code
    except httpx.HTTPError as error:
        status = 0
        report.violate("GET /livez", f"no answer: {error!r}", "httpx.get(URL + '/livez')")
    if status != 200:
        report.violate("GET /livez", f"answered {status}", "httpx.get(URL + '/livez')")


def log_problems(log: Path) -> list[str]:
    """Traceback and ERROR lines of the server's log."""
    lines = log.read_text(errors="replace").splitlines()
    return [line for line in lines if "Traceback" in line or line.startswith("ERROR")]


def print_report(
    report: Report, figures: dict[str, int], seed: int, cases: int, details: bool = False
) -> None:
    print(f"seed {seed}, {cases} cases against {report.url}")
    width = max(len(route) for route in report.statuses) + 2
    print(f"{'route':<{width}}{'cases':>7}  statuses")
    for route in sorted(report.statuses):
        counts = report.statuses[route]
        shown = ", ".join(f"{status}: {n}" for status, n in sorted(counts.items()))
        print(f"{route:<{width}}{sum(counts.values()):>7}  {shown}")
    print(
        f"control: {figures['control_laps']} episodes, {figures['control_steps']} steps, "
        f"{figures['differed']} replayed actions differed"
    )
    if details:
        print("error answers by (status, code, field), one detail each:")
        for (status, code, fld), detail in sorted(report.details.items()):
            print(f"  {status} {code} {fld}: {detail[:160]}")
    print(f"violations: {len(report.violations)}")
    for route, problem, repro in report.violations[:50]:
        print(f"- {route}: {problem}\n    {repro}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="draws the cases (default 0)")
    parser.add_argument("--cases", type=positive_int, default=1000, help="requests and frames")
    parser.add_argument("--server", help="a running service (default: start `cdt serve` here)")
    parser.add_argument("--models-dir", type=Path, default=ROOT / "models")
    parser.add_argument("--timeout", type=float, default=10.0, help="longest wait for an answer")
    parser.add_argument(
        "--details", action="store_true", help="print one error detail per status, code, field"
    )
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        log = None
        if args.server is None:
            log = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "serve.log"
            url = stack.enter_context(running_server(args.models_dir, log=log))
        else:
            url = args.server.rstrip("/")
        report, figures = fuzz(url, args.seed, args.cases, args.timeout)
        if log is not None:
            for line in log_problems(log)[:20]:
                report.violate("server log", line[:300], "")
    print_report(report, figures, args.seed, args.cases, args.details)
    return 1 if report.violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
