"""Inputs checked before work (merak_exec.inputs, merak_exec.builders): every bad value
is one ExecError line (exit 2 from merak-exec) naming the field, sample or number and
the fix: TrainingArguments ranges (HuggingFace's rules), dataset items, the model's
shape against tp, its memory and CPU time priced by the simulator's models, the
sequence length against the position table, token ids against the vocabulary, and a
micro-batch with nothing to learn."""

import collections
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from merak_exec.builders import (
    check_resources,
    check_shape,
    parameter_count,
    spec_from_flags,
    spec_of,
)
from merak_exec.inputs import check_first_batch, check_inputs, check_model_fits, sample_tensors
from merak_exec.mesh import ExecError
from merak_exec.trainer import Trainer, TrainingArguments, pad_sample, rotate_checkpoints
from merak_sim.config import ParallelConfig
from support.models import build_model

ONE = ParallelConfig(micro_batch_size=1, global_batch_size=4, dtype="fp32")


def one_line(e: pytest.ExceptionInfo, *needles: str) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    for n in needles:
        assert n in msg, msg
    return msg


@pytest.mark.parametrize("kw,field", [
    ({"warmup_ratio": 2}, "warmup_ratio=2"), ({"warmup_ratio": -0.1}, "warmup_ratio"),
    ({"save_total_limit": -1}, "save_total_limit=-1"), ({"weight_decay": -1}, "weight_decay"),
    ({"max_grad_norm": -1}, "max_grad_norm=-1"), ({"learning_rate": float("inf")}, "inf"),
    ({"learning_rate": float("nan")}, "learning_rate=nan"), ({"learning_rate": 0}, "rate=0"),
    ({"learning_rate": 1e308}, "learning_rate=1e+308"), ({"seq_len": 0}, "seq_len=0"),
    ({"seq_len": -5}, "seq_len=-5"), ({"per_device_train_batch_size": 0}, "batch_size=0"),
    ({"gradient_accumulation_steps": 2.5}, "gradient_accumulation_steps"),
    ({"max_steps": 0}, "max_steps=0"), ({"num_train_epochs": 0}, "num_train_epochs"),
    ({"adam_beta1": 1.0}, "adam_beta1"), ({"adam_beta2": -0.5}, "adam_beta2"),
    ({"adam_epsilon": -1e-8}, "adam_epsilon"), ({"lr_scheduler_type": "wsd"}, "wsd"),
    ({"warmup_steps": -1}, "warmup_steps"), ({"logging_steps": -1}, "logging_steps"),
    ({"save_steps": 1.5}, "save_steps"), ({"pad_token_id": -1}, "pad_token_id"),
    ({"bf16": "yes"}, "bf16='yes'"), ({"output_dir": ""}, "output_dir=''"),
    ({"split_points": [1, "x"]}, "split_points"), ({"seed": None}, "seed=None"),
])
def test_training_arguments_out_of_range_at_construction(kw, field):
    with pytest.raises(ExecError) as e:
        TrainingArguments(**kw)
    one_line(e, "TrainingArguments out of range: ", field, "must be")


def test_arguments_changed_after_construction_are_checked_again():
    args = TrainingArguments()
    args.save_total_limit = -1
    with pytest.raises(ExecError) as e:
        Trainer(model=None, args=args, train_dataset=[])
    one_line(e, "save_total_limit=-1")
    with pytest.raises(ExecError, match="args must be merak_exec.TrainingArguments"):
        Trainer(model=None, args={"learning_rate": 1e-3}, train_dataset=[])


def test_rotation_never_reads_a_negative_limit(tmp_path):
    for s in (2, 4, 6):
        (tmp_path / f"checkpoint-{s}").mkdir()
    with pytest.raises(ExecError, match="save_total_limit=-1"):
        rotate_checkpoints(str(tmp_path), -1)
    rotate_checkpoints(str(tmp_path), 0)  # HuggingFace: 0 keeps them all
    assert len(list(tmp_path.iterdir())) == 3
    rotate_checkpoints(str(tmp_path), 1)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-6"]


BAD_SAMPLES = [
    ({"ids": [1, 2]}, "sample 7 has no 'input_ids' (keys: ['ids'])"),
    ("text", "sample 7 is a str; each item must be a dict with input_ids"),
    ({"input_ids": []}, "input_ids is empty"),
    ({"input_ids": [[1, 2, 3]]}, "shape (1, 3); give one 1-D sequence"),
    ({"input_ids": [0.5, 1.0]}, "dtype torch.float32; give integer token ids"),
    ({"input_ids": [True, False]}, "dtype torch.bool"),
    ({"input_ids": [[1], [2, 3]]}, "not a list of token ids"),
    ({"input_ids": [3, -1]}, "negative id -1"),
    ({"input_ids": [1, 2], "labels": [1, -5]}, "negative value other than -100"),
    ({"input_ids": [1, 2], "labels": [1.0, 2.0]}, "labels has dtype torch.float32"),
    ({"input_ids": [1, 2], "attention_mask": [1, 2]}, "attention_mask must be 0s and 1s"),
    ({"input_ids": [1, 2], "attention_mask": [1]}, "attention_mask must be 0s and 1s"),
    (([1, 2], [1, 2], [3]), "sample 7 is a tuple"),
]


