"""
The comparison of docs/methods.md, from results/methods/runs/*.json (made by run_methods.py): each method against the
baseline of the same seed (the same initialisation and data order), the mean difference over the seeds both have with
its two-sided 95% t interval and the paired t test's p-value (n − 1 degrees of freedom), and for each metric a Holm
correction across the methods compared (a finding that survives it is marked). Runs from another machine or commit
than the most common one are left out and counted. A skip-block or lens cell of runs whose profile read the streams
without Backout's − λ·h_k (old_readout: the lens at layer L is not the run's own loss) is shown as "n/a (old readout)",
its p counted as 1 in Holm's correction; backout_readout() says, from backout_readout.json, how far off that was.
results/collect.py writes the table into docs/methods.md; plot() draws results/methods/methods.png.

    python results/methods/numbers_methods.py          # the table on stdout, and the figure
"""
import glob
import json
import os
import sys
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import numbers_reproduction as repro  # noqa: E402
from numbers_reproduction import holm, t_p  # noqa: E402,F401  (the statistics, shared with the seed study)

CONDITIONS = {"base": "baseline", "jreg_a1": "JREG α = 1", "lns": "LayerNorm Scaling", "mixln": "Mix-LN",
              "periln": "Peri-LN", "early_exit": "early-exit loss", "backout": "Backout",
              "jreg_lns": "JREG + LayerNorm Scaling"}
# metric: (label, digits, function of a run)
METRICS = {"val_loss": ("val loss", 4, lambda r: r["profile"]["loss"]),
           "zeta_L": ("ζ_L", 2, lambda r: r["profile"]["zeta"][-1]),
           "psi_L": ("Ψ_L", 4, lambda r: r["profile"]["psi"][-1]),
           "psi_total": ("total Ψ", 4, lambda r: sum(r["profile"]["psi"][1:])),
           "skip_L": ("skip block L (nats)", 3, lambda r: r["profile"]["skip_block_loss_increase"][-1]),
           "lens_mid": ("lens h_3..h_{L−1} (nats)", 3,
                        lambda r: repro.LAYER_ROWS["lens_mid"][2](r["profile"])),
           "step_s": ("s a step", 3, lambda r: r["seconds_per_step"])}
STUDY_LR = 3e-3                                                  # configs/kjv.py's lr, which every condition trains at
READOUT = ("skip_L", "lens_mid")        # the metrics that read a stream through the head: a skipped block, the lens
OLD_READOUT = "n/a (old readout)"
READOUT_JSON = os.path.join(HERE, "backout_readout.json")        # backout_readout.py: a rerun read both ways


def old_readout(r):
    """Whether a run's profile read its streams otherwise than its model reads its own last one: its logit lens at
    layer L is not its own loss. So were Backout's profiles made before the lens and the skipped block read through
    Llama.head_input: N(h), without Backout's − λ·h_k (each other method's profile read as it does now)."""
    p = r["profile"]
    return "analysis_loss" in p and abs(p["logit_lens_loss"][-1] - p["analysis_loss"]) > 1e-4


def read_right(m, *runs):
    """Whether metric m of these runs can be shown: it reads no stream through the head, or every run read it so."""
    return m not in READOUT or not any(old_readout(r) for r in runs)


def lr_text(lr):
    """A learning rate as the configs write it: 1.5e-3, not 0.0015."""
    mantissa, exponent = f"{lr:e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


def runs():
    """({condition: {seed: run}} of the runs made on the most common (machine, commit), the count left out)."""
    every = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(HERE, "runs", "*.json")))]
    if not every:
        return {}, 0
    where = Counter((r["machine"]["cpu"], r["machine"]["commit"]) for r in every).most_common(1)[0][0]
    kept = [r for r in every if (r["machine"]["cpu"], r["machine"]["commit"]) == where]
    by = {c: {} for c in CONDITIONS}
    for r in kept:
        by[r["condition"]][r["seed"]] = r
    return by, len(every) - len(kept)


