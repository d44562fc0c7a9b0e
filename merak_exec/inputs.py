"""Input checks of the Python API, made before any work (HuggingFace's rules where it
has them): each refusal is one :class:`~merak_exec.mesh.ExecError` line naming the
field, sample or number and the fix.

- :func:`argument_problems`: TrainingArguments ranges (:data:`ARGUMENT_RANGES`:
  warmup_ratio in [0, 1], save_total_limit >= 0 or None, a finite learning rate up to
  :data:`LEARNING_RATE_MAX`, ...).
- :func:`sample_tensors`: one dataset item as (input_ids, labels, attention_mask):
  a dict with input_ids (or an (ids, labels) pair), 1-D integer, non-empty.
- :func:`check_inputs`: model and dataset types, output paths (the one checker,
  :func:`merak_sim.io.check_output_path`), before torch.distributed starts.
- :func:`check_model_fits`: sequence length against the position table, shape
  against tp, memory and CPU time (:func:`merak_exec.builders.check_resources`).
- :func:`check_first_batch`: token ids against the vocabulary, a label to learn in
  every micro-batch.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping

import torch

from merak_exec.mesh import ExecError
from merak_exec.optim import SCHEDULES

__all__ = ["LEARNING_RATE_MAX", "ARGUMENT_RANGES", "argument_problems", "sample_tensors",
           "check_inputs", "check_model_fits", "check_first_batch", "vocab_size"]

#: The largest learning rate accepted: AdamW moves every weight by about the learning
#: rate per step, so anything above 1 diverges (to inf, then NaN) within a few steps.
LEARNING_RATE_MAX = 1.0

def _int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


def _path(v) -> bool:
    return isinstance(v, (str, os.PathLike)) and str(v) != ""


_COUNT = (lambda v: _int(v) and v >= 1, "an integer >= 1")
_EVERY = (lambda v: _int(v) and v >= 0, "an integer >= 0 (0: never)")
_FLAG = (lambda v: isinstance(v, bool), "True or False")
_UNIT = (lambda v: _real(v) and 0 <= v < 1, "a number in [0, 1)")
#: field -> (accepts the value, what it must be): HuggingFace's ranges and AdamW's
ARGUMENT_RANGES = {
    "output_dir": (_path, "a directory path"),
    "per_device_train_batch_size": _COUNT, "gradient_accumulation_steps": _COUNT,
    "max_steps": (lambda v: _int(v) and (v == -1 or v >= 1),
                  "-1 (run num_train_epochs) or an integer >= 1"),
    "num_train_epochs": (lambda v: _real(v) and v > 0, "a finite number > 0"),
    "learning_rate": (lambda v: _real(v) and 0 < v <= LEARNING_RATE_MAX,
                      f"a finite number in (0, {LEARNING_RATE_MAX:g}]: AdamW moves each "
                      "weight by about this much per step"),
    "weight_decay": (lambda v: _real(v) and v >= 0, "a finite number >= 0"),
    "adam_beta1": _UNIT, "adam_beta2": _UNIT,
    "adam_epsilon": (lambda v: _real(v) and v >= 0, "a finite number >= 0"),
    "max_grad_norm": (lambda v: v is None or _real(v) and v >= 0,
                      "None or a finite number >= 0 (0 or None: no clipping)"),
    "lr_scheduler_type": (lambda v: isinstance(v, str) and v in SCHEDULES,
                          "one of " + ", ".join(SCHEDULES)),
    "warmup_steps": (lambda v: _int(v) and v >= 0, "an integer >= 0"),
    "warmup_ratio": (lambda v: _real(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "bf16": _FLAG, "fp16": _FLAG, "gradient_checkpointing": _FLAG,
    "seed": (_int, "an integer"),
    "logging_steps": _EVERY, "save_steps": _EVERY,
    "save_total_limit": (lambda v: v is None or _int(v) and v >= 0,
                         "None or an integer >= 0 (None or 0: keep every checkpoint)"),
    "eval_steps": (lambda v: v is None or _int(v) and v >= 1, "None or an integer >= 1"),
    "seq_len": (lambda v: v is None or _int(v) and v >= 1, "None or an integer >= 1"),
    "pad_token_id": (lambda v: _int(v) and v >= 0, "an integer >= 0"),
    "resume_from_checkpoint": (lambda v: v is None or isinstance(v, bool) or _path(v),
                               "None, True or a checkpoint directory"),
    "split_points": (lambda v: v is None or isinstance(v, (list, tuple))
                     and all(_int(x) for x in v), "None or a list of layer indices"),
    "trace_path": (lambda v: v is None or _path(v), "None or a file path"),
    "extra": (lambda v: isinstance(v, dict), "a dict"),
}


def argument_problems(a) -> list[str]:
    """Each field whose value is outside :data:`ARGUMENT_RANGES`, as "name=value must be
    ..."."""
    out = []
    for name, (ok, what) in ARGUMENT_RANGES.items():
        v = getattr(a, name)
        if not ok(v):
            out.append(f"{name}={v!r} must be {what}")
    return out




