"""
The numbers README.md and docs/reproduction.md quote, from results/kjv/: the seed study (seeds/*.json, made by
results/kjv/run_seeds.py), with per condition mean ± standard deviation over seeds and JREG − baseline per seed (the
same seed: the same initialisation and data order) with a two-sided 95% t interval of the mean difference (n − 1
degrees of freedom; results/stats.py); the 600-step runs of two seeds; the drift other CPUs gave (other_cpus.json); the
quick start's fresh-clone run. results/collect.py writes them; plots() draws the seed study's two figures.
"""
import functools
import glob
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stats import holm, mean_sd, t_interval, t_p  # noqa: E402,F401  (scipy.stats: results/stats.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KJV = os.path.join(ROOT, "results", "kjv")
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


def p_text(p):
    return "p<0.001" if p < 0.001 else f"p={p:.3f}"


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


def paired_table(seeds, values, fam):
    lines = ["| JREG − baseline, same seed | " + " | ".join(METRICS[m][0] for m in METRICS) + " |",
             "|---" * (len(METRICS) + 1) + "|"]
    for c in ("jreg_a1", "jreg_a3"):
        cells = []
        for m, (_, digits, _) in METRICS.items():
            diff = [a - b for a, b in zip(values[m][c], values[m]["base"])]
            mean, low, high = t_interval(diff)
            cells.append(f"{fmt(mean, digits, True)} [{fmt(low, digits, True)}, {fmt(high, digits, True)}] "
                         f"{p_text(fam[c, m][1])}{'*' if fam[c, m][2] < 0.05 else ''}")
        lines.append(f"| {CONDITIONS[c]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + (f"\n\nMean difference over the {len(seeds)} seeds, its two-sided 95% t interval "
                               f"({len(seeds) - 1} degrees of freedom) and the paired t test's p; * where it survives "
                               f"Holm's correction at 0.05 over the seed study's {len(fam)} comparisons (this table's, "
                               f"the layer table's and α = 3's two).")


def run_table(runs):
    lines = ["| condition | seed | " + " | ".join(METRICS[m][0] for m in METRICS) + " | training s |",
             "|---" * (len(METRICS) + 3) + "|"]
    for c, by_seed in runs.items():
        for seed, run in by_seed.items():
            cells = [fmt(f(run["profile"]), digits) for _, digits, f in METRICS.values()]
            lines.append(f"| {CONDITIONS[c]} | {seed} | " + " | ".join(cells) + f" | {run['train_seconds']} |")
    return "\n".join(lines)


def paired(runs, seeds, f, cond, ref="base"):
    """(mean, low, high) of f(cond's profile) − f(ref's profile), seed by seed, and in how many seeds it is below 0."""
    diff = [f(runs[cond][s]["profile"]) - f(runs[ref][s]["profile"]) for s in seeds]
    return t_interval(diff), sum(d < 0 for d in diff)


def interval(t, digits):
    return f"{t[0]:+.{digits}f} [{t[1]:+.{digits}f}, {t[2]:+.{digits}f}]"


def loss_verdict(loss):
    """What a paired interval of JREG − baseline validation loss allows, each side said as what it is."""
    mean, low, high = loss
    if low <= 0 <= high:
        return (f"The interval holds 0: no difference in validation loss is detected; the data allow a cost of up to "
                f"{high:.4f} or a gain of up to {-low:.4f}")
    if low > 0:
        return f"JREG's validation loss is higher than the baseline's at 95%: a cost of {low:.4f} to {high:.4f}"
    return f"JREG's validation loss is lower than the baseline's at 95%: a gain of {-high:.4f} to {-low:.4f}"


