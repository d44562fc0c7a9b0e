"""Per-layer profiler: forward / backward / recompute times and activation bytes.

For each *kind* of layer in a model's chain (the embedding, one transformer block,
the head with its loss) at a given micro-batch size and sequence length, the
profiler measures on the current device (median of ``repeats`` after ``warmup``):

- ``forward_s``: forward with grad (activations kept);
- ``backward_s``: full backward of that forward;
- ``backward_input_s`` / ``backward_weight_s``: the zero-bubble halves as the runtime
  runs them (I: the input gradient plus the output gradients of every
  parameter-owning module in one pass; W: each module's local weight-gradient step);
  their sum exceeds ``backward_s`` by the cost of splitting;
- ``recompute_s``: a checkpointed forward (no-grad) plus its re-forward during
  backward minus the plain backward, i.e. what checkpointing adds;
- ``activation_bytes``: bytes of the tensors autograd saves for backward (parameters
  excluded, shared storages counted once), via
  :func:`~merak_exec.profiling.saved_tensors.saved_tensor_bytes`;
- ``checkpoint_bytes``: the layer input (what a checkpointed layer keeps);
- ``param_bytes`` and ``flops`` (2 * multiply-accumulates, counted by
  ``torch.utils.flop_counter``).

Timing: ``time.perf_counter`` around the operation on CPU; CUDA events (with a
synchronise) on GPU. :func:`write_trace` writes the profile atomically as a
``merak-trace/1`` file (:func:`merak_sim.trace.from_exec_profile`), the format the
trace-driven cost model reads; ``merak-exec profile`` profiles several shapes, merges
them and can add gloo collective timings (:mod:`merak_exec.profiling.collectives`).
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from merak_exec.profiling.saved_tensors import saved_tensor_bytes
from merak_sim.io import atomic_write_text
from merak_sim.trace import from_exec_profile

__all__ = ["LayerProfile", "Profile", "profile_chain", "write_trace", "TRACE_FORMAT"]

TRACE_FORMAT = "merak-exec-profile/1"


@dataclass(frozen=True)
class LayerProfile:
    """Measured costs of one layer kind for one micro-batch (see module docstring)."""

    name: str
    count: int
    forward_s: float
    backward_s: float
    backward_input_s: float
    backward_weight_s: float
    recompute_s: float
    activation_bytes: int
    checkpoint_bytes: int
    output_bytes: int
    param_bytes: int
    flops: int


@dataclass
class Profile:
    """A profile: the layers plus how and where they were measured."""

    layers: list[LayerProfile]
    model: dict
    micro_batch_size: int
    seq_len: int
    dtype: str
    device: str
    meta: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """Plain JSON form."""
        return {"format": TRACE_FORMAT, "model": self.model,
                "micro_batch_size": self.micro_batch_size, "seq_len": self.seq_len,
                "dtype": self.dtype, "device": self.device, "meta": self.meta,
                "layers": [asdict(lp) for lp in self.layers]}


class _Timer:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self, fn) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            return a.elapsed_time(b) / 1e3
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t


def _flops(fn) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        fn()
    return int(fc.get_total_flops())


def _time_once(timer, run, make_input, seed_grad, params, layer) -> tuple[float, ...]:
    """One sample of (forward, backward, backward-input, backward-weight,
    checkpointed forward+backward) times. I and W are timed the way the runtime runs
    them: I returns the input gradient and the output gradients of every
    parameter-owning module in one pass; W runs each module's local weight step."""
    box: dict = {}
    x = make_input()
    tf = timer(lambda: box.__setitem__("y", run(x)))
    y = box["y"]
    g = seed_grad(y)
    tb = timer(lambda: torch.autograd.backward(y, g))
    x2 = make_input()
    rec: list = []
    hooks = [m.register_forward_hook(lambda m, a, o: rec.append((m, o)))
             for m in layer.modules() if any(True for _ in m.parameters(recurse=False))]
    try:
        y2 = run(x2)
    finally:
        for h in hooks:
            h.remove()
    g2 = seed_grad(y2)
    mods = [(m, o) for m, o in rec if isinstance(o, torch.Tensor) and o.requires_grad]
    inputs = ([x2] if x2.requires_grad else []) + [o for _, o in mods]
    got: dict = {}

    def bi():
        got["g"] = torch.autograd.grad(y2, inputs, g2, retain_graph=True, allow_unused=True)

    tbi = timer(bi)
    outs = list(zip(mods, got["g"][len(inputs) - len(mods):], strict=True))

    def bw():
        for (m, o), go in outs:
            ps = [p for p in m.parameters(recurse=False) if p.requires_grad]
            if go is not None and ps:
                torch.autograd.grad(o, ps, go, retain_graph=True, allow_unused=True)

    tbw = timer(bw) if params else 0.0
    x3 = make_input()
    tr = timer(lambda: torch.autograd.backward(run(x3, ckpt=True), g2))
    return tf, tb, tbi, tbw, tr


