"""
A jump survey: several models profiled on the same text with the same number of tokens each, both h_L conventions,
one table sorted by ζ_L. The paper's claim that the final-layer jump is common across open-weight models, and grows
during pre-training, as one command. Loading, windows and the profile itself are lib/commands.py's and
lib/profiles.py's.

    python -m scripts.survey --text genesis.txt --hf meta-llama/Llama-3.2-1B Qwen/Qwen2.5-0.5B google/gemma-2-2b --out s.json
    python -m scripts.survey --text genesis.txt --hf EleutherAI/pythia-160m@step1000 EleutherAI/pythia-160m@step143000 --plot p/
    python -m scripts.survey --text genesis.txt --hf DIR/SmolLM2-135M-Instruct.Q4_1.gguf --runs out/kjv/base out/kjv/jreg_a1

--hf: hub names or local folders (transformers), .gguf files; a hub name optionally NAME@REVISION (a branch, tag or
commit: Pythia's training checkpoints are its revisions step0..step143000). --runs: our run folders, RUN@STEP for a
checkpoint. Models sharing a NAME with numbered revisions (stepN, a run's steps) also form a series, drawn as ζ
against the step. A model that cannot be loaded (a gated or missing hub model) is reported and the survey goes on;
the command then ends with an `error:` line and exit status 1, with the other models' results written.
"""
import argparse
import gc
import json
import os
import re
import sys
import time

import numpy as np
import torch

from files import write_atomic
from lib.profiles import plot_profiles, profile_model, profile_target, text_documents, text_windows
from lib.hf import check_hf_source, load_hf
from lib.commands import check_device, check_writable, checkpoint_path, int_at_least, load_run
from checkpoint import run_step
from lib.tasks import HFModelLM, ModelLM


CONVENTIONS = {"raw": ("psi", "zeta"), "normed": ("psi_normed", "zeta_normed")}   # h_L raw, or after the final norm


def parse_model(spec, kind):
    """{"spec", "kind", "path", "gguf", "revision", "step"} of one --hf / --runs argument."""
    if kind == "run":                                     # RUN_DIR, RUN_DIR@STEP, RUN_DIR@latest
        path, step = run_step(spec)
        return {"spec": spec, "kind": kind, "path": path, "gguf": None, "revision": None, "step": step}
    path, revision, gguf = spec, None, None
    if "@" in spec and not os.path.exists(spec):
        path, revision = spec.rsplit("@", 1)
    if path.endswith(".gguf"):
        path, gguf = os.path.dirname(path) or ".", os.path.basename(path)
    step = re.fullmatch(r"(?:step[-_]?)?(\d+)(?:-.*)?", revision or "")       # 1000, step1000, step1000-tokens4B
    return {"spec": spec, "kind": kind, "path": path, "gguf": gguf, "revision": revision,
            "step": int(step.group(1)) if step else None}


def check(args):
    """Every option, file and local model checked before any model is loaded; returns the parsed models."""
    args.device = check_device(args.device)
    models = [parse_model(s, "hf") for s in args.hf] + [parse_model(s, "run") for s in args.runs]
    if not models:
        raise SystemExit("error: give models to survey: --hf NAME_OR_DIR_OR_GGUF ... and/or --runs RUN_DIR ...")
    if len({m["spec"] for m in models}) < len(models):
        raise SystemExit("error: a model is named twice")
    for m in models:
        if m["kind"] == "run":
            checkpoint_path(m["path"], m["step"], f"--runs {m['spec']}")
        else:                                             # a local folder or GGUF file: no @REVISION
            check_hf_source(m["path"], m["gguf"], m["revision"], local=bool(m["gguf"]))
    for path in args.text:                                # a wrong format or field fails here, at the first document
        if not os.path.isfile(path):
            raise SystemExit(f"error: --text {path} is not a file")
        next(text_documents([path]), None)
    check_writable(args.out, "--out")
    check_writable(args.plot, "--plot", folder=True)
    return models


def load(m, device, dtype):
    """(model to profile, a tasks.py LM for its tokenizer, source record) of one parsed model."""
    if m["kind"] == "run":
        model, tokenizer, meta = load_run(m["path"], m["step"], device, dtype)
        return model, ModelLM(model, tokenizer, m["spec"]), {"checkpoint": meta["checkpoint"], "step": meta["step"]}
    hf_model, tokenizer = load_hf(m["path"], m["gguf"], device, dtype, revision=m["revision"])
    source = {"hf": m["path"], "gguf": m["gguf"], "revision": m["revision"], "class": type(hf_model).__name__}
    target, lm = profile_target(hf_model), HFModelLM(hf_model, tokenizer, m["spec"])
    if target is not hf_model:                            # converted to our Llama: the transformers copy can go
        lm.model = None
    return target, lm, source


def summary(p):
    """Per convention: ζ_L, ζ_(L−2), Ψ_L, the mean Ψ of the middle layers 2..L−2 and Ψ_L over it."""
    out, L = {}, p["n_layer"]
    for conv, (psi_key, zeta_key) in CONVENTIONS.items():
        psi, zeta, middle = p[psi_key], p[zeta_key], p[psi_key][1:L - 2]
        mid = float(np.mean(middle)) if middle else None
        out[conv] = {"zeta_L": zeta[-1] if zeta else None, "zeta_L_minus_2": zeta[-3] if L >= 4 else None,
                     "psi_L": psi[-1], "middle_psi": mid, "psi_L_over_middle": psi[-1] / mid if mid else None}
    return out


