"""Sequence parallelism and selective recompute train exactly like one process.

Pairwise design on two gloo ranks (tp2 or pp2), tiny models: sequence parallelism
with each recompute policy and with zero-bubble and sub-pipelined TP, selective
recompute with tp2 (plain and sequence-parallel), pp2 (1f1b, zero-bubble) and a
HuggingFace model. Each case compares 3 steps' losses, the last gradients and the
final parameters with a single-process run: relative error <= 1e-5 (fp32). The
refusals (a family sequence parallelism does not know, a block without an attention
core, ZeRO-2/3 with sequence parallelism, cp > 1) are one-line errors checked
without launching ranks.
"""

import types

import pytest
import torch

from support.shared_launch import register
from support.workers import assert_equivalent

from merak_exec.mesh import ExecError

SP = dict(tp=2, sequence_parallel=True)


def C(name, model="gpt", **kw):
    kw.setdefault("dtype", "fp32")
    kw.setdefault("micro_batch_size", 1)
    kw.setdefault("global_batch_size", 4 * kw.get("dp", 1) * kw["micro_batch_size"])
    return {"name": name, "model": model, "config": kw}


CASES = [
    C("tp2 sp 1f1b none", **SP),
    C("tp2 sp zb-h1 selective", **SP, schedule="zb-h1", recompute="selective"),
    C("tp2 sp sub-pipelined full", **SP, recompute="full", tp_overlap="sub-pipelined",
      micro_batch_size=2),
    C("tp2 selective", tp=2, recompute="selective"),
    C("pp2 1f1b selective", pp=2, recompute="selective"),
    C("pp2 zb-h1 selective", pp=2, schedule="zb-h1", recompute="selective"),
    C("hf-llama pp2 selective", "llama", pp=2, recompute="selective"),
]
register(2, CASES, 500)  # launched together with the other modules' two-rank cases


def test_sp_and_selective_equal_single_process(equivalence):
    assert_equivalent(equivalence(2, CASES), CASES)


def test_sequence_parallel_refuses_unknown_families():
    from merak_exec.sequence_parallel import apply_sequence_parallel

    with pytest.raises(ExecError, match="built-in GPT only"):
        apply_sequence_parallel([], [], None, "gpt2")


def test_selective_recompute_needs_an_attention_core():
    from merak_exec.stages import StageModule

    stage = StageModule([torch.nn.Linear(4, 4)], 0, 1, None, [True])
    stage.selective_recompute = True
    with pytest.raises(ExecError, match="calls none; use recompute full"):
        stage(torch.randn(2, 4, requires_grad=True))


def test_selective_recompute_recomputes_only_the_attention_core():
    from merak_exec.models import GPT, GPTConfig
    from merak_exec.stages import AttentionRecompute

    torch.manual_seed(0)
    block = GPT(GPTConfig(vocab_size=16, n_positions=8, n_embd=16, n_layer=1,
                          n_head=4)).blocks[0]
    x = torch.randn(2, 8, 16, requires_grad=True)
    block(x).sum().backward()
    want = x.grad.clone()
    x.grad = None
    with AttentionRecompute() as core:
        y = block(x)
    y.sum().backward()
    assert core.calls == 1
    torch.testing.assert_close(x.grad, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("fields,match", [({"zero": 2, "cp": 1, "sequence_parallel": True},
                                           "ZeRO-2 \\(torch FSDP2\\) with sequence"),
                                          ({"zero": 3, "zero_group": 2}, "HSDP"),
                                          ({"zero": 0, "cp": 2}, "ring attention"),
                                          ({"dtype": "fp8"}, "FP8")])
def test_unexecuted_options_refused_in_one_line(fields, match):
    from merak_exec.parallel import check_executable

    with pytest.raises(ExecError, match=match) as e:
        check_executable(types.SimpleNamespace(**fields))
    assert "\n" not in str(e.value)
