"""
Pre-train a Llama with or without JREG (loss = CE + λ · Σ_l w_l Ψ_l).

    python train.py configs/tiny.py                               # one process (CPU or one GPU)
    python train.py configs/tiny_jreg.py --max_steps=50 --lr=1e-3  # --key=value overrides the config file
    torchrun --nproc_per_node=8 train.py configs/170m_jreg.py     # DDP (or FSDP2 with --fsdp=True)

Every setting and its default is in `Config` below; a config file is Python (trusted input) assigning some of them.
Starting a run in an out_dir that holds a checkpoint resumes it exactly; the settings that define the experiment
must then be the same (RESUMABLE lists those that may change). A user error is one `error:` line, exit status 1.
"""
import dataclasses
import fcntl
import glob
import hashlib
import json
import math
import os
import platform
import signal
import socket
import subprocess
import sys
import time
import traceback
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from jreg import WEIGHTINGS, Profile, displacement, jump_rate, layer_weights, streams
from model import PRESETS, Llama, LlamaConfig
from prepare_fineweb import get_tokenizer, list_shards, load_manifest, read_shard, write_atomic
from sft import PackedStream, is_conversations


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
    # data: token shards of prepare_fineweb.py (pre-training) or conversations of sft.py (fine-tuning, packed)
    data_dir: str = "data/fineweb_edu"
    tokenizer: str = "gpt2"         # must match the shards' header
    # fine-tuning: the weights to start from (not resumed: a new run); the model shape is theirs
    init_from: str = ""             # "" (random init) | RUN_DIR (newest ckpt) | RUN_DIR@STEP | RUN_DIR@latest | hf:NAME
    epochs: float = 0.0             # > 0: max_steps = epochs × windows per epoch / sequences per step
    warmup_ratio: float = 0.0       # > 0: warmup_steps = warmup_ratio × max_steps
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
    grad_clip: float = 1.0          # 0: no clipping
    # JREG
    jreg_lambda: float = 0.0        # 0 = the baseline, exactly
    jreg_alpha: float = 1.0
    jreg_weighting: str = "index"   # index: softmax(α·l) | depth: softmax(α·l/L) | uniform | last
    jreg_final_norm: bool = False   # h_L = raw residual stream (False) or after the final RMSNorm (True, HF's view)
    jreg_skip_first: bool = False   # leave position 0 out of Ψ
    # logging, evaluation, checkpoints
    log_interval: int = 1
    eval_interval: int = 1000       # 0: no periodic evaluation
    eval_batches: int = 20          # fixed validation batches (of micro_batch sequences) per eval
    ckpt_interval: int = 1000
    keep_ckpts: int = 3
    wandb_project: str = ""
    wandb_run_name: str = ""


# settings that may differ when a run is resumed (recorded in config.json's history); all others must match
RESUMABLE = {"max_steps", "device", "dtype", "compile", "fsdp", "micro_batch", "log_interval", "eval_interval",
             "eval_batches", "ckpt_interval", "keep_ckpts", "wandb_project", "wandb_run_name"}


def fail(message):
    raise SystemExit(f"error: {message}")


def read_config_file(path):
    """The settings a config file assigns. `include("other.py")` inside it first reads another file of the same
    folder, so a JREG config can be its baseline plus the lines that differ."""
    if not os.path.isfile(path):
        fail(f"config file {path!r} does not exist")
    ns = {"include": lambda name: ns.update(read_config_file(os.path.join(os.path.dirname(path), name)))}
    try:
        exec(compile(open(path).read(), path, "exec"), ns)
    except SystemExit:
        raise
    except Exception as e:                                       # name the file and line of the mistake
        line = e.lineno if isinstance(e, SyntaxError) else next(
            (f.lineno for f in reversed(traceback.extract_tb(e.__traceback__)) if f.filename == path), "?")
        fail(f"{path}, line {line}: {type(e).__name__}: {e}")
    return {k: v for k, v in ns.items() if not (k.startswith("_") or k == "include" or callable(v)
                                                or type(v).__name__ == "module")}