def finding(runs, seeds, values):
    """The README's sentence: what the intervals support."""
    n, fam = len(seeds), family(runs, seeds)
    base, a1 = (mean_sd(values["zeta_L"][c]) for c in ("base", "jreg_a1"))
    loss = t_interval([a - b for a, b in zip(values["val_loss"]["jreg_a1"], values["val_loss"]["base"])])
    zeta = t_interval([a - b for a, b in zip(values["zeta_L"]["jreg_a1"], values["zeta_L"]["base"])])
    jreg = [v for c in ("jreg_a1", "jreg_a3") for v in values["zeta_L"][c]]
    if all(v == 0 for v in jreg) and all(v > 0 for v in values["zeta_L"]["base"]):
        margins = [(runs[c][s]["profile"]["psi"][-2] - runs[c][s]["profile"]["psi"][-1], c, s)
                   for c in ("jreg_a1", "jreg_a3") for s in seeds]
        margin, c, s = min(margins)
        psi = mean_sd(values["psi_L"]["jreg_a1"])
        zeta_text = (f"All {len(jreg)} JREG runs (both α) end with ζ_L at exactly 0 and all {n} baselines above 0 "
                     f"({min(values['zeta_L']['base']):.2f}–{max(values['zeta_L']['base']):.2f}; {n} of {n} alone is "
                     f"a sign test's p = {sign_p(n):.4f}); with the JREG arm constant, the paired 95% t interval "
                     f"({zeta[0]:+.2f} [{zeta[1]:+.2f}, {zeta[2]:+.2f}], {n - 1} degrees of freedom; "
                     f"{tested(fam, ('jreg_a1', 'zeta_L'))} over the seed study's {len(fam)} comparisons) is the "
                     f"baselines' own spread. ζ_L = 0 means Ψ_L ≤ Ψ_{{L−1}} (by at least {margin:.5f}, "
                     f"{CONDITIONS[c]}'s seed {s}), not that the last block stands still (α = 1's Ψ_L = "
                     f"{psi[0]:.4f} ± {psi[1]:.4f})")
    else:
        zeta_text = f"The paired difference in ζ_L is {zeta[0]:+.2f}, 95% t interval [{zeta[1]:+.2f}, {zeta[2]:+.2f}]"
    return (f"Over {n} seeds, JREG (λ = 1, α = 1) takes the final-layer jump rate ζ_L from {base[0]:.2f} ± {base[1]:.2f} "
            f"to {a1[0]:.2f} ± {a1[1]:.2f} (mean ± sd). {zeta_text}. Its validation loss differs from the "
            f"baseline's by {interval(loss, 4)} ({p_text(fam['jreg_a1', 'val_loss'][1]).replace('=', ' = ')}). "
            f"{loss_verdict(loss)}.")


def largest_step(psi):
    """The layer l (2..L) of the largest Ψ_l − Ψ_{l−1}."""
    steps = [psi[l - 1] - psi[l - 2] for l in range(2, len(psi) + 1)]
    return 2 + steps.index(max(steps))


def alpha3_stats(runs, seeds):
    """α = 3 against α = 1 (Ψ_{L−1}) and against the baseline (the jump at L−1, ζ_{L−2}) over the seeds, the seeds in
    which its largest step is at L−1, and whether all of it shows the jump moved one layer down."""
    n, L = len(seeds), runs["base"][seeds[0]]["profile"]["n_layer"]
    more, below = paired(runs, seeds, lambda p: p["psi"][-2], "jreg_a3", "jreg_a1")
    jump, _ = paired(runs, seeds, JUMP_L1, "jreg_a3")
    zeta2, _ = paired(runs, seeds, lambda p: p["zeta"][-3], "jreg_a3")
    largest = sum(largest_step(runs["jreg_a3"][s]["profile"]["psi"]) == L - 1 for s in seeds)
    moved = jump[1] > 0 and zeta2[1] > 0 and largest == n
    return more, n - below, jump, zeta2, largest, moved


def alpha3_finding(runs, seeds, values):
    """What the seeds say of α = 3 (about 95% of the weight on layer L) below the last layer: whether the jump moves
    one layer down, said only where the seeds show it."""
    n, fam = len(seeds), family(runs, seeds)
    more, above, jump, zeta2, largest, moved = alpha3_stats(runs, seeds)
    z2 = {c: mean_sd(values["zeta_L2"][c])[0] for c in ("base", "jreg_a3")}
    side = (f"its Ψ_{{L−1}} exceeds α = 1's in {above} of {n} seeds ({interval(more, 4)}, "
            f"{tested(fam, ('jreg_a3', 'psi_L1_vs_a1'))})" if more[1] > 0 else
            f"its Ψ_{{L−1}} is not clearly above α = 1's ({interval(more, 4)}, higher in {above} of {n} seeds)")
    verdict = ("these seeds show the jump moved one layer down" if moved else
               "these seeds do not show the jump moved one layer down")
    return (f"α = 3 (about 95% of the weight on layer L) {'leaves more' if more[1] > 0 else 'need not leave more'} "
            f"displacement to the block below the last: {side}. {verdict[0].upper() + verdict[1:]}: its jump at layer "
            f"L−1 (ζ_{{L−1}} − ζ_L) differs from the baseline's by {interval(jump, 2)} ({p_text(fam['jreg_a3', 'jump_L1'][1]).replace('=', ' = ')}), its step at L−1 is its largest "
            f"in {largest} of {n} seeds, and its ζ_{{L−2}} ({z2['jreg_a3']:.2f}) is "
            f"{'below' if z2['jreg_a3'] < z2['base'] else 'above'} the baseline's ({z2['base']:.2f}; "
            f"{interval(zeta2, 2)}).")


LAYER_ROWS = {   # name: (label, digits, function of a profile)
    "skip_L": ("loss increase when block L is skipped (nats)", 3, lambda p: p["skip_block_loss_increase"][-1]),
    "lens_mid": ("mean logit-lens loss of h_3..h_{L−1} (nats)", 3,
                 lambda p: sum(p["logit_lens_loss"][3:-1]) / len(p["logit_lens_loss"][3:-1])),
    "psi_total": ("total Ψ, layers 2..L", 4, lambda p: sum(p["psi"][1:])),
    "psi_mid": ("mean Ψ, layers 2..L−2", 4, lambda p: sum(p["psi"][1:-2]) / len(p["psi"][1:-2])),
}


