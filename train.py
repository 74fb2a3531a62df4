"""
Pre-train a Llama with or without JREG (loss = CE + λ · Σ_l w_l Ψ_l).

    python train.py configs/tiny.py                               # one process (CPU or one GPU)
    python train.py configs/tiny_jreg.py --max_steps=50 --lr=1e-3  # --key=value overrides the config file
    torchrun --nproc_per_node=8 train.py configs/170m_jreg.py     # DDP (or FSDP2 with --fsdp=True)

Every setting and its default is in `Config` below; a config file is Python (trusted input) assigning some of them.
Starting a run in an out_dir that holds a checkpoint resumes it exactly; the settings that define the experiment
must then be the same (RESUMABLE lists those that may change, lr and grad_clip among them). A step with a non-finite
loss or gradient is skipped and logged; max_bad_steps + 1 of them in a row stop the run. A user error is one `error:`
line, exit status 1.
"""
import dataclasses
import gc
import inspect
import json
import math
import os
import shutil
import signal
import sys
import time
import uuid
from contextlib import nullcontext
from datetime import timedelta

import torch
import torch.distributed as dist

from config import fail, load_config, usage
from conversations import PackedStream, is_conversations
from data import ShardStream, data_identity, get_tokenizer, load_manifest, tokenizer_tag, val_windows, write_atomic
from jreg import JregObjective, Profile, jump_rate
from model import Llama
from runs import (
    check_resume, finish_checkpoint, list_checkpoints, load_checkpoint, lock_run, peak_flops, read_log, restore, run_info,
    save_checkpoint, start_weights)


# ----------------------------------------------------------------------------------------------------------
# Data and schedule

def data_streams(cfg, vocab_size, n_val):
    """(train stream, val batches source) for cfg.data_dir: prepare_sft.py conversations are packed (conversations.PackedStream),
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


def lr_at(step, cfg):
    """Linear warm-up to cfg.lr, then cosine decay to cfg.lr · min_lr_ratio at max_steps."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


# ----------------------------------------------------------------------------------------------------------
# Setup: processes and devices, the model and optimizer, the run's records

