"""
The speed and memory figures docs/speed.md, training.md and data.md quote, from results/speed/*.json (written by
`python -m scripts.bench ... --json` and results/speed/tokenize_bench.py; all remade by results/speed/measure.sh).
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def speed(name):
    return json.load(open(os.path.join(ROOT, "results", "speed", f"{name}.json")))


def machine_line(*records):
    ms = {(r["machine"]["cpu"], r["machine"]["gpu"], r["machine"]["threads"], r["machine"]["torch"]) for r in records}
    return "; ".join(f"{gpu or cpu}, {threads} thread{'s' * (threads > 1)}, torch {torch}"
                     for cpu, gpu, threads, torch in sorted(ms, key=str))


def speed_training():
    rows = {"train_vocab50304": "vocab 50,304, batch 4 × 256, eager", "train_vocab512": "vocab 512, batch 8 × 256, eager",
            "train_vocab512_compile": "vocab 512, batch 8 × 256, `--compile`"}
    records = [speed(n) for n in rows]
    lines = ["| setting | fwd+bwd ours / HF | train step ours / HF | JREG overhead (λ=1 vs λ=0 step) | command |",
             "|---|---|---|---|---|"]
    for (n, label), rec in zip(rows.items(), records):
        r = rec["results"]
        fb, st = r["fwd_bwd_ms"], r["step_ms"]
        lines.append(f"| {label} | {fb['HF'] / fb['ours']:.2f}× ({fb['ours']:.0f} vs {fb['HF']:.0f} ms) | "
                     f"{st['HF λ=0'] / st['ours λ=0']:.2f}× ({st['ours λ=0']:.0f} vs {st['HF λ=0']:.0f} ms) | "
                     f"{100 * r['jreg_overhead']:+.1f}% | `{rec['command']}` |")
    return "\n".join(lines) + f"\n\nMeasured on {machine_line(*records)} (`results/speed/train_*.json`)."


def speed_generation():
    records = [speed(f"generate_batch{b}") for b in (1, 8)]
    lines = ["| batch | cached | uncached | speed-up | same tokens |", "|---|---|---|---|---|"]
    for rec in records:
        r = rec["results"]
        lines.append(f"| {r['batch']} | {r['cached_tok_per_s']:.1f} tok/s | {r['uncached_tok_per_s']:.1f} tok/s | "
                     f"{r['cached_tok_per_s'] / r['uncached_tok_per_s']:.1f}× | {r['same_tokens']} |")
    return "\n".join(lines) + (f"\n\nMeasured on {machine_line(*records)}: `{records[0]['command']}` "
                               f"(`results/speed/generate_batch*.json`).")


def speed_against():
    rec = speed("against_b6b6601")
    r = rec["results"]
    return (f"Measured against `{r['against']}` (the code before the loss went through `lm_head`): training forward + "
            f"backward {r['ms']['now']:.0f} ms now vs {r['ms']['then']:.0f} ms then, speed now / then = "
            f"{r['speed_ratio']:.3f}×, the same loss bit for bit: {r['same_loss']} (`{rec['command']}`, "
            f"{machine_line(rec)}; `results/speed/against_b6b6601.json`)." + against_hand_gradient())


def against_hand_gradient():
    """The loss differentiated by autograd (today) against the hand-written softmax − one-hot gradient (48cd52c)."""
    recs = [speed(name) for name in ("against_48cd52c", "against_48cd52c_1thread")]
    ratios = [r["results"]["speed_ratio"] for r in recs]
    runs = "; ".join(f"{r['machine']['threads']} thread{'s' if r['machine']['threads'] > 1 else ''}: "
                     f"{r['results']['ms']['now']:.0f} vs {r['results']['ms']['then']:.0f} ms, "
                     f"{r['results']['speed_ratio']:.3f}× (`{r['command']}`)" for r in recs)
    return (f"\n\nMeasured against `48cd52c` (the loss's gradient written by hand, softmax − one-hot, where today "
            f"autograd differentiates `chunk_loss`): {runs}; {recs[0]['machine']['cpu']}, torch "
            f"{recs[0]['machine']['torch']}. Autograd's cross-entropy makes this small model's training "
            f"step {(1 - max(ratios)) * 100:.0f}–{(1 - min(ratios)) * 100:.0f}% slower (its loss is a large share of "
            f"the step): the price of a loss that an edit reaches, gradient included (docs/ablations.md, edit 4).")


def memory_probe():
    """Measured peaks (torch.profiler's tensor bytes) beside the estimate, on CPU: fp32 and bf16 autocast, chunks of
    128 positions; and the bytes per logit of the loss at a 32,768 vocabulary."""
    fp32, bf16, big = speed("memory_probe"), speed("memory_probe_bf16"), speed("memory_probe_v32768")
    r, rb = fp32["results"], bf16["results"]
    ratio = ", ".join(f"{r['estimate_mb'][k] / r['peak_mb'][k]:.3f}" for k in r["peak_mb"])
    bpl = big["results"]["bytes_per_logit"]
    return (f"With `{fp32['command']}` (small preset, fp32, eager) the estimate is {ratio} of the measured peak (full "
            f"logits, chunked, chunked + checkpointing); the loss takes {r['bytes_per_logit']['full']:.1f} bytes per "
            f"logit with the full fp32 logits and {r['bytes_per_logit']['chunked']:.1f} chunked ({r['loss_chunk']} "
            f"positions a chunk); checkpointing the blocks took a step's peak from {r['peak_mb']['chunked loss']:.1f} "
            f"to {r['peak_mb']['chunked + checkpointing']:.1f} MB in fp32 and from {rb['peak_mb']['chunked loss']:.1f} "
            f"to {rb['peak_mb']['chunked + checkpointing']:.1f} MB under bf16 autocast, and took "
            f"{r['step_ms']['chunked + checkpointing'] / r['step_ms']['chunked loss']:.2f}× the step time in fp32. At "
            f"a 32,768 vocabulary (`{big['command']}`) the loss takes {bpl['full']:.2f} bytes per logit full and "
            f"{bpl['chunked']:.2f} chunked. Measured on {machine_line(fp32, bf16, big)} "
            f"(`results/speed/memory_probe*.json`).")


def memory_table():
    """bench.py --memory's predictions: the configs as they run, then eager, then eager with checkpointing."""
    records = [speed(n) for n in ("memory_8gpu", "memory_8gpu_eager", "memory_8gpu_ckpt")]
    cols = ("weights", "gradients", "optimizer", "buffers", "activations", "logits", "total")
    lines = ["| config | mode | micro × accum | " + " | ".join(cols) + " | margin |", "|---" * (len(cols) + 4) + "|"]
    for rec in records:
        for path, r in rec["results"]["configs"].items():
            name = os.path.basename(path).removesuffix(".py")
            lines.append(f"| {name} | {r['mode']} | {r['micro_batch']} × {r['grad_accum']} | "
                         + " | ".join(f"{r[c]:.2f}" for c in cols) + f" | {100 * r['margin']:.0f}% |")
    return "\n".join(lines) + "\n\n" + "; ".join(f"`{rec['command']}`" for rec in records) + \
        " (`results/speed/memory_8gpu*.json`)."

def tokenize_speed():
    """prepare_fineweb.py's pipeline against the bare tokenizer (results/speed/tokenize_*.json)."""
    names = ("tokenize_kjv_verses", "tokenize_kjv_chapters", "tokenize_kjv_smollm2")
    records = [speed(n) for n in names]
    lines = ["| documents | tokenizer | tokens | bare, tokens/s | pipeline, tokens/s | pipeline / bare |", "|---" * 6 + "|"]
    for rec in records:
        r = rec["results"]
        tok = "SmolLM2's (a GGUF file)" if rec["tokenizer"].startswith("hf:") else rec["tokenizer"]
        lines.append(f"| {rec['documents']} | {tok} | {r['tokens']:,} | {r['bare_tokens_per_s'] / 1e6:.2f}M | "
                     f"{r['pipeline_tokens_per_s'] / 1e6:.2f}M | {r['ratio']:.2f}× |")
    return "\n".join(lines) + (f"\n\nBest of {records[0]['results']['rounds']}, on {machine_line(*records)} "
                               f"(`results/speed/tokenize_*.json`, made by "
                               f"`results/speed/tokenize_bench.py`).")


MFU, PEAK, GPUS, TOKENS = 0.35, 989e12, 8, 104.9e9      # the estimate's assumptions (H100 SXM, dense bf16)
SIZES = {"170m": "170M", "1b": "1B", "3.4b": "3.4B"}      # the configs' names as the paper writes the sizes


def full_scale_hours(mfu=MFU, peak=PEAK, gpus=GPUS, tokens=TOKENS):
    """{config name: (its record in memory_8gpu.json, tokens/s on one node, hours for the paper's tokens)}, the
    baselines' configs (a JREG config has the same shape)."""
    configs = speed("memory_8gpu")["results"]["configs"]
    out = {}
    for path, r in configs.items():
        if "jreg" not in path:
            rate = mfu * peak * gpus / r["flops_per_token"]
            out[os.path.basename(path).removesuffix(".py")] = (r, rate, tokens / rate / 3600)
    return out


def readme_estimate(mfu=MFU):
    """The README's line on the full-scale runs' time, from the same estimate as docs/speed.md's table."""
    hours = full_scale_hours(mfu)
    return (f"the throughput at these sizes is estimated ("
            + ", ".join(f"{SIZES.get(name, name)} ≈ {h:.0f} h" for name, (_, _, h) in hours.items())
            + f" on one node of {GPUS} × H100 at {100 * mfu:.0f}% MFU)")


def param_counts():
    """The parameter counts of the paper's shapes, as bench.py --memory recorded them (memory_8gpu.json)."""
    return ("The parameter counts these shapes give (untied, GPT-2 vocabulary): "
            + ", ".join(f"{r['params']:,} ({SIZES.get(name, name)})" for name, (r, _, _) in full_scale_hours().items())
            + ".")


def full_scale_estimate(mfu=MFU, peak=PEAK, gpus=GPUS, tokens=TOKENS):
    """Not a measurement: each config's FLOPs per token (Llama.flops_per_token, in memory_8gpu.json) at an assumed MFU
    on 8 × H100 SXM (989 TFLOP/s dense bf16 each), and the time for the paper's 104.9B tokens."""
    lines = ["| size | parameters | GFLOP / token | tokens/s per 8 × H100 (est.) | 104.9B tokens on 1 node (est.) |",
             "|---|---|---|---|---|"]
    for name, (r, rate, hours) in full_scale_hours(mfu, peak, gpus, tokens).items():
        n = r["params"]
        size = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"
        lines.append(f"| {name} | {size} | {r['flops_per_token'] / 1e9:.2f} | "
                     f"{rate / 1e6:.2f}M | {hours:.0f} h (4 nodes: {hours / 4:.0f} h) |")
    return "\n".join(lines) + f"\n\nAssumed: {100 * mfu:.0f}% MFU, {peak / 1e12:.0f} TFLOP/s per GPU, {gpus} GPUs a node."


def loss_chunks():
    """The loss alone at the 170M width at two chunk sizes (bench.py --loss_chunks), on CPU."""
    rec = speed("loss_chunks_170m")
    table = rec["results"]["loss_chunks"]
    (small, a), (large, b) = sorted(table.items(), key=lambda kv: int(kv[0]))
    return (f"At the 170M width (d 768, vocab 50,304, 4 × 2048 positions, fp32, eager) the loss alone, forward + "
            f"backward, took {a['ms'] / 1e3:.1f} s in {a['chunks']} chunks of {small} and {b['ms'] / 1e3:.1f} s in "
            f"{b['chunks']} of {large} ({a['ms'] / b['ms']:.2f}× the speed), {a['bytes_per_logit']:.2f} and "
            f"{b['bytes_per_logit']:.2f} bytes per logit of the micro-batch; the head-gradient traffic (each chunk "
            f"writes, reads and adds an fp32 gradient of the head) is {a['head_grad_traffic_gb']:.2f} and "
            f"{b['head_grad_traffic_gb']:.2f} GB. On this CPU the larger chunk is the slower and the larger; on a GPU, "
            f"where that traffic is the cost, it is not measured yet (scripts/gpu_check.sh step 6 measures it). "
            f"`{rec['command']}`, {machine_line(rec)} (`results/speed/loss_chunks_170m.json`).")


def config_values(path, *keys):
    """The values a config file sets for keys, as train.py reads them (config.read_config_file)."""
    sys.path.insert(0, ROOT)
    from config import read_config_file
    settings = read_config_file(os.path.join(ROOT, path))
    return [settings[k] for k in keys]


def retrofit_full_scale(mfus=(0.40, 0.30)):
    """The full-scale retrofit's predicted memory (bench.py --memory, results/speed/memory_retrofit_1.7b*.json) and its
    time at assumed MFUs on 8 H100 (not measured)."""
    compiled = speed("memory_retrofit_1.7b")
    eager = speed("memory_retrofit_1.7b_eager")
    configs = compiled["results"]["configs"]
    base, jreg = (configs[f"configs/retrofit_smollm2_1.7b{s}.py"] for s in ("", "_jreg"))
    (e,) = eager["results"]["configs"].values()
    steps, batch = config_values("configs/retrofit_smollm2_1.7b.py", "max_steps", "batch_tokens")
    hours = [steps * batch * base["flops_per_token"] / (m * PEAK * GPUS) / 3600 for m in mfus]
    fpt = f"{base['flops_per_token']:.3g}".replace("e+", "e")
    jreg_text = ("with or without JREG" if round(jreg["total"], 1) == round(base["total"], 1) else
                 f"{jreg['total']:.1f} GiB with JREG")
    return (f"Predicted peak per GPU on {GPUS} GPUs (`bench.py --memory`, `results/speed/memory_retrofit_1.7b*.json`): "
            f"{base['total']:.1f} GiB of an 80 GB GPU compiled, {jreg_text}, {e['total']:.1f} GiB with JREG eager "
            f"({100 * e['margin']:.0f}% margin). Time: {fpt} training FLOPs per token "
            f"(`Llama.flops_per_token`) × {steps * batch / 1e9:.1f}B tokens, so "
            + ", ".join(f"{h:.1f} h at an assumed {100 * m:.0f}% MFU" for h, m in zip(hours, mfus))
            + f" on {GPUS} H100 (not measured: no GPU run yet)")


def full_scale_assumptions(mfu=MFU, peak=PEAK, gpus=GPUS):
    """docs/speed.md's statement of what the full-scale estimate assumes (the constants above)."""
    return f"the tokens/s assume {100 * mfu:.0f}% MFU on {gpus} × H100 SXM ({peak / 1e12:.0f} TFLOP/s dense bf16 each)"


def gradient_copy():
    """docs/training.md's fp32 gradient copy that gradient_as_bucket_view saves, at 170M (4 bytes a parameter)."""
    return f"{4 * full_scale_hours()['170m'][0]['params'] / 1e9:.2f} GB at 170M"


def checkpoint_bytes(size="3.4b"):
    """Not a measurement: a checkpoint's bytes at a paper's size, its fp32 weights and AdamW's two fp32 moments (12
    bytes a parameter; the parameter count as bench.py --memory recorded it in memory_8gpu.json)."""
    return 12 * full_scale_hours()[size][0]["params"]


def about(n):
    """n bytes in GB to two significant digits, as an estimate is written."""
    return f"~{float(f'{n:.2g}') / 1e9:.0f} GB"


def checkpoint_size():
    """docs/training.md's size of a 3.4B checkpoint."""
    return f"a 3.4B checkpoint is {about(checkpoint_bytes())} (fp32 weights and AdamW's two moments, 12 bytes a parameter)"


def checkpoints_kept():
    """docs/training.md's bytes of the checkpoints configs/3.4b.py keeps for good (every keep_every-th step)."""
    steps, every = config_values("configs/3.4b.py", "max_steps", "keep_every")
    return f"at 3.4B that is {about(steps // every * checkpoint_bytes())}"


BLOCKS = {"loss-chunks": loss_chunks, "speed-training": speed_training, "speed-generation": speed_generation, "speed-against": speed_against,
          "memory-probe": memory_probe, "memory-table": memory_table, "full-scale-estimate": full_scale_estimate,
          "tokenize-speed": tokenize_speed, "readme-estimate": readme_estimate, "param-counts": param_counts,
          "retrofit-full-scale": retrofit_full_scale, "full-scale-assumptions": full_scale_assumptions,
          "ckpt-size": checkpoint_size, "ckpt-kept": checkpoints_kept, "gradient-copy": gradient_copy}
