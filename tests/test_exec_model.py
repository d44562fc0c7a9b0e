"""The built-in GPT: shapes, tied head, causality, loss decreases."""

import pytest
import torch

from merak_exec.models import GPT, GPTConfig, lm_loss


def _tiny(**kw):
    return GPTConfig(vocab_size=97, n_positions=16, n_embd=32, n_layer=2, n_head=4, **kw)


def test_shapes_tied_head_and_param_count():
    torch.manual_seed(0)
    m = GPT(_tiny())
    ids = torch.randint(0, 97, (3, 16))
    assert m(ids).shape == (3, 16, 97)
    assert m.head.lm_head.weight is m.embed.wte.weight
    assert sum(p.numel() for p in m.parameters()) == m.config.num_params()
    assert len(m.layers()) == 2 + 2


def test_causal_future_tokens_do_not_change_past_logits():
    torch.manual_seed(0)
    m = GPT(_tiny()).eval()
    ids = torch.randint(0, 97, (1, 16))
    ids2 = ids.clone()
    ids2[0, 10:] = (ids2[0, 10:] + 1) % 97
    a, b = m(ids), m(ids2)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_layers_chain_equals_forward_and_training_reduces_loss():
    torch.manual_seed(0)
    m = GPT(_tiny())
    ids = torch.randint(0, 97, (4, 16))
    x = ids
    for layer in m.layers():
        x = layer(x)
    torch.testing.assert_close(x, m(ids))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    labels = ids  # aligned with the inputs: lm_loss shifts
    first = None
    for _ in range(20):
        loss = lm_loss(m(ids), labels)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5 * first


def test_bad_config_is_one_line_error():
    with pytest.raises(ValueError, match="n_head=5 does not divide"):
        GPTConfig(n_embd=32, n_head=5)
