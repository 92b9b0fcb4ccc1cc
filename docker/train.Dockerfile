# syntax=docker/dockerfile:1
# Training image: the `[train]` extra (torch CPU, gymnasium, bullet-safety-gym, h5py, matplotlib,
# onnx, onnxruntime for `cdt select` / `cdt evaluate`) and the `cdt` command as entry point, run
# as a non-root user. Only runtime/ and training/ are copied: training never imports service/ or
# clients/ (tests/test_import_rules.py), so `cdt serve` lives in the serving image. Build from
# the repo root:
#   docker build -f docker/train.Dockerfile -t cdt-train .
#   docker run --rm -v "$PWD/runs:/workspace/runs" -v "$PWD/models:/workspace/models" \
#       cdt-train train --help
# torch comes from the PyTorch CPU wheel index (no CUDA libraries); override TORCH_INDEX_URL to
# use a mirror or a local wheel index, and keep TORCH_VERSION equal to the pin in pyproject.toml.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# a compiler, in case pybullet has no wheel for this platform (build stage only)
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md cdt_cli.py ./
COPY runtime/ runtime/
COPY training/ training/
# torch==2.13.0 in the extra is already met by the CPU wheel (2.13.0+cpu)
RUN /opt/venv/bin/pip install ".[train]"

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MPLBACKEND=Agg \
    HOME=/workspace
RUN groupadd --system --gid 10001 cdt \
    && useradd --system --uid 10001 --gid cdt --home-dir /workspace --shell /usr/sbin/nologin cdt \
    && mkdir -p /workspace/runs /workspace/models \
    && chown -R 10001:10001 /workspace
COPY --from=build /opt/venv /opt/venv
WORKDIR /workspace
COPY --chown=10001:10001 datasets/ /workspace/datasets/
VOLUME ["/workspace/runs", "/workspace/models"]
USER 10001:10001
ENTRYPOINT ["cdt"]
CMD ["--help"]
