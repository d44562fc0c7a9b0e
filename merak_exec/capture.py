"""Turning a user's model into a :class:`~merak_exec.stages.LayerChain`.

- The built-in GPT exposes its chain directly (:meth:`GPT.layers`).
- HuggingFace GPT2LMHeadModel and LlamaForCausalLM are viewed as chains by small
  adapters that reuse the model's own submodules (no weights are copied): the
  embedding, each decoder block, and the final norm + LM head. Values every block
  needs besides the residual stream (position ids, rotary cos/sin, the causal mask)
  are *recomputed* inside each stage from the sequence length instead of being sent
  across cuts, so only the residual stream crosses a boundary.
- Any other model whose ``forward(input_ids)`` returns logits: captured with
  ``torch.export.export(..., strict=False)`` (on the meta device if the model lives
  there, with a dynamic batch dimension), then cut by :func:`capture_export` into
  shards: everything before the first block of the model's longest ``nn.ModuleList``,
  one shard per block, everything after the last. A value needed k shards later (an
  attention mask, rotary tables, position ids) is threaded through the shards between,
  so each cut carries the residual stream plus those few broadcast values (Merak's
  automatic graph sharding, Lai et al., TPDS 2023). Parameters shared by two shards (tied
  embeddings) are listed as tied.
"""

from __future__ import annotations

import torch
from torch import nn

from merak_exec.mesh import ExecError
from merak_exec.models.gpt import lm_loss
from merak_exec.stages import LayerChain

__all__ = ["to_chain", "CaptureError"]


class CaptureError(ExecError):
    """The model could not be turned into a chain of stages."""


def to_chain(model, seq_len: int) -> tuple[LayerChain, str | None]:
    """The model as a chain plus its family name ("gpt", "gpt2", "llama" or None)."""
    if isinstance(model, LayerChain):
        return model, None
    from merak_exec.models.gpt import GPT

    if isinstance(model, GPT):
        L = model.config.n_layer
        tied = ([((0, "wte.weight"), (L + 1, "lm_head.weight"))]
                if model.config.tie_embeddings else [])
        return LayerChain(layers=model.layers(), loss_fn=lm_loss, tied=tied,
                          hidden_size=model.config.n_embd, heavy=list(range(1, L + 1)),
                          init_fn=model.init_weights), "gpt"
    name = type(model).__name__
    if name == "GPT2LMHeadModel":
        from merak_exec.hf import gpt2_chain

        return gpt2_chain(model), "gpt2"
    if name == "LlamaForCausalLM":
        from merak_exec.hf import llama_chain

        return llama_chain(model), "llama"
    return capture_export(model, seq_len), None


def _block_list(model: nn.Module) -> str:
    best, n = None, 0
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) > n:
            best, n = name, len(mod)
    if best is None:
        raise CaptureError(
            f"{type(model).__name__} has no nn.ModuleList of blocks to cut between; pass a "
            "LayerChain (a list of modules applied in sequence) or explicit split points"
        )
    return best


def _block_of(node, prefix: str) -> int | None:
    stack = node.meta.get("nn_module_stack") or {}
    for fqn, _ in stack.values():
        if fqn.startswith(prefix):
            head = fqn[len(prefix):].split(".", 1)[0]
            if head.isdigit():
                return int(head)
    return None


def capture_export(model: nn.Module, seq_len: int) -> LayerChain:
    """Capture ``model`` with torch.export and cut it into a chain of shards (see the
    module docstring). Raises :class:`CaptureError` naming the operation that failed."""
    from torch.fx.passes.split_module import split_module

    params = list(model.parameters())
    device = params[0].device if params else torch.device("cpu")
    list_name = _block_list(model)
    n_blocks = len(model.get_submodule(list_name))
    ids = torch.zeros((2, seq_len), dtype=torch.long, device=device)
    batch = torch.export.Dim("batch", min=1, max=1 << 16)
    try:
        ep = torch.export.export(model, (ids,), dynamic_shapes=({0: batch},), strict=False)
    except Exception as e:  # report the failing operation in one line
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        where = ""
        for i, ln in enumerate(lines):
            if ln.startswith("The following call raised this error"):
                where = " at " + " ".join(lines[i + 1:i + 3])[:160]
                break
        raise CaptureError(
            f"torch.export could not capture {type(model).__name__}: {type(e).__name__}: "
            f"{(lines or [''])[0][:160]}{where}; pass explicit split points or a LayerChain"
        ) from None
    gm = ep.module()
    for node in list(gm.graph.nodes):  # export's input guards: not part of the model
        if node.op == "call_module" and str(node.target).startswith("_guards") and \
                not node.users:
            gm.graph.erase_node(node)
    gm.recompile()
    prefix = list_name + "." if list_name else ""
    part: dict = {}
    cur = 0
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr", "output"):
            continue
        b = _block_of(node, prefix)
        if b is not None:
            cur = b + 1
        elif cur == n_blocks:
            cur = n_blocks + 1  # after the last block: the head
        part[node] = cur
    split = split_module(gm, gm, lambda n: part[n], keep_original_order=True)
    return _chain_from_split(split, model, seq_len, device)


