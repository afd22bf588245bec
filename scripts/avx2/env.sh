# Source this to run on an AVX-512 machine as on a 2-core AVX2 laptop without native bf16: torch, oneDNN and MKL
# capped at AVX2, vLLM's AVX2 kernel build (sitecustomize.py beside this file), and so float32 serving
# (distill picks float32 where torch is capped below AVX-512).
#   source scripts/avx2/env.sh && make test
export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
export PYTHONPATH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)${PYTHONPATH:+:$PYTHONPATH}"
