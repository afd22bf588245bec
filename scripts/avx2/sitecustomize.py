"""Makes an AVX-512 machine behave like an AVX2 one for benchmarks (scripts/avx2/env.sh puts this folder first
on PYTHONPATH). torch honours ATEN_CPU_CAPABILITY for its own kernels, but vLLM picks its compiled CPU kernels
by `torch.cpu._is_avx512_supported()`, which reads the CPU itself; here those probes answer as an AVX2 CPU would,
so vLLM loads its AVX2 build. Never used by the project's own code or tests."""

import importlib.abc
import importlib.machinery
import os
import sys

_PROBES = ("_is_avx512_supported", "_is_avx512_vnni_supported", "_is_avx512_bf16_supported",
           "_is_amx_tile_supported", "_is_amx_fp16_supported")


def _patch(module) -> None:
    for name in _PROBES:
        if hasattr(module, name):
            setattr(module, name, lambda: False)


class _AfterTorchCpu(importlib.abc.MetaPathFinder):
    """Patches `torch.cpu` as soon as it is imported (importing torch here would slow every process)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch.cpu":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def patched(module):
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = patched
        return spec


if os.environ.get("ATEN_CPU_CAPABILITY", "").lower() == "avx2":
    sys.meta_path.insert(0, _AfterTorchCpu())
