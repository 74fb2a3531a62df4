"""
Collect the small CPU reproduction (README, "Reproduction at small scale") into one JSON per run and print the
results table. Run from the repository root after the training runs and the evaluate.py commands:

    python results/kjv/collect.py [out/kjv]
"""
import json
import os
import sys

RUNS = ["base", "jreg_a1", "jreg_a3", "base_seed1", "jreg_a1_seed1"]
HERE = os.path.dirname(os.path.abspath(__file__))


def collect(run_root):
    models = json.load(open(os.path.join(HERE, "profiles.json")))["models"]
    rows = {}
    for run in RUNS:
        folder = os.path.join(run_root, run)
        records = [json.loads(line) for line in open(os.path.join(folder, "log.jsonl"))]
        result = {"run": run, "config": json.load(open(os.path.join(folder, "config.json"))),
                  "evals": [r for r in records if "val_loss" in r],
                  "last_step": [r for r in records if "loss" in r][-1],
                  "profile": models[run]["profile"]}
        with open(os.path.join(HERE, f"{run}.json"), "w") as f:
            json.dump(result, f, indent=1)
        rows[run] = result
    return rows


def table(rows):
    lines = ["| run | seed | val loss | Ψ_L | Ψ_{L−1} | ζ_L | ζ_{L−2} | ζ_L (normed h_L) | mean Ψ, layers 2..L−2 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for run, r in rows.items():
        p, cfg = r["profile"], r["config"]["config"]
        psi, zeta = p["psi"], p["zeta"]
        mid = psi[1:-2]
        lines.append(f"| {run} | {cfg['seed']} | {r['evals'][-1]['val_loss']:.4f} | {psi[-1]:.4f} | {psi[-2]:.4f} | "
                     f"{zeta[-1]:.2f} | {zeta[-3]:.2f} | {p['zeta_normed'][-1]:.2f} | {sum(mid) / len(mid):.4f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(collect(sys.argv[1] if len(sys.argv) > 1 else "out/kjv")))
