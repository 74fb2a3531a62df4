"""
The run folder and the models we load: checkpoints (one format), the lock that keeps one process per folder, the
checks that make a resume exact, the weights a fine-tuning run starts from, loading a run or a Hugging Face model,
the device, and the run's record of its machine.

    model, enc, meta = load_run("out/kjv/jreg_a1")                # latest checkpoint (or step=N)
    hf_model, hf_tok = load_hf("HuggingFaceTB/SmolLM2-135M-Instruct")
    list_checkpoints(out_dir) -> [(step, path)]                   # complete checkpoints, oldest first

A checkpoint ckpt_NNNNNNN.pt holds the unwrapped model, the optimizer, model_config, config, the tokenizer's tag
(data.tokenizer_tag: a Hugging Face one with its fingerprint), step, tokens, the data position and identity, and the
RNG states; written to a temporary file and renamed, never with non-finite weights.
With sharded_ckpt it is a folder ckpt_NNNNNNN/ instead: each rank's shard of the model and optimizer
(torch.distributed.checkpoint), their index .metadata, and the rest in meta.pt; it resumes on any number of processes.
"""
import argparse
import dataclasses
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from contextlib import suppress

import torch
import torch.distributed as dist

from config import BEFORE, RESUMABLE, fail, model_config
from data import HFTokenizer, get_tokenizer, lock_file, one_line, same_tokenizer, tokenizer_fingerprint, tokenizer_tag
from model import Llama, LlamaConfig


def list_checkpoints(out_dir):
    """[(step, path)] of the checkpoints in out_dir, oldest first: ckpt_NNNNNNN.pt files and sharded ckpt_NNNNNNN
    folders (a folder being written is ckpt_NNNNNNN.tmp, never listed)."""
    found = []
    for name in os.listdir(out_dir) if os.path.isdir(out_dir) else []:
        step, path = name[5:].removesuffix(".pt"), os.path.join(out_dir, name)
        if name.startswith("ckpt_") and step.isdigit() and (name.endswith(".pt") or os.path.isdir(path)):
            found.append((int(step), path))
    return sorted(found)


def load_checkpoint(path):
    """The checkpoint dict: model, optimizer, model_config, config, tokenizer_tag, step, tokens, data_state, rng. A
    file is memory-mapped, so the ranks of one node share a copy in the page cache; a sharded folder gives its record
    with model and optimizer None and "sharded" its path (model_state reads its weights, restore all of it)."""
    sharded = os.path.isdir(path)
    try:
        if sharded and not os.path.isfile(os.path.join(path, ".metadata")):
            raise FileNotFoundError("incomplete: no .metadata (the shards' index)")
        ckpt = torch.load(os.path.join(path, "meta.pt") if sharded else path, map_location="cpu",
                          weights_only=False, mmap=not sharded)
    except Exception as e:
        fail(f"cannot read checkpoint {path}: {one_line(e)}")
    return {**ckpt, "model": None, "optimizer": None, "sharded": path} if sharded else ckpt


def model_state(ckpt):
    """The full model state dict of a checkpoint (of a sharded one: read from its shards, on CPU, in one process)."""
    if not ckpt.get("sharded"):
        return ckpt["model"]
    import torch.distributed.checkpoint as dcp
    with torch.device("meta"):
        shapes = Llama(LlamaConfig(**ckpt["model_config"])).state_dict()
    state = {"model": {k: torch.empty(v.shape, dtype=v.dtype) for k, v in shapes.items()}}
    try:
        dcp.load(state, checkpoint_id=ckpt["sharded"], no_dist=True)
    except Exception as e:
        fail(f"cannot read checkpoint {ckpt['sharded']}: {one_line(e)}")
    return state["model"]


PENDING = []   # an async sharded save in flight: (future, its .tmp folder, its final name, the config)


def finish_checkpoint():
    """Wait for the async save in flight, if any, and give it its final name."""
    while PENDING:
        future, tmp, path, cfg = PENDING.pop()
        future.result()
        publish(tmp, path, cfg)


