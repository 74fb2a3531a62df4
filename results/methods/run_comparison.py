"""
The comparison of JREG with the other fixes for the last layers (docs/methods.md), each method as its authors run it
(configs/kjv_<method>.py) beside today's variants (named for what differs), at the quick start's budget (300 steps).

    python results/methods/run_comparison.py sweep     # each condition's lr, chosen on held-out seeds
    python results/methods/run_comparison.py table     # the main table: the ten seeds, each condition at its own lr
    python results/methods/run_comparison.py deep      # 16 layers: the baseline, JREG and the two methods nearest it
    python results/methods/run_comparison.py shared    # the second table: every condition and variant at 3e-3

sweep: every condition of SWEPT at ½×, 1× and 2× the study's lr on SWEEP_SEEDS, seeds that no table uses; where the
best (the mean final val loss of the two) lies at an edge, one more lr beyond it, until it lies inside. table: each
condition of SWEPT at its own lr (the sweep's pick) on SEEDS. deep: DEEP and the two methods whose mean ζ_L in the main
table is nearest JREG's (nearest()), at n_layer = 16, their 8-layer lrs, the first five SEEDS. shared: every condition
but Muon's (OPTIMIZER), the variants too, at the study's lr on SHARED_SEEDS (the first five), into the table's folder
(a run at a pick that is the study's lr serves both tables). The parts go in this order, the main table and the
16-layer check before the second table. Runs go seed by seed (a seed's conditions together), two at a time, one
thread each; each is train.py then evaluate.py --profile (study_runs.py), written to
results/methods/<folder>/CONDITION_lrLR_seedN.json with the machine: its CPU, torch, commit and `arithmetic`, the
losses of a fixed 2-step run (so the comparison pairs only runs computed with one arithmetic). A rerun goes on where
it stopped; a seed whose runs are half done on another arithmetic is run again whole here. Needs data/kjv_bytes
(quickstart.sh).
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from study_runs import ROOT, machine, save, train_and_profile  # noqa: E402

CONDITIONS = {                                                  # the authors' recipes, then today's variants
    "base": "configs/kjv.py", "jreg_a1": "configs/kjv_jreg.py", "lns": "configs/kjv_lns.py",
    "mixln": "configs/kjv_mixln.py", "periln": "configs/kjv_periln.py", "early_exit": "configs/kjv_early_exit.py",
    "backout": "configs/kjv_backout.py", "jreg_lns": "configs/kjv_jreg_lns.py",
    "lns_depth_init": "configs/kjv_lns_depth_init.py",
    "periln_no_embedding_norm": "configs/kjv_periln_no_embedding_norm.py",
    "early_exit_uniform": "configs/kjv_early_exit_uniform.py", "backout_half": "configs/kjv_backout_half.py",
    "muon": "configs/kjv_muon.py", "muon_jreg": "configs/kjv_muon_jreg.py"}     # the optimizer's (docs/optimizer.md)
METHODS = list(CONDITIONS)[:8]                                 # the methods tables' (the variants: the study's lr only)
OPTIMIZER = ["muon", "muon_jreg"]                              # Muon's rows beside the AdamW baseline's and JREG's
SWEPT = METHODS + OPTIMIZER                                    # each at an lr of its own
STUDY_LR = 3e-3                                                # configs/kjv.py's
SWEEP_LRS = [STUDY_LR / 2, STUDY_LR, STUDY_LR * 2]
SWEEP_SEEDS = [1001, 1002]                                     # held out: no table uses them
SEEDS = [1337, 1, 2, 3, 4, 5, 6, 7, 8, 9]
DEEP, DEEP_LAYERS, DEEP_SEEDS = ["base", "jreg_a1"], 16, SEEDS[:5]   # + the two methods nearest JREG (--deep_methods)
SHARED_SEEDS = SEEDS[:5]                                       # the second table's
DEEP_SETTINGS = {"backout": ("--backout_layer=12",), "backout_half": ("--backout_layer=8",)}   # k kept at 3L/4, L/2


def name(condition, lr, seed):
    return f"{condition}_lr{lr:g}_seed{seed}"


def arithmetic():
    """The losses of configs/kjv.py's first 2 steps at 2 layers here, hashed: equal on two machines and commits only
    where the training arithmetic is (the CPU's kernels, torch, the code)."""
    folder = tempfile.mkdtemp()
    try:
        subprocess.run([sys.executable, "train.py", "configs/kjv.py", f"--out_dir={folder}", "--max_steps=2",
                        "--eval_interval=0", "--n_layer=2", "--ckpt_interval=2", "--keep_ckpts=1"], cwd=ROOT,
                       check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        losses = [json.loads(line)["loss"] for line in open(os.path.join(folder, "log.jsonl"))]
    finally:
        shutil.rmtree(folder)
    return hashlib.sha256(repr(losses).encode()).hexdigest()[:12]


def here():
    """study_runs.machine() and this machine's arithmetic."""
    return {**machine(), "arithmetic": arithmetic()}


def one_run(condition, lr, seed, part, where, out_root, *settings):
    run, t0 = name(condition, lr, seed), time.time()
    out = {"run": run, "condition": condition, "seed": seed, "lr": lr, "settings": list(settings), "machine": where,
           **train_and_profile(CONDITIONS[condition], os.path.join(out_root, part, run), seed, f"--lr={lr!r}",
                               *settings)}
    out["wall_seconds"] = round(time.time() - t0, 1)                           # one thread: its CPU time
    seconds = sorted(out.pop("step_seconds"))
    out["seconds_per_step"] = seconds[len(seconds) // 2]                       # the median: no warm-up outlier
    save(out, os.path.join(HERE, part, f"{run}.json"))
    print(f"{part}/{run}: val loss {out['evals'][-1]['val_loss']:.4f}, ζ_L {out['profile']['zeta'][-1]:.2f}",
          flush=True)


def load(part):
    """{run name: its result} of results/methods/<part>/."""
    folder = os.path.join(HERE, part)
    return {f[:-5]: json.load(open(os.path.join(folder, f))) for f in sorted(os.listdir(folder)) if f.endswith(".json")
            } if os.path.isdir(folder) else {}


def picks_means(sweep, condition):
    """{lr: the mean final val loss over SWEEP_SEEDS} of the lrs this condition has run on every one of them."""
    mean = {}
    for lr in sorted({r["lr"] for r in sweep.values() if r["condition"] == condition}):
        runs = [sweep.get(name(condition, lr, s)) for s in SWEEP_SEEDS]
        if all(runs):
            mean[lr] = sum(r["evals"][-1]["val_loss"] for r in runs) / len(runs)
    return mean


def picks(sweep, conditions=None):
    """{condition: (its best lr, whether the sweep is done: the best inside the lrs run, every lr run on every seed)};
    the best by the mean final val loss over SWEEP_SEEDS."""
    out = {}
    for c in conditions or SWEPT:
        mean = picks_means(sweep, c)
        ran = {r["lr"] for r in sweep.values() if r["condition"] == c}
        best = min(mean, key=mean.get) if mean else None
        out[c] = (best, bool(mean) and best not in (min(mean), max(mean)) and set(SWEEP_LRS) <= set(mean) == ran)
    return out


def sweep_grid(sweep):
    """The sweep's runs [(condition, lr, seed, settings)]: SWEEP_LRS for every condition of SWEPT on SWEEP_SEEDS, the
    further lrs already run, and where a condition's best (picks) lies at an edge of its lrs run, the next one beyond
    it (½× below, 2× above)."""
    grid = [(c, lr, s, ()) for s in SWEEP_SEEDS for c in SWEPT for lr in SWEEP_LRS]
    for c, (best, ok) in picks(sweep).items():
        lrs = sorted({r["lr"] for r in sweep.values() if r["condition"] == c} | set(SWEEP_LRS))
        grid += [(c, lr, s, ()) for s in SWEEP_SEEDS for lr in lrs if lr not in SWEEP_LRS]
        if best is not None and not ok and set(SWEEP_LRS) <= set(picks_means(sweep, c)):
            grid += [(c, best / 2 if best == lrs[0] else best * 2, s, ()) for s in SWEEP_SEEDS]
    return list(dict.fromkeys(grid))


def nearest(table, lrs, k=2):
    """The k methods of SWEPT (not the baseline, JREG or a combination with it) whose mean ζ_L over the seeds of the
    main table (each at its own lr, lrs) is nearest JREG's: the ones the 16-layer check runs beside it."""
    def zeta(c):
        runs = [table[name(c, lrs[c], s)] for s in SEEDS if name(c, lrs[c], s) in table]
        return sum(r["profile"]["zeta"][-1] for r in runs) / len(runs) if runs else float("inf")
    methods = [c for c in METHODS if c != "base" and not c.startswith("jreg")]
    return sorted(methods, key=lambda c: abs(zeta(c) - zeta("jreg_a1")))[:k]


def todo(grid, part, where, block=lambda run: run[2]):
    """The runs of grid [(condition, lr, seed, settings)] still to run here: those without a result, and every run of
    a block (by default a seed, whose runs the tables pair) whose runs are not all done and not all of this machine's
    arithmetic (that block is run again whole)."""
    done = load(part)
    out = []
    for key in dict.fromkeys(block(g) for g in grid):
        runs = [g for g in grid if block(g) == key]
        have = [done.get(name(c, lr, s)) for c, lr, s, _ in runs]
        mixed = not all(have) and any(h and h["machine"]["arithmetic"] != where["arithmetic"] for h in have)
        out += [g for g, h in zip(runs, have) if h is None or mixed]
    return out


def go(grid, folder, where, out_root, jobs, block=lambda run: run[2]):
    """Run grid's runs still to do (todo) into results/methods/<folder>/, `jobs` at a time."""
    pending, t0 = todo(grid, folder, where, block), time.time()
    print(f"{folder}: {len(pending)} of {len(grid)} runs to go, {jobs} at a time", flush=True)
    os.makedirs(os.path.join(HERE, folder), exist_ok=True)
    with ThreadPoolExecutor(jobs) as pool:
        for future in [pool.submit(one_run, c, lr, s, folder, where, out_root, *settings)
                       for c, lr, s, settings in pending]:
            future.result()
    print(f"{folder}: {len(pending)} runs in {time.time() - t0:.0f} s", flush=True)


def grids(chosen):
    """{part: its grid [(condition, lr, seed, settings)]} of the parts after the sweep, at its picks chosen."""
    return {"table": [(c, chosen[c][0], s, ()) for s in SEEDS for c in SWEPT],
            "shared": [(c, STUDY_LR, s, ()) for s in SHARED_SEEDS for c in CONDITIONS if c not in OPTIMIZER]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("part", choices=["sweep", "table", "deep", "shared"])
    p.add_argument("--out", default="out/comparison", help="the run folders")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each")
    p.add_argument("--deep_methods", default="", help="deep: two methods (default: the two whose mean ζ_L in the main "
                   "table is nearest JREG's)")
    args = p.parse_args()
    where = here()
    print(f"on {where['cpu']}, torch {where['torch']}, commit {where['commit']}, arithmetic {where['arithmetic']}",
          flush=True)
    if args.part == "sweep":
        by_condition = lambda run: run[0]                        # noqa: E731  (a pick compares one condition's lrs)
        while todo(sweep_grid(load("sweep")), "sweep", where, by_condition):   # further lrs while a best is at edge
            go(sweep_grid(load("sweep")), "sweep", where, args.out, args.jobs, by_condition)
        for c, (best, ok) in picks(load("sweep")).items():
            print(f"{c}: lr {best:g}" + ("" if ok else " (at an edge)"))
        return
    chosen = picks(load("sweep"))
    if not all(ok for _, ok in chosen.values()):
        raise SystemExit(f"error: the sweep is not done ({', '.join(c for c, (_, ok) in chosen.items() if not ok)}): "
                         "run the sweep part first")
    if args.part in ("table", "shared"):
        go(grids(chosen)[args.part], "table", where, args.out, args.jobs)
    else:
        lrs = {c: lr for c, (lr, _) in chosen.items()}
        methods = [m for m in args.deep_methods.split(",") if m] or nearest(load("table"), lrs)
        if len(methods) != 2 or not set(methods) <= set(SWEPT):
            raise SystemExit(f"error: --deep_methods names two of {', '.join(SWEPT)}")
        print(f"deep: {', '.join(DEEP + methods)} at {DEEP_LAYERS} layers", flush=True)
        grid = [(c, chosen[c][0], s, (f"--n_layer={DEEP_LAYERS}", *DEEP_SETTINGS.get(c, ())))
                for s in DEEP_SEEDS for c in DEEP + methods]
        go(grid, "deep", where, args.out, args.jobs)

if __name__ == "__main__":
    main()
