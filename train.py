"""
Pre-train a Llama with or without JREG: loss = CE + λ · Σ_l w_l Ψ_l.

    python train.py configs/tiny.py                               # one process (CPU or one GPU)
    python train.py configs/tiny_jreg.py --max_steps=50 --lr=1e-3  # --key=value overrides the config file
    torchrun --nproc_per_node=8 train.py configs/170m_jreg.py     # DDP (or FSDP2 with --fsdp=True)

Every setting and its default is in config.Config; a config file is Python (trusted input) assigning some of them.
One step reads three files: this one (the loop and the loss), model.py (the forward) and jreg.py (Ψ and the penalty);
parallel.py spreads it over processes and devices, runs.py keeps the run folder.
Starting a run in an out_dir that holds a checkpoint resumes it exactly (runs.Run); the settings that define the
experiment must then be the same (config.RESUMABLE lists those that may change). A step with a non-finite loss or
gradient is skipped and logged. A user error is one `error:` line, exit status 1.
"""
import dataclasses
import math
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

from config import fail, load_config, usage
from data import (
    PackedStream, ShardStream, data_identity, is_conversations, load_manifest, split_over_processes, val_windows)
from jreg import JregObjective, Profile, jump_rate
from model import Llama
from parallel import Group, place, processes, shard_fsdp, to_device
from runs import Run, peak_flops, start_weights


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
# The model and the optimizer

def build_model(cfg, mcfg, device, init_sd):
    """The model, built in place on the device and FSDP-sharded when asked, and AdamW. Numerics, DDP and FSDP alike:
    fp32 weights, bf16 matmuls from the loop's autocast, an fp32 residual stream. No weight decay on norms, biases or
    the token embedding (tied: the shared matrix) unless decay_embeddings; an untied head decays."""
    with torch.device(device):                          # no full CPU copy per process
        model = Llama(mcfg, activation_checkpointing=cfg.activation_checkpointing, loss_chunk=cfg.loss_chunk)
    if init_sd is not None:
        model.load_state_dict(init_sd)
    if cfg.fsdp:
        shard_fsdp(model, cfg)
    decay, no_decay = [], []
    for p in model.parameters():
        decays = p.dim() >= 2 and (cfg.decay_embeddings or p is not model.tok_emb.weight)
        (decay if decays else no_decay).append(p)
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=device.type in ("cuda", "cpu"))
    return model, optimizer


# ----------------------------------------------------------------------------------------------------------
# One optimizer step, and validation

@dataclasses.dataclass
class StepStats:
    """Means over the global batch: cross-entropy, penalty Σ_l w_l Ψ_l, the loss CE + λ · penalty, and Ψ_1..Ψ_L; and
    how many processes were asked to stop."""
    ce: torch.Tensor
    penalty: torch.Tensor
    loss: torch.Tensor
    psi: torch.Tensor
    stopping: torch.Tensor


def token_counts(batch, skip_first):
    """(targets predicted, tokens Ψ averages over) of a micro-batch (x, y, mask or None) on the host, by numpy."""
    x, y, mask = batch
    counted = x.shape[0] * (x.shape[1] - int(skip_first)) if mask is None else mask[:, int(skip_first):].numpy().sum()
    return [int(np.count_nonzero(y.numpy() != -1)), int(counted)]