def survey_model(m, args):
    """Load one model, profile it on the text, and time both."""
    t0 = time.time()
    target, lm, source = load(m, args.device, getattr(torch, args.dtype))
    t1 = time.time()
    if (seq_len := min(args.seq_len, lm.max_length)) < args.seq_len:
        print(f"{m['spec']}: windows of {seq_len} tokens, its max_length (--seq_len {args.seq_len})", file=sys.stderr)
    windows = text_windows(lm, args.text, n := max(1, args.tokens // seq_len), seq_len)    # whole windows
    if len(windows) == 0:
        raise SystemExit(f"error: --text holds fewer than {seq_len + 1} tokens of {m['spec']}")
    analysis = None if args.analysis_tokens == -1 else args.analysis_tokens
    profile = profile_model(target, windows.split(args.batch_size), analysis_tokens=analysis, progress=True)
    if len(windows) < n:                                  # the text ran out (not --tokens rounded to windows)
        print(f"warning: {m['spec']}: the text gives {profile['n_tokens']} of --tokens {args.tokens}", file=sys.stderr)
    params = sum(p.numel() for p in target.parameters())      # parameters() counts tied embeddings once
    return {"source": source, "params": params, "n_layer": profile["n_layer"], "seq_len": seq_len,
            "load_s": round(t1 - t0, 1), "profile_s": round(time.time() - t1, 1), "step": m["step"],
            "summary": summary(profile), "profile": profile}


def table(results):
    """Markdown: a row per model, sorted by ζ_L on the raw stream (largest first), both conventions."""
    num = lambda v, f=".2f": "–" if v is None else format(v, f)          # noqa: E731
    head = "| model | params | layers | tokens | " + " | ".join(
        f"ζ_L {c} | ζ_(L−2) {c} | Ψ_L / middle Ψ {c}" for c in CONVENTIONS) + " | load s | profile s |"
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    ok = {k: r for k, r in results.items() if "summary" in r}
    for name, r in sorted(ok.items(), key=lambda kv: -(kv[1]["summary"]["raw"]["zeta_L"] or 0)):
        cells = [f"{num(s['zeta_L'])} | {num(s['zeta_L_minus_2'])} | {num(s['psi_L_over_middle'], '.1f')}"
                 for s in r["summary"].values()]
        short = name if len(name) <= 48 else "…" + name[-47:]                # a long local path: its end
        lines.append(f"| {short} | {r['params'] / 1e6:,.1f}M | {r['n_layer']} | {r['profile']['n_tokens']} | "
                     + " | ".join(cells) + f" | {r['load_s']:.0f} | {r['profile_s']:.0f} |")
    lines += [f"| {name} | failed: {r['error']} |" for name, r in results.items() if "error" in r]
    return "\n".join(lines)


def figures(results):
    """(profiles, series) for plot_profiles from the survey's `models` {spec: result}: every profiled model, and the
    models sharing a name with two or more numbered revisions or steps as a series {name: profiles with "step"}."""
    done = {spec: r for spec, r in results.items() if "profile" in r}
    series = {}
    for spec, r in done.items():
        if r["step"] is not None:
            path = parse_model(spec, "run" if "checkpoint" in r.get("source", {}) else "hf")["path"]
            series.setdefault(path, []).append({**r["profile"], "step": r["step"]})
    series = {name: sorted(points, key=lambda p: p["step"]) for name, points in series.items() if len(points) > 1}
    return {spec: r["profile"] for spec, r in done.items()}, series


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip())
    p.error = lambda message: sys.exit(f"error: {message}")
    p.add_argument("--hf", nargs="+", default=[], help="hub names, local folders or .gguf files, each maybe @REVISION")
    p.add_argument("--runs", nargs="+", default=[], help="our run folders, each optionally @STEP")
    p.add_argument("--text", nargs="+", required=True, help="the text all models read (.txt; .jsonl/.json: text)")
    p.add_argument("--tokens", type=int_at_least(1), default=16384, help="tokens read per model (its own tokenizer)")
    p.add_argument("--seq_len", type=int_at_least(2), default=512, help="window length (at most max_length)")
    p.add_argument("--batch_size", type=int_at_least(1), default=4, help="windows per forward")
    p.add_argument("--analysis_tokens", type=int_at_least(-1), default=0,
                   help="tokens for the logit lens and skipped blocks (0: off, the default; -1: all)")
    p.add_argument("--out", help="results JSON, rewritten after each model")
    p.add_argument("--plot", help="write psi_profiles.png and, for series, zeta_over_checkpoints.png here")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    models = check(args)
    results, config = {}, vars(args).copy()

    def save(complete=False):
        if args.out:
            write_atomic(args.out, json.dumps({"config": config, "models": results, "complete": complete}, indent=1))

    for m in models:
        print(f"{m['spec']}: loading", file=sys.stderr)
        try:
            results[m["spec"]] = survey_model(m, args)
        except SystemExit as e:                           # a gated or missing model: recorded, the survey goes on
            results[m["spec"]] = {"error": str(e.code).removeprefix("error: ")}
            print(e.code, file=sys.stderr)
        gc.collect()
        save()
    save(complete=True)
    print(table(results))
    profiles, series = figures(results)
    if args.plot and profiles:
        for path in plot_profiles(profiles, args.plot, series):
            print(f"wrote {path}")
    if failed := [name for name, r in results.items() if "error" in r]:
        raise SystemExit(f"error: {len(failed)} of {len(models)} models could not be surveyed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
