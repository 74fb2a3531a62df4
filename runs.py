"""
The run folder and the models we load: checkpoints (one format), the lock that keeps one process per folder, the
checks that make a resume exact, the weights a fine-tuning run starts from, loading a run or a Hugging Face model,
the device, and the run's record of its machine.

    model, enc, meta = load_run("out/kjv/jreg_a1")                # latest checkpoint (or step=N)
    hf_model, hf_tok = load_hf("HuggingFaceTB/SmolLM2-135M-Instruct")
    list_checkpoints(out_dir) -> [(step, path)]                   # complete checkpoints, oldest first

A checkpoint ckpt_NNNNNNN.pt holds the unwrapped model, the optimizer, model_config, config, the tokenizer's tag
(data.tokenizer_tag: a Hugging Face one with its fingerprint), step, tokens, the data position and identity: tensors
and plain values only, read with weights_only=True (a file that needs more is refused; loading it runs no code); written
to a temporary file and renamed, never with non-finite weights.
With sharded_ckpt it is a folder ckpt_NNNNNNN/ instead: each rank's shard of the model and optimizer
(torch.distributed.checkpoint), their index .metadata, and the rest in meta.pt; it resumes on any number of processes.
torch.distributed.checkpoint reads .metadata with pickle: a sharded checkpoint is trusted input, as a config file is;
share weights as scripts/export.py writes them (safetensors).
"""
import argparse
import dataclasses
import json
import os
import pickle
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from contextlib import suppress

import torch
import torch.distributed as dist

from config import BEFORE, RESUMABLE, fail, model_config
from data import (HFTokenizer, get_tokenizer, lock_file, one_line, same_tokenizer, tokenizer_fingerprint, tokenizer_tag,
                  write_atomic)
from lib.progress import timed
from lib.hf import _hf_kwargs, hf_max_length, hf_name, init_weights_hf, llama_from_hf, load_hf
from model import Llama, LlamaConfig