def publish(tmp, path, cfg):
    """Rank 0 renames a sharded checkpoint written by every rank to its final name and prunes the others; the others
    wait for it."""
    if int(os.environ.get("RANK", 0)) == 0:
        os.replace(tmp, path)
        prune(cfg)
    if dist.is_initialized():
        dist.barrier()


def prune(cfg):
    """All but the newest keep_ckpts checkpoints and those of steps that are multiples of keep_every, and what killed
    saves left (.tmp), are deleted."""
    left = [os.path.join(cfg.out_dir, n) for n in os.listdir(cfg.out_dir) if re.fullmatch(r"ckpt_\d+(\.pt)?\.tmp", n)]
    old = [path for step, path in list_checkpoints(cfg.out_dir)[:-cfg.keep_ckpts]
           if not (cfg.keep_every and step % cfg.keep_every == 0)]
    for path in old + left:
        shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.remove(path)


def save_checkpoint(cfg, step, model, optimizer, seq_index, data_id=None):
    """The model, optimizer, data position and identity (data_identity) and RNG states of `step`. By default rank 0
    writes the full (unsharded, uncompiled) state as one file; with sharded_ckpt each rank writes its own shard
    (torch.distributed.checkpoint) into a folder, in the background with async_ckpt. Either way it is written under a
    temporary name and renamed when whole. A model with a non-finite parameter is never saved."""
    finish_checkpoint()                           # the save in flight first: it may be the last good checkpoint
    bad = torch.tensor(float(any(not torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all()
                                 for p in model.parameters())), device=next(model.parameters()).device)   # NCCL: CUDA
    if dist.is_initialized():
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    if bad.item():
        fail(f"non-finite parameters after step {step}: nothing saved. {last_good(cfg)}, with a lower lr or grad_clip")
    master = int(os.environ.get("RANK", 0)) == 0
    meta = {"model_config": dataclasses.asdict(model.config), "config": dataclasses.asdict(cfg),
            "tokenizer_tag": tokenizer_tag(cfg.tokenizer), "step": step,
            "tokens": step * cfg.batch_tokens, "data_state": {"seq_index": seq_index}, "data_identity": data_id}
    path = os.path.join(cfg.out_dir, f"ckpt_{step:07d}" + ("" if cfg.sharded_ckpt else ".pt"))
    if cfg.sharded_ckpt:
        save_sharded(cfg, path, model, optimizer, meta, master)
    elif cfg.fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
        model_sd, optim_sd = get_state_dict(model, optimizer,
                                            options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    else:
        model_sd, optim_sd = model.state_dict(), optimizer.state_dict()
    if master and not cfg.sharded_ckpt:
        try:
            torch.save({"model": model_sd, "optimizer": optim_sd, **meta}, path + ".tmp")
        except (OSError, RuntimeError) as e:          # a full disk: torch's stream writer raises a RuntimeError
            with suppress(OSError):
                os.remove(path + ".tmp")
            fail(f"cannot write checkpoint {path}: {one_line(e)}. {last_good(cfg)}, once there is room")
        os.replace(path + ".tmp", path)
        prune(cfg)


def last_good(cfg):
    last = list_checkpoints(cfg.out_dir)
    return f"The last good checkpoint is {last[-1][1] if last else '(none)'}; rerun to resume from it"


def save_sharded(cfg, path, model, optimizer, meta, master):
    """Each rank writes its shard (torch.distributed.checkpoint) into path.tmp/, rank 0 also the record (meta.pt) and,
    last, the index of the shards (.metadata); once every rank is done, rank 0 renames it to path (finish_checkpoint).
    With async_ckpt the state is copied to CPU here and written while training goes on, on a gloo group of its own."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    tmp = path + ".tmp"
    if master:
        shutil.rmtree(tmp, ignore_errors=True)            # what a killed save left
        os.makedirs(tmp)
        torch.save(meta, os.path.join(tmp, "meta.pt"))
    if dist.is_initialized():
        dist.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)   # DTensor shards under FSDP, the whole under DDP
    state = {"model": model_sd, "optimizer": optim_sd}
    if not cfg.async_ckpt:
        dcp.save(state, checkpoint_id=tmp, no_dist=not dist.is_initialized())
        return publish(tmp, path, cfg)
    if dist.is_initialized() and "gloo" not in ASYNC_GROUP:   # created once, by every rank at the same point
        ASYNC_GROUP["gloo"] = dist.new_group(backend="gloo")
    PENDING.append((dcp.async_save(state, checkpoint_id=tmp, process_group=ASYNC_GROUP.get("gloo"),
                                   no_dist=not dist.is_initialized()), tmp, path, cfg))


ASYNC_GROUP = {}


def start_weights(cfg):
    """(state dict or None, model config) to build the model from. A fine-tuning run that has a checkpoint resumes
    from it and never reads init_from again (the source may since have been pruned, deleted or gone offline); a shape
    setting that contradicts the weights' is an error, not silently ignored."""
    if not cfg.init_from:
        return None, model_config(cfg)
    if ckpts := list_checkpoints(cfg.out_dir):
        sd, mcfg = None, LlamaConfig(**load_checkpoint(ckpts[-1][1])["model_config"])
    else:
        sd, mcfg = init_weights(cfg.init_from, cfg.tokenizer)
    shape = {f.name: getattr(mcfg, f.name) for f in dataclasses.fields(LlamaConfig)}
    if wrong := [f"{k} = {getattr(cfg, k)!r} (the weights': {v!r})" for k, v in shape.items()
                 if getattr(cfg, k, None) not in (None, v)]:
        fail(f"init_from {cfg.init_from!r} gives the model's shape, but {', '.join(wrong)}: leave them out")
    return sd, mcfg


def init_weights(spec, tokenizer):
    """(state dict, model config) of the weights a fine-tuning run starts from: RUN_DIR, RUN_DIR@STEP, RUN_DIR@latest
    or hf:NAME_OR_DIR; they must have been trained with `tokenizer` (the data's)."""
    if spec.startswith("hf:"):
        return init_weights_hf(spec[3:], tokenizer)
    run_dir, at = run_step(spec)
    ckpts = dict(list_checkpoints(run_dir))
    if (step := max(ckpts, default=None) if at is None else at) not in ckpts:
        fail(f"init_from {spec!r}: no checkpoint{'' if at is None else f' of step {at}'} in {run_dir!r}"
             + (f" (steps {sorted(ckpts)})" if ckpts else ""))
    ckpt = load_checkpoint(ckpts[step])
    trained = ckpt.get("tokenizer_tag") or ckpt["config"].get("tokenizer", "gpt2")   # its tag: an HF one's fingerprint
    if trained != tokenizer and not same_tokenizer(tokenizer_tag(trained), tokenizer_tag(tokenizer)):
        fail(f"init_from {spec!r} was trained with tokenizer {trained!r}, but tokenizer = {tokenizer!r} (the data's): "
             f"fine-tune it on data prepared with {trained!r}")
    return model_state(ckpt), LlamaConfig(**ckpt["model_config"])


def init_weights_hf(name, tokenizer):
    """A Hugging Face Llama (a hub name, a local folder or DIR/FILE.gguf) through Llama.from_hf; each way it can fail is
    one line. If it ships a tokenizer, that must be the data's `tokenizer`: for a Hugging Face one the same vocabulary
    fingerprint (data.tokenizer_fingerprint, which the shards' headers carry), for a tiktoken one the same ids of a
    probe text."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    where, name = f"init_from 'hf:{name}'", os.path.expanduser(name)
    local, (path, gguf) = os.path.exists(name), os.path.split(name) if name.lower().endswith(".gguf") else (name, None)
    path = path or "."                                  # FILE.gguf: in this folder, as data.get_tokenizer reads it
    kwargs = _hf_kwargs(gguf)
    if not local and (gguf or name.startswith((".", "/", "~")) or name.count("/") > 1):
        fail(f"{where}: no such {'GGUF file' if gguf else 'folder'}")
    try:
        model_type = AutoConfig.from_pretrained(path, **kwargs).model_type
    except Exception as e:
        fail(f"{where}: cannot load its config ({one_line(e, 200)})" + ("" if local else
             "; a hub name needs the network or a cached copy: offline, download it first or give a local folder"))
    if model_type != "llama":
        fail(f"{where} is a {model_type} model, not a Llama (the architecture this project trains)")
    try:
        hf = Llama.from_hf(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kwargs))
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
                     f"{theirs[:16]} and {ours[:16]}; prepare the data with --tokenizer hf:{name}")
        elif hf_tokenizer.encode(probe := "Final-layer jumps: Ψ and ζ over 12 layers, 2026.\n",
                                 add_special_tokens=False) != data.encode_ordinary(probe):
            fail(f"{where} has another tokenizer than {tokenizer!r} (the data's): it encodes text differently")
    return hf.state_dict(), hf.config


def restore(ckpt, model, optimizer, fsdp):
    """The checkpoint's weights, optimizer state and RNG states, whether it was written with or without FSDP, as one
    file or sharded (on any number of processes: torch.distributed.checkpoint reshards by parameter name)."""
    if ckpt.get("sharded"):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optimizer": optim_sd}
        dcp.load(state, checkpoint_id=ckpt["sharded"], no_dist=not dist.is_initialized())
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    elif fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict
        optim_sd = ckpt["optimizer"]
        if isinstance(optim_sd["param_groups"][0]["params"][0], int):  # written without FSDP: parameters by position
            names = {id(p): n for n, p in model.named_parameters()}
            name = dict(zip((i for g in optim_sd["param_groups"] for i in g["params"]),
                            (names[id(p)] for g in optimizer.param_groups for p in g["params"])))
            optim_sd = {"state": {name[k]: v for k, v in optim_sd["state"].items()}, "param_groups": [
                {**g, "params": [name[i] for i in g["params"]]} for g in optim_sd["param_groups"]]}
        set_state_dict(model, optimizer, model_state_dict=ckpt["model"], optim_state_dict=optim_sd,
                       options=StateDictOptions(full_state_dict=True))
    else:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
    # No random-number state is restored (older checkpoints' "rng" is ignored): training draws no random numbers after
    # the seeded initialisation (no dropout; the data order is numpy's, seeded by seed and epoch), so a resume is exact
    # on any number of processes and GPUs. An ablation that adds dropout must save each rank's own generator.


def lock_run(out_dir):
    """out_dir/run.lock, held for the life of this process (data.lock_file): one training process per folder."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        return lock_file(os.path.join(out_dir, "run.lock"), f"{out_dir} is in use by another training process "
                         "({holder}); wait for it to finish or use another out_dir")
    except OSError as e:
        fail(f"out_dir {out_dir!r} cannot be written: {e.strerror or e}")