@pytest.mark.parametrize("sample,needle", BAD_SAMPLES)
def test_bad_dataset_items_are_named(sample, needle):
    with pytest.raises(ExecError) as e:
        pad_sample(7, sample, 8, 0)
    assert one_line(e, needle).startswith("sample 7")


def test_good_items_of_every_documented_form():
    enc = collections.UserDict({"input_ids": [5, 6, 7], "attention_mask": [1, 1, 0]})
    ids, labels = pad_sample(0, enc, 4, 0)  # a tokenizer's BatchEncoding is a mapping
    assert ids.tolist() == [5, 6, 7, 0] and labels.tolist() == [5, 6, -100, -100]
    ids, labels, mask = sample_tensors(([1, 2], [-100, 2]), 0)
    assert labels.tolist() == [-100, 2] and mask is None


def _gen():
    yield {"input_ids": [1, 2]}


@pytest.mark.parametrize("model,dataset,needle", [
    (None, [{"input_ids": [1, 2]}], "model must be a torch.nn.Module"),
    ("gpt2", [{"input_ids": [1, 2]}], "got str"),
    (torch.nn.Linear(2, 2), _gen(), "got a generator; materialise it"),
    (torch.nn.Linear(2, 2), iter([1]), "must be indexable with a length"),
    (torch.nn.Linear(2, 2), [], "train_dataset is empty"),
])
def test_model_and_dataset_types(model, dataset, needle):
    with pytest.raises(ExecError) as e:
        check_inputs(model, TrainingArguments(), dataset, None)
    one_line(e, needle)


def test_first_batch_token_ids_and_labels():
    ids = torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(0))
    check_first_batch(ids, ids, 64, 2)
    with pytest.raises(ExecError) as e:
        check_first_batch(ids.clone().fill_(64), ids, 64, 2)
    one_line(e, "input_ids has token id 64", "vocabulary has 64 ids (0..63)")
    labels = ids.clone()
    labels[2:, 1:] = -100  # micro-batch 1 (rows 2, 3 at mbs 2): nothing after the shift
    with pytest.raises(ExecError) as e:
        check_first_batch(ids, labels, 64, 2)
    one_line(e, "micro-batch 1 of the first batch has every label -100", "NaN")
    with pytest.raises(ExecError, match="micro-batch 2"):
        check_first_batch(ids, labels, 64, 1)
    labels[2, 5] = 7  # one label to learn is enough
    with pytest.raises(ExecError, match="micro-batch 3"):
        check_first_batch(ids, labels, 64, 1)
    check_first_batch(ids, labels, 64, 2)
    with pytest.raises(ExecError, match="sequence length 1 leaves no next token"):
        check_first_batch(ids[:, :1], ids[:, :1], 64, 2)


@pytest.mark.parametrize("kind", ["gpt", "gpt2", "llama", "llama-tied"])
def test_the_memory_estimate_prices_the_model_that_is_built(kind):
    model = build_model(kind, 2)
    spec = spec_of(model, 8)
    tied_llama = kind == "llama-tied"  # priced untied: the estimate errs high by V*h
    extra = spec.vocab * spec.hidden if tied_llama else 0
    assert spec.total_params() == parameter_count(model) + extra


def test_sequence_longer_than_the_position_table():
    model = build_model("gpt", 2)  # n_positions 8 (support.models.tiny_gpt_config)
    with pytest.raises(ExecError) as e:
        check_model_fits(model, ONE, 9, torch.device("cpu"))
    one_line(e, "sequence length 9 exceeds the model's 8 positions")
    check_model_fits(model, ONE, 8, torch.device("cpu"))


def test_model_shape_against_heads_kv_heads_and_tp():
    from transformers import LlamaConfig, LlamaForCausalLM

    odd = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=12, intermediate_size=24,
                                       num_hidden_layers=1, num_attention_heads=4,
                                       num_key_value_heads=2))
    with pytest.raises(ExecError) as e:
        check_model_fits(odd, ONE, 8, torch.device("cpu"))
    one_line(e, "even head size", "12 / 4 heads = 3")
    for args, needle in [(("gpt", 30, 4, 4, 120, 64, 1), "hidden size 30 is not divisible"),
                         (("llama", 64, 4, 3, 256, 64, 1), "not divisible by 3 kv heads"),
                         (("llama", 64, 8, 2, 256, 64, 4), "tp=4 does not divide the kv heads"),
                         (("gpt", 64, 4, 4, 256, 63, 2), "tp=2 does not divide the vocabulary")]:
        with pytest.raises(ExecError) as e:
            check_shape(*args)
        one_line(e, needle)


