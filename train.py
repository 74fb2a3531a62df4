"""
Pre-train a Llama with or without JREG: loss = CE + λ · Σ_l w_l Ψ_l.

    python train.py configs/tiny.py                               # one process (CPU or one GPU)
    python train.py configs/tiny_jreg.py --max_steps=50 --lr=1e-3  # --key=value overrides the config file
    torchrun --nproc_per_node=8 train.py configs/170m_jreg.py     # DDP (or FSDP2 with --fsdp=True)

Every setting and its default is in config.Config; a config file is Python (trusted input) assigning some of them.
A step reads this file (the loop, the loss CE + λ · penalty and its log), model.py (the forward), loss.py (the
chunked cross-entropy), jreg.py (Ψ and the penalty) and optimizers.py (AdamW, or Muon and AdamW); parallel.py spreads
it over processes and devices, data.py feeds it, checkpoint.py and runs.py keep the run folder (docs/ablations.md,
"Where things are").
Starting a run in an out_dir that holds a checkpoint resumes it exactly; the settings that define the experiment must
then be the same (config.RESUMABLE lists those that may change). A step with a non-finite loss or gradient is skipped
and logged. A user error is one `error:` line, exit status 1.
"""
import dataclasses
import math
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

from checkpoint import Checkpoints, list_checkpoints, restore, start_weights
from config import derived, fail, load_config, usage
from data import (
    PackedStream, ShardStream, data_identity, is_conversations, load_manifest, split_over_processes, val_windows)
from jreg import Profile, jump_rate
from loss import Objective
from model import Llama
from optimizers import build_optimizer
from parallel import compile_seconds, gather, parallelize, peak_flops, place, processes, to_device
from runs import Run


# ----------------------------------------------------------------------------------------------------------
# Data and schedule

def data_streams(cfg, vocab_size, n_val, proc):
    """(train stream, validation micro-batches of this process). prepare_sft.py conversations are packed
    (PackedStream), prepare_fineweb.py text is cut into windows (ShardStream); both give batch(first, count) ->
    (x, y, mask of the tokens that count, or None: all). n_val = 0 (no periodic eval) reads no val split."""
    stream = PackedStream if is_conversations(cfg.data_dir) else ShardStream
    train = stream(cfg.data_dir, "train", cfg.seq_len, cfg.seed, cfg.tokenizer, vocab_size)
    if not n_val:
        return train, []
    if not any(s["split"] == "val" for s in load_manifest(cfg.data_dir)["shards"]):
        fail(f"{cfg.data_dir} has no val split (prepared with --val_tokens 0 or --val_conversations 0), which "
             f"eval_interval = {cfg.eval_interval} needs: set eval_interval=0 or prepare it with a val split")
    if stream is PackedStream:
        val = PackedStream(cfg.data_dir, "val", cfg.seq_len, cfg.seed, cfg.tokenizer, vocab_size)
        x, y, mask = val.batch(0, min(n_val, val.per_epoch))
    else:
        windows = val_windows(cfg.data_dir, cfg.tokenizer, vocab_size, cfg.seq_len, n_val)
        x, y, mask = windows[:, :-1], windows[:, 1:], None
    if len(x) == 0:
        fail(f"{cfg.data_dir}: the val split holds no window of {cfg.seq_len + 1} tokens")
    return train, split_over_processes(x, y, mask, cfg.micro_batch, proc.rank, proc.world)


def step_batches(train_data, seq_index, grad_accum, micro_batch, proc, device, skip_first):
    """This process's micro-batches of the global batch at sequence seq_index, and their token counts, on the device
    (from pinned memory): micro-batch m of process r reads from sequence seq_index + (m · world + r) · micro_batch,
    so any split (1×8, 2×4, 8×1) reads the same batch."""
    starts = [seq_index + (micro * proc.world + proc.rank) * micro_batch for micro in range(grad_accum)]
    batches = [train_data.batch(start, micro_batch) for start in starts]
    counts = torch.tensor([token_counts(batch, skip_first) for batch in batches])
    *batches, (counts,) = to_device(batches + [(counts,)], device)     # one pinned copy each
    return batches, counts


def grad_accum_steps(cfg, world):
    """Micro-steps per optimizer step: batch_tokens = micro_batch · seq_len · world · grad_accum, exactly."""
    seqs, rest = divmod(cfg.batch_tokens, cfg.seq_len)
    accum, rest2 = divmod(seqs, cfg.micro_batch * world)
    if rest or rest2 or accum == 0:
        fail(f"batch_tokens {cfg.batch_tokens} must be a multiple of seq_len · micro_batch · world_size"
             f" = {cfg.seq_len} · {cfg.micro_batch} · {world}")
    return accum