def _tensor(i: int, what: str, value) -> torch.Tensor:
    """``value`` as a 1-D integer tensor, or one line naming sample ``i`` and ``what``."""
    try:
        t = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        raise ExecError(f"sample {i}: {what} is a {type(value).__name__} that is not a list "
                        "of token ids; give a 1-D list or tensor of integers") from None
    if t.numel() == 0:
        raise ExecError(f"sample {i}: {what} is empty; drop empty samples from the dataset")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ExecError(f"sample {i}: {what} has dtype {t.dtype}; give integer token ids "
                        "(torch.long)")
    if t.dim() != 1:
        raise ExecError(f"sample {i}: {what} has shape {tuple(t.shape)}; give one 1-D "
                        "sequence per item (drop the batch dimension: ids[0])")
    return t


def sample_tensors(sample, i: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(input_ids, labels, attention_mask) of item ``i``; labels default to input_ids.
    A malformed item (not a dict with input_ids or an (ids, labels) pair; ids not a
    non-empty 1-D integer sequence; negative ids) is one line naming it."""
    if isinstance(sample, Mapping):
        if "input_ids" not in sample:
            raise ExecError(f"sample {i} has no 'input_ids' (keys: {sorted(map(str, sample))})"
                            "; each item must be a dict with input_ids (labels and "
                            "attention_mask optional)")
        raw_labels, raw_mask = sample.get("labels"), sample.get("attention_mask")
        ids = _tensor(i, "input_ids", sample["input_ids"])
    elif isinstance(sample, (tuple, list)) and len(sample) == 2:
        ids, raw_labels, raw_mask = _tensor(i, "input_ids", sample[0]), sample[1], None
    else:
        raise ExecError(f"sample {i} is a {type(sample).__name__}; each item must be a dict "
                        "with input_ids (labels, attention_mask optional) or an (input_ids, "
                        "labels) pair")
    if int(ids.min()) < 0:
        raise ExecError(f"sample {i}: input_ids has a negative id {int(ids.min())}; token "
                        "ids are >= 0")
    labels = ids if raw_labels is None else _tensor(i, "labels", raw_labels)
    if raw_labels is not None and bool(((labels < 0) & (labels != -100)).any()):
        raise ExecError(f"sample {i}: labels has a negative value other than -100 (the "
                        "ignored label)")
    mask = None if raw_mask is None else _tensor(i, "attention_mask", raw_mask)
    if mask is not None and (mask.shape != ids.shape or bool(((mask != 0) & (mask != 1)).any())):
        raise ExecError(f"sample {i}: attention_mask must be 0s and 1s, one per input id")
    return ids, labels, mask




def check_inputs(model, args, dataset, eval_dataset) -> None:
    """What can be refused before torch.distributed starts: the arguments, the model
    and dataset types, and every output path (written only after training steps)."""
    from torch import nn

    from merak_exec.stages import LayerChain
    from merak_sim.io import OutputPathError, check_output_path

    if eval_dataset is not None and not (hasattr(eval_dataset, "__len__") and
                                         hasattr(eval_dataset, "__getitem__")):
        raise ExecError(f"eval_dataset must be indexable with a length, got a "
                        f"{type(eval_dataset).__name__}; materialise it, e.g. list(...)")
    if not isinstance(model, (nn.Module, LayerChain)):
        raise ExecError(f"model must be a torch.nn.Module (e.g. a HuggingFace "
                        f"GPT2LMHeadModel), got {type(model).__name__}")
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise ExecError(f"train_dataset must be indexable with a length (a list, a torch "
                        f"map-style Dataset or a HuggingFace Dataset), got a "
                        f"{type(dataset).__name__}; materialise it, e.g. list(...)")
    if len(dataset) == 0:
        raise ExecError("train_dataset is empty")
    outputs = [("output_dir", args.output_dir, True)] if args.save_steps else []
    if args.trace_path:
        outputs.append(("trace_path", args.trace_path, False))
    for name, path, folder in outputs:
        try:
            check_output_path(path, folder=folder)
        except OutputPathError as e:
            raise ExecError(f"TrainingArguments.{name} {e}") from None


def _positions(model) -> int | None:
    """The learned position table's size (GPT-2 style models), None if unbounded."""
    n = getattr(getattr(model, "config", None), "n_positions", None)
    return n if isinstance(n, int) else None


def vocab_size(model) -> int | None:
    """The model's vocabulary size from its config (None if it has none)."""
    n = getattr(getattr(model, "config", None), "vocab_size", None)
    return n if isinstance(n, int) else None


def check_model_fits(model, config, seq: int, device) -> None:
    """Sequence length against the position table, the model's shape against tp, and
    its memory and CPU time against this rank (:func:`check_resources`)."""
    from merak_exec.builders import check_resources, check_shape, parameter_count, spec_of

    positions = _positions(model)
    if positions is not None and seq > positions:
        raise ExecError(f"sequence length {seq} exceeds the model's {positions} positions "
                        "(n_positions); set TrainingArguments.seq_len <= it or truncate "
                        "the samples")
    if not isinstance(model, torch.nn.Module):
        return  # a ready LayerChain: nothing to price
    spec = spec_of(model, seq)
    if spec is not None:
        check_shape(spec.family, spec.hidden, spec.heads, spec.kv_heads, spec.ffn_hidden,
                    spec.vocab, config.tp)
    resident = not any(p.is_meta for p in model.parameters())
    check_resources(config, device, spec=spec, params=parameter_count(model),
                    resident=resident and device.type == "cpu")


def check_first_batch(ids: torch.Tensor, labels: torch.Tensor, vocab: int | None,
                      mbs: int) -> None:
    """The first global batch: token ids and labels within the vocabulary, and a label
    to learn in every micro-batch (all -100 makes the loss 0/0 = NaN)."""
    if labels.shape[1] < 2:
        raise ExecError("sequence length 1 leaves no next token to predict; give samples "
                        "of at least 2 tokens (or set TrainingArguments.seq_len >= 2)")
    if vocab is not None:
        for what, t in (("input_ids", ids), ("labels", labels[labels != -100])):
            if t.numel() and int(t.max()) >= vocab:
                raise ExecError(f"{what} has token id {int(t.max())} but the model's "
                                f"vocabulary has {vocab} ids (0..{vocab - 1}); check the "
                                "tokenizer matches the model")
    learnable = (labels[:, 1:] != -100).reshape(-1, mbs, labels.shape[1] - 1)
    empty = (~learnable.flatten(1).any(1)).nonzero().flatten().tolist()
    if empty:
        raise ExecError(f"micro-batch {empty[0]} of the first batch has every label -100 "
                        "(after the shift: labels[1:]), so its loss is 0/0 = NaN; give each "
                        "sample at least one label to predict beyond its first token")
