#!/usr/bin/env bash
# The GPU half of the rehearsal, one command, under 10 minutes (7B-shape SFT step rate and MFU, one GRPO step, a
# 2-process accelerate launch), one JSON:
#   bash scripts/gpu_check_train.sh --rehearsal            (on CPU, to check the script: --rehearsal --tiny)
# LoRA SFT throughput on one GPU (usage: scripts/gpu_check_train.py's docstring, e.g. --sweep or --tiny): prints
# tokens/s, s/step, peak memory and MFU as JSON (the sweep: a markdown table); also writes the JSON to
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