def JUMP_L1(p):
    """The jump at layer L−1: ζ_{L−1} − ζ_L = 100 · max(0, Ψ_{L−1} − Ψ_{L−2})."""
    return p["zeta"][-2] - p["zeta"][-1]


def family(runs, seeds):
    """Every comparison of the seed study that the pages print, {(condition, metric): (t interval, p, Holm's p)}: JREG
    (α = 1 and α = 3) − baseline for each metric of the paired and the layer tables, and α = 3's two comparisons of the
    layer below the last (Ψ_{L−1} against α = 1, the jump at L−1 against the baseline); Holm's correction is over all
    of them, the family a reader scans."""
    fs = {m: f for rows in (METRICS, LAYER_ROWS) for m, (_, _, f) in rows.items()}
    pairs = {(c, m): (f, c, "base") for c in ("jreg_a1", "jreg_a3") for m, f in fs.items()}
    pairs["jreg_a3", "psi_L1_vs_a1"] = (lambda p: p["psi"][-2], "jreg_a3", "jreg_a1")
    pairs["jreg_a3", "jump_L1"] = (JUMP_L1, "jreg_a3", "base")
    rows = {}
    for key, (f, c, ref) in pairs.items():
        diff = [f(runs[c][s]["profile"]) - f(runs[ref][s]["profile"]) for s in seeds]
        rows[key] = (t_interval(diff), t_p(diff))
    return {key: (t, p, a) for (key, (t, p)), a in zip(rows.items(), holm([p for _, p in rows.values()]))}


def tested(fam, key):
    """A comparison's p and whether it survives Holm's correction over the family, as the text says it."""
    _, p, adjusted = fam[key]
    said = p_text(p).replace("=", " = ").replace("<", " < ")
    return f"{said}, {'' if adjusted < 0.05 else 'not '}surviving Holm's correction"


def sign_p(n):
    """The two-sided sign test's p when all n paired differences have one sign: 2 · 0.5^n."""
    return 2 * 0.5 ** n


def layer_table(runs, seeds):
    """The seed runs' layer analysis, JREG − baseline of the same seed: what skipping the last block costs, how well the
    middle layers read out through the logit lens, and how much the stream moves in all."""
    n = len(seeds)
    lines = ["| JREG − baseline, same seed | " + " | ".join(c for c, _, _ in LAYER_ROWS.values()) + " |",
             "|---" * (len(LAYER_ROWS) + 1) + "|"]
    fam = family(runs, seeds)
    for c in ("jreg_a1", "jreg_a3"):
        cells = []
        for m, (_, digits, f) in LAYER_ROWS.items():
            t, below = paired(runs, seeds, f, c)
            cells.append(f"{interval(t, digits)} {p_text(fam[c, m][1])}{'*' if fam[c, m][2] < 0.05 else ''}, lower in "
                         f"{below} of {n}")
        lines.append(f"| {CONDITIONS[c]} | " + " | ".join(cells) + " |")
    tokens = runs["base"][seeds[0]]["profile"]["analysis_tokens"]
    return "\n".join(lines) + (f"\n\nMean difference over the {n} seeds, its two-sided 95% t interval ({n - 1} degrees "
                               f"of freedom), the paired t test's p (* where it survives Holm's correction at 0.05 over "
                               f"the seed study's {len(fam)} comparisons: this table's, the paired table's and α = 3's "
                               f"two), and in how many seeds JREG's value is the lower (a sign count: {n} of {n} alone "
                               f"is a two-sided sign test's p = {sign_p(n):.4f}); the logit lens and the skipped block on the first "
                               f"{tokens:,} of the profile's validation tokens (`results/kjv/seeds/`).")


