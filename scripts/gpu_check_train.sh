#!/usr/bin/env bash
# LoRA SFT throughput on one GPU: Qwen2.5-7B-shaped random model, the real TRL/PEFT path, synthetic plans.
#   scripts/gpu_check_train.sh                    # 200 steps (10 warm-up), per-device batch 8, bf16, grad ckpt
#   scripts/gpu_check_train.sh --config configs/qwen2.5-7b_lora_80gb.yaml    # that config's settings
#   scripts/gpu_check_train.sh --batch-size 32 --no-gradient-checkpointing --liger --packing
#   scripts/gpu_check_train.sh --sweep            # batch x checkpointing x kernels x packing: one table, ~10 min
#   scripts/gpu_check_train.sh --tiny             # CPU, 2-layer model: checks the script only
# Prints tokens/s, s/step, peak memory and MFU as JSON (the sweep: a markdown table); also writes the JSON to
# $OUT/gpu_check_train.json when $OUT is set (else runs/gpu_check/gpu_check_train.json). A GPU machine without a
# package index: see docs/TRAINING.md ("GPU machine set-up"). Measured H200 figures: docs/TRAINING.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
"$PY" -c 'import torch, transformers, trl, peft; print(f"torch {torch.__version__} transformers {transformers.__version__} trl {trl.__version__} peft {peft.__version__}")'
"$PY" -c 'import importlib.util as u; print("flash-attn", "yes" if u.find_spec("flash_attn") else "no", "| liger-kernel", "yes" if u.find_spec("liger_kernel") else "no")'
exec "$PY" scripts/gpu_check_train.py --json "${OUT:-runs/gpu_check}/gpu_check_train.json" "$@"
