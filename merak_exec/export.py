"""Export a checkpoint as a HuggingFace model folder (``save_pretrained`` layout).

The checkpoint's manifest records where its model came from (:func:`merak_exec.parallel.
model_origin`): the class, its config and the model's own name of every parameter.
Export assembles each full tensor from whatever layout saved it
(:class:`~merak_exec.checkpoint_store.Reader`), then:

- a HuggingFace ``GPT2LMHeadModel`` or ``LlamaForCausalLM`` gets its tensors back under
  its own names;
- the built-in GPT becomes a ``GPT2LMHeadModel`` (the same architecture: pre-LN blocks,
  tanh GELU, learned positions, tied head): q, k and v are concatenated into GPT-2's
  fused ``c_attn`` and every projection is transposed into its ``Conv1D`` layout.

The folder is written by transformers' own ``save_pretrained`` (safetensors), so
``AutoModelForCausalLM.from_pretrained(folder)`` loads it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from merak_exec.checkpoint_store import Reader, StoreError, read_manifest
from merak_exec.mesh import ExecError

__all__ = ["ExportError", "export_hf", "save_model", "EXPORTABLE"]

#: Model classes a checkpoint can be exported from.
EXPORTABLE = ("GPT", "GPT2LMHeadModel", "LlamaForCausalLM")


class ExportError(ExecError):
    """A checkpoint cannot be exported (unknown origin, unreadable, output exists)."""


def export_hf(checkpoint: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write the model of ``checkpoint`` to the folder ``out`` in HuggingFace's layout;
    returns ``out``. ``out`` must not exist yet (it is written beside, then renamed)."""
    from merak_sim.io import OutputPathError, check_output_path

    out = Path(out)
    if out.exists() or out.is_symlink():
        raise ExportError(f"{out} exists; choose a new folder for the export")
    try:
        check_output_path(out, folder=True)
    except OutputPathError as e:
        raise ExportError(str(e)) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        manifest = read_manifest(checkpoint)
    except StoreError as e:
        raise ExportError(str(e)) from None
    origin = manifest.header.get("origin")
    if not origin or origin.get("class") not in EXPORTABLE:
        found = (origin or {}).get("class", "a model without a config")
        raise ExportError(f"checkpoint at {checkpoint} holds {found}; export knows "
                          f"{', '.join(EXPORTABLE)}")
    reader = Reader(manifest)
    try:
        tensors = {origin["names"].get(n, n): reader.full(f"model/{n}")
                   for n in manifest.header["model"]}
    except StoreError as e:
        raise ExportError(str(e)) from None
    model = _hf_model(origin, tensors)
    tmp = out.with_name(f".{out.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(str(tmp))
    tmp.rename(out)
    return out


def save_model(pm, out: str | os.PathLike, step: int, workdir: str | os.PathLike) -> Path:
    """Export the live model ``pm`` (every rank calls this) to the HuggingFace folder
    ``out``: a checkpoint in ``workdir`` gathers the ranks' tensors, rank 0 exports it,
    and the checkpoint is removed. Any rank's failure is one line on every rank."""
    from merak_exec.checkpoint import agree_error, save_checkpoint

    out = Path(out)
    tmp = Path(workdir) / f".export-{step}"
    save_checkpoint(pm, tmp, step)
    failed = None
    if pm.mesh.rank == 0:
        try:
            export_hf(tmp, out)
        except ExecError as e:
            failed = str(e)
        shutil.rmtree(tmp, ignore_errors=True)
    agree_error(pm, failed, "the model export rendezvous")
    return out


def _hf_model(origin: dict, tensors: dict[str, torch.Tensor]):
    """The HuggingFace model holding ``tensors`` (the origin's own names)."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if origin["class"] == "GPT":
        config, tensors = _gpt_as_gpt2(origin["config"], tensors)
        cls = transformers.GPT2LMHeadModel
    else:
        cls = getattr(transformers, origin["class"])
        config_cls = cls.config_class
        config = config_cls.from_dict({k: v for k, v in origin["config"].items()
                                       if k != "transformers_version"})
    with torch.device("meta"):
        model = cls(config)
    if getattr(config, "tie_word_embeddings", False) and "lm_head.weight" not in tensors:
        emb = next(k for k in tensors if k.endswith("wte.weight") or
                   k.endswith("embed_tokens.weight"))
        tensors["lm_head.weight"] = tensors[emb]
    missing = [n for n, _ in model.named_parameters() if n not in tensors]
    if missing:
        raise ExportError(f"the checkpoint has no tensor for {missing[0]} of "
                          f"{origin['class']}; it was saved from another model")
    # Built on the meta device (no random init of a large model), the parameters are
    # then the checkpoint's own tensors; the buffers left on meta are the non-persistent
    # ones (rotary tables, masks) that save_pretrained does not write.
    model.load_state_dict(tensors, strict=False, assign=True)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    return model


def _gpt_as_gpt2(cfg: dict, t: dict[str, torch.Tensor]):
    """The built-in GPT's config and tensors in GPT-2's layout."""
    from transformers import GPT2Config

    h, L = cfg["n_embd"], cfg["n_layer"]
    config = GPT2Config(vocab_size=cfg["vocab_size"], n_positions=cfg["n_positions"],
                        n_embd=h, n_layer=L, n_head=cfg["n_head"],
                        n_inner=cfg["ffn_mult"] * h, activation_function="gelu_new",
                        resid_pdrop=cfg["dropout"], embd_pdrop=cfg["dropout"],
                        attn_pdrop=cfg["dropout"], layer_norm_epsilon=cfg["layer_norm_eps"],
                        tie_word_embeddings=cfg["tie_embeddings"], bos_token_id=0,
                        eos_token_id=0)
    out = {"transformer.wte.weight": t["embed.wte.weight"],
           "transformer.wpe.weight": t["embed.wpe.weight"],
           "transformer.ln_f.weight": t["head.ln_f.weight"],
           "transformer.ln_f.bias": t["head.ln_f.bias"]}
    if "head.lm_head.weight" in t:
        out["lm_head.weight"] = t["head.lm_head.weight"]
    for i in range(L):
        src, dst = f"blocks.{i}.", f"transformer.h.{i}."
        for ln in ("ln_1", "ln_2"):
            for k in ("weight", "bias"):
                out[f"{dst}{ln}.{k}"] = t[f"{src}{ln}.{k}"]
        qkv = [f"{src}attn.{p}_proj" for p in "qkv"]
        out[f"{dst}attn.c_attn.weight"] = torch.cat([t[f"{n}.weight"] for n in qkv]).t()
        out[f"{dst}attn.c_attn.bias"] = torch.cat([t[f"{n}.bias"] for n in qkv])
        for ours, theirs in (("attn.o_proj", "attn.c_proj"), ("mlp.fc_in", "mlp.c_fc"),
                             ("mlp.fc_out", "mlp.c_proj")):
            out[f"{dst}{theirs}.weight"] = t[f"{src}{ours}.weight"].t()
            out[f"{dst}{theirs}.bias"] = t[f"{src}{ours}.bias"]
    return config, {k: v.contiguous() for k, v in out.items()}