def layer_finding(runs, seeds):
    """What the seed runs' layer analysis supports: the small-scale evidence that the middle layers do more."""
    n, fam = len(seeds), family(runs, seeds)
    skip, skip_below = paired(runs, seeds, LAYER_ROWS["skip_L"][2], "jreg_a1")
    lens, lens_below = paired(runs, seeds, LAYER_ROWS["lens_mid"][2], "jreg_a1")
    total, total_below = paired(runs, seeds, LAYER_ROWS["psi_total"][2], "jreg_a1")
    mid, _ = paired(runs, seeds, LAYER_ROWS["psi_mid"][2], "jreg_a1")
    L = runs["base"][seeds[0]]["profile"]["n_layer"]
    if skip[2] < 0 and lens[2] < 0:
        work = (f"With α = 1 the last block does less of the work and the middle layers read out better: skipping "
                f"block {L} costs "
                f"{-skip[0]:.2f} nats less ({interval(skip, 3)}, {tested(fam, ('jreg_a1', 'skip_L'))}, lower in "
                f"{skip_below} of {n} seeds), and h_3..h_{L - 1} read out {-lens[0]:.2f} nats better through the logit "
                f"lens ({interval(lens, 3)}, {tested(fam, ('jreg_a1', 'lens_mid'))}, {lens_below} of {n})")
    else:
        work = (f"With α = 1 these seeds do not show the work moved from the last block to the middle layers: skipping "
                f"block {L} changes by {interval(skip, 3)} ({skip_below} of {n} lower), the logit-lens loss of "
                f"h_3..h_{L - 1} by {interval(lens, 3)} ({lens_below} of {n} lower)")
    if total[2] < 0 and mid[1] <= 0:
        moved = (f"The stream moves less in all (total Ψ over layers 2..L {interval(total, 3)}, "
                 f"{tested(fam, ('jreg_a1', 'psi_total'))}, lower in {total_below} of {n} seeds) and the middle layers' Ψ shows no rise ({interval(mid, 4)}): the penalty "
                 f"takes displacement out of the last block without the middle layers taking it up, where the paper "
                 f"reports their displacement enlarged")
    elif mid[1] > 0:
        moved = f"The middle layers' Ψ rises ({interval(mid, 4)}), as the paper reports"
    else:
        moved = (f"Total Ψ over layers 2..L changes by {interval(total, 3)} and the middle layers' by "
                 f"{interval(mid, 4)}")
    return f"{work}. {moved}."


def zero_from(curves):
    """The first step from which every curve is 0 to its end, or None."""
    steps = [x for x, _ in curves[0]]
    for i, step in enumerate(steps):
        if all(v == 0 for cv in curves for _, v in cv[i:]):
            return step
    return None


def plots(runs, seeds, values):
    """psi_profiles.png: Ψ per layer, mean over seeds with a band of ± one standard deviation, layers 2..L (Ψ_1, the
    embedding's first update, is ~0.23 in every run and would flatten the rest); zeta_over_training.png: ζ_L of the
    periodic evals (raw h_L, the runs' validation windows), every seed a thin line, the mean a thick one, α = 1's
    dashed over α = 3's wider line where both are 0. The conditions' colours and labels are lib/style.py's, those of
    every figure."""
    import sys
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sys.path.insert(0, ROOT)
    from lib.style import COLOURS, LABELS, MARKERS, save
    fig, ax = plt.subplots(figsize=(6.4, 4), layout="constrained")
    for i, c in enumerate(CONDITIONS):
        profiles = [runs[c][s]["profile"]["psi"] for s in seeds]
        layers = list(range(2, len(profiles[0]) + 1))
        stat = [mean_sd([p[l - 1] for p in profiles]) for l in layers]
        mean = [m for m, _ in stat]
        ax.plot(layers, mean, marker=MARKERS[i], color=COLOURS[c], label=rf"{LABELS[c]} ($\Psi_1$ = "
                f"{mean_sd([p[0] for p in profiles])[0]:.2f}, not drawn)")
        ax.fill_between(layers, [m - s for m, s in stat], [m + s for m, s in stat], color=COLOURS[c], alpha=0.2)
    ax.set_xticks(layers)
    ax.set(xlabel=r"layer $\ell$", ylabel=r"$\Psi_\ell$ (raw $h_L$, 32,768 val tokens)",
           title=rf"KJV: $\Psi_\ell$, mean ± sd over {len(seeds)} seeds")
    ax.legend(fontsize=8.5, loc="upper left")
    save(fig, os.path.join(KJV, "psi_profiles.png"))
    fig, ax = plt.subplots(figsize=(6.4, 4), layout="constrained")
    width = {"base": 2.2, "jreg_a1": 2.2, "jreg_a3": 4.5}
    for c in ("base", "jreg_a3", "jreg_a1"):                    # α = 1 drawn last, dashed, over α = 3's wider line
        curves = [[(e["step"], e["zeta"][-1]) for e in runs[c][s]["evals"]] for s in seeds]
        for curve in curves:
            ax.plot(*zip(*curve), color=COLOURS[c], alpha=0.3, linewidth=0.8)
        steps = [x for x, _ in curves[0]]
        zero = zero_from(curves) if c != "base" else None
        ax.plot(steps, [sum(cv[i][1] for cv in curves) / len(curves) for i in range(len(steps))], color=COLOURS[c],
                linewidth=width[c], ls="--" if c == "jreg_a1" else "-",
                label=f"{LABELS[c]}: mean of {len(curves)} seeds" + (f", every seed 0 from step {zero}" if zero else ""))
    handles, labels = ax.get_legend_handles_labels()
    order = [labels.index(next(lb for lb in labels if lb.startswith(LABELS[c]))) for c in CONDITIONS]
    ax.legend([handles[i] for i in order], [labels[i] for i in order], fontsize=8.5, loc="upper left")
    ax.set(xlabel="training step", ylabel=r"$\zeta_L$ (%, raw $h_L$)",
           title=r"$\zeta_L$ over training: each seed (thin), the mean")
    save(fig, os.path.join(KJV, "zeta_over_training.png"))


