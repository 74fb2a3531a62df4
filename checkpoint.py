"""
Checkpoints: writing and reading a run's weights, optimizer state and data position, one path for one process, DDP
and FSDP alike (torch.distributed.checkpoint.state_dict gives the full or sharded state of any of them).

    saver = Checkpoints(cfg, data_id)             # the run's checkpoints, as the loop writes them
    saver.save(step, model, optimizer, seq_index) # ckpt_NNNNNNN.pt (or a sharded ckpt_NNNNNNN/), then the old pruned
    saver.finish()                                # an async save in flight waited for and published
    list_checkpoints(out_dir) -> [(step, path)]   # complete checkpoints, oldest first
    ckpt = load_checkpoint(path); model_state(ckpt)   # a checkpoint's record and its full weights
    restore(ckpt, model, optimizer)               # its weights and optimizer state into a model built as cfg says
    init_sd, mcfg = start_weights(cfg, ckpts)     # the weights init_from names (or None) and the model's shape
    run_dir, step = run_step("RUN_DIR@STEP")      # how every command names a checkpoint

A checkpoint ckpt_NNNNNNN.pt holds the unwrapped model, the optimizer (its state by parameter name), model_config,
config, the tokenizer's tag (tokenizer.tokenizer_tag: a Hugging Face one with its fingerprint), step, tokens, the data
position and identity: tensors and plain values only, read with weights_only=True (a file that needs more is refused;
loading it runs no code); written to a temporary file and renamed, never with non-finite weights.
With sharded_ckpt it is a folder ckpt_NNNNNNN/ instead: each rank's shard of the model and optimizer
(torch.distributed.checkpoint), their index .metadata, and the rest in meta.pt; it resumes on any number of processes.
torch.distributed.checkpoint reads .metadata with pickle: a sharded checkpoint is trusted input, as a config file is;
share weights as scripts/export.py writes them (safetensors).
No random-number state is saved (older checkpoints' "rng" is ignored): training draws no random numbers after the
seeded initialisation (no dropout; the data order is numpy's, seeded by seed and epoch), so a resume is exact on any
number of processes. An ablation that adds dropout must save each rank's own generator (docs/ablations.md).
"""
import dataclasses
import os
import pickle
import re
import shutil
import sys
import time
from contextlib import suppress

import torch
import torch.distributed as dist

from config import fail, model_config
from files import one_line
from model import Llama, LlamaConfig
from tokenizer import same_tokenizer, tokenizer_tag


