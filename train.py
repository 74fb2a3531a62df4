"""
Pre-train a Llama with or without JREG (loss = CE + λ · Σ_l w_l Ψ_l).

    python train.py configs/tiny.py                               # one process (CPU or one GPU)
    python train.py configs/tiny_jreg.py --max_steps=50 --lr=1e-3  # --key=value overrides the config file
    torchrun --nproc_per_node=8 train.py configs/170m_jreg.py     # DDP (or FSDP2 with --fsdp=True)

Every setting and its default is in `Config` below; a config file is a Python file assigning some of them.
Starting a run in an out_dir that holds a checkpoint resumes it exactly.
"""
import dataclasses
import glob
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from jreg import WEIGHTINGS, displacement, jump_rate, layer_weights, streams
from model import PRESETS, Llama, LlamaConfig


# ----------------------------------------------------------------------------------------------------------
# Configuration: the one place that holds every setting with its default

@dataclass
class Config:
    # run
    out_dir: str = "out/run"
    seed: int = 1337
    device: str = "auto"            # auto | cpu | cuda | cuda:N | mps
    dtype: str = "auto"             # auto (bf16 autocast on CUDA, fp32 elsewhere) | bfloat16 | float32
    compile: bool = True            # torch.compile the training forward (eval stays eager)
    fsdp: bool = False              # FSDP2 (fully_shard) instead of DDP: shards parameters and optimizer state
    # data (shards written by prepare_fineweb.py)
    data_dir: str = "data/fineweb_edu"
    tokenizer: str = "gpt2"         # must match the shards' header
    # model: a preset from model.PRESETS; any field set below (not None) overrides it
    model: str = "170m"
    vocab_size: int = None
    n_layer: int = None
    n_head: int = None
    n_kv_head: int = None
    d_model: int = None
    ffn_hidden: int = None
    rope_theta: float = None
    tie_embeddings: bool = None
    # batch: batch_tokens per optimizer step = micro_batch · seq_len · world_size · grad_accum
    batch_tokens: int = 524288
    micro_batch: int = 16
    seq_len: int = 2048
    # optimiser and schedule
    max_steps: int = 200000
    lr: float = 6e-4
    min_lr_ratio: float = 0.1       # cosine decays to lr · min_lr_ratio
    warmup_steps: int = 2000
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    # JREG
    jreg_lambda: float = 0.0        # 0 = the baseline, exactly
    jreg_alpha: float = 1.0
    jreg_weighting: str = "index"   # index: softmax(α·l) | depth: softmax(α·l/L) | uniform | last
    jreg_final_norm: bool = False   # h_L = raw residual stream (False) or after the final RMSNorm (True, HF's view)
    jreg_skip_first: bool = False   # leave position 0 out of Ψ
    # logging, evaluation, checkpoints
    log_interval: int = 1
    eval_interval: int = 1000
    eval_batches: int = 20          # fixed validation batches (of micro_batch sequences) per eval
    ckpt_interval: int = 1000
    keep_ckpts: int = 3
    wandb_project: str = ""
    wandb_run_name: str = ""


class RunError(ValueError):
    """A user error (config, data, checkpoint): reported as one line, nothing written."""


def parse_value(key, text, ftype):
    """Turn a command-line string into the field's type, or fail naming the key."""
    if ftype is bool:
        if text.lower() in ("true", "1", "yes"):
            return True
        if text.lower() in ("false", "0", "no"):
            return False
        raise RunError(f"config key {key!r}: expected a bool, got {text!r}")
    try:
        return ftype(float(text)) if ftype is int and "e" in text.lower() else ftype(text)
    except ValueError:
        raise RunError(f"config key {key!r}: expected {ftype.__name__}, got {text!r}") from None


def check_type(key, value, ftype):
    if ftype is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if ftype is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, ftype) or (ftype is int and isinstance(value, bool)):
        raise RunError(f"config key {key!r}: expected {ftype.__name__}, got {type(value).__name__} {value!r}")
    return value


def read_config_file(path):
    """The settings a config file assigns. `include("other.py")` inside it first reads another file of the same
    folder, so a JREG config can be its baseline plus the lines that differ."""
    if not os.path.isfile(path):
        raise RunError(f"config file {path!r} does not exist")
    namespace = {"include": lambda name: namespace.update(read_config_file(os.path.join(os.path.dirname(path), name)))}
    exec(compile(open(path).read(), path, "exec"), namespace)
    return {k: v for k, v in namespace.items()
            if not (k.startswith("_") or k == "include" or callable(v) or type(v).__name__ == "module")}