def check_resume(cfg, mcfg, ckpt, path, data_id):
    """The settings of a resumed run must be the checkpoint's, except the RESUMABLE ones: {key: [old, new]}. The data
    must be the same (its data_identity); it may have moved (checkpoints without an identity compare the path), and so
    may the tokenizer (the shards' headers have checked it: a Hugging Face one by its fingerprint)."""
    old, new = {**BEFORE, **ckpt["config"]}, dataclasses.asdict(cfg)     # settings newer than the run: as before them
    changed = {k: [old.get(k), v] for k, v in new.items() if old.get(k, v) != v}
    free = RESUMABLE | {"out_dir"} | ({"data_dir", "tokenizer"} if ckpt.get("data_identity") else set())
    wrong = {k: c for k, c in changed.items() if k not in free}
    if ckpt.get("model_config") != dataclasses.asdict(mcfg):
        fail(f"checkpoint {path} is of another model: use another out_dir or the same model")
    if "micro_batch" in changed and "eval_batches" not in changed:    # even with eval off now: the checkpoint keeps it
        n, (was, now) = old["eval_batches"] * old["micro_batch"], changed["micro_batch"]
        fail(f"micro_batch {was} -> {now} changes the validation set (eval_batches · micro_batch = {n} windows): "
             + (f"add --eval_batches={n // now} to keep it" if n % now == 0 else f"keep it with a micro_batch that "
                f"divides {n} windows, or set eval_batches too (another validation set)"))
    if ckpt.get("data_identity") not in (None, data_id):
        fail(f"{cfg.data_dir} holds other data than the run was trained on (identity {data_id}, the run's "
             f"{ckpt['data_identity']}; prepared again?): resume on the run's data or use another out_dir")
    if wrong:
        fail(f"{cfg.out_dir} holds a run with other settings; resuming needs the same ones "
             f"({'; '.join(f'{k}: run {a!r}, now {b!r}' for k, (a, b) in wrong.items())}): use another out_dir")
    return {k: c for k, c in changed.items() if k != "out_dir"}


