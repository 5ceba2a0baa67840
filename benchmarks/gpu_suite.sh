#!/usr/bin/env bash
# The GPU measurements of the project in one call, for a machine with one CUDA device (nothing else depends on one):
# the card and software, the mixed-precision smoke run of every algorithm family, and batched clients
# (client_parallelism) against sequential clients for the 2NN and the CNN at 100 and 1 000 clients, fp32 and bf16.
# Each step has its own time limit, so a slow step costs only itself; every log goes to the folder given (default
# gpu_logs/), and the tables are printed last.
#
#     bash benchmarks/gpu_suite.sh [log folder]
set -uo pipefail
cd "$(dirname "$0")/.."
logs="${1:-gpu_logs}"
mkdir -p "$logs"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" WANDB_MODE=offline
python3=${PYTHON:-python3}

{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
    "$python3" -c "import torch, lightning; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'lightning', lightning.__version__, torch.cuda.get_device_name(0))"
    nproc
} > "$logs/machine.txt" 2>&1

step() {  # step <seconds> <log name> <command...>
    local limit=$1 name=$2
    shift 2
    local start=$SECONDS
    timeout "$limit" "$@" > "$logs/$name.txt" 2>&1
    echo "exit $? after $((SECONDS - start)) s" >> "$logs/$name.txt"
}

step 80 smoke "$python3" benchmarks/gpu_smoke.py --precision bf16-mixed --rounds 2
for precision in 32-true bf16-mixed; do
    for model in 2nn cnn; do
        step 110 "batched_${model}_${precision}" "$python3" benchmarks/batched.py --device cuda \
            --precision "$precision" --models "$model" --clients 100 1000 --parallelism auto --repeats 3
    done
done

cat "$logs/machine.txt"
for log in "$logs"/smoke.txt "$logs"/batched_*.txt; do
    echo "== $log"
    grep -E '^\||x$|exit|max \||s/round|Error|error' "$log" | tail -40
done
