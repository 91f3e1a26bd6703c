#!/usr/bin/env bash
# The accelerator check: everything the project claims about CUDA, in one run of at most ~8.5 minutes (GPU_CHECK_BUDGET).
#
#   bash benchmarks/gpu_check.sh [STAGE ...]        # default: every stage, in the order below
#
# Stages (each writes benchmarks/results/gpu_<stage>.json, or records why it could not):
#   tests     the tests marked `gpu` (fused attention, capture, interventions, decoding, bf16 training vs the CPU)
#   train     the Multi30k config for a fixed step count in fp32 and in bf16 autocast: loss curves agree
#             (benchmarks/gpu_train_check.py states the tolerance)
#   capture   capture vs plain forward at base size (d=512, 6+6 layers) for B x L in 1x512, 32x64, 32x512,
#             beside the peers (bench_core.py)
#   decode    beam 5, 64 sentences x 64 steps at base size, beside Hugging Face's generate (bench_decode.py), and
#             where one search's host and device time go (gpu_decode_profile.txt/.json)
#   ddp       DDP over NCCL on the copy task, only where torch sees two or more devices
#   trainbench  the trainer step at base size beside the peers, compiled ones included (bench_train.py --compile)
# A summary of every stage (exit status, seconds) goes to benchmarks/results/gpu_check.json; with $OUT set (the
# device tool's output folder) every result file is copied there too.
#
# It installs nothing: it runs on the machine's python (PYTHON=..., else .venv/bin/python when present, else
# python3), with the repository on PYTHONPATH. That python needs torch with CUDA, pytest, sentencepiece, sacrebleu,
# safetensors, pandas and (for the Hugging Face peers) transformers — what `make test TORCH=torch` installs, or
# what an accelerator image carries. A machine that has only the repository (no ../shared beside it) reads the
# shared benchmarks and data from a git-ignored copy at .gpu_shared/ (bench/ and data/multi30k/), when present.
#
# Budget: GPU_CHECK_BUDGET seconds in all (default 500); a stage starts only when its minimum fits in what is
# left, and runs under the smaller of its own limit and what is left, so one slow stage cannot eat the others.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RESULTS=benchmarks/results
mkdir -p "$RESULTS"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
if [ ! -d ../shared ] && [ -d .gpu_shared ]; then
    ln -s "$ROOT/.gpu_shared" ../shared
fi
export WORKBENCH_DATA=${WORKBENCH_DATA:-$ROOT/../shared/data}

BUDGET=${GPU_CHECK_BUDGET:-500}
START=$(date +%s)
SUMMARY=$(mktemp)

left() { echo $((BUDGET - ($(date +%s) - START))); }

# stage NAME MIN_SECONDS MAX_SECONDS COMMAND...: run it under a time limit, record its status
stage() {
    local name=$1 min=$2 max=$3; shift 3
    local remaining limit t0 rc
    remaining=$(left)
    if [ "$remaining" -lt "$min" ]; then
        echo "=== $name: skipped, ${remaining}s left of the budget (needs ${min}s)"
        echo "{\"stage\": \"$name\", \"status\": \"skipped: budget\", \"seconds\": 0}" >>"$SUMMARY"
        return
    fi
    limit=$((max < remaining ? max : remaining))
    echo "=== $name (limit ${limit}s): $*"
    t0=$(date +%s)
    timeout --kill-after=10 "$limit" "$@"
    rc=$?
    local took=$(($(date +%s) - t0))
    local status=ok
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && status="timed out after ${limit}s"
    [ $rc -ne 0 ] && [ "$status" = ok ] && status="failed (exit $rc)"
    echo "=== $name: $status in ${took}s"
    echo "{\"stage\": \"$name\", \"status\": \"$status\", \"exit\": $rc, \"seconds\": $took}" >>"$SUMMARY"
}

"$PY" - <<'EOF' || { echo "gpu_check: torch sees no CUDA device; nothing to check" >&2; exit 3; }
import sys, torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)
if not torch.cuda.is_available():
    sys.exit(1)
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"device {i}: {p.name}, {p.total_memory / 2**30:.1f} GiB, {p.multi_processor_count} SMs")
EOF
NDEV=$("$PY" -c "import torch; print(torch.cuda.device_count())")
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader

STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(tests capture decode train ddp trainbench)

for s in "${STAGES[@]}"; do
    case $s in
    tests)
        mapfile -t files < <(grep -rl "mark.gpu" tests --include='*.py')
        stage tests 30 150 "$PY" -m pytest -q -m gpu -p no:cacheprovider -o addopts="-ra --strict-markers" \
            --junitxml="$RESULTS/gpu_tests.xml" "${files[@]}"
        ;;
    train)
        stage train 60 260 "$PY" benchmarks/gpu_train_check.py --steps 800 --warmup 200 --json "$RESULTS/gpu_train_multi30k.json"
        ;;
    capture)
        stage capture 45 120 "$PY" benchmarks/bench_core.py --device cuda --config base --workload capture \
            --capture-shapes 1x512,32x64,32x512 --json "$RESULTS/gpu_capture.json"
        ;;
    decode)
        stage decode 45 120 "$PY" benchmarks/bench_decode.py --device cuda --config base \
            --json "$RESULTS/gpu_decode.json" --profile "$RESULTS/gpu_decode_profile.txt"
        ;;
    ddp)
        if [ "$NDEV" -ge 2 ]; then
            stage ddp 30 90 "$PY" -m torch.distributed.run --standalone --nproc_per_node=2 -m workbench.cli train \
                configs/copy_task.toml --fresh --device=cuda --max_steps=200 --max_minutes=0 \
                --out_dir=/tmp/workbench_gpu_check/ddp
        else
            echo "=== ddp: skipped, $NDEV CUDA device(s) (NCCL DDP needs two)"
            echo "{\"stage\": \"ddp\", \"status\": \"skipped: $NDEV device(s)\", \"seconds\": 0}" >>"$SUMMARY"
        fi
        ;;
    trainbench)
        # GPU_CHECK_COMPILE=0 leaves the compiled variants out (compiling the trainer and two peers takes minutes)
        stage trainbench 60 300 "$PY" benchmarks/bench_train.py --config base \
            $([ "${GPU_CHECK_COMPILE:-1}" = 1 ] && echo --compile) --json "$RESULTS/gpu_train_base.json"
        ;;
    *)
        echo "gpu_check: unknown stage '$s' (tests, train, capture, decode, ddp, trainbench)" >&2
        exit 2
        ;;
    esac
done

"$PY" - "$SUMMARY" "$RESULTS/gpu_check.json" "$NDEV" "$(($(date +%s) - START))" <<'EOF'
import json, sys, torch, datetime
rows = [json.loads(line) for line in open(sys.argv[1])]
out = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(0),
       "devices": int(sys.argv[3]), "torch": torch.__version__, "seconds": int(sys.argv[4]), "stages": rows}
open(sys.argv[2], "w").write(json.dumps(out, indent=1) + "\n")
for r in rows:
    print(f"{r['stage']:>10}: {r['status']} ({r['seconds']} s)")
EOF
if [ -n "${OUT:-}" ]; then
    cp "$RESULTS"/gpu_*.json "$RESULTS"/gpu_*.txt "$RESULTS"/gpu_tests.xml "$OUT"/ 2>/dev/null
fi
! grep -q '"status": "\(failed\|timed out\)' "$SUMMARY"