class ShardLayer(nn.Module):
    """One shard of a captured graph: receives the live values at its input cut,
    returns the live values at its output cut (a tuple)."""

    def __init__(self, sub: nn.Module, in_names: list[str], arg_names: list[str],
                 result_names: list[str], out_names: list[str],
                 consts: dict[str, torch.Tensor] | None = None) -> None:
        super().__init__()
        self.sub = sub
        self.in_names, self.arg_names = in_names, arg_names
        self.result_names, self.out_names = result_names, out_names
        self.const_names = []
        for name, t in (consts or {}).items():  # parameters the splitter left outside
            if isinstance(t, nn.Parameter):
                self.register_parameter(f"const_{name}", t)
            else:
                self.register_buffer(f"const_{name}", t)
            self.const_names.append(name)

    def forward(self, *xs: torch.Tensor) -> tuple:
        """Live inputs (in ``in_names`` order) -> live outputs (``out_names`` order)."""
        env = dict(zip(self.in_names, xs, strict=True))
        for name in self.const_names:
            env[name] = getattr(self, f"const_{name}")
        res = self.sub(*[env[n] for n in self.arg_names])
        if len(self.result_names) == 1 and not isinstance(res, (tuple, list)):
            res = (res,)
        env.update(zip(self.result_names, res, strict=True))
        return tuple(env[n] for n in self.out_names)


def _chain_from_split(split, model, seq_len: int, device) -> LayerChain:
    """Walk the split graph: shard k's live-in values are those defined before it and
    used by it or any later shard; its live-out values are shard k+1's live-in."""
    calls = [n for n in split.graph.nodes if n.op == "call_module"]
    order = {n: i for i, n in enumerate(split.graph.nodes)}
    out_node = next(n for n in split.graph.nodes if n.op == "output")
    # values produced per shard: the call itself (one output) or its getitem users
    produced = {}
    for c in calls:
        gets = [u for u in c.users if u.op == "call_function" and
                getattr(u.target, "__name__", "") == "getitem"]
        produced[c] = gets if gets and len(gets) == len(c.users) else [c]
    values = [n for n in split.graph.nodes if n.op == "placeholder"]
    first_use = {}
    last_use = {}
    for n in split.graph.nodes:
        for a in n.all_input_nodes:
            last_use[a] = max(last_use.get(a, -1), order[n])
            first_use.setdefault(a, order[n])
    leaves = [a for a in _flatten(out_node.args[0])]
    if not leaves:
        raise CaptureError("the captured model returns no tensor; forward(ids) must return "
                           "logits")
    logits = leaves[0]

    def live_at(i_call: int) -> list[str]:
        pos = order[calls[i_call]]
        defined = [v for v in values if order[v] < pos] + [
            g for c in calls[:i_call] for g in produced[c]]
        return [v.name for v in defined if last_use.get(v, -1) >= pos]

    layers = []
    for i, c in enumerate(calls):
        in_names = live_at(i)
        out_names = live_at(i + 1) if i + 1 < len(calls) else [logits.name]
        consts = {a.name: _get_attr(split, a.target) for a in c.args if a.op == "get_attr"}
        layers.append(ShardLayer(getattr(split, c.target), in_names,
                                 [a.name for a in c.args], [g.name for g in produced[c]],
                                 out_names, consts))
    # tied parameters: the same tensor in two shards
    seen: dict = {}
    tied = []
    for i, layer in enumerate(layers):
        for name, p in layer.named_parameters(remove_duplicate=False):
            if id(p) in seen and seen[id(p)][0] != i:
                tied.append((seen[id(p)], (i, name)))
            else:
                seen.setdefault(id(p), (i, name))
    # boundary shapes: run the shards once on meta tensors of batch 1 ("batch" marks it)
    boundaries = _trace_boundaries(layers, seq_len, device)
    hidden = next((s[-1] for spec in boundaries for s, dt in spec if dt.is_floating_point
                   and len(s) == 3 and s[0] == "batch"), 0)
    heavy = list(range(1, len(layers) - 1)) if len(layers) > 2 else list(range(len(layers)))
    return LayerChain(layers=layers, loss_fn=lm_loss, tied=tied, hidden_size=hidden,
                      heavy=heavy, boundaries=boundaries, materialize=_generic_init(model))


