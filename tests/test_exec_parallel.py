"""Multi-process equivalence: every layout and rank order / schedule / recompute / TP-overlap value,
and every pair of dimensions, trains exactly like a single process (gloo, CPU).

Models: the built-in GPT, HuggingFace GPT-2 and LLaMA, and a model captured by
torch.export. Pairwise design (not the
full product): each row below is one case; cases of the same world size share one
process launch. Every case compares losses of 3 steps,
the last step's gradients and the final parameters against a single-process run of
the same model and data: relative error <= 1e-5 (fp32).
"""

import pytest

from support.shared_launch import register
from support.workers import assert_equivalent


def C(name, model="gpt", **kw):
    kw.setdefault("dtype", "fp32")
    kw.setdefault("micro_batch_size", 1)
    kw.setdefault("global_batch_size", 4 * kw.get("dp", 1) * kw["micro_batch_size"])
    return {"name": name, "model": model, "config": kw}


SUB = dict(tp_overlap="sub-pipelined", micro_batch_size=2)
TWO = [
    C("pp2 1f1b none", pp=2),
    C("pp2 gpipe full", pp=2, schedule="gpipe", recompute="full"),
    C("pp2 interleaved stage-aware", pp=2, schedule="interleaved-1f1b", virtual_stages=2,
      recompute="stage-aware"),
    C("pp2 zb-h1 full", pp=2, schedule="zb-h1", recompute="full"),
    C("pp2 shifted stage-aware", pp=2, schedule="shifted-critical-path",
      recompute="stage-aware"),
    C("pp2 pre-recompute none", pp=2, schedule="pre-recompute"),
    dict(C("pp2 1f1b parameter-balanced", pp=2, recompute="full"), partition="parameters",
         n_layer=5),
    dict(C("pp2 1f1b explicit split", pp=2), split_points=[2]),
    C("pp2 last-no-recompute full", pp=2, schedule="last-no-recompute", recompute="full"),
    C("tp2 plain none", tp=2),
    C("tp2 zb-h1 (tied head on one rank)", tp=2, schedule="zb-h1"),
    C("tp2 sub-pipelined full", tp=2, recompute="full", **SUB),
    C("dp2 stage-aware", dp=2, recompute="stage-aware"),
    C("dp2 zb-h1 full", dp=2, schedule="zb-h1", recompute="full"),
    # HuggingFace models built from a config (no downloads)
    C("hf-gpt2 pp2 shifted full", "gpt2", pp=2, schedule="shifted-critical-path",
      recompute="full"),
    C("hf-gpt2 tp2 sub none", "gpt2", tp=2, **SUB),
    C("hf-llama pp2 interleaved none", "llama", pp=2, schedule="interleaved-1f1b",
      virtual_stages=2),
    C("hf-llama tp2 plain stage-aware", "llama", tp=2, recompute="stage-aware"),
    # any model torch.export captures (a broadcast value crosses every cut, tied head)
    C("export pp2 zb-h1 full", "custom", pp=2, schedule="zb-h1", recompute="full"),
    C("export pp2 shifted stage-aware", "custom", pp=2, schedule="shifted-critical-path",
      recompute="stage-aware"),
    # the zero-bubble family (zb-auto runs its unit-cost order: no cost table here)
    C("pp2 zb-h2 none", pp=2, schedule="zb-h2"),
    C("pp2 zb-auto full", pp=2, schedule="zb-auto", recompute="full"),
    C("pp2 zb-scp stage-aware", pp=2, schedule="zb-scp", recompute="stage-aware"),
    C("pp2 1f1b-split none", pp=2, schedule="1f1b-split"),
    C("hf-gpt2 pp2 zb-h1 none", "gpt2", pp=2, schedule="zb-h1"),
    C("hf-gpt2 pp2 zb-h2 full", "gpt2", pp=2, schedule="zb-h2", recompute="full"),
    C("hf-gpt2 pp2 zb-auto none", "gpt2", pp=2, schedule="zb-auto"),
    C("hf-gpt2 pp2 zb-scp full", "gpt2", pp=2, schedule="zb-scp", recompute="full"),
    C("pp2 zb-interleaved stage-aware", pp=2, schedule="zb-interleaved", virtual_stages=2,
      recompute="stage-aware"),
    C("hf-gpt2 pp2 1f1b-split none", "gpt2", pp=2, schedule="1f1b-split"),
    C("hf-gpt2 pp2 zb-interleaved none", "gpt2", pp=2, schedule="zb-interleaved",
      virtual_stages=2),
]
FOUR = [
    C("pp2xtp2 1f1b sub stage-aware", pp=2, tp=2, recompute="stage-aware", **SUB),
    C("pp2xtp2 interleaved plain none", pp=2, tp=2, schedule="interleaved-1f1b",
      virtual_stages=2),
    C("pp2xtp2 zb-h1 sub full", pp=2, tp=2, schedule="zb-h1", recompute="full", **SUB),
    C("pp2xtp2 shifted plain full", pp=2, tp=2, schedule="shifted-critical-path",
      recompute="full"),
    C("pp2xdp2 1f1b full", pp=2, dp=2, recompute="full"),
    C("pp2xdp2 interleaved stage-aware", pp=2, dp=2, schedule="interleaved-1f1b",
      virtual_stages=2, recompute="stage-aware"),
    C("pp2xdp2 zb-h1 none", pp=2, dp=2, schedule="zb-h1"),
    C("pp2xdp2 shifted none", pp=2, dp=2, schedule="shifted-critical-path"),
    C("tp2xdp2 sub none", tp=2, dp=2, **SUB),
    C("tp2xdp2 plain full", tp=2, dp=2, recompute="full"),
    C("pp4 shifted stage-aware", pp=4, schedule="shifted-critical-path",
      recompute="stage-aware"),
    C("pp4 1f1b full", pp=4, recompute="full"),
    C("pp4 interleaved none", pp=4, schedule="interleaved-1f1b", virtual_stages=2,
      n_layer=8),
    C("pp4 zb-h1 stage-aware", pp=4, schedule="zb-h1", recompute="stage-aware"),
    C("hf-gpt2 pp2xtp2 zb-h1 plain", "gpt2", pp=2, tp=2, schedule="zb-h1"),
    C("hf-llama pp2xdp2 1f1b full", "llama", pp=2, dp=2, recompute="full"),
    C("hf-llama tp2xdp2 sub none", "llama", tp=2, dp=2, **SUB),
    C("export pp2xdp2 interleaved none", "custom", pp=2, dp=2, schedule="interleaved-1f1b",
      virtual_stages=2),
    C("pp4 zb-h2 none", pp=4, schedule="zb-h2"),
    C("pp4 zb-auto none", pp=4, schedule="zb-auto"),
    C("pp4 zb-scp full", pp=4, schedule="zb-scp", recompute="full"),
    C("pp4 1f1b-split none", pp=4, schedule="1f1b-split"),
    C("hf-gpt2 pp4 zb-h1 none", "gpt2", pp=4, schedule="zb-h1"),
    C("hf-gpt2 pp4 zb-scp stage-aware", "gpt2", pp=4, schedule="zb-scp",
      recompute="stage-aware"),
    C("pp4 zb-interleaved none", pp=4, schedule="zb-interleaved", virtual_stages=2,
      n_layer=8),
    C("pp2xdp2 zero1 1f1b none", pp=2, dp=2, zero=1),
    C("tp2xdp2 zero1 sub none", tp=2, dp=2, zero=1, **SUB),
    C("pp2xtp2 sp selective", pp=2, tp=2, sequence_parallel=True, recompute="selective"),
    # other rank orders: pipeline peers side by side, tensor peers two ranks apart
    C("pp2xdp2 order pp-dp-tp-cp", pp=2, dp=2, order="pp-dp-tp-cp"),
    C("pp2xtp2 order dp-pp-cp-tp zb-h1", pp=2, tp=2, order="dp-pp-cp-tp", schedule="zb-h1"),
    C("hf-gpt2 pp4 zb-h2 none", "gpt2", pp=4, schedule="zb-h2"),
    C("hf-gpt2 pp4 zb-auto none", "gpt2", pp=4, schedule="zb-auto"),
    C("hf-gpt2 pp4 1f1b-split none", "gpt2", pp=4, schedule="1f1b-split"),
    C("hf-gpt2 pp4 zb-interleaved none", "gpt2", pp=4, schedule="zb-interleaved",
      virtual_stages=2, n_layer=8),
]
for c in TWO + FOUR:
    if "n_layer" in c["config"]:
        c["n_layer"] = c["config"].pop("n_layer")
register(2, TWO, 500)  # launched together with the other modules' cases of each world
register(4, FOUR, 500)


@pytest.mark.parametrize("world,cases", [(2, TWO), (4, FOUR)], ids=["2-ranks", "4-ranks"])
def test_parallel_training_equals_single_process(world, cases, equivalence):
    assert_equivalent(equivalence(world, cases), cases)