def read_log(path, last_step):
    """The records of log.jsonl up to last_step (a torn last line from a kill is dropped)."""
    records = []
    for line in open(path) if os.path.exists(path) else []:
        with suppress(json.JSONDecodeError):
            records.append(json.loads(line))
    return [r for r in records if r["step"] <= last_step]


def git(*args):
    """git's output in this repository's folder, or None where git is not installed (many GPU images) or fails."""
    try:
        done = subprocess.run(["git", *args], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)))
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def run_info(device):
    status = git("status", "--porcelain", "--untracked-files=no")
    product, _ = peak_flops(device)
    return {"git_commit": git("rev-parse", "HEAD"), "git_dirty": None if status is None else bool(status),
            "torch": torch.__version__, "python": sys.version.split()[0],
            "platform": platform.platform(), "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "device": torch.cuda.get_device_name(device) if device.type == "cuda"
            else device.type, "peak_flops_of": product, "world_size": int(os.environ.get("WORLD_SIZE", 1)),
            "argv": sys.argv, "time": time.strftime("%Y-%m-%d %H:%M:%S")}


# Peak dense bf16 tensor FLOP/s for MFU, by the product name CUDA reports (a leading "NVIDIA " dropped), matched in
# full: an H100 PCIe or NVL is not an H100 SXM. An unknown device logs mfu = null.
PEAK_FLOPS = [(r"H100( 80GB HBM3| SXM5.*)?", "H100 SXM", 989e12), (r"H100 NVL", "H100 NVL", 835e12),
              (r"H100 PCIe", "H100 PCIe", 756e12), (r"H200( 141GB HBM3e)?", "H200 SXM", 989e12),
              (r"H200 NVL", "H200 NVL", 835e12), (r"GH200.*", "GH200", 989e12), (r"B200", "B200", 2250e12),
              (r"A100[- ].*", "A100", 312e12), (r"A800[- ].*", "A800", 312e12), (r"L40S", "L40S", 362e12),
              (r"L4", "L4", 121e12), (r"A10G", "A10G", 70e12), (r"A10", "A10", 125e12),
              (r"GeForce RTX 4090", "RTX 4090", 165e12), (r"GeForce RTX 3090", "RTX 3090", 71e12),
              (r"AMD Instinct MI300X.*", "MI300X", 1307e12), (r"AMD Instinct MI250X.*", "MI250X", 383e12)]


