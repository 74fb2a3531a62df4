"""
Speed, measured side by side in one run (ratios, not absolute claims). Random tokens, no data needed.

    python bench.py                                   # CPU: small config, fp32, eager
    python bench.py --preset 170m --device cuda --compile --dtype bfloat16 --micro_batch 16 --seq_len 2048
                                                      # the GPU check: tok/s and MFU, λ = 0 vs λ = 1
    python bench.py --generate --micro_batch 1 --prompt_len 128   # generation: KV cache vs recomputation

It times, interleaving the contenders so that machine noise hits all of them alike (median of --repeats):
  1. forward + backward: our Llama vs transformers' LlamaForCausalLM with the same weights (skipped without
     transformers or with --no_hf);
  2. a full training step (forward, backward, clip, AdamW) through train.py's JregObjective, λ = 0 vs λ = 1,
     and our training step vs the same step on the Hugging Face model.
"""
import argparse
import dataclasses
import statistics
import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from config import Config
from generation import generate, generate_uncached
from jreg import JregObjective
from model import Llama, PRESETS
from runs import PEAK_FLOPS, check_device, peak_flops


def timed(fn, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def measured_peak(fn):
    """Peak CPU bytes allocated by fn() beyond what was allocated before it: the running sum of every allocation and
    free torch.profiler records (profile_memory=True), in time order. Exact tensor bytes, free of the allocator's
    caching and of RSS noise; a GPU's caching allocator adds its own rounding and fragmentation."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]" and e.device_type().name == "CPU")
    total = peak = 0
    for _, nbytes in events:
        total += nbytes
        peak = max(peak, total)
    return peak


def estimate(mcfg, micro_batch, seq_len, mode="autocast", checkpointing=False, loss_chunk=1024, jreg=True,
             world=1, fsdp=False, grad_accum=1):
    """Predicted peak bytes per process of one eager training step, by part. mode: fp32 | autocast (fp32 weights,
    bf16 matmuls: DDP) | bf16 (bf16 weights and residual stream: FSDP's param_dtype, fp32 master shards).
    loss_chunk 0: the full-logits loss. The activations are what autograd saves, at whichever moment holds the most:
    the end of the forward pass, the start of the backward pass, or (checkpointing) a block's recomputation;
    test_memory.py checks them against torch.profiler's peaks on CPU."""
    L, d, f, V, n = mcfg.n_layer, mcfg.d_model, mcfg.ffn_hidden, mcfg.vocab_size, micro_batch * seq_len
    kv = mcfg.n_kv_head * mcfg.head_dim
    p_block = 2 * d + 2 * d * d + 2 * d * kv + 3 * d * f
    p_top = V * d * (1 if mcfg.tie_embeddings else 2) + d
    P = L * p_block + p_top
    r, c = (2, 2) if mode == "bf16" else (4, 4) if mode == "fp32" else (4, 2)      # residual, matmul bytes
    # saved per token by a block: two RMSNorms (fp32 input, normalized, what the linears keep of the output: fp32 or
    # bf16 once, or bf16 once per linear under autocast), rotated q and k, v, attention output; gate, silu, up, product
    block = 2 * (4 + r) * d + {"fp32": 8, "autocast": 10, "bf16": 4}[mode] * d + c * (2 * d + 2 * kv) + 4 * c * f
    top = (4 + r) * d + (4 if mode == "fp32" or loss_chunk else c) * d          # the final norm, its output for the head
    kept = L * (r * d if checkpointing else block)   # checkpointing keeps each block's input only
    streams = (L + 1) * r * d if jreg else 0        # the penalty's gradients of h_0..h_L, waiting for their block
    fp32_streams = (L + 1) * 4 * d if jreg and r == 2 else 0    # the penalty's fp32 copies of bf16 streams
    rows = min(loss_chunk, n) if loss_chunk else n
    head_grads = 2 * (2 if mode == "bf16" else 4) * V * d if loss_chunk else 0   # the head's gradient, summed over chunks
    copies = 2 * (L * p_block + V * d) if mode == "autocast" else 0               # autocast's bf16 weights (cached)
    saved_copies = 2 * (L * p_block * (not checkpointing) + V * d * (not loss_chunk)) if mode == "autocast" else 0
    phases = {  # (activations, logits)
        "forward": (n * (kept + top + fp32_streams) + copies, 8 * rows * V),
        "backward": (n * (kept + top + streams) + saved_copies, 12 * rows * V + head_grads)}
    if checkpointing:                                 # one block recomputed, its gradients in flight
        phases["recompute"] = (n * (kept + streams + block + 2 * c * f) + 2 * p_block * (mode == "autocast"), 0)
    activations, logits = max(phases.values(), key=sum)
    shard = world if fsdp else 1
    weights = 4 * P / shard + (2 * (p_top + 2 * p_block) if fsdp else 0)  # FSDP: bf16 root and two blocks all-gathered
    parts = dict(weights=weights, gradients=4 * P / shard, optimizer=8 * P / shard,   # AdamW: two fp32 moments
                 # DDP: its fp32 gradient buckets; FSDP accumulating micro-batches: the unsharded fp32 gradients
                 buffers=4 * P if not fsdp or grad_accum > 1 else 0, activations=activations, logits=logits)
    return {**parts, "total": sum(parts.values())}


def race(contenders, device, warmup, repeats):
    """Median seconds per call of each contender, interleaved."""
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            times[name].append(timed(fn, device))
    return {name: statistics.median(t) for name, t in times.items()}


def bench_generation(model, args):
    """--generate: greedy generation of --max_new_tokens tokens after --prompt_len random tokens, --micro_batch rows:
    cached vs uncached (Llama.forward over the whole growing sequence), interleaved, median of --repeats."""
    cfg, device = model.config, torch.device(args.device)
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


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="small", choices=sorted(PRESETS))
    p.add_argument("--vocab_size", type=int, default=None, help="override the preset's vocabulary")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="autocast dtype")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--micro_batch", type=int, default=4)
    p.add_argument("--seq_len", type=int, default=256)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--no_hf", action="store_true", help="skip the transformers comparison")
    p.add_argument("--generate", action="store_true", help="generation instead: KV cache vs recomputation")
    p.add_argument("--prompt_len", type=int, default=128, help="--generate: prompt tokens")
    p.add_argument("--max_new_tokens", type=int, default=64, help="--generate: new tokens per row")
    args = p.parse_args(argv)
    for name, low in (("micro_batch", 1), ("seq_len", 1), ("repeats", 1), ("warmup", 0), ("vocab_size", 1),
                      ("prompt_len", 1), ("max_new_tokens", 1)):
        if getattr(args, name) is not None and getattr(args, name) < low:
            raise SystemExit(f"error: --{name} must be at least {low}, got {getattr(args, name)}")
    return args


