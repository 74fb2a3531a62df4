"""
Zero-shot tasks scored exactly as lm-evaluation-harness scores them (also read out at every layer: early exit), and
layer profiles (Ψ, ζ, logit lens, skipped blocks), for our checkpoints and for any Hugging Face causal LM. Options,
output schema, numbers: docs/evaluation.md. A user error (bad option, missing file, unreadable checkpoint) is one
`error:` line and exit status 1.

    python evaluate.py out/base                                       # the paper's nine tasks, latest checkpoint
    python evaluate.py out/base out/jreg --limit 500 --out cmp.json   # one table, a column per model, Δ = 2nd − 1st
    python evaluate.py --hf gpt2 --tasks lambada_openai,hellaswag --log_samples --out gpt2.json
    python evaluate.py --hf DIR --gguf model.gguf --data_dir tasks_offline --limit 200 \
        --tasks lambada_openai,boolq,arc_easy,hellaswag,piqa,social_iqa,sciq   # offline_tasks.py builds tasks_offline
    python evaluate.py out/base out/jreg --profile --plot plots/      # Ψ profiles on the runs' validation windows
    python evaluate.py out/base --profile --all_ckpts --plot plots/   # ζ_L over training
    python evaluate.py out/base out/jreg --tasks piqa,sciq --exit_layers all --plot plots/   # early exit at every layer
    python evaluate.py out/sft_base --profile                         # a fine-tuning run: its val conversations
"""
import argparse
import importlib.util
import json
import os
import sys

import numpy as np
import torch

from data import PackedStream, is_conversations, val_windows
from files import write_atomic
from lib.profiles import (
    _zeta_l, blocks_and_norm, context_windows, plot_profiles, profile_model, profile_target, report_figures,
    shards_tokenizer, text_documents, text_windows)
from lib.hf import check_hf_source, load_hf
from lib.commands import check_device, check_writable, checkpoint_path, int_at_least, load_run, max_length_of
from checkpoint import list_checkpoints, load_checkpoint
from lib.tasks import HFModelLM, ModelLM, PAPER_TASKS, TASKS, evaluate_tasks, load_task, parse_tasks


# ==========================================================================================================
# Reports: markdown tables and plots

METRIC_ORDER = ("acc", "acc_norm", "perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte")
RATES = ("chance", "majority")     # a task's baselines beside its accuracy (tasks.class_rates): the documents', not a model's


def _num(v, fmt):
    """v in `fmt`, or in 3 significant digits from 1e5 up: a tiny model's LAMBADA perplexity reads 1.88e+08, not
    188251185.23 (the JSON keeps every digit)."""
    return format(v, ("+" if fmt.startswith("+") else "") + ".2e") if abs(v) >= 1e5 else format(v, fmt)


def _fmt(result, m):
    v, se = result.get(m), result.get(m + "_stderr")
    if v is None:
        return "–"
    if se is not None:
        return f"{_num(v, '.4f')} ± {_num(se, '.4f')}"
    return _num(v, ".2f" if m in ("perplexity", "word_perplexity") else ".4f")