def differences(by, f):
    """{method: (t interval of f(method) − f(baseline) over the shared seeds, p, Holm-adjusted p)}."""
    methods = [c for c in CONDITIONS if c != "base" and set(by[c]) & set(by["base"])]
    rows = {}
    for c in methods:
        diff = [f(by[c][s]) - f(by["base"][s]) for s in sorted(set(by[c]) & set(by["base"]))]
        rows[c] = (repro.t_interval(diff), repro.t_p(diff))
    return {c: (t, p, a) for (c, (t, p)), a in zip(rows.items(), repro.holm([p for _, p in rows.values()]))}


def finding():
    """What the table says, in two sentences written from the runs: which methods end with ζ_L = 0 in every seed, and
    what each costs or gains in validation loss (the Holm-surviving differences named as such)."""
    by, _ = runs()
    if not by or not by["base"]:
        return "No runs yet: python results/methods/run_methods.py."
    zeta, loss = METRICS["zeta_L"][2], METRICS["val_loss"][2]
    zero = [c for c in CONDITIONS if by[c] and all(round(zeta(r), 2) == 0 for r in by[c].values())]
    d = differences(by, loss)
    worse = [c for c in d if d[c][2] < 0.05 and d[c][0][0] > 0]
    better = [c for c in d if d[c][2] < 0.05 and d[c][0][0] < 0]      # a gain or a cost: only where it survives Holm
    named = lambda cs: ", ".join(CONDITIONS[c] for c in cs) or "none"                  # noqa: E731
    cell = lambda c, note="": (                                                        # noqa: E731
        f"{CONDITIONS[c]} {repro.interval(d[c][0], 4)} ({repro.p_text(d[c][1])}{note})")
    zs = {c: [zeta(r) for r in by[c].values()] for c in CONDITIONS if by[c] and c not in zero}
    dz = differences(by, zeta)
    held = [c for c in dz if dz[c][2] >= 0.05]
    verb = "ends" if len(zero) == 1 else "end"
    return (f"At the quick start's budget (300 steps, {len(by['base'])} seeds) only {named(zero)} {verb} with "
            f"ζ_L = 0.00 in every seed; the others leave a jump in some seeds (ζ_L over the seeds: "
            + "; ".join(f"{CONDITIONS[c]} {min(v):.2f}–{max(v):.2f}" for c, v in zs.items()) + ")"
            + (f", and with {len(by['base'])} seeds no difference in ζ_L survives Holm's correction (smallest p "
               f"{min(dz[c][1] for c in dz):.3f})" if len(held) == len(dz) else "") + ". "
            f"In validation loss {named(worse)} cost more than the noise after Holm's correction ("
            + "; ".join(cell(c) for c in worse) + "), "
            + ("; ".join(cell(c) for c in better) + (" gains" if len(better) == 1 else " gain") if better
               else "no method gains after it")
            + ", and no difference is detected for " + "; ".join(
                cell(c, ", not surviving Holm's correction" if d[c][1] < 0.05 else "")
                for c in d if c not in worse and c not in better) + ".")


