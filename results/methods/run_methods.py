"""
JREG beside the other fixes for the last layers (docs/methods.md): the baseline, JREG (λ = 1, α = 1), LayerNorm
Scaling, Mix-LN, Peri-LN, the early-exit loss, Backout, and JREG + LayerNorm Scaling, each with the seed study's seeds
(1337, 1, 2, 3, 4: the initialisation and the data order) at the quick start's budget (300 steps of configs/kjv*.py),
all on one machine with one commit, so that a difference is the method's. Two runs at a time, one thread each; each
run is profiled by evaluate.py --profile (Ψ, ζ, the logit lens, skip-one-block) as it ends, and its wall-clock per
step kept. Writes results/methods/runs/CONDITION_seedN.json: the settings, the periodic evals, every 10th step, the
last step, the profile, the seconds per step, and the machine and commit it ran on (runs from another machine or
commit are kept apart by the comparison). A rerun goes on where it stopped. Needs data/kjv_bytes (quickstart.sh).

    python results/methods/run_methods.py [--out out/methods] [--jobs 2]   # 40 runs: ~3 h on an idle 2-core CPU
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONDITIONS = {"base": "configs/kjv.py", "jreg_a1": "configs/kjv_jreg.py", "lns": "configs/kjv_lns.py",
              "mixln": "configs/kjv_mixln.py", "periln": "configs/kjv_periln.py",
              "early_exit": "configs/kjv_early_exit.py", "backout": "configs/kjv_backout.py",
              "jreg_lns": "configs/kjv_jreg_lns.py"}
SEEDS = [1337, 1, 2, 3, 4]
STEPS = ["--max_steps=300", "--eval_interval=50", "--ckpt_interval=300", "--keep_ckpts=1"]   # as quickstart.sh


def machine():
    cpu = platform.processor()
    if os.path.exists("/proc/cpuinfo"):
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                   cpu)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    import torch
    return {"cpu": cpu, "torch": torch.__version__, "commit": commit.strip() or None}


def one_run(condition, seed, out_root, where):
    name = f"{condition}_seed{seed}"
    folder, result = os.path.join(out_root, name), os.path.join(HERE, "runs", f"{name}.json")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = lambda *cmd: subprocess.run([sys.executable, *cmd], cwd=ROOT, env=env, check=True,   # noqa: E731
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    run("train.py", CONDITIONS[condition], f"--out_dir={folder}", f"--seed={seed}", *STEPS)
    run("evaluate.py", folder, "--profile", "--out", os.path.join(folder, "profile.json"))
    records = [json.loads(line) for line in open(os.path.join(folder, "log.jsonl"))]
    steps = [r for r in records if "loss" in r]
    seconds = [r["tokens"] / r["step"] / r["tok_per_s"] for r in steps]    # each step's wall-clock
    out = {"run": name, "condition": condition, "seed": seed, "machine": where,
           "config": json.load(open(os.path.join(folder, "config.json")))["config"],
           "evals": [r for r in records if "val_loss" in r], "steps": [r for r in steps if r["step"] % 10 == 0],
           "last_step": steps[-1], "profile": json.load(open(os.path.join(folder, "profile.json")))["profile"],
           "seconds_per_step": sorted(seconds)[len(seconds) // 2]}                # the median: no warm-up outlier
    with open(result + ".tmp", "w") as f:
        json.dump(out, f, indent=1)
    os.replace(result + ".tmp", result)
    print(f"{name}: {out['seconds_per_step']:.2f} s a step, val loss {out['evals'][-1]['val_loss']:.4f}, ζ_L "
          f"{out['profile']['zeta'][-1]:.2f}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default="out/methods", help="the run folders")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each")
    args = p.parse_args()
    os.makedirs(os.path.join(HERE, "runs"), exist_ok=True)
    todo = [(c, s) for s in SEEDS for c in CONDITIONS
            if not os.path.exists(os.path.join(HERE, "runs", f"{c}_seed{s}.json"))]   # a rerun goes on
    where, t0 = machine(), time.time()
    print(f"{len(todo)} runs to go on {where['cpu']}, commit {where['commit']}", flush=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        for f in [pool.submit(one_run, c, s, args.out, where) for c, s in todo]:
            f.result()
    print(f"done in {(time.time() - t0) / 60:.0f} min")


if __name__ == "__main__":
    main()
