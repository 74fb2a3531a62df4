"""
The optimizer study of docs/optimizer.md, from the methods comparison's runs (results/methods/{sweep,table}/, made by
run_comparison.py): {AdamW, Muon} × {baseline, JREG λ = 1, α = 1}, each at its own lr (the held-out sweep's pick),
paired over the tables' seeds (the same initialisation and data order), with the tests of numbers_comparison.py (ζ_L by
the exact sign-flip test; Holm's correction within a column, across the four comparisons).

    sweep()      Muon's lr beside AdamW's: the held-out sweep's rows of the four conditions
    table()      the four conditions' means, and the four paired comparisons
    over_time()  ζ_L over training (the runs' periodic evals), each condition's mean at each eval
    plot()       results/methods/optimizer.png: Ψ per layer and ζ_L over training, the four conditions

    python results/methods/numbers_optimizer.py
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import numbers_comparison as NC  # noqa: E402
import run_comparison as RC  # noqa: E402
import stats as S  # noqa: E402

FOUR = {"base": "AdamW", "jreg_a1": "AdamW + JREG", "muon": "Muon", "muon_jreg": "Muon + JREG"}
COMPARED = {"Muon − AdamW": ("muon", "base"), "Muon + JREG − AdamW + JREG": ("muon_jreg", "jreg_a1"),
            "JREG − baseline, AdamW": ("jreg_a1", "base"), "JREG − baseline, Muon": ("muon_jreg", "muon")}
FIGURE = os.path.join(HERE, "optimizer.png")


def runs():
    """({condition: {seed: run}} of the four at their own lrs, on one arithmetic per seed (the baseline's), or None
    while the sweep has not picked every lr)."""
    chosen = RC.picks(RC.load("sweep"), list(FOUR))
    if not all(done for _, done in chosen.values()):
        return None
    table = RC.load("table")
    out = {c: {} for c in FOUR}
    for s in RC.SEEDS:
        base = table.get(RC.name("base", chosen["base"][0], s))
        for c in FOUR:
            r = table.get(RC.name(c, chosen[c][0], s))
            if r and base and r["machine"]["arithmetic"] == base["machine"]["arithmetic"]:
                out[c][s] = r
    return out


def sweep():
    return NC.sweep(list(FOUR))


def table():
    by = runs()
    if by is None:
        return "Not yet: the lr sweep is under way (python results/methods/run_comparison.py sweep)."
    if not all(by.values()):
        return "No runs yet: python results/methods/run_comparison.py table."
    rows = {label: {s: (by[a][s], by[b][s]) for s in sorted(set(by[a]) & set(by[b]))}
            for label, (a, b) in COMPARED.items()}
    texts, power = NC.cells({k: v for k, v in rows.items() if len(v) > 1})
    head = "| " + " | ".join(label for label, *_ in NC.METRICS.values()) + " |"
    lines = ["| condition | seeds " + head, "|---" * (len(NC.METRICS) + 2) + "|"]
    for c, name in FOUR.items():
        lines.append(f"| {name} (mean ± sd) | {len(by[c])} | " + " | ".join(
            "{:.{d}f} ± {:.{d}f}".format(*S.mean_sd([f(r["profile"]) for r in by[c].values()]), d=d)
            for _, d, f, _ in NC.METRICS.values()) + " |")
    lines += ["| paired difference | seeds " + head, "|---" * (len(NC.METRICS) + 2) + "|"]
    for label, v in rows.items():
        lines.append(f"| {label} | {len(v)} | " + " | ".join(texts.get((label, m), "") for m in NC.METRICS) + " |")
    power_line = "; ".join(f"{NC.METRICS[m][0].split(' (')[0]} {d:.{NC.METRICS[m][1]}f}" for m, (_, d, _) in
                           power.items())
    return "\n".join(lines) + (
        "\n\nEach at its own lr (the held-out sweep's pick). A difference: the first condition's value minus the "
        "second's of the same seed, the mean over the seeds, [its 95% interval] and p, as in the methods table (ζ_L: "
        "the exact sign-flip test and a bootstrap interval; the others: the paired t test); * survives Holm's "
        f"correction within its column, across these {len(rows)} comparisons. The smallest difference the paired t "
        f"test detects with 80% power at 0.05: {power_line}.")


def over_time():
    """ζ_L at each eval of training (every 50 steps), each condition's mean over its seeds."""
    by = runs()
    if not by or not all(by.values()):
        return "No runs yet: python results/methods/run_comparison.py table."
    steps = [e["step"] for e in next(iter(by["base"].values()))["evals"] if e["step"] > 0]
    lines = ["| ζ_L at step | " + " | ".join(map(str, steps)) + " |", "|---" * (len(steps) + 1) + "|"]
    for c, name in FOUR.items():
        means = [sum(next(e for e in r["evals"] if e["step"] == step)["zeta"][-1] for r in by[c].values())
                 / len(by[c]) for step in steps]
        lines.append(f"| {name} | " + " | ".join(f"{m:.2f}" for m in means) + " |")
    return "\n".join(lines) + ("\n\nThe mean over the seeds of ζ_L in train.py's periodic evaluation (its validation "
                               "batches), each condition at its own lr.")


def plot(path=FIGURE):
    """Ψ per layer (the mean profile) and ζ_L over training, the four conditions, in lib/style.py's colours."""
    by = runs()
    if not by or not all(by.values()):
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
    from lib.style import DPI, legend, line_styles
    styles = line_styles(list(FOUR))
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 3.8), layout="constrained")
    for c, name in FOUR.items():
        profiles = [r["profile"]["psi"] for r in by[c].values()]
        mean = [sum(col) / len(col) for col in zip(*profiles)]
        left.plot(range(1, len(mean) + 1), mean, label=f"{name} ({len(profiles)} seeds)", **styles[c])
        steps = [e["step"] for e in next(iter(by[c].values()))["evals"] if e["step"] > 0]
        right.plot(steps, [sum(next(e for e in r["evals"] if e["step"] == step)["zeta"][-1] for r in by[c].values())
                           / len(by[c]) for step in steps], **styles[c])
    left.set(xlabel=r"layer $\ell$", ylabel=r"mean $\Psi_\ell$ over seeds", title=r"$\Psi_\ell$ per layer")
    right.set(xlabel="step", ylabel=r"mean $\zeta_L$ (%)", title=r"$\zeta_L$ over training")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    legend(fig, *left.get_legend_handles_labels())
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


BLOCKS = {"optimizer-sweep": sweep, "optimizer-table": table, "optimizer-over-time": over_time}

if __name__ == "__main__":
    for block in BLOCKS.values():
        print(block(), end="\n\n")
    print(plot())