def bench_training(mcfg, device, args):
    """Forward + backward ours vs Hugging Face, and full training steps λ = 0 vs λ = 1 (vs HF), interleaved."""
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if args.dtype == "bfloat16" else nullcontext()
    x = torch.randint(0, mcfg.vocab_size, (args.micro_batch, args.seq_len), device=device)
    y = torch.randint(0, mcfg.vocab_size, (args.micro_batch, args.seq_len), device=device)
    tokens = x.numel()

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
        obj = JregObjective(model, Config(jreg_lambda=lam, jreg_alpha=1.0)).to(device)
        run = torch.compile(obj) if args.compile else obj
        def loss(a, b):
            ce, penalty, _ = run(a, b)
            return ce + lam * penalty                                   # as train.py's loop, one micro-batch
        return model, loss

    print(f"{args.preset}: {mcfg.n_layer} layers, d={mcfg.d_model}, vocab {mcfg.vocab_size} | batch "
          f"{args.micro_batch}x{args.seq_len} | {device} {args.dtype} | compile={args.compile} | torch {torch.__version__}")

    # 1 + 2: training steps
    base_model, base_loss = objective(0.0)
    jreg_model, jreg_loss = objective(1.0)
    contenders = {"ours λ=0": train_step_fn(base_loss, list(base_model.parameters())),
                  "ours λ=1": train_step_fn(jreg_loss, list(jreg_model.parameters()))}
    hf = None
    if not args.no_hf:
        try:
            hf = base_model.to_hf().to(device)
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
    peak = peak_flops(device)
    flops = base_model.flops_per_token(args.seq_len) * tokens
    for name, sec in t.items():
        mfu = f"   MFU {100 * flops / sec / peak:5.1f}%" if peak else ""
        print(f"train step {name:9s} {1e3 * sec:8.1f} ms   {tokens / sec:10.0f} tok/s{mfu}")
    print(f"JREG overhead (λ=1 vs λ=0 step time): {100 * (t['ours λ=1'] / t['ours λ=0'] - 1):+.1f}%")
    if "HF λ=0" in t:
        print(f"training step speed ours/HF: {t['HF λ=0'] / t['ours λ=0']:.3f}x")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        print(f"device {name}; peak bf16 {peak / 1e12 if peak else 'unknown'} TFLOP/s "
              f"(table: {', '.join(k for k, _ in PEAK_FLOPS)}); max memory {torch.cuda.max_memory_allocated() / 1e9:.1f} GB")


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(check_device(args.device))
    torch.backends.cuda.matmul.allow_tf32 = True
    mcfg = PRESETS[args.preset]
    mcfg = dataclasses.replace(mcfg, max_seq_len=max(mcfg.max_seq_len, args.seq_len),
                               **({"vocab_size": args.vocab_size} if args.vocab_size else {}))
    torch.manual_seed(0)
    if args.generate:
        return bench_generation(Llama(mcfg).to(device).eval(), args)
    bench_training(mcfg, device, args)


if __name__ == "__main__":
    main()