def comparison():
    """The table: per method, each metric's mean difference from the baseline of the same seed, [95% t interval], p
    (* where it survives Holm's correction across the methods at 0.05)."""
    by, left_out = runs()
    if not by or not by["base"]:
        return "No runs yet: python results/methods/run_methods.py."
    methods = [c for c in CONDITIONS if c != "base" and set(by[c]) & set(by["base"])]
    cells, seeds_of, unread, dropped = {}, {}, set(), {}
    for m, (_, digits, f) in METRICS.items():
        rows = {}
        for c in methods:
            seeds = sorted(set(by[c]) & set(by["base"]))
            seeds_of[c] = seeds
            if not read_right(m, *(by[c][s] for s in seeds), *(by["base"][s] for s in seeds)):
                rows[c] = None                           # not shown; in Holm's family at p = 1, the others' worst case
                unread.add(c)
                continue
            diff = [f(by[c][s]) - f(by["base"][s]) for s in seeds]
            rows[c] = (repro.t_interval(diff), repro.t_p(diff))
        adjusted = dict(zip(rows, repro.holm([1.0 if v is None else v[1] for v in rows.values()])))
        shown = {c: v for c, v in rows.items() if v is not None}
        smaller = dict(zip(shown, repro.holm([p for _, p in shown.values()])))     # the family without them
        dropped[m] = [c for c in shown if smaller[c] < 0.05 <= adjusted[c]]
        for c, v in rows.items():
            if v is None:
                cells[c, m] = OLD_READOUT
                continue
            t, p = v
            mark = "*" if adjusted[c] < 0.05 else ""
            cells[c, m] = f"{repro.interval(t, digits)} {repro.p_text(p)}{mark}"
    lines = ["| − baseline, same seed | seeds | " + " | ".join(label for label, _, _ in METRICS.values()) + " |",
             "|---" * (len(METRICS) + 2) + "|"]
    base = "| baseline (mean ± sd) | " + ", ".join(map(str, sorted(by["base"]))) + " | " + " | ".join(
        "{:.{d}f} ± {:.{d}f}".format(*repro.mean_sd([f(r) for r in by["base"].values()]), d=d)
        for _, d, f in METRICS.values()) + " |"
    lines.append(base)
    for c in methods:
        lines.append(f"| {CONDITIONS[c]} | {', '.join(map(str, seeds_of[c]))} | "
                     + " | ".join(cells[c, m] for m in METRICS) + " |")
    missing = [f"{CONDITIONS[c]} ({len(by[c])} of 5)" for c in CONDITIONS if len(by[c]) < 5]
    return "\n".join(lines) + (
        "\n\nEach cell: the method's value minus the baseline's of the same seed, the mean over the seeds both have "
        "[its two-sided 95% t interval], and the paired t test's p (n − 1 degrees of freedom); * marks a difference "
        f"that survives Holm's correction across the {len(methods)} methods at 0.05. ζ_L, Ψ_L and total Ψ (layers "
        f"2..L) are evaluate.py's profile on the first {tokens(by)[0]:,} validation tokens, the loss increase when "
        f"block L is skipped and the logit lens on its first {tokens(by)[1]:,}; s a step is the median wall-clock of a training step, two runs at a time on 2 cores. "
        f"The steps of the {sum(map(len, by.values()))} runs add up to "
        f"{sum(r['seconds_per_step'] * r['last_step']['step'] for v in by.values() for r in v.values()) / 60:.0f} "
        "min (each run's median step × its steps; evaluation not counted)."
        + (f" Not yet complete: {', '.join(missing)} seeds." if missing else "")
        + (f" {left_out} runs from another machine or commit left out." if left_out else "")
        + (unread_note([c for c in methods if c in unread], len(methods), dropped) if unread else ""))


def tokens(by):
    """(the validation tokens of Ψ and ζ, those of the skipped block and the lens) of the profiles, the same in all."""
    counts = {(r["profile"]["n_tokens"], r["profile"]["analysis_tokens"]) for v in by.values() for r in v.values()}
    if len(counts) != 1:
        raise SystemExit(f"error: the profiles read different numbers of validation tokens: {sorted(counts)}")
    return counts.pop()


def unread_note(unread, n, dropped):
    """The footnote to the cells not shown: the profiles that read the streams without Backout's − λ·h_k, and how
    Holm's correction counts them (dropped: {metric: the methods that would survive it with those left out of the
    family})."""
    names, column = " and ".join(CONDITIONS[c] for c in unread), lambda m: METRICS[m][0].split(" (")[0]  # noqa: E731
    would = [f"{' and '.join(CONDITIONS[c] for c in cs)} in the {column(m)} column" for m, cs in dropped.items() if cs]
    return (f" {OLD_READOUT}: the {' and '.join(map(column, READOUT))} columns of {names} were computed without its "
            "− λ·h_k (each stream read as N(h), not as its head reads h_L, N(h − λ·h_k)) and are left out until the "
            f"comparison is rerun; Holm's correction in those columns still counts the {n} methods, the p left out "
            "taken as 1, so that no * of another method rests on it"
            + (f" (with {names} out of the family, {'; '.join(would)} would also survive it)" if would else "") + ".")


