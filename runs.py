"""
The run folder: the lock that keeps one process per folder, the checks that make a resume exact, the run's records
(config.json, run_info.json, log.jsonl) and its log line. Checkpoints and the weights a run starts from:
checkpoint.py; loading a run for the commands: lib/commands.py.

    run = Run(cfg, mcfg, data_id, rank, ckpts)    # the folder locked and checked: see Run
"""
import dataclasses
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import uuid
from contextlib import suppress

import torch
import torch.distributed as dist

from checkpoint import load_checkpoint
from config import BEFORE, RESUMABLE, fail
from parallel import peak_flops
from files import lock_file, write_atomic
from model import LlamaConfig
from tokenizer import get_tokenizer, tokenizer_tag


class Run:
    """The run folder as the training loop sees it. Opening it locks the folder (rank 0), reads its newest checkpoint
    and checks that this start may resume it:

        run = Run(cfg, mcfg, data_id, rank, ckpts)   # locked, checked: run.step, run.seq_index (0, 0 or the checkpoint's),
                                                  # run.ckpt (the checkpoint to restore, or None)
        run.start(device, header)                 # config.json, run_info.json, log.jsonl cut back; W&B
        run.log(record)                           # a record in log.jsonl (and W&B), its line on stdout: rank 0
        run.stop_requested()                      # this process got SIGTERM / SIGINT (the loop shares it in a step)
    """

    def __init__(self, cfg, mcfg, data_id, rank, ckpts):
        """ckpts: checkpoint.list_checkpoints(cfg.out_dir), as the loop's setup read it once."""
        self.cfg, self.mcfg, self.data_id, self.master = cfg, mcfg, data_id, rank == 0
        self.lock = lock_run(cfg.out_dir) if self.master else None      # held until this process ends
        self.path = ckpts[-1][1] if ckpts else None
        self.ckpt = load_checkpoint(self.path) if ckpts else None
        self.changed = check_resume(cfg, mcfg, self.ckpt, self.path, data_id) if ckpts else {}
        self.step, self.seq_index = (self.ckpt["step"], self.ckpt["data_state"]["seq_index"]) if ckpts else (0, 0)
        self.wandb = None
        self.log_path = os.path.join(cfg.out_dir, "log.jsonl")
        self.signals = signals = []                       # SIGTERM / SIGINT got since this start: saved at the end of
        for sig in (signal.SIGTERM, signal.SIGINT):       # the step (checkpoint); the handler holds the list, not the
            signal.signal(sig, lambda signum, frame: signals.append(signum))   # Run, so its lock dies with it

    def start(self, device, header):
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
        """record into log.jsonl (and W&B); on stdout `line`, or that of a step or eval record unless quiet: a step's
        line shows each of its numbers, as log.jsonl does."""
        if not self.master:
            return
        with open(self.log_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.wandb:
            self.wandb.log(record, step=record["step"])
        if line is None and not quiet and "loss" in record:
            shown = " ".join(f"{k} {v:.4f}" for k, v in record.items() if k not in STEP_FIELDS)
            line = (f"step {record['step']:6d} | {shown} ζ_L {record['zeta_L'] or 0:.2f} | lr {record['lr']:.2e} | "
                    f"grad {record['grad_norm']:.3f} | {record['tok_per_s']:.0f} tok/s"
                    + (f" | mfu {100 * record['mfu']:.1f}%" if record["mfu"] else "")
                    + (f" | compiled {record['compile_s']:.1f} s" if record.get("compile_s") else ""))
        elif line is None and not quiet and "val_loss" in record:
            line = (f"eval {record['step']:6d} | val_loss {record['val_loss']:.4f} | ζ_L "
                    f"{(record['zeta'] or [0])[-1]:.2f} | Ψ {' '.join(f'{p:.3f}' for p in record['psi'])}")
        if line:
            print(line, flush=True)

    def stop_requested(self):
        """Whether this process got SIGTERM / SIGINT since the run started (the loop shares it in the step's stats)."""
        return bool(self.signals)


# a step record's fields that its line shows in their own places; every other field is one of the step's named means
STEP_FIELDS = ("step", "tokens", "zeta_L", "lr", "grad_norm", "tok_per_s", "mfu", "mem_gb", "compile_s")


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


def lock_run(out_dir):
    """out_dir/run.lock, held for the life of this process (files.lock_file): one training process per folder."""
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
    # a model setting added since the checkpoint was written reads as its default there, so older runs still resume
    was = {**dataclasses.asdict(LlamaConfig()), **ckpt.get("model_config", {})}
    if other := [f"{k}: run {v!r}, now {getattr(mcfg, k)!r}" for k, v in was.items() if v != getattr(mcfg, k, None)]:
        fail(f"checkpoint {path} is of another model ({'; '.join(other)}): use another out_dir or the same model")
    if "optimizer" in ckpt and ckpt["optimizer"] is None and not ckpt.get("sharded"):
        fail(f"checkpoint {path} holds weights without optimizer state (a converted model, python -m "
             f"scripts.convert_hf): it is a start, not a run to resume; train from it into a new folder: "
             f"out_dir=NEW init_from={cfg.out_dir}")
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
