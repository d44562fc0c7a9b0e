"""Divergence stops the run in one line naming the step: a gradient norm or loss that is
not finite (fp32, bf16), or fp16 gradients still overflowing once the loss scaler is at
its minimum scale; before that, fp16 overflows are skipped as usual."""

import json
import os
import subprocess
import sys

import pytest
import torch

from merak_exec.mesh import NonFiniteError
from merak_exec.optim import LossScaler, TrainingOptimizer


def _opt(p, **kw) -> TrainingOptimizer:
    return TrainingOptimizer(torch.optim.SGD([p], lr=0.1), counts={}, device=p.device, **kw)


def test_a_nan_gradient_norm_stops_before_any_change():
    p = torch.nn.Parameter(torch.ones(3))
    opt = _opt(p, max_grad_norm=1.0)
    p.grad = torch.ones(3)
    opt.step()  # step 1 is fine
    p.grad = torch.tensor([float("nan"), 0.0, 0.0])
    before = p.detach().clone()
    with pytest.raises(NonFiniteError, match=r"^merak_exec: training diverged at step 2: the "
                                             r"gradient norm is nan;") as e:
        opt.step()
    assert "\n" not in str(e.value) and torch.equal(p.detach(), before)


def test_fp16_overflows_are_skipped_until_the_scale_is_at_its_minimum():
    p = torch.nn.Parameter(torch.ones(3))
    sc = LossScaler(scale=4.0, min_scale=1.0)
    opt = _opt(p, scaler=sc)
    for scale in (2.0, 1.0):  # backs off, skips, never below the minimum
        p.grad = torch.tensor([float("inf"), 0.0, 0.0])
        opt.step()
        assert sc.scale == scale and torch.equal(p.detach(), torch.ones(3))
    assert opt.skipped == 2 and sc.skipped_in_a_row == 2 and sc.at_minimum
    p.grad = torch.tensor([float("inf"), 0.0, 0.0])
    with pytest.raises(NonFiniteError, match=r"at step 3: the fp16 gradients overflowed with "
                                             r"the loss scale at its minimum 1 \(3 steps "
                                             r"skipped in a row\)"):
        opt.step()


def test_a_good_step_resets_the_run_of_skips():
    sc = LossScaler(scale=2.0, min_scale=1.0)
    sc.update(True)
    sc.update(False)
    assert sc.skipped_in_a_row == 0 and sc.scale == 1.0 and sc.at_minimum


_RUN = r"""
import json, sys, torch
import merak_exec
from merak_exec.mesh import NonFiniteError
from merak_exec.models import GPT, GPTConfig
merak_exec.init()
cfg = GPTConfig(vocab_size=32, n_positions=8, n_embd=16, n_layer=2, n_head=2)
g = torch.Generator().manual_seed(0)
ds = [{"input_ids": torch.randint(0, 32, (8,), generator=g)} for _ in range(8)]
out = {}
for name, fp16, clip in (("fp32-no-clip", False, 0.0), ("fp32-clip", False, 1.0),
                         ("fp16", True, 1.0)):
    args = merak_exec.TrainingArguments(output_dir=sys.argv[1], max_steps=40, fp16=fp16,
                                        max_grad_norm=clip, logging_steps=0)
    try:  # SGD with a learning rate no CLI accepts: the weights blow up after step 1
        merak_exec.Trainer(model=GPT(cfg), args=args, train_dataset=ds,
                           optimizer_fn=lambda ps: torch.optim.SGD(ps, lr=1e30)).train()
        out[name] = None
    except NonFiniteError as e:
        out[name] = str(e)
print(json.dumps(out))
"""


def test_training_stops_at_the_step_that_diverged(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "MERAK_FAULT")}
    p = subprocess.run([sys.executable, "-c", _RUN, str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.splitlines()[-1])
    # no norm measured: the runtime's loss check (the weights are already NaN)
    assert got["fp32-no-clip"] == ("merak_exec: training diverged at step 2: the loss is nan; "
                                   "lower the learning rate or check the inputs")
    # the norm (clipping on): the optimizer stops before applying it
    assert got["fp32-clip"].startswith("merak_exec: training diverged at step 2: the "
                                       "gradient norm is ")
    # fp16: 2**16 backs off to 1 over 16 skipped steps; the 17th overflow gives up
    assert got["fp16"].startswith("merak_exec: training diverged at step 18: the fp16 "
                                  "gradients overflowed"), got["fp16"]