@functools.cache
def seed_study():
    """(runs, seeds, values) of the seed study, read once: every block of it reads these."""
    runs = seed_runs()
    return (runs, *stats(runs))


# The 600-step runs of two seeds (results/kjv/profiles.json: evaluate.py --profile of the five runs at step 600)

RUNS600 = ("base", "jreg_a1", "jreg_a3", "base_seed1", "jreg_a1_seed1")


def profiles600():
    """{run: profile} and {run: seed} of the 600-step runs."""
    models = json.load(open(os.path.join(KJV, "profiles.json")))["models"]
    seeds = {r: int(r.rsplit("_seed", 1)[1]) if "_seed" in r else
             json.load(open(os.path.join(KJV, f"{r}.json")))["config"].get("seed") or 1337 for r in RUNS600}
    return {r: models[r]["profile"] for r in RUNS600}, seeds


def mid(psi):
    return sum(psi[1:-2]) / len(psi[1:-2])


def kjv600_runs():
    prof, seeds = profiles600()
    lines = ["| run | seed | val loss | Ψ_L | Ψ_{L−1} | ζ_L | ζ_{L−2} | ζ_L (normed h_L) | mean Ψ, layers 2..L−2 |",
             "|---" * 9 + "|"]
    for r, p in prof.items():
        lines.append(f"| {r} | {seeds[r]} | {p['loss']:.4f} | {p['psi'][-1]:.4f} | {p['psi'][-2]:.4f} | "
                     f"{p['zeta'][-1]:.2f} | {p['zeta'][-3]:.2f} | {p['zeta_normed'][-1]:.2f} | {mid(p['psi']):.4f} |")
    return "\n".join(lines) + f"\n\nval loss: the profile's, on its {prof['base']['n_tokens']:,} tokens."


def kjv600_layers():
    prof, _ = profiles600()
    b, a1, a3 = prof["base"], prof["jreg_a1"], prof["jreg_a3"]
    lines = ["| layer | Ψ base | Ψ α=1 | Ψ α=3 | skip Δloss base | skip Δloss α=1 | skip Δloss α=3 | lens loss base | "
             "lens loss α=1 |", "|---" * 9 + "|"]
    for l in range(1, len(b["psi"]) + 1):
        skip = " | ".join(f"{p['skip_block_loss_increase'][l - 1]:+.3f}" for p in (b, a1, a3))
        lines.append(f"| {l} | {b['psi'][l - 1]:.4f} | {a1['psi'][l - 1]:.4f} | {a3['psi'][l - 1]:.4f} | {skip} | "
                     f"{b['logit_lens_loss'][l]:.3f} | {a1['logit_lens_loss'][l]:.3f} |")
    return "\n".join(lines)


def kjv600_finding():
    """What the two 600-step seeds show, each number from profiles.json or base_checkpoints.json."""
    prof, _ = profiles600()
    b, b1, a1, a1s, a3 = (prof[r] for r in ("base", "base_seed1", "jreg_a1", "jreg_a1_seed1", "jreg_a3"))
    middle = [v for p in (b, b1) for v in p["psi"][1:-2]]
    ckpts = {c["step"]: c["zeta"][-1] for c in
             json.load(open(os.path.join(KJV, "base_checkpoints.json")))["profile_checkpoints"]}
    dips = [s for s in sorted(ckpts)[1:-1] if ckpts[s] < ckpts[s - 50]]
    lens_drop = [b["logit_lens_loss"][l] - a1["logit_lens_loss"][l] for l in range(3, len(b["psi"]))]
    L = len(b["psi"])
    moved = largest_step(a3["psi"]) == L - 1 and largest_step(b["psi"]) == L
    seeds_moved = alpha3_stats(*seed_study()[:2])[-1]
    three = (f", the baseline's at layer {largest_step(b['psi'])} (Ψ_{L - 1} = {a3['psi'][-2]:.3f} against the "
             f"baseline's {b['psi'][-2]:.3f}, ζ_{{L−2}} = {a3['zeta'][-3]:.2f}): " +
             ("in this run the jump moved one layer down" if moved else "in this run the jump did not move") +
             (", and the five 300-step seeds bear that out" if seeds_moved == moved else
              f", but the five 300-step seeds {'do not show it moved' if moved else 'show it moved'} (above)") + ". ")
    return (f"The baselines grow a final-layer jump: Ψ_{L} = {b['psi'][-1]:.3f} and {b1['psi'][-1]:.3f} against "
            f"{min(middle):.3f}–{max(middle):.3f} in layers 2–{L - 2}, ζ_L = {b['zeta'][-1]:.2f} and "
            f"{b1['zeta'][-1]:.2f} for the two seeds, and ζ_L rises over training ({ckpts[50]:.2f} at step 50, "
            f"{ckpts[200]:.2f} at 200, {ckpts[600]:.2f} at 600, lower than the checkpoint before at "
            f"{', '.join(map(str, dips))}; `results/kjv/base_checkpoints.json`), as the paper reports for its models. "
            f"JREG with α = 1 {'removes it in both seeds' if a1['zeta'][-1] == a1s['zeta'][-1] == 0 else 'lowers it'} "
            f"(ζ_L = {a1['zeta'][-1]:.2f} and {a1s['zeta'][-1]:.2f}, Ψ_{L} = "
            f"{a1['psi'][-1]:.3f} and {a1s['psi'][-1]:.3f}); its validation loss differs from the same seed's "
            f"baseline by {a1['loss'] - b['loss']:+.4f} and {a1s['loss'] - b1['loss']:+.4f}. In seed 1337 the middle "
            f"layers read out better under JREG: the logit-lens loss of h_3..h_{L - 1} is "
            f"{min(lens_drop):.2f}–{max(lens_drop):.2f} nats lower, and skipping the last block costs "
            f"{a1['skip_block_loss_increase'][-1]:+.3f} nats instead of {b['skip_block_loss_increase'][-1]:+.3f} (over "
            f"five seeds: [the seed study's layer analysis](#the-layers-over-five-seeds)). In this one run of α = 3 "
            f"(about 95% of the weight on layer L) the largest step is at layer "
            f"{largest_step(a3['psi'])}{three}α = 1 keeps ζ_{{L−2}} at "
            f"{a1['zeta'][-3]:.2f} in seed 1337 but {a1s['zeta'][-3]:.2f} in seed 1: the penalty removes the last "
            f"layer's jump, not always the one below it.")


