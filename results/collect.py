"""
Every results number that README.md and docs/ quote is written by this script from committed files, between markers

    <!-- results/collect.py: NAME -->
    ...generated text...
    <!-- end -->

so a quoted number cannot drift from its source. tests/test_results.py runs `--check` and fails when a generated block
no longer equals what the committed files give.

    python results/collect.py            # rewrite the blocks in README.md and docs/, and the plots they show
    python results/collect.py --check    # exit 1 and name the blocks that differ (no file is written)

The KJV seed study (results/kjv/seeds/*.json, made by results/kjv/run_seeds.py): per condition, mean ± standard
deviation over seeds; JREG − baseline per seed (the same seed: the same initialisation and data order), with a
two-sided 95% t interval of the mean difference (n − 1 degrees of freedom).
"""
import glob
import json
import math
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KJV = os.path.join(ROOT, "results", "kjv")
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
CONDITIONS = {"base": "baseline", "jreg_a1": "JREG α = 1", "jreg_a3": "JREG α = 3"}
# metric: (label, digits, function of a run's profile)
METRICS = {"val_loss": ("val loss", 4, lambda p: p["loss"]),
           "psi_L": ("Ψ_L", 4, lambda p: p["psi"][-1]),
           "zeta_L": ("ζ_L", 2, lambda p: p["zeta"][-1]),
           "zeta_L2": ("ζ_{L−2}", 2, lambda p: p["zeta"][-3]),
           "psi_mid": ("mean Ψ, layers 2..L−2", 4, lambda p: sum(p["psi"][1:-2]) / len(p["psi"][1:-2])),
           "zeta_L_normed": ("ζ_L (normed h_L)", 2, lambda p: p["zeta_normed"][-1])}


def seed_runs():
    """{condition: {seed: run record}} of results/kjv/seeds/."""
    runs = {c: {} for c in CONDITIONS}
    for path in sorted(glob.glob(os.path.join(KJV, "seeds", "*.json"))):
        run = json.load(open(path))
        runs[run["condition"]][run["seed"]] = run
    return runs


def mean_sd(values):
    m = sum(values) / len(values)
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else float("nan")
    return m, sd


def t_interval(values):
    """(mean, low, high): the two-sided 95% t interval of the mean."""
    m, sd = mean_sd(values)
    half = T975[len(values) - 1] * sd / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return m, m - half, m + half


def stats(runs):
    """{metric: {condition: values by seed}}, the seeds every condition has, sorted."""
    seeds = sorted(set.intersection(*(set(r) for r in runs.values())))
    return seeds, {m: {c: [f(runs[c][s]["profile"]) for s in seeds] for c in CONDITIONS}
                   for m, (_, _, f) in METRICS.items()}


