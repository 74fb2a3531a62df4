"""
JREG beside the other fixes for the last layers (docs/methods.md): the baseline, JREG (λ = 1, α = 1), LayerNorm
Scaling, Mix-LN, Peri-LN, the early-exit loss, Backout, and JREG + LayerNorm Scaling, each with the seed study's seeds
(1337, 1, 2, 3, 4: the initialisation and the data order) at the quick start's budget (300 steps of configs/kjv*.py),
all on one machine with one commit, so that a difference is the method's. Two runs at a time, one thread each; each
run is profiled by evaluate.py --profile (Ψ, ζ, the logit lens, skip-one-block) as it ends, and its wall-clock per
step kept. Writes results/methods/runs/CONDITION_seedN.json: the settings, the periodic evals, every 10th step, the
last step, the profile, the seconds per step, and the machine and commit it ran on (runs from another machine or
commit are kept apart by the comparison). A rerun goes on where it stopped. Needs data/kjv_bytes (quickstart.sh).

The learning-rate check (--lr_check): is the study's lr = 3e-3 near each method's best at this budget? Seed 1337 of
every condition but the combination, at half, one and two times that lr, into results/methods/lr_runs/; then a wider
lr where a best lies at the edge, and the other seeds at a method's best lr, to compare it with the baseline there.

    python results/methods/run_methods.py [--out out/methods] [--jobs 2]   # 40 runs
    python results/methods/run_methods.py --lr_check                       # 21 runs
    python results/methods/run_methods.py --lr_check --lrs 1.2e-2 --conditions mixln,lns   # docs/methods.md: all run
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from study_runs import machine, run_pending, save, train_and_profile  # noqa: E402

# the configs of today's variants, as this study ran them (before the authors' recipes: run_comparison.py)
CONDITIONS = {"base": "configs/kjv.py", "jreg_a1": "configs/kjv_jreg.py", "lns": "configs/kjv_lns_depth_init.py",
              "mixln": "configs/kjv_mixln.py", "periln": "configs/kjv_periln_no_embedding_norm.py",
              "early_exit": "configs/kjv_early_exit_uniform.py", "backout": "configs/kjv_backout_half.py",
              "jreg_lns": "configs/kjv_jreg_lns.py"}
SETTINGS = {"jreg_lns": ["--depth_scaled_init=True"]}          # JREG with LNS on the depth-scaled init, as it ran
SEEDS = [1337, 1, 2, 3, 4]
LRS = "1.5e-3,3e-3,6e-3"                                                       # the lr check: the study's lr, ½ and 2×


def one_run(condition, seed, out_root, where, lr=None, folder="runs"):
    name = condition + (f"_lr{lr:g}" if lr else "") + f"_seed{seed}"
    out = {"run": name, "condition": condition, "seed": seed, "lr": lr, "machine": where, **train_and_profile(
        CONDITIONS[condition], os.path.join(out_root, name), seed, *([f"--lr={lr!r}"] if lr else []),
        *SETTINGS.get(condition, []))}
    seconds = sorted(out.pop("step_seconds"))
    out["seconds_per_step"] = seconds[len(seconds) // 2]                       # the median: no warm-up outlier
    save(out, os.path.join(HERE, folder, f"{name}.json"))
    print(f"{name}: {out['seconds_per_step']:.2f} s a step, val loss {out['evals'][-1]['val_loss']:.4f}, ζ_L "
          f"{out['profile']['zeta'][-1]:.2f}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default="out/methods", help="the run folders")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each")
    p.add_argument("--lr_check", action="store_true", help="the learning-rate check instead, into lr_runs/")
    p.add_argument("--lrs", default=LRS, help=f"with --lr_check: the learning rates (default {LRS})")
    p.add_argument("--conditions", default=",".join(c for c in CONDITIONS if c != "jreg_lns"),
                   help="with --lr_check: the conditions (default: all but jreg_lns)")
    p.add_argument("--seeds", default="1337", help="with --lr_check: the seeds (default 1337)")
    args = p.parse_args()
    where = machine()
    print(f"on {where['cpu']}, commit {where['commit']}", flush=True)
    if args.lr_check:
        lrs = [float(lr) for lr in args.lrs.split(",")]
        grid = {f"{c}_lr{lr:g}": (c, lr) for c in args.conditions.split(",") for lr in lrs}
        unknown = sorted({c for c, _ in grid.values()} - set(CONDITIONS))
        if unknown:
            raise SystemExit(f"error: no condition {', '.join(unknown)} (conditions: {', '.join(CONDITIONS)})")
        run_pending(lambda c, s: one_run(grid[c][0], s, args.out, where, grid[c][1], "lr_runs"), grid,
                    [int(s) for s in args.seeds.split(",")], os.path.join(HERE, "lr_runs"), args.jobs)
        return
    run_pending(lambda c, s: one_run(c, s, args.out, where), CONDITIONS, SEEDS, os.path.join(HERE, "runs"), args.jobs)


if __name__ == "__main__":
    main()
