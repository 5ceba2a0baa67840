#!/usr/bin/env bash
# The GPU measurements of the project, for a machine with one CUDA device (nothing else depends on one):
#   smoke    the card and software, and the mixed-precision smoke run of every algorithm family (about 1 min);
#   batched  batched clients (client_parallelism) against sequential clients for the 2NN and the CNN at 100 and
#            1 000 clients, fp32 and bf16 (about 7 min);
#   speed    the cross-silo speed workload (10 clients x 6 000 Fashion-MNIST images, LeNet-5, batch 32) three ways:
#            lightning_fed, a plain PyTorch loop and a Lightning Trainer per client (about 4 min);
#   foundation  LoRA on a frozen base (needs the llm extra): peak GPU memory of one round against a plain loop at
#            Qwen2.5-0.5B's shape; batched adapters against sequential at 16 and 64 clients (small LLaMA shape) and
#            FlowerTune's shape (Qwen2.5-0.5B's, LoRA r 32, 10 clients, 2 a round) (about 6 min);
#   vs_pfl   pfl-research's CIFAR-10 configuration, the full 1 500 rounds, in pfl's simulator, lightning_fed and
#            lightning_fed with batched clients (needs `pip install pfl`; not run yet: the time limit is a guess).
# Each step has its own time limit, so a slow step costs only itself; every log goes to the folder given (default
# gpu_logs/), and the tables are printed last. Name steps to run only those (a device that allows 10 minutes per
# call takes `smoke batched`, then `speed`, then `foundation`; `vs_pfl` needs a machine that allows an hour):
#
#     bash benchmarks/gpu_suite.sh [log folder] [smoke] [batched] [speed] [foundation] [vs_pfl]
set -uo pipefail
cd "$(dirname "$0")/.."
logs="${1:-gpu_logs}"
shift $(($# > 0 ? 1 : 0))
steps="${*:-smoke batched speed foundation}"
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

if [[ " $steps " == *" smoke "* ]]; then
    step 80 smoke "$python3" benchmarks/gpu_smoke.py --precision bf16-mixed --rounds 2
fi
if [[ " $steps " == *" batched "* ]]; then
    for precision in 32-true bf16-mixed; do
        for model in 2nn cnn; do
            step 110 "batched_${model}_${precision}" "$python3" benchmarks/batched.py --device cuda \
                --precision "$precision" --models "$model" --clients 100 1000 --parallelism auto --repeats 3
        done
    done
fi
if [[ " $steps " == *" speed "* ]]; then
    step 300 speed_cross_silo "$python3" benchmarks/speed.py --device cuda --samples-per-client 0 \
        --batch-sizes 32 --rounds 3 --repeats 3
fi

if [[ " $steps " == *" foundation "* ]]; then
    step 150 foundation_memory "$python3" benchmarks/foundation_memory.py --shape qwen2.5-0.5b --device cuda
    step 150 foundation_batched "$python3" benchmarks/batched_adapters.py --device cuda --clients 16 64
    step 150 foundation_flowertune "$python3" benchmarks/batched_adapters.py --device cuda --shape qwen2.5-0.5b \
        --lora-r 32 --clients 10 --clients-per-round 2
fi

if [[ " $steps " == *" vs_pfl "* ]]; then
    step 3600 vs_pfl "$python3" benchmarks/vs_pfl.py --device cuda --rounds 1500 --repeats 1 --parallelism auto
fi

cat "$logs/machine.txt"
for log in "$logs"/smoke.txt "$logs"/batched_*.txt "$logs"/speed_*.txt "$logs"/foundation_*.txt "$logs"/vs_pfl.txt; do
    [[ -f "$log" ]] || continue
    echo "== $log"
    grep -E '^\||x$|exit|max \||s/round|peak|Error|error' "$log" | tail -40
done
