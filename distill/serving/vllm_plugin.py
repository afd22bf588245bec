"""A vLLM general plugin (entry point `vllm.general_plugins`, loaded by every vLLM process) that makes LoRA on
CPU cost about what the base model costs.

vLLM's CPU LoRA path (`vllm.lora.ops.torch_ops`, used by `PunicaWrapperCPU`) gathers a copy of an adapter's
weights for every token (`weights[indices]`) and multiplies token by token (`einsum("bi,boi->bo")`): for a
512-token prompt that is 512 weight copies per LoRA layer. The trained adapters put LoRA on every linear layer,
so a LoRA module served at about half the base model's tokens/s, and the Solver's long prompts at a quarter
(scripts/bench_serving.py). Here the same ops group the tokens by adapter and do one matmul per adapter in the
batch. Tokens of no adapter (index -1) are left as they are, as vLLM's GPU kernels leave them.

Only the CPU wrapper's names are replaced, and only where vLLM runs on CPU; DISTILL_VLLM_CPU_LORA=0 keeps
vLLM's own ops (for a comparison). The functions keep vLLM's signatures, so a vLLM whose ops changed shape
falls back to its own for any call these do not recognise.
"""

from __future__ import annotations

import os

_NAMES = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice", "sgmv_shrink", "sgmv_expand", "sgmv_expand_slice")
_original: dict = {}


def _groups(weights, indices):
    """(rows or None for all rows, [out, in] weights) for each adapter index in the batch, -1 left out."""
    import torch

    w = weights.squeeze(1) if weights.dim() == 4 else weights
    first = int(indices[0]) if indices.numel() else -1
    if indices.numel() and bool((indices == first).all()):
        return [] if first < 0 else [(None, w[first])]
    return [((indices == i).nonzero(as_tuple=True)[0], w[i]) for i in torch.unique(indices).tolist() if i >= 0]


def _rows_match(inputs, indices, output) -> bool:
    return inputs.dim() == 2 and indices.dim() == 1 and inputs.shape[0] == indices.shape[0] == output.shape[0]


def bgmv_shrink(inputs, lora_b_weights, output_tensor, lora_indices_tensor, scaling: float = 1.0):
    if not _rows_match(inputs, lora_indices_tensor, output_tensor):
        return _original["bgmv_shrink"](inputs, lora_b_weights, output_tensor, lora_indices_tensor, scaling)
    dtype = output_tensor.dtype
    for rows, w in _groups(lora_b_weights, lora_indices_tensor):
        x = inputs if rows is None else inputs[rows]
        out = (x.to(dtype) @ w.to(dtype).t()) * scaling
        if rows is None:
            output_tensor[:, : out.shape[1]] = out
        else:
            output_tensor[rows, : out.shape[1]] = out


def bgmv_expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs: bool = True):
    if not _rows_match(inputs, lora_indices_tensor, output_tensor):
        return _original["bgmv_expand"](inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs)
    dtype = output_tensor.dtype
    for rows, w in _groups(lora_b_weights, lora_indices_tensor):
        # the adapter and the model may pad their output dimension differently: the common columns only
        cols = min(w.shape[0], output_tensor.shape[1])
        x = inputs if rows is None else inputs[rows]
        out = x.to(dtype) @ w[:cols].to(dtype).t()
        target = slice(None) if rows is None else rows
        if add_inputs:
            output_tensor[target, :cols] += out
        else:
            output_tensor[target, :cols] = out


def bgmv_expand_slice(inputs, lora_b_weights, output_tensor, lora_indices_tensor, slice_offset: int,
                      slice_size: int, add_inputs: bool = True):
    if not _rows_match(inputs, lora_indices_tensor, output_tensor):
        return _original["bgmv_expand_slice"](inputs, lora_b_weights, output_tensor, lora_indices_tensor,
                                              slice_offset, slice_size, add_inputs)
    dtype = output_tensor.dtype
    for rows, w in _groups(lora_b_weights, lora_indices_tensor):
        x = inputs if rows is None else inputs[rows]
        out = x.to(dtype) @ w.to(dtype).t()
        target = slice(None) if rows is None else rows
        if add_inputs:
            output_tensor[target, slice_offset: slice_offset + slice_size] += out
        else:
            output_tensor[target, slice_offset: slice_offset + slice_size] = out


def _explode(lora_indices_tensor, seq_len_tensor):
    import torch

    return torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)


def sgmv_shrink(inputs, lora_a_weights, output_tensor, b_seq_start_loc, seq_len_tensor, lora_indices_tensor,
                batches, max_seq_length, token_nums, scaling):
    bgmv_shrink(inputs, lora_a_weights, output_tensor, _explode(lora_indices_tensor, seq_len_tensor), scaling)


def sgmv_expand(inputs, lora_b_weights, output_tensor, b_seq_start_loc, seq_len_tensor, lora_indices_tensor,
                batches, max_seq_length, token_nums, add_inputs=False):
    bgmv_expand(inputs, lora_b_weights, output_tensor, _explode(lora_indices_tensor, seq_len_tensor), add_inputs)


def sgmv_expand_slice(inputs, lora_b_weights, output_tensor, b_seq_start_loc, seq_len_tensor, lora_indices_tensor,
                      batches, max_seq_length, token_nums, slice_offset, slice_size, add_inputs=False):
    bgmv_expand_slice(inputs, lora_b_weights, output_tensor, _explode(lora_indices_tensor, seq_len_tensor),
                      slice_offset, slice_size, add_inputs)


def register() -> None:
    """vLLM calls this in each of its processes; a second call changes nothing."""
    if os.environ.get("DISTILL_VLLM_CPU_LORA", "1") == "0":
        return
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return
        from vllm.lora.ops import torch_ops
        from vllm.lora.punica_wrapper import punica_cpu
    except ImportError:  # a vLLM without these modules: its own ops stay
        return
    if not all(hasattr(punica_cpu, n) and hasattr(torch_ops, n) for n in _NAMES):
        return
    for name in _NAMES:
        _original.setdefault(name, getattr(torch_ops, name))
        setattr(punica_cpu, name, globals()[name])