def fmt(value, digits, sign=False):
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def seed_table(seeds, values):
    head = "| condition | " + " | ".join(METRICS[m][0] for m in METRICS) + " |"
    lines = [head, "|---" * (len(METRICS) + 1) + "|"]
    for c, name in CONDITIONS.items():
        cells = []
        for m, (_, digits, _) in METRICS.items():
            mean, sd = mean_sd(values[m][c])
            cells.append(f"{fmt(mean, digits)} ± {fmt(sd, digits)}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + f"\n\nMean ± standard deviation over {len(seeds)} seeds ({', '.join(map(str, seeds))})."


def paired_table(seeds, values):
    lines = ["| JREG − baseline, same seed | " + " | ".join(METRICS[m][0] for m in METRICS) + " |",
             "|---" * (len(METRICS) + 1) + "|"]
    for c in ("jreg_a1", "jreg_a3"):
        cells = []
        for m, (_, digits, _) in METRICS.items():
            diff = [a - b for a, b in zip(values[m][c], values[m]["base"])]
            mean, low, high = t_interval(diff)
            cells.append(f"{fmt(mean, digits, True)} [{fmt(low, digits, True)}, {fmt(high, digits, True)}]")
        lines.append(f"| {CONDITIONS[c]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + (f"\n\nMean difference over the {len(seeds)} seeds and its two-sided 95% t interval "
                               f"({len(seeds) - 1} degrees of freedom).")


def run_table(runs):
    lines = ["| condition | seed | " + " | ".join(METRICS[m][0] for m in METRICS) + " | training s |",
             "|---" * (len(METRICS) + 3) + "|"]
    for c, by_seed in runs.items():
        for seed, run in by_seed.items():
            cells = [fmt(f(run["profile"]), digits) for _, digits, f in METRICS.values()]
            lines.append(f"| {CONDITIONS[c]} | {seed} | " + " | ".join(cells) + f" | {run['train_seconds']} |")
    return "\n".join(lines)


def finding(seeds, values):
    """The README's sentence: what the intervals support."""
    n = len(seeds)
    base, a1 = (mean_sd(values["zeta_L"][c]) for c in ("base", "jreg_a1"))
    loss = t_interval([a - b for a, b in zip(values["val_loss"]["jreg_a1"], values["val_loss"]["base"])])
    zeta = t_interval([a - b for a, b in zip(values["zeta_L"]["jreg_a1"], values["zeta_L"]["base"])])
    verdict = ("the interval holds 0: no difference in validation loss is detected, and a cost or a gain as large as "
               f"{max(abs(loss[1]), abs(loss[2])):.4f} is not ruled out" if loss[1] <= 0 <= loss[2] else
               ("JREG's validation loss is higher" if loss[1] > 0 else "JREG's validation loss is lower") +
               " than the baseline's at 95%")
    return (f"Over {n} seeds, JREG (λ = 1, α = 1) takes the final-layer jump rate ζ_L from {base[0]:.2f} ± {base[1]:.2f} "
            f"to {a1[0]:.2f} ± {a1[1]:.2f} (paired difference {zeta[0]:+.2f}, 95% t interval [{zeta[1]:+.2f}, "
            f"{zeta[2]:+.2f}]). Its validation loss differs from the baseline's by {loss[0]:+.4f} "
            f"[{loss[1]:+.4f}, {loss[2]:+.4f}]: {verdict}.")


def plots(runs, seeds, values):
    """psi_profiles.png: Ψ per layer, mean over seeds with a band of ± one standard deviation, layers 2..L (Ψ_1, the
    embedding's first update, is ~0.23 in every run and would flatten the rest); zeta_over_training.png: ζ_L of the
    periodic evals (raw h_L, the runs' validation windows), every seed a thin line, the mean a thick one."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = {"base": "tab:gray", "jreg_a1": "tab:blue", "jreg_a3": "tab:orange"}
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for c, name in CONDITIONS.items():
        profiles = [runs[c][s]["profile"]["psi"] for s in seeds]
        layers = list(range(2, len(profiles[0]) + 1))
        stat = [mean_sd([p[l - 1] for p in profiles]) for l in layers]
        mean = [m for m, _ in stat]
        ax.plot(layers, mean, marker="o", color=colors[c], label=f"{name} (Ψ_1 = "
                f"{mean_sd([p[0] for p in profiles])[0]:.2f}, not drawn)")
        ax.fill_between(layers, [m - s for m, s in stat], [m + s for m, s in stat], color=colors[c], alpha=0.2)
    ax.set(xlabel="layer l", ylabel="Ψ_l (raw h_L, 32,768 val tokens)",
           title=f"The final-layer jump and JREG: KJV, 8 layers, mean ± sd over {len(seeds)} seeds")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(KJV, "psi_profiles.png"), dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for c, name in CONDITIONS.items():
        curves = [[(e["step"], e["zeta"][-1]) for e in runs[c][s]["evals"]] for s in seeds]
        for curve in curves:
            ax.plot(*zip(*curve), color=colors[c], alpha=0.3, linewidth=0.8)
        steps = [x for x, _ in curves[0]]
        ax.plot(steps, [sum(cv[i][1] for cv in curves) / len(curves) for i in range(len(steps))], color=colors[c],
                linewidth=2.2, label=f"{name}: mean of {len(curves)} seeds")
    ax.set(xlabel="training step", ylabel="ζ_L (%, raw h_L)", title="ζ_L over training, every seed (thin) and the mean")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(KJV, "zeta_over_training.png"), dpi=120)
    plt.close(fig)


def retrofit_finding():
    """SmolLM2-135M-Instruct before and after 245,760 tokens of continued pre-training on the KJV (one run each), on
    the same 16,384 KJV validation tokens in its own tokenizer (windows of 256) and the same 8 tasks (50 documents
    each): results/retrofit/."""
    load = lambda name: json.load(open(os.path.join(ROOT, "results", "retrofit", f"{name}.json")))   # noqa: E731
    before, base, jreg, normed = (load(n) for n in ("before", "after_base", "after_jreg", "after_jreg_normed"))
    z = lambda r, key="zeta": r["profile"][key][-1]                                                   # noqa: E731
    loss = lambda r: r["profile"]["loss"] - base["profile"]["loss"]                                  # noqa: E731
    acc = lambda r: r["average"]["acc"] - before["average"]["acc"]                                   # noqa: E731
    return (f"Continued pre-training of SmolLM2-135M-Instruct for 245,760 tokens (one run each, so no interval): "
            f"with JREG on the raw h_L its raw ζ_L goes {z(before):.2f} → {z(jreg):.2f} (the baseline run's "
            f"{z(base):.2f}) for {loss(jreg):+.3f} in validation loss against the baseline run, but its normed ζ_L does "
            f"not fall ({z(before, 'zeta_normed'):.2f} → {z(jreg, 'zeta_normed'):.2f}); the penalty on the normed h_L "
            f"takes that one to {z(normed, 'zeta_normed'):.2f} (the baseline run's {z(base, 'zeta_normed'):.2f}) for "
            f"{loss(normed):+.3f}. All three runs lose task accuracy against the source model (mean over 8 tasks, 50 "
            f"documents each: baseline {acc(base):+.3f}, JREG {acc(jreg):+.3f}, JREG on the normed h_L "
            f"{acc(normed):+.3f}); ζ here is on 16,384 KJV validation tokens in windows of 256.")


def smollm2_finding():
    p = json.load(open(os.path.join(ROOT, "results", "smollm2", "profile.json")))
    cfg, prof = p["config"], p["profile"]
    return (f"SmolLM2-135M-Instruct, a real open-weight Llama, has ζ_L = {prof['zeta'][-1]:.2f} on the raw h_L and "
            f"{prof['zeta_normed'][-1]:.2f} on the final-normed one ({prof['n_tokens']:,} tokens of Genesis in windows "
            f"of {cfg['seq_len']}; other text moves these numbers, so compare them only on the same windows).")


def blocks():
    """{name: generated text} of every block."""
    runs = seed_runs()
    seeds, values = stats(runs)
    return {"kjv-seeds": seed_table(seeds, values), "kjv-paired": paired_table(seeds, values),
            "kjv-runs": run_table(runs), "kjv-finding": finding(seeds, values),
            "retrofit-finding": retrofit_finding(), "smollm2-finding": smollm2_finding()}, (runs, seeds, values)


MARKER = re.compile(r"(<!-- results/collect\.py: ([\w-]+) -->\n)((?:(?!<!-- )[\s\S])*?)(\n<!-- end -->)")


def rewrite(text, generated, path, stale):
    def one(m):
        if m.group(2) not in generated:
            raise SystemExit(f"error: {path}: no block {m.group(2)!r} (blocks: {', '.join(generated)})")
        if m.group(3) != generated[m.group(2)]:
            stale.append(f"{os.path.relpath(path, ROOT)}: {m.group(2)}")
        return m.group(1) + generated[m.group(2)] + m.group(4)
    return MARKER.sub(one, text)


def main(argv):
    check = "--check" in argv
    generated, (runs, seeds, values) = blocks()
    stale = []
    for path in [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))):
        text = open(path).read()
        new = rewrite(text, generated, path, stale)
        if new != text and not check:
            open(path, "w").write(new)
    if check:
        if stale:
            print("stale blocks (run python results/collect.py):\n  " + "\n  ".join(stale))
            return 1
        return 0
    plots(runs, seeds, values)
    print("\n\n".join(generated.values()))
    print("rewrote: " + (", ".join(stale) or "nothing changed"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
