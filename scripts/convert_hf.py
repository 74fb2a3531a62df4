"""Convert a Hugging Face Llama into a run folder of this project, once, before training starts from it: training
(train.py's init_from) reads only its own checkpoint format.

    python -m scripts.convert_hf hf:HuggingFaceTB/SmolLM2-1.7B out/smollm2 --tokenizer hf:HuggingFaceTB/SmolLM2-1.7B
    python -m scripts.convert_hf hf:DIR/FILE.gguf OUT_DIR --tokenizer hf:DIR/FILE.gguf    # GGUF: dequantised to fp32
    python -m scripts.convert_hf hf:path/to/folder OUT_DIR --tokenizer bytes --overwrite  # replace OUT_DIR
    python train.py CONFIG.py --init_from=OUT_DIR                                          # then: training from it

The source is a hub name, a local folder or a GGUF file (hf:NAME_OR_DIR or hf:DIR/FILE.gguf). --tokenizer is the
tokenizer of the data the model will be trained on (train.py's `tokenizer`): a Hugging Face model's tokenizer must be
it (the same vocabulary fingerprint, or for a tiktoken one the same ids of a probe text), and fit the model's
vocabulary. Each way the source can fail (missing, offline, not a Llama, broken, another tokenizer, a tokenizer larger
than the model's vocabulary) is one `error:` line, and nothing is written; so is Ctrl-C ("interrupted: nothing
written", exit status 130).

OUT_DIR: ckpt_0000000.pt, a checkpoint as train.py writes them (the weights in fp32 and no optimizer state,
model_config, config with the tokenizer and the source as init_from, the tokenizer's tag, step 0, tokens 0; tensors and
plain values only, read with weights_only=True), and for
a Hugging Face tokenizer its copy in tokenizer/ with its chat template, as a run keeps it; written to OUT_DIR.tmp, then
renamed. evaluate.py, scripts/export.py and the other commands read it as a run at step 0. An OUT_DIR that is not
empty is refused unless --overwrite, which replaces it whole. The conversion holds OUT_DIR's lock (run.lock, as a
training process does) from before the model loads to its end: a training process or another conversion in OUT_DIR
is refused in one line, either way round.
"""
import argparse
import contextlib
import dataclasses
import errno
import os
import shutil
import signal
import sys
import threading
import time

import torch

from checkpoint import list_checkpoints
from config import fail
from files import lock_file, one_line, release_lock
from lib.hf import _hf_kwargs, cannot_write, check_vocabulary, llama_from_hf
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
    check_vocabulary(model.config.vocab_size, get_tokenizer(tokenizer), f"{where}: ")   # or chat.py fails on an id
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


LOCK = "run.lock"                                # a run folder's lock, as train.py's (runs.lock_run)
CONVERTING = "python -m scripts.convert_hf"      # how a conversion's lock names its holder


class Interrupted(SystemExit):
    """Ctrl-C: the conversion stopped, and what it had written is removed."""


@contextlib.contextmanager
def interrupts_held():
    """Ctrl-C ignored inside (SIGINT, in the main thread): the swap of OUT_DIR, the clean-up after a failure and the
    locks' taking are never cut halfway."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def lock(path, out_dir):
    """files.lock_file on `path`, its holder line naming this command; held: one line naming the holder's kind."""
    try:
        f = lock_file(path, f"{out_dir} is in use by a training process ({{holder}}): wait for it to finish or give "
                      "another OUT_DIR")
    except SystemExit as e:
        message = str(e.code)
        raise SystemExit(message.replace(" a training process (", " another conversion (", 1)
                         if message.endswith(f"{CONVERTING}): wait for it to finish or give another OUT_DIR")
                         else message) from None
    f.seek(0)
    holder = f.read().strip()
    f.truncate(0)
    f.write(f"{holder}, {CONVERTING}\n")
    f.flush()
    return f


def refuse_a_conversion_writing(tmp, out_dir):
    """A conversion into OUT_DIR holds OUT_DIR.tmp/run.lock while it writes there and swaps it in: refused in one line.
    A lock there that nobody holds is what a killed conversion left."""
    path = os.path.join(tmp, LOCK)
    if os.path.exists(path):
        with contextlib.suppress(FileNotFoundError):     # gone meanwhile: that conversion ended
            release_lock(lock(path, out_dir))


def not_empty(out_dir, overwrite):
    """OUT_DIR must be empty (but for a lock) unless --overwrite: one line, naming the checkpoints of a run."""
    if not overwrite and os.path.isdir(out_dir) and set(os.listdir(out_dir)) - {LOCK}:
        ckpts = list_checkpoints(out_dir)
        fail(f"{out_dir} " + (f"holds checkpoints (steps {[step for step, _ in ckpts]})" if ckpts else "is not empty")
             + ": give another OUT_DIR, or --overwrite to replace it")


