#!/usr/bin/env bash
# Serve the student planner with vLLM: the same as `distill serve`, e.g.
#   scripts/serve_planner.sh --config configs/serve_planner.yaml --set port=8001
set -euo pipefail
command -v distill >/dev/null 2>&1 && exec distill serve "$@"
# Not on PATH (venv not activated): use the repository's own .venv.
exec "$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/distill" serve "$@"
