"""MoE model shapes: parameter and FLOP formulas, presets against published counts,
one-line refusals (merak_sim.moe, ModelSpec.moe)."""

import pytest

from merak_sim.model import ModelSpec, ModelSpecError, get_model
from merak_sim.moe import MoESpec, busiest_load, moe_layer_count

MOE_PRESETS = ("qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-120b", "mixtral-8x7b",
               "mixtral-8x22b", "deepseek-v3")


def _tiny(**moe):
    spec = dict(experts=4, top_k=2, expert_ffn=32) | moe
    return ModelSpec(name="t", family="llama", layers=3, hidden=16, heads=2, seq_len=8,
                     vocab=64, ffn_hidden=48, moe=MoESpec(**spec))


def test_tiny_params_by_hand():
    m = _tiny(shared_experts=1, shared_ffn=8, dense_layers=1)
    h, V = 16, 64
    attn = 4 * h * h
    dense = attn + 3 * h * 48 + 2 * h
    moe = attn + h * 4 + 4 * 3 * h * 32 + 3 * h * 8 + 2 * h
    emb_head = V * h + h + V * h
    assert m.total_params() == dense + 2 * moe + emb_head
    active = attn + h * 4 + 2 * 3 * h * 32 + 3 * h * 8 + 2 * h
    assert m.active_params() == dense + 2 * active + emb_head
    assert moe_layer_count(m) == 2


def test_tiny_flops_count_active_parameters():
    m = _tiny()
    b, s, h = 2, 8, 16
    t = b * s
    attn = 2 * t * h * 3 * h + 4 * b * s * s * h + 2 * t * h * h
    mlp = 2 * t * (h * 4 + 2 * 3 * h * 32)
    head = 2 * t * h * 64
    assert m.forward_flops(b) == pytest.approx(3 * (attn + mlp) + head)
    assert m.training_flops(b) == pytest.approx(3 * m.forward_flops(b))


def test_head_size_widens_queries():
    dense = ModelSpec(name="d", family="llama", layers=1, hidden=16, heads=2, seq_len=8,
                      vocab=64, ffn_hidden=48)
    wide = dense.with_(head_size=16)
    assert wide.q_dim == 32 and dense.q_dim == 16
    # q and o projections double (16 x 16 -> 16 x 32 each); K and V are head-wide.
    assert wide.layer_params() - dense.layer_params() == 2 * 16 * 16 + 2 * 16 * 16


@pytest.mark.parametrize("name", MOE_PRESETS)
def test_presets_match_published_counts(name):
    m = get_model(name)
    assert m.total_params() == pytest.approx(m.extra["published_params"], rel=0.01)
    active = m.active_params()
    if name == "gpt-oss-120b":
        # The model card's 5.13B active leaves out the input embedding (V x h).
        active -= m.vocab * m.hidden
    # DeepSeek-V3: MLA modelled as MHA adds 1.1B (the preset's source says so).
    tol = 0.05 if name == "deepseek-v3" else 0.02
    assert active == pytest.approx(m.extra["published_active_params"], rel=tol)


def test_mixtral_8x7b_by_hand():
    m = get_model("mixtral-8x7b")
    h, f, L = 4096, 14336, 32
    attn = h * (4096 + 2 * 1024) + 4096 * h
    layer_total = attn + h * 8 + 8 * 3 * h * f + 2 * h
    assert m.total_params() == L * layer_total + 2 * 32000 * h + h


@pytest.mark.parametrize("bad,msg", [
    (dict(top_k=5), "top_k 5 exceeds the 4 experts"),
    (dict(capacity_factor=0.5), "capacity_factor must be 0"),
    (dict(imbalance=0.9), "imbalance"),
    (dict(router="hash"), "router 'hash' unknown"),
    (dict(experts=0), "experts must be a positive integer"),
])
def test_bad_moe_is_one_line(bad, msg):
    with pytest.raises(ModelSpecError, match=msg) as e:
        ModelSpec(
            name="t", family="llama", layers=2, hidden=16, heads=2, seq_len=8, vocab=64,
            moe=dict(experts=4, top_k=2, expert_ffn=32) | bad)
    assert "\n" not in str(e.value)


def test_dense_layers_must_leave_moe_layers():
    with pytest.raises(ModelSpecError, match="leaves no MoE layer"):
        _tiny(dense_layers=3)


def test_json_round_trip_and_dense_keys_unchanged():
    m = get_model("deepseek-v3")
    back = ModelSpec.from_json(m.to_dict())
    assert back == m and back.moe.dense_layers == 3
    assert "moe" not in get_model("llama3-8b").to_dict()
    assert "head_size" not in get_model("llama3-8b").to_dict()


def test_busiest_load_capped_by_capacity():
    assert busiest_load(MoESpec(experts=4, top_k=1, expert_ffn=8, imbalance=1.5)) == 1.5
    assert busiest_load(MoESpec(experts=4, top_k=1, expert_ffn=8, imbalance=1.5,
                                capacity_factor=1.25)) == 1.25