def lr_at(step, cfg):
    """Linear warm-up to cfg.lr, then cosine decay to cfg.lr · min_lr_ratio at max_steps."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


# ----------------------------------------------------------------------------------------------------------
# The model, the objective and the optimizer

def build_model(cfg, mcfg, device, init_sd):
    """(model, objective, optimizer): the model built in place on the device (init_sd's weights, or fresh ones), the
    objective around it as parallel.parallelize spreads it (DDP or FSDP, compiled or not: the loop never asks which),
    and the optimizer over the model's parameters as spread (optimizers.py: AdamW, or Muon for the blocks' matrices).
    Numerics, DDP and FSDP alike: fp32 weights, bf16 matmuls from the loop's autocast, an fp32 residual stream."""
    with torch.device(device):                          # no full CPU copy per process
        model = Llama(mcfg, activation_checkpointing=cfg.activation_checkpointing, loss_chunk=cfg.loss_chunk)
    if init_sd is not None:
        model.load_state_dict(init_sd)
    # what a step minimises, all its settings here: loss (+ early-exit loss) + λ · Σ_l w_l Ψ_l (loss.Objective)
    objective = Objective(model, jreg_lambda=cfg.jreg_lambda, alpha=cfg.jreg_alpha, weighting=cfg.jreg_weighting,
                          final_norm=cfg.jreg_final_norm, skip_first=cfg.jreg_skip_first,
                          early_exit=cfg.early_exit, early_exit_scale=cfg.early_exit_scale,
                          early_exit_every=cfg.early_exit_every).to(device)
    objective = parallelize(objective, cfg, device)       # parallel.Parallel: the objective as the loop calls it
    return model, objective, build_optimizer(model, cfg, device)   # AdamW, or Muon + AdamW (optimizers.py)


# ----------------------------------------------------------------------------------------------------------
# One optimizer step, and validation

def token_counts(batch, skip_first):
    """(targets predicted, tokens Ψ averages over) of a micro-batch (x, y, mask or None) on the host, by numpy."""
    x, y, mask = batch
    counted = x.shape[0] * (x.shape[1] - int(skip_first)) if mask is None else mask[:, int(skip_first):].numpy().sum()
    return [int(np.count_nonzero(y.numpy() != -1)), int(counted)]


def train_step(objective, batches, counts, autocast, stop):
    """Forward and backward of a step's micro-batches (on the device; counts: their token counts) through the
    objective (parallel.Parallel over loss.Objective). Returns the step's named means over the whole global batch
    (tensors on the device): loss, what was back-propagated (the objective's loss + λ · penalty), each part of the
    objective's loss (ce, early_exit, ...), the penalty jreg and Ψ_1..Ψ_L (psi), and stopping, how many processes were
    asked to stop (stop: this one was). A micro-batch's means are weighted by its share of the global batch's targets
    (the loss's terms) or counted tokens (the penalty's), so the weighted sums over every micro-batch of every process
    are the global means (1×8, 2×4 and 8×1 give the same step); they are summed over processes in one all-reduce."""
    totals = counts.sum(0)
    if dist.is_initialized():
        dist.all_reduce(totals)                                   # the global batch's targets and counted tokens
    shares = counts / totals.clamp(min=1)                         # each micro-batch's part of them: (CE, Ψ)
    world = dist.get_world_size() if dist.is_initialized() else 1     # DDP and FSDP average gradients over processes
    lam, sums = objective.jreg_lambda, {"loss": 0.0}
    for micro, (x, y, mask) in enumerate(batches):
        objective.set_gradient_sync(micro == len(batches) - 1)   # all-reduced once, after the last micro-batch
        with autocast:
            loss, penalty, per_target, per_token = objective(x, y, mask)   # one forward: means, and those to log
        ce_share, psi_share = shares[micro]
        part = loss * ce_share + lam * penalty * psi_share        # loss + λ · Σ_l w_l Ψ_l, this micro-batch's part
        (part * world).backward()                                 # × world: the processes' average is their sum
        sums["loss"] = sums["loss"] + loss.detach() * ce_share    # the loss as back-propagated (+ λ · jreg below)
        for values, share in ((per_target, ce_share), (per_token, psi_share)):
            for name, value in values.items():
                sums[name] = sums.get(name, 0.0) + value * share
    sums = {**sums, "loss": sums["loss"] + lam * sums["jreg"],
            "stopping": torch.tensor(float(stop), device=shares.device)}
    if dist.is_initialized():                                     # the sums over processes: the global means
        flat = torch.cat([value.reshape(-1) for value in sums.values()])
        dist.all_reduce(flat)
        sums = dict(zip(sums, (part.view_as(value) for part, value in zip(flat.split(
            [value.numel() for value in sums.values()]), sums.values()))))
    return sums