class Checkpoints:
    """The checkpoints of the run in cfg.out_dir as the loop writes them: save() at a step, finish() an async save."""

    def __init__(self, cfg, data_id):
        self.cfg, self.data_id, self.master = cfg, data_id, int(os.environ.get("RANK", 0)) == 0
        self.pending, self.async_group = None, None       # an async sharded save in flight; the gloo group it uses
        self.tokenizer_tag = tokenizer_tag(cfg.tokenizer)  # once: a Hugging Face tokenizer's fingerprint reads its files

    def save(self, step, model, optimizer, seq_index):
        """The model, optimizer, data position and identity (data_identity) of `step`. By default rank 0 writes the
        full (unsharded, uncompiled) state as one file; with sharded_ckpt each rank writes its own shard
        (torch.distributed.checkpoint) into a folder, in the background with async_ckpt. Either way it is written
        under a temporary name and renamed when whole. A model with a non-finite parameter is never saved."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
        cfg = self.cfg
        self.finish()                              # the save in flight first: it may be the last good checkpoint
        bad = torch.tensor(float(any(not torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all()
                                     for p in model.parameters())), device=next(model.parameters()).device)  # NCCL
        if dist.is_initialized():
            dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        if bad.item():
            fail(f"non-finite parameters after step {step}: nothing saved. {last_good(cfg)}, with a lower lr or "
                 "grad_clip")
        meta = {"model_config": dataclasses.asdict(model.config), "config": dataclasses.asdict(cfg),
                "tokenizer_tag": self.tokenizer_tag, "step": step, "tokens": step * cfg.batch_tokens,
                "data_state": {"seq_index": seq_index}, "data_identity": self.data_id}
        path = os.path.join(cfg.out_dir, f"ckpt_{step:07d}" + ("" if cfg.sharded_ckpt else ".pt"))
        if cfg.sharded_ckpt:                                      # each rank's shards (DTensors under FSDP)
            return self.save_sharded(path, get_state_dict(model, optimizer), meta)
        model_sd, optim_sd = get_state_dict(model, optimizer,     # the whole, on rank 0's CPU
                                            options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.master:
            try:
                with timed(f"writing checkpoint {path}"):          # minutes at the paper's sizes: said in the log
                    torch.save({"model": model_sd, "optimizer": optim_sd, **meta}, path + ".tmp")
            except (OSError, RuntimeError) as e:      # a full disk: torch's stream writer raises a RuntimeError
                cannot_write(cfg, path, e, partial=path + ".tmp")
            os.replace(path + ".tmp", path)
            prune(cfg)

    def save_sharded(self, path, state_dicts, meta):
        """Each rank writes its shard (torch.distributed.checkpoint) into path.tmp/, rank 0 also the record (meta.pt)
        and, last, the index of the shards (.metadata); once every rank is done, rank 0 renames it to path (publish).
        With async_ckpt the state is copied to CPU here and written while training goes on, on a gloo group of its
        own; finish() publishes it."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException    # a BaseException: every rank's errors
        cfg, tmp = self.cfg, path + ".tmp"
        if self.master:
            shutil.rmtree(tmp, ignore_errors=True)            # what a killed save left
            try:
                os.makedirs(tmp)
                torch.save(meta, os.path.join(tmp, "meta.pt"))
            except (OSError, RuntimeError) as e:
                cannot_write(cfg, path, e, partial=tmp)
        if dist.is_initialized():
            dist.barrier()
        state = dict(zip(("model", "optimizer"), state_dicts))
        if not cfg.async_ckpt:
            try:
                with timed(f"writing checkpoint {path}"):
                    dcp.save(state, checkpoint_id=tmp, no_dist=not dist.is_initialized())
            except (OSError, RuntimeError, CheckpointException) as e:   # every rank: dcp.save gathers their errors
                cannot_write(cfg, path, e, partial=tmp)
            return publish(tmp, path, cfg)
        if dist.is_initialized() and self.async_group is None:     # made once, by every rank at the same point
            self.async_group = dist.new_group(backend="gloo")
        self.pending = (dcp.async_save(state, checkpoint_id=tmp, process_group=self.async_group,
                                       no_dist=not dist.is_initialized()), tmp, path)

    def finish(self):
        """Wait for the async save in flight, if any, and give it its final name."""
        if self.pending is None:
            return
        from torch.distributed.checkpoint.api import CheckpointException
        (future, tmp, path), self.pending = self.pending, None
        try:
            future.result()
        except (OSError, RuntimeError, CheckpointException) as e:
            cannot_write(self.cfg, path, e, partial=tmp)
        publish(tmp, path, self.cfg)


def timed(what):
    """`what ...` before the work and `what: done in N s` after it, on stderr, from rank 0 only."""
    class Timed:
        def __enter__(self):
            self.start = time.perf_counter()
            if int(os.environ.get("RANK", 0)) == 0:
                print(f"{what} ...", file=sys.stderr, flush=True)

        def __exit__(self, kind, *_):
            if kind is None and int(os.environ.get("RANK", 0)) == 0:
                print(f"{what}: done in {round(time.perf_counter() - self.start)} s", file=sys.stderr, flush=True)
    return Timed()


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
    """The checkpoint dict: model, optimizer, model_config, config, tokenizer_tag, step, tokens, data_state. A
    file is memory-mapped, so the ranks of one node share a copy in the page cache; a sharded folder gives its record
    with model and optimizer None and "sharded" its path (model_state reads its weights, restore all of it)."""
    sharded = os.path.isdir(path)
    try:
        if sharded and not os.path.isfile(os.path.join(path, ".metadata")):
            raise FileNotFoundError("incomplete: no .metadata (the shards' index)")
        ckpt = torch.load(os.path.join(path, "meta.pt") if sharded else path, map_location="cpu",
                          weights_only=True, mmap=not sharded)   # tensors and plain values only: loading runs no code
    except pickle.UnpicklingError as e:
        fail(f"refused checkpoint {path}: it holds objects other than tensors and plain values, which only a full "
             f"unpickling would build, and that can run any code (ours never hold one): {one_line(e, 120)}")
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



