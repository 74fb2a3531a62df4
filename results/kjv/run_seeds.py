"""
The small CPU reproduction over seeds: the baseline (configs/kjv.py), JREG α = 1 (kjv_jreg.py) and JREG α = 3
(kjv_jreg_a3.py), each with seeds 1337, 1, 2, 3 and 4 (the seed sets the initialisation and the data order), 300 steps
(the configs' 600 halved, as the quick start runs them: the jump is clear by then, and 15 runs fit in under an hour).
Two runs at a time, one thread each (on 2 cores, faster than one after the other on two threads, and bit-identical);
each run is profiled by evaluate.py --profile as soon as it ends. Writes results/kjv/seeds/CONDITION_seedN.json: the
settings, the periodic evals of log.jsonl (val loss, Ψ, ζ every 50 steps), every 10th step record, the last step and
the profile (Ψ, ζ on both h_L conventions, on the 32,768 validation tokens). Needs data/kjv_bytes (quickstart.sh).

    python results/kjv/run_seeds.py [--out out/kjv_seeds] [--jobs 2]     # ~40 min on an idle 2-core CPU
    python results/collect.py                                            # the tables, intervals and plots
"""
import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONDITIONS = {"base": "configs/kjv.py", "jreg_a1": "configs/kjv_jreg.py", "jreg_a3": "configs/kjv_jreg_a3.py"}
SEEDS = [1337, 1, 2, 3, 4]
STEPS = ["--max_steps=300", "--eval_interval=50", "--ckpt_interval=300", "--keep_ckpts=1"]   # as quickstart.sh


def one_run(condition, seed, out_root):
    name, t0 = f"{condition}_seed{seed}", time.time()
    folder, result = os.path.join(out_root, f"{condition}_seed{seed}"), os.path.join(HERE, "seeds", f"{name}.json")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = lambda *cmd: subprocess.run([sys.executable, *cmd], cwd=ROOT, env=env, check=True,   # noqa: E731
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    run("train.py", CONDITIONS[condition], f"--out_dir={folder}", f"--seed={seed}", *STEPS)   # ζ over training: the
    #                                                                                   periodic evals of log.jsonl
    run("evaluate.py", folder, "--profile", "--out", os.path.join(folder, "profile.json"))
    records = [json.loads(line) for line in open(os.path.join(folder, "log.jsonl"))]
    steps = [r for r in records if "loss" in r]
    profile = json.load(open(os.path.join(folder, "profile.json")))["profile"]          # evaluate.py, one model
    out = {"run": name, "condition": condition, "seed": seed,
           "config": json.load(open(os.path.join(folder, "config.json")))["config"],
           "evals": [r for r in records if "val_loss" in r], "steps": [r for r in steps if r["step"] % 10 == 0],
           "last_step": steps[-1], "profile": profile,
           "train_seconds": round(sum(r["tokens"] / r["step"] / r["tok_per_s"] for r in steps))}   # its steps' times
    with open(result + ".tmp", "w") as f:
        json.dump(out, f, indent=1)
    os.replace(result + ".tmp", result)
    print(f"{name}: {out['train_seconds']} s of training ({time.time() - t0:.0f} s here), val loss {out['evals'][-1]['val_loss']:.4f}, ζ_L {profile['zeta'][-1]:.2f}",
          flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default="out/kjv_seeds", help="the run folders")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each")
    args = p.parse_args()
    os.makedirs(os.path.join(HERE, "seeds"), exist_ok=True)
    todo = [(c, s) for s in SEEDS for c in CONDITIONS
            if not os.path.exists(os.path.join(HERE, "seeds", f"{c}_seed{s}.json"))]   # a rerun goes on
    t0 = time.time()
    with ThreadPoolExecutor(args.jobs) as pool:
        for future in [pool.submit(one_run, c, s, args.out) for c, s in todo]:
            future.result()
    print(f"{len(todo)} runs in {time.time() - t0:.0f} s with {args.jobs} at a time")


if __name__ == "__main__":
    main()