def results_table(models):
    """models: {name: evaluate_tasks output}. One model: a row per task; several: a column per model and Δ. Each
    task's chance and majority rates (of the documents scored) stand beside its accuracy: columns, or rows."""
    names = list(models)
    tasks = [t for t in TASKS if any(t in models[n]["results"] for n in names)]
    if len(names) == 1:
        lines = ["| task | split | n | acc | acc_norm | perplexity | chance | majority |", "|---" * 8 + "|"]
        for t, r in ((t, models[names[0]]["results"][t]) for t in tasks):
            ppl = (f"word {_num(r['word_perplexity'], '.2f')}, byte {_num(r['byte_perplexity'], '.4f')}, "
                   f"bpb {r['bits_per_byte']:.4f}"
                   if "word_perplexity" in r else _fmt(r, "perplexity"))
            lines.append(f"| {t} | {r['split']} | {r['n']} | {_fmt(r, 'acc')} | {_fmt(r, 'acc_norm')} | {ppl} | "
                         + " | ".join(_fmt(r, m) for m in RATES) + " |")
        avg = models[names[0]]["average"]
        if avg["acc"] is not None:
            norm = f"{avg['acc_norm']:.4f} ({avg['n_tasks_acc_norm']} tasks)" if avg["acc_norm"] is not None else "–"
            lines.append(f"| **average** (acc, {avg['n_tasks']} tasks) | | | {avg['acc']:.4f} | {norm} | | "
                         + " | ".join(_fmt(avg, m) for m in RATES) + " |")
        return "\n".join(lines)
    lines = ["| task | metric | " + " | ".join(names) + f" | Δ ({names[1]} − {names[0]}) |",
             "|---|---|" + "---|" * (len(names) + 1)]
    for t, m in ((t, m) for t in tasks for m in METRIC_ORDER + RATES):
        res = [models[n]["results"].get(t, {}) for n in names]
        if any(r.get(m) is not None for r in res):
            vals = [r.get(m) for r in res]
            delta = _num(vals[1] - vals[0], "+.4f") if None not in vals[:2] and m not in RATES else "–"
            lines.append(f"| {t} | {m} | " + " | ".join(_fmt(r, m) for r in res) + f" | {delta} |")
    for m, count in (("acc", "n_tasks"), ("acc_norm", "n_tasks_acc_norm")):     # the paper's average, and acc_norm's
        avgs, n = [models[name]["average"][m] for name in names], models[names[0]]["average"][count]
        if None not in avgs:
            lines.append(f"| **average** ({n} task{'s' * (n > 1)}) | {m} | " + " | ".join(f"{a:.4f}" for a in avgs)
                         + f" | {avgs[1] - avgs[0]:+.4f} |")
    for m in RATES:                                       # over the tasks of the acc average
        avgs, n = [models[name]["average"].get(m) for name in names], models[names[0]]["average"]["n_tasks"]
        if None not in avgs:
            lines.append(f"| **average** ({n} task{'s' * (n > 1)}) | {m} | " + " | ".join(f"{a:.4f}" for a in avgs)
                         + " | – |")
    return "\n".join(lines)


def early_exit_table(name, entry):
    """A row per exit layer: acc / acc_norm of each task read out at that layer (a task without acc, wikitext: its
    word perplexity), and the averages over the tasks with acc; then chance and the majority-class rate."""
    tasks, chance = list(entry["results"]), entry["chance"]
    num = lambda v: "–" if v is None else f"{v:.3f}"                                      # noqa: E731
    ppl = [t for t, r in entry["results"].items() if "acc" not in r]
    lines = [f"**{name}**: early exit, h_l read through the final norm and the LM head (acc / acc_norm"
             + "".join(f"; {t}: word perplexity" for t in ppl) + ")", "",
             "| exit layer | " + " | ".join(tasks) + " | average acc | average acc_norm |",
             "|---" * (len(tasks) + 3) + "|"]
    for row in entry["early_exit"]:
        cells = [" / ".join(num(r[m]) for m in ("acc", "acc_norm") if m in r) if "acc" in r else
                 _num(r["word_perplexity"], ".2f") for r in row["results"].values()]
        lines.append(f"| {row['layer']} | " + " | ".join(cells) + f" | {num(row['average']['acc'])} | "
                     f"{num(row['average']['acc_norm'])} |")
    majority = {t: r["majority"] for t, r in entry["results"].items() if r.get("majority") is not None}
    return "\n".join(lines + [f"| {m} | " + " | ".join(num(rates.get(t)) for t in tasks)
                               + f" | {num(np.mean(list(rates.values())) if rates else None)} | |"
                               for m, rates in (("chance", chance), ("majority", majority))])