class Run:
    """The run folder as the training loop sees it. Opening it locks the folder (rank 0), reads its newest checkpoint
    and checks that this start may resume it; then the loop calls a few verbs:

        run = Run(cfg, mcfg, data_id, rank)       # locked, checked: run.step, run.seq_index (0, 0 or the checkpoint's)
        run.restore(model, optimizer)             # the checkpoint's weights and optimizer state, if there is one
        run.start(device, model)                  # config.json, run_info.json, log.jsonl cut back; W&B
        run.log(record)                           # a record in log.jsonl (and W&B), its line on stdout: rank 0
        run.stop_requested()                      # this process got SIGTERM / SIGINT (the loop shares it in a step)
        run.count_bad_steps(applied, step, ...)   # a non-finite step logged; too many in a row end the run
        run.checkpoint(step, model, optimizer, seq_index, stop)   # when due, or stopping: saved; True: the loop ends
        run.close()                               # an async save in flight is published
    """

    def __init__(self, cfg, mcfg, data_id, rank):
        self.cfg, self.mcfg, self.data_id, self.master = cfg, mcfg, data_id, rank == 0
        self.lock = lock_run(cfg.out_dir) if self.master else None      # held until this process ends
        ckpts = list_checkpoints(cfg.out_dir)
        self.path = ckpts[-1][1] if ckpts else None
        self.ckpt = load_checkpoint(self.path) if ckpts else None
        self.changed = check_resume(cfg, mcfg, self.ckpt, self.path, data_id) if ckpts else {}
        self.step, self.seq_index = (self.ckpt["step"], self.ckpt["data_state"]["seq_index"]) if ckpts else (0, 0)
        self.bad, self.wandb = 0, None
        self.log_path = os.path.join(cfg.out_dir, "log.jsonl")
        STOP.clear()
        for sig in (signal.SIGTERM, signal.SIGINT):       # saved at the end of the step (checkpoint); the handler holds
            signal.signal(sig, lambda signum, frame: STOP.append(signum))   # no Run, so its lock dies with it

    def restore(self, model, optimizer):
        if self.ckpt is not None:
            restore(self.ckpt, model, optimizer, self.cfg.fsdp)
            self.ckpt = None                                # the memory back

    def start(self, device, model, header):
        """The records of this start (not of a run with nothing left to train, which keeps them as they are), and the
        header line on stdout."""
        cfg, left = self.cfg, self.step < self.cfg.max_steps
        if not self.master:
            return
        if left:
            run_id = write_records(cfg, self.mcfg, self.data_id, self.step, self.changed, device)
            if cfg.wandb_project:
                import wandb
                self.wandb = wandb
                wandb.init(project=cfg.wandb_project, name=cfg.wandb_run_name or None,
                           config=dataclasses.asdict(cfg), id=run_id, resume="allow")   # a resume: the same W&B run
        print((f"resuming from {self.path} at step {self.step}" + (f", changed: {self.changed}" if self.changed
               else "") + "\n" if self.step else "") + header)
        if not left:
            print(f"the run is at step {self.step} (max_steps {cfg.max_steps}): nothing to train; raise max_steps to "
                  "extend it")

    def log(self, record, line=None, quiet=False):
        """record into log.jsonl (and W&B); on stdout `line`, or that of a step or eval record unless quiet."""
        if not self.master:
            return
        with open(self.log_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.wandb:
            self.wandb.log(record, step=record["step"])
        if line is None and not quiet and "loss" in record:
            line = (f"step {record['step']:6d} | loss {record['loss']:.4f} ce {record['ce']:.4f} jreg "
                    f"{record['jreg']:.4f} ζ_L {record['zeta_L'] or 0:.2f} | lr {record['lr']:.2e} | grad "
                    f"{record['grad_norm']:.3f} | {record['tok_per_s']:.0f} tok/s"
                    + (f" | mfu {100 * record['mfu']:.1f}%" if record["mfu"] else ""))
        elif line is None and not quiet and "val_loss" in record:
            line = (f"eval {record['step']:6d} | val_loss {record['val_loss']:.4f} | ζ_L "
                    f"{(record['zeta'] or [0])[-1]:.2f} | Ψ {' '.join(f'{p:.3f}' for p in record['psi'])}")
        if line:
            print(line, flush=True)

    def count_bad_steps(self, applied, step, seq_index, loss, grad_norm, lr):
        """A step not applied had a non-finite loss or gradient norm (tensors, read only then): nothing of it was
        applied and the data moves on past its batch (sequences seq_index on). It is logged; the bad-th in a row beyond
        max_bad_steps ends the run, naming the last checkpoint and a change that resume accepts."""
        cfg, self.bad = self.cfg, 0 if applied else self.bad + 1
        bad = self.bad
        if applied:
            return
        loss, grad_norm = loss.item(), grad_norm.item()
        if bad > cfg.max_bad_steps:
            finish_checkpoint()                                           # an async save in flight is published
            last = list_checkpoints(cfg.out_dir)
            fail(f"non-finite loss {loss} or gradient norm {grad_norm} at step {step} (data from sequence "
                 f"{seq_index}), {bad} in a row (max_bad_steps = {cfg.max_bad_steps}); nothing of "
                 f"{'it' if bad == 1 else f'steps {step - bad + 1}-{step}'} was applied. The last checkpoint is "
                 f"{last[-1][1] if last else '(none)'}: rerun with a lower lr (e.g. --lr={cfg.lr / 2:g}), grad_clip "
                 f"or a higher max_bad_steps to resume from it")
        self.log({"step": step, "tokens": step * cfg.batch_tokens, "skipped": bad, "seq_index": seq_index,
                  "bad_loss": loss, "bad_grad_norm": grad_norm, "lr": lr},
                 f"step {step:6d} | skipped: non-finite loss {loss} or gradient norm {grad_norm}, data from sequence "
                 f"{seq_index} | {bad} in a row (max_bad_steps = {cfg.max_bad_steps})")

    def stop_requested(self):
        """Whether this process got SIGTERM / SIGINT since the run started (the loop shares it in the step's stats)."""
        return bool(STOP)

    def checkpoint(self, step, model, optimizer, seq_index, stop=False):
        """Save at every ckpt_interval, at max_steps, and when some process was asked to stop (stop, the same on every
        process: then True, the loop ends)."""
        cfg = self.cfg
        if step % cfg.ckpt_interval == 0 or step == cfg.max_steps or stop:
            save_checkpoint(cfg, step, model, optimizer, seq_index, self.data_id)
        if stop and self.master:
            print(f"stopped by signal at step {step}; checkpoint saved, rerun the same command to resume")
        return stop

    def close(self):
        finish_checkpoint()                                               # an async save still in flight


STOP = []   # the signals this process got since its Run started


def write_records(cfg, mcfg, data_id, step, changed, device):
    """config.json (settings, the run's id and the history of starts and resumes), run_info.json, log.jsonl cut back
    to step. Returns the run id."""
    info = run_info(device)
    saved = os.path.join(cfg.out_dir, "config.json")
    old = json.load(open(saved)) if step and os.path.exists(saved) else {}
    history = old.get("history", []) + [{"step": step, "changed": changed, **{k: info[k] for k in (
        "argv", "time", "git_commit", "git_dirty", "torch", "device", "world_size")}}]   # run_info.json: the last start's
    run_id = old.get("run_id") or uuid.uuid4().hex[:16]      # the run's for its life: its Weights & Biases run id
    write_atomic(saved, json.dumps({"config": dataclasses.asdict(cfg), "model_config": dataclasses.asdict(mcfg),
                                    "tokenizer": tokenizer_tag(cfg.tokenizer), "data_identity": data_id,
                                    "run_id": run_id, "history": history}, indent=2))
    write_atomic(os.path.join(cfg.out_dir, "run_info.json"), json.dumps(info, indent=2))
    folder = os.path.join(cfg.out_dir, "tokenizer")
    if not step:                                        # a fresh start: no tokenizer of an earlier, killed attempt
        shutil.rmtree(folder, ignore_errors=True)
    if cfg.tokenizer.startswith("hf:") and not os.path.isdir(folder):
        get_tokenizer(cfg.tokenizer).hf.save_pretrained(folder + ".tmp")  # the model's own tokenizer and chat template,
        os.replace(folder + ".tmp", folder)                                # for load_run and export.py
    log_path = os.path.join(cfg.out_dir, "log.jsonl")
    kept = read_log(log_path, step) if step else []     # records past the checkpoint are redone
    write_atomic(log_path, "".join(json.dumps(r) + "\n" for r in kept))
    return run_id


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


PENDING = []   # an async sharded save in flight: (future, its .tmp folder, its final name, the config)


def finish_checkpoint():
    """Wait for the async save in flight, if any, and give it its final name."""
    from torch.distributed.checkpoint.api import CheckpointException
    while PENDING:
        future, tmp, path, cfg = PENDING.pop()
        try:
            future.result()
        except (OSError, RuntimeError, CheckpointException) as e:
            cannot_write(cfg, path, e, partial=tmp)
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
    """The model, optimizer, data position and identity (data_identity) of `step`. By default rank 0
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
            with timed(f"writing checkpoint {path}"):              # minutes at the paper's sizes: said in the log
                torch.save({"model": model_sd, "optimizer": optim_sd, **meta}, path + ".tmp")
        except (OSError, RuntimeError) as e:          # a full disk: torch's stream writer raises a RuntimeError
            cannot_write(cfg, path, e, partial=path + ".tmp")
        os.replace(path + ".tmp", path)
        prune(cfg)


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


def save_sharded(cfg, path, model, optimizer, meta, master):
    """Each rank writes its shard (torch.distributed.checkpoint) into path.tmp/, rank 0 also the record (meta.pt) and,
    last, the index of the shards (.metadata); once every rank is done, rank 0 renames it to path (finish_checkpoint).
    With async_ckpt the state is copied to CPU here and written while training goes on, on a gloo group of its own."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.checkpoint.api import CheckpointException    # a BaseException: every rank's errors
    tmp = path + ".tmp"
    if master:
        shutil.rmtree(tmp, ignore_errors=True)            # what a killed save left
        try:
            os.makedirs(tmp)
            torch.save(meta, os.path.join(tmp, "meta.pt"))
        except (OSError, RuntimeError) as e:
            cannot_write(cfg, path, e, partial=tmp)
    if dist.is_initialized():
        dist.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)   # DTensor shards under FSDP, the whole under DDP
    state = {"model": model_sd, "optimizer": optim_sd}
    if not cfg.async_ckpt:
        try:
            with timed(f"writing checkpoint {path}"):
                dcp.save(state, checkpoint_id=tmp, no_dist=not dist.is_initialized())
        except (OSError, RuntimeError, CheckpointException) as e:   # every rank: dcp.save gathers the ranks' errors
            cannot_write(cfg, path, e, partial=tmp)
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
