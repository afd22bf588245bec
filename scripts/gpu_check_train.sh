#!/usr/bin/env bash
# LoRA SFT throughput on one GPU: Qwen2.5-7B-shaped random model, the real TRL/PEFT path, synthetic plans.
#   scripts/gpu_check_train.sh                    # 200 steps (10 warm-up), per-device batch 8, bf16, grad ckpt
#   scripts/gpu_check_train.sh --steps 100 --batch-size 16
#   scripts/gpu_check_train.sh --tiny             # CPU, 2-layer model: checks the script only
# Prints tokens/s, s/step, peak memory and MFU as JSON; also writes it to $OUT/gpu_check_train.json when $OUT is
# set (else runs/gpu_check/gpu_check_train.json). Expected H200 figures: docs/TRAINING.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
"$PY" -c 'import torch, transformers, trl, peft; print(f"torch {torch.__version__} transformers {transformers.__version__} trl {trl.__version__} peft {peft.__version__}")'
exec "$PY" scripts/gpu_check_train.py --json "${OUT:-runs/gpu_check}/gpu_check_train.json" "$@"