def _layer(values, l, first=1, fmt=".2f"):
    """The value of layer l in a list that starts at layer `first`, or "–" (ζ starts at layer 2; a short model)."""
    return format(values[l - first], fmt) if first <= l < first + len(values) else "–"


def profile_table(profiles):
    """A row of headline numbers per model, then per model a row per layer: Ψ (raw, normed h_L, without position 0)
    and, where analysed, the logit-lens loss and the loss increase when the block is skipped."""
    lines = ["| model | layers | tokens | loss | Ψ_L | Ψ_(L-1) | ζ_L | ζ_(L-2) | ζ_L normed | window |",
             "|---" * 10 + "|"]
    for name, p in profiles.items():
        L, psi, zeta = p["n_layer"], p["psi"], p["zeta"]
        lines.append(f"| {name} | {L} | {p['n_tokens']} | {p['loss']:.4f} | {_layer(psi, L, fmt='.4f')} | "
                     f"{_layer(psi, L - 1, fmt='.4f')} | {_layer(zeta, L, 2)} | {_layer(zeta, L - 2, 2)} | "
                     f"{_layer(p['zeta_normed'], L, 2)} | {p.get('seq_len', '–')} |")
    for name, p in profiles.items():
        lines += ["", f"**{name}**" + (f": logit lens and skipped blocks on the first {p['analysis_tokens']} tokens "
                                       f"(loss there {p['analysis_loss']:.4f})" if "analysis_tokens" in p else ""), "",
                  "| layer | Ψ raw | Ψ normed | Ψ raw, skip first | logit-lens loss | skip-block Δloss |",
                  "|---" * 6 + "|"]
        columns = [(p["psi"], 1, ".4f"), (p["psi_normed"], 1, ".4f"), (p.get("psi_skip_first", []), 1, ".4f"),
                   (p.get("logit_lens_loss", []), 0, ".3f"), (p.get("skip_block_loss_increase", []), 1, "+.4f")]
        for l in range(0 if p.get("logit_lens_loss") else 1, p["n_layer"] + 1):   # the logit lens reads h_0 too
            lines.append(f"| {l} | " + " | ".join(_layer(v, l, first, fmt) for v, first, fmt in columns) + " |")
    return "\n".join(lines) + "\n"


# ==========================================================================================================
# Command line: every option checked, and the outputs proven writable, before any model is loaded


def _exit_layers(text):
    layers = text if text == "all" else sorted({int(t) if t.strip().isdigit() else -1 for t in text.split(",")})
    if layers != "all" and layers[0] < 0:
        raise argparse.ArgumentTypeError(f"'all' or comma-separated layers >= 0, got {text!r}")
    return layers


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.error = lambda message: sys.exit(f"error: {message}")      # one line and exit status 1, as every user error
    p.add_argument("runs", nargs="*", help="run folders holding ckpt_*.pt (the latest is evaluated), or RUN_DIR@STEP")
    p.add_argument("--hf", help="a Hugging Face causal LM: hub name or local folder")
    p.add_argument("--gguf", help="a GGUF file inside --hf's folder, passed as gguf_file= to from_pretrained")
    p.add_argument("--step", type=int_at_least(0), help="this checkpoint step of each run, not the latest")
    p.add_argument("--tasks", help=f"comma-separated (default: {','.join(PAPER_TASKS)}; with --profile: none)")
    p.add_argument("--data_dir", help="tasks from DIR/<task>[.jsonl|.jsonl.gz|.json|.parquet] (offline_tasks.py)")
    p.add_argument("--limit", type=int_at_least(1), help="only the first N documents of each task")
    p.add_argument("--batch_size", type=int_at_least(1), default=16, help="requests (or profile windows) per forward")
    p.add_argument("--out", help="write the results JSON here (rewritten after each task and model)")
    p.add_argument("--log_samples", action="store_true", help="store per-document requests and log-likelihoods")
    p.add_argument("--exit_layers", type=_exit_layers, help="also score the tasks read out at these layers (all, or "
                   "e.g. 4,8,12; 0 = the embedding): h_l through the final norm and LM head, in the same forwards")
    p.add_argument("--profile", action="store_true", help="layer profiles: Ψ, ζ, logit lens, skipped blocks")
    p.add_argument("--shards", help="profile on the val windows of this data folder (default for a run: its data_dir)")
    p.add_argument("--text", nargs="+", help="profile on these text files (.txt, .jsonl/.json with a text field)")
    p.add_argument("--profile_task", help="profile on the contexts of this task")
    p.add_argument("--profile_tokens", type=int_at_least(1), default=32768, help="tokens read by the model for Ψ / ζ")
    p.add_argument("--analysis_tokens", type=int_at_least(-1), default=4096,
                   help="tokens for the logit lens and skipped blocks (whole batches; 0: off, -1: all profile tokens)")
    p.add_argument("--seq_len", type=int_at_least(2), default=1024, help="profile window length (at most max_length)")
    p.add_argument("--all_ckpts", action="store_true", help="profile every checkpoint of each run (ζ over training)")
    p.add_argument("--plot", help="write PNG charts into this folder")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (default: cuda if available)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    return p.parse_args(argv)


