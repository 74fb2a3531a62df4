"""
What the command-line tools share (evaluate.py and scripts/): a run's checkpoint or a Hugging Face Llama loaded as our
Llama, and the checks of their arguments, each a one-line error.

    model, enc, meta = load_run("out/kjv/jreg_a1")                # latest checkpoint (or step=N, or RUN_DIR@STEP)
    model, enc, name = load_llama(run_dir=..., hf=...)            # for generation: a run, or an HF Llama converted
"""
import argparse
import os
import re

import torch

from files import one_line
from lib.hf import _hf_kwargs, hf_max_length, hf_name, llama_from_hf, load_hf
from model import Llama, LlamaConfig
from checkpoint import list_checkpoints, load_checkpoint, model_state
from checkpoint import run_step
from tokenizer import HFTokenizer, get_tokenizer


def checkpoint_path(run_dir, step=None, what=None):
    """The path of the checkpoint of `step` (default: the latest) in a run folder (list_checkpoints), or of
    RUN_DIR@STEP (run_step); what: how an error names the step asked for (default: --step N, or RUN_DIR@STEP)."""
    spec, (run_dir, step) = run_dir, run_step(run_dir, step)
    what = what or (spec if spec != run_dir else f"--step {step}")
    ckpts = dict(list_checkpoints(run_dir))
    if not ckpts:
        raise SystemExit(f"error: no checkpoints (ckpt_*.pt) in {run_dir}")
    if step is not None and step not in ckpts:
        raise SystemExit(f"error: {what}: no such checkpoint in {run_dir} (steps: {sorted(ckpts)})")
    return ckpts[max(ckpts) if step is None else step]


def load_run(run_dir, step=None, device="cpu", dtype=torch.float32, tokenizer=None):
    """(model, tokenizer, meta) of the latest checkpoint of a run folder, or of `step`; train.py's checkpoint format.
    tokenizer: an Encoding to use instead of the run's (config["tokenizer"]; a Hugging Face one from its copy in the
    run folder, which holds its chat template). run_dir may be RUN_DIR@STEP (run_step)."""
    run_dir, step = run_step(run_dir, step)
    ckpt = load_checkpoint(path := checkpoint_path(run_dir, step))
    model = Llama(LlamaConfig(**ckpt["model_config"]))
    model.load_state_dict(model_state(ckpt))
    config = ckpt.get("config") or {}
    meta = {"run_dir": run_dir, "checkpoint": path, "step": ckpt.get("step", step), "tokens": ckpt.get("tokens"),
            "config": config, "model_config": ckpt["model_config"]}
    folder, name = os.path.join(run_dir, "tokenizer"), config.get("tokenizer", "gpt2")   # train.py's copy of an HF one
    tokenizer = tokenizer or get_tokenizer("hf:" + folder if name.startswith("hf:") and os.path.isdir(folder) else name)
    return model.to(device=device, dtype=dtype).eval(), tokenizer, meta


def max_length_of(kind, path, step=None, gguf_file=None):
    """The longest input of a model before loading its weights: a run's max_seq_len, an HF config's positions."""
    if kind == "run":
        return load_checkpoint(checkpoint_path(path, step))["model_config"]["max_seq_len"]
    from transformers import AutoConfig
    try:
        return hf_max_length(AutoConfig.from_pretrained(path, **_hf_kwargs(gguf_file)))
    except Exception as e:
        raise SystemExit(f"error: could not load the config of Hugging Face model {hf_name(path, gguf_file)}: "
                         f"{one_line(e)}") from e


def check_device(device):
    """auto -> cuda if available, else cpu; anything but cpu, mps, or an available cuda / cuda:N is an error."""
    device = device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if not re.fullmatch(r"cpu|mps|cuda(:\d+)?", device) or ("cuda" in device and not torch.cuda.is_available()) or (
            device == "mps" and not torch.backends.mps.is_available()):
        raise SystemExit(f"error: --device {device}: choose cpu, mps, or cuda / cuda:N where CUDA is available")
    return device


def check_writable(path, option, folder=False):
    """Create the folder and write a probe file there (for --out: write_atomic's temporary file), or exit; no path
    (the option not given) is fine."""
    if not path:
        return
    probe = os.path.join(path, ".probe.tmp") if folder else f"{path}.tmp"        # write_atomic's temporary file
    try:
        if not folder and (os.path.isdir(path) or path.endswith(os.sep)):
            raise IsADirectoryError(21, "is a folder")
        os.makedirs(os.path.dirname(probe) or ".", exist_ok=True)
        open(probe, "w").close()
        os.remove(probe)
    except OSError as e:
        raise SystemExit(f"error: {option} {path} cannot be written: {e.strerror or e}")


def int_at_least(minimum):
    def parse(text):
        value = int(text)                                 # "nan", "1.5": argparse's "invalid int value"
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {value}")
        return value
    parse.__name__ = "int"
    return parse


def load_llama(run_dir=None, step=None, hf=None, gguf=None, device="cpu"):
    """(our Llama, tokenizer, name) from a run folder or a Hugging Face Llama (converted to our Llama), for generation;
    a Hugging Face tokenizer's stop_ids are its eos and those of the model's generation_config."""
    if hf:
        hf_model, hf_tok = load_hf(hf, gguf, device)
        if hf_model.config.model_type != "llama":
            raise SystemExit(f"error: {hf} is a {hf_model.config.model_type!r} model; generation runs Llama models")
        enc, eos = HFTokenizer(hf_tok), hf_model.generation_config.eos_token_id   # generate stops where HF's does
        enc.stop_ids = {enc.eot_token, *(eos if isinstance(eos, list) else [] if eos is None else [eos])}
        return llama_from_hf(hf_model).to(device).eval(), enc, hf
    run_dir, step = run_step(run_dir, step)
    if not os.path.isdir(run_dir):
        raise SystemExit(f"error: run folder {run_dir} does not exist")
    model, enc, meta = load_run(run_dir, step, device)
    return model, enc, f"{run_dir} (step {meta['step']})"
