"""Achieved-efficiency curves: what fraction of peak a kernel of a given shape reaches.

The curve is a frozen set of named parameters (:class:`Efficiency`) so a fit
(``merak-sim calibrate``, :mod:`merak_sim.calibrate`, fits it to measured runs) can set
them and a table can print them. Shapes enter through three factors:

    gemm_efficiency(m, n, k) = gemm_max * g(m) * g(n) * g(k) * W / (W + gemm_flops_half)
    g(d) = d / (d + gemm_dim_half),   W = 2 m n k (the GEMM's FLOPs)

``g`` charges thin matrices (a dimension of ``gemm_dim_half`` halves that factor: tile
quantisation and low arithmetic intensity); the W term charges GEMMs too small to fill
the device (wave quantisation / occupancy). Batched attention GEMMs (QK^T and
attention x V, with a head-dim side of 64-128) are further scaled by ``attn_factor``.
Memory-bound kernels move bytes at ``mem_bw_eff`` of the device bandwidth. Every kernel
costs ``kernel_overhead_s`` on top (the device-side gap between back-to-back kernels:
launch latency and tail, not hidden when kernels are small).

Host issue (``host_op_s``): an eager framework's host thread issues kernels
asynchronously, paying the Python, module and dispatcher cost of each operation; the
device runs them from a queue. For a long run of identical layers the queue reaches a
steady state in which one layer pass takes the longer of the device's time and the
host's issue time (a producer-consumer pipeline; the launch-bound regime that CUDA
Graphs exist to remove, NVIDIA "Getting Started with CUDA Graphs", 2019):

    pass_time = max(device_time, kernels x host_op_s)      (:meth:`Efficiency.host_bound`)

``host_op_s`` is host seconds per modelled kernel (0: never host bound). A modelled
kernel stands for a few framework operations (views, bias adds, casts and autograd
bookkeeping around each kernel), so the bound is 10-100 us: 10 us is eager PyTorch's
per-op dispatch alone, 100 us about five framework ops of 20 us each. It matters for
small models and micro-batches (vTrain's 1-8 GPU runs of 350M-1.3B models show a floor
of about 3.5 ms per layer and micro-batch whatever the hidden size and micro-batch) and
vanishes for large ones.

Default values (per GPU type, :data:`DEFAULT_EFFICIENCY`) come from published GEMM
efficiency figures, not from a fit:
- A100: cuBLAS bf16 GEMMs of 4k-8k sizes reach about 250-270 of 312 TFLOP/s (NVIDIA
  "Matrix Multiplication Background" user guide, Deep Learning Performance docs;
  Megatron-LM reports 138-163 TFLOP/s *per GPU end to end* on A100, Narayanan et al.
  SC'21 Table 1) -> gemm_max 0.82; 1k x 1k x 1k reaches about half of peak -> dim and
  FLOP half-points 64 and 0.5 GFLOP.
- H100/H200: large bf16 GEMMs 700-800 of 989 TFLOP/s (this workplace measured
  769-798 on an H200) -> gemm_max 0.78.
- V100: about 100 of 125 TFLOP/s fp16 -> 0.78. RTX 3090: consumer tensor cores run
  close to their fp32-accumulate rate -> 0.85.
- Elementwise kernels: 70-80 % of HBM bandwidth (STREAM-like copy figures).
- CPU (this machine): from its own measurement; per-op dispatch overhead of eager
  PyTorch (~10-20 us) dominates small kernels.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

__all__ = ["Efficiency", "DEFAULT_EFFICIENCY", "default_efficiency"]


@dataclass(frozen=True, slots=True)
class Efficiency:
    """Named parameters of the achieved-efficiency curve (module docstring).

    Attributes:
        gemm_max: asymptotic fraction of peak for large GEMMs.
        gemm_dim_half: a GEMM dimension of this size halves its shape factor.
        gemm_flops_half: a GEMM of this many FLOPs gets half from the occupancy factor.
        attn_factor: extra factor for the batched attention GEMMs.
        mem_bw_eff: fraction of memory bandwidth reached by memory-bound kernels.
        kernel_overhead_s: fixed device seconds per kernel (launch + tail).
        host_op_s: host seconds to issue one kernel (0: never host bound).
    """

    gemm_max: float = 0.82
    gemm_dim_half: float = 64.0
    gemm_flops_half: float = 0.5e9
    attn_factor: float = 0.7
    mem_bw_eff: float = 0.75
    kernel_overhead_s: float = 4e-6
    host_op_s: float = 0.0

    def __post_init__(self) -> None:
        strict = ("gemm_max", "attn_factor", "mem_bw_eff")
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0 or (
                    v == 0 and f.name in strict):
                need = "positive" if f.name in strict else ">= 0"
                raise ValueError(f"efficiency parameter {f.name} must be {need}, got {v!r}")
        if self.gemm_max > 1 or self.mem_bw_eff > 1:
            raise ValueError("efficiency parameters gemm_max and mem_bw_eff must be <= 1, "
                             f"got {self.gemm_max} and {self.mem_bw_eff}")

    def gemm(self, m: float, n: float, k: float) -> float:
        """Achieved fraction of peak for an (m x k) @ (k x n) GEMM."""
        dh = self.gemm_dim_half
        w = 2.0 * m * n * k
        return (self.gemm_max * (m / (m + dh)) * (n / (n + dh)) * (k / (k + dh))
                * (w / (w + self.gemm_flops_half)))

    def gemm_time(self, m: float, n: float, k: float, peak_flops: float,
                  batch: float = 1.0, attention: bool = False) -> float:
        """Seconds for ``batch`` GEMMs of (m x k) @ (k x n) at ``peak_flops``, plus one
        kernel overhead (a batched GEMM is one kernel)."""
        w = 2.0 * m * n * k * batch
        if w <= 0:
            return 0.0
        # Occupancy depends on the whole batched launch, so use the total work.
        dh = self.gemm_dim_half
        eff = (self.gemm_max * (m / (m + dh)) * (n / (n + dh)) * (k / (k + dh))
               * (w / (w + self.gemm_flops_half)))
        if attention:
            eff *= self.attn_factor
        return w / (peak_flops * eff) + self.kernel_overhead_s

    def mem_time(self, nbytes: float, bandwidth_Bps: float, kernels: int = 1) -> float:
        """Seconds for memory-bound kernels moving ``nbytes`` in total."""
        return nbytes / (bandwidth_Bps * self.mem_bw_eff) + kernels * self.kernel_overhead_s

    def host_bound(self, device_s: float, kernels: float) -> float:
        """Seconds of a pass whose kernels take ``device_s`` on the device and are
        issued by the host at ``host_op_s`` each (module docstring)."""
        return max(device_s, kernels * self.host_op_s)

    def to_dict(self) -> dict:
        """Parameter name -> value."""
        # Every field is a float: asdict's deep copy is not needed (one per table).
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def with_(self, **changes: float) -> Efficiency:
        """A copy with some parameters changed (validated)."""
        return replace(self, **changes)


#: Defaults per GPU preset name (module docstring gives the sources).
DEFAULT_EFFICIENCY: dict[str, Efficiency] = {
    "A100-40GB": Efficiency(),
    "A100-80GB": Efficiency(),
    "H100-80GB": Efficiency(gemm_max=0.78, gemm_dim_half=96.0, gemm_flops_half=1.5e9),
    "H200-141GB": Efficiency(gemm_max=0.78, gemm_dim_half=96.0, gemm_flops_half=1.5e9),
    # the same Hopper die as the H100 (its published defaults; fits are per stack)
    "GH200-96GB": Efficiency(gemm_max=0.78, gemm_dim_half=96.0, gemm_flops_half=1.5e9),
    # Blackwell: no open GEMM sweep to fit yet; the Hopper curve with the half-rate
    # point scaled by the ~2.25x dense bf16 rate (uncalibrated, stated in fidelity.md)
    **{name: Efficiency(gemm_max=0.78, gemm_dim_half=128.0, gemm_flops_half=3.4e9)
       for name in ("B200-180GB", "B300-288GB", "GB200-186GB", "GB300-288GB")},
    "V100-32GB": Efficiency(gemm_max=0.78, gemm_dim_half=48.0, gemm_flops_half=0.2e9,
                            kernel_overhead_s=5e-6),
    "RTX3090": Efficiency(gemm_max=0.85, gemm_dim_half=48.0, gemm_flops_half=0.15e9,
                          kernel_overhead_s=5e-6),
    "CPU-2core": Efficiency(gemm_max=0.8, gemm_dim_half=16.0, gemm_flops_half=2e6,
                            attn_factor=0.6, mem_bw_eff=0.5, kernel_overhead_s=15e-6),
}


_A100 = DEFAULT_EFFICIENCY["A100-80GB"]


def default_efficiency(gpu_name: str) -> Efficiency:
    """The default curve for a GPU preset (A100's for unknown GPUs)."""
    eff = DEFAULT_EFFICIENCY.get(gpu_name)
    return eff if eff is not None else _A100