def plot(path=os.path.join(HERE, "methods.png"), by=None, names=CONDITIONS, interval=None, how="95% t interval"):
    """The mean Ψ profile of every condition in one panel, and ζ_L with its 95% t interval per condition, in
    lib/style.py's colours (the baseline blue and JREG α = 1 orange, as in every figure; each other method a colour
    and a marker of its own) and layout (at most MAX_WIDTH pixels wide, the legend below the panels). by {condition:
    {seed: run}}, names and interval (values -> (mean, low, high), described by how): another comparison's
    (numbers_comparison.plot); by default this one's runs and the t interval."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
    from lib.style import DPI, LABELS, MARKERS, legend, line_styles
    by, interval = by or runs()[0], interval or repro.t_interval
    shown = [c for c in names if by.get(c)]
    colours = {c: style["color"] for c, style in line_styles(shown).items()}
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 3.8), layout="constrained",
                                      gridspec_kw={"width_ratios": [3, 2]})
    for i, c in enumerate(shown):
        profiles = [r["profile"]["psi"] for r in by[c].values()]
        mean = [sum(col) / len(col) for col in zip(*profiles)]
        left.plot(range(1, len(mean) + 1), mean, marker=MARKERS[i % len(MARKERS)], ms=4, color=colours[c],
                  label=f"{LABELS.get(c, names[c])} ({len(profiles)} seeds)")
        m, lo, hi = interval([r["profile"]["zeta"][-1] for r in by[c].values()]) if len(profiles) > 1 else \
            (by[c][next(iter(by[c]))]["profile"]["zeta"][-1],) * 3
        right.errorbar([m], [i], xerr=[[m - lo], [hi - m]], fmt=MARKERS[i % len(MARKERS)], color=colours[c],
                       capsize=3)
    left.set(xlabel=r"layer $\ell$", ylabel=r"mean $\Psi_\ell$ over seeds", title=r"$\Psi_\ell$ per layer")
    right.set_yticks(range(len(shown)), [LABELS.get(c, names[c]) for c in shown], fontsize=8.5)
    right.invert_yaxis()
    right.set(xlabel=rf"$\zeta_L$ (%): mean, {how}", title="final-layer jump rate")
    for axis in (left.xaxis, right.xaxis):                         # layers; ζ_L in whole percent
        axis.set_major_locator(MaxNLocator(integer=True))
    for ax in (left, right):
        ax.grid(alpha=0.3)
    legend(fig, *left.get_legend_handles_labels())
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def lr_runs():
    """{condition: {lr: {seed: run}}} of the learning-rate check (run_methods.py --lr_check)."""
    by = {}
    for path in sorted(glob.glob(os.path.join(HERE, "lr_runs", "*.json"))):
        r = json.load(open(path))
        by.setdefault(r["condition"], {}).setdefault(r["lr"], {})[r["seed"]] = r
    return {c: by[c] for c in CONDITIONS if c in by}


def lr_seed1337():
    """{condition: {lr: run}}: the check's seed-1337 runs, the ones every lr has."""
    return {c: {lr: v[1337] for lr, v in lrs.items() if 1337 in v} for c, lrs in lr_runs().items()}


def seeded():
    """{(method, lr): {metric: (t interval, p, Holm-adjusted p)}} of each method run over several seeds at an lr of its
    own, paired with the study's baseline (at the study's lr) of the same seed; Holm across these rows per metric."""
    study, _ = runs()
    base = study.get("base", {})
    rows = {(c, lr): v for c, lrs in lr_runs().items() for lr, v in lrs.items()
            if lr != STUDY_LR and len(set(v) & set(base)) > 1}
    out = {key: {} for key in rows}
    for m, (_, _, f) in METRICS.items():
        if m == "step_s":
            continue
        tested = {}
        for key, v in rows.items():
            seeds = sorted(set(v) & set(base))
            if not read_right(m, *(v[s] for s in seeds), *(base[s] for s in seeds)):
                tested[key] = None                        # not shown (old readout); in Holm's family at p = 1
                continue
            diff = [f(v[s]) - f(base[s]) for s in seeds]
            tested[key] = (repro.t_interval(diff), repro.t_p(diff))
        for key, v, a in zip(tested, tested.values(), repro.holm([1.0 if v is None else v[1]
                                                                  for v in tested.values()])):
            out[key][m] = None if v is None else (*v, a)
    return {key: (sorted(set(rows[key]) & set(base)), cells) for key, cells in out.items()}