# Other CPUs and arithmetic orders (results/kjv/other_cpus.json) against the committed 600-step baseline

def other_cpus():
    doc = json.load(open(os.path.join(KJV, "other_cpus.json")))
    base = json.load(open(os.path.join(ROOT, doc["committed"])))
    evals = {str(e["step"]): e["val_loss"] for e in base["evals"] if "val_loss" in e}
    p = json.load(open(os.path.join(KJV, "profiles.json")))["models"]["base"]["profile"]
    committed = {"val_loss": p["loss"], "psi_L": p["psi"][-1], "psi_L1": p["psi"][-2], "zeta_L": p["zeta"][-1],
                 "zeta_L2": p["zeta"][-3], "zeta_L_normed": p["zeta_normed"][-1], "psi_mid": mid(p["psi"])}
    return doc["runs"], evals, committed


def cpu_loss_table():
    runs, evals, _ = other_cpus()
    steps = list(evals)
    lines = ["| step | " + " | ".join(steps) + " |", "|---" * (len(steps) + 1) + "|",
             "| committed | " + " | ".join(f"{evals[s]:.4f}" for s in steps) + " |"]
    for r in runs:
        lines.append(f"| {r['machine']}; {r['code']} | " + " | ".join(f"{r['val_loss'][s]:.4f}" for s in steps) + " |")
    return "\n".join(lines)


PROFILE_COLS = {"val_loss": ("val loss", 4), "psi_L": ("Ψ_L", 4), "psi_L1": ("Ψ_{L−1}", 4), "zeta_L": ("ζ_L", 2),
                "zeta_L2": ("ζ_{L−2}", 2), "zeta_L_normed": ("ζ_L normed", 2), "psi_mid": ("mean Ψ, layers 2..L−2", 4)}


def cpu_profile_table():
    runs, _, committed = other_cpus()
    lines = ["| base, step 600 | " + " | ".join(c for c, _ in PROFILE_COLS.values()) + " |",
             "|---" * (len(PROFILE_COLS) + 1) + "|",
             "| committed | " + " | ".join(f"{committed[k]:.{d}f}" for k, (_, d) in PROFILE_COLS.items()) + " |"]
    for r in runs:
        lines.append(f"| {r['machine']}; {r['code']} | "
                     + " | ".join(f"{r['profile'][k]:.{d}f}" for k, (_, d) in PROFILE_COLS.items()) + " |")
    return "\n".join(lines)


def other_cpus_split():
    """(rows on another CPU with the committed runs' code, rows with later code that reorders the float arithmetic)."""
    doc = json.load(open(os.path.join(KJV, "other_cpus.json")))
    runs, _, _ = other_cpus()
    same = [r for r in runs if r["commit"] == doc["committed_commit"]]
    return same, [r for r in runs if r["commit"] != doc["committed_commit"]]