def lock_out_dir(out_dir, overwrite, held):
    """OUT_DIR's lock (run.lock, as a training process holds it), taken before the model loads and held to the end,
    so that a training process or another conversion there is refused in one line, either way round; OUT_DIR is
    created to hold it (and removed if nothing is written: held["created"]). OUT_DIR must be a folder that is empty
    unless --overwrite. What a killed conversion left goes: OUT_DIR.tmp, and OUT_DIR.old, which is the folder before
    it if OUT_DIR is missing (killed between its two renames) and comes back."""
    tmp, old = out_dir + ".tmp", out_dir + ".old"
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        fail(f"{out_dir} is a file, not a folder")
    not_empty(out_dir, overwrite)                        # before anything is touched
    if os.path.isdir(old) and not os.path.exists(out_dir):
        refuse_a_conversion_writing(tmp, out_dir)        # one between its two renames
        with contextlib.suppress(OSError):
            os.replace(old, out_dir)
    for _ in range(10):
        held["created"] = held["created"] or not os.path.exists(out_dir)
        try:
            os.makedirs(out_dir, exist_ok=True)
            held["out"] = lock(os.path.join(out_dir, LOCK), out_dir)
            break
        except FileNotFoundError:                        # OUT_DIR swapped meanwhile by a conversion: again
            continue
        except OSError as e:
            fail(f"{out_dir} cannot be written: {e.strerror or e}")
    else:
        fail(f"{out_dir} is being replaced by another process: try again")
    refuse_a_conversion_writing(tmp, out_dir)
    for path in (tmp, old):
        shutil.rmtree(path, ignore_errors=True)
    not_empty(out_dir, overwrite)                        # written meanwhile, or the folder that came back


def convert(source, out_dir, tokenizer, overwrite=False):
    """Write OUT_DIR (see the module's doc) from hf:NAME_OR_DIR for data of `tokenizer` and say so; returns OUT_DIR.
    Any failure, Ctrl-C included, leaves no OUT_DIR.tmp, no lock and no OUT_DIR that was not there before."""
    name, out_dir = source.removeprefix("hf:"), os.path.normpath(out_dir)
    # the two locks; whether OUT_DIR was made for its lock, OUT_DIR.tmp is this conversion's, they were swapped
    held = {"out": None, "tmp": None, "created": False, "writing": False, "swapped": False}
    try:
        with interrupts_held():
            lock_out_dir(out_dir, overwrite, held)
        get_tokenizer(tokenizer)                         # an unknown tokenizer: one line before the model loads
        state, mcfg = hf_weights(name, tokenizer)
        return write(out_dir, name, tokenizer, state, mcfg, held)
    except BaseException as e:
        if held["swapped"] and isinstance(e, KeyboardInterrupt):     # after "wrote OUT_DIR": it was
            return out_dir
        with interrupts_held():
            if held["writing"]:                          # not another conversion's
                shutil.rmtree(out_dir + ".tmp", ignore_errors=True)
            unlock(out_dir, held)
            if held["created"]:
                with contextlib.suppress(OSError):      # only if empty: never another process's folder
                    os.rmdir(out_dir)
        raise


def unlock(out_dir, held):
    """Let the conversion's locks go, their files removed first (data.release_lock): that of OUT_DIR.tmp was renamed
    into OUT_DIR with it."""
    if f := held["tmp"]:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(out_dir if held["swapped"] else out_dir + ".tmp", LOCK))
        f.close()
    if f := held["out"]:
        if held["swapped"]:                              # its file went with the old folder
            f.close()
        else:
            release_lock(f)
    held.update(out=None, tmp=None)


def write(out_dir, name, tokenizer, state, mcfg, held):
    """OUT_DIR.tmp/ (its lock held) with the checkpoint of step 0 and the tokenizer's copy, then swapped in for OUT_DIR
    (OUT_DIR -> OUT_DIR.old, OUT_DIR.tmp -> OUT_DIR), the locks let go and "wrote OUT_DIR" said, with Ctrl-C held."""
    ckpt = {"model": state, "optimizer": None, "model_config": dataclasses.asdict(mcfg),
            "config": {"tokenizer": tokenizer, "init_from": f"hf:{name}"}, "tokenizer_tag": tokenizer_tag(tokenizer),
            "step": 0, "tokens": 0, "data_state": {"seq_index": 0}}
    tmp, old = out_dir + ".tmp", out_dir + ".old"
    try:
        with interrupts_held():
            held["writing"] = True
            os.makedirs(tmp)
            held["tmp"] = lock(os.path.join(tmp, LOCK), out_dir)
        if tokenizer.startswith("hf:"):                 # the tokenizer and its chat template, as a run keeps them
            get_tokenizer(tokenizer).hf.save_pretrained(os.path.join(tmp, "tokenizer"))
        with timed(f"writing {os.path.join(out_dir, CKPT)}"):
            torch.save(ckpt, os.path.join(tmp, CKPT))
        with interrupts_held():
            os.replace(out_dir, old)
            for wait in (0.01, 0.1, 1, None):            # OUT_DIR made meanwhile by a process that is then refused
                try:
                    os.replace(tmp, out_dir)
                    break
                except OSError as e:
                    if wait is None or e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                        raise
                    time.sleep(wait)
            held["swapped"] = True
            shutil.rmtree(old, ignore_errors=True)
            unlock(out_dir, held)
            print(f"wrote {out_dir}: {', '.join(sorted(os.listdir(out_dir)))}; train from it with init_from = "
                  f"{out_dir!r}", flush=True)
    except (OSError, RuntimeError) as e:                # a full disk: torch's stream writer raises a RuntimeError
        if os.path.isdir(old) and not os.path.exists(out_dir):
            os.replace(old, out_dir)                     # the folder before it stays
        cannot_write(out_dir, e)
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
    try:
        convert(args.source, args.out_dir, args.tokenizer, args.overwrite)
    except KeyboardInterrupt:
        raise Interrupted("interrupted: nothing written") from None


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Interrupted as e:
        print(e, file=sys.stderr, flush=True)
        sys.exit(130)
