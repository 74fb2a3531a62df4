"""
The run folder: its checkpoints, the lock that keeps one process per folder, the checks that make a resume exact,
the weights a fine-tuning run starts from, and the run's record of its machine. (Loading a run for the commands:
lib/commands.py.)

    run = Run(cfg, mcfg, data_id, rank)                           # the verbs train.py calls: see Run
    list_checkpoints(out_dir) -> [(step, path)]                   # complete checkpoints, oldest first
    ckpt = load_checkpoint(path); model_state(ckpt)               # a checkpoint's record and its full weights

A checkpoint ckpt_NNNNNNN.pt holds the unwrapped model, the optimizer, model_config, config, the tokenizer's tag
(data.tokenizer_tag: a Hugging Face one with its fingerprint), step, tokens, the data position and identity: tensors
and plain values only, read with weights_only=True (a file that needs more is refused; loading it runs no code); written
to a temporary file and renamed, never with non-finite weights.
With sharded_ckpt it is a folder ckpt_NNNNNNN/ instead: each rank's shard of the model and optimizer
(torch.distributed.checkpoint), their index .metadata, and the rest in meta.pt; it resumes on any number of processes.
torch.distributed.checkpoint reads .metadata with pickle: a sharded checkpoint is trusted input, as a config file is;
share weights as scripts/export.py writes them (safetensors).
"""
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
from data import get_tokenizer, lock_file, one_line, same_tokenizer, tokenizer_tag, write_atomic
from lib.progress import timed
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
        self.pending, self.async_group = None, None       # an async sharded save in flight; the gloo group it uses
        self.signals = signals = []                       # SIGTERM / SIGINT got since this start: saved at the end of
        for sig in (signal.SIGTERM, signal.SIGINT):       # the step (checkpoint); the handler holds the list, not the
            signal.signal(sig, lambda signum, frame: signals.append(signum))   # Run, so its lock dies with it

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
            self.finish()                                                 # an async save in flight is published
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
        return bool(self.signals)

    def checkpoint(self, step, model, optimizer, seq_index, stop=False):
        """Save at every ckpt_interval, at max_steps, and when some process was asked to stop (stop, the same on every
        process: then True, the loop ends)."""
        cfg = self.cfg
        if step % cfg.ckpt_interval == 0 or step == cfg.max_steps or stop:
            self.save(step, model, optimizer, seq_index)
        if stop and self.master:
            print(f"stopped by signal at step {step}; checkpoint saved, rerun the same command to resume")
        return stop

    def save(self, step, model, optimizer, seq_index):
        """The model, optimizer, data position and identity (data_identity) of `step`. By default rank 0 writes the
        full (unsharded, uncompiled) state as one file; with sharded_ckpt each rank writes its own shard
        (torch.distributed.checkpoint) into a folder, in the background with async_ckpt. Either way it is written
        under a temporary name and renamed when whole. A model with a non-finite parameter is never saved."""
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
                "tokenizer_tag": tokenizer_tag(cfg.tokenizer), "step": step, "tokens": step * cfg.batch_tokens,
                "data_state": {"seq_index": seq_index}, "data_identity": self.data_id}
        path = os.path.join(cfg.out_dir, f"ckpt_{step:07d}" + ("" if cfg.sharded_ckpt else ".pt"))
        if cfg.sharded_ckpt:
            return self.save_sharded(path, model, optimizer, meta)
        if cfg.fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
            model_sd, optim_sd = get_state_dict(model, optimizer,
                                                options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        else:
            model_sd, optim_sd = model.state_dict(), optimizer.state_dict()
        if self.master:
            try:
                with timed(f"writing checkpoint {path}"):          # minutes at the paper's sizes: said in the log
                    torch.save({"model": model_sd, "optimizer": optim_sd, **meta}, path + ".tmp")
            except (OSError, RuntimeError) as e:      # a full disk: torch's stream writer raises a RuntimeError
                cannot_write(cfg, path, e, partial=path + ".tmp")
            os.replace(path + ".tmp", path)
            prune(cfg)

    def save_sharded(self, path, model, optimizer, meta):
        """Each rank writes its shard (torch.distributed.checkpoint) into path.tmp/, rank 0 also the record (meta.pt)
        and, last, the index of the shards (.metadata); once every rank is done, rank 0 renames it to path (publish).
        With async_ckpt the state is copied to CPU here and written while training goes on, on a gloo group of its
        own; finish() publishes it."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict
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
        model_sd, optim_sd = get_state_dict(model, optimizer)   # DTensor shards under FSDP, the whole under DDP
        state = {"model": model_sd, "optimizer": optim_sd}
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
        from torch.distributed.checkpoint.api import CheckpointException
        if self.pending is None:
            return
        (future, tmp, path), self.pending = self.pending, None
        try:
            future.result()
        except (OSError, RuntimeError, CheckpointException) as e:
            cannot_write(self.cfg, path, e, partial=tmp)
        publish(tmp, path, self.cfg)

    def close(self):
        self.finish()                                                     # an async save still in flight


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
    if wrong := [f"{k} = {cfg.shape[k]!r} (the weights': {v!r})" for k, v in shape.items()
                 if cfg.shape.get(k, v) != v]:
        fail(f"init_from {cfg.init_from!r} gives the model's shape, but {', '.join(wrong)}: leave them out")
    return sd, mcfg


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


def restore(ckpt, model, optimizer, fsdp):
    """The checkpoint's weights and optimizer state, whether it was written with or without FSDP, as one
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
