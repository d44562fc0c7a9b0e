"""Training data from files: token files, datasets folders and JSONL text, packed into
windows with a held-out split; every bad input one DataError line."""

import json

import numpy as np
import pytest
import torch

from merak_exec.data import DataError, load_data


def _tokenizer_folder(path):
    """A tiny word-level tokenizer saved as a local HuggingFace tokenizer folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<eos>", "<unk>", "the", "cat", "sat", "on", "mat", "a", "dog"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>")
    fast.save_pretrained(str(path))
    return str(path)


def test_token_file_packs_windows_and_holds_out_the_tail(tmp_path):
    f = tmp_path / "tokens.bin"
    np.arange(100, dtype=np.uint16).tofile(f)
    s = load_data(str(f), seq_len=8, vocab_size=128, eval_fraction=0.2)
    assert s.tokens == 100 and len(s.train) == 9 and len(s.eval) == 3  # 12 windows
    assert torch.equal(s.train[1]["input_ids"], torch.arange(8, 16))
    assert torch.equal(s.eval[0]["input_ids"], torch.arange(72, 80))
    assert s.train[0]["input_ids"].dtype == torch.int64


def test_token_file_wider_than_16_bits(tmp_path):
    f = tmp_path / "tokens.bin"
    np.array([70000, 1, 2, 3], dtype=np.uint32).tofile(f)
    s = load_data(str(f), seq_len=2, vocab_size=100000)
    assert s.train[0]["input_ids"].tolist() == [70000, 1]


def test_jsonl_with_a_local_tokenizer(tmp_path):
    tok = _tokenizer_folder(tmp_path / "tok")
    f = tmp_path / "docs.jsonl"
    f.write_text("\n".join(json.dumps({"text": t}) for t in ["the cat sat", "a dog"]) + "\n")
    s = load_data(str(f), seq_len=3, vocab_size=9, tokenizer=tok)
    # "the cat sat <eos> a dog <eos>" = 7 tokens -> 2 windows of 3
    assert s.tokens == 7 and [s.train[i]["input_ids"].tolist() for i in range(2)] == \
        [[2, 3, 4], [0, 7, 8]]


def test_datasets_folder_with_input_ids(tmp_path):
    import datasets  # the data extra, installed by make test
    datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5, 6, 7]]}).save_to_disk(
        str(tmp_path / "ds"))
    s = load_data(str(tmp_path / "ds"), seq_len=2, vocab_size=10)
    assert [s.train[i]["input_ids"].tolist() for i in range(3)] == [[1, 2], [3, 4], [5, 6]]


def test_bad_data_is_one_line(tmp_path):
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x00\x01\x02")
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    short = tmp_path / "short.bin"
    np.arange(3, dtype=np.uint16).tofile(short)
    big = tmp_path / "big.bin"
    np.array([1, 2, 300, 4], dtype=np.uint16).tofile(big)
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"text": "the cat"}\nnot json\n')
    no_text = tmp_path / "notext.jsonl"
    no_text.write_text('{"body": "the cat"}\n')
    plain_dir = tmp_path / "plain"
    plain_dir.mkdir()
    tok = _tokenizer_folder(tmp_path / "tok")
    cases = [
        (lambda: load_data(str(tmp_path / "nope.bin"), 4, 10), "no data at"),
        (lambda: load_data(str(odd), 4, 10), "not a whole number of uint16"),
        (lambda: load_data(str(empty), 4, 10), "is empty"),
        (lambda: load_data(str(short), 4, 10), "fewer than one sequence of 4"),
        (lambda: load_data(str(short), 2, 10, eval_fraction=0.5), "nothing left to hold out"),
        (lambda: load_data(str(big), 4, 256).train[0], "token 2 is 300, outside the model's "
                                                       "vocabulary of 256"),
        (lambda: load_data(str(bad_json), 2, 10, tokenizer=tok), "line 2 is not JSON"),
        (lambda: load_data(str(no_text), 2, 10, tokenizer=tok), 'no "text" string'),
        (lambda: load_data(str(no_text), 2, 10, tokenizer=str(plain_dir)),
         "cannot load the tokenizer"),
        (lambda: load_data(str(bad_json), 2, 10), "give a local tokenizer folder"),
        (lambda: load_data(str(bad_json), 2, 10, tokenizer=str(odd)), "is not a folder"),
        (lambda: load_data(str(plain_dir), 2, 10), "not a HuggingFace datasets folder"),
        (lambda: load_data(str(short), 2, 10, dtype="float"), "unknown token dtype"),
        (lambda: load_data(str(short), 2, 10, eval_fraction=1.0), "must lie in [0, 1)"),
    ]
    for fn, text in cases:
        with pytest.raises(DataError) as e:
            fn()
        assert text in str(e.value) and "\n" not in str(e.value)