def check_args(args):
    """Everything that can be checked without a model; returns the task list."""
    args.device = check_device(args.device)
    if not args.runs and not args.hf:
        raise SystemExit("error: give one or more run folders or --hf NAME_OR_PATH")
    if args.gguf and not args.hf:
        raise SystemExit("error: --gguf needs --hf DIR")
    if (args.step is not None or args.all_ckpts) and not args.runs:
        raise SystemExit(f"error: {'--step' if args.step is not None else '--all_ckpts'} reads checkpoints of run "
                         "folders; no run folder given")
    default = vars(parse_args([]))                        # options that only the layer profile reads
    profile_only = [f"--{k}" for k in ("shards", "text", "profile_task", "profile_tokens", "analysis_tokens", "seq_len",
                                       "all_ckpts") if getattr(args, k) != default[k]]
    if profile_only and not args.profile:
        raise SystemExit(f"error: {', '.join(profile_only)} {'is' if len(profile_only) == 1 else 'are'} for the layer "
                         f"profile: add --profile")
    tasks = parse_tasks(args.tasks) if args.tasks else ([] if args.profile else PAPER_TASKS)
    if args.profile_task:
        parse_tasks([args.profile_task])
    for run_dir in args.runs:
        checkpoint_path(run_dir, args.step)
    if args.profile and len(args.runs) > 1 and not (args.shards or args.text or args.profile_task):
        own = {run: load_checkpoint(checkpoint_path(run, args.step))["config"].get("data_dir") for run in args.runs}
        if len({path and os.path.realpath(path) for path in own.values()}) > 1:    # no val windows in common
            raise SystemExit(f"error: --profile compares the models on the same windows, but the runs' own "
                             f"validation data differ ({', '.join(f'{r}: {d}' for r, d in own.items())}): give "
                             "--shards, --text or --profile_task")
    if args.hf:
        check_hf_source(args.hf, args.gguf)
    if args.profile and args.hf and not (args.shards or args.text or args.profile_task):
        raise SystemExit("error: --profile of --hf needs --shards, --text or --profile_task")
    for path in [args.shards, args.data_dir]:
        if path and not os.path.exists(path):
            raise SystemExit(f"error: {path} does not exist")
    for path in args.text or []:                          # a wrong format or field fails here, at the first document
        if not os.path.isfile(path):
            raise SystemExit(f"error: --text {path} is not a file")
        next(text_documents([path]), None)
    check_writable(args.out, "--out")
    if args.exit_layers and not tasks:
        raise SystemExit("error: --exit_layers reads the tasks out at each layer: give --tasks")
    if args.plot and (not (args.profile or args.exit_layers) or importlib.util.find_spec("matplotlib") is None):
        raise SystemExit("error: --plot draws layer analyses: it needs --profile or --exit_layers, and matplotlib")
    check_writable(args.plot, "--plot", folder=True)
    return tasks