def train_step(objective, batches, counts, cfg, autocast, set_gradient_sync, stop):
    """Forward and backward of a step's micro-batches (on the device; counts: their token counts). CE and Ψ are means
    over the whole global batch, whatever the micro-batching and the number of processes: a micro-batch's means are
    weighted by its share of the global batch's targets (CE) and counted tokens (Ψ), so the weighted sums over every
    micro-batch of every process are the global means (1×8, 2×4 and 8×1 give the same step). stop: whether this
    process was asked to stop (a signal); the stats' all-reduce counts the processes asking."""
    totals = counts.sum(0)
    if dist.is_initialized():
        dist.all_reduce(totals)                                   # the global batch's targets and counted tokens
    shares = counts / totals.clamp(min=1)                         # each micro-batch's part of them: (CE, Ψ)
    world = dist.get_world_size() if dist.is_initialized() else 1     # DDP and FSDP average gradients over processes
    ce_sum, penalty_sum, psi_sum = 0.0, 0.0, 0.0
    for micro, (x, y, mask) in enumerate(batches):
        set_gradient_sync(micro == len(batches) - 1)              # all-reduced once, after the last micro-batch
        with autocast:
            ce, penalty, psi = objective(x, y, mask)              # one forward: CE, Σ_l w_l Ψ_l, Ψ_1..Ψ_L (means)
        ce_share, psi_share = shares[micro]
        loss = ce * ce_share + cfg.jreg_lambda * penalty * psi_share       # CE + λ · Σ_l w_l Ψ_l, this part of it
        (loss * world).backward()                                 # × world: the processes' average is their sum
        ce_sum, penalty_sum = ce_sum + ce.detach() * ce_share, penalty_sum + penalty.detach() * psi_share
        psi_sum = psi_sum + psi * psi_share
    stats = torch.cat([torch.stack([ce_sum, penalty_sum, ce_sum + cfg.jreg_lambda * penalty_sum]), psi_sum,
                       psi_sum.new_full((1,), float(stop))])
    if dist.is_initialized():
        dist.all_reduce(stats)                                    # the sums over processes: the global means
    return StepStats(*stats[:3], stats[3:-1], stats[-1])


@torch.no_grad()
def validate(model, val_batches, cfg, device, autocast):
    """Validation loss and Ψ / ζ (in the penalty's convention) on the fixed validation windows, over all processes;
    eager, also under FSDP's compiled blocks (no-grad mode and a ragged last micro-batch would compile them again)."""
    model.eval()
    profile = Profile()
    with autocast, torch.compiler.set_stance("force_eager"):
        for x, y, mask in to_device(val_batches, device):
            out = model(x, y)                                     # the chunked loss: no full logits held
            n = (y != -1).sum()                                   # 0 in a micro-batch of padding windows only
            profile.add(out.hidden_states, out.final_hidden, mask=mask, n_loss=n,
                        loss_sum=torch.where(n > 0, out.loss.float() * n, 0.0))
    model.train()
    p = profile.result(dist.all_reduce if dist.is_initialized() else None)
    key = "psi" + ("_normed" if cfg.jreg_final_norm else "") + ("_skip_first" if cfg.jreg_skip_first else "")
    return {"val_loss": p["loss"], "psi": p[key], "zeta": p[key.replace("psi", "zeta")]}


# ----------------------------------------------------------------------------------------------------------