def lr_check():
    """The learning-rate check's table: each method's validation loss and ζ_L at each lr (seed 1337), the lowest loss
    of the row marked, and whether the runs at the study's lr give the study's own numbers (same seed, later commit)."""
    by = lr_seed1337()
    if not by:
        return "No runs yet: python results/methods/run_methods.py --lr_check."
    lrs = sorted({lr for v in by.values() for lr in v})
    loss, zeta = METRICS["val_loss"][2], METRICS["zeta_L"][2]
    lines = ["| seed 1337, 300 steps | " + " | ".join(f"lr {lr_text(lr)}" for lr in lrs) + " |",
             "|---" * (len(lrs) + 1) + "|"]
    for c, v in by.items():
        best = min(v, key=lambda lr: loss(v[lr]))
        lines.append(f"| {CONDITIONS[c]} | " + " | ".join(
            "" if lr not in v else ("**{:.4f}** ({:.2f})" if lr == best else "{:.4f} ({:.2f})").format(
                loss(v[lr]), zeta(v[lr])) for lr in lrs) + " |")
    study, _ = runs()
    same = [(c, loss(v[STUDY_LR]) - loss(study[c][1337])) for c, v in by.items()
            if STUDY_LR in v and 1337 in study.get(c, {})]
    commits = sorted({r["machine"]["commit"] for v in by.values() for r in v.values()})
    return "\n".join(lines) + (
        "\n\nEach cell: the validation loss (ζ_L in brackets) of evaluate.py's profile after 300 steps at that peak "
        f"learning rate (warm-up and decay as configs/kjv.py), seed 1337, commit {', '.join(commits)}; bold: the "
        "lowest loss of the row; a blank was not run. One seed tells apart only differences well above the spread "
        f"of the paired differences over seeds (the table above). At lr {lr_text(STUDY_LR)} " + (
            f"the {len(same)} runs give the study's seed-1337 numbers to the last digit (a later commit, the same "
            "arithmetic), so these runs and the study's pair up." if all(d == 0 for _, d in same) else
            "the runs differ from the study's seed-1337 runs by up to "
            f"{max(abs(d) for _, d in same):.2g} in validation loss (a later commit)."))


def lr_seeds():
    """Each method at an lr of its own with more than one seed, against the study's baseline (lr 3e-3, its best) of
    the same seed: the metrics of the table above with their intervals, p and Holm's correction across these rows."""
    rows = seeded()
    if not rows:
        return "No method at an lr of its own over several seeds yet: run_methods.py --lr_check --seeds 1,2,3,4 ..."
    metrics = {m: METRICS[m] for m in METRICS if m != "step_s"}
    lines = ["| − baseline at lr 3e-3, same seed | seeds | " + " | ".join(l for l, _, _ in metrics.values()) + " |",
             "|---" * (len(metrics) + 2) + "|"]
    for (c, lr), (seeds, cells) in rows.items():
        lines.append(f"| {CONDITIONS[c]} at lr {lr_text(lr)} | {', '.join(map(str, seeds))} | " + " | ".join(
            OLD_READOUT if cells[m] is None else f"{repro.interval(cells[m][0], digits)} {repro.p_text(cells[m][1])}"
            + ("*" if cells[m][2] < 0.05 else "") for m, (_, digits, _) in metrics.items()) + " |")
    unread = [c for (c, _), (_, cells) in rows.items() if any(v is None for v in cells.values())]
    return "\n".join(lines) + (
        "\n\nAs the table above (paired over seeds, 95% t interval, p; * survives Holm's correction across these "
        f"{len(rows)} rows), each against the study's baseline runs (lr {lr_text(STUDY_LR)}, the baseline's best of "
        "the check). The lr was chosen on seed 1337, which is one of the seeds: the other seeds are the test."
        + (f" {OLD_READOUT}: as in the table above, computed without {' and '.join(map(CONDITIONS.get, unread))}'s "
           "− λ·h_k and left out until rerun, its p taken as 1 in Holm's correction." if unread else ""))


