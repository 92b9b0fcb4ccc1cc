"""Per-step serving latency and throughput, next to the raw onnxruntime call for the same model.

    python bench/serve_latency.py                     # synthetic CDT-sized graph (needs `onnx`)
    python bench/serve_latency.py --model-dir models/cdt-carrun-paper

Starts the service as `cdt serve` runs it (`bench/local_server.py`: its HTTP and websocket guards
included) on 127.0.0.1 in a subprocess, drives it over websocket (`websockets`) and REST (a
minimal keep-alive HTTP/1.1 client, so the load generator's own CPU use stays small on a 2-core
machine) at 1 and 64 concurrent episodes, and prints p50/p99 per-step latency and steps/s.
Every loop is bounded; the server is stopped at the end. The load generator shares the cores
with the server: figures are end-to-end.

It also measures the transport floor: the same websocket client against `echo_app`, a bare ASGI
echo under plain uvicorn, so no model and no service code. Echo p50 + raw p50 is the least a
served step can cost here, and the report prints it next to the 2.5x goal (issue 13).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import numpy as np
import onnx  # the synthetic graph needs it (the [train] extra, in [dev])
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere in the repo

from bench.local_server import running_server
from runtime.context import EpisodeContext, stack_windows
from runtime.policy import Policy
from service.config import Settings
from service.episodes import EpisodeService
from service.inference import Inference
from service.metrics import Metrics
from service.repository import ModelRepository
from service.schemas import EpisodeCreate, StepRequest, StepResponse
from service.stores.memory import InMemorySessionStore

Sample = tuple[list[float], float]  # per-step latencies (s), elapsed wall time (s)
Measurement = tuple[str, int, Callable[[], Sample]]  # (path, concurrent episodes, job)
Run = Callable[[str, Any, int, int], Coroutine[Any, Any, Sample]]  # (url, card, episodes, steps)
PERM = [0, 2, 1, 3]  # [B, T, heads, d] <-> [B, heads, T, d]
RAW = "raw onnxruntime call"
IN_PROCESS = "service.step, in process"
ECHO = "websocket echo (no model)"
CONCURRENT = 64
IN_MEMORY = "websocket (default)"
SCALE_OUT = "websocket (2 workers + Redis)"
ECHO_APP = "bench.serve_latency:echo_app"


class GraphBuilder:
    """Appends onnx nodes and random weights; every method returns its output's name."""

    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self.rng = np.random.default_rng(0)

    def constant(self, name: str, value: Any, dtype: Any = np.int64) -> str:
        """An initializer holding `value`."""
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def weight(self, name: str, *shape: int) -> str:
        """A random float32 initializer."""
        return self.constant(name, self.rng.normal(0.0, 0.05, shape), np.float32)

    def op(
        self, op_type: str, inputs: list[str], output: str, attributes: dict[str, Any] | None = None
    ) -> str:
        """One node; `attributes` as onnx.helper.make_node takes them."""
        self.nodes.append(helper.make_node(op_type, inputs, [output], **(attributes or {})))
        return output

    def linear(self, x: str, name: str, fan_in: int, fan_out: int) -> str:
        """x @ W, no bias."""
        return self.op("MatMul", [x, self.weight(f"{name}_w", fan_in, fan_out)], name)

    def layer_norm(self, x: str, name: str, width: int) -> str:
        """LayerNormalization over the last axis (unit scale, zero bias)."""
        scale = self.constant(f"{name}_g", np.ones(width), np.float32)
        bias = self.constant(f"{name}_b", np.zeros(width), np.float32)
        return self.op("LayerNormalization", [x, scale, bias], name, {"axis": -1})

    def heads(self, x: str, name: str, shape: str) -> str:
        """[B, T, width] -> [B, heads, T, width / heads]."""
        split = self.op("Reshape", [x, shape], f"{name}_split")
        return self.op("Transpose", [split], f"{name}_heads", {"perm": PERM})

    def block(self, x: str, i: int, width: int, heads: int, bias: str) -> str:
        """Pre-norm transformer block: causal multi-head attention, then a 4x MLP."""
        tokens_shape = self.constant(f"split{i}", [0, -1, heads, width // heads])
        h = self.layer_norm(x, f"ln1_{i}", width)
        q, k, v = (
            self.heads(self.linear(h, f"{n}{i}", width, width), f"{n}{i}", tokens_shape)
            for n in "qkv"
        )
        k_t = self.op("Transpose", [k], f"kt{i}", {"perm": [0, 1, 3, 2]})
        scores = self.op("MatMul", [q, k_t], f"qk{i}")  # [B, heads, T, T]
        scale = self.constant(f"scale{i}", 1.0 / np.sqrt(width // heads), np.float32)
        scores = self.op("Add", [self.op("Mul", [scores, scale], f"qks{i}"), bias], f"qkb{i}")
        attention = self.op("Softmax", [scores], f"att{i}", {"axis": -1})
        mixed = self.op(
            "Transpose", [self.op("MatMul", [attention, v], f"av{i}")], f"avt{i}", {"perm": PERM}
        )
        merge = self.constant(f"merge{i}", [0, -1, width])
        mixed = self.op("Reshape", [mixed, merge], f"avm{i}")  # [B, T, width]
        x = self.op("Add", [x, self.linear(mixed, f"o{i}", width, width)], f"x1_{i}")
        hidden = self.linear(self.layer_norm(x, f"ln2_{i}", width), f"m1_{i}", width, 4 * width)
        hidden = self.op("Relu", [hidden], f"relu{i}")
        return self.op("Add", [x, self.linear(hidden, f"m2_{i}", 4 * width, width)], f"x2_{i}")


def embed_tokens(g: GraphBuilder, dims: tuple[int, int], k: int, width: int) -> str:
    """(return+cost, state, action) tokens per step with a time embedding: [B, 3K, width]."""
    observation_dim, action_dim = dims
    steps = g.op("Min", ["time_steps", g.constant("last_step", 999)], "clamped_steps")
    time = g.op("Gather", [g.weight("time_table", 1000, width), steps], "time")
    axis = g.constant("last_axis", [-1])
    columns = [g.op("Unsqueeze", [n, axis], f"{n}_1") for n in ("returns_to_go", "costs_to_go")]
    budgets = g.op("Concat", columns, "rc", {"axis": -1})  # [B, K, 2]
    parts = [
        g.op("Add", [g.linear(budgets, "rc_emb", 2, width), time], "rc_tok"),
        g.op("Add", [g.linear("states", "s_emb", observation_dim, width), time], "s_tok"),
        g.op("Add", [g.linear("actions", "a_emb", action_dim, width), time], "a_tok"),
    ]
    stacked = g.op("Concat", parts, "stacked", {"axis": 2})  # [B, K, 3 * width]
    return g.op("Reshape", [stacked, g.constant("seq", [0, 3 * k, width])], "tokens")


def attention_bias(g: GraphBuilder, k: int) -> str:
    """Causal plus key-padding additive bias, [B, 1, 3K, 3K]."""
    mask = g.op("Unsqueeze", ["padding_mask", g.constant("ax2", [2])], "mask3")  # [B, K, 1]
    mask = g.op("Expand", [mask, g.constant("three", [1, 1, 3])], "mask_tokens")  # [B, K, 3]
    mask = g.op("Reshape", [mask, g.constant("flat", [0, 3 * k])], "mask_flat")  # [B, 3K]
    mask = g.op("Cast", [mask], "mask_float", {"to": TensorProto.FLOAT})
    padding = g.op("Mul", [mask, g.constant("minus_inf", -1e9, np.float32)], "pad_bias")
    padding = g.op("Unsqueeze", [padding, g.constant("ax12", [1, 2])], "pad_bias4")
    causal = g.constant("causal", np.triu(np.full((3 * k, 3 * k), -1e9), 1), np.float32)
    return g.op("Add", [padding, causal], "bias")


def build_cdt_graph(directory: Path, observation_dim: int = 7, action_dim: int = 2) -> Path:
    """A CDT-sized policy (K=10, 3 tokens per step, 3 layers, 8 heads, width 128) + its card."""
    k, width, layers, g = 10, 128, 3, GraphBuilder()
    x = embed_tokens(g, (observation_dim, action_dim), k, width)
    bias = attention_bias(g, k)
    for i in range(layers):
        x = g.block(x, i, width, heads=8, bias=bias)
    newest = g.constant("newest_state", 3 * (k - 1) + 1)  # the state token of step K - 1
    h = g.op("Gather", [g.layer_norm(x, "ln_f", width), newest], "h", {"axis": 1})  # [B, width]
    g.op("Tanh", [g.linear(h, "mean", width, action_dim)], "action_mean")
    low, high = g.constant("low", -5.0, np.float32), g.constant("high", 2.0, np.float32)
    g.op("Clip", [g.linear(h, "std", width, action_dim), low, high], "action_log_std")
    float_, shapes = TensorProto.FLOAT, {"states": [k, observation_dim], "actions": [k, action_dim]}
    types = {"time_steps": TensorProto.INT64, "padding_mask": TensorProto.BOOL}
    names = ("states", "actions", "returns_to_go", "costs_to_go", "time_steps", "padding_mask")
    inputs = [
        helper.make_tensor_value_info(n, types.get(n, float_), ["B", *shapes.get(n, [k])])
        for n in names
    ]
    outputs = [
        helper.make_tensor_value_info(n, float_, ["B", action_dim])
        for n in ("action_mean", "action_log_std")
    ]
    graph = helper.make_graph(g.nodes, "cdt_bench", inputs, outputs, g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    directory.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(directory / "model.onnx"))
    bounds = {"action_low": [-1.0] * action_dim, "action_high": [1.0] * action_dim}
    card = {"name": "bench", "version": "1", "task": "SafetyCarRun-v0", "context_len": k}
    card |= {"observation_dim": observation_dim, "action_dim": action_dim, "max_episode_len": 1000}
    (directory / "model.json").write_text(json.dumps(card | bounds))
    return directory


def measure_raw(policy: Policy, calls: int, threads: int) -> Sample:
    """Single-window forward passes from `threads` threads: per-call latencies, elapsed s."""
    card = policy.card
    k, dim, act = card.context_len, card.observation_dim, card.action_dim
    context = EpisodeContext.start(np.zeros(dim), 100.0, 10.0, context_len=k, action_dim=act)
    for t in range(k):  # a full window, no padding
        context.advance(1.0, 0.1, np.full(dim, 0.01 * t))
    windows = stack_windows([context])  # [1, K, ...] per input
    latencies: list[float] = []

    def worker() -> None:
        for _ in range(calls // threads):
            started = time.perf_counter()
            policy.predict(windows)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return latencies, time.perf_counter() - started


def measure_in_process(models_dir: Path, card: Any, steps: int) -> Sample:
    """`EpisodeService.step` awaited directly (in memory): the serving logic without network or
    threads."""
    repository = ModelRepository(models_dir)
    repository.reload()
    store = InMemorySessionStore(ttl_s=600.0, max_episodes=10)
    settings, metrics = Settings.model_construct(), Metrics()
    inference = Inference(store, metrics, settings)
    service = EpisodeService(repository, store, metrics, settings, inference=inference)

    async def episode() -> Sample:
        request = EpisodeCreate.model_validate(start_body(card, 0))
        started = await service.start(request, reply=StepResponse)
        latencies: list[float] = []
        began = time.perf_counter()
        for t in range(1, steps + 1):
            request = StepRequest.model_validate(step_body(card, t))
            sent = time.perf_counter()
            await service.step(started.episode_id, request, reply=StepResponse)
            latencies.append(time.perf_counter() - sent)
        return latencies, time.perf_counter() - began

    try:
        return asyncio.run(episode())
    finally:
        inference.close()


async def echo_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A bare ASGI websocket echo (and a `/readyz`): the transport floor, nothing else."""
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
    elif scope["type"] == "websocket":
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        while (message := await receive())["type"] == "websocket.receive":
            await send({"type": "websocket.send", "text": message.get("text")})


def start_body(card: Any, seed: int) -> dict[str, Any]:
    """A `start` request for `card`'s model."""
    body = {"model": card.name, "target_reward": 100.0, "target_cost": 10.0, "seed": seed}
    return body | {"observation": [0.0] * card.observation_dim}


def step_body(card: Any, t: int) -> dict[str, Any]:
    """A `step` request at step `t`."""
    return {"observation": [0.01 * t] * card.observation_dim, "reward": 1, "cost": 0.1, "step": t}


async def drive(episodes: int, episode: Callable[[int, list[float]], Awaitable[None]]) -> Sample:
    """Run `episodes` concurrent episodes; returns per-step latencies and elapsed seconds."""
    latencies: list[float] = []
    started = time.perf_counter()
    await asyncio.gather(*(episode(seed, latencies) for seed in range(episodes)))
    return latencies, time.perf_counter() - started


async def timed_steps(
    ws: Any, card: Any, episode_id: str, steps: int, reply_type: str, latencies: list[float]
) -> None:
    """Send `steps` step frames; latency = frame sent -> reply (of `reply_type`) received."""
    for t in range(1, steps + 1):
        frame = json.dumps({"type": "step", "episode_id": episode_id, **step_body(card, t)})
        sent = time.perf_counter()
        await ws.send(frame)
        reply = json.loads(await ws.recv())
        latencies.append(time.perf_counter() - sent)
        assert reply["type"] == reply_type, reply


async def websocket_episodes(url: str, card: Any, episodes: int, steps: int) -> Sample:
    """One socket per episode; latency = step frame sent -> action frame received."""
    from websockets.asyncio.client import connect

    async def episode(seed: int, latencies: list[float]) -> None:
        async with connect(url.replace("http", "ws") + "/v1/stream", compression=None) as ws:
            await ws.send(json.dumps({"type": "start", **start_body(card, seed)}))
            episode_id = json.loads(await ws.recv())["episode_id"]
            await timed_steps(ws, card, episode_id, steps, "action", latencies)

    return await drive(episodes, episode)


async def websocket_echoes(url: str, card: Any, episodes: int, steps: int) -> Sample:
    """The websocket loop of `websocket_episodes` against `echo_app`: a step frame and back."""
    from websockets.asyncio.client import connect

    async def episode(seed: int, latencies: list[float]) -> None:
        async with connect(url.replace("http", "ws") + "/v1/stream", compression=None) as ws:
            await timed_steps(ws, card, "e" * 32, steps, "step", latencies)

    return await drive(episodes, episode)


async def http_call(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str, body: dict[str, Any]
) -> dict[str, Any]:
    """POST JSON over a kept-alive HTTP/1.1 connection and read the JSON answer."""
    payload = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
    writer.write(f"{head}Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    header = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
    length = int(header.split("content-length:")[1].split("\r\n")[0])
    answer: dict[str, Any] = json.loads(await reader.readexactly(length))
    if not header.startswith(("http/1.1 200", "http/1.1 201")):
        raise RuntimeError(f"{path}: {answer}")
    return answer


async def rest_episodes(url: str, card: Any, episodes: int, steps: int) -> Sample:
    """One keep-alive connection per episode; latency = request written -> answer read."""
    host, port = url.removeprefix("http://").split(":")

    async def episode(seed: int, latencies: list[float]) -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        started = await http_call(reader, writer, "/v1/episodes", start_body(card, seed))
        path = f"/v1/episodes/{started['episode_id']}/step"
        for t in range(1, steps + 1):
            sent = time.perf_counter()
            await http_call(reader, writer, path, step_body(card, t))
            latencies.append(time.perf_counter() - sent)
        writer.close()
        await writer.wait_closed()

    return await drive(episodes, episode)


def report(rows: dict[tuple[str, int], Sample]) -> None:
    """Print p50/p99 latency and steps/s per path, and the ratios the issue sets goals for."""
    print(f"{'path':<32} {'episodes':>8} {'p50 ms':>8} {'p99 ms':>8} {'steps/s':>9}")
    for (name, episodes), (latencies, seconds) in rows.items():
        p50, p99 = np.percentile(latencies, [50, 99]) * 1e3
        rate = len(latencies) / seconds
        print(f"{name:<32} {episodes:>8} {p50:>8.3f} {p99:>8.3f} {rate:>9.0f}")
    raw_p50 = np.percentile(rows[(RAW, 1)][0], 50)
    raw_rates = {n: len(lat) / sec for (name, n), (lat, sec) in rows.items() if name == RAW}
    floor = raw_p50 + np.percentile(rows[(ECHO, 1)][0], 50)
    print(f"floor: echo p50 + raw p50 = {floor * 1e3:.3f} ms = {floor / raw_p50:.2f}x the raw call")
    for (name, episodes), (latencies, seconds) in rows.items():
        if name.startswith("websocket") and name != ECHO and episodes == 1:
            ratio = np.percentile(latencies, 50) / raw_p50
            print(f"goal <= 2.5x: {name} p50 at 1 episode = {ratio:.2f}x the raw call")
        if episodes == CONCURRENT and name == SCALE_OUT:
            in_memory = rows[(IN_MEMORY, CONCURRENT)]
            share = len(latencies) / seconds / (len(in_memory[0]) / in_memory[1])
            print(f"goal >= 75%: {name} at {episodes} episodes = {share:.0%} of in-memory")
        elif episodes == CONCURRENT:  # the server's event loop runs its forward passes on one core
            shares = [len(latencies) / seconds / raw_rates[threads] for threads in (1, 2)]
            print(f"goal >= 75%: {name} at {episodes} episodes = {shares[0]:.0%} of raw steps/s "
                  f"on 1 thread, {shares[1]:.0%} on 2")  # fmt: skip


def as_job(run: Run, url: str, card: Any, episodes: int, steps: int) -> Callable[[], Sample]:
    """A blocking job that runs a fresh `run(...)` coroutine each time it is called."""
    return lambda: asyncio.run(run(url, card, episodes, steps))


def plan_server(url: str, card: Any, label: str, steps: tuple[int, int]) -> list[Measurement]:
    """The websocket and REST measurements of one server, at 1 and 64 episodes."""
    plan: list[Measurement] = []
    for name, run in (("websocket", websocket_episodes), ("REST", rest_episodes)):
        for episodes, count in ((1, steps[0]), (CONCURRENT, steps[1])):
            plan.append((f"{name} ({label})", episodes, as_job(run, url, card, episodes, count)))
    return plan


def run_plan(plan: list[Measurement], rounds: int) -> dict[tuple[str, int], Sample]:
    """Run every measurement once to warm up, then `rounds` times interleaved (load drifts)."""
    for _, _, job in plan:
        job()
    tally: dict[tuple[str, int], Sample] = {(name, n): ([], 0.0) for name, n, _ in plan}
    for _ in range(rounds):
        for name, episodes, job in plan:
            latencies, seconds = job()
            total = tally[(name, episodes)]
            tally[(name, episodes)] = (total[0] + latencies, total[1] + seconds)
    return tally


def main(argv: list[str] | None = None) -> None:
    """Measure raw onnxruntime and the served model over websocket and REST, interleaved."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, help="an exported model (default: synthetic)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--steps", type=int, default=100, help="steps per round, 1 episode")
    parser.add_argument("--steps-concurrent", type=int, default=50, help="steps per episode at 64")
    parser.add_argument("--raw-calls", type=int, default=300, help="raw calls per round")
    parser.add_argument(
        "--redis-url",
        default="redis://127.0.0.1:6379/0",
        help="Redis for the 2-workers row ('' skips it)",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as servers:
        model_dir = args.model_dir or build_cdt_graph(Path(scratch) / "models" / "bench")
        models_dir, policy = model_dir.parent, Policy.load(model_dir)  # the server serves them all
        card = policy.card
        print(f"model {card.name} {card.version}: K={card.context_len}, {os.cpu_count()} cores")
        plan: list[Measurement] = [
            (RAW, 1, functools.partial(measure_raw, policy, args.raw_calls, 1)),
            (RAW, 2, functools.partial(measure_raw, policy, args.raw_calls, 2)),
            (IN_PROCESS, 1, functools.partial(measure_in_process, models_dir, card, args.steps)),
        ]
        steps = (args.steps, args.steps_concurrent)
        echo_url = servers.enter_context(running_server(models_dir, app=ECHO_APP))
        plan.append((ECHO, 1, as_job(websocket_echoes, echo_url, card, 1, args.steps)))
        url = servers.enter_context(running_server(models_dir))
        plan += plan_server(url, card, "default", steps)
        if args.redis_url:
            url = servers.enter_context(running_server(models_dir, redis_url=args.redis_url))
            job = as_job(websocket_episodes, url, card, CONCURRENT, args.steps_concurrent)
            plan.append((SCALE_OUT, CONCURRENT, job))
        report(run_plan(plan, args.rounds))


if __name__ == "__main__":
    main()
