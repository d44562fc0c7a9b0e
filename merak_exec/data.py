"""Training data from files, packed into fixed-length sequences.

:func:`load_data` reads the formats people keep their data in:

- a flat token file (``.bin`` or any other file): token ids end to end as unsigned
  integers, read through a numpy memory map so a file larger than memory is fine
  (nanoGPT's ``train.bin`` and the token stream of Megatron's indexed datasets are this
  layout). ``dtype="auto"`` reads uint16 when the vocabulary fits in 16 bits, else
  uint32;
- a HuggingFace ``datasets`` folder written by ``save_to_disk`` (its ``train`` split
  when it holds several), with an ``input_ids`` column, or a ``text`` column and a
  tokenizer;
- JSON lines (``.jsonl``) with a ``text`` field per line, tokenised by a local
  HuggingFace tokenizer folder (nothing is downloaded), an end-of-text token after
  each document.

Every format becomes one token stream cut into windows of ``seq_len`` tokens (labels
are the inputs; the loss shifts them), the last ``eval_fraction`` of the windows held
out for evaluation. Order, shuffling and epochs are the Trainer's (a seeded
permutation of the windows per epoch, its position saved in checkpoints).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from merak_exec.mesh import ExecError

__all__ = ["DataError", "PackedTokens", "Splits", "load_data", "TOKEN_DTYPES"]

TOKEN_DTYPES = ("auto", "uint16", "uint32", "int32", "int64")


class DataError(ExecError):
    """The data cannot be read or does not fit the model (one line naming the fix)."""


class PackedTokens(Sequence):
    """Windows ``[start, stop)`` of ``seq_len`` tokens of a token stream, as samples
    ``{"input_ids": LongTensor[seq_len]}``; a token id at or above ``vocab_size`` is
    refused when its window is read, naming the window."""

    def __init__(self, tokens: np.ndarray, seq_len: int, start: int, stop: int,
                 vocab_size: int, source: str) -> None:
        self.tokens, self.seq_len, self.vocab_size = tokens, seq_len, vocab_size
        self.start, self.stop, self.source = start, stop, source

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, i: int) -> dict:
        if not -len(self) <= i < len(self):
            raise IndexError(f"window {i} of {len(self)}")
        w = self.start + (i % len(self))
        chunk = np.asarray(self.tokens[w * self.seq_len:(w + 1) * self.seq_len])
        ids = torch.from_numpy(chunk.astype(np.int64))
        if ids.numel() and int(ids.max()) >= self.vocab_size:
            pos = int((ids >= self.vocab_size).nonzero()[0]) + w * self.seq_len
            raise DataError(f"{self.source}: token {pos} is {int(ids.max())}, outside the "
                            f"model's vocabulary of {self.vocab_size}; use the tokenizer the "
                            "model was built for, or a larger --vocab")
        return {"input_ids": ids}


@dataclass(frozen=True)
class Splits:
    """The packed training windows, the held-out ones (None when none are held out) and
    how many tokens the source held."""

    train: PackedTokens
    eval: PackedTokens | None
    tokens: int


def load_data(path: str, seq_len: int, vocab_size: int, *, tokenizer: str | None = None,
              dtype: str = "auto", eval_fraction: float = 0.0) -> Splits:
    """Read ``path`` (see the module docstring) and pack it into ``seq_len`` windows,
    the last ``eval_fraction`` of them held out."""
    if dtype not in TOKEN_DTYPES:
        raise DataError(f"unknown token dtype {dtype!r}; choose one of {', '.join(TOKEN_DTYPES)}")
    if not 0.0 <= eval_fraction < 1.0:
        raise DataError(f"eval fraction {eval_fraction} must lie in [0, 1)")
    p = Path(path)
    if not p.exists():
        raise DataError(f"no data at {path}; give a token file, a datasets folder or a "
                        ".jsonl file")
    if p.is_dir():
        tokens = _datasets_folder(p, tokenizer)
    elif p.suffix in (".jsonl", ".json"):
        tokens = _jsonl(p, tokenizer)
    else:
        tokens = _token_file(p, dtype, vocab_size)
    windows = len(tokens) // seq_len
    if windows < 1:
        raise DataError(f"{path} holds {len(tokens)} tokens, fewer than one sequence of "
                        f"{seq_len}; give more data or a shorter --seq")
    held = min(windows - 1, math.ceil(eval_fraction * windows)) if eval_fraction else 0
    if eval_fraction and held < 1:
        raise DataError(f"{path} holds one sequence of {seq_len} tokens: nothing left to hold "
                        "out for evaluation; give more data or no evaluation")
    train = PackedTokens(tokens, seq_len, 0, windows - held, vocab_size, str(path))
    ev = PackedTokens(tokens, seq_len, windows - held, windows, vocab_size, str(path)) \
        if held else None
    return Splits(train, ev, len(tokens))


def _token_file(p: Path, dtype: str, vocab_size: int) -> np.ndarray:
    dt = np.dtype(("uint16" if vocab_size <= 1 << 16 else "uint32") if dtype == "auto"
                  else dtype)
    size = p.stat().st_size
    if size % dt.itemsize:
        raise DataError(f"{p} has {size} bytes, not a whole number of {dt.name} tokens; give "
                        "--data-dtype the width it was written with")
    if size == 0:
        raise DataError(f"{p} is empty; give a file of token ids")
    return np.memmap(p, dtype=dt, mode="r")


def _tokenizer(path: str | None, source: Path):
    if path is None:
        raise DataError(f"{source} holds text: give a local tokenizer folder (--tokenizer DIR)")
    if not Path(path).is_dir():
        raise DataError(f"tokenizer {path} is not a folder; give a local HuggingFace "
                        "tokenizer folder (nothing is downloaded)")
    import transformers
    from transformers import AutoTokenizer

    transformers.logging.set_verbosity_error()
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"cannot load the tokenizer at {path}: {first[:160]}") from None


def _encode(texts, tok) -> np.ndarray:
    eos = tok.eos_token_id
    out: list[int] = []
    for text in texts:
        out.extend(tok(text, add_special_tokens=False)["input_ids"])
        if eos is not None:
            out.append(eos)
    return np.asarray(out, dtype=np.int64)


def _jsonl(p: Path, tokenizer: str | None) -> np.ndarray:
    tok = _tokenizer(tokenizer, p)
    texts = []
    with open(p, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                raise DataError(f"{p} line {n} is not JSON; each line must be an object "
                                'with a "text" field') from None
            if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
                raise DataError(f'{p} line {n} has no "text" string; each line must be an '
                                'object with a "text" field')
            texts.append(rec["text"])
    return _encode(texts, tok)


def _datasets_folder(p: Path, tokenizer: str | None) -> np.ndarray:
    if not any((p / f).exists() for f in ("dataset_info.json", "dataset_dict.json",
                                          "state.json")):
        raise DataError(f"{p} is a folder but not a HuggingFace datasets folder (no "
                        "dataset_info.json); give a folder written by save_to_disk")
    try:
        import datasets
    except ImportError:
        raise DataError("reading a datasets folder needs the datasets package: pip install "
                        "'merak[data]'") from None
    ds = datasets.load_from_disk(str(p))
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise DataError(f"{p} holds splits {sorted(ds)} but no 'train'; save the training "
                            "split as 'train'")
        ds = ds["train"]
    if "input_ids" in ds.column_names:
        rows = ds["input_ids"]
        return np.fromiter((t for row in rows for t in row), dtype=np.int64)
    if "text" in ds.column_names:
        return _encode(ds["text"], _tokenizer(tokenizer, p))
    raise DataError(f"{p} has columns {ds.column_names}; it needs 'input_ids' or 'text'")
