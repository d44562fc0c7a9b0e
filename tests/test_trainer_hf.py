"""HuggingFace conventions of the Trainer and the loss.

Labels are aligned with input_ids and shifted inside the loss (labels = input_ids, the
HF way, matches GPT2LMHeadModel's own loss within 1e-5 in fp32, -100 ignored, also
through pp2, tp2 (vocab-parallel loss) and dp2); missing labels mean input_ids; right
padding is masked, left padding and over-long samples are refused in one line;
TrainingArguments takes HF's common fields and refuses by name what it cannot honour;
checkpoints rotate (save_total_limit) and train(resume_from_checkpoint=...) continues
the same run.
"""

import pytest
import torch

from merak_exec.mesh import ExecError
from merak_exec.trainer import Trainer, TrainingArguments, pad_sample, rotate_checkpoints
from support.models import build_model
from support.precision_workers import run_world


def test_chain_loss_with_labels_equal_input_ids_matches_hf_gpt2():
    from merak_exec.capture import to_chain

    hf = build_model("gpt2")
    chain, _ = to_chain(hf, 8)
    ids = torch.randint(0, 64, (3, 8), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[0, 2:4] = -100
    with torch.no_grad():
        x = ids
        for layer in chain.layers:
            x = layer(x)
        for lab in (ids, labels):
            want = float(hf(ids, labels=lab).loss)
            assert float(chain.loss_fn(x, lab)) == pytest.approx(want, rel=1e-5, abs=1e-6)


HF_LOSS_CONFIGS = [dict(pp=2, micro_batch_size=1, global_batch_size=4, dtype="fp32"),
                   dict(tp=2, micro_batch_size=2, global_batch_size=4, dtype="fp32"),
                   dict(dp=2, micro_batch_size=1, global_batch_size=4, dtype="fp32")]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """case_hf_loss and case_trainer in turn in one launch of 2 gloo ranks: per rank,
    ``{"hf_loss": ..., "trainer": ...}`` (or the launch's exception)."""
    out = tmp_path_factory.mktemp("two-ranks")
    jobs = [["hf_loss", "case_hf_loss", {"configs": HF_LOSS_CONFIGS}],
            ["trainer", "case_trainer", {"dir": str(out / "run")}]]
    return run_world(2, "case_each", {"jobs": jobs}, str(out))


def test_parallel_hf_gpt2_loss_equals_hf_loss(two_ranks):
    for res in two_ranks:
        rank = res.get("hf_loss", res)
        assert isinstance(rank, list), rank
        for cfg, r in zip(HF_LOSS_CONFIGS, rank, strict=True):
            for got, want in zip(r["got"], r["want"], strict=True):
                assert abs(got - want) <= 1e-5 * abs(want), (cfg, r)


def test_right_padding_is_masked_left_padding_and_long_samples_refused():
    ids = torch.tensor([5, 6, 7, 0])
    got_ids, got_labels = pad_sample(0, {"input_ids": ids,
                                         "attention_mask": torch.tensor([1, 1, 1, 0])}, 6, 0)
    assert got_ids.tolist() == [5, 6, 7, 0, 0, 0]
    assert got_labels.tolist() == [5, 6, 7, -100, -100, -100]
    with pytest.raises(ExecError, match="sample 3: attention_mask has a 0 before a 1"):
        pad_sample(3, {"input_ids": ids, "attention_mask": torch.tensor([0, 1, 1, 1])}, 6, 0)
    with pytest.raises(ExecError, match="sample 2 has 4 tokens, more than seq_len=3"):
        pad_sample(2, {"input_ids": ids}, 3, 0)
    with pytest.raises(ExecError, match="labels must be aligned with input_ids"):
        pad_sample(1, {"input_ids": ids, "labels": ids[1:]}, 6, 0)


def test_padded_tokens_do_not_change_the_loss():
    from merak_exec.models import GPT, GPTConfig, lm_loss

    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=32, n_positions=8, n_embd=16, n_layer=1, n_head=2))
    ids = torch.randint(1, 32, (5,))
    full_ids, full_labels = pad_sample(0, {"input_ids": ids}, 8, 0)
    with torch.no_grad():
        assert float(lm_loss(m(full_ids[None]), full_labels[None])) == pytest.approx(
            float(lm_loss(m(ids[None]), ids[None])), rel=1e-6)


def test_training_arguments_refuse_by_name():
    ds = [{"input_ids": torch.zeros(4, dtype=torch.long)}] * 4
    for kw, name in [({"report_to": "wandb"}, "report_to"),
                     ({"eval_strategy": "epoch"}, "eval_strategy"),
                     ({"eval_strategy": "steps"}, "without eval_steps"),
                     ({"dataloader_num_workers": 2}, "dataloader_num_workers"),
                     ({"bf16": True, "fp16": True}, "bf16 and fp16")]:
        with pytest.raises(ExecError, match=name):
            Trainer(model=None, args=TrainingArguments(**kw), train_dataset=ds)
    with pytest.raises(TypeError, match="deepspeed"):
        TrainingArguments(deepspeed="ds.json")
    with pytest.raises(ExecError, match="eval_dataset must be indexable"):
        Trainer(model=None, args=TrainingArguments(), train_dataset=ds,
                eval_dataset=(x for x in ds))
    # HF's common fields are accepted with their meaning
    TrainingArguments(num_train_epochs=1, bf16=True, warmup_steps=2, max_grad_norm=0.5,
                      lr_scheduler_type="cosine", save_total_limit=2, eval_steps=5,
                      report_to="none", dataloader_num_workers=0, gradient_checkpointing=True)


def test_rotation_keeps_the_newest(tmp_path):
    for s in (2, 10, 4, 8):
        (tmp_path / f"checkpoint-{s}").mkdir()
    (tmp_path / "checkpoint-x").mkdir()
    rotate_checkpoints(str(tmp_path), 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-10", "checkpoint-8",
                                                          "checkpoint-x"]


def test_trainer_epochs_rotation_and_resume_two_ranks(two_ranks):
    for res in two_ranks:
        r = res.get("trainer", res)
        assert "exception" not in r, r
        assert len(r["full"]) == 8 and r["saved"] == r["full"]  # 2 epochs of 4 steps
        assert r["kept"] == ["checkpoint-6", "checkpoint-8"]
        assert r["resumed_from"] == "checkpoint-6"
        assert r["resumed"] == pytest.approx(r["full"][6:], rel=1e-6)
        assert r["full"][-1] < r["full"][0]