def restore(ckpt, model, optimizer):
    """The checkpoint's weights and optimizer state into the model and optimizer as built (one process, DDP or FSDP),
    whether it was written with or without FSDP, as one file or sharded (on any number of processes:
    torch.distributed.checkpoint reshards by parameter name)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
    if ckpt.get("sharded"):
        import torch.distributed.checkpoint as dcp
        state = dict(zip(("model", "optimizer"), get_state_dict(model, optimizer)))
        dcp.load(state, checkpoint_id=ckpt["sharded"], no_dist=not dist.is_initialized())
        return set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    optim_sd = ckpt["optimizer"]
    if isinstance(optim_sd["param_groups"][0]["params"][0], int):   # written by optimizer.state_dict(): by position
        names = {id(p): n for n, p in model.named_parameters()}
        name = dict(zip((i for g in optim_sd["param_groups"] for i in g["params"]),
                        (names[id(p)] for g in optimizer.param_groups for p in g["params"])))
        optim_sd = {"state": {name[k]: v for k, v in optim_sd["state"].items()}, "param_groups": [
            {**g, "params": [name[i] for i in g["params"]]} for g in optim_sd["param_groups"]]}
    set_state_dict(model, optimizer, model_state_dict=ckpt["model"], optim_state_dict=optim_sd,
                   options=StateDictOptions(full_state_dict=True))


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



def last_good(cfg):
    last = list_checkpoints(cfg.out_dir)
    return f"The last good checkpoint is {last[-1][1] if last else '(none)'}; rerun to resume from it"



def cannot_write(cfg, path, e, partial=None):
    """A checkpoint that could not be written (a full disk, say): its partial file or folder removed, one error line
    with the free space and the last good checkpoint; what was there before (the log, that checkpoint) stays."""
    if partial and os.path.isdir(partial):
        shutil.rmtree(partial, ignore_errors=True)
    elif partial:
        with suppress(OSError):
            os.remove(partial)
    if failures := getattr(e, "failures", None):        # torch.distributed.checkpoint's: (error, trace) of each rank
        e = next(iter(failures.values()))[0]
    free = shutil.disk_usage(cfg.out_dir).free / 2**30
    fail(f"cannot write checkpoint {path}: {one_line(e)}. {free:.1f} GiB free in {cfg.out_dir}. {last_good(cfg)}, "
         "once there is room")


def start_weights(cfg, ckpts):
    """(state dict or None, model config) to build the model from; ckpts: list_checkpoints(cfg.out_dir). A fine-tuning
    run that has a checkpoint resumes from it and never reads init_from again (the source may since have been pruned,
    deleted or gone offline); a shape setting that contradicts the weights' is an error, not silently ignored."""
    if not cfg.init_from:
        return None, model_config(cfg)
    if ckpts:
        sd, mcfg = None, LlamaConfig(**load_checkpoint(ckpts[-1][1])["model_config"])
    else:
        sd, mcfg = init_weights(cfg.init_from, cfg.tokenizer)
    shape = {f.name: getattr(mcfg, f.name) for f in dataclasses.fields(LlamaConfig)}
    if wrong := [f"{k} = {cfg.shape[k]!r} (the weights': {v!r})" for k, v in shape.items()
                 if cfg.shape.get(k, v) != v]:
        fail(f"init_from {cfg.init_from!r} gives the model's shape, but {', '.join(wrong)}: leave them out")
    return sd, model_config(cfg, mcfg)


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


def init_weights(spec, tokenizer):
    """(state dict, model config) of the weights a fine-tuning run starts from: RUN_DIR, RUN_DIR@STEP or RUN_DIR@latest
    (a Hugging Face model: converted into a run folder first, scripts/convert_hf.py); they must have been trained with
    `tokenizer` (the data's)."""
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
