"""
Speed, measured side by side in one run (ratios, not absolute claims). Random tokens, no data needed.

    python -m scripts.bench                                   # CPU: small config, fp32, eager
    python -m scripts.bench --preset 170m --device cuda --compile --dtype bfloat16 --micro_batch 16 --seq_len 2048
                                                      # the GPU check: tok/s and MFU, λ = 0 vs λ = 1
    python -m scripts.bench --generate --micro_batch 1 --prompt_len 128   # generation: KV cache vs recomputation
    python -m scripts.bench --memory_probe --loss_chunk 128   # peak memory, measured beside estimate(): full vs chunked loss,
                                                      # blocks stored vs checkpointed; and their step times
    python -m scripts.bench --loss_chunks 1024 8192 --preset 170m --micro_batch 4 --seq_len 2048
                                                      # the loss alone (head + cross-entropy, forward + backward) at
                                                      # each chunk size: step time and bytes per logit
    python -m scripts.bench --memory configs/1b_jreg.py --world 8 [--fsdp] [--compile] [--checkpointing]
                                                      # the predicted peak per GPU of a config, by part
    python -m scripts.bench --against 9146661 --compile       # the training forward + backward of model.py now vs at a git
                                                      # revision (an ablation vs main: --against main), same weights
    python -m scripts.bench --steps configs/kjv.py configs/kjv_lns.py ...   # a training step of each config, as a
                                                      # ratio to the first's in the same round (a method's step cost)
    ... --json results/speed/NAME.json                # also write the numbers, the command and the machine (a record
                                                      # the docs quote: results/collect.py reads results/speed/)

It times, interleaving the contenders so that machine noise hits all of them alike (median of --repeats):
  1. forward + backward: our Llama vs transformers' LlamaForCausalLM with the same weights (skipped without
     transformers or with --no_hf);
  2. a full training step (forward, backward, clip, AdamW) through train.py's objective (loss.Objective), λ = 0 vs λ = 1,
     and our training step vs the same step on the Hugging Face model.
"""
import argparse
import dataclasses
import datetime
import glob
import inspect
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import types
from contextlib import nullcontext, suppress

import torch
import torch.nn.functional as F

from checkpoint import list_checkpoints, load_checkpoint
from config import Config, load_config, model_config
from files import one_line
from jreg import jreg_penalty
from loss import Objective
from lib.commands import check_device, int_at_least
from lib.generation import generate, generate_uncached
from lib.hf import llama_to_hf
from loss import cross_entropy
from model import Llama, LlamaConfig, PRESETS
from optimizers import build_optimizer
from parallel import PEAK_FLOPS, peak_flops
from runs import git


CLOCK = time.perf_counter      # --cpu_time: time.process_time, this process's CPU seconds (a machine shared)
RESULTS = {}                   # what --json writes: each bench below records its numbers here as it prints them