def peak_flops_of(name):
    """(the product whose peak applies, its peak FLOP/s) of a device name, or (None, None)."""
    name = name.removeprefix("NVIDIA ").strip()
    return next(((product, peak) for pattern, product, peak in PEAK_FLOPS if re.fullmatch(pattern, name)), (None, None))


def peak_flops(device):
    """(product, peak dense bf16 FLOP/s) of a CUDA device (peak_flops_of); (None, None) elsewhere."""
    return peak_flops_of(torch.cuda.get_device_name(device)) if device.type == "cuda" else (None, None)


def run_step(spec, step=None):
    """(run folder, step) of RUN_DIR, RUN_DIR@STEP or RUN_DIR@latest (step None: the latest), as every command names a
    checkpoint; an existing folder whose name holds '@' is itself. `step` (a --step) must not contradict it."""
    run_dir, at, tail = spec.rpartition("@")
    if not at or os.path.isdir(spec):
        return spec, step
    if not (tail.isdigit() or tail == "latest"):
        raise SystemExit(f"error: {spec}: use RUN_DIR, RUN_DIR@STEP (a checkpoint's step) or RUN_DIR@latest")
    if step is not None and str(step) != tail:
        raise SystemExit(f"error: {spec} and --step {step} name two checkpoints: give the step once")
    return run_dir, int(tail) if tail.isdigit() else None


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