def profile_windows(args, lm, meta, task_data, seq_len, tokenizer=None):
    """The windows a model is profiled on, in batches of --batch_size: by default a run's own validation windows
    (data.val_windows, the windows of train.py's periodic eval), else --shards, --text or --profile_task. Shards
    must hold the model's tokenizer's ids: a run's tiktoken name, or `tokenizer` (shards_tokenizer) for --hf."""
    n, source, mask = max(1, args.profile_tokens // seq_len), args.text or args.profile_task or args.shards, None
    if args.text:
        windows = text_windows(lm, args.text, n, seq_len)
    elif args.profile_task:
        windows, mask = context_windows(lm, task_data[args.profile_task], args.profile_tokens, seq_len)
    else:
        if not (source := source or meta["config"].get("data_dir")):
            raise SystemExit(f"error: --profile: the run {meta['run_dir']} names no data_dir; give --shards or --text")
        tokenizer = lm.tokenizer.name if meta else tokenizer
        if is_conversations(source):                  # conversations: the val windows of a fine-tuning run
            val = PackedStream(source, "val", seq_len, 0, tokenizer, lm.model.config.vocab_size)
            x, y, real = val.batch(0, min(n, val.per_epoch))
            return list(zip(x.split(args.batch_size), y.split(args.batch_size), real.split(args.batch_size)))
        windows = val_windows(source, tokenizer, lm.model.config.vocab_size, seq_len, n)
    if len(windows) == 0:
        raise SystemExit(f"error: --profile: {', '.join(args.text or [source])} holds fewer than {seq_len + 1} "
                         "tokens (one window)")
    mask = torch.ones_like(windows, dtype=torch.bool) if mask is None else mask
    return list(zip(windows.split(args.batch_size), mask.split(args.batch_size)))


def evaluate_model(args, name, kind, path, tasks, task_data, report, save, seq_len=None):
    """Load one model, score the tasks and profile it on windows of seq_len tokens (None: --seq_len, at most the
    model's max_length); report[name] is filled as results come in."""
    device, dtype = args.device, getattr(torch, args.dtype)
    if kind == "run":
        model, tokenizer, meta = load_run(path, args.step, device, dtype)
        lm, target = ModelLM(model, tokenizer, name), model
        source = {k: meta[k] for k in ("run_dir", "checkpoint", "step", "tokens")}
    else:
        hf_model, hf_tokenizer = load_hf(path, args.gguf, device, dtype)
        lm, meta = HFModelLM(hf_model, hf_tokenizer, name), None
        target = profile_target(hf_model) if args.profile else None
        source = {"hf": path, "gguf": args.gguf, "class": type(hf_model).__name__}
    report[name] = entry = {"source": {**source, "max_length": lm.max_length}}
    if args.profile:                                       # checked before any task is scored
        if not seq_len and lm.max_length < args.seq_len:   # several models: main() chose one T and said it
            print(f"profile windows: {lm.max_length} tokens, the max_length of {name} (--seq_len {args.seq_len})",
                  file=sys.stderr)
        seq_len = seq_len or min(args.seq_len, lm.max_length)
        shards = None if kind == "run" or args.text or args.profile_task else shards_tokenizer(lm, args.shards)
    if exits := args.exit_layers:                          # checked against the depth as soon as it is known
        n_layer = len(blocks_and_norm(lm.model)[0])
        exits = list(range(n_layer + 1)) if exits == "all" else exits
        if exits[-1] > n_layer:
            raise SystemExit(f"error: --exit_layers {exits[-1]}: {name} has layers 0 (the embedding) to {n_layer}")
    if tasks:
        evaluate_tasks(lm, tasks, batch_size=args.batch_size, log_samples=args.log_samples, task_data=task_data,
                       on_task=lambda partial: (entry.update(partial), save()), exits=exits)
    if not args.profile:
        return
    batches = profile_windows(args, lm, meta, task_data, seq_len, shards)
    analysis = None if args.analysis_tokens == -1 else args.analysis_tokens
    entry["profile"] = {**profile_model(target, batches, analysis_tokens=analysis, progress=True), "seq_len": seq_len,
                        "windows": args.text or args.profile_task or args.shards or meta["config"]["data_dir"]}
    save()
    ckpts = list_checkpoints(meta["run_dir"]) if kind == "run" else []
    if args.all_ckpts or (args.plot and len(args.runs) == 1 and not args.hf and len(ckpts) > 1):
        entry["profile_checkpoints"] = points = []
        for step, _ in ckpts:                             # ζ over training: the same windows at every checkpoint
            model, _, meta = load_run(path, step, device, dtype, tokenizer=lm.tokenizer)
            points.append({"step": step, "tokens": meta["tokens"], "checkpoint": meta["checkpoint"],
                           **profile_model(model, batches, analysis_tokens=0)})
            print(f"{name} step {step}: ζ_L = {_zeta_l(points[-1]):.2f} (raw h_L)")
            save()


def main(argv=None):
    args = parse_args(argv)
    tasks = check_args(args)
    data_tasks = list(dict.fromkeys(tasks + ([args.profile_task] if args.profile_task else [])))
    task_data = {t: load_task(t, args.data_dir, args.limit) for t in data_tasks}
    models = {}                                            # name (the folder's, or the path if taken) -> (kind, path)
    for kind, path in [("run", r) for r in args.runs] + ([("hf", args.hf)] if args.hf else []):
        name = os.path.basename(os.path.normpath(args.gguf if kind == "hf" and args.gguf else path))
        models[path if name in models or not name else name] = (kind, path)
    config, report = {**vars(args), "tasks": tasks}, {}      # every option, as resolved
    seq_len = None
    if args.profile and len(models) > 1:                 # one window length for all: the same windows
        lengths = {name: max_length_of(kind, path, args.step, args.gguf) for name, (kind, path) in models.items()}
        config["profile_seq_len"] = seq_len = min(args.seq_len, *lengths.values())
        if short := [f"{name} ({n})" for name, n in lengths.items() if n < args.seq_len]:
            print(f"profile windows: {seq_len} tokens for every model (--seq_len {args.seq_len}; max_length of "
                  f"{', '.join(short)})", file=sys.stderr)

    def save(complete=False):                            # --out is rewritten whenever a result comes in
        if not args.out:
            return
        if len(models) == 1:
            out = {"model": next(iter(models)), "config": config, **report.get(next(iter(models)), {})}
        else:
            out = {"config": config, "models": report}
            if tasks and len(report) >= 2 and all("results" in e for e in list(report.values())[:2]):
                a, b = (e["results"] for e in list(report.values())[:2])            # Δ = second − first
                out["difference"] = {t: {m: b[t][m] - a[t][m] for m in METRIC_ORDER if m in a[t] and m in b[t]}
                                     for t in a if t in b}
        write_atomic(args.out, json.dumps({**out, "complete": complete}, indent=1))
        if complete:
            print(f"wrote {args.out}")

    for name, (kind, path) in models.items():
        evaluate_model(args, name, kind, path, tasks, task_data, report, save, seq_len)
    save(complete=True)
    if tasks:
        print(results_table(report))
    exits = {name: e for name, e in report.items() if "early_exit" in e}
    for name, e in exits.items():
        print("\n" + early_exit_table(name, e))
    profiles, series, _ = report_figures(report)           # a fine-tuning run's profile: all tokens, then its answers
    if profiles:
        print(profile_table(profiles))
    if args.plot:
        for path in plot_profiles(profiles, args.plot, series, exits):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
