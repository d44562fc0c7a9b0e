"""What ``attention="auto"`` resolves to, in one place for both time and memory: flash
on CUDA presets, the measured profile on the CPU cluster; the historical recipes (vTrain,
the Merak paper's systems) pin the unfused kernel."""

import dataclasses
from pathlib import Path

import pytest

from merak_sim.calibrate.fit import PreparedRun
from merak_sim.calibrate.vtrain import load_vtrain, row_setup, vtrain_runs
from merak_sim.config import ATTENTIONS, ParallelConfig
from merak_sim.costs import AnalyticCostModel
from merak_sim.costs.attention_choice import (
    attention_label,
    attention_profile,
    default_profile,
    resolve_attention,
)
from merak_sim.hardware import CLUSTER_PRESETS, get_cluster
from merak_sim.memory import CPU_EAGER, FLASH, KORTHIKANTI, TORCHTITAN, layer_activation_bytes
from merak_sim.model import get_model
from merak_sim.planner import SYSTEMS, SearchSpace
from merak_sim.reproduce.merak import PAPER_MODELS, hand_configs
from merak_sim.sim import simulate

ROOT = Path(__file__).resolve().parents[1]
GPU_CLUSTERS = [c for c in CLUSTER_PRESETS if c != "local-cpu"]
GPT = get_model("gpt-2.5b")
TINY = get_model({"family": "gpt", "layers": 2, "hidden": 64, "heads": 4, "seq_len": 32,
                  "vocab": 256, "dropout": 0.1})


def cfg(**kw):
    base = dict(dp=1, tp=2, pp=2, micro_batch_size=2, global_batch_size=16)
    base.update(kw)
    return ParallelConfig(**base)


def test_resolve_attention():
    """Forced kernels pass through on every preset; auto (or no config) is flash on
    every CUDA preset and unfused on the CPU one."""
    assert "local-cpu" in CLUSTER_PRESETS and len(GPU_CLUSTERS) >= 5
    for name in CLUSTER_PRESETS:
        gpu = get_cluster(name).gpu.name
        for att in ("flash", "unfused"):
            assert resolve_attention(cfg(attention=att), gpu) == att
        want = "unfused" if name == "local-cpu" else "flash"
        assert resolve_attention(cfg(), gpu) == want
        assert resolve_attention(None, gpu) == want
    assert ParallelConfig.__dataclass_fields__["attention"].default == "auto"


def test_default_and_auto_profiles():
    """Without a profile: Korthikanti's storing the flash log-sum-exp on GPUs, the
    measured eager profile kept whole on CPU; a given profile keeps everything but the
    attention storage, which follows the resolved kernel."""
    assert default_profile("A100-80GB") is KORTHIKANTI
    assert default_profile("CPU-2core") is CPU_EAGER
    gpu = attention_profile(None, cfg(), "H100-80GB")
    assert dataclasses.replace(gpu, name="flash") == FLASH
    assert attention_profile(None, cfg(attention="unfused"), "H100-80GB") is KORTHIKANTI
    assert attention_profile(None, cfg(), "CPU-2core") is CPU_EAGER
    assert attention_profile(None, None, "CPU-2core") is CPU_EAGER
    assert attention_profile(TORCHTITAN, cfg(), "H100-80GB") is TORCHTITAN
    forced = attention_profile(TORCHTITAN, cfg(attention="unfused"), "H100-80GB")
    assert forced.attention == "unfused" and forced.selective == TORCHTITAN.selective


@pytest.mark.parametrize("name", CLUSTER_PRESETS)
@pytest.mark.parametrize("att", ATTENTIONS)
def test_memory_and_time_describe_one_kernel(name, att):
    """The profile's attention storage is that of the kernel the layer cost times
    (the CPU cluster's measured ``sdpa-cpu`` storage under auto goes with the unfused
    kernel's time)."""
    cm, cl, c = AnalyticCostModel(), get_cluster(name), cfg(attention=att)
    kernel = cm.attention_kernel(cl, c)
    storage = cm.profile_for(cl, c).attention
    assert kernel in ("flash", "unfused")
    assert storage == kernel or (name == "local-cpu" and att == "auto"
                                 and (storage, kernel) == ("sdpa-cpu", "unfused"))


