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
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from study_runs import run_pending, save, train_and_profile  # noqa: E402

CONDITIONS = {"base": "configs/kjv.py", "jreg_a1": "configs/kjv_jreg.py", "jreg_a3": "configs/kjv_jreg_a3.py"}
SEEDS = [1337, 1, 2, 3, 4]


def one_run(condition, seed, out_root):
    name, t0 = f"{condition}_seed{seed}", time.time()
    out = {"run": name, "condition": condition, "seed": seed,
           **train_and_profile(CONDITIONS[condition], os.path.join(out_root, name), seed)}
    out["train_seconds"] = round(sum(out.pop("step_seconds")))                   # its steps' times
    save(out, os.path.join(HERE, "seeds", f"{name}.json"))
    print(f"{name}: {out['train_seconds']} s of training ({time.time() - t0:.0f} s here), val loss "
          f"{out['evals'][-1]['val_loss']:.4f}, ζ_L {out['profile']['zeta'][-1]:.2f}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default="out/kjv_seeds", help="the run folders")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each")
    args = p.parse_args()
    run_pending(lambda c, s: one_run(c, s, args.out), CONDITIONS, SEEDS, os.path.join(HERE, "seeds"), args.jobs)


if __name__ == "__main__":
    main()
