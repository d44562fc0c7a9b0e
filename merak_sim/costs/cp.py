"""Context-parallel communication variants: volumes, overlap and working memory.

``ParallelConfig.cp_comm`` picks how the cp ranks of a sequence exchange keys and values
(Megatron-core's ``--cp-comm-type`` p2p / all_gather / a2a / a2a+p2p, implemented in
Transformer Engine's ``attention`` context-parallel functions). Notation, per GPU and per
layer pass: ``kv`` = bytes of its local K and V block, 2 b (s/cp) kv_dim/tp e (the
``cp_kv_bytes`` of :mod:`merak_sim.costs.layers`); ``q`` = bytes of its local queries
(and of the attention output), b (s/cp) q_dim/tp e.

- ``ring`` (default; Liu et al., Ring Attention, arXiv:2310.01889; Megatron "p2p"):
  :mod:`merak_sim.costs.ring`, unchanged: cp - 1 neighbour exchanges of kv forward and
  of 2 kv backward, each hidden behind one step's attention (1/cp of the pass).
- ``all-gather`` (Llama 3, Dubey et al. arXiv:2407.21783 sec. 3.3.2: "all-gather the K
  and V tensors, then compute attention output for the local Q chunk"): forward one
  all-gather of the cp kv blocks; backward the all-gather again and a reduce-scatter of
  their gradients. Each GPU sends (cp-1) kv forward and 2 (cp-1) kv backward, as the
  ring does, but the attention waits for the gathered keys: exposed = total. Working
  memory: the gathered K/V and their gradient, 2 cp kv, held one layer at a time.
- ``a2a`` (DeepSpeed-Ulysses, Jacobs et al. arXiv:2309.14509): an all-to-all turns the
  sequence split into a head split before attention (q + kv bytes) and one turns the
  output back (q); backward the same for the gradients. Each GPU sends (cp-1)/cp of
  (2 q + kv) per pass, on the critical path (exposed = total). Needs the query and the
  key/value heads of a TP rank divisible by cp. Working memory: the receive buffers,
  2 q + kv.
- ``a2a+ring`` (Megatron a2a+p2p with hierarchical cp sizes; USP, Fang and Zhao
  arXiv:2405.07719): all-to-all inside inner groups of ``a`` consecutive cp ranks (the
  largest divisor of cp, 1 < a < cp, that divides the TP rank's heads and keeps the
  inner group in one NVLink domain), then a ring over the cp/a groups; after the
  all-to-all a GPU holds s/(cp/a) tokens of 1/a of the heads, so the ring block is
  again kv bytes, cp/a - 1 exchanges hidden behind 1/(cp/a) of the attention each.
  Working memory: the all-to-all buffers (2 q + kv) and the ring's receive block (kv).

Attention compute is the same in all four (every query meets every key once; the cost
model keeps its per-variant kernel count as the ring's, a small overstatement for a2a).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from merak_sim.config import CP_COMMS
from merak_sim.costs.moe import a2a_time
from merak_sim.costs.ring import RingPass, ring_pass
from merak_sim.layout import RankLayout

__all__ = ["CP_COMMS", "cp_pass", "check_cp_comm", "inner_a2a_size",
           "cp_volumes", "cp_notes"]

Comm = Callable[[str, float, tuple[int, ...], Any], float]


def _heads_per_rank(model: Any, tp: int) -> tuple[int, int]:
    """(query heads, key/value heads) one GPU of a TP group of ``tp`` holds."""
    return model.heads // tp, max(model.kv_heads // tp, 1)


def inner_a2a_size(model: Any, config: Any, cluster: Any = None, pp_rank: int = 0) -> int:
    """The all-to-all group size ``a`` of a2a+ring (module docstring); 0 if none fits."""
    cp = config.cp
    qh, kvh = _heads_per_rank(model, config.tp)
    grp = None
    if cluster is not None:
        lay = RankLayout.of(config)
        grp = lay.group("cp", lay.rank(pp_rank))
    for a in range(cp - 1, 1, -1):
        if cp % a or qh % a or kvh % a:
            continue
        if grp is not None and any(cluster.domain_of(grp[i]) != cluster.domain_of(grp[i - i % a])
                                   for i in range(cp)):
            continue
        return a
    return 0


def check_cp_comm(model: Any, config: Any) -> None:
    """Raise a one-line ValueError if ``config.cp_comm`` cannot split ``model``'s
    attention over ``config.cp`` ranks (module docstring)."""
    kind, cp = getattr(config, "cp_comm", "ring"), config.cp
    if cp == 1 or kind in ("ring", "all-gather"):
        return
    qh, kvh = _heads_per_rank(model, config.tp)
    if kind == "a2a" and (qh % cp or kvh % cp):
        raise ValueError(f"cp-comm a2a splits heads over cp={cp}: a TP rank holds {qh} "
                         f"query and {kvh} key/value heads; choose cp dividing both, or "
                         "--cp-comm ring / all-gather / a2a+ring")
    if kind == "a2a+ring" and not inner_a2a_size(model, config):
        raise ValueError(f"cp-comm a2a+ring needs a divisor a of cp={cp} with 1 < a < cp "
                         f"dividing a TP rank's {qh} query and {kvh} key/value heads; "
                         "choose --cp-comm ring, all-gather or a2a")


def cp_volumes(kind: str, cp: int, q: float, kv: float, a: int = 0) -> tuple[float, float]:
    """Bytes one GPU sends per layer, (forward, backward), for variant ``kind`` with
    local query bytes ``q`` and K/V bytes ``kv`` (module docstring; ``a``: a2a+ring's
    inner group)."""
    if cp <= 1:
        return 0.0, 0.0
    if kind == "ring":
        return (cp - 1) * kv, 2 * (cp - 1) * kv
    if kind == "all-gather":
        return (cp - 1) * kv, 2 * (cp - 1) * kv
    if kind == "a2a":
        v = (cp - 1) / cp * (2 * q + kv)
        return v, v
    if kind == "a2a+ring":
        r = cp // a
        v = (a - 1) / a * (2 * q + kv)
        return v + (r - 1) * kv, v + 2 * (r - 1) * kv
    raise ValueError(f"unknown cp-comm {kind!r}; choose one of: {', '.join(CP_COMMS)}")


def cp_pass(comm: Comm, cluster: Any, config: Any, pp_rank: int, model: Any,
            kv_bytes: float, attn_fwd_s: float, attn_bwd_s: float) -> RingPass:
    """The context-parallel exchanges of one layer pass on pipeline rank ``pp_rank``
    under ``config.cp_comm`` (module docstring); ring is :func:`ring_pass`'s figure."""
    kind = getattr(config, "cp_comm", "ring")
    if kind == "ring" or config.cp == 1 or kv_bytes <= 0:
        return ring_pass(comm, cluster, config, pp_rank, kv_bytes, attn_fwd_s, attn_bwd_s)
    cp = config.cp
    lay = RankLayout.of(config)
    grp = lay.group("cp", lay.rank(pp_rank))
    q = kv_bytes / 2 * (model.q_dim / config.tp) / model.kv_dim_per_rank(config.tp)
    if kind == "all-gather":
        f = comm("all-gather", cp * kv_bytes, grp, cluster)
        b = f + comm("reduce-scatter", cp * kv_bytes, grp, cluster)
        vf, vb = cp_volumes(kind, cp, q, kv_bytes)
        return RingPass(f, f, b, b, vf, vb, 2 * cp * kv_bytes)
    if kind == "a2a":
        t = a2a_time(q + kv_bytes, grp, cluster) + a2a_time(q, grp, cluster)
        vf, vb = cp_volumes(kind, cp, q, kv_bytes)
        return RingPass(t, t, t, t, vf, vb, 2 * q + kv_bytes)
    a = inner_a2a_size(model, config, cluster, pp_rank) or inner_a2a_size(model, config)
    if not a:
        raise ValueError(f"cp-comm a2a+ring finds no inner all-to-all group in cp={cp}")
    inner = tuple(grp[:a])
    t_a2a = a2a_time(q + kv_bytes, inner, cluster) + a2a_time(q, inner, cluster)
    r = cp // a
    ring_ranks = [tuple(grp[j + i * a] for i in range(r)) for j in range(a)]
    pairs = {(rr[i], rr[(i + 1) % r]) for rr in ring_ranks for i in range(r)}
    tf = max(comm("p2p", kv_bytes, pr, cluster) for pr in pairs)
    tb = max(comm("p2p", 2 * kv_bytes, pr, cluster) for pr in pairs)
    ef = t_a2a + (r - 1) * max(0.0, tf - attn_fwd_s / r)
    eb = t_a2a + (r - 1) * max(0.0, tb - attn_bwd_s / r)
    vf, vb = cp_volumes(kind, cp, q, kv_bytes, a)
    return RingPass(t_a2a + (r - 1) * tf, ef, t_a2a + (r - 1) * tb, eb, vf, vb,
                  2 * q + 2 * kv_bytes)


def cp_notes(model: Any, cluster: Any, config: Any, kv_bytes: float) -> tuple[str, ...]:
    """One cost-table note naming the context-parallel variant and its bytes per layer
    (empty without context parallelism)."""
    cp, kind = config.cp, getattr(config, "cp_comm", "ring")
    if cp == 1 or kv_bytes <= 0:
        return ()
    q = kv_bytes / 2 * (model.q_dim / config.tp) / model.kv_dim_per_rank(config.tp)
    a = inner_a2a_size(model, config, cluster) if kind == "a2a+ring" else 0
    vf, vb = cp_volumes(kind, cp, q, kv_bytes, a)
    how = {"ring": f"ring attention, {cp - 1} K/V exchanges hidden behind attention steps",
           "all-gather": "all-gather of K/V (Llama 3), exposed",
           "a2a": "Ulysses all-to-alls of Q/K/V and output, exposed",
           "a2a+ring": f"all-to-all inside groups of {a}, ring over {cp // max(a, 1)}"}[kind]
    return (f"context parallelism: cp={cp} {kind} ({how}); per GPU and layer "
            f"{vf / 1e6:.1f} MB sent forward, {vb / 1e6:.1f} MB backward "
            "(merak_sim.costs.cp)",)