def load_config(argv):
    """Config from `[config.py] [--key=value ...]`: defaults <- config file <- command line."""
    types = {f.name: f.type for f in dataclasses.fields(Config)}
    values = {}
    for arg in argv:
        if arg.startswith("--"):
            key, sep, text = arg[2:].partition("=")
            if key not in types:
                raise RunError(f"unknown config key {key!r} (from the command line)")
            if not sep:
                raise RunError(f"config key {key!r}: use --{key}=VALUE")
            values[key] = parse_value(key, text, types[key])
        else:
            for key, value in read_config_file(arg).items():
                if key not in types:
                    raise RunError(f"unknown config key {key!r} in {arg}")
                values[key] = value
    cfg = Config()
    for key, value in values.items():
        if value is not None:
            value = check_type(key, value, types[key])
        setattr(cfg, key, value)
    if cfg.model not in PRESETS:
        raise RunError(f"config key 'model': unknown preset {cfg.model!r}; choose one of {sorted(PRESETS)}")
    if cfg.jreg_weighting not in WEIGHTINGS:
        raise RunError(f"config key 'jreg_weighting': {cfg.jreg_weighting!r} is not one of {WEIGHTINGS}")
    return cfg


def model_config(cfg):
    overrides = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(LlamaConfig)
                 if hasattr(cfg, f.name) and getattr(cfg, f.name) is not None}
    overrides["max_seq_len"] = max(cfg.seq_len, PRESETS[cfg.model].max_seq_len)
    return dataclasses.replace(PRESETS[cfg.model], **overrides)


# ----------------------------------------------------------------------------------------------------------
# Data: a deterministic, resumable stream of (seq_len + 1)-token windows over the shards

def load_shards(data_dir, split, tokenizer, vocab_size):
    """The token arrays (memory-mapped) of one split, checked against the model's tokenizer and vocabulary."""
    from prepare_fineweb import list_shards, read_shard
    arrays = []
    try:
        for path in list_shards(data_dir, split):
            tokens, header = read_shard(path, tokenizer=tokenizer)
            if header["vocab_size"] > vocab_size:
                raise RunError(f"{path}: vocabulary of {header['vocab_size']} tokens does not fit the model's "
                               f"vocab_size {vocab_size}")
            arrays.append(tokens)
    except (ValueError, FileNotFoundError) as e:
        raise RunError(str(e)) from e
    return arrays


