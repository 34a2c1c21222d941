#!/usr/bin/env bash
# One short GPU check (run on a machine with an NVIDIA GPU, from the repo root, with a prepared
# data/shakespeare-bpe4096): training on CUDA in bf16, fp16 + GradScaler and bf16 + compile through the
# CLI, then training throughput and MFU against Hugging Face peers at GPT-2-small size (124M).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
py=python3
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
$py -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
run() { echo "== $*"; timeout 150 "$@" 2>&1 | grep -v -E "it/s\]|Warning" | tail -6; }
common="--data data/shakespeare-bpe4096 --no-progress --set device=cuda --set eval_interval=1000 --set log_interval=50"
common="$common --set batch_size=16 --set lr=0.002 --set compile=false"  # the eager GPU runs
run $py -m lmlab.cli train --config demo --out /tmp/r_bf16 $common --set dtype=bf16 --set max_steps=300
tail -1 /tmp/r_bf16/metrics.jsonl; $py -m lmlab.cli eval /tmp/r_bf16 --json
run $py -m lmlab.cli train --config demo --out /tmp/r_fp16 $common --set dtype=fp16 --set max_steps=100
tail -1 /tmp/r_fp16/metrics.jsonl
run $py -m lmlab.cli train --config demo --out /tmp/r_comp $common --set dtype=bf16 --set compile=true --set max_steps=100
tail -1 /tmp/r_comp/metrics.jsonl
echo "== GPT-2 small (124M) shape, bf16, batch 16 x 1024: lmlab vs HF, eager and compiled"
g="--device cuda --dtype bf16 --d-model 768 --layers 12 --heads 12 --context 1024 --vocab 50304 --batch 16"
g="$g --steps 5 --rounds 3 --warmup 2 --systems lmlab,hf"
timeout 240 $py bench/train_vs_peers.py --recipe gpt2 $g --lmlab-compile --peers-compiled 2>&1 | tail -8
timeout 240 $py bench/train_vs_peers.py --recipe llama $g --lmlab-compile --peers-compiled 2>&1 | tail -8
echo "== sweep batching (issue 14 item 4): K runs as one vmapped module vs one after another"
timeout 120 $py bench/sweep_batching.py --device cuda --k 8 --shape lab --steps 10 --rounds 3 2>&1 | grep -v Warn | tail -7
timeout 120 $py bench/sweep_batching.py --device cuda --k 8 --shape demo --dtype bf16 --steps 10 --rounds 3 2>&1 \
  | grep -v Warn | tail -7
