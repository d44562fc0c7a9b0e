"""ZeRO-1 (optimizer state sharded over dp) trains exactly like one process and holds
1/dp of the optimizer state per rank (ZeRO-3 through FSDP2: 1/dp of the parameters).

Two gloo ranks (dp2), tiny models, pairwise with the schedule, the recompute policy
and a HuggingFace model: 3 steps' losses and the final parameters (all-gathered on
every rank) against a single-process run, relative error <= 1e-5 (fp32). The memory
test measures the bytes of the sharded AdamW state on each rank against the same
optimizer unsharded over the same parameters and prints both.
"""

import json
import os

import pytest
import torch

from support.shared_launch import register
from support.workers import assert_equivalent

from merak_exec.launch import STORE_PORT, run_ranks


def C(name, model="gpt", **kw):
    kw.setdefault("dtype", "fp32")
    kw.setdefault("micro_batch_size", 1)
    kw.setdefault("global_batch_size", 4 * kw.get("dp", 1) * kw["micro_batch_size"])
    return {"name": name, "model": model, "config": dict(kw, zero=1)}


CASES = [
    C("dp2 zero1 1f1b none", dp=2),
    C("dp2 zero1 zb-h1 selective", dp=2, schedule="zb-h1", recompute="selective"),
    C("dp2 zero1 shifted full", dp=2, schedule="shifted-critical-path", recompute="full"),
    C("hf-gpt2 dp2 zero1 stage-aware", "gpt2", dp=2, recompute="stage-aware"),
]
register(2, CASES, 500)  # launched together with the other modules' two-rank cases


def test_zero1_equals_single_process(equivalence):
    # grads are not compared under ZeRO (run_case reports 0): losses and parameters are
    assert_equivalent(equivalence(2, CASES), CASES)


def memory_worker(rank: int, world: int, port: int, out_dir: str, zeros: list[int]) -> None:
    """For each ``zero`` of ``zeros`` in turn, one AdamW step sharded over dp=world;
    write the sharded and unsharded bytes of what ``zero`` shards last: the optimizer
    state (1) or the parameters (3)."""
    from merak_exec.mesh import init_distributed, loopback_env

    loopback_env(rank, world, port)
    init_distributed(backend="gloo")
    for zero in zeros:
        _memory_step(rank, world, out_dir, zero)
    os._exit(0)


def _memory_step(rank: int, world: int, out_dir: str, zero: int) -> None:
    from support.models import data, tiny_gpt_config

    from merak_exec.fsdp import local_tensor
    from merak_exec.models import GPT
    from merak_exec.parallel import parallelize
    from merak_exec.zero import ZeroOptimizer, optimizer_state_bytes
    from merak_sim.config import ParallelConfig

    mcfg = tiny_gpt_config()
    pc = ParallelConfig(dp=world, zero=zero, global_batch_size=2 * world, micro_batch_size=1,
                        dtype="fp32")
    torch.manual_seed(0)
    pm = parallelize(GPT(mcfg), pc, seq_len=mcfg.n_positions,
                     optimizer_fn=lambda ps: torch.optim.AdamW(ps, lr=1e-3))
    (x, y), = data(mcfg, pc.global_batch_size, mcfg.n_positions, 1)
    pm.train_step(x, y)
    opt = pm.runtime.optimizer
    if zero == 1:
        full = torch.optim.AdamW([torch.nn.Parameter(p.detach().clone())
                                  for p in pm.parameters()])
        for p in full.param_groups[0]["params"]:
            p.grad = torch.zeros_like(p)
        full.step()
        out = {"sharded": optimizer_state_bytes(opt), "unsharded": optimizer_state_bytes(full),
               "kind": isinstance(opt, ZeroOptimizer)}
    else:  # distinct storages of the local FSDP shards against the full parameters
        storages = {}
        for p in pm.parameters():
            st = local_tensor(p.data).untyped_storage()
            storages[st.data_ptr()] = st.nbytes()
        out = {"sharded": sum(storages.values()),
               "unsharded": sum(p.numel() * p.element_size() for p in pm.parameters()),
               "kind": all(hasattr(p, "to_local") for p in pm.parameters())}
    with open(os.path.join(out_dir, f"mem{zero}-{rank}.json"), "w") as f:
        json.dump(out, f)