def machine():
    """The machine a measurement ran on: CPU model and vector extensions, threads, GPU, torch."""
    cpu = platform.processor()
    with suppress(OSError):
        info = open("/proc/cpuinfo").read()
        cpu = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), cpu)
        flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))
        cpu += " (" + ("AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2") + ")"
    return {"cpu": cpu, "cores": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


def timed(fn, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = CLOCK()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return CLOCK() - t0


def measured_peak(fn, device=torch.device("cpu")):
    """Peak bytes allocated by fn() beyond what was allocated before it. CUDA: max_memory_allocated. CPU: the running
    sum of every allocation and free that torch.profiler records (profile_memory=True), in time order: exact tensor
    bytes, free of the allocator's caching and of RSS noise."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]" and e.device_type().name == "CPU")
    return max(itertools.accumulate((nbytes for _, nbytes in events), initial=0))


COMPILED_BLOCK = 0.66   # a block's saved activations compiled / eager, torch.compile (inductor) measured on CPU


def estimate(mcfg, micro_batch, seq_len, mode="autocast", checkpointing=False, loss_chunk=1024, jreg=True,
             compiled=False, world=1, fsdp=False, grad_accum=1, optimizer="adamw"):
    """Predicted peak bytes per process of one training step, by part. mode: fp32 | autocast (fp32 weights, bf16
    matmuls: train.py on a GPU, DDP and FSDP alike). loss_chunk 0: the full-logits loss. The activations are what
    autograd saves, at whichever moment holds the most: the end of the forward pass (autocast's cache of bf16
    weights still alive), the start of the backward pass, or (checkpointing) a block's recomputation; test_memory.py
    checks them against torch.profiler's peaks on CPU (eager). compiled (from CPU inductor measurements): blocks keep
    COMPILED_BLOCK of it, a full-logits loss ~2.5 bytes per logit. optimizer: adamw (two fp32 moments a parameter)
    or muon (Muon's one fp32 momentum buffer for the blocks' matrices, AdamW's two for the rest)."""
    L, d, f, V, n = mcfg.n_layer, mcfg.d_model, mcfg.ffn_hidden, mcfg.vocab_size, micro_batch * seq_len
    kv = mcfg.n_kv_head * mcfg.head_dim
    p_block = 2 * d + 2 * d * d + 2 * d * kv + 3 * d * f
    p_top = V * d * (1 if mcfg.tie_embeddings else 2) + d
    P = L * p_block + p_top
    c = 4 if mode == "fp32" else 2                    # bytes of a matmul's input and output; the residual stream is fp32
    # saved per token by a block: two RMSNorms (input, normalized, and the output: fp32 once, or its bf16 cast once per
    # linear under autocast), rotated q and k, v, attention output; gate, silu, up, product
    block = 16 * d + (8 if mode == "fp32" else 10) * d + c * (2 * d + 2 * kv) + 4 * c * f
    block *= COMPILED_BLOCK if compiled else 1
    top = 8 * d if loss_chunk else c * d + 8 * d       # the final norm; full loss: its output kept for the head
    kept = L * (4 * d if checkpointing else block)   # checkpointing keeps each block's input only
    streams = (L + 1) * 4 * d if jreg else 0        # the penalty's gradients of h_0..h_L, waiting for their block
    rows = min(loss_chunk, n)
    if loss_chunk:   # one chunk's logits and what autograd keeps of them (its log-softmax, beside the fp32 logits in
        # fp32); the gradients for the final hidden and the head (made in the forward pass, then scaled): the head's
        # fp32 sum and one chunk's fresh gradient (fp32; autocast: bf16, and its cast to fp32)
        loss_fwd = (11 if c == 4 else 10) * rows * V + (8 if c == 4 else 10) * V * d + 4 * n * d
        loss_bwd = 8 * (n + V) * d
    else:            # log-softmax and two gradients of every logit in fp32 (compiled: ~2.5 bytes a logit)
        loss_fwd, loss_bwd = (2.5 if compiled else 8) * n * V, (2.5 if compiled else 12) * n * V
    copies = 2 * (L * p_block + V * d) if c == 2 else 0                 # autocast's cached bf16 weights
    saved_copies = 2 * (L * p_block * (not checkpointing) + V * d * (not loss_chunk)) if c == 2 else 0
    phases = {  # (activations, logits)
        "forward": (n * (kept + top) + copies, loss_fwd),
        "backward": (n * (kept + top + streams) + saved_copies, loss_bwd)}
    if checkpointing:                                 # one block recomputed, its gradients in flight
        phases["recompute"] = (n * (kept + streams + block + 2 * c * f) + 2 * p_block * (c == 2), 0)
    activations, logits = max(phases.values(), key=sum)
    shard = world if fsdp else 1
    p_head = p_top if mcfg.tie_embeddings else V * d + d   # FSDP's gathered groups at the backward's start: the root
    matrices = L * (p_block - 2 * d) if optimizer == "muon" else 0          # Muon's: one buffer each, not two
    parts = dict(weights=4 * P / shard + (4 * (p_head + 2 * p_block) if fsdp else 0),   # (final norm, head), two blocks
                 gradients=4 * P / shard, optimizer=(8 * P - 4 * matrices) / shard,      # AdamW: two fp32 moments
                 # DDP: its fp32 gradient buckets; FSDP accumulating micro-batches: the unsharded fp32 gradients
                 buffers=4 * P if not fsdp or grad_accum > 1 else 0, activations=activations, logits=logits)
    return {**parts, "total": sum(parts.values())}


def race(contenders, device, warmup, repeats, rounds=False):
    """Median seconds per call of each contender, interleaved, in reverse order every other round (so that neither
    the first nor the last place favours a contender); rounds: each round's seconds instead of the medians."""
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in contenders}
    for r in range(repeats):
        for name, fn in list(contenders.items())[::-1 if r % 2 else 1]:
            times[name].append(timed(fn, device))
    return times if rounds else {name: statistics.median(t) for name, t in times.items()}


def bench_steps(args, device, autocast):
    """A training step of each config (its model and methods, its objective and optimizer; one micro-batch of its shape,
    random tokens), interleaved, each round's time as a ratio to the first config's in the same round: what a method
    costs a step, apart from the machine's load."""
    contenders = {}
    for path in args.steps:
        cfg = load_config([path])
        mcfg = model_config(cfg)
        torch.manual_seed(0)
        model = Llama(mcfg, loss_chunk=cfg.loss_chunk).to(device)
        objective = Objective(model, jreg_lambda=cfg.jreg_lambda, alpha=cfg.jreg_alpha, weighting=cfg.jreg_weighting,
                              final_norm=cfg.jreg_final_norm, skip_first=cfg.jreg_skip_first, early_exit=cfg.early_exit,
                              early_exit_scale=cfg.early_exit_scale, early_exit_every=cfg.early_exit_every).to(device)
        run = torch.compile(objective) if args.compile else objective
        x, y = (torch.randint(0, mcfg.vocab_size, (cfg.micro_batch, cfg.seq_len), device=device) for _ in "xy")
        opt = build_optimizer(model, cfg, device)                       # its own: AdamW, or Muon and AdamW

        def step(objective=objective, run=run, model=model, opt=opt, x=x, y=y, cfg=cfg, count=itertools.count()):
            objective.at_step(next(count))                               # LayerSkip's rotation, as in training
            with autocast:
                loss, penalty, *_ = run(x, y)
            (loss + cfg.jreg_lambda * penalty).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip or float("inf"))
            opt.step()
            opt.zero_grad(set_to_none=True)
        contenders[os.path.splitext(os.path.basename(path))[0]] = step
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None     # other work on the machine, said with it
    times = race(contenders, device, args.warmup, args.repeats, rounds=True)
    first = next(iter(times))
    ratios = {name: sorted(a / b for a, b in zip(t, times[first])) for name, t in times.items()}
    print(f"a training step of each config, {args.repeats} interleaved rounds | {device} {args.dtype} | "
          f"compile={bool(args.compile)} | threads {torch.get_num_threads()} | torch {torch.__version__}")
    for name, t in times.items():
        q = statistics.quantiles(ratios[name], n=4)
        print(f"{name:32s} {1e3 * statistics.median(t):8.1f} ms   × {first}: {statistics.median(ratios[name]):.3f} "
              f"(quartiles {q[0]:.3f}–{q[2]:.3f})")
    RESULTS.update(step_ms={k: 1e3 * statistics.median(v) for k, v in times.items()}, first=first,
                   ratio={k: statistics.median(v) for k, v in ratios.items()},
                   ratio_quartiles={k: statistics.quantiles(v, n=4)[::2] for k, v in ratios.items()},
                   configs=list(args.steps), threads=torch.get_num_threads(), repeats=args.repeats,
                   load_average=[load, os.getloadavg()[0] if load is not None else None], cpus=os.cpu_count())


def bench_generation(model, device, args):
    """--generate: greedy generation of --max_new_tokens tokens after --prompt_len random tokens, --micro_batch rows:
    cached vs uncached (Llama.forward over the whole growing sequence), interleaved, median of --repeats."""
    cfg = model.config
    n_new = min(args.max_new_tokens, cfg.max_seq_len - args.prompt_len)
    if n_new < 1:
        raise SystemExit(f"error: --prompt_len {args.prompt_len} leaves no room in max_seq_len {cfg.max_seq_len}")
    torch.manual_seed(0)
    prompts = torch.randint(0, cfg.vocab_size, (args.micro_batch, args.prompt_len)).tolist()
    cached = lambda: generate(model, prompts, n_new, stop_ids=(), stop_texts=())
    uncached = lambda: generate_uncached(model, prompts, n_new)
    same = cached() == uncached()
    t = race({"cached": cached, "uncached": uncached}, device, warmup=1, repeats=args.repeats)
    print(f"{cfg.n_layer} layers, d={cfg.d_model}, vocab {cfg.vocab_size} | batch {args.micro_batch}, prompt "
          f"{args.prompt_len} + {n_new} new tokens, greedy | {device} {next(model.parameters()).dtype} | "
          f"torch {torch.__version__}")
    for k, sec in t.items():
        print(f"{k:9s} {1e3 * sec:9.1f} ms   {args.micro_batch * n_new / sec:8.1f} tok/s")
    print(f"speed-up of the cache: {t['uncached'] / t['cached']:.2f}x; same tokens: {same}")
    RESULTS.update(batch=args.micro_batch, new_tokens=n_new, same_tokens=same,
                   **{f"{k}_tok_per_s": args.micro_batch * n_new / sec for k, sec in t.items()})


def fwd_bwd(run, x, y, autocast, full=False):
    """Forward + backward of the λ = 1 training loss of run (CE + the penalty, as loss.Objective); returns the loss.
    full: the cross-entropy of the full logits instead of the chunked loss."""
    def fn():
        with autocast:
            out = run(x) if full else run(x, y)
            ce = F.cross_entropy(out.logits.float().flatten(0, 1), y.reshape(-1)) if full else out.loss
            loss = ce + jreg_penalty(out.hidden_states, 1.0)
        del out
        loss.backward()
        return loss.detach()
    return fn


def bench_loss_chunks(mcfg, device, args, autocast, y):
    """--loss_chunks: the loss as training runs it (lm_head and cross-entropy through loss.cross_entropy, forward +
    backward into allocated gradients) at each chunk size, interleaved: step time, and the measured peak beyond the
    weights and gradients per logit of the micro-batch. Each chunk writes one fresh fp32 gradient of the head and adds
    it into the sum: chunks x 4 x the head's fp32 bytes of memory traffic, shown beside."""
    head = torch.nn.Linear(mcfg.d_model, mcfg.vocab_size, bias=False, device=device)
    head.weight.grad = torch.zeros_like(head.weight)
    h = torch.randn(args.micro_batch, args.seq_len, mcfg.d_model, device=device, requires_grad=True)
    h.grad, n = torch.zeros_like(h), y.numel()

    def step(rows):
        def run():
            with autocast:
                loss, _ = cross_entropy(head, h, y, rows)
            loss.backward()
        return run
    steps = {rows: step(rows) for rows in args.loss_chunks}
    t = race(steps, device, args.warmup, args.repeats)
    print(f"the loss alone, {args.preset} width: d={mcfg.d_model}, vocab {mcfg.vocab_size} | {args.micro_batch}x"
          f"{args.seq_len} = {n} positions | {device} {args.dtype}")
    first, table = args.loss_chunks[0], {}
    for rows in args.loss_chunks:
        chunks = -(-n // rows)
        table[rows] = {"chunks": chunks, "ms": 1e3 * t[rows], "bytes_per_logit": measured_peak(steps[rows], device)
                       / (n * mcfg.vocab_size), "head_grad_traffic_gb": chunks * 4 * head.weight.numel() * 4 / 1e9}
        r = table[rows]
        print(f"chunk {rows:6d} ({chunks:3d} chunks)  {r['ms']:9.1f} ms  speed vs chunk {first}: "
              f"{t[first] / t[rows]:.3f}x  {r['bytes_per_logit']:.2f} bytes per logit  head-gradient traffic "
              f"{r['head_grad_traffic_gb']:.2f} GB")
    RESULTS.update(loss_chunks=table)


def bench_memory(mcfg, device, args, autocast, x, y):
    """--memory_probe: measured peaks beside estimate()'s, and step times, of one λ = 1 training step (forward +
    backward, gradients already allocated): the full-logits loss vs the chunked one, blocks stored vs checkpointed."""
    mode, n = ("autocast" if args.dtype == "bfloat16" else "fp32"), args.micro_batch * args.seq_len
    with torch.device(device):                   # built in place (3.4B: no CPU init and copy)
        model = Llama(mcfg, loss_chunk=args.loss_chunk)
    run = torch.compile(model) if args.compile else model
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    print(f"memory probe {args.preset}: {mcfg.n_layer} layers, d={mcfg.d_model}, vocab {mcfg.vocab_size} | batch "
          f"{args.micro_batch}x{args.seq_len} | {device} {args.dtype} | compile={bool(args.compile)} | peaks: "
          f"{'max_memory_allocated' if device.type == 'cuda' else 'torch.profiler'}, beyond weights and gradients")
    h = torch.randn(args.micro_batch, args.seq_len, mcfg.d_model, device=device, requires_grad=True)
    per_logit = {}
    for name, loss in (("full", lambda: F.cross_entropy(model.lm_head(h).float().flatten(0, 1), y.view(-1))),
                       ("chunked", lambda: model.loss(model.lm_head, h, y, model.loss_chunk)[0])):
        def loss_step():
            with autocast:
                value = loss()
            value.backward()
        loss_step()
        per_logit[name] = measured_peak(loss_step, device) / (n * mcfg.vocab_size)
    print(f"the loss alone (head, cross-entropy, forward + backward): {per_logit['full']:.2f} bytes per logit full, "
          f"{per_logit['chunked']:.2f} chunked ({args.loss_chunk} positions a chunk)")
    variants = {"full logits": (True, False), "chunked loss": (False, False), "chunked + checkpointing": (False, True)}
    t = {}
    print(f"{'training step':24s} {'peak MB':>9s} {'estimate MB':>12s} {'est/meas':>9s}")
    for name, (full, ckpt) in variants.items():                          # one variant at a time: the flag is global
        model.activation_checkpointing = ckpt
        fn = fwd_bwd(run, x, y, autocast, full=full)
        fn()                                                              # warm-up (and compilation)
        peak = measured_peak(fn, device)
        e = estimate(mcfg, args.micro_batch, args.seq_len, mode, ckpt, 0 if full else args.loss_chunk,
                     compiled=bool(args.compile))
        predicted = e["activations"] + e["logits"]
        print(f"{name:24s} {peak / 1e6:9.1f} {predicted / 1e6:12.1f} {predicted / peak:9.3f}")
        RESULTS.setdefault("peak_mb", {})[name] = peak / 1e6
        RESULTS.setdefault("estimate_mb", {})[name] = predicted / 1e6
        t.update(race({name: fn}, device, args.warmup, args.repeats))
    print(f"step time: full {1e3 * t['full logits']:.1f} ms, chunked {1e3 * t['chunked loss']:.1f} ms "
          f"(chunked / full = {t['chunked loss'] / t['full logits']:.3f}), checkpointed "
          f"{1e3 * t['chunked + checkpointing']:.1f} ms ({t['chunked + checkpointing'] / t['chunked loss']:.3f}x)")
    RESULTS.update(bytes_per_logit=per_logit, step_ms={k: 1e3 * v for k, v in t.items()}, loss_chunk=args.loss_chunk)


def bench_against(mcfg, device, args, autocast, x, y):
    """--against REV: forward + backward of the training loss (CE + the λ = 1 penalty) through model.py (and loss.py,
    where REV has one) as they are and as they were at git revision REV, with the same weights, interleaved; and whether
    the two give the same numbers."""
    def source(path):
        return subprocess.run(["git", "show", f"{args.against}:{path}"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)))
    if (model_py := source("model.py")).returncode:
        raise SystemExit(f"error: --against {args.against}: {model_py.stderr.strip()}")
    then, now_loss = {}, sys.modules["loss"]
    if not (loss_py := source("loss.py")).returncode:   # REV's model.py imports REV's loss.py, not today's
        sys.modules["loss"] = types.ModuleType("loss")
        exec(compile(loss_py.stdout, f"{args.against}:loss.py", "exec"), sys.modules["loss"].__dict__)
    try:
        exec(compile(model_py.stdout, f"{args.against}:model.py", "exec"), then)
    finally:
        sys.modules["loss"] = now_loss
    fields = {f.name for f in dataclasses.fields(then["LlamaConfig"])}
    now = Llama(mcfg).to(device)
    old = then["Llama"](then["LlamaConfig"](**{k: v for k, v in dataclasses.asdict(mcfg).items() if k in fields}))
    try:
        old.load_state_dict(now.state_dict())
    except RuntimeError as e:
        raise SystemExit(f"error: --against {args.against}: its model.py takes other weights ({one_line(e)})") from None
    old = old.to(device)
    def chunked(m):            # the training loss of a model.py of any date: chunked, whatever its forward calls it
        if "return_logits" in inspect.signature(m.forward).parameters:
            return lambda a, b: m(a, b, return_logits=False)
        return m
    contenders = {name: fwd_bwd(torch.compile(chunked(m)) if args.compile else chunked(m), x, y, autocast)
                  for name, m in (("now", now), ("then", old))}
    same = bool(torch.equal(*(fn() for fn in contenders.values())))
    t = race(contenders, device, args.warmup, args.repeats)
    print(f"{args.preset}: {mcfg.n_layer} layers, d={mcfg.d_model} | batch {args.micro_batch}x{args.seq_len} | {device} "
          f"{args.dtype} | compile={bool(args.compile)} | torch {torch.__version__}")
    print(f"training forward + backward: now {1e3 * t['now']:.1f} ms, {args.against} {1e3 * t['then']:.1f} ms; "
          f"speed now / {args.against} = {t['then'] / t['now']:.3f}x; same loss: {same}")
    RESULTS.update(against=args.against, ms={k: 1e3 * v for k, v in t.items()}, speed_ratio=t["then"] / t["now"],
                   same_loss=same)


def start_shape(cfg, path):
    """The model an init_from config (which sets no shape) starts from: the run folder's, when it is here, else that of
    the config beside it that trains init_from (configs/3.4b.py for out/3.4b)."""
    run = cfg.init_from.rpartition("@")[0] or cfg.init_from                      # RUN_DIR[@STEP]
    if ckpts := list_checkpoints(run):
        return LlamaConfig(**load_checkpoint(ckpts[-1][1])["model_config"])
    for other in sorted(glob.glob(os.path.join(os.path.dirname(path), "*.py"))):
        if run in open(other).read():                   # only a file that names the run is read (run) as a config
            with suppress(SystemExit):
                if (source := load_config([other])).out_dir == run and not source.init_from:
                    return model_config(source)
    raise SystemExit(f"error: {path}: init_from {cfg.init_from!r} is not here, and no config beside {path} trains it: "
                     "set its shape (model, n_layer, ...) in the config to estimate it")


def memory_table(args):
    """--memory CONFIG.py ...: the predicted peak per GPU of each config's training step, by part, in the mode it runs
    (its fsdp, compile, activation_checkpointing, micro_batch) unless --fsdp/--compile/--checkpointing say otherwise."""
    gib = 2 ** 30
    print(f"predicted peak per GPU, GiB ({args.world} processes; {args.gpu_gib} GiB a GPU; needed: 10% margin). "
          f"Not counted: CUDA context, NCCL buffers, compile workspace, allocator fragmentation.")
    cols = ("weights", "gradients", "optimizer", "buffers", "activations", "logits")
    print(f"{'config':26s} {'mode':18s} {'micro':>5s} {'accum':>5s} " + " ".join(f"{c[:7]:>7s}" for c in cols)
          + f" {'total':>7s} {'margin':>7s}")
    for path in args.memory:
        cfg = load_config([path])
        mcfg = start_shape(cfg, path) if cfg.init_from and not cfg.shape else model_config(cfg)
        fsdp, compiled, ckpt = (getattr(cfg, a) if getattr(args, k) is None else getattr(args, k) for k, a in
                                (("fsdp", "fsdp"), ("compile", "compile"), ("checkpointing", "activation_checkpointing")))
        mode = "fp32" if cfg.dtype == "float32" else "autocast"

        def total(micro_batch, ckpt):
            accum = cfg.batch_tokens // (cfg.seq_len * micro_batch * args.world)
            return estimate(mcfg, micro_batch, cfg.seq_len, mode, ckpt, loss_chunk=cfg.loss_chunk, compiled=compiled,
                            jreg=cfg.jreg_lambda > 0, world=args.world, fsdp=fsdp, grad_accum=accum,
                            optimizer=cfg.optimizer), accum
        est, accum = total(cfg.micro_batch, ckpt)
        if accum * cfg.seq_len * cfg.micro_batch * args.world != cfg.batch_tokens:
            raise SystemExit(f"error: {path}: batch_tokens {cfg.batch_tokens} is not a multiple of seq_len · "
                             f"micro_batch · world = {cfg.seq_len} · {cfg.micro_batch} · {args.world}")
        margin = 1 - est["total"] / (args.gpu_gib * gib)
        how = (f"{'FSDP' if fsdp else 'DDP'} {'compiled' if compiled else 'eager'}{' ckpt' if ckpt else ''}"
               f"{' muon' if cfg.optimizer == 'muon' else ''}")
        print(f"{path:26s} {how:18s} {cfg.micro_batch:5d} {accum:5d} " + " ".join(f"{est[c] / gib:7.2f}" for c in cols)
              + f" {est['total'] / gib:7.2f} {100 * margin:6.0f}%")
        with torch.device("meta"):                       # the shape alone: parameters and FLOPs per token
            shape = Llama(mcfg)
        RESULTS.setdefault("configs", {})[path] = {"mode": how, "micro_batch": cfg.micro_batch, "grad_accum": accum,
                                                   **{c: est[c] / gib for c in (*cols, "total")}, "margin": margin,
                                                   "params": shape.num_params(), "seq_len": cfg.seq_len,
                                                   "flops_per_token": shape.flops_per_token(cfg.seq_len)}
        if margin < 0.1:                                  # what would fit: checkpointing, or a smaller micro-batch
            fit = lambda m, c: total(m, c)[0]["total"] <= 0.9 * args.gpu_gib * gib
            fits = [f"activation_checkpointing=True ({total(cfg.micro_batch, True)[0]['total'] / gib:.1f} GiB)"] \
                if not ckpt and fit(cfg.micro_batch, True) else []
            fits += [f"micro_batch={m} ({total(m, ckpt)[0]['total'] / gib:.1f} GiB)" for m in range(cfg.micro_batch - 1, 0, -1)
                     if cfg.micro_batch % m == 0 and fit(m, ckpt)][:1]
            print(f"  {path}: under 10% margin; needs {' or '.join(fits) or 'more GPUs (FSDP) or a shorter seq_len'}")


def gib(text):
    if not (value := float(text)) > 0 or value == float("inf"):          # nan, 0, negative: argparse's one line
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.error = lambda message: sys.exit(f"error: {message}")      # one line and exit status 1, as every user error
    p.add_argument("--preset", default="small", choices=sorted(PRESETS))
    p.add_argument("--vocab_size", type=int_at_least(1), default=None, help="override the preset's vocabulary")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="autocast dtype")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile (--memory: default, each config's setting)")
    p.add_argument("--micro_batch", type=int_at_least(1), default=4)
    p.add_argument("--seq_len", type=int_at_least(1), default=256)
    p.add_argument("--warmup", type=int_at_least(0), default=3)
    p.add_argument("--repeats", type=int_at_least(1), default=10)
    p.add_argument("--no_hf", action="store_true", help="skip the transformers comparison")
    p.add_argument("--generate", action="store_true", help="generation instead: KV cache vs recomputation")
    p.add_argument("--prompt_len", type=int_at_least(1), default=128, help="--generate: prompt tokens")
    p.add_argument("--max_new_tokens", type=int_at_least(1), default=64, help="--generate: new tokens per row")
    p.add_argument("--memory_probe", action="store_true", help="peak memory and step time: full vs chunked loss, "
                   "blocks stored vs checkpointed, measured beside the estimate")
    p.add_argument("--memory", nargs="+", metavar="CONFIG.py", help="the predicted peak per GPU of these configs")
    p.add_argument("--against", metavar="REV", help="model.py now vs at this git revision: training forward + backward")
    p.add_argument("--steps", nargs="+", metavar="CONFIG.py", help="a training step of each config, interleaved, as a "
                   "ratio to the first's")
    p.add_argument("--world", type=int_at_least(1), default=8, help="--memory: processes (GPUs)")
    p.add_argument("--fsdp", action=argparse.BooleanOptionalAction, default=None, help="--memory: default, the config's")
    p.add_argument("--checkpointing", action=argparse.BooleanOptionalAction, default=None,
                   help="--memory: activation checkpointing (default, the config's)")
    p.add_argument("--gpu_gib", type=gib, default=79.6, help="--memory: a GPU's memory (an 80 GB H100: 79.6 GiB)")
    p.add_argument("--loss_chunk", type=int_at_least(1), default=1024,
                   help="--memory_probe: positions per chunk of the loss")
    p.add_argument("--loss_chunks", type=int_at_least(1), nargs="+", metavar="ROWS",
                   help="the loss alone at each of these chunk sizes: step time and bytes per logit")
    p.add_argument("--threads", type=int_at_least(0), default=0, help="CPU threads (0: torch's default)")
    p.add_argument("--json", metavar="PATH", help="also write the measured numbers, the command and the machine here")
    p.add_argument("--cpu_time", action="store_true", help="time this process's CPU seconds, not wall seconds "
                   "(on a machine shared with other work; with --threads 1)")
    return p.parse_args(argv)


def bench_training(mcfg, device, args, autocast, x, y):
    """Forward + backward ours vs Hugging Face, and full training steps λ = 0 vs λ = 1 (vs HF), interleaved."""
    def train_step_fn(step_model, params):
        opt = torch.optim.AdamW(params, lr=1e-4, fused=device.type in ("cuda", "cpu"))

        def step():
            with autocast:
                loss = step_model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    def objective(lam):
        torch.manual_seed(0)
        model = Llama(mcfg).to(device)
        obj = Objective(model, jreg_lambda=lam, alpha=1.0).to(device)
        run = torch.compile(obj) if args.compile else obj
        def loss(a, b):
            ce, penalty, *_ = run(a, b)
            return ce + lam * penalty                                   # as train.py's loop, one micro-batch
        return model, loss

    print(f"{args.preset}: {mcfg.n_layer} layers, d={mcfg.d_model}, vocab {mcfg.vocab_size} | batch "
          f"{args.micro_batch}x{args.seq_len} | {device} {args.dtype} | compile={bool(args.compile)} | torch {torch.__version__}")

    # 1 + 2: training steps
    base_model, base_loss = objective(0.0)
    jreg_model, jreg_loss = objective(1.0)
    contenders = {"ours λ=0": train_step_fn(base_loss, list(base_model.parameters())),
                  "ours λ=1": train_step_fn(jreg_loss, list(jreg_model.parameters()))}
    hf = None
    if not args.no_hf:
        try:
            hf = llama_to_hf(base_model).to(device)
        except ImportError:
            print("transformers is not installed: skipping the Hugging Face comparison")
    if hf is not None:
        hf.config._attn_implementation = "sdpa"
        hf_run = torch.compile(hf) if args.compile else hf
        hf_loss = lambda a, b: F.cross_entropy(hf_run(input_ids=a).logits.float().flatten(0, 1), b.view(-1))
        contenders["HF λ=0"] = train_step_fn(hf_loss, list(hf.parameters()))
        plain = torch.compile(base_model) if args.compile else base_model     # forward + backward, no optimiser

        def fwd_bwd(loss_fn):
            def run():
                with autocast:
                    loss = loss_fn(x, y)
                loss.backward()
            return run
        fb = race({"ours": fwd_bwd(lambda a, b: plain(a, b).loss), "HF": fwd_bwd(hf_loss)},
                  device, args.warmup, args.repeats)
        print(f"forward+backward   ours {1e3 * fb['ours']:8.1f} ms   HF {1e3 * fb['HF']:8.1f} ms   "
              f"speed ratio ours/HF = {fb['HF'] / fb['ours']:.3f}x")
    t = race(contenders, device, args.warmup, args.repeats)
    product, peak = peak_flops(device)
    flops = base_model.flops_per_token(args.seq_len) * x.numel()
    for name, sec in t.items():
        mfu = f"   MFU {100 * flops / sec / peak:5.1f}%" if peak else ""
        print(f"train step {name:9s} {1e3 * sec:8.1f} ms   {x.numel() / sec:10.0f} tok/s{mfu}")
    print(f"JREG overhead (λ=1 vs λ=0 step time): {100 * (t['ours λ=1'] / t['ours λ=0'] - 1):+.1f}%")
    RESULTS.update(step_ms={k: 1e3 * v for k, v in t.items()}, jreg_overhead=t["ours λ=1"] / t["ours λ=0"] - 1)
    if hf is not None:
        RESULTS.update(fwd_bwd_ms={k: 1e3 * v for k, v in fb.items()})
    if "HF λ=0" in t:
        print(f"training step speed ours/HF: {t['HF λ=0'] / t['ours λ=0']:.3f}x")
    if device.type == "cuda":
        print(f"device {torch.cuda.get_device_name(device)}; peak bf16 "
              + (f"{peak / 1e12:g} TFLOP/s (of {product})" if peak else
                 f"unknown (products: {', '.join(p for _, p, _ in PEAK_FLOPS)})")
              + f"; max memory {torch.cuda.max_memory_allocated() / 1e9:.1f} GB")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    RESULTS.clear()
    run_bench(args)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        json.dump({"command": "python -m scripts.bench " + " ".join(argv), "machine": machine(),
                   "git_commit": git("rev-parse", "--short", "HEAD"), "date": datetime.date.today().isoformat(),
                   "results": RESULTS}, open(args.json, "w"), indent=1, ensure_ascii=False)
        print(f"wrote {args.json}")


def run_bench(args):
    if args.threads:
        torch.set_num_threads(args.threads)
    global CLOCK
    CLOCK = time.process_time if args.cpu_time else time.perf_counter
    if args.memory:
        return memory_table(args)
    device = torch.device(check_device(args.device))
    if args.steps:
        return bench_steps(args, device, torch.autocast(device.type, dtype=torch.bfloat16) if args.dtype == "bfloat16"
                           else nullcontext())
    torch.backends.cuda.matmul.allow_tf32 = True
    mcfg = PRESETS[args.preset]
    mcfg = dataclasses.replace(mcfg, max_seq_len=max(mcfg.max_seq_len, args.seq_len),
                               **({"vocab_size": args.vocab_size} if args.vocab_size else {}))
    torch.manual_seed(0)
    if args.generate:
        return bench_generation(Llama(mcfg).to(device).eval(), device, args)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if args.dtype == "bfloat16" else nullcontext()
    x, y = (torch.randint(0, mcfg.vocab_size, (args.micro_batch, args.seq_len), device=device) for _ in "xy")
    if args.memory_probe:
        return bench_memory(mcfg, device, args, autocast, x, y)
    if args.loss_chunks:
        return bench_loss_chunks(mcfg, device, args, autocast, y)
    if args.against:
        return bench_against(mcfg, device, args, autocast, x, y)
    bench_training(mcfg, device, args, autocast, x, y)


if __name__ == "__main__":
    main()
