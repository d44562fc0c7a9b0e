"""ZeRO-2/3 through torch FSDP2 trains exactly like one process.

gloo ranks on CPU, tiny GPT, fp32: ZeRO-2 (parameters kept gathered from forward to
backward) and ZeRO-3 (resharded after every forward), pairwise with the schedule
(1f1b, gpipe), the recompute policy, pipeline (pp2, tied embedding across the two
ends) and tensor parallelism (tp2): 3 steps' losses and the final parameters (full
tensors gathered from the shards) against a single-process run, relative error
<= 1e-5. Then ZeRO-3's parameter memory per rank against the unsharded model.
"""

import pytest

from support.workers import launch

from merak_sim.config import ParallelConfig
from merak_sim.executable import unsupported


def C(name, **kw):
    kw.update(dtype="fp32", micro_batch_size=1)
    kw.setdefault("global_batch_size", 4 * kw.get("dp", 1))
    return {"name": name, "config": kw}


TWO = [
    C("dp2 zero3 1f1b none", dp=2, zero=3),
    C("dp2 zero2 gpipe full", dp=2, zero=2, schedule="gpipe", recompute="full"),
]
FOUR = [
    C("pp2 dp2 zero3 gpipe none", pp=2, dp=2, zero=3, schedule="gpipe"),
    C("pp2 dp2 zero2 1f1b full", pp=2, dp=2, zero=2, recompute="full"),
    C("tp2 dp2 zero3 1f1b full", tp=2, dp=2, zero=3, recompute="full"),
    C("tp2 dp2 zero2 gpipe none", tp=2, dp=2, zero=2, schedule="gpipe"),
]


def _check(results):
    for rank, rs in enumerate(results):
        errors = [r["error"] for r in rs if "error" in r]
        assert not errors, f"rank {rank}: {errors[0]}"
        for r in rs:
            for what in ("loss", "param"):
                assert r[what] <= 1e-5, f"rank {rank} {r['name']}: {what} rel err {r[what]}"
            assert r["losses"][-1] != r["losses"][0]


def test_fsdp_dp2_equals_single_process(tmp_path):
    _check(launch(2, TWO, str(tmp_path), timeout_s=400))


def test_fsdp_with_pp2_and_tp2_equals_single_process(tmp_path):
    _check(launch(4, FOUR, str(tmp_path), timeout_s=600))


@pytest.mark.parametrize("kw, fragment", [
    (dict(schedule="zb-h1"), "I/W actions"),
    (dict(tp=2, sequence_parallel=True), "sequence parallelism"),
])
def test_fsdp_refuses_split_backwards_and_sequence_parallel(kw, fragment):
    kw = dict(dp=2, global_batch_size=8, micro_batch_size=1, **kw)
    kw["pp"] = 2 if "schedule" in kw else 1
    why = unsupported(ParallelConfig(zero=3, **kw))
    assert why is not None and fragment in why and "ZeRO-3 (torch FSDP2)" in why
    assert unsupported(ParallelConfig(zero=1, **kw)) is None


def memory_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """One ZeRO-3 step over dp=world; write this rank's parameter bytes (distinct
    storages of the local shards) and the unsharded model's."""
    import json
    import os

    import torch

    from merak_exec.fsdp import local_tensor
    from merak_exec.mesh import init_distributed, loopback_env
    from merak_exec.models import GPT
    from merak_exec.parallel import parallelize
    from support.models import data, tiny_gpt_config

    loopback_env(rank, world, port)
    init_distributed(backend="gloo")
    mcfg = tiny_gpt_config()
    pc = ParallelConfig(dp=world, zero=3, global_batch_size=2 * world, micro_batch_size=1,
                        dtype="fp32")
    torch.manual_seed(0)
    pm = parallelize(GPT(mcfg), pc, seq_len=mcfg.n_positions)
    (x, y), = data(mcfg, pc.global_batch_size, mcfg.n_positions, 1)
    pm.train_step(x, y)
    storages = {}
    for p in pm.parameters():
        st = local_tensor(p.data).untyped_storage()
        storages[st.data_ptr()] = st.nbytes()
    full = sum(p.numel() * p.element_size() for p in pm.parameters())
    out = {"sharded": sum(storages.values()), "unsharded": full,
           "dtensor": all(hasattr(p, "to_local") for p in pm.parameters())}
    with open(os.path.join(out_dir, f"mem{rank}.json"), "w") as f:
        json.dump(out, f)
    os._exit(0)


def test_zero3_parameter_memory_is_one_over_dp(tmp_path):
    import json

    from merak_exec.launch import free_port, run_ranks

    world = 2
    codes = run_ranks(memory_worker, world, (world, free_port(), str(tmp_path)), timeout_s=300)
    assert codes == [0] * world
    for r in range(world):
        m = json.load(open(tmp_path / f"mem{r}.json"))
        ratio = m["sharded"] / m["unsharded"]
        print(f"rank {r}: ZeRO-3 parameters {m['sharded']} B of {m['unsharded']} B "
              f"unsharded = {ratio:.4f} (1/dp = {1 / world:.4f})")
        assert m["dtensor"]
        assert abs(ratio * world - 1) <= 0.05
