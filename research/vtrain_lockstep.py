"""DeepSpeed's 1F1B as its ``TrainSchedule`` runs it: stages in lock-step, every
exchange a blocking meeting of two neighbours. A cross-check of the evaluator, not a
second predictor.

Evidence (what the runs' engine does): DeepSpeed's ``TrainSchedule``
(``deepspeed/runtime/pipe/schedule.py``) runs ``2 (m + n - 1)`` steps on every stage of
an ``n``-stage pipeline with ``m`` micro-batches. Even stages run forwards on even
steps and backwards on odd ones, odd stages the reverse; the micro-batch of a step is
a closed formula of the step, the stage and ``n`` (:func:`step_micro_batch`), invalid
ids (outside ``0 .. m-1``) being idle steps. A forward step first receives its input
from the previous stage and sends the previous step's input gradient back to it; a
backward step first sends the previous forward's output to the next stage and
receives its own output gradient from it; then the step computes. The sends and
receives are blocking and "must be paired" (the instruction classes' own notes), so a
stage and its neighbour meet at the same step: stage g's backward step with stage
g + 1's forward step. Each step of a stage therefore starts when both it and the
neighbour it exchanges with have finished their previous steps
(:func:`lockstep_makespan`); the two transfers run one after the other, then each
computes. After the last step each stage reduces its tied and data-parallel
gradients and steps its optimizer (the first and last stage meet for the tied
embedding's all-reduce).

Pricing: the stages' forward, recompute and backward times, transfers, all-gathers and
copies of :mod:`merak_sim.costs.deepspeed_pipe` (the same cost model as the
prediction, nothing fitted). The pairing is the stricter assumption: NCCL can finish a
send smaller than its staging buffer (4 MiB by default) before the receiver arrives,
and every multi-node activation of the vTrain rows is larger.

Result (the rows of data/vtrain, with the constants fitted before
:mod:`merak_sim.costs.framework`'s Megatron kernels were priced; with the current ones
tests/test_vtrain_lockstep.py checks that it is never slower than the evaluator and
within 2 % of it):
charging two transfers at every meeting, the lock-step iteration equals the
evaluator's prediction on all 1,549 rows (to 0.01 %): the evaluator's 1F1B with the
exchange inside both ranks' compute
(:func:`merak_sim.costs.deepspeed_pipe.with_exchange`) is DeepSpeed's lock-step
schedule. Counting the tensors that really move (one at the meetings of the pipeline's
fill and drain) makes it 0-0.4 % faster on the single-node rows and 0-1.3 % on the
multi-node ones: single-node MAPE 6.99 % -> 7.00 %, multi-node 7.12 % -> 7.10 %, mean
signed error -5.39 % -> -5.60 %, tp=2 rows -16.1 % -> -16.5 %. The pairing of blocking
sends is therefore not the multi-node bias (it can only make the prediction faster),
and the over-charged transfer is at most 1.3 % of a row, so the evaluator keeps it.
"""

from __future__ import annotations

from merak_sim.costs.comm import group_ranks
from merak_sim.costs.deepspeed_pipe import FULL_COPY_BYTES, DeepSpeedPipelineModel
from merak_sim.costs.efficiency import Efficiency
from merak_sim.sim.from_config import stage_rank
from research.vtrain import PreparedRow, vtrain_cost_model

__all__ = ["lockstep_makespan", "step_micro_batch"]


def step_micro_batch(step: int, stage: int, stages: int) -> tuple[int, bool]:
    """(micro-batch id, is forward) of ``step`` on ``stage`` in DeepSpeed's
    ``TrainSchedule`` (module docstring); an id outside ``0 .. m-1`` is an idle step."""
    half = step // 2
    if (step - stage) % 2 == 0:  # same parity: a forward step
        return half - stage // 2, True
    if step % 2 == 0:  # even step, odd stage: backward
        return half - stages + (stage + 1) // 2, False
    return half - stages + 1 + stage // 2, False  # odd step, even stage: backward


def lockstep_makespan(prepared: PreparedRow, efficiency: Efficiency | None = None) -> float:
    """Iteration seconds of ``prepared`` under DeepSpeed's lock-step ``TrainSchedule``
    with blocking paired exchanges (module docstring), priced as
    :class:`~merak_sim.costs.deepspeed_pipe.DeepSpeedPipelineModel` prices them."""
    cm = vtrain_cost_model(efficiency)
    if not isinstance(cm, DeepSpeedPipelineModel):
        raise TypeError("the lock-step schedule is DeepSpeed's; the vTrain cost model must be")
    cfg, cl = prepared.config, prepared.cluster
    st = cm.base.cost_table(prepared.model, cl, cfg).stages
    n, tp, m = len(st), cfg.tp, cfg.num_microbatches
    eff = cm.base.efficiency_for(cl)
    tp_ranks = [group_ranks("tp", cfg, stage_rank(cfg, g)) for g in range(n)]

    def transfer(g: int) -> float:  # one tensor across the boundary g | g + 1
        return cm.comm("p2p", st[g].p2p_bytes / tp, (tp_ranks[g][0], tp_ranks[g + 1][0]), cl)

    def full(nbytes: float, g: int) -> float:  # one PartitionedTensor.full() on stage g
        if tp == 1:
            return 0.0
        return (cm.comm("all-gather", nbytes, tp_ranks[g], cl)
                + eff.mem_time(FULL_COPY_BYTES * nbytes, cl.gpu.mem_bandwidth_Bps, 2))

    c = prepared.recompute
    fwd = [st[g].forward_s + (full(st[g - 1].p2p_bytes, g) if g else 0.0) for g in range(n)]
    bwd = [st[g].backward_s + c[g] * st[g].recompute_s
           + (2.0 * full(st[g].p2p_bytes, g) if g < n - 1 else 0.0) for g in range(n)]

    def valid(i: int) -> bool:
        return 0 <= i < m

    ready = [0.0] * n  # when each stage finished its previous step
    last = [-1] * n  # micro-batch of each stage's previous step
    for step in range(2 * (m + n - 1)):
        now = [step_micro_batch(step, g, n) for g in range(n)]
        start = list(ready)
        for g in range(n - 1):  # g in a backward step meets g + 1 in a forward step
            (i, fw), (_, fw_next) = now[g], now[g + 1]
            if fw or not fw_next:
                continue
            moves = valid(last[g]) + valid(i)  # SendActivation(previous), RecvGrad(this)
            if moves:
                start[g] = start[g + 1] = max(ready[g], ready[g + 1]) + moves * transfer(g)
        for g, (i, fw) in enumerate(now):
            ready[g] = start[g] + ((fwd[g] if fw else bwd[g]) if valid(i) else 0.0)
            last[g] = i
    if n > 1:  # ReduceTiedGrads: the first and last stage meet
        ready[0] = ready[-1] = max(ready[0], ready[-1])
    return max(r + s.grad_allreduce_s + s.optimizer_s for r, s in zip(ready, st, strict=True))
