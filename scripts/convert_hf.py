"""Convert a Hugging Face Llama into a run folder of this project, once, before training starts from it: training
(train.py's init_from) reads only its own checkpoint format.

    python -m scripts.convert_hf hf:HuggingFaceTB/SmolLM2-1.7B out/smollm2 --tokenizer hf:HuggingFaceTB/SmolLM2-1.7B
    python -m scripts.convert_hf hf:DIR/FILE.gguf OUT_DIR --tokenizer hf:DIR/FILE.gguf    # GGUF: dequantised to fp32
    python -m scripts.convert_hf hf:path/to/folder OUT_DIR --tokenizer bytes --overwrite  # replace OUT_DIR
    python train.py CONFIG.py --init_from=OUT_DIR                                          # then: training from it

The source is a hub name, a local folder or a GGUF file (hf:NAME_OR_DIR or hf:DIR/FILE.gguf). --tokenizer is the
tokenizer of the data the model will be trained on (train.py's `tokenizer`): a Hugging Face model's tokenizer must be
it (the same vocabulary fingerprint, or for a tiktoken one the same ids of a probe text). Each way the source can fail
(missing, offline, not a Llama, broken, another tokenizer) is one `error:` line, and nothing is written.

OUT_DIR: ckpt_0000000.pt, a checkpoint as train.py writes them (the weights in fp32 and no optimizer state,
model_config, config with the tokenizer and the source as init_from, the tokenizer's tag, step 0, tokens 0; tensors and
plain values only, read with weights_only=True), and for
a Hugging Face tokenizer its copy in tokenizer/ with its chat template, as a run keeps it; written to OUT_DIR.tmp, then
renamed. evaluate.py, scripts/export.py and the other commands read it as a run at step 0. An OUT_DIR that is not
empty is refused unless --overwrite, which replaces it whole (not while a training process holds it).
"""
import argparse
import dataclasses
import os
import shutil
import sys

import torch

from checkpoint import list_checkpoints
from config import fail
from data import lock_file, one_line, release_lock
from lib.hf import _hf_kwargs, llama_from_hf
from lib.progress import timed
from tokenizer import HFTokenizer, get_tokenizer, tokenizer_fingerprint, tokenizer_tag

CKPT = "ckpt_0000000.pt"      # step 0


def hf_weights(name, tokenizer):
    """(state dict, model config) of a Hugging Face Llama (a hub name, a local folder or DIR/FILE.gguf) through
    llama_from_hf; each way it can fail is one line. If it ships a tokenizer, that must be the data's `tokenizer`: for a
    Hugging Face one the same vocabulary fingerprint (tokenizer.tokenizer_fingerprint, which the shards' headers carry), for
    a tiktoken one the same ids of a probe text."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    where, name = f"hf:{name}", os.path.expanduser(name)
    local, (path, gguf) = os.path.exists(name), os.path.split(name) if name.lower().endswith(".gguf") else (name, None)
    path = path or "."                                  # FILE.gguf: in this folder, as tokenizer.get_tokenizer reads it
    kwargs = _hf_kwargs(gguf)
    if not local and (gguf or name.startswith((".", "/", "~")) or name.count("/") > 1):
        fail(f"{where}: no such {'GGUF file' if gguf else 'folder'}")
    if local and not gguf and list_checkpoints(path):
        fail(f"{where} is a run folder of train.py already: set init_from = {path!r}, no conversion needed")
    try:
        model_type = AutoConfig.from_pretrained(path, **kwargs).model_type
    except Exception as e:
        fail(f"{where}: cannot load its config ({one_line(e, 200)})" + ("" if local else
             "; a hub name needs the network or a cached copy: offline, download it first or give a local folder"))
    if model_type != "llama":
        fail(f"{where} is a {model_type} model, not a Llama (the architecture this project trains)")
    try:
        with timed(f"{where}: loading the weights" + (" (GGUF: dequantising to fp32)" if gguf else "")):
            model = llama_from_hf(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kwargs))
    except Exception as e:
        fail(f"{where}: cannot load the model ({one_line(e, 200)})")
    try:
        hf_tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    except Exception:
        print(f"note: {where} ships no tokenizer; its vocabulary is taken to be tokenizer {tokenizer!r}'s")
    else:
        data = get_tokenizer(tokenizer)
        if isinstance(data, HFTokenizer):
            theirs, ours = tokenizer_fingerprint(HFTokenizer(hf_tokenizer)), tokenizer_fingerprint(data)
            if theirs != ours:
                fail(f"{where} has another tokenizer than {tokenizer!r} (the data's): vocabulary fingerprints "
                     f"{theirs[:16]} and {ours[:16]}; prepare the data with --tokenizer {where}")
        elif hf_tokenizer.encode(probe := "Final-layer jumps: Ψ and ζ over 12 layers, 2026.\n",
                                 add_special_tokens=False) != data.encode_ordinary(probe):
            fail(f"{where} has another tokenizer than {tokenizer!r} (the data's): it encodes text differently")
    return model.state_dict(), model.config


def check_out_dir(out_dir, overwrite):
    """OUT_DIR must be a folder that does not exist or is empty, unless --overwrite (checked before the model loads);
    one that is replaced must not be in use by a training process: its lock (run.lock), held until released."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        fail(f"{out_dir} is a file, not a folder")
    if not (os.path.isdir(out_dir) and os.listdir(out_dir)):
        return None
    if not overwrite:
        ckpts = list_checkpoints(out_dir)
        fail(f"{out_dir} " + (f"holds checkpoints (steps {[step for step, _ in ckpts]})" if ckpts else "is not empty")
             + ": give another OUT_DIR, or --overwrite to replace it")
    return lock_file(os.path.join(out_dir, "run.lock"), f"{out_dir} is in use by a training process ({{holder}}): "
                     "wait for it to finish or give another OUT_DIR")


