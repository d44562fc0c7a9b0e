"""Tiny models, data and a single-process reference run for the multi-process tests."""

from __future__ import annotations

import torch

__all__ = ["tiny_gpt_config", "data", "RecordingSGD", "CustomLM", "build_model",
           "reference_run"]


def tiny_gpt_config(n_layer: int = 4):
    """A GPT small enough for 2-4 CPU processes."""
    from merak_exec.models import GPTConfig

    return GPTConfig(vocab_size=64, n_positions=8, n_embd=16, n_layer=n_layer, n_head=4,
                     dropout=0.0)


def data(cfg_model, global_batch: int, seq: int, steps: int, seed: int = 1):
    """Deterministic token batches ``[(ids, labels)] * steps`` (labels = ids: the loss
    shifts them)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        ids = torch.randint(0, cfg_model.vocab_size, (global_batch, seq + 1), generator=g)
        ids = ids[:, :-1].contiguous()
        out.append((ids, ids.clone()))
    return out


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps a copy of the gradients it last applied (for comparisons)."""

    def step(self, closure=None):  # noqa: D102 - documented by the class
        self.last_grads = [None if p.grad is None else p.grad.detach().clone()
                           for g in self.param_groups for p in g["params"]]
        return super().step(closure)


class CustomLM(torch.nn.Module):
    """A model no adapter knows (captured by torch.export): embedding, blocks that take
    the residual stream *and* a broadcast mask computed once up front, tied head."""

    def __init__(self, vocab: int = 64, h: int = 16, n_layer: int = 4) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, h)
        self.layers = torch.nn.ModuleList(_CustomBlock(h) for _ in range(n_layer))
        self.norm = torch.nn.LayerNorm(h)
        self.head = torch.nn.Linear(h, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids -> logits."""
        x = self.emb(ids)
        pos = torch.arange(ids.shape[1], device=ids.device, dtype=x.dtype)
        gate = torch.sigmoid(pos / ids.shape[1])[None, :, None]
        for blk in self.layers:
            x = blk(x, gate)
        return self.head(self.norm(x))


class _CustomBlock(torch.nn.Module):
    def __init__(self, h: int) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(h)
        self.fc1 = torch.nn.Linear(h, 2 * h)
        self.fc2 = torch.nn.Linear(2 * h, h)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return x + gate * self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))


def build_model(kind: str, n_layer: int = 4, meta: bool = False):
    """A tiny model of the given family ("gpt", "gpt2", "llama", "llama-tied" with tied
    embeddings, "custom"), seeded identically; on the meta device if ``meta``."""
    torch.manual_seed(0)
    if meta:
        with torch.device("meta"):
            return build_model(kind, n_layer)
    if kind == "custom":
        return CustomLM(n_layer=n_layer)
    if kind == "gpt":
        from merak_exec.models import GPT

        return GPT(tiny_gpt_config(n_layer))
    import transformers

    transformers.logging.set_verbosity_error()
    if kind == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=8, n_embd=16,
                                          n_layer=n_layer, n_head=4, resid_pdrop=0.0,
                                          embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                          eos_token_id=0))
    if kind in ("llama", "llama-tied"):
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16,
                                            intermediate_size=32, num_hidden_layers=n_layer,
                                            num_attention_heads=4, num_key_value_heads=2,
                                            max_position_embeddings=8, bos_token_id=0,
                                            eos_token_id=0, pad_token_id=0,
                                            tie_word_embeddings=kind == "llama-tied"))
    raise ValueError(f"unknown test model {kind!r}")


def reference_run(kind: str, n_layer: int, batches, pc, lr: float = 0.1,
                  meta: bool = False):
    """Single-process training with the same model, data and loss scaling: returns
    (losses, chain, grads of the last step keyed by parameter id). A ``meta`` model is
    materialised whole, as one stage, by the backend's own materialisation."""
    from merak_exec.capture import to_chain
    from merak_exec.parallel import materialize_layers
    from merak_exec.stages import build_stage

    model = build_model(kind, n_layer, meta)
    seq = batches[0][0].shape[1]
    chain, _ = to_chain(model, seq)
    if meta:
        whole = [range(len(chain.layers))]
        materialize_layers(chain, whole, [build_stage(chain, whole, 0, lambda g: 0)],
                           torch.device("cpu"), torch.float32)
    opt = RecordingSGD(model.parameters(), lr=lr)
    n_mb = pc.global_batch_size // pc.micro_batch_size
    losses = []
    for ids, labels in batches:
        total = 0.0
        mbs = pc.micro_batch_size
        for x, y in zip(ids.split(mbs), labels.split(mbs), strict=True):
            xs = (x,)
            for layer in chain.layers:
                out = layer(*xs)
                xs = out if isinstance(out, tuple) else (out,)
            loss = chain.loss_fn(xs[0], y)
            (loss / n_mb).backward()
            total += loss.item() / n_mb
        losses.append(total)
        opt.step()
        opt.zero_grad()
    grads = {id(p): g for p, g in zip(model.parameters(), opt.last_grads, strict=True)}
    return losses, chain, grads