def load_config(argv):
    """Config from `[config.py ...] [--key=value ...]`: defaults <- config files <- command line; then checked."""
    types = {f.name: f.type for f in dataclasses.fields(Config)}
    values = {}
    for arg in argv:
        if not arg.startswith("--"):
            for key, value in read_config_file(arg).items():
                values[key] = (value, f"in {arg}")
            continue
        key, sep, text = arg[2:].partition("=")
        if not sep:
            fail(f"config key {key!r}: use --{key}=VALUE")
        ftype = types.get(key, str)
        try:
            value = {"true": True, "false": False}.get(text.lower(), text) if ftype is bool else \
                int(float(text)) if ftype is int and float(text).is_integer() else ftype(text)
        except ValueError:
            value = text                                         # reported as a wrong type below
        values[key] = (value, "(from the command line)")
    for key, (value, where) in values.items():
        ftype = types.get(key)
        if ftype is None:
            fail(f"unknown config key {key!r} {where}")
        if ftype is float and type(value) is int:
            value = float(value)
        if value is not None and type(value) is not ftype:
            fail(f"config key {key!r}: expected {ftype.__name__}, got {type(value).__name__} {value!r} {where}")
        values[key] = value
    cfg = Config(**values)
    check_config(cfg)
    return cfg


def check_config(cfg):
    """Every setting in range, before anything is built or written."""
    def need(ok, key, what):
        if not ok:
            fail(f"config key {key!r} = {getattr(cfg, key)!r}: {what}")
    for key in ("batch_tokens", "micro_batch", "seq_len", "log_interval", "eval_batches", "ckpt_interval",
                "keep_ckpts", "max_steps"):
        need(getattr(cfg, key) >= 1, key, "must be at least 1")
    for key in ("warmup_steps", "eval_interval"):
        need(getattr(cfg, key) >= 0, key, "must be 0 or more")
    for key in ("lr", "weight_decay", "grad_clip", "jreg_lambda", "jreg_alpha", "epochs", "warmup_ratio"):
        need(math.isfinite(getattr(cfg, key)) and getattr(cfg, key) >= 0, key, "must be a finite number >= 0")
    for key in ("min_lr_ratio", "beta1", "beta2"):
        need(0 <= getattr(cfg, key) <= 1, key, "must be in [0, 1]")
    need(cfg.seq_len >= 2 or not cfg.jreg_skip_first, "jreg_skip_first", "leaves Ψ no token of a 1-token window: "
         "use seq_len >= 2 or jreg_skip_first=False")
    need(cfg.model in PRESETS, "model", f"choose one of {sorted(PRESETS)}")
    need(cfg.jreg_weighting in WEIGHTINGS, "jreg_weighting", f"choose one of {WEIGHTINGS}")
    need(cfg.dtype in ("auto", "bfloat16", "float32"), "dtype", "choose auto, bfloat16 or float32")
    if cfg.device != "auto":
        try:
            device = torch.device(cfg.device)
        except RuntimeError:
            fail(f"config key 'device' = {cfg.device!r}: not a device (cpu, cuda, cuda:N, mps)")
        need(device.type != "cuda" or torch.cuda.is_available(), "device", "CUDA is not available here")
        need(device.type in ("cpu", "cuda", "mps"), "device", "choose cpu, cuda, cuda:N or mps")
    if not cfg.init_from:
        model_config(cfg)


def model_config(cfg):
    overrides = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(LlamaConfig)
                 if getattr(cfg, f.name, None) is not None}
    overrides["max_seq_len"] = max(cfg.seq_len, PRESETS[cfg.model].max_seq_len)
    for key in ("vocab_size", "n_layer", "n_head", "n_kv_head", "d_model", "ffn_hidden"):
        if overrides.get(key, 1) < 1:
            fail(f"config key {key!r} = {overrides[key]}: must be at least 1")
    try:
        return dataclasses.replace(PRESETS[cfg.model], **overrides)
    except AssertionError as e:                                   # LlamaConfig's shape checks
        fail(f"model shape: {e} (n_head, n_kv_head, d_model = {overrides.get('n_head')}, "
             f"{overrides.get('n_kv_head')}, {overrides.get('d_model')})")