@pytest.mark.parametrize("name", ["paper-3090", "dgx-a100-80g", "dgx-h100", "dgx-h200"])
@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_auto_on_gpu_equals_flash(name, recompute):
    """Memory (activation bytes per stage, from the flash profile) and time (the flash
    kernel) of auto equal attention="flash" and differ from unfused: faster, and
    without selective recompute smaller by the s x s scores less the log-sum-exp."""
    cm, cl = AnalyticCostModel(), get_cluster(name, nodes=1)
    c = cfg(recompute=recompute)
    auto = cm.cost_table(GPT, cl, c)
    flash = cm.cost_table(GPT, cl, dataclasses.replace(c, attention="flash"))
    unfused = cm.cost_table(GPT, cl, dataclasses.replace(c, attention="unfused"))
    assert auto.stages == flash.stages
    for a, u in zip(auto.stages, unfused.stages, strict=True):
        assert a.forward_s < u.forward_s and a.backward_s < u.backward_s
        assert (a.activation_bytes < u.activation_bytes if recompute == "none"
                else a.activation_bytes == u.activation_bytes)
    lay = cm.layer_breakdown(GPT, cl, c)["layer"]
    assert lay["activation_bytes"] == layer_activation_bytes(
        GPT, 2, 2, False, recompute, FLASH, "bf16")
    if recompute == "none":
        lay_u = cm.layer_breakdown(GPT, cl, dataclasses.replace(c, attention="unfused"))
        a_h, s, e = GPT.heads, GPT.seq_len, 2
        # Unfused keeps the softmax (e), its dropout mask (1) and the dropped
        # probabilities (e) per score; flash 4 bytes of log-sum-exp per head and token.
        per_tok = ((2 * e + 1) * s - 4) * a_h if GPT.dropout > 0 else (e * s - 4) * a_h
        assert lay_u["layer"]["activation_bytes"] - lay["activation_bytes"] == \
            pytest.approx(2 * s * per_tok / 2)


def test_auto_on_cpu_keeps_the_measured_profile():
    """On the CPU cluster auto stores what the measured profile says (dropout on: the
    math kernel's s x s tensors) and times the unfused kernel, as before."""
    cm, cl, c = AnalyticCostModel(), get_cluster("local-cpu"), cfg(tp=1, pp=1)
    lay = cm.layer_breakdown(TINY, cl, c)["layer"]
    assert lay["activation_bytes"] == layer_activation_bytes(TINY, 2, profile=CPU_EAGER)
    unf = cm.layer_breakdown(TINY, cl, dataclasses.replace(c, attention="unfused"))["layer"]
    fl = cm.layer_breakdown(TINY, cl, dataclasses.replace(c, attention="flash"))["layer"]
    times = ("forward_s", "backward_input_s", "backward_weight_s", "recompute_s")
    assert all(lay[k] == unf[k] for k in times)
    assert any(lay[k] != fl[k] for k in times)


def test_vtrain_rows_are_pinned_unfused():
    """Every vTrain row (single- and multi-node) runs the unfused kernel; its
    prediction is the unfused one, not the GPU default's."""
    data = ROOT / "data" / "vtrain"
    rows = (load_vtrain(data / "ground_truth_single.csv")
            + load_vtrain(data / "ground_truth_multi.csv"))
    assert len(rows) > 1000
    assert {row_setup(r)[2].attention for r in rows} == {"unfused"}
    r = rows[0]
    model, cluster, c = row_setup(r)
    cm = AnalyticCostModel()
    assert cm.attention_kernel(cluster, c) == "unfused"
    assert cm.profile_for(cluster, c).attention == "unfused"
    assert cm.cost_table(model, cluster, c).stages != cm.cost_table(
        model, cluster, dataclasses.replace(c, attention="auto")).stages
    # The row's prediction is the pinned configuration's, slower than under the GPU
    # default of flash.
    run = vtrain_runs(data / "ground_truth_single.csv")[0]
    p = PreparedRun.of(run)
    pinned = p.predict(None)
    whole = simulate(model, cluster, c, cost_model=p.cost_model(None), engine="evaluator",
                     sub_cluster=True, keep_trace=False).iteration_time_s
    assert whole == pytest.approx(pinned, rel=1e-12)
    flash = dataclasses.replace(p, run=dataclasses.replace(
        run, config=dataclasses.replace(c, attention="auto")))
    assert flash.predict(None) < pinned


def test_merak_systems_are_pinned_unfused():
    """The paper's systems (every reproduction space and hand-written configuration)
    run unfused attention; the full space keeps auto."""
    assert {a for sp in SYSTEMS.values() for a in sp.attention} == {"unfused"}
    for m in PAPER_MODELS:
        cfgs = [c for cs in hand_configs(m).values() for c in cs]
        assert cfgs and {c.attention for c in cfgs} == {"unfused"}
    assert SearchSpace().attention == ("auto",)


def test_attention_label():
    """Printed form: auto names what it resolved to, and on the CPU cluster that the
    measured profile's storage is not the timed kernel's."""
    assert attention_label(cfg(), "H100-80GB") == "auto (flash)"
    cpu = get_cluster("local-cpu").gpu.name
    assert attention_label(cfg(), cpu) == "auto (unfused timed, sdpa-cpu storage)"
    assert attention_label(cfg(attention="flash"), cpu) == "flash"
    assert attention_label(cfg(attention="unfused"), "H100-80GB") == "unfused"