def processes(cfg):
    """(ddp, rank, world, grad_accum, device, bf16): one process per device; grad_accum micro-steps per step."""
    ddp = "RANK" in os.environ
    rank, local_rank, world = (int(os.environ.get(k, d)) for k, d in (("RANK", 0), ("LOCAL_RANK", 0), ("WORLD_SIZE", 1)))
    if cfg.fsdp and not ddp:
        fail("fsdp=True needs torch.distributed: launch with torchrun (--nproc_per_node=1 for one GPU)")
    seqs_per_step, rest = divmod(cfg.batch_tokens, cfg.seq_len)
    grad_accum, rest2 = divmod(seqs_per_step, cfg.micro_batch * world)
    if rest or rest2 or grad_accum == 0:
        fail(f"batch_tokens {cfg.batch_tokens} must be a multiple of seq_len · micro_batch · world_size"
             f" = {cfg.seq_len} · {cfg.micro_batch} · {world}")
    cfg.device = process_device(cfg.device, local_rank, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    device = torch.device(cfg.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(cfg.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    bf16 = cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and device.type == "cuda")
    return ddp, rank, world, grad_accum, device, bf16


def process_device(name, local_rank, local_world):
    """The device of this process: auto and a bare cuda are this node's GPU local_rank (torchrun's one GPU per process);
    cuda:N is refused where several processes of the node would all land on GPU N."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        return f"cuda:{local_rank}"
    if name.startswith("cuda:") and local_world > 1:
        fail(f"device = {name!r} puts all {local_world} processes of this node on one GPU: use device=cuda (or auto), "
             "which gives each process the GPU of its LOCAL_RANK")
    return name


def build(cfg, mcfg, device, bf16, init_sd):
    """The model (built in place on the device, FSDP-sharded per block when asked) and AdamW. Numerics, DDP and FSDP
    alike: fp32 weights (FSDP gathers and reduces them in fp32) and bf16 matmuls from main's autocast, so the residual
    stream is fp32 in both. No weight decay on norms, biases or the token embedding (tied: the shared matrix) unless
    decay_embeddings; an untied head is a linear layer and decays. (bf16 is main's; the autocast applies it.)"""
    with torch.device(device):                          # no full CPU copy per rank
        model = Llama(mcfg)
    model.checkpoint_blocks = cfg.activation_checkpointing
    if init_sd is not None:
        model.load_state_dict(init_sd)
    if cfg.fsdp:                                        # torchtitan's placement: each block compiled, then sharded
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        if cfg.compile:                                 # the top level in parts: final norm, the loss's chunks (head
            model.norm.compile()                        # and cross-entropy); JregObjective compiles the penalty
            model.compile_loss = True
        # weights gathered in fsdp_param_dtype, gradients always reduced in fp32 (docs/training.md, "Numerics")
        shard = dict(mp_policy=MixedPrecisionPolicy(param_dtype=getattr(torch, cfg.fsdp_param_dtype),
                                                    reduce_dtype=torch.float32))
        if not mcfg.tie_embeddings:                     # as torchtitan: the embedding its own group, resharded after
            fully_shard(model.tok_emb, **shard)         # forward; (a tied one stays with the root: one matrix)
        for block in model.layers:
            if cfg.compile:
                block.compile()                         # in place: parameter names unchanged
            fully_shard(block, **shard)
        if not mcfg.tie_embeddings:                     # final norm and head: the backward starts there, so they stay
            fully_shard([model.norm, model.lm_head], reshard_after_forward=False, **shard)   # gathered
        fully_shard(model, **shard)
    decay = [p.dim() >= 2 and (cfg.decay_embeddings or p is not model.tok_emb.weight) for p in model.parameters()]
    groups = [[p for p, d in zip(model.parameters(), decay) if d == on] for on in (True, False)]
    optimizer = torch.optim.AdamW([{"params": groups[0], "weight_decay": cfg.weight_decay},
                                   {"params": groups[1], "weight_decay": 0.0}],
                                  lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=device.type in ("cuda", "cpu"))
    return model, optimizer


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


def evaluate(model, val_data, cfg, device, autocast, ddp):
    """Validation loss and Ψ / ζ (in the penalty's convention) on the fixed val windows, summed over processes."""
    model.eval()
    profile = Profile()
    with torch.no_grad(), autocast:
        for x, y, real in val_data:
            x, y, real = x.to(device), y.to(device), real if real is None else real.to(device)
            out = model(x, y, return_logits=False)               # the chunked loss: no full logits held
            n = (y != -1).sum()                                   # 0 in a micro-batch of padding windows only
            profile.add(out.hidden_states, out.final_hidden, mask=real, n_loss=n,
                        loss_sum=torch.where(n > 0, out.loss.float() * n, 0.0))
    model.train()
    p = profile.result(dist.all_reduce if ddp else None)
    key = "psi" + ("_normed" if cfg.jreg_final_norm else "") + ("_skip_first" if cfg.jreg_skip_first else "")
    return {"val_loss": p["loss"], "psi": p[key], "zeta": p[key.replace("psi", "zeta")]}


# ----------------------------------------------------------------------------------------------------------
# One optimizer step

def wrap_ddp(module, device):
    """DDP as torchtitan sets it for a compiled model: no broadcast of buffers (the only ones, RoPE's tables, never
    change) and 100 MB gradient buckets (compiled DDP breaks the graph at each bucket: 25 MB cut a 170M model's into
    ~26 pieces)."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    no_sync = "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP).parameters else \
        "broadcast_buffers"                                      # its name before torch 2.13
    return DDP(module, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=100,
               **{no_sync: False})


def to_device(batches, device):
    """A step's micro-batches on the device: copied from pinned memory, so the copies do not stop the host (a copy from
    pageable memory to a GPU waits for the GPU)."""
    if device.type == "cpu":
        return batches
    move = lambda t: None if t is None else t.pin_memory().to(device, non_blocking=True)   # noqa: E731
    return [tuple(move(t) for t in batch) for batch in batches]


def accumulate(train_step, objective, model, batches, cfg, device, autocast, ddp, world):
    """Forward and backward of the micro-batches: CE and Ψ are means over the whole global batch (its targets, its
    real tokens), whatever the micro-batching. Returns [ce, penalty, loss, Ψ_1..Ψ_L], averaged over processes."""
    counts = torch.stack([torch.stack([(y != -1).sum(), (torch.ones_like(x, dtype=torch.bool) if real is None
                          else real)[:, int(cfg.jreg_skip_first):].sum()]) for x, y, real in batches]).to(device)
    totals = counts.sum(0)
    if ddp:
        dist.all_reduce(totals)
    shares = counts * world / totals.clamp(min=1)                 # × world: DDP averages gradients over ranks
    sums = torch.zeros(3 + model.config.n_layer, device=device)
    for micro, (x, y, real) in enumerate(to_device(batches, device)):
        last = micro == len(batches) - 1
        if ddp and not cfg.fsdp:
            objective.require_backward_grad_sync = last           # gradients are all-reduced on the last micro-step only
        elif cfg.fsdp:
            model.set_requires_gradient_sync(last)
        with autocast:
            ce, penalty, psi = train_step(x, y, real)
        ce_share, psi_share = shares[micro]
        loss = ce * ce_share + cfg.jreg_lambda * penalty * psi_share
        loss.backward()
        sums += torch.cat([torch.stack([ce.detach() * ce_share, penalty.detach() * psi_share, loss.detach()]),
                           psi * psi_share])
    if ddp:
        dist.all_reduce(sums, op=dist.ReduceOp.AVG)
    return sums


def skip_step(cfg, step, seq_index, loss, grad_norm, lr, bad, log):
    """Step `step` had a non-finite loss or gradient norm: nothing of it is applied (the caller zeroes the gradients)
    and the data moves on past its batch (sequences seq_index on). It is logged; the bad-th in a row beyond
    max_bad_steps ends the run, naming the last checkpoint and a change that resume accepts."""
    loss, grad_norm = loss.item(), grad_norm.item()
    if bad > cfg.max_bad_steps:
        finish_checkpoint()                                               # an async save in flight is published
        last = list_checkpoints(cfg.out_dir)
        fail(f"non-finite loss {loss} or gradient norm {grad_norm} at step {step} (data from sequence {seq_index}), "
             f"{bad} in a row (max_bad_steps = {cfg.max_bad_steps}); nothing of "
             f"{'it' if bad == 1 else f'steps {step - bad + 1}-{step}'} was applied. The last checkpoint is "
             f"{last[-1][1] if last else '(none)'}: rerun with a lower lr (e.g. --lr={cfg.lr / 2:g}), grad_clip or "
             f"a higher max_bad_steps to resume from it")
    log({"step": step, "tokens": step * cfg.batch_tokens, "skipped": bad, "seq_index": seq_index, "bad_loss": loss,
         "bad_grad_norm": grad_norm, "lr": lr}, f"step {step:6d} | skipped: non-finite loss {loss} or gradient norm "
        f"{grad_norm}, data from sequence {seq_index} | {bad} in a row (max_bad_steps = {cfg.max_bad_steps})")
    return bad


# ----------------------------------------------------------------------------------------------------------

def main(argv):
    if {"-h", "--help"} & set(argv):
        return print(usage())
    cfg = load_config(argv)
    ddp, rank, world, grad_accum, device, bf16 = processes(cfg)
    master, seqs_per_step = rank == 0, cfg.batch_tokens // cfg.seq_len
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()   # over fp32 weights

    # ---- weights to start from (fine-tuning) and data, checked before anything is written
    init_sd, mcfg = start_weights(cfg)
    mcfg = dataclasses.replace(mcfg, max_seq_len=max(mcfg.max_seq_len, cfg.seq_len))
    train_data, (vx, vy, vreal) = data_streams(cfg, mcfg.vocab_size,
                                               cfg.eval_batches * cfg.micro_batch if cfg.eval_interval else 0)
    data_id = data_identity(cfg.data_dir)
    if cfg.eval_interval and len(vx) == 0:
        fail(f"{cfg.data_dir}: the val split holds no window of {cfg.seq_len + 1} tokens")
    if pad := -len(vx) % world:      # every window on some rank, as many on each: the last padded with masked copies
        vreal = torch.ones_like(vx, dtype=torch.bool) if vreal is None else vreal
        vx, vy, vreal = (torch.cat([t, fill(t[:1].expand(pad, -1))]) for t, fill in
                         ((vx, torch.clone), (vy, lambda t: torch.full_like(t, -1)), (vreal, torch.zeros_like)))
    part = lambda t, i: None if t is None else t[rank::world][i:i + cfg.micro_batch]   # strided over ranks
    val_data = [tuple(part(t, i) for t in (vx, vy, vreal)) for i in range(0, len(vx) // world, cfg.micro_batch)]
    if cfg.epochs:
        cfg.max_steps = max(1, math.ceil(cfg.epochs * train_data.per_epoch / seqs_per_step))
    if cfg.warmup_ratio:
        cfg.warmup_steps = round(cfg.warmup_ratio * cfg.max_steps)

    # ---- the run folder: locked (until this process ends), then resumed from its newest checkpoint if it has one
    lock = lock_run(cfg.out_dir) if master else None  # noqa: F841 (held, not used)
    if ddp:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                timeout=timedelta(minutes=cfg.dist_timeout_min))
    ckpts = list_checkpoints(cfg.out_dir)
    ckpt = load_checkpoint(ckpts[-1][1]) if ckpts else None
    changed = check_resume(cfg, mcfg, ckpt, ckpts[-1][1], data_id) if ckpt else {}
    model, optimizer = build(cfg, mcfg, device, bf16, None if ckpt else init_sd)
    del init_sd
    step, seq_index, bad = 0, 0, 0
    if ckpt:
        restore(ckpt, model, optimizer, cfg.fsdp)
        step, seq_index = ckpt["step"], ckpt["data_state"]["seq_index"]
        del ckpt
    log_path = os.path.join(cfg.out_dir, "log.jsonl")
    if master and step < cfg.max_steps:       # (a run with nothing to train keeps its records as they are)
        run_id = write_records(cfg, mcfg, data_id, step, changed, device)
    if master:
        print((f"resuming from {ckpts[-1][1]} at step {step}" + (f", changed: {changed}" if changed else "") + "\n"
               if step else "") + f"model {cfg.init_from or cfg.model}: {model.num_params() / 1e6:.1f}M parameters, "
              f"{mcfg.n_layer} layers | world {world} | grad_accum {grad_accum} | device {device} "
              f"{'bf16' if bf16 else 'fp32'} | jreg λ={cfg.jreg_lambda} α={cfg.jreg_alpha} {cfg.jreg_weighting}")
        if step >= cfg.max_steps:
            print(f"the run is at step {step} (max_steps {cfg.max_steps}): nothing to train; raise max_steps to "
                  "extend it")
    wandb = None
    if cfg.wandb_project and master and step < cfg.max_steps:
        import wandb
        wandb.init(project=cfg.wandb_project, name=cfg.wandb_run_name or None, config=dataclasses.asdict(cfg),
                   id=run_id, resume="allow")                   # a resume goes on in the same W&B run

    def log(record, line=None):
        if master:
            with open(log_path, "a") as f:
                f.write(json.dumps(record) + "\n")
            if wandb:
                wandb.log(record, step=record["step"])
            if line:
                print(line, flush=True)

    objective = train_step = JregObjective(model, cfg, compile_penalty=cfg.compile and cfg.fsdp).to(device)
    if ddp and not cfg.fsdp:                      # DDP before compile, as PyTorch documents: buckets overlap the backward
        objective = train_step = wrap_ddp(objective, device)
    if cfg.compile and not cfg.fsdp:
        train_step = torch.compile(objective)
    flops_per_step, (_, peak) = model.flops_per_token(cfg.seq_len) * cfg.batch_tokens, peak_flops(device)
    stop = {"signal": None}
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.update(signal=signum))

    # ---- the loop
    if step == 0 and cfg.eval_interval > 0:
        log({"step": 0, "tokens": 0, **evaluate(model, val_data, cfg, device, autocast, ddp)})
    while step < cfg.max_steps:
        t0, lr = time.time(), lr_at(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batches = [train_data.batch(seq_index + (micro * world + rank) * cfg.micro_batch, cfg.micro_batch)
                   for micro in range(grad_accum)]
        sums = accumulate(train_step, objective, model, batches, cfg, device, autocast, ddp, world)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip or float("inf"))
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        if torch.isfinite(sums[2]) and torch.isfinite(grad_norm):         # the same on every rank (all-reduced)
            optimizer.step()
            bad = 0
        else:                                                             # never step on non-finite numbers
            bad = skip_step(cfg, step + 1, seq_index, sums[2], grad_norm, lr, bad + 1, log)
        optimizer.zero_grad(set_to_none=True)
        seq_index += seqs_per_step                                        # past the batch, applied or skipped
        step += 1

        (ce, penalty, loss), dt = sums[:3].tolist(), time.time() - t0
        if not bad and (step % cfg.log_interval == 0 or step == cfg.max_steps):
            zeta = jump_rate(sums[3:])
            rec = {"step": step, "tokens": step * cfg.batch_tokens, "loss": loss, "ce": ce, "jreg": penalty,
                   "zeta_L": zeta[-1].item() if len(zeta) else None, "lr": lr, "grad_norm": grad_norm.item(),
                   "tok_per_s": cfg.batch_tokens / dt, "mfu": flops_per_step / dt / (peak * world) if peak else None,
                   "mem_gb": torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None}
            log(rec, f"step {step:6d} | loss {loss:.4f} ce {ce:.4f} jreg {penalty:.4f} ζ_L {rec['zeta_L'] or 0:.2f} | "
                f"lr {lr:.2e} | grad {rec['grad_norm']:.3f} | {rec['tok_per_s']:.0f} tok/s"
                + (f" | mfu {100 * rec['mfu']:.1f}%" if rec["mfu"] else ""))
        if cfg.eval_interval > 0 and (step % cfg.eval_interval == 0 or step == cfg.max_steps):
            ev = evaluate(model, val_data, cfg, device, autocast, ddp)
            log({"step": step, "tokens": step * cfg.batch_tokens, **ev},
                f"eval {step:6d} | val_loss {ev['val_loss']:.4f} | ζ_L {(ev['zeta'] or [0])[-1]:.2f} | "
                f"Ψ {' '.join(f'{p:.3f}' for p in ev['psi'])}")
        stopping = torch.tensor(float(stop["signal"] is not None), device=device)
        if ddp:
            dist.all_reduce(stopping, op=dist.ReduceOp.MAX)
        if step % cfg.ckpt_interval == 0 or step == cfg.max_steps or stopping.item():
            save_checkpoint(cfg, step, model, optimizer, seq_index, data_id)
        if stopping.item():
            if master:
                print(f"stopped by signal at step {step}; checkpoint saved, rerun the same command to resume")
            break

    finish_checkpoint()                                                   # an async save still in flight
    if ddp:   # DDP's reducer goes first, while the group lives: the last reference to a gloo group, dropped from
        del train_step, objective  # outside destroy_process_group, joins its thread holding the GIL (a deadlock)
        torch._dynamo.reset()                                             # compiled code refers to it too
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