def convert(source, out_dir, tokenizer, overwrite=False):
    """Write OUT_DIR (see the module's doc) from hf:NAME_OR_DIR for data of `tokenizer`; returns OUT_DIR."""
    name, out_dir = source.removeprefix("hf:"), os.path.normpath(out_dir)
    lock = check_out_dir(out_dir, overwrite)
    try:
        get_tokenizer(tokenizer)                        # an unknown tokenizer: one line before the model loads
        state, mcfg = hf_weights(name, tokenizer)
        return write(out_dir, name, tokenizer, state, mcfg)
    finally:
        if lock:
            release_lock(lock)


def write(out_dir, name, tokenizer, state, mcfg):
    """OUT_DIR.tmp/ with the checkpoint of step 0 and the tokenizer's copy, renamed to OUT_DIR (replacing it)."""
    ckpt = {"model": state, "optimizer": None, "model_config": dataclasses.asdict(mcfg),
            "config": {"tokenizer": tokenizer, "init_from": f"hf:{name}"}, "tokenizer_tag": tokenizer_tag(tokenizer),
            "step": 0, "tokens": 0, "data_state": {"seq_index": 0}}
    tmp, old = out_dir + ".tmp", out_dir + ".old"
    for path in (tmp, old):                             # what a killed conversion left
        shutil.rmtree(path, ignore_errors=True)
    try:
        os.makedirs(tmp)
        if tokenizer.startswith("hf:"):                 # the tokenizer and its chat template, as a run keeps them
            get_tokenizer(tokenizer).hf.save_pretrained(os.path.join(tmp, "tokenizer"))
        with timed(f"writing {os.path.join(out_dir, CKPT)}"):
            torch.save(ckpt, os.path.join(tmp, CKPT))
        if os.path.exists(out_dir):
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    except (OSError, RuntimeError) as e:                # a full disk: torch's stream writer raises a RuntimeError
        fail(f"cannot write {out_dir}: {one_line(e)}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m scripts.convert_hf", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("source", metavar="hf:NAME_OR_DIR", help="a hub name, a local folder or hf:DIR/FILE.gguf")
    p.add_argument("out_dir", metavar="OUT_DIR", help="the run folder to write (must not exist or be empty, unless "
                   "--overwrite); training then sets init_from = OUT_DIR")
    p.add_argument("--tokenizer", required=True, help="the data's tokenizer (train.py's tokenizer: gpt2, bytes, a "
                   "tiktoken name, hf:NAME_OR_DIR, hf:DIR/FILE.gguf);\nthe model's own must be it")
    p.add_argument("--overwrite", action="store_true", help="replace OUT_DIR if it is not empty")
    args = p.parse_args(argv)
    out = convert(args.source, args.out_dir, args.tokenizer, args.overwrite)
    print(f"wrote {out}: {', '.join(sorted(os.listdir(out)))}; train from it with init_from = {out!r}")


if __name__ == "__main__":
    sys.exit(main())