@pytest.fixture(scope="module")
def memory_runs(tmp_path_factory):
    """ZeRO-1 and ZeRO-3 memory steps in turn in one launch of 2 ranks: (codes, dir)."""
    out = tmp_path_factory.mktemp("memory")
    codes = run_ranks(memory_worker, 2, (2, STORE_PORT, str(out), [1, 3]), timeout_s=300)
    return codes, out


@pytest.mark.parametrize("zero, what", [(1, "AdamW state"), (3, "parameters (FSDP2)")])
def test_sharded_memory_is_one_over_dp(memory_runs, zero, what):
    world = 2
    codes, out = memory_runs
    assert codes == [0] * world
    for r in range(world):
        m = json.load(open(out / f"mem{zero}-{r}.json"))
        ratio = m["sharded"] / m["unsharded"]
        print(f"rank {r}: ZeRO-{zero} {what} {m['sharded']} B of {m['unsharded']} B "
              f"unsharded = {ratio:.4f} (1/dp = {1 / world:.4f})")
        assert m["kind"]
        assert abs(ratio * world - 1) <= 0.05


def test_zero1_state_names_cover_every_shard_once():
    """dp=1 group-free shard: the named state covers each parameter's whole range."""
    from merak_exec.zero import ZeroOptimizer

    lin = torch.nn.Linear(3, 2)
    named = list(lin.named_parameters())
    opt = ZeroOptimizer(torch.optim.AdamW(lin.parameters()), None, 1, 0)
    lin(torch.randn(4, 3)).sum().backward()
    before = lin.weight.detach().clone()
    opt.step()
    assert not torch.equal(before, lin.weight)
    keys = sorted(opt.state_by_name(named))
    assert keys == sorted(f"{n}[0:{p.numel()}].{k}" for n, p in named
                          for k in ("exp_avg", "exp_avg_sq", "step"))


@pytest.fixture(scope="module")
def resume_runs(tmp_path_factory):
    """case_zero_resume with ZeRO-1 and ZeRO-3 in turn in one launch of 2 ranks."""
    from support.precision_workers import run_world

    out = tmp_path_factory.mktemp("resume")
    jobs = [[f"zero{z}", "case_zero_resume", {"dir": str(out / f"ckpt{z}"),
                                              "config": {"zero": z}}] for z in (1, 3)]
    return run_world(2, "case_each", {"jobs": jobs}, str(out))


@pytest.mark.parametrize("zero", [1, 3])
def test_zero_fp16_resume_equals_uninterrupted_run(resume_runs, zero):
    """The sharded AdamW state (ZeRO-1 pieces, FSDP2 shards), the loss scaler and the
    LR iteration are checkpointed: a run resumed at step 2 from another random init
    continues exactly."""
    for rank, res in enumerate(resume_runs):
        r = res.get(f"zero{zero}", res)
        assert "exception" not in r, r["exception"]
        assert r["step"] == 2 and r["state_keys"] > 0
        assert r["restored"] == [2.0 ** 10, 3, 2], r["restored"]
        assert r["resumed"] == r["full"][2:], (rank, r["resumed"], r["full"])
        assert r["scaler_resumed"] == r["scaler_full"]
        assert r["param_err"] == 0.0


ZERO_CLIP = [
    {"name": "tp2 dp2 zero1 clip", "clip": 0.5,
     "config": dict(tp=2, dp=2, zero=1, dtype="fp32", micro_batch_size=1, global_batch_size=8)},
    {"name": "pp2 dp2 zero1 clip (tied embedding)", "clip": 0.5,
     "config": dict(pp=2, dp=2, zero=1, dtype="fp32", micro_batch_size=1, global_batch_size=8)},
]


def test_zero1_clipping_norm_counts_each_element_once(tmp_path):
    """Under ZeRO-1 the global norm (tp-replicated parameters, the tied embedding on
    both pipeline ends, dp-disjoint shards) equals one process's clip_grad_norm_."""
    from support.precision_workers import run_world

    res = run_world(4, "case_amp", {"cases": ZERO_CLIP}, str(tmp_path), timeout_s=500)
    for rank in res:
        assert isinstance(rank, list), rank
        for case, r in zip(ZERO_CLIP, rank, strict=True):
            norm = max(abs(a - b) / b for a, b in zip(r["norms"], r["ref_norms"], strict=True))
            loss = max(abs(a - b) / b for a, b in zip(r["losses"], r["ref"], strict=True))
            print(case["name"], f"norm rel err {norm:.1e} loss rel err {loss:.1e}", r["norms"])
            assert norm <= 1e-5 and loss <= 1e-5, (case["name"], r["norms"], r["ref_norms"])
