"""The CPU LoRA ops of distill's vLLM plugin compute what vLLM's own torch ops compute, for every adapter's tokens,
and leave tokens of no adapter (index -1) as they were, as vLLM's GPU kernels do."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
torch_ops = pytest.importorskip("vllm.lora.ops.torch_ops")

from distill.serving import vllm_plugin  # noqa: E402

SLOTS, R, IN, OUT = 3, 8, 48, 40


@pytest.fixture(autouse=True)
def originals():
    for name in vllm_plugin._NAMES:
        vllm_plugin._original.setdefault(name, getattr(torch_ops, name))


def case(indices: list[int], seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    idx = torch.tensor(indices)
    return gen, idx


@pytest.mark.parametrize("indices", [[0, 0, 0, 0, 0], [2, 0, 1, 2, 0], [1, -1, 1, -1, 2], [-1, -1, -1], [2]])
def test_shrink_and_expand_match_vllm_ops_for_adapter_tokens(indices: list[int]) -> None:
    gen, idx = case(indices)
    n = len(indices)
    x = torch.randn(n, IN, generator=gen)
    a = torch.randn(SLOTS, 1, R, IN, generator=gen)  # lora_a stacked as vLLM keeps it: [slots, 1, r, in]
    b = torch.randn(SLOTS, 1, OUT, R, generator=gen)
    mine, theirs = torch.zeros(n, R), torch.zeros(n, R)
    vllm_plugin.bgmv_shrink(x, a, mine, idx, 0.5)
    torch_ops.bgmv_shrink(x, a, theirs, idx, 0.5)
    has = idx >= 0
    assert torch.allclose(mine[has], theirs[has], atol=1e-5)
    assert (mine[~has] == 0).all()  # untouched: the caller's zeroed buffer
    base = torch.randn(n, OUT, generator=gen)
    for add in (True, False):
        mine_y, theirs_y = base.clone(), base.clone()
        vllm_plugin.bgmv_expand(theirs, b, mine_y, idx, add_inputs=add)
        torch_ops.bgmv_expand(theirs, b, theirs_y, idx, add_inputs=add)
        assert torch.allclose(mine_y[has], theirs_y[has], atol=1e-4)
        assert torch.equal(mine_y[~has], base[~has])


def test_expand_slice_and_prefill_forms_match_vllm_ops() -> None:
    gen, seq_idx = case([1, -1, 0])
    seq_len = torch.tensor([3, 2, 4])
    tokens = int(seq_len.sum())
    starts = torch.cumsum(seq_len, 0) - seq_len
    x = torch.randn(tokens, R, generator=gen)
    b = torch.randn(SLOTS, 1, 16, R, generator=gen)
    out = torch.randn(tokens, OUT, generator=gen)
    meta = (starts, seq_len, seq_idx, 3, 4, tokens)
    mine, theirs = out.clone(), out.clone()
    vllm_plugin.sgmv_expand_slice(x, b, mine, *meta, 8, 16, True)
    torch_ops.sgmv_expand_slice(x, b, theirs, *meta, 8, 16, True)
    has = torch.repeat_interleave(seq_idx, seq_len) >= 0
    assert torch.allclose(mine[has], theirs[has], atol=1e-4) and torch.equal(mine[~has], out[~has])
    a = torch.randn(SLOTS, 1, R, IN, generator=gen)
    xs = torch.randn(tokens, IN, generator=gen)
    mine_r, theirs_r = torch.zeros(tokens, R), torch.zeros(tokens, R)
    vllm_plugin.sgmv_shrink(xs, a, mine_r, *meta, 2.0)
    torch_ops.sgmv_shrink(xs, a, theirs_r, *meta, 2.0)
    assert torch.allclose(mine_r[has], theirs_r[has], atol=1e-4)


def test_a_call_of_another_shape_falls_back_to_vllm_ops() -> None:
    gen, idx = case([0])
    x = torch.randn(1, R, generator=gen)  # one input row broadcast over four output rows (vLLM's `limit` case)
    b = torch.randn(SLOTS, 1, OUT, R, generator=gen)
    mine, theirs = torch.zeros(4, OUT), torch.zeros(4, OUT)
    vllm_plugin.bgmv_expand(x, b, mine, idx, add_inputs=True)
    torch_ops.bgmv_expand(x, b, theirs, idx, add_inputs=True)
    assert torch.equal(mine, theirs) and mine.abs().sum() > 0


def test_registered_as_a_vllm_general_plugin() -> None:
    from importlib.metadata import entry_points

    (plugin,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "distill_cpu_lora"]
    assert plugin.load() is vllm_plugin.register