class ShardStream:
    """Sequence k of an endless stream: epoch e = k // N visits the shards in an order drawn from (seed, e) and
    the windows of each shard in an order drawn from (seed, e, shard). Random access by k, so the loader's whole
    state is one integer, and the global batch does not depend on the number of processes."""

    def __init__(self, data_dir, split, seq_len, seed, tokenizer, vocab_size):
        self.shards = load_shards(data_dir, split, tokenizer, vocab_size)
        self.seq_len, self.seed = seq_len, seed
        self.n_windows = np.array([(len(s) - 1) // seq_len for s in self.shards])
        self.per_epoch = int(self.n_windows.sum())
        if self.per_epoch == 0:
            raise RunError(f"{data_dir}: no {split} shard holds {seq_len + 1} tokens")
        self._epoch, self._order = None, None

    def _epoch_order(self, epoch):
        if self._epoch != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            shard_order = rng.permutation(len(self.shards))
            self._order = (shard_order, np.cumsum(self.n_windows[shard_order]), {})
            self._epoch = epoch
        return self._order

    def position(self, k):
        """(shard, first token) of sequence k."""
        epoch, i = divmod(k, self.per_epoch)
        shard_order, ends, perms = self._epoch_order(epoch)
        j = int(np.searchsorted(ends, i, side="right"))
        shard = int(shard_order[j])
        if shard not in perms:
            perms[shard] = np.random.default_rng([self.seed, epoch, shard]).permutation(self.n_windows[shard])
        return shard, int(perms[shard][i - (ends[j] - self.n_windows[shard])]) * self.seq_len

    def window(self, k):
        shard, start = self.position(k)
        return self.shards[shard][start:start + self.seq_len + 1]

    def batch(self, first, count):
        w = torch.from_numpy(np.stack([self.window(k) for k in range(first, first + count)]).astype(np.int64))
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()


def val_batches(data_dir, cfg, vocab_size, rank, world):
    """The fixed validation set: the first eval_batches · micro_batch windows of the val shards, in order,
    strided over ranks (the same number on each)."""
    tokens = np.concatenate(load_shards(data_dir, "val", cfg.tokenizer, vocab_size))
    n = min(cfg.eval_batches * cfg.micro_batch, (len(tokens) - 1) // cfg.seq_len) // world * world
    if n == 0:
        raise RunError(f"{data_dir}: the val shards hold fewer than {world} windows of {cfg.seq_len + 1} tokens")
    windows = np.stack([tokens[i * cfg.seq_len: i * cfg.seq_len + cfg.seq_len + 1] for i in range(n)])
    windows = torch.from_numpy(windows.astype(np.int64))[rank::world]
    return [(w[:, :-1], w[:, 1:]) for w in windows.split(cfg.micro_batch)]


# ----------------------------------------------------------------------------------------------------------
# The training objective: one forward gives CE, Ψ and the penalty

class JregObjective(nn.Module):
    """loss = CE + λ · Σ_l w_l Ψ_l. Wraps the model so that torch.compile sees forward and penalty as one graph."""

    def __init__(self, model, cfg):
        super().__init__()
        self.model, self.cfg = model, cfg
        self.register_buffer("weights", layer_weights(model.config.n_layer, cfg.jreg_alpha, cfg.jreg_weighting),
                             persistent=False)

    def forward(self, x, y):
        cfg = self.cfg
        out = self.model(x, y)
        hs = streams(out, cfg.jreg_final_norm)
        if cfg.jreg_lambda == 0:                      # the baseline: Ψ only for the log, outside autograd
            hs = [h.detach() for h in hs]
        psi = displacement(hs, skip_first=cfg.jreg_skip_first)
        penalty = (self.weights * psi).sum()
        loss = out.loss + cfg.jreg_lambda * penalty if cfg.jreg_lambda else out.loss
        return loss, out.loss.detach(), penalty.detach(), psi.detach()


def lr_at(step, cfg):
    """Linear warm-up to cfg.lr, then cosine decay to cfg.lr · min_lr_ratio at max_steps."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


# peak dense bf16 tensor FLOP/s by device name, for MFU; unknown devices log mfu = null
PEAK_FLOPS = [("H200", 989e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("GH200", 989e12), ("B200", 2250e12),
              ("A100", 312e12), ("A800", 312e12), ("L40S", 362e12), ("L4", 121e12), ("A10G", 70e12),
              ("A10", 125e12), ("RTX 4090", 165e12), ("RTX 3090", 71e12), ("MI300X", 1307e12), ("MI250X", 383e12)]


def peak_flops(device):
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_FLOPS if key in name), None)


# ----------------------------------------------------------------------------------------------------------
# Checkpoints: written to a temporary file and renamed; the newest complete one is resumed

def checkpoint_paths(out_dir):
    return sorted(glob.glob(os.path.join(out_dir, "ckpt_*.pt")))


def save_checkpoint(cfg, step, model, optimizer, seq_index, fsdp):
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
        model_sd, optim_sd = get_state_dict(model, optimizer,
                                            options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    else:
        model_sd, optim_sd = model.state_dict(), optimizer.state_dict()
    if int(os.environ.get("RANK", 0)) != 0:
        return
    ckpt = {"model": model_sd, "optimizer": optim_sd, "model_config": dataclasses.asdict(model.config),
            "config": dataclasses.asdict(cfg), "step": step, "tokens": step * cfg.batch_tokens,
            "data_state": {"seq_index": seq_index}, "rng": {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}}
    path = os.path.join(cfg.out_dir, f"ckpt_{step:07d}.pt")
    torch.save(ckpt, path + ".tmp")
    os.replace(path + ".tmp", path)
    for old in checkpoint_paths(cfg.out_dir)[:-cfg.keep_ckpts]:
        os.remove(old)


def load_checkpoint(path, model, optimizer, fsdp):
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False, mmap=True)   # ranks share the page cache
    except Exception as e:
        raise RunError(f"cannot read checkpoint {path}: {e}") from e
    if ckpt.get("model_config") != dataclasses.asdict(model.config):
        raise RunError(f"checkpoint {path} is of another model:\n  checkpoint {ckpt.get('model_config')}\n"
                         f"  this run   {dataclasses.asdict(model.config)}\nuse another out_dir or the same model")
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict
        set_state_dict(model, optimizer, model_state_dict=ckpt["model"], optim_state_dict=ckpt["optimizer"],
                       options=StateDictOptions(full_state_dict=True))
    else:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
    torch.set_rng_state(ckpt["rng"]["torch"])
    if ckpt["rng"]["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(ckpt["rng"]["cuda"])
    return ckpt


def run_info(device):
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                    text=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip())
    except OSError:
        commit, dirty = None, None
    return {"git_commit": commit, "git_dirty": dirty, "torch": torch.__version__, "python": sys.version.split()[0],
            "platform": platform.platform(), "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "device": torch.cuda.get_device_name(device) if device.type == "cuda"
            else device.type, "world_size": int(os.environ.get("WORLD_SIZE", 1)), "argv": sys.argv}


# ----------------------------------------------------------------------------------------------------------

def main(argv):
    cfg = load_config(argv)

    # ---- processes and devices
    ddp = "RANK" in os.environ
    rank, local_rank, world = (int(os.environ.get(k, d)) for k, d in (("RANK", 0), ("LOCAL_RANK", 0), ("WORLD_SIZE", 1)))
    if cfg.device == "auto":
        cfg.device = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    device = torch.device(cfg.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if ddp:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    master = rank == 0
    if cfg.fsdp and not ddp:
        raise RunError("fsdp=True needs torch.distributed: launch with torchrun (--nproc_per_node=1 for one GPU)")
    torch.manual_seed(cfg.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    bf16 = cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and device.type == "cuda")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()

    seqs_per_step, rest = divmod(cfg.batch_tokens, cfg.seq_len)
    grad_accum, rest2 = divmod(seqs_per_step, cfg.micro_batch * world)
    if rest or rest2 or grad_accum == 0:
        raise RunError(f"batch_tokens {cfg.batch_tokens} must be a multiple of seq_len · micro_batch · world_size"
                         f" = {cfg.seq_len} · {cfg.micro_batch} · {world}")

    # ---- model, data, optimiser
    mcfg = model_config(cfg)
    train_data = ShardStream(cfg.data_dir, "train", cfg.seq_len, cfg.seed, cfg.tokenizer, mcfg.vocab_size)
    val_data = val_batches(cfg.data_dir, cfg, mcfg.vocab_size, rank, world)
    with torch.device(device):                          # built in place: no full CPU copy per rank
        model = Llama(mcfg)
    if cfg.fsdp:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
        for block in model.layers:
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=device.type in ("cuda", "cpu"))

    # ---- resume from the newest checkpoint of out_dir, if any
    step, seq_index = 0, 0
    ckpts = checkpoint_paths(cfg.out_dir)
    if ckpts:
        ckpt = load_checkpoint(ckpts[-1], model, optimizer, cfg.fsdp)
        step, seq_index = ckpt["step"], ckpt["data_state"]["seq_index"]
        if master:
            print(f"resuming from {ckpts[-1]} at step {step}")
        del ckpt
    log_path = os.path.join(cfg.out_dir, "log.jsonl")
    if master:
        os.makedirs(cfg.out_dir, exist_ok=True)
        with open(os.path.join(cfg.out_dir, "config.json"), "w") as f:
            json.dump({"config": dataclasses.asdict(cfg), "model_config": dataclasses.asdict(mcfg)}, f, indent=2)
        with open(os.path.join(cfg.out_dir, "run_info.json"), "w") as f:
            json.dump(run_info(device), f, indent=2)
        if os.path.exists(log_path):                  # drop records past the checkpoint: those steps are redone
            with open(log_path) as f:
                kept = [line for line in f if json.loads(line)["step"] <= step]
            with open(log_path, "w") as f:
                f.writelines(kept)
        print(f"model {cfg.model}: {model.num_params() / 1e6:.1f}M parameters, {mcfg.n_layer} layers | world {world} | "
              f"grad_accum {grad_accum} | device {device} {'bf16' if bf16 else 'fp32'} | "
              f"jreg λ={cfg.jreg_lambda} α={cfg.jreg_alpha} {cfg.jreg_weighting}")
    wandb = None
    if cfg.wandb_project and master:
        import wandb
        wandb.init(project=cfg.wandb_project, name=cfg.wandb_run_name or None, config=dataclasses.asdict(cfg),
                   resume="allow")

    objective = JregObjective(model, cfg).to(device)
    train_step = torch.compile(objective) if cfg.compile else objective
    if ddp and not cfg.fsdp:
        from torch.nn.parallel import DistributedDataParallel as DDP
        train_step = DDP(train_step, device_ids=[local_rank] if device.type == "cuda" else None)
    flops_per_step = model.flops_per_token(cfg.seq_len) * cfg.batch_tokens
    peak = peak_flops(device)

    stop = {"signal": None}
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.update(signal=signum))

    def evaluate():
        model.eval()
        totals = torch.zeros(2 + mcfg.n_layer, device=device)      # loss sum, token count, Ψ sums
        with torch.no_grad(), autocast:
            for x, y in val_data:
                x, y = x.to(device), y.to(device)
                out = model(x, y)
                psi = displacement(streams(out, cfg.jreg_final_norm), skip_first=cfg.jreg_skip_first)
                totals += torch.cat([torch.stack([out.loss.float() * y.numel(), torch.tensor(float(y.numel()),
                                     device=device)]), psi * y.numel()])
        if ddp:
            dist.all_reduce(totals)
        model.train()
        psi = totals[2:] / totals[1]
        return {"val_loss": (totals[0] / totals[1]).item(), "psi": psi.tolist(), "zeta": jump_rate(psi).tolist()}

    def log(record):
        if not master:
            return
        with open(log_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if wandb:
            wandb.log(record, step=record["step"])

    # ---- the loop
    if step == 0 and cfg.eval_interval > 0:
        log({"step": 0, "tokens": 0, **evaluate()})
    while step < cfg.max_steps:
        t0 = time.time()
        lr = lr_at(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        sums = torch.zeros(3 + mcfg.n_layer, device=device)         # loss, ce, penalty, Ψ (means over micro-steps)
        for micro in range(grad_accum):
            first = seq_index + (micro * world + rank) * cfg.micro_batch
            x, y = (t.to(device, non_blocking=True) for t in train_data.batch(first, cfg.micro_batch))
            last = micro == grad_accum - 1
            if ddp and not cfg.fsdp:
                train_step.require_backward_grad_sync = last          # gradients are all-reduced on the last micro-step only
            elif cfg.fsdp:
                model.set_requires_gradient_sync(last)
            with autocast:
                loss, ce, penalty, psi = train_step(x, y)
            (loss / grad_accum).backward()
            sums += torch.cat([torch.stack([loss.detach(), ce, penalty]), psi]) / grad_accum
        seq_index += seqs_per_step
        if ddp:
            dist.all_reduce(sums, op=dist.ReduceOp.AVG)
        if not torch.isfinite(sums[0]):
            raise FloatingPointError(f"non-finite loss {sums[0].item()} at step {step + 1}; the last checkpoint "
                                     f"in {cfg.out_dir} is intact")
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1

        loss, ce, penalty = sums[:3].tolist()
        dt = time.time() - t0
        if step % cfg.log_interval == 0 or step == cfg.max_steps:
            psi = sums[3:]
            rec = {"step": step, "tokens": step * cfg.batch_tokens, "loss": loss, "ce": ce, "jreg": penalty,
                   "zeta_L": jump_rate(psi)[-1].item(), "lr": lr, "grad_norm": grad_norm.item(),
                   "tok_per_s": cfg.batch_tokens / dt,
                   "mfu": flops_per_step / dt / (peak * world) if peak else None,
                   "mem_gb": torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None}
            log(rec)
            if master:
                print(f"step {step:6d} | loss {loss:.4f} ce {ce:.4f} jreg {penalty:.4f} ζ_L {rec['zeta_L']:.2f} | "
                      f"lr {lr:.2e} | grad {rec['grad_norm']:.3f} | {rec['tok_per_s']:.0f} tok/s"
                      + (f" | mfu {100 * rec['mfu']:.1f}%" if rec["mfu"] else ""), flush=True)
        if cfg.eval_interval > 0 and (step % cfg.eval_interval == 0 or step == cfg.max_steps):
            ev = evaluate()
            log({"step": step, "tokens": step * cfg.batch_tokens, **ev})
            if master:
                print(f"eval {step:6d} | val_loss {ev['val_loss']:.4f} | ζ_L {ev['zeta'][-1]:.2f} | "
                      f"Ψ {' '.join(f'{p:.3f}' for p in ev['psi'])}", flush=True)
        stopping = torch.tensor(float(stop["signal"] is not None), device=device)
        if ddp:
            dist.all_reduce(stopping, op=dist.ReduceOp.MAX)
        if step % cfg.ckpt_interval == 0 or step == cfg.max_steps or stopping.item():
            save_checkpoint(cfg, step, model, optimizer, seq_index, cfg.fsdp)
        if stopping.item():
            if master:
                print(f"stopped by signal at step {step}; checkpoint saved, rerun the same command to resume")
            break

    if ddp:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (RunError, FloatingPointError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