def _hf_kwargs(gguf_file=None, revision=None):
    return {k: v for k, v in (("gguf_file", gguf_file), ("revision", revision)) if v}


def hf_name(name_or_path, gguf_file=None, revision=None):
    """How messages name a Hugging Face model: the folder or hub name, its GGUF file, @revision."""
    return (os.path.join(name_or_path, gguf_file) if gguf_file else name_or_path) + (f"@{revision}" if revision else "")


def check_hf_source(path, gguf_file=None, revision=None, local=False):
    """A local model (a path, or `local`) must exist and be a Hugging Face folder or a GGUF file there, and takes no
    revision (from_pretrained ignores it for a folder); a hub name is checked when it is loaded."""
    if not (local or os.path.isabs(path) or path.startswith(".") or os.path.exists(path)):
        return
    where = hf_name(path, gguf_file)
    if revision:
        raise SystemExit(f"error: {where}@{revision}: a revision is a hub branch, tag or commit, but {where} is local "
                         "(give the folder of that checkpoint instead)")
    if gguf_file and not os.path.isfile(where):
        raise SystemExit(f"error: GGUF file {where} does not exist")
    if not os.path.isdir(path):
        raise SystemExit(f"error: Hugging Face model folder {path} does not exist")
    if not gguf_file and not os.path.isfile(os.path.join(path, "config.json")):
        run = " (a run folder of train.py: give it without --hf)" if list_checkpoints(path) else ""
        raise SystemExit(f"error: {path} is not a Hugging Face model folder: it has no config.json{run}")


def load_hf(name_or_path, gguf_file=None, device="cpu", dtype=torch.float32, revision=None):
    """A transformers causal LM and its tokenizer; gguf_file and revision (a hub branch, tag or commit, e.g. Pythia's
    "step1000") are passed to both from_pretrained calls. A failure (missing, offline, not a causal LM, broken files,
    out of memory) is one error line naming the model and the part that failed."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    kwargs, part = _hf_kwargs(gguf_file, revision), "tokenizer"
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
        part = "weights"
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, **kwargs).to(device).eval()
    except Exception as e:
        raise SystemExit(f"error: could not load the {part} of Hugging Face model "
                         f"{hf_name(name_or_path, gguf_file, revision)}: {one_line(e)}") from e
    return model, tokenizer


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


def hf_max_length(config, tokenizer=None, default=2048):
    """As the harness: n_positions, max_position_embeddings, n_ctx (text_config first), model_max_length, 2048."""
    cfg = getattr(config, "text_config", None) or config
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        if getattr(cfg, attr, None) is not None:
            return int(getattr(cfg, attr))
    mml = getattr(tokenizer, "model_max_length", None)
    return int(mml) if mml is not None and mml != 1000000000000000019884624838656 else default


def load_llama(run_dir=None, step=None, hf=None, gguf=None, device="cpu"):
    """(our Llama, tokenizer, name) from a run folder or a Hugging Face Llama (converted to our Llama), for generation;
    a Hugging Face tokenizer's stop_ids are its eos and those of the model's generation_config."""
    if hf:
        hf_model, hf_tok = load_hf(hf, gguf, device)
        if hf_model.config.model_type != "llama":
            raise SystemExit(f"error: {hf} is a {hf_model.config.model_type!r} model; generation runs Llama models")
        enc, eos = HFTokenizer(hf_tok), hf_model.generation_config.eos_token_id   # generate stops where HF's does
        enc.stop_ids = {enc.eot_token, *(eos if isinstance(eos, list) else [] if eos is None else [eos])}
        return Llama.from_hf(hf_model).to(device).eval(), enc, hf
    run_dir, step = run_step(run_dir, step)
    if not os.path.isdir(run_dir):
        raise SystemExit(f"error: run folder {run_dir} does not exist")
    model, enc, meta = load_run(run_dir, step, device)
    return model, enc, f"{run_dir} (step {meta['step']})"