def read_on_host(values):
    """A dict of tensors on the device as Python numbers (a tensor of one dimension or more: a list), in one copy: a
    step's one wait for the device."""
    flat = torch.cat([value.reshape(-1).float() for value in values.values()]).tolist()
    out, start = {}, 0
    for name, value in values.items():
        part, start = flat[start:start + value.numel()], start + value.numel()
        out[name] = part if value.dim() else part[0]
    return out


@torch.no_grad()
def validate(objective, val_batches, cfg, device, autocast):
    """Validation loss and Ψ / ζ (in the penalty's convention) on the fixed validation windows, over all processes;
    the model's forward in eager mode (objective.evaluate)."""
    objective.model.eval()
    profile = Profile()
    with autocast:
        for x, y, mask in to_device(val_batches, device):
            out = objective.evaluate(x, y)                        # the chunked loss: no full logits held
            n = (y != -1).sum()                                   # 0 in a micro-batch of padding windows only
            profile.add(out.hidden_states, out.final_hidden, mask=mask, n_loss=n,
                        loss_sum=torch.where(n > 0, out.loss.float() * n, 0.0))
    objective.model.train()
    p = profile.result(dist.all_reduce if dist.is_initialized() else None)
    key = "psi" + ("_normed" if cfg.jreg_final_norm else "") + ("_skip_first" if cfg.jreg_skip_first else "")
    return {"val_loss": p["loss"], "psi": p[key], "zeta": p[key.replace("psi", "zeta")]}


def same_start(cfg, run, device):
    """Every process starts from the same step and data position, or none does: each lists out_dir itself, and a
    node-local out_dir (each node its own folder) would otherwise resume some ranks and start others afresh (a hang)."""
    starts = gather((run.step, run.seq_index), device)
    if len(set(starts)) > 1:
        fail(f"the processes would start from different points of {cfg.out_dir}: " + ", ".join(
             f"rank {r} step {s} (sequence {q})" for r, (s, q) in enumerate(starts)) + "; out_dir must be one folder "
             "that every node sees (a shared file system)")


def skipped(run, saver, cfg, step, bad, seq_index, loss, grad_norm, lr):
    """A step not applied (a non-finite loss or gradient norm): nothing of it was applied and the data moves on past its
    batch (sequences seq_index on). It is logged; the bad-th in a row beyond max_bad_steps ends the run, naming the
    last checkpoint and a change that resume accepts."""
    if bad > cfg.max_bad_steps:
        saver.finish()                                                    # an async save in flight is published
        last = list_checkpoints(cfg.out_dir)
        fail(f"non-finite loss {loss} or gradient norm {grad_norm} at step {step} (data from sequence "
             f"{seq_index}), {bad} in a row (max_bad_steps = {cfg.max_bad_steps}); nothing of "
             f"{'it' if bad == 1 else f'steps {step - bad + 1}-{step}'} was applied. The last checkpoint is "
             f"{last[-1][1] if last else '(none)'}: rerun with a lower lr (e.g. --lr={cfg.lr / 2:g}), grad_clip "
             f"or a higher max_bad_steps to resume from it")
    run.log({"step": step, "tokens": step * cfg.batch_tokens, "skipped": bad, "seq_index": seq_index,
             "bad_loss": loss, "bad_grad_norm": grad_norm, "lr": lr},
            f"step {step:6d} | skipped: non-finite loss {loss} or gradient norm {grad_norm}, data from sequence "
            f"{seq_index} | {bad} in a row (max_bad_steps = {cfg.max_bad_steps})")


# ----------------------------------------------------------------------------------------------------------

