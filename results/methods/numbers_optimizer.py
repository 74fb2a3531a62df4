"""
The optimizer study of docs/optimizer.md, from the methods comparison's runs (results/methods/{sweep,table}/, made by
run_comparison.py): {AdamW, Muon} × {baseline, JREG λ = 1, α = 1}, each at its own lr (the held-out sweep's pick),
paired over the tables' seeds (the same initialisation and data order), with the tests of numbers_comparison.py (ζ_L by
the exact sign-flip test; Holm's correction within a column, across the four comparisons).

    sweep()      Muon's lr beside AdamW's: the held-out sweep's rows of the four conditions
    table()      the four conditions' means, and the four paired comparisons
    over_time()  ζ_L over training (the runs' periodic evals), each condition's mean at each eval
    finding()    what the table says, in two sentences (readme(): the README's one)
    figure()     the figure's line in docs/optimizer.md, once it is drawn
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
    """{condition: {seed: run}} of the four at their own lrs, paired by seed with the baseline's arithmetic, or None
    while the sweep has not picked every lr (numbers_comparison.picked_runs)."""
    return NC.picked_runs(list(FOUR))


def own_lrs():
    """{condition: the held-out sweep's pick} of the four."""
    return {c: lr for c, (lr, _) in RC.picks(RC.load("sweep"), list(FOUR)).items()}


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
    lrs = {c: NC.lr_text(lr) for c, lr in own_lrs().items()}
    head = "| " + " | ".join(label for label, *_ in NC.METRICS.values()) + " |"
    lines = ["| condition | lr | seeds " + head, "|---" * (len(NC.METRICS) + 3) + "|"]
    for c, name in FOUR.items():
        lines.append(f"| {name} (mean ± sd) | {lrs[c]} | {len(by[c])} | " + " | ".join(
            NC.mean_sd([f(r["profile"]) for r in by[c].values()], d) for _, d, f, _ in NC.METRICS.values()) + " |")
    lines += ["| paired difference | lrs | seeds " + head, "|---" * (len(NC.METRICS) + 3) + "|"]
    for label, v in rows.items():
        a, b = COMPARED[label]
        lines.append(f"| {label} | {lrs[a]}, {lrs[b]} | {len(v)} | "
                     + " | ".join(texts.get((label, m), "") for m in NC.METRICS) + " |")
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


def profile():
    """The mean Ψ_ℓ per layer over the seeds, each condition at its own lr (the figure's left panel, in numbers)."""
    by = runs()
    if not by or not all(by.values()):
        return "No runs yet: python results/methods/run_comparison.py table."
    mean = {c: mean_psi(by, c) for c in FOUR}
    layers = range(1, len(mean["base"]) + 1)
    lines = ["| mean Ψ_ℓ | seeds | " + " | ".join(f"ℓ = {layer}" for layer in layers) + " |",
             "|---" * (len(layers) + 2) + "|"]
    lines += [f"| {name} | {len(by[c])} | " + " | ".join(f"{x:.4f}" for x in mean[c]) + " |"
              for c, name in FOUR.items()]
    tokens = next(iter(by["base"].values()))["profile"]["n_tokens"]
    return "\n".join(lines) + (f"\n\nevaluate.py's profile of each run at its last step (the first {tokens:,} "
                               "validation tokens), the mean over the seeds; ζ_L = 100 · max(0, Ψ_L − Ψ_{L−1}).")


def complete():
    """runs() when every condition has a run on every seed of the tables, else None."""
    return NC.complete(runs())


def mean_psi(by, c):
    """The mean Ψ profile over a condition's seeds."""
    profiles = [r["profile"]["psi"] for r in by[c].values()]
    return [sum(col) / len(col) for col in zip(*profiles)]


def largest(by, c):
    """The layer ℓ ≥ 3 where the mean Ψ profile over the seeds rises most, Ψ_ℓ − Ψ_{ℓ−1}: where the jump is (ℓ = 2
    left out: its rise is over Ψ_1, the embedding's first step)."""
    mean = mean_psi(by, c)
    return max(range(3, len(mean) + 1), key=lambda layer: mean[layer - 1] - mean[layer - 2])


def middle(by, c):
    """The mean over layers 2..L−1 of the seeds' mean Ψ_ℓ: how far the stream moves through the middle layers."""
    mean = mean_psi(by, c)
    return sum(mean[1:-1]) / len(mean[1:-1])


def finding(short=False):
    """Three sentences from the table's runs: whether Muon removes, keeps or moves the baseline's jump (ζ_L under each
    optimizer, the exact sign-flip test with Holm's correction across the four comparisons, and the layer where the
    mean Ψ rises most), what JREG does under Muon, and how far the stream moves through the middle layers; short: the
    README's one."""
    by = complete()
    if by is None:
        return ("The study of AdamW and Muon, with and without JREG, is under way (results/methods/run_comparison.py)."
                if short else "Not yet: the runs are under way (python results/methods/run_comparison.py table).")
    zeta, loss = NC.METRICS["zeta_L"][2], NC.METRICS["val_loss"][2]
    diff = lambda a, b, f: [f(by[a][s]["profile"]) - f(by[b][s]["profile"]) for s in by[a]]    # noqa: E731
    p = dict(zip(COMPARED, S.holm([S.sign_flip_p(diff(a, b, zeta)) for a, b in COMPARED.values()])))
    mean = {c: S.mean_sd([zeta(r["profile"]) for r in by[c].values()]) for c in FOUR}
    d, held = S.bootstrap_interval(diff("muon", "base", zeta)), p["Muon − AdamW"] < 0.05
    where = {c: largest(by, c) for c in ("base", "muon")}
    verdict = ("no difference in ζ_L between the optimizers is detected" if not held else
               "Muon removes the jump by itself" if d[0] < 0 and mean["muon"][0] < 0.1 * mean["base"][0] else
               "Muon shrinks the jump" if d[0] < 0 else "Muon enlarges the jump")
    moved = (f", and the largest rise of the mean Ψ_ℓ over Ψ_{{ℓ−1}} (ℓ ≥ 3) moves from layer {where['base']} to "
             f"{where['muon']}" if where["base"] != where["muon"] else
             f", the largest rise of the mean Ψ_ℓ over Ψ_{{ℓ−1}} (ℓ ≥ 3) at layer {where['muon']} under both")
    zero = sum(round(zeta(r["profile"]), 2) == 0 for r in by["muon_jreg"].values())
    lt = S.t_interval(diff("muon", "base", loss))
    total = diff("muon", "base", NC.METRICS["psi_total"][2])
    mid = {c: middle(by, c) for c in ("base", "muon")}
    spread = (f" Muon's total Ψ (layers 2..L) differs from AdamW's by {NC.interval(S.t_interval(total), 4)} "
              f"({NC.p_text(S.t_p(total))}), its mean Ψ_ℓ over layers 2..L−1 is {mid['muon']:.4f} against "
              f"{mid['base']:.4f}: the stream moves {'more' if mid['muon'] > mid['base'] else 'less'} through the "
              "middle layers.")
    if short:
        return (f"Over {len(RC.SEEDS)} seeds at 300 steps, the baseline's ζ_L is {mean['base'][0]:.2f} under AdamW and "
                f"{mean['muon'][0]:.2f} under Muon: {verdict}{moved}; JREG under Muon ends with ζ_L = 0.00 in {zero} "
                f"of {len(by['muon_jreg'])} seeds.")
    lrs = own_lrs()
    own = ", ".join(f"{name} {NC.lr_text(lrs[c])}" for c, name in FOUR.items())
    return (f"Over {len(RC.SEEDS)} seeds, each condition at its own lr ({own}), the baseline's ζ_L is "
            f"{mean['base'][0]:.2f} ± {mean['base'][1]:.2f} under AdamW and {mean['muon'][0]:.2f} ± "
            f"{mean['muon'][1]:.2f} under Muon (Muon − AdamW {NC.interval(d, 2)}, Holm-adjusted "
            f"p={p['Muon − AdamW']:.3f}): {verdict}{moved}. With JREG, ζ_L "
            f"is {mean['jreg_a1'][0]:.2f} under AdamW and {mean['muon_jreg'][0]:.2f} under Muon (0.00 in {zero} of "
            f"{len(by['muon_jreg'])} seeds; JREG − baseline under Muon Holm-adjusted p="
            f"{p['JREG − baseline, Muon']:.3f}), and Muon's baseline differs from AdamW's in validation loss by "
            f"{NC.interval(lt, 4)} ({NC.p_text(S.t_p(diff('muon', 'base', loss)))}).{spread}")


def readme():
    return finding(short=True)


def figure():
    """The figure's line, once the runs to draw it exist (plot())."""
    if complete() is None:
        return "Not drawn yet: the runs are under way."
    return ("![Ψ per layer and ζ_L over training, AdamW and Muon with and without JREG]"
            "(../results/methods/optimizer.png)")


def plot(path=FIGURE):
    """Ψ per layer (the mean profile) and ζ_L over training, the four conditions, in lib/style.py's colours."""
    by = complete()
    if by is None:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
    from lib.style import LABELS, legend, line_styles, psi_per_layer, save
    styles = line_styles(list(FOUR))
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 3.8), layout="constrained")
    for c, name in FOUR.items():
        mean = mean_psi(by, c)
        label = f"{LABELS[c]}, AdamW" if c in LABELS else name.replace("JREG", r"JREG $\alpha$ = 1")
        left.plot(range(1, len(mean) + 1), mean, label=f"{label} ({len(by[c])} seeds)", **styles[c])
        steps = [e["step"] for e in next(iter(by[c].values()))["evals"] if e["step"] > 0]
        right.plot(steps, [sum(next(e for e in r["evals"] if e["step"] == step)["zeta"][-1] for r in by[c].values())
                           / len(by[c]) for step in steps], **styles[c])
    left.set_xticks(range(1, len(mean) + 1))                                  # layers: whole numbers
    psi_per_layer(left)
    right.set(xlabel="step", ylabel=r"mean $\zeta_L$ (%)", title=r"$\zeta_L$ over training")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    legend(fig, *left.get_legend_handles_labels())
    return save(fig, path)


BLOCKS = {"optimizer-sweep": sweep, "optimizer-table": table, "optimizer-profile": profile,
          "optimizer-over-time": over_time,
          "optimizer-finding": finding, "optimizer-figure": figure, "optimizer-readme": readme}

if __name__ == "__main__":
    for block in BLOCKS.values():
        print(block(), end="\n\n")
    print(plot())
