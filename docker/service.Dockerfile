# syntax=docker/dockerfile:1
# Serving image: the `[serve]` extra only (FastAPI, uvicorn, onnxruntime; no torch, no training/),
# run as a non-root user, with the shipped models baked in at /app/models. Mount a volume there
# to serve other models. Build from the repository root:
#   docker build -f docker/service.Dockerfile -t cdt-service .
#   docker run -p 127.0.0.1:8000:8000 -e CDT_API_TOKENS=token-a -v "$PWD/models:/app/models:ro" cdt-service
# (with no CDT_API_TOKENS the API is open to anyone who reaches the port: publish it on 127.0.0.1)
# The CMD is SERVE_COMMAND in tests/test_docker.py, which the tests also run outside docker.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/venv
COPY pyproject.toml README.md cdt_cli.py ./
COPY runtime/ runtime/
COPY service/ service/
RUN /opt/venv/bin/pip install ".[serve]"

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CDT_MODELS_DIR=/app/models
RUN groupadd --system --gid 10001 cdt \
    && useradd --system --uid 10001 --gid cdt --home-dir /app --shell /usr/sbin/nologin cdt
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY --chown=10001:10001 models/ /app/models/
VOLUME ["/app/models"]
USER 10001:10001
EXPOSE 8000
# slim images have no curl: probe /livez with the standard library
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/livez', timeout=4).status != 200)"]
# --http: uvicorn's protocol with a request-head timeout (CDT_HTTP_HEADER_TIMEOUT_S and
# CDT_HTTP_KEEP_ALIVE_S set both timeouts); --ws: a text frame that is not UTF-8 is answered as a
# bad frame, not logged as a server error; --no-access-log: no line per request, as `cdt serve`
# (one line per step floods the log; /metrics counts requests)
CMD ["uvicorn", "service.main:create_app", "--factory", \
     "--http", "service.http_guard:GuardedHTTPProtocol", \
     "--ws", "service.http_guard:GuardedWebSocketProtocol", \
     "--no-access-log", "--host", "0.0.0.0", "--port", "8000"]