def main(argv):
    if {"-h", "--help"} & set(argv):
        return print(usage())
    # ---- settings: the config, this process's place, its device
    cfg = load_config(argv)                                       # frozen: cfg.lr = 0.5 raises
    proc = processes()
    grad_accum = grad_accum_steps(cfg, proc.world)
    device, autocast = place(cfg, proc)            # the device, the process group, bf16 autocast over fp32 or none
    torch.manual_seed(cfg.seed)            # the initialisation; training draws nothing random after it (dropout would:
                                           # docs/ablations.md says what an exact resume then needs)

    # ---- weights: the run's own checkpoints (a resume) or init_from's, and the model's shape; then the data: all
    # checked before anything is written
    ckpts = list_checkpoints(cfg.out_dir)                         # read once
    init_sd, mcfg = start_weights(cfg, ckpts)
    seqs_per_step = cfg.batch_tokens // cfg.seq_len
    train_data, val_batches = data_streams(cfg, mcfg.vocab_size,
                                           cfg.eval_batches * cfg.micro_batch if cfg.eval_interval else 0, proc)
    cfg = derived(cfg, device, train_data.per_epoch)              # device, max_steps from epochs, warm-up from ratio

    # ---- resume: the run folder locked and checked, then the model and optimizer at its newest checkpoint
    run = Run(cfg, mcfg, data_identity(cfg.data_dir), proc.rank, ckpts)
    same_start(cfg, run, device)                                  # the first collective: every process agrees
    model, objective, optimizer = build_model(cfg, mcfg, device, None if run.step else init_sd)
    del init_sd
    if run.ckpt is not None:
        restore(run.ckpt, model, optimizer)
        run.ckpt = None                                           # the memory back
    saver = Checkpoints(cfg, run.data_id)
    step, seq_index = run.step, run.seq_index
    run.start(device, f"model {cfg.init_from or cfg.model}: {model.num_params() / 1e6:.1f}M parameters, "
              f"{mcfg.n_layer} layers | world {proc.world} | grad_accum {grad_accum} | device {device} "
              f"{'bf16' if isinstance(autocast, torch.autocast) else 'fp32'} | jreg λ={cfg.jreg_lambda} α={cfg.jreg_alpha} {cfg.jreg_weighting}")
    flops_per_step, (_, peak) = model.flops_per_token(cfg.seq_len) * cfg.batch_tokens, peak_flops(device)

    # ---- the loop: one wait for the device a step (every number it logs, whether to apply it, whether to stop)
    if step == 0 and cfg.eval_interval > 0:
        run.log({"step": 0, "tokens": 0, **validate(objective, val_batches, cfg, device, autocast)}, quiet=True)
    def batches_at(first):                           # a step's micro-batches on the device, and their token counts
        return step_batches(train_data, first, grad_accum, cfg.micro_batch, proc, device, cfg.jreg_skip_first)
    batches, counts = batches_at(seq_index)
    bad, compiled_before = 0, compile_seconds()                 # non-finite steps in a row; seconds compiling
    while step < cfg.max_steps:
        t0, lr = time.time(), lr_at(step, cfg)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr * param_group.get("lr_mult", 1.0)
        objective.at_step(step)                                 # the early exits this step trains (LayerSkip's)
        means = train_step(objective, batches, counts, autocast, run.stop_requested())
        grad_norm = objective.clip_grad_norm(cfg.grad_clip)
        batches, counts = batches_at(seq_index + seqs_per_step)   # the next step's, read while the device works
        means["zeta"], means["grad_norm"] = jump_rate(means.pop("psi")), grad_norm     # ζ_2..ζ_L: on the device
        means = read_on_host(means)                             # the wait: every number, the same on every process
        grad_norm, zeta, stopping = means.pop("grad_norm"), means.pop("zeta"), means.pop("stopping")
        applied = math.isfinite(means["loss"]) and math.isfinite(grad_norm)
        if applied:
            optimizer.step()                                    # never a step on non-finite numbers
        optimizer.zero_grad(set_to_none=True)
        bad = 0 if applied else bad + 1
        if not applied:                                         # logged; too many in a row end the run
            skipped(run, saver, cfg, step + 1, bad, seq_index, means["loss"], grad_norm, lr)
        seq_index += seqs_per_step                              # past the batch, applied or skipped
        step += 1
        dt = time.time() - t0
        if applied and (step % cfg.log_interval == 0 or step == cfg.max_steps):
            compiled = compile_seconds() - compiled_before              # since the last log: the first step's compile
            compiled_before += compiled
            run.log({"step": step, "tokens": step * cfg.batch_tokens, **means,      # loss, ce, jreg and any added
                     "zeta_L": zeta[-1] if zeta else None, "lr": lr,
                     "grad_norm": grad_norm, "tok_per_s": cfg.batch_tokens / dt,
                     "mfu": flops_per_step / dt / (peak * proc.world) if peak else None,
                     "mem_gb": torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None,
                     **({"compile_s": compiled} if compiled else {})})
        if cfg.eval_interval > 0 and (step % cfg.eval_interval == 0 or step == cfg.max_steps):
            run.log({"step": step, "tokens": step * cfg.batch_tokens, **validate(objective, val_batches, cfg, device,
                                                                                  autocast)})
        stop = stopping > 0                                     # some process got SIGTERM / SIGINT
        if step % cfg.ckpt_interval == 0 or step == cfg.max_steps or stop:
            saver.save(step, model, optimizer, seq_index)
        if stop:
            if proc.rank == 0:
                print(f"stopped by signal at step {step}; checkpoint saved, rerun the same command to resume")
            break

    # ---- teardown
    saver.finish()                                                # an async checkpoint in flight is published
    objective.close()


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except SystemExit as e:       # an error line in one write: two processes' lines on one pipe never interleave
        if not isinstance(e.code, str):
            raise
        sys.stderr.write(e.code + "\n")
        sys.exit(1)
