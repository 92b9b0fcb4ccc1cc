#!/usr/bin/env bash
# Every GPU check of the training side in one call, for a lent GPU machine (no registry there).
#
#   bash bench/gpu_check.sh            # OUT=folder for results (default /tmp/gpu-check)
#
# 1. the CUDA tests (tests/training/learn/test_train_cuda.py: GPU batches, resume, bf16, export);
# 2. torchrun with one process on nccl (the DistributedDataParallel path on a GPU);
# 3. bench/train_throughput.py on the GPU, fp32 and bf16, batch 256 and 2048;
# 4. the `paper` preset on CarRun for PAPER_SECONDS of wall clock (checkpoints every 2,000 steps,
#    so a cut run keeps its last one); last.pt, its config and train.csv are copied to OUT;
# Pure-Python packages the machine lacks (tyro and its needs) travel as wheels in .whl/.
# Each stage has its own time limit and a failed stage does not stop the next.
set -u
OUT=${OUT:-/tmp/gpu-check}
PAPER_SECONDS=${PAPER_SECONDS:-210}
DATASET=datasets/SafetyCarRun-v0.hdf5
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu dry-runs the script on a machine without a GPU
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_MININTERVAL=15
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

stage() { echo "== $1 ($(date +%T))"; }

stage environment
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import torch, onnxruntime; print('torch', torch.__version__, \
'cuda', torch.version.cuda, 'onnxruntime', onnxruntime.__version__)"
} 2>&1 | tee "$OUT/environment.txt"

stage "CUDA tests"
# --noconftest: the suite's root conftest imports the service's web stack (FastAPI and what it
# pulls in), which the GPU machine lacks and these tests do not use.
timeout 120 python3 -m pytest -q -p no:cacheprovider --noconftest -o filterwarnings= -m gpu \
    tests/training/learn/test_train_cuda.py >"$OUT/gpu_tests.txt" 2>&1
tail -n 15 "$OUT/gpu_tests.txt"

stage "torchrun, 1 process"
timeout 90 python3 -m torch.distributed.run --standalone --nproc-per-node 1 -m cdt_cli train \
    --dataset "$DATASET" --preset paper --device "$DEVICE" --update-steps 50 --eval-every 0 \
    --no-tensorboard --out-dir /tmp/ddp --run-name ddp 2>&1 | tail -n 3

stage "throughput on the GPU"
timeout 200 python3 -m bench.train_throughput --device "$DEVICE" --bf16 --steps 200 --rounds 2 \
    2>&1 | tee "$OUT/throughput.txt"

stage "paper preset on CarRun for ${PAPER_SECONDS} s"
timeout --signal=INT "$PAPER_SECONDS" python3 -m cdt_cli train --dataset "$DATASET" \
    --preset paper --device "$DEVICE" --eval-every 0 --checkpoint-every 2000 --log-every 500 \
    --no-tensorboard --out-dir /tmp/paper --run-name cdt-carrun-paper >/tmp/paper.log 2>&1
tail -n 4 /tmp/paper.log | tr '\r' '\n' | tail -n 4
cp /tmp/paper/cdt-carrun-paper/last.pt /tmp/paper/cdt-carrun-paper/last.json \
    /tmp/paper/cdt-carrun-paper/train.csv "$OUT/" 2>&1
tail -n 2 "$OUT/train.csv"

stage done