def _profile_layer(name: str, count: int, layer: nn.Module, make_input, loss_fn, labels,
                   device, warmup: int, repeats: int) -> LayerProfile:
    timer = _Timer(device)
    params = [p for p in layer.parameters() if p.requires_grad]

    def run(x, ckpt=False):
        y = checkpoint(layer, x, use_reentrant=False) if ckpt else layer(x)
        return loss_fn(y, labels) if loss_fn is not None else y

    def seed_grad(y):
        return None if y.dim() == 0 else torch.ones_like(y)

    samples: dict[str, list[float]] = {k: [] for k in ("f", "b", "bi", "bw", "r")}
    for i in range(warmup + repeats):
        t = _time_once(timer, run, make_input, seed_grad, params, layer)
        for p in params:
            p.grad = None
        if i >= warmup:
            for k, v in zip(("f", "b", "bi", "bw", "r"), t, strict=True):
                samples[k].append(v)
    x = make_input()
    y = layer(x)
    out_bytes = y.numel() * y.element_size()
    # what one micro-batch keeps for backward, loss included for the head
    _, act_bytes = saved_tensor_bytes(lambda: run(x), layer.parameters())
    x = make_input()

    def fb():
        y = run(x)
        torch.autograd.backward(y, seed_grad(y))

    flops = _flops(fb)
    for p in params:
        p.grad = None
    med = {k: statistics.median(v) for k, v in samples.items()}
    return LayerProfile(
        name=name, count=count, forward_s=med["f"], backward_s=med["b"],
        backward_input_s=med["bi"], backward_weight_s=med["bw"],
        # what checkpointing adds to forward + backward (the re-forward, measured)
        recompute_s=max(0.0, med["r"] - med["f"] - med["b"]),
        activation_bytes=act_bytes,
        checkpoint_bytes=x.numel() * x.element_size(), output_bytes=out_bytes,
        param_bytes=sum(p.numel() * p.element_size() for p in layer.parameters()),
        flops=flops,
    )


def profile_chain(model, micro_batch_size: int, seq_len: int, *,
                  device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                  warmup: int = 2, repeats: int = 5, meta: dict | None = None) -> Profile:
    """Profile the embedding, one block and the head (+ loss) of ``model``'s chain.

    ``model`` is anything :func:`merak_exec.capture.to_chain` accepts. Blocks are
    assumed identical (the first heavy layer is measured and counted ``L`` times).
    """
    from merak_exec.capture import to_chain

    device = torch.device(device)
    chain, family = to_chain(model, seq_len=seq_len)
    heavy = chain.heavy or list(range(1, len(chain.layers) - 1))
    first, block, last = chain.layers[0], chain.layers[heavy[0]], chain.layers[-1]
    vocab = None
    for mod in first.modules():
        if isinstance(mod, nn.Embedding):
            vocab = mod.num_embeddings
            break
    if vocab is None:
        raise ValueError("profiler: the chain's first layer has no nn.Embedding to size ids")
    for layer in (first, block, last):
        layer.to(device=device, dtype=dtype)
    h = chain.hidden_size
    gen = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, vocab, (micro_batch_size, seq_len), generator=gen).to(device)
    labels = torch.randint(0, vocab, (micro_batch_size, seq_len), generator=gen).to(device)

    def hidden():
        return torch.randn(micro_batch_size, seq_len, h, device=device,
                           dtype=dtype).requires_grad_()

    rows = [
        _profile_layer("embedding", 1, first, lambda: ids, None, None, device, warmup,
                       repeats),
        _profile_layer("block", len(heavy), block, hidden, None, None, device, warmup,
                       repeats),
        _profile_layer("head", 1, last, hidden, chain.loss_fn, labels, device, warmup,
                       repeats),
    ]
    info = {"family": family, "hidden": h, "layers": len(heavy), "vocab": vocab}
    if hasattr(model, "config") and hasattr(model.config, "to_dict"):
        info["config"] = {k: v for k, v in model.config.to_dict().items()
                          if isinstance(v, (int, float, str, bool))}
    elif hasattr(model, "config"):
        info["config"] = asdict(model.config)
    m = {"torch": torch.__version__, "host": platform.node(), "python":
         platform.python_version(), "threads": torch.get_num_threads(),
         "warmup": warmup, "repeats": repeats, "statistic": "median",
         "created_unix_s": int(time.time())}
    if device.type == "cuda":
        m["gpu"] = torch.cuda.get_device_name(device)
    m.update(meta or {})
    return Profile(layers=rows, model=info, micro_batch_size=micro_batch_size,
                   seq_len=seq_len, dtype=str(dtype).replace("torch.", ""),
                   device=m.get("gpu", f"cpu ({platform.processor() or platform.machine()})"),
                   meta=m)


def write_trace(profile: Profile, path) -> None:
    """Write ``profile`` atomically as a ``merak-trace/1`` JSON file."""
    atomic_write_text(path, json.dumps(from_exec_profile(profile.to_dict()), indent=1))
