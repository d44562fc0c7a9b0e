"""A model built on the meta device (``merak-exec train``'s default) trains the same
model as one process: a tied embedding and LM head stay one tensor on a rank holding
both (one process, dp only, the V placement, tensor parallel), and every layer is
initialised from its own seed, so the values do not depend on the layout.

Each case compares 3 steps' losses, the last gradients and the final parameters with
a single-process run of the same meta model materialised whole (relative error <=
1e-5), and asserts no tie was lost on any rank (``untied``)."""

import pytest

from support.shared_launch import register
from support.workers import assert_equivalent

LAYOUTS = {
    "dp2": dict(dp=2),
    "pp2": dict(pp=2, schedule="1f1b"),
    "zb-v": dict(pp=2, schedule="zb-v", virtual_stages=2),
    "tp2": dict(tp=2),
}


def C(model, layout, meta=True):
    cfg = dict(LAYOUTS[layout], dtype="fp32", micro_batch_size=1, global_batch_size=4)
    tag = "meta" if meta else "no-meta"
    return {"name": f"{model} {layout} {tag}", "model": model, "config": cfg, "n_layer": 4,
            "meta": meta}


CASES = register(2, [C(m, lay) for m in ("gpt", "gpt2", "llama-tied") for lay in LAYOUTS]
                 + [C("llama-tied", lay, meta=False) for lay in ("dp2", "zb-v")], 300)


def test_meta_build_keeps_ties_and_trains_like_one_process(equivalence):
    assert_equivalent(equivalence(2, CASES), CASES)


def test_meta_materialisation_keeps_the_tie_in_one_process():
    """The single-process path itself: materialising a meta model whole keeps
    ``lm_head.weight is wte.weight`` and the parameter count of the eager model."""
    import torch

    from merak_exec.capture import to_chain
    from merak_exec.parallel import materialize_layers
    from merak_exec.stages import build_stage
    from support.models import build_model

    for kind in ("gpt", "gpt2", "llama-tied"):
        eager = build_model(kind, 2)
        model = build_model(kind, 2, meta=True)
        chain, _ = to_chain(model, 8)
        whole = [range(len(chain.layers))]
        materialize_layers(chain, whole, [build_stage(chain, whole, 0, lambda g: 0)],
                           torch.device("cpu"), torch.float32)
        (i, ni), (j, nj) = chain.tied[0]
        assert chain.layers[i].get_parameter(ni) is chain.layers[j].get_parameter(nj), kind
        count = sum(p.numel() for p in model.parameters())
        assert count == sum(p.numel() for p in eager.parameters()), kind
        assert not any(p.is_meta for p in model.parameters())


@pytest.mark.parametrize("kind", ["gpt", "gpt2"])
def test_meta_layer_values_do_not_depend_on_the_layout(kind):
    """Layer 2 materialised alone (as a later pipeline rank would) equals layer 2 of
    the whole model materialised at once."""
    import torch

    from merak_exec.capture import to_chain
    from merak_exec.parallel import materialize_layers
    from merak_exec.stages import build_stage
    from support.models import build_model

    whole_chain, _ = to_chain(build_model(kind, 2, meta=True), 8)
    whole = [range(len(whole_chain.layers))]
    materialize_layers(whole_chain, whole, [build_stage(whole_chain, whole, 0, lambda g: 0)],
                       torch.device("cpu"), torch.float32)
    part_chain, _ = to_chain(build_model(kind, 2, meta=True), 8)
    split = [range(0, 2), range(2, 4)]
    torch.manual_seed(0)
    materialize_layers(part_chain, split, [build_stage(part_chain, split, 1, lambda g: g)],
                       torch.device("cpu"), torch.float32)
    a = dict(whole_chain.layers[2].named_parameters())
    b = dict(part_chain.layers[2].named_parameters())
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)