def main(argv):
    if {"-h", "--help"} & set(argv):
        return print(usage())
    cfg = load_config(argv)
    proc = processes()
    grad_accum = grad_accum_steps(cfg, proc.world)
    device, autocast = place(cfg, proc)                           # bf16 autocast over fp32 weights, or none
    torch.manual_seed(cfg.seed)            # the initialisation; training draws nothing random after it (dropout would:
                                           # docs/ablations.md says what an exact resume then needs)

    # ---- setup: the weights to start from and the data, checked before anything is written
    init_sd, mcfg = start_weights(cfg)
    mcfg = dataclasses.replace(mcfg, max_seq_len=max(mcfg.max_seq_len, cfg.seq_len))
    seqs_per_step = cfg.batch_tokens // cfg.seq_len
    train_data, val_batches = data_streams(cfg, mcfg.vocab_size,
                                           cfg.eval_batches * cfg.micro_batch if cfg.eval_interval else 0, proc)
    if cfg.epochs:
        cfg.max_steps = max(1, math.ceil(cfg.epochs * train_data.per_epoch / seqs_per_step))
    if cfg.warmup_ratio:
        cfg.warmup_steps = round(cfg.warmup_ratio * cfg.max_steps)

    # ---- resume: the run folder locked and checked, then the model and optimizer at its newest checkpoint
    run = Run(cfg, mcfg, data_identity(cfg.data_dir), proc.rank)
    group = Group(proc, device, cfg)                              # torchrun's processes: their group, before the model
    model, optimizer = build_model(cfg, mcfg, device, None if run.step else init_sd)
    del init_sd
    run.restore(model, optimizer)
    step, seq_index = run.step, run.seq_index
    run.start(device, model, f"model {cfg.init_from or cfg.model}: {model.num_params() / 1e6:.1f}M parameters, "
              f"{mcfg.n_layer} layers | world {proc.world} | grad_accum {grad_accum} | device {device} "
              f"{'bf16' if isinstance(autocast, torch.autocast) else 'fp32'} | jreg λ={cfg.jreg_lambda} α={cfg.jreg_alpha} {cfg.jreg_weighting}")

    # the penalty's settings, all here: w_l = layer_weights(L, α, weighting), h_L's convention, position 0; λ below
    objective = JregObjective(model, alpha=cfg.jreg_alpha, weighting=cfg.jreg_weighting,
                              final_norm=cfg.jreg_final_norm, skip_first=cfg.jreg_skip_first,
                              penalize=cfg.jreg_lambda > 0, compile_penalty=cfg.compile and cfg.fsdp).to(device)
    group.wrap(objective, model)                   # group.forward: DDP-wrapped and compiled as cfg says, in that order
    flops_per_step, (_, peak) = model.flops_per_token(cfg.seq_len) * cfg.batch_tokens, peak_flops(device)

    # ---- the loop: one wait for the device a step (whether to apply it), outside logging, eval and checkpoint steps
    if step == 0 and cfg.eval_interval > 0:
        run.log({"step": 0, "tokens": 0, **validate(model, val_batches, cfg, device, autocast)}, quiet=True)
    def batches_at(first):                           # a step's micro-batches on the device, and their token counts
        return step_batches(train_data, first, grad_accum, cfg.micro_batch, proc, device, cfg.jreg_skip_first)
    batches, counts = batches_at(seq_index)
    while step < cfg.max_steps:
        t0, lr = time.time(), lr_at(step, cfg)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        stats = train_step(group.forward, batches, counts, cfg, autocast, group.set_gradient_sync,
                           run.stop_requested())
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip or float("inf"))
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        batches, counts = batches_at(seq_index + seqs_per_step)   # the next step's, read while the device works
        finite = torch.isfinite(stats.loss) & torch.isfinite(grad_norm)
        applied, stop = torch.stack([finite, stats.stopping > 0]).tolist()   # the wait; the same on every process
        if applied:
            optimizer.step()                                    # never a step on non-finite numbers
        run.count_bad_steps(applied, step + 1, seq_index, stats.loss, grad_norm, lr)
        optimizer.zero_grad(set_to_none=True)
        seq_index += seqs_per_step                              # past the batch, applied or skipped
        step += 1
        dt = time.time() - t0
        if applied and (step % cfg.log_interval == 0 or step == cfg.max_steps):
            zeta = jump_rate(stats.psi)
            rec = {"step": step, "tokens": step * cfg.batch_tokens, "loss": stats.loss.item(), "ce": stats.ce.item(),
                   "jreg": stats.penalty.item(), "zeta_L": zeta[-1].item() if len(zeta) else None, "lr": lr,
                   "grad_norm": grad_norm.item(), "tok_per_s": cfg.batch_tokens / dt,
                   "mfu": flops_per_step / dt / (peak * proc.world) if peak else None,
                   "mem_gb": torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None}
            run.log(rec)
        if cfg.eval_interval > 0 and (step % cfg.eval_interval == 0 or step == cfg.max_steps):
            run.log({"step": step, "tokens": step * cfg.batch_tokens, **validate(model, val_batches, cfg, device,
                                                                                  autocast)})
        if run.checkpoint(step, model, optimizer, seq_index, stop):
            break                                               # stopped by a signal, its checkpoint saved

    # ---- teardown
    run.close()                                                   # an async checkpoint in flight is published
    group.close()


if __name__ == "__main__":
    main(sys.argv[1:])