# ----------------------------------------------------------------------------------------------------------
# Data: a deterministic, resumable stream of (seq_len + 1)-token windows over the shards

def load_shards(data_dir, split, tokenizer, vocab_size):
    """The token arrays (memory-mapped) of one split, checked against the model's tokenizer and vocabulary."""
    arrays = []
    for path in list_shards(data_dir, split):
        tokens, header = read_shard(path, tokenizer=tokenizer)
        if header["vocab_size"] > vocab_size:
            fail(f"{path}: vocabulary of {header['vocab_size']} tokens does not fit the model's vocab_size {vocab_size}")
        arrays.append(tokens)
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
            fail(f"{data_dir}: no {split} shard holds {seq_len + 1} tokens")
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
        """x, y: int64 [count, seq_len] (y = x shifted by one), and None: every token is real (no padding)."""
        w = torch.from_numpy(np.stack([self.window(k) for k in range(first, first + count)]).astype(np.int64))
        return w[:, :-1].contiguous(), w[:, 1:].contiguous(), None


def data_streams(cfg, vocab_size, n_val):
    """(train stream, val batches source) for cfg.data_dir: sft.py conversations are packed (sft.PackedStream),
    prepare_fineweb.py text is cut into windows; both give batch(first, count) -> (x, y, real tokens or None).
    n_val = 0 (no periodic eval) reads no val split, so a folder prepared without one trains."""
    stream = PackedStream if is_conversations(cfg.data_dir) else ShardStream
    train = stream(cfg.data_dir, "train", cfg.seq_len, cfg.seed, cfg.tokenizer, vocab_size)
    if not n_val:
        return train, (torch.zeros(0, cfg.seq_len, dtype=torch.long),) * 2 + (None,)
    if not any(s["split"] == "val" for s in load_manifest(cfg.data_dir)["shards"]):
        fail(f"{cfg.data_dir} has no val split (prepared with --val_tokens 0 or --val_conversations 0), which "
             f"eval_interval = {cfg.eval_interval} needs: set eval_interval=0 or prepare it with a val split")
    if stream is PackedStream:
        val = PackedStream(cfg.data_dir, "val", cfg.seq_len, cfg.seed, cfg.tokenizer, vocab_size)
        return train, val.batch(0, min(n_val, val.per_epoch))
    windows = val_windows(cfg.data_dir, cfg.tokenizer, vocab_size, cfg.seq_len, n_val)
    return train, (windows[:, :-1], windows[:, 1:], None)


def data_identity(data_dir):
    """What data_dir holds, not where it is: a fingerprint of its manifest's preparation settings and shard list
    (files, splits, token counts), and of the first and last 4 KiB of each shard file, so that other text prepared
    again into the same folder with the same sizes still differs. A moved or copied folder keeps its identity."""
    m = load_manifest(data_dir)
    h = hashlib.sha256(json.dumps([m.get("config"), m["shards"]], sort_keys=True).encode())
    for name in [n for s in m["shards"] for n in (s["file"], s.get("mask")) if n]:
        with open(os.path.join(data_dir, name), "rb") as f:
            h.update(f.read(4096))
            f.seek(max(4096, os.fstat(f.fileno()).st_size - 4096))
            h.update(f.read())
    return h.hexdigest()[:16]


