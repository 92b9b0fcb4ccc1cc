#!/usr/bin/env bash
# Train on a lent GPU machine, where no simulator runs: the `paper` preset on the GPU and `cpu`
# preset runs on its CPU cores, all at once, keeping a checkpoint every few steps. Choose best.pt
# back on a machine with the simulator: `cdt select RUN_DIR` (the reported protocol).
#
#   OUT=/tmp/out SECONDS_LEFT=420 RUNS="paper-carrun cpu-ballrun" bash bench/gpu_train.sh
#   OUT=/tmp/out SECONDS_LEFT=420 RUNS= SWEEP=bench/sweeps/FILE.txt bash bench/gpu_train.sh
#
# SWEEP names a file of `cpu-budget` runs, one a line: NAME TASK DEVICE [cdt train options] (DEVICE
# cuda for the GPU, cpu for one of its cores; '#' starts a comment line). The ledger entries of
# every run come back in $OUT/ledger.jsonl.
#
# Kept checkpoints (and the step a run stopped at) are stripped of optimiser state and packed into
# $OUT/runs-*.tar (<= 15 MB each, each run's newest first, 56 MB in all).
set -u
OUT=${OUT:-/tmp/gpu-train}
LIMIT=${SECONDS_LEFT:-420}
mkdir -p "$OUT" /tmp/runs
export PYTHONUNBUFFERED=1 TQDM_MININTERVAL=30 CDT_LEDGER="$OUT/ledger.jsonl"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/environment.txt"
nproc | tee -a "$OUT/environment.txt"

train() {  # NAME DATASET ARGS...
    local name=$1 dataset=$2
    shift 2
    timeout --signal=INT "$LIMIT" python3 -m cdt_cli train --dataset "$dataset" \
        --eval-every 0 --keep-checkpoints --no-tensorboard --log-every 500 \
        --out-dir /tmp/runs --run-name "$name" "$@" >"/tmp/runs/$name.log" 2>&1
    echo "$name: exit $? $(tail -c 300 "/tmp/runs/$name.log" | tr '\r' '\n' | tail -n 1)"
}

# Datasets packed by `python bench/device_data.py pack ... --out .device-data` (carried, as the
# tracked ones exceed the upload limit) are restored first.
if compgen -G ".device-data/*.hdf5" >/dev/null; then
    python3 bench/device_data.py unpack .device-data --out datasets || exit
fi

dataset_of() {  # TASK (lower case) -> its file in datasets/
    ls datasets/*.hdf5 | grep -i "/safety$1-v0.hdf5$"
}

# RUNS picks what to train: paper-<task> on the GPU, cpu-<task> (seeds 1 2) on CPU cores; <task> is
# the lower-case name in datasets/Safety<Task>-v0.hdf5. PAPER_SEED seeds the paper runs.
# Unset RUNS trains paper-carrun; RUNS= (empty) none of these. Runs share the GPU: two go no
# faster in all than one.
RUNS=${RUNS-"paper-carrun"}
for run in $RUNS; do
    kind=${run%%-*} task=${run#*-}
    data=$(dataset_of "$task")
    if [ "$kind" = paper ]; then
        train "cdt-$task-paper" "$data" --preset paper --device cuda --bf16 --seed "${PAPER_SEED:-0}" \
            --checkpoint-every 3000 --update-steps 100000 &
    else
        for seed in 1 2; do
            train "cdt-$task-s$seed" "$data" --seed "$seed" --update-steps 8000 \
                --checkpoint-every 1000 &
        done
    fi
done
if [ -n "${SWEEP:-}" ]; then
    while read -r name task device options; do
        case "$name" in "" | "#"*) continue ;; esac
        data=$(dataset_of "$task")
        # shellcheck disable=SC2086  # the options are words of the sweep file
        train "$name" "$data" --preset cpu-budget --device "$device" --fail-fast-step 0 $options &
    done <"$SWEEP"
fi
wait

# Keep what selection and export read; drop optimiser and sampler state (resume is not needed).
python3 - "$OUT" <<'PY'
import sys, tarfile, pathlib, torch
out = pathlib.Path(sys.argv[1]); keep = ("format", "step", "model", "model_config", "stats",
    "config", "dataset", "evaluation", "best_score")
# A run stopped by the time limit ends between kept steps: keep where it stopped too.
for last in pathlib.Path("/tmp/runs").glob("*/last.pt"):
    kept = last.with_name(f"step_{torch.load(last, weights_only=True)['step']:07d}.pt")
    if not kept.exists():
        last.rename(kept)
        if last.with_suffix(".json").exists():
            last.with_suffix(".json").rename(kept.with_suffix(".json"))
# What comes back is capped at 64 MiB: each run's newest checkpoints first, taken in turn across runs.
newest_first = {}
for path in sorted(pathlib.Path("/tmp/runs").glob("*/step_*.pt"), reverse=True):
    newest_first.setdefault(path.parent, []).append(path)
files, total = [], 0
for rank in range(max(map(len, newest_first.values()), default=0)):
    for run in sorted(newest_first):
        if rank >= len(newest_first[run]):
            continue
        path = newest_first[run][rank]
        payload = torch.load(path, map_location="cpu", weights_only=True)
        torch.save({key: payload[key] for key in keep if key in payload}, path)
        if total + path.stat().st_size > 56e6:
            print(f"left behind: {path}")
            continue
        total += path.stat().st_size
        files += [path, path.with_suffix(".json")]
files += sorted(pathlib.Path("/tmp/runs").glob("*/train.csv"))
files += sorted(pathlib.Path("/tmp/runs").glob("*.log"))
part, size, tar = 0, 0, None
for path in files:
    if tar is None or size + path.stat().st_size > 15e6:
        if tar is not None:
            tar.close()
        tar = tarfile.open(out / f"runs-{part}.tar", "w"); part += 1; size = 0
    tar.add(path, arcname=str(path.relative_to("/tmp/runs"))); size += path.stat().st_size
if tar is not None:
    tar.close()
print(f"{len(files)} files in {part} tar(s)")
PY
ls -la "$OUT"