def test_memory_and_cpu_time_refused_before_any_work():
    huge = spec_from_flags("gpt", 4, 100000, 4, 100000, 32, 0.0)
    with pytest.raises(ExecError) as e:
        check_resources(ONE, "cpu", spec=huge)
    one_line(e, "GiB per rank", "as merak-sim prices them")
    with pytest.raises(ExecError) as e:  # without a shape: the state alone
        check_resources(ONE, "cpu", params=huge.total_params())
    one_line(e, "GiB per rank")
    long = spec_from_flags("gpt", 4, 64, 4, 256, 100000, 0.0)
    with pytest.raises(ExecError) as e:
        check_resources(ONE, "cpu", spec=long)
    one_line(e, "min on a CPU core", "shorter sequences")
    many = ParallelConfig(micro_batch_size=1, global_batch_size=100000, dtype="fp32")
    with pytest.raises(ExecError) as e:  # tiny passes, but a hundred thousand of them
        check_resources(many, "cpu", spec=spec_from_flags("gpt", 4, 64, 4, 256, 32, 0.0))
    one_line(e, "600,000 layer passes", "fewer micro-batches")
    check_resources(ONE, "cpu", spec=spec_from_flags("gpt", 4, 64, 4, 256, 32, 0.0))


CLI_BAD = [
    (["--model", "llama", "--hidden", "30", "--heads", "4"], "hidden size 30 is not divisible"),
    (["--model", "llama", "--hidden", "12", "--heads", "4"], "even head size"),
    (["--hidden", "100000", "--vocab", "100000"], "GiB per rank"),
    (["--seq", "100000"], "min on a CPU core"),
    (["--lr", "1e308"], "'--lr': 1e+308 is above 1"),
    (["--lr", "inf"], "'--lr': 'inf' is not a finite number"),
    (["--lr", "nan"], "'--lr': 'nan' is not a finite number"),
    (["--dropout", "nan"], "'--dropout': 'nan' is not a finite number"),
    (["--tp", "3", "--heads", "4"], "tp=3 does not divide the attention heads (4)"),
]


def test_cli_refuses_in_one_line_before_building(tmp_path):
    from support.cli_runs import run_commands

    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    done = run_commands([(["train", *a], str(tmp_path)) for a, _ in CLI_BAD], env)
    for (argv, needle), r in zip(CLI_BAD, done, strict=True):
        err = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(err) == 1, (argv, r.stderr[-2000:])
        assert err[0].startswith("merak-exec: error: ") and needle in err[0], err
        assert "parameters:" not in r.stdout, argv


_TRAINER_CASES = textwrap.dedent('''
    import json, os, sys, torch
    torch.set_num_threads(1)
    from merak_exec.mesh import ExecError
    from merak_exec.trainer import Trainer, TrainingArguments
    sys.path.insert(0, sys.argv[2])
    from support.models import build_model
    ds = [{"input_ids": torch.randint(0, 64, (8,))} for _ in range(8)]
    cases = {
        "vocab": [{"input_ids": torch.full((8,), 99)}] * 8,
        "masked": [{"input_ids": d["input_ids"], "labels": [-100] * 8} for d in ds],
        "long": [{"input_ids": torch.zeros(12, dtype=torch.long)}] * 8,
        "two-d": [{"input_ids": torch.zeros(1, 8, dtype=torch.long)}] * 8,
        "ok": ds,
    }
    out = {}
    for name, data in cases.items():
        args = TrainingArguments(output_dir=sys.argv[1], max_steps=1, logging_steps=0,
                                 save_steps=1 if name == "ok" else 0)
        try:
            out[name] = Trainer(model=build_model("gpt", 2), args=args,
                                train_dataset=data).train().losses
        except ExecError as e:
            out[name] = "ExecError: " + str(e)
    print(json.dumps(out))
    os._exit(0)
''')


def test_trainer_refuses_bad_data_when_built(tmp_path):
    tests = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", MERAK_TIMEOUT_S="30")
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(k, None)
    r = subprocess.run([sys.executable, "-c", _TRAINER_CASES, str(tmp_path / "run"), tests],
                       capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert "token id 99" in got["vocab"] and "every label -100" in got["masked"]
    assert "exceeds the model's 8 positions" in got["long"] and "(1, 8)" in got["two-d"]
    assert all(v.startswith("ExecError: ") for k, v in got.items() if k != "ok")
    assert len(got["ok"]) == 1 and (tmp_path / "run" / "checkpoint-1").is_dir()


def test_init_refuses_a_bad_configuration_before_starting_ranks():
    import torch.distributed as dist

    import merak_exec

    with pytest.raises(ExecError) as e:
        merak_exec.init(schedule="nope")
    one_line(e, "merak_exec.init: unknown schedule 'nope'")
    assert not dist.is_initialized()