def drift(rows):
    """The largest move the rows gave against the committed run: final val loss, mid-run val loss, Ψ, ζ."""
    _, evals, committed = other_cpus()
    if not rows:
        return (float("nan"),) * 4
    final = max(abs(r["profile"]["val_loss"] - committed["val_loss"]) for r in rows)
    midrun = max(abs(r["val_loss"][s] - evals[s]) for r in rows for s in evals)
    psi = max(abs(r["profile"][k] - committed[k]) for r in rows for k in ("psi_L", "psi_L1", "psi_mid"))
    zeta = max(abs(r["profile"][k] - committed[k]) for r in rows for k in ("zeta_L", "zeta_L2", "zeta_L_normed"))
    return final, midrun, psi, zeta


def cpu_drift():
    """The largest move another CPU gave with the committed runs' code (the CPU alone), in final val loss, mid-run val
    loss, Ψ and ζ, and the number of such CPUs."""
    same, _ = other_cpus_split()
    return (*drift(same), len({r["machine"] for r in same}))


def machines(rows):
    return len({r["machine"].split(";")[0].replace("the same ", "a ") for r in rows})


def determinism():
    final, _, _, zeta, n = cpu_drift()
    same, later = other_cpus_split()
    final2, _, _, zeta2 = drift(later)
    return (f"**Determinism.** Bit-exact on the same CPU, code and thread count (a resumed run too; the tests check "
            f"it). With the committed runs' code, {n} other CPU{'s' if n != 1 else ''} moved the final validation loss "
            f"by up to {final:.4f} and ζ_L by up to {zeta:.2f}; later commits that reorder the float arithmetic "
            f"({len(later)} runs on {machines(later)} CPUs, CPU and code not separated) moved them by up to "
            f"{final2:.4f} and {zeta2:.2f} (600-step runs); all of it less than the seed does: "
            f"[reproduction](docs/reproduction.md#which-digits-are-exact).")


def cpu_finding():
    final, midrun, psi, zeta, n = cpu_drift()
    same, later = other_cpus_split()
    final2, midrun2, psi2, zeta2 = drift(later)
    runs, _, committed = other_cpus()
    zetas = [committed["zeta_L"]] + [r["profile"]["zeta_L"] for r in runs]
    psis = [committed["psi_L"]] + [r["profile"]["psi_L"] for r in runs]
    jreg = [r["jreg_profile"]["zeta_L"] for r in runs if "jreg_profile" in r]
    return (f"With the committed runs' code ({same[0]['commit']}), {n} other CPU{'s' if n != 1 else ''} "
            f"({'; '.join(r['machine'].split(',')[0] for r in same)}) moved the final validation loss by up to "
            f"{final:.4f}, a mid-run one by up to {midrun:.4f}, Ψ by up to {psi:.4f} and ζ by up to {zeta:.2f}: "
            f"that is the CPU alone. The {len(later)} rows with later commits ran code that reorders the float "
            f"arithmetic (the loss in chunks), on the same Zen 3 and on {machines(later) - 1} more CPUs, so there the "
            f"CPU and the code are not separated: they moved the final loss by up to {final2:.4f}, a mid-run one by up "
            f"to {midrun2:.4f}, Ψ by up to {psi2:.4f} and ζ by up to {zeta2:.2f}. Every variant tells the same story: "
            f"the baseline ends with Ψ_L between {min(psis):.4f} and {max(psis):.4f} and ζ_L between {min(zetas):.2f} "
            f"and {max(zetas):.2f}, and the JREG runs recorded beside two of them with ζ_L = {max(jreg):.2f}.")


def quickstart_time():
    q = json.load(open(os.path.join(KJV, "quickstart_run.json")))
    times = []
    for run in q["runs"]:
        yours = [line for line in run["printed"] if "| yours |" in line]
        if not all(line.replace("yours", "committed") in run["printed"] for line in yours):
            raise SystemExit(f"quickstart_run.json: the run of {run['commit']} differs from the committed rows")
        m, sec = divmod(round(run["seconds"]), 60)
        times.append(f"{m} min {sec} s (`{run['commit']}`)")
    return (f"From fresh clones the quick start took {' and '.join(times)} (`time bash quickstart.sh`, the packages "
            f"already installed; {q['machine']['cpu']}, torch {q['machine']['torch']}), and each time its table equalled "
            f"the committed seed-1337 rows to the last printed digit (`results/kjv/quickstart_run.json`)."
            + quickstart_code_change(q["code_change"]))


