"""Measured vs predicted activation bytes of real PyTorch layers (CPU, eager).

The saved tensors of one forward are collected with
``torch.autograd.graph.saved_tensors_hooks``, deduplicated by storage (views of one
tensor count once, at the size of their storage) and with parameters excluded; the
memory model's ``cpu-eager`` profiles must predict the total within 3 %.
"""

import dataclasses

import pytest
import torch

from merak_exec.profiling.saved_tensors import saved_tensor_bytes
from merak_sim.memory import (
    CPU_EAGER,
    CPU_EAGER_HF_GPT2,
    first_stage_extra_bytes,
    last_stage_extra_bytes,
    layer_activation_bytes,
)
from merak_sim.model import ModelSpec

SHAPES = [(2, 64, 128, 4), (1, 128, 256, 8), (3, 32, 96, 3), (2, 100, 192, 6)]


def saved_bytes(fn, params) -> int:
    """Bytes of distinct storages saved for backward while running ``fn()`` (the
    profiler's own measurement, so the tests check what traces record)."""
    return saved_tensor_bytes(fn, params)[1]


def spec(b, s, h, a, p, vocab=1000):
    return ModelSpec(name="probe", family="gpt", layers=1, hidden=h, heads=a, seq_len=s,
                     vocab=vocab, dropout=p, dtype="fp32")


def _hf_block(h, a, s, p, impl):
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    cfg = GPT2Config(n_embd=h, n_head=a, n_positions=s, resid_pdrop=p, attn_pdrop=p,
                     embd_pdrop=p)
    cfg._attn_implementation = impl
    return GPT2Block(cfg, layer_idx=0).train()


@pytest.mark.parametrize("b,s,h,a", SHAPES)
@pytest.mark.parametrize("p", [0.0, 0.1])
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_hf_gpt2_block(b, s, h, a, p, impl):
    torch.manual_seed(0)
    blk = _hf_block(h, a, s, p, impl)
    x = torch.randn(b, s, h, requires_grad=True)
    measured = saved_bytes(lambda: _first(blk(x)), blk.parameters())
    prof = CPU_EAGER_HF_GPT2 if impl == "sdpa" else \
        dataclasses.replace(CPU_EAGER_HF_GPT2, attention="unfused")
    predicted = layer_activation_bytes(spec(b, s, h, a, p), b, profile=prof)
    assert predicted == pytest.approx(measured, rel=0.03), (measured, predicted)


def _first(y):
    return y[0] if isinstance(y, tuple) else y


def _builtin():
    return pytest.importorskip("merak_exec.models.gpt")


@pytest.mark.parametrize("b,s,h,a", SHAPES)
@pytest.mark.parametrize("p", [0.0, 0.1])
def test_builtin_gpt_block(b, s, h, a, p):
    g = _builtin()
    torch.manual_seed(0)
    blk = g.Block(g.GPTConfig(n_embd=h, n_head=a, n_positions=s, dropout=p)).train()
    x = torch.randn(b, s, h, requires_grad=True)
    measured = saved_bytes(lambda: blk(x), blk.parameters())
    predicted = layer_activation_bytes(spec(b, s, h, a, p), b, profile=CPU_EAGER)
    assert predicted == pytest.approx(measured, rel=0.03), (measured, predicted)


@pytest.mark.parametrize("b,s,h,a", SHAPES[:2])
@pytest.mark.parametrize("p", [0.0, 0.1])
def test_builtin_embedding_and_head(b, s, h, a, p):
    g = _builtin()
    torch.manual_seed(0)
    cfg = g.GPTConfig(n_embd=h, n_head=a, n_positions=s, dropout=p, vocab_size=1000)
    emb = g.Embedding(cfg).train()
    head = g.Head(cfg, emb.wte).train()
    ids = torch.randint(0, 1000, (b, s))
    m = spec(b, s, h, a, p)
    got_e = saved_bytes(lambda: emb(ids), emb.parameters())
    want_e = first_stage_extra_bytes(m, b, profile=CPU_EAGER)
    assert want_e == pytest.approx(got_e, rel=0.03), (got_e, want_e)
    x = torch.randn(b, s, h, requires_grad=True)
    tgt = torch.randint(0, 1000, (b * s,))

    def run():
        return torch.nn.functional.cross_entropy(head(x).view(-1, 1000), tgt)

    got_h = saved_bytes(run, head.parameters())
    want_h = last_stage_extra_bytes(m, b, profile=CPU_EAGER)
    assert want_h == pytest.approx(got_h, rel=0.03), (got_h, want_h)