def val_windows(data_dir, tokenizer, vocab_size, seq_len, n):
    """The fixed validation set: the first n (or fewer, if the val shards are shorter) non-overlapping windows of
    seq_len + 1 tokens of the val shards, in order. train.py's periodic eval and evaluate.py's profiles use it."""
    tokens = np.concatenate(load_shards(data_dir, "val", tokenizer, vocab_size))
    n = min(n, (len(tokens) - 1) // seq_len)
    return torch.from_numpy(np.stack([tokens[i * seq_len:(i + 1) * seq_len + 1] for i in range(n)]).astype(np.int64)
                            if n else np.zeros((0, seq_len + 1), dtype=np.int64))


# ----------------------------------------------------------------------------------------------------------
# The training objective: one forward gives CE, Ψ and the penalty

class JregObjective(nn.Module):
    """CE and the penalty Σ_l w_l Ψ_l from one forward. Wraps the model so that torch.compile sees both as one graph."""

    def __init__(self, model, cfg):
        super().__init__()
        self.model, self.cfg = model, cfg
        self.register_buffer("weights", layer_weights(model.config.n_layer, cfg.jreg_alpha, cfg.jreg_weighting),
                             persistent=False)

    def forward(self, x, y, real=None):
        cfg = self.cfg
        out = self.model(x, y)
        hs = streams(out, cfg.jreg_final_norm)
        if cfg.jreg_lambda == 0:                      # the baseline: Ψ only for the log, outside autograd
            hs = [h.detach() for h in hs]
        psi = displacement(hs, mask=real, skip_first=cfg.jreg_skip_first)       # real: padding left out
        return out.loss, (self.weights * psi).sum(), psi.detach()


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
# Checkpoints (one format, also read by evaluate.py): ckpt_NNNNNNN.pt, written to a temporary file and renamed

def list_checkpoints(out_dir):
    """[(step, path)] of the complete checkpoints in out_dir, oldest first."""
    found = [(int(os.path.basename(p)[5:-3]), p) for p in glob.glob(os.path.join(out_dir, "ckpt_*.pt"))
             if os.path.basename(p)[5:-3].isdigit()]
    return sorted(found)


def load_checkpoint(path):
    """The checkpoint dict: model, optimizer, model_config, config, step, tokens, data_state, rng. Memory-mapped,
    so the ranks of one node share a copy in the page cache."""
    try:
        return torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception as e:
        fail(f"cannot read checkpoint {path}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")


def save_checkpoint(cfg, step, model, optimizer, seq_index, data_id=None):
    """Rank 0 writes the full (unsharded, uncompiled) state and the data's identity (data_identity). A model with a
    non-finite parameter is never saved."""
    bad = torch.tensor(float(any(not torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all()
                                 for p in model.parameters())))
    if dist.is_initialized():
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    if bad.item():
        last = list_checkpoints(cfg.out_dir)
        fail(f"non-finite parameters after step {step}: nothing saved. The last good checkpoint is "
             f"{last[-1][1] if last else '(none)'}; rerun to resume from it, with a lower lr or grad_clip")
    if cfg.fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
        model_sd, optim_sd = get_state_dict(model, optimizer,
                                            options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    else:
        model_sd, optim_sd = model.state_dict(), optimizer.state_dict()
    if int(os.environ.get("RANK", 0)) != 0:
        return
    ckpt = {"model": model_sd, "optimizer": optim_sd, "model_config": dataclasses.asdict(model.config),
            "config": dataclasses.asdict(cfg), "step": step, "tokens": step * cfg.batch_tokens,
            "data_state": {"seq_index": seq_index}, "data_identity": data_id, "rng": {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}}
    path = os.path.join(cfg.out_dir, f"ckpt_{step:07d}.pt")
    torch.save(ckpt, path + ".tmp")
    os.replace(path + ".tmp", path)
    for _, old in list_checkpoints(cfg.out_dir)[:-cfg.keep_ckpts]:
        os.remove(old)


def start_weights(cfg):
    """(state dict or None, model config) to build the model from. A fine-tuning run that has a checkpoint resumes
    from it and never reads init_from again (the source may since have been pruned, deleted or gone offline)."""
    ckpts = list_checkpoints(cfg.out_dir) if cfg.init_from else []
    if ckpts:
        return None, LlamaConfig(**load_checkpoint(ckpts[-1][1])["model_config"])
    return init_weights(cfg.init_from, cfg.tokenizer) if cfg.init_from else (None, model_config(cfg))


def init_weights(spec, tokenizer):
    """(state dict, model config) of the weights a fine-tuning run starts from: RUN_DIR, RUN_DIR@STEP, RUN_DIR@latest
    or hf:NAME_OR_DIR; they must have been trained with `tokenizer` (the data's)."""
    if spec.startswith("hf:"):
        return init_weights_hf(spec[3:], tokenizer)
    run_dir, _, at = spec.rpartition("@") if "@" in spec else (spec, "", "latest")
    if not (at.isdigit() or at == "latest"):
        fail(f"init_from {spec!r}: use RUN_DIR, RUN_DIR@STEP (a number), RUN_DIR@latest or hf:NAME_OR_DIR")
    ckpts = dict(list_checkpoints(run_dir))
    step = int(at) if at.isdigit() else max(ckpts, default=None)
    if step not in ckpts:
        fail(f"init_from {spec!r}: no checkpoint{' of step ' + at if at.isdigit() else ''} in {run_dir!r}"
             + (f" (steps {sorted(ckpts)})" if ckpts else ""))
    ckpt = load_checkpoint(ckpts[step])
    if (trained := ckpt["config"].get("tokenizer", "gpt2")) != tokenizer:
        fail(f"init_from {spec!r} was trained with tokenizer {trained!r}, but tokenizer = {tokenizer!r} (the data's): "
             f"fine-tune it on data prepared with {trained!r}")
    return ckpt["model"], LlamaConfig(**ckpt["model_config"])


def init_weights_hf(name, tokenizer):
    """A Hugging Face Llama (a hub name or a local folder) through Llama.from_hf; each way it can fail is one line.
    If it ships a tokenizer, that must encode text as `tokenizer` does."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    where, local = f"init_from 'hf:{name}'", os.path.isdir(name)
    why = lambda e: f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"   # noqa: E731
    if not local and (name.startswith((".", "/", "~")) or name.count("/") > 1):
        fail(f"{where}: no such folder")
    try:
        model_type = AutoConfig.from_pretrained(name).model_type
    except Exception as e:
        fail(f"{where}: cannot load its config ({why(e)})" + ("" if local else
             "; a hub name needs the network or a cached copy: offline, download it first or give a local folder"))
    if model_type != "llama":
        fail(f"{where} is a {model_type} model, not a Llama (the architecture this project trains)")
    try:
        hf = Llama.from_hf(AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32))
    except Exception as e:
        fail(f"{where}: cannot load the model ({why(e)})")
    try:
        hf_tokenizer = AutoTokenizer.from_pretrained(name)
    except Exception:
        print(f"note: {where} ships no tokenizer; its vocabulary is taken to be tokenizer {tokenizer!r}'s")
    else:
        probe = "Final-layer jumps: Ψ and ζ over 12 layers, 2026.\n"
        if hf_tokenizer.encode(probe, add_special_tokens=False) != get_tokenizer(tokenizer).encode_ordinary(probe):
            fail(f"{where} has another tokenizer than {tokenizer!r} (the data's): it encodes text differently")
    return hf.state_dict(), hf.config


def restore(ckpt, model, optimizer, fsdp):
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


# ----------------------------------------------------------------------------------------------------------
# The run folder: one process at a time, its settings fixed at the start, its records rewritten atomically

def lock_run(out_dir):
    """An exclusive lock on out_dir/run.lock for the life of this process (the kernel drops it when the process
    dies, so a killed run never blocks its own resume). A second process in the same folder is refused."""
    os.makedirs(out_dir, exist_ok=True)
    f = open(os.path.join(out_dir, "run.lock"), "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        fail(f"{out_dir} is in use by another training process ({f.read().strip() or 'unknown'}); "
             f"wait for it to finish or use another out_dir")
    f.truncate(0)
    f.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    f.flush()
    return f


def check_resume(cfg, mcfg, ckpt, path, data_id):
    """The settings of a resumed run must be the checkpoint's, except the RESUMABLE ones: {key: [old, new]}. The data
    must be the same (its data_identity); it may have moved (checkpoints without an identity compare the path)."""
    old, new = ckpt["config"], dataclasses.asdict(cfg)
    changed = {k: [old.get(k), v] for k, v in new.items() if old.get(k, v) != v}
    free = RESUMABLE | {"out_dir"} | ({"data_dir"} if ckpt.get("data_identity") else set())
    wrong = {k: c for k, c in changed.items() if k not in free}
    if ckpt.get("model_config") != dataclasses.asdict(mcfg):
        fail(f"checkpoint {path} is of another model: use another out_dir or the same model")
    if ckpt.get("data_identity") not in (None, data_id):
        fail(f"{cfg.data_dir} holds other data than the run was trained on (identity {data_id}, the run's "
             f"{ckpt['data_identity']}; prepared again?): resume on the run's data or use another out_dir")
    if wrong:
        fail(f"{cfg.out_dir} holds a run with other settings; resuming needs the same ones "
             f"({'; '.join(f'{k}: run {a!r}, now {b!r}' for k, (a, b) in wrong.items())}): use another out_dir")
    return {k: c for k, c in changed.items() if k != "out_dir"}


def read_log(path, last_step):
    """The records of log.jsonl up to last_step (a torn last line from a kill is dropped)."""
    if not os.path.exists(path):
        return []
    records = []
    for line in open(path):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return [r for r in records if r["step"] <= last_step]


def run_info(device):
    here = os.path.dirname(os.path.abspath(__file__))
    git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True, cwd=here).stdout.strip()
    return {"git_commit": git("rev-parse", "HEAD") or None, "git_dirty": bool(git("status", "--porcelain",
            "--untracked-files=no")), "torch": torch.__version__, "python": sys.version.split()[0],
            "platform": platform.platform(), "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "device": torch.cuda.get_device_name(device) if device.type == "cuda"
            else device.type, "world_size": int(os.environ.get("WORLD_SIZE", 1)), "argv": sys.argv,
            "time": time.strftime("%Y-%m-%d %H:%M:%S")}


# ----------------------------------------------------------------------------------------------------------

def main(argv):
    cfg = load_config(argv)

    # ---- processes and devices
    ddp = "RANK" in os.environ
    rank, local_rank, world = (int(os.environ.get(k, d)) for k, d in (("RANK", 0), ("LOCAL_RANK", 0), ("WORLD_SIZE", 1)))
    master = rank == 0
    if cfg.fsdp and not ddp:
        fail("fsdp=True needs torch.distributed: launch with torchrun (--nproc_per_node=1 for one GPU)")
    seqs_per_step, rest = divmod(cfg.batch_tokens, cfg.seq_len)
    grad_accum, rest2 = divmod(seqs_per_step, cfg.micro_batch * world)
    if rest or rest2 or grad_accum == 0:
        fail(f"batch_tokens {cfg.batch_tokens} must be a multiple of seq_len · micro_batch · world_size"
             f" = {cfg.seq_len} · {cfg.micro_batch} · {world}")
    if cfg.device == "auto":
        cfg.device = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    device = torch.device(cfg.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(cfg.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    bf16 = cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and device.type == "cuda")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()

    # ---- weights to start from (fine-tuning) and data, checked before anything is written
    init_sd, mcfg = start_weights(cfg)
    mcfg = dataclasses.replace(mcfg, max_seq_len=max(mcfg.max_seq_len, cfg.seq_len))
    train_data, (vx, vy, vreal) = data_streams(cfg, mcfg.vocab_size,
                                               cfg.eval_batches * cfg.micro_batch if cfg.eval_interval else 0)
    data_id = data_identity(cfg.data_dir)
    n_val = len(vx) // world * world
    if cfg.eval_interval and n_val == 0:
        fail(f"{cfg.data_dir}: the val split holds fewer than {world} windows of {cfg.seq_len + 1} tokens")
    part = lambda t, i: None if t is None else t[:n_val][rank::world][i:i + cfg.micro_batch]   # strided over ranks
    val_data = [tuple(part(t, i) for t in (vx, vy, vreal)) for i in range(0, n_val // world, cfg.micro_batch)]
    if cfg.epochs:
        cfg.max_steps = max(1, math.ceil(cfg.epochs * train_data.per_epoch / seqs_per_step))
    if cfg.warmup_ratio:
        cfg.warmup_steps = round(cfg.warmup_ratio * cfg.max_steps)

    # ---- the run folder: locked, then resumed from its newest checkpoint if it has one
    lock = lock_run(cfg.out_dir) if master else None   # held until this process ends
    if ddp:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    ckpts = list_checkpoints(cfg.out_dir)
    ckpt = load_checkpoint(ckpts[-1][1]) if ckpts else None
    changed = check_resume(cfg, mcfg, ckpt, ckpts[-1][1], data_id) if ckpt else {}

    with torch.device(device):                          # built in place: no full CPU copy per rank
        model = Llama(mcfg)
    if init_sd is not None and not ckpt:
        model.load_state_dict(init_sd)
    del init_sd
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
    step, seq_index = 0, 0
    if ckpt:
        restore(ckpt, model, optimizer, cfg.fsdp)
        step, seq_index = ckpt["step"], ckpt["data_state"]["seq_index"]
        del ckpt

    log_path = os.path.join(cfg.out_dir, "log.jsonl")
    if master:
        info = run_info(device)
        saved = os.path.join(cfg.out_dir, "config.json")
        old = json.load(open(saved)) if step and os.path.exists(saved) else {}
        history = old.get("history", []) + [{"step": step, "changed": changed, "argv": info["argv"], "time": info["time"]}]
        write_atomic(os.path.join(cfg.out_dir, "config.json"), json.dumps(
            {"config": dataclasses.asdict(cfg), "model_config": dataclasses.asdict(mcfg), "data_identity": data_id,
             "history": history}, indent=2))
        write_atomic(os.path.join(cfg.out_dir, "run_info.json"), json.dumps(info, indent=2))
        kept = read_log(log_path, step) if step else []   # records past the checkpoint are redone
        write_atomic(log_path, "".join(json.dumps(r) + "\n" for r in kept))
        print(("resuming from " + ckpts[-1][1] + f" at step {step}" + (f", changed: {changed}" if changed else "") + "\n"
               if step else "") + f"model {cfg.init_from or cfg.model}: {model.num_params() / 1e6:.1f}M parameters, {mcfg.n_layer} layers"
              f" | world {world} | grad_accum {grad_accum} | device {device} {'bf16' if bf16 else 'fp32'} | "
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
        profile = Profile()
        with torch.no_grad(), autocast:
            for x, y, real in val_data:
                x, y, real = x.to(device), y.to(device), real if real is None else real.to(device)
                out = model(x, y)
                n = (y != -1).sum()
                profile.add(out.hidden_states, out.final_hidden, mask=real, loss_sum=out.loss.float() * n, n_loss=n)
        model.train()
        p = profile.result(dist.all_reduce if ddp else None)
        key = "psi" + ("_normed" if cfg.jreg_final_norm else "") + ("_skip_first" if cfg.jreg_skip_first else "")
        return {"val_loss": p["loss"], "psi": p[key], "zeta": p[key.replace("psi", "zeta")]}

    def log(record):
        if master:
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
        batches = [train_data.batch(seq_index + (micro * world + rank) * cfg.micro_batch, cfg.micro_batch)
                   for micro in range(grad_accum)]
        # CE and Ψ are means over the whole global batch (its targets, its real tokens), whatever the micro-batching
        counts = torch.stack([torch.stack([(y != -1).sum(), (torch.ones_like(x, dtype=torch.bool) if real is None
                              else real)[:, int(cfg.jreg_skip_first):].sum()]) for x, y, real in batches]).to(device)
        totals = counts.sum(0)
        if ddp:
            dist.all_reduce(totals)
        shares = counts * world / totals.clamp(min=1)                 # × world: DDP averages gradients over ranks
        sums = torch.zeros(3 + mcfg.n_layer, device=device)     # ce, penalty, loss, Ψ (means over the global batch)
        for micro, (x, y, real) in enumerate(batches):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            real = real if real is None else real.to(device, non_blocking=True)
            last = micro == grad_accum - 1
            if ddp and not cfg.fsdp:
                train_step.require_backward_grad_sync = last          # gradients are all-reduced on the last micro-step only
            elif cfg.fsdp:
                model.set_requires_gradient_sync(last)
            with autocast:
                ce, penalty, psi = train_step(x, y, real)
            ce_share, psi_share = shares[micro]
            loss = ce * ce_share + cfg.jreg_lambda * penalty * psi_share
            loss.backward()
            sums += torch.cat([torch.stack([ce.detach() * ce_share, penalty.detach() * psi_share, loss.detach()]),
                               psi * psi_share])
        seq_index += seqs_per_step
        if ddp:
            dist.all_reduce(sums, op=dist.ReduceOp.AVG)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip or float("inf"))
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        if not (torch.isfinite(sums[2]) and torch.isfinite(grad_norm)):   # never step on non-finite numbers
            last = list_checkpoints(cfg.out_dir)
            fail(f"non-finite loss {sums[2].item()} or gradient norm {grad_norm.item()} at step {step + 1}; "
                 f"nothing of this step was applied or saved. The last checkpoint is "
                 f"{last[-1][1] if last else '(none)'}; rerun to resume from it, with a lower lr or another seed")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1

        ce, penalty, loss = sums[:3].tolist()
        dt = time.time() - t0
        if step % cfg.log_interval == 0 or step == cfg.max_steps:
            zeta = jump_rate(sums[3:])
            rec = {"step": step, "tokens": step * cfg.batch_tokens, "loss": loss, "ce": ce, "jreg": penalty,
                   "zeta_L": zeta[-1].item() if len(zeta) else None, "lr": lr, "grad_norm": grad_norm.item(),
                   "tok_per_s": cfg.batch_tokens / dt,
                   "mfu": flops_per_step / dt / (peak * world) if peak else None,
                   "mem_gb": torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None}
            log(rec)
            if master:
                print(f"step {step:6d} | loss {loss:.4f} ce {ce:.4f} jreg {penalty:.4f} ζ_L {rec['zeta_L'] or 0:.2f} | "
                      f"lr {lr:.2e} | grad {rec['grad_norm']:.3f} | {rec['tok_per_s']:.0f} tok/s"
                      + (f" | mfu {100 * rec['mfu']:.1f}%" if rec["mfu"] else ""), flush=True)
        if cfg.eval_interval > 0 and (step % cfg.eval_interval == 0 or step == cfg.max_steps):
            ev = evaluate()
            log({"step": step, "tokens": step * cfg.batch_tokens, **ev})
            if master:
                print(f"eval {step:6d} | val_loss {ev['val_loss']:.4f} | ζ_L {(ev['zeta'] or [0])[-1]:.2f} | "
                      f"Ψ {' '.join(f'{p:.3f}' for p in ev['psi'])}", flush=True)
        stopping = torch.tensor(float(stop["signal"] is not None), device=device)
        if ddp:
            dist.all_reduce(stopping, op=dist.ReduceOp.MAX)
        if step % cfg.ckpt_interval == 0 or step == cfg.max_steps or stopping.item():
            save_checkpoint(cfg, step, model, optimizer, seq_index, data_id)
        if stopping.item():
            if master:
                print(f"stopped by signal at step {step}; checkpoint saved, rerun the same command to resume")
            break

    if ddp:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