def quickstart_code_change(change):
    """How far the quick start moved on one CPU when the loss's gradient arithmetic changed (old and new commit)."""
    def table(run):                                 # {(name, column): value} of the printed "yours" rows
        rows = [line.strip("| ").split(" | ") for line in run["printed"] if "| yours |" in line]
        return {(r[0], col): float(v) for r in rows for col, v in zip(("loss", "psi", "zeta", "zeta2"), r[2:])}
    old, new = (table(run) for run in change["runs"])
    moved = {col: max(abs(new[k] - old[k]) for k in old if k[1] == col) for col in ("loss", "psi", "zeta", "zeta2")}
    before, after = change["runs"]
    loss, _, psi, zeta, _ = cpu_drift()
    within = moved["loss"] <= loss and moved["psi"] <= psi and max(moved["zeta"], moved["zeta2"]) <= zeta
    return (f" The loss's gradient has been made by autograd since (`fb1e4cd`: the same math, its float operations in "
            f"another order), so today's code is not expected to equal those rows to the last digit: on one "
            f"{change['machine']['cpu'].split(',')[0]} the quick start of `{before['commit']}` and of "
            f"`{after['commit']}` differ by up to {moved['loss']:.4f} in val loss, {moved['psi']:.4f} in Ψ_L and "
            f"{max(moved['zeta'], moved['zeta2']):.2f} in ζ (`code_change` in the same file), "
            + ("less than another CPU moves them (below)." if within else "more than another CPU moved them (below)."))


def kjv_params():
    """The KJV model's parameter count, as the survey of its checkpoints recorded it (results/layers/survey/)."""
    survey = json.load(open(os.path.join(ROOT, "results", "layers", "survey", "survey.json")))["models"]
    params = {m["params"] for name, m in survey.items() if name.startswith("out/kjv/")}
    assert len(params) == 1, params
    return params.pop()


def kjv_setup():
    """The README's line on what the seed study trained: the model's size, the steps, the batch and the profile's
    tokens of the seed runs."""
    runs, seeds, _ = seed_study()
    run = runs["base"][seeds[0]]
    cfg, prof = run["config"], run["profile"]
    words = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}
    return (f"An {prof['n_layer']}-layer, d 128 Llama ({kjv_params():,} parameters) trained on the King James Bible in "
            f"bytes, {cfg['max_steps']} steps × {cfg['batch_tokens']:,} tokens on a 2-core CPU (the quick start's runs), "
            f"{words.get(len(seeds), len(seeds))} seeds each of the baseline, JREG λ = 1, α = 1 and JREG λ = 1, α = 3 "
            f"(Ψ and ζ on {prof['n_tokens']:,} validation tokens, raw h_L)")


def kjv_scale():
    """The README's limitation: how small the seed study's model and its training are."""
    runs, seeds, _ = seed_study()
    cfg = runs["base"][seeds[0]]["config"]
    return (f"One {kjv_params() / 1e6:.1f}M-parameter model on one corpus (a byte-level Bible), "
            f"trained on a CPU for {cfg['max_steps'] * cfg['batch_tokens'] / 1e6:.1f}M tokens")


BLOCKS = {"kjv-setup": kjv_setup, "kjv-scale": kjv_scale, "kjv-seeds": lambda: seed_table(*seed_study()[1:]), "kjv-paired": lambda: paired_table(*seed_study()[1:], family(*seed_study()[:2])),
          "kjv-runs": lambda: run_table(seed_study()[0]), "kjv-finding": lambda: finding(*seed_study()),
          "kjv-alpha3": lambda: alpha3_finding(*seed_study()),
          "kjv-layers": lambda: layer_table(*seed_study()[:2]), "kjv-layers-finding": lambda: layer_finding(*seed_study()[:2]),
          "kjv600-runs": kjv600_runs, "kjv600-layers": kjv600_layers, "kjv600-finding": kjv600_finding,
          "cpu-loss": cpu_loss_table, "cpu-profile": cpu_profile_table, "cpu-finding": cpu_finding,
          "determinism": determinism, "quickstart-time": quickstart_time}


def kjv_bytes_manifest():
    """The manifest of the quick start's byte-level KJV (prepare_fineweb.py's record of data/kjv_bytes, committed as
    results/kjv/kjv_bytes_manifest.json)."""
    return json.load(open(os.path.join(KJV, "kjv_bytes_manifest.json")))


def kjv_data():
    """docs/data.md's line on the byte-level KJV: its tokens, documents and shards, as the preparation recorded them."""
    m = kjv_bytes_manifest()
    val = sum(s["num_tokens"] for s in m["shards"] if s["split"] == "val")
    train = sum(s["split"] == "train" for s in m["shards"])
    return (f"The KJV in bytes (`results/kjv/kjv_bytes_manifest.json`, the manifest of the quick start's "
            f"`data/kjv_bytes`): {m['tokens']:,} tokens, {m['documents']:,} documents; val {val:,} tokens, "
            f"{train} train shards.")


def kjv_corpus():
    """The byte-level KJV's size for docs/reproduction.md: one token per UTF-8 byte plus one end-of-text a document."""
    m = kjv_bytes_manifest()
    return (f"{m['tokens']:,} byte-level tokens, its {m['tokens'] - m['documents']:,} UTF-8 bytes and an end-of-text "
            f"before each of its {m['documents']:,} documents")


BLOCKS.update({"kjv-data": kjv_data, "kjv-corpus": kjv_corpus, "kjv-params": lambda: f"{kjv_params():,} parameters",
               "kjv-size": lambda: f"{kjv_params() / 1e6:.1f}M-parameter"})