def lr_finding():
    """What the learning-rate check says: each method's best lr of those run, and its loss there against the
    baseline's best (seed 1337)."""
    by = lr_seed1337()
    if "base" not in by:
        return "No runs yet: python results/methods/run_methods.py --lr_check."
    loss = METRICS["val_loss"][2]
    best = {c: min(v, key=lambda lr: loss(v[lr])) for c, v in by.items()}
    edge = [f"{CONDITIONS[c]} at the {'highest' if best[c] == max(by[c]) else 'lowest'}" for c in by
            if best[c] != STUDY_LR and best[c] in (min(by[c]), max(by[c]))]
    base = loss(by["base"][best["base"]])
    moved = [c for c in by if best[c] != STUDY_LR]
    return (f"With seed 1337, the study's lr {lr_text(STUDY_LR)} is the best of those run for "
            + (", ".join(CONDITIONS[c] for c in by if c not in moved) or "no condition")
            + ("; " + ", ".join(f"{CONDITIONS[c]} does best at {lr_text(best[c])}" for c in moved) if moved else "")
            + (f" (the best at the edge of the lrs run, so perhaps better further out: {', '.join(edge)})"
               if edge else "")
            + ". Each at its own best lr against the baseline at its own: "
            + ", ".join(f"{CONDITIONS[c]} {loss(by[c][best[c]]) - base:+.4f}" for c in by if c != "base") + "."
            + "".join(f" Over seeds {', '.join(map(str, seeds))}, {CONDITIONS[c]} at lr {lr_text(lr)} − the baseline "
                      f"at {lr_text(STUDY_LR)}: validation loss {repro.interval(cells['val_loss'][0], 4)} "
                      f"({repro.p_text(cells['val_loss'][1])}), ζ_L {repro.interval(cells['zeta_L'][0], 2)} "
                      f"({repro.p_text(cells['zeta_L'][1])})." for (c, lr), (seeds, cells) in seeded().items()))



def backout_readout():
    """What the old readout did to Backout's columns, measured: a rerun of its seed 1337 profiled both ways
    (backout_readout.py), and whether the old way gives the committed run's numbers (then these are that run's)."""
    if not os.path.exists(READOUT_JSON):
        return "Not measured yet: python results/methods/backout_readout.py."
    r = json.load(open(READOUT_JSON))
    now, old, committed = r["current"], r["old"], r["committed"]
    same = all(f"{old[k]:.4f}" == f"{committed[k]:.4f}" for k in ("analysis_loss", "lens_L", "skip_L", "lens_mid"))
    pair = lambda k, d=4, sign="": (                                                      # noqa: E731
        f"{old[k]:{sign}.{d}f} read without − λ·h_k, {now[k]:{sign}.{d}f} with it ({now[k] - old[k]:+.{d}f})")
    return (f"Backout's seed {r['seed']} rerun as the comparison runs it (k = {r['backout_layer']}, step {r['step']}, "
            f"the lens and the skipped block on its first {r['analysis_tokens']:,} validation tokens) and profiled "
            f"both ways (results/methods/backout_readout.py): the logit lens at layer L is {pair('lens_L')}, against "
            f"the model's own loss {now['analysis_loss']:.4f}; the loss increase when block L is skipped "
            f"{pair('skip_L', 3, '+')}; the mean lens over h_3..h_{{L−1}} {pair('lens_mid', 3)}. "
            + ("Read the old way, the rerun gives the committed run's numbers to the digits shown (lens at L "
               f"{committed['lens_L']:.4f}, skip block L {committed['skip_L']:+.3f}), so these are the corrections of "
               "that run's cells." if same else
               f"The committed run of that seed ({committed['machine']['cpu']}, commit {committed['machine']['commit']}"
               f"; the rerun: {r['machine']['cpu']}, commit {r['machine']['commit']}) read the old way gave lens at L "
               f"{committed['lens_L']:.4f}, skip block L {committed['skip_L']:+.3f} and mean lens "
               f"{committed['lens_mid']:.3f}: near the rerun's, not equal (another CPU and commit), so these "
               "differences measure the size of the error in that run's cells, not their exact correction."))


BLOCKS = {"methods-table": comparison, "methods-backout-readout": backout_readout, "methods-finding": finding,
          "methods-lr": lr_check,
          "methods-lr-finding": lr_finding, "methods-lr-seeds": lr_seeds}

if __name__ == "__main__":
    print(comparison())
    print(plot())