def _get_attr(root: nn.Module, target: str):
    obj = root
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _flatten(x):
    if isinstance(x, (tuple, list)):
        for y in x:
            yield from _flatten(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _flatten(y)
    elif x is not None:
        yield x


def _trace_boundaries(layers, seq_len: int, device) -> list:
    """(shape, dtype) of every value leaving each shard, found by running the shards on
    batches of 1 and 2 (on the meta device when the model lives there): a dimension
    that changes with the batch is recorded as "batch"."""
    runs = []
    with torch.no_grad():
        for b in (1, 2):
            xs = (torch.zeros((b, seq_len), dtype=torch.long, device=device),)
            shapes = []
            for layer in layers:
                xs = layer(*xs)
                shapes.append([(tuple(t.shape), t.dtype) for t in xs])
            runs.append(shapes)
    out = []
    for one, two in zip(*runs, strict=True):
        spec = []
        for (s1, dt), (s2, _) in zip(one, two, strict=True):
            spec.append((tuple("batch" if d1 != d2 else d1 for d1, d2 in
                               zip(s1, s2, strict=True)), dt))
        out.append(spec)
    return out


def _generic_init(model: nn.Module):
    """Initialiser for shards of a meta-device model. Shards share the original
    model's Parameter objects, so each meta parameter is traced back to the module
    that owns it there; that module's ``reset_parameters`` (run on a real copy) gives
    its values. Parameters with no owner (copies made when untying) or owners without
    ``reset_parameters`` get ones (1-D weights), zeros (biases) or N(0, 0.02)."""
    origin = {}
    for mod in model.modules():
        for name, p in mod.named_parameters(recurse=False):
            origin.setdefault(id(p), (mod, name))
    done: dict = {}

    def materialize(stage: nn.Module, device, dtype) -> None:
        for mod in stage.modules():
            for name, p in list(mod.named_parameters(recurse=False)):
                if not p.is_meta:
                    continue
                if id(p) not in done:
                    done[id(p)] = nn.Parameter(_init_like(origin.get(id(p)), name, p,
                                                          device).to(dtype))
                setattr(mod, name, done[id(p)])
            if isinstance(mod, torch.fx.GraphModule):
                _retarget_device(mod, device)
            for name, b in list(mod.named_buffers(recurse=False)):
                if b.is_meta:
                    raise CaptureError(
                        f"buffer {name!r} of a meta-device model cannot be materialised "
                        "generically; build the model on the CPU, or use a supported family"
                    )
        stage.to(device=device, dtype=dtype)

    return materialize


def _retarget_device(gm: torch.fx.GraphModule, device) -> None:
    """Export on the meta device bakes ``device=meta`` into factory calls (arange,
    full, tensor-metadata asserts): point them at the real device."""
    changed = False
    for node in gm.graph.nodes:
        dev = node.kwargs.get("device")
        if dev is not None and torch.device(dev).type == "meta":
            node.kwargs = {**node.kwargs, "device": torch.device(device)}
            changed = True
    if changed:
        gm.recompile()


def _init_like(owner, name: str, p: torch.Tensor, device) -> torch.Tensor:
    import copy

    if owner is not None and hasattr(owner[0], "reset_parameters"):
        tmp = copy.deepcopy(owner[0])
        tmp.to_empty(device=device, recurse=False)
        with torch.no_grad():
            tmp.reset_parameters()
        return getattr(tmp, owner[1]).detach()
    t = torch.empty(p.shape, dtype=p.dtype, device=device)
    with torch.no_grad():
        if "bias" in name:
            return t.zero_()
        if p.dim() == 1:
            return t.fill_(1.0)
        return t.normal_(0.0, 0.02)
