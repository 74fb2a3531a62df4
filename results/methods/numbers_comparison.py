"""
The comparison of docs/methods.md, from results/methods/{sweep,table,deep}/*.json (made by run_comparison.py) and
results/methods/step_time.json (scripts/bench.py --steps): each method as its authors run it, and today's variants.

    sweep()      each condition's lr: the mean final val loss over the held-out seeds at each lr, the pick marked
    table()      the main table: every condition at its own lr, against the baseline at its own, same seed
    shared()     the second table: every condition at the study's lr 3e-3, against the baseline there
    deep()       16 layers: the baseline, JREG and the two methods nearest JREG, at their own lrs
    steps()      a training step of each condition as a ratio to the baseline's, measured interleaved in one process
    finding()    what the tables say

A cell is the method's value minus the baseline's of the same seed (the same initialisation and data order), the mean
over the seeds both have, with the paired test of results/stats.py: for ζ_L (bounded at 0, often exactly 0) the exact
sign-flip permutation test and a percentile bootstrap interval; for the others the paired t test and its t interval.
The correction is Holm's, within each column of a table: the family is one metric's comparisons of that table's
methods with the baseline. A pair is kept only where both runs share one arithmetic (run_comparison.here()).

    python results/methods/numbers_comparison.py       # every table on stdout
"""
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import run_comparison as RC  # noqa: E402
import stats as S  # noqa: E402

NAMES = {"base": "baseline", "jreg_a1": "JREG α = 1", "lns": "LayerNorm Scaling", "mixln": "Mix-LN",
         "periln": "Peri-LN", "early_exit": "LayerSkip early-exit loss", "backout": "Backout",
         "jreg_lns": "JREG + LayerNorm Scaling", "lns_depth_init": "LNS, depth-scaled init",
         "periln_no_embedding_norm": "Peri-LN, no embedding norm", "early_exit_uniform": "early exit, uniform 0.1",
         "backout_half": "Backout at h_{L/2}, λ at 1× lr", "muon": "Muon", "muon_jreg": "Muon + JREG"}


def lens_mid(p):
    """The mean logit-lens loss over h_3..h_{L−1} (nats)."""
    lens = p["logit_lens_loss"][3:-1]
    return sum(lens) / len(lens)


# metric: (label, digits, function of a run's profile, test: "t" or "sign-flip")
METRICS = {"val_loss": ("val loss", 4, lambda p: p["loss"], "t"),
           "zeta_L": ("ζ_L", 2, lambda p: p["zeta"][-1], "sign-flip"),
           "psi_L": ("Ψ_L", 4, lambda p: p["psi"][-1], "t"),
           "psi_total": ("total Ψ", 4, lambda p: sum(p["psi"][1:]), "t"),
           "skip_L": ("skip block L (nats)", 3, lambda p: p["skip_block_loss_increase"][-1], "t"),
           "lens_mid": ("lens h_3..h_{L−1} (nats)", 3, lens_mid, "t")}
STEP_TIME = os.path.join(HERE, "step_time.json")


def lr_text(lr):
    """A learning rate as the configs write it: 1.5e-3, not 0.0015."""
    mantissa, exponent = f"{lr:e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


def interval(t, digits):
    return f"{t[0]:+.{digits}f} [{t[1]:+.{digits}f}, {t[2]:+.{digits}f}]"


def mean_sd(values, digits):
    """The values' mean ± their sd; the mean alone for one value (no sd)."""
    m, sd = S.mean_sd(values)
    return f"{m:.{digits}f}" + (f" ± {sd:.{digits}f}" if len(values) > 1 else "")


def untestable(n, family):
    """The exact sign-flip test's smallest p at n seeds where it lies above Holm's first step 0.05/family, so that no
    difference can be marked whatever the runs; else None."""
    floor = S.sign_flip_floor(n)
    return floor if floor > 0.05 / family else None


def listed(conditions):
    """The conditions' names, by commas, or by semicolons where a name holds a comma ("LNS, depth-scaled init")."""
    names = [NAMES[c] for c in conditions]
    return ("; " if any("," in n for n in names) else ", ").join(names) or "none"


def p_text(p):
    return "p<0.001" if p < 0.001 else f"p={p:.3f}"


def sweep(conditions=None):
    """The held-out sweep: each condition's (of RC.METHODS) mean final val loss over SWEEP_SEEDS at each lr run, the
    pick in bold."""
    conditions = conditions or RC.METHODS
    runs, chosen = RC.load("sweep"), RC.picks(RC.load("sweep"), conditions)
    if not runs:
        return "No runs yet: python results/methods/run_comparison.py sweep."
    lrs = sorted({r["lr"] for r in runs.values() if r["condition"] in conditions})
    lines = [f"| seeds {', '.join(map(str, RC.SWEEP_SEEDS))}, 300 steps | " + " | ".join(
        f"lr {lr_text(lr)}" for lr in lrs) + " | pick |", "|---" * (len(lrs) + 2) + "|"]
    for c in conditions:
        cells = []
        for lr in lrs:
            have = [runs.get(RC.name(c, lr, s)) for s in RC.SWEEP_SEEDS]
            if not all(have):
                cells.append(f"({sum(map(bool, have))} of {len(have)})" if any(have) else "")
                continue
            loss = sum(r["evals"][-1]["val_loss"] for r in have) / len(have)
            zeta = sum(r["profile"]["zeta"][-1] for r in have) / len(have)
            cells.append(("**{:.4f}** ({:.2f})" if lr == chosen[c][0] else "{:.4f} ({:.2f})").format(loss, zeta))
        best, done = chosen[c]
        pick = "" if best is None else lr_text(best) + ("" if done else " (so far)")
        lines.append(f"| {NAMES[c]} | " + " | ".join(cells) + f" | {pick} |")
    return "\n".join(lines) + (
        "\n\nEach cell: the final validation loss (ζ_L in brackets) after 300 steps at that peak lr (warm-up and decay "
        f"as configs/kjv.py), the mean over the held-out seeds {' and '.join(map(str, RC.SWEEP_SEEDS))}, which no "
        "table uses; bold: the condition's pick, the lowest mean; a blank was not run, (k of 2) is under way. Where "
        "the lowest lay at an edge of ½×, 1× and 2× the study's lr, the next lr beyond it was run, until it lay "
        "inside.")


def pairs(runs, condition, base, lr, base_lr, seeds):
    """{seed: (the condition's run, the baseline's run)} at these lrs, for the seeds both have on one arithmetic, and
    the seeds left out for a differing arithmetic."""
    out, apart = {}, []
    for s in seeds:
        a, b = runs.get(RC.name(condition, lr, s)), runs.get(RC.name(base, base_lr, s))
        if a and b:
            if a["machine"]["arithmetic"] == b["machine"]["arithmetic"]:
                out[s] = (a, b)
            else:
                apart.append(s)
    return out, apart


def cells(rows):
    """rows {method: {seed: (run, baseline run)}} -> ({(method, metric): text}, {metric: (n, detectable at 0.05,
    detectable at 0.05 / family)}): each metric's paired test, Holm's correction across the methods (* survives)."""
    out, power = {}, {}
    for m, (_, digits, f, test) in METRICS.items():
        tested = {}
        for c, by_seed in rows.items():
            diff = [f(a["profile"]) - f(b["profile"]) for a, b in by_seed.values()]
            if len(diff) == 1:                                  # one seed in: its difference, no test yet
                out[c, m] = f"{diff[0]:+.{digits}f} (one seed)"
                continue
            if test == "sign-flip":
                tested[c] = (S.bootstrap_interval(diff), S.sign_flip_p(diff), diff)
            else:
                tested[c] = (S.t_interval(diff), S.t_p(diff), diff)
        adjusted = dict(zip(tested, S.holm([p for _, p, _ in tested.values()])))
        for c, (t, p, _) in tested.items():
            out[c, m] = f"{interval(t, digits)} {p_text(p)}" + ("*" if adjusted[c] < 0.05 else "")
        if tested:
            n = min(len(d) for _, _, d in tested.values())
            sd = statistics.median(S.mean_sd(d)[1] for _, _, d in tested.values())
            power[m] = (n, S.detectable(sd, n), S.detectable(sd, n, 0.05 / len(tested)))
    return out, power


def comparison(runs, conditions, lrs, base_lr, seeds, title):
    """One table: the baseline's mean ± sd, then per condition its lr, seeds and cells; the power line below."""
    rows, apart = {}, set()
    for c in conditions:
        rows[c], left = pairs(runs, c, "base", lrs[c], base_lr, seeds)
        apart.update(left)
    rows = {c: v for c, v in rows.items() if v}
    if not rows:
        return None
    base = [b for v in rows.values() for _, b in v.values()]
    base = list({id(b): b for b in base}.values())
    texts, power = cells(rows)
    family = sum(len(v) > 1 for v in rows.values())           # Holm's: the conditions tested (a second seed in)
    lines = [f"| {title} | lr | seeds | " + " | ".join(label for label, *_ in METRICS.values()) + " |",
             "|---" * (len(METRICS) + 3) + "|",
             f"| baseline (mean ± sd) | {lr_text(base_lr)} | {len(base)} | " + " | ".join(
                 mean_sd([f(r["profile"]) for r in base], d) for _, d, f, _ in METRICS.values()) + " |"]
    for c, v in rows.items():
        lines.append(f"| {NAMES[c]} | {lr_text(lrs[c])} | {len(v)} | " + " | ".join(
            texts.get((c, m), "") for m in METRICS) + " |")
    power_line = "; ".join(f"{METRICS[m][0].split(' (')[0]} {d:.{METRICS[m][1]}f} ({dh:.{METRICS[m][1]}f} at "
                           f"0.05/{family})" for m, (n, d, dh) in power.items())
    n = min(n for n, _, _ in power.values()) if power else 0
    counts = {(r["profile"]["n_tokens"], r["profile"]["analysis_tokens"]) for r in base}
    return "\n".join(lines), power_line, n, sorted(apart), family, max(counts)


def note(power_line, n, apart, family, missing, tokens):
    return (
        "Each cell: the method's value minus the baseline's of the same seed, the mean over the seeds, [its 95% "
        "interval] and p: for ζ_L the exact sign-flip permutation test (every one of the 2^n sign patterns of the "
        "differences) and a percentile bootstrap interval (9,999 resamples), for the others the paired t test and its "
        "t interval (n − 1 degrees of freedom; results/stats.py, scipy.stats). * marks a difference that survives "
        f"Holm's correction at 0.05 within its column: the family is one metric's {family} comparisons with the "
        f"baseline. ζ_L, Ψ_L and total Ψ (layers 2..L) are evaluate.py's profile on the first {tokens[0]:,} "
        f"validation tokens, the loss increase when block L is skipped and the logit lens on its first {tokens[1]:,}."
        + (f" The smallest difference the paired t test detects with 80% power at {n} seeds, from the median over the "
           f"methods of the sd of their differences, at 0.05 (and at 0.05/{family}, Holm's first step): {power_line}; "
           "smaller differences may exist unseen, and a cell without * says no difference was detected, not that "
           "there is none." if power_line else "")
        + (f" At {n} seeds the exact sign-flip test's smallest p is 2/2^{n} = {floor:.4f}, above "
           f"Holm's first step (0.05/{family} = {0.05 / family:.4f}): no ζ_L cell can be marked *, whatever the runs; "
           "its interval says what the seeds do." if n and (floor := untestable(n, family)) else "")
        + (f" Seeds left out for a differing arithmetic: {', '.join(map(str, apart))}." if apart else "")
        + (f" Not yet run: {missing}." if missing else ""))


def own_lrs():
    chosen = RC.picks(RC.load("sweep"))
    return {c: chosen[c][0] if c in chosen else RC.STUDY_LR for c in RC.CONDITIONS}, chosen


def table():
    """The main table: every condition of the sweep at its own lr, the baseline at its own."""
    lrs, chosen = own_lrs()
    if not all(chosen[c][1] for c in RC.METHODS):
        return "Not yet: the lr sweep is under way (python results/methods/run_comparison.py sweep)."
    runs = RC.load("table")
    out = comparison(runs, [c for c in RC.METHODS if c != "base"], lrs, lrs["base"], RC.SEEDS, "− baseline, own lr")
    if out is None:
        return "No runs yet: python results/methods/run_comparison.py table."
    text, power_line, n, apart, family, tokens = out
    missing = sum(RC.name(c, lrs[c], s) not in runs for c in RC.METHODS for s in RC.SEEDS)
    return text + "\n\n" + note(power_line, n, apart, family, f"{missing} runs" if missing else "", tokens)


def shared():
    """The second table: every condition, the variants too, at the study's lr."""
    runs = RC.load("table")
    shared = [c for c in RC.CONDITIONS if c not in RC.OPTIMIZER]
    lrs = {c: RC.STUDY_LR for c in shared}
    out = comparison(runs, [c for c in shared if c != "base"], lrs, RC.STUDY_LR, RC.SHARED_SEEDS,
                     f"− baseline, all at lr {lr_text(RC.STUDY_LR)}")
    if out is None:
        return "No runs yet: python results/methods/run_comparison.py shared."
    text, power_line, n, apart, family, tokens = out
    missing = sum(RC.name(c, RC.STUDY_LR, s) not in runs for c in shared for s in RC.SHARED_SEEDS)
    return text + "\n\n" + note(power_line, n, apart, family, f"{missing} runs" if missing else "", tokens)


def deep():
    """The 16-layer check: the baseline's ζ_L at 8 and 16 layers, and each condition − the baseline at 16."""
    runs, (lrs, _) = RC.load("deep"), own_lrs()
    conditions = sorted({r["condition"] for r in runs.values()} - {"base"}, key=list(RC.CONDITIONS).index)
    out = comparison(runs, conditions, lrs, lrs["base"], RC.DEEP_SEEDS, f"{RC.DEEP_LAYERS} layers, − baseline")
    if out is None:
        return "No runs yet: python results/methods/run_comparison.py deep."
    text, power_line, n, apart, family, tokens = out
    grown = depth(runs, conditions, lrs)                       # "" until two seeds are in at both depths
    missing = sum(RC.name(c, lrs[c], s) not in runs for c in ["base"] + conditions for s in RC.DEEP_SEEDS)
    return text + "\n\n" + (
        f"At {RC.DEEP_LAYERS} layers (the same width, data and steps), each condition at its 8-layer lr (the held-out "
        "sweep's pick; not chosen again at this depth), Backout's k kept at 3L/4. " + (grown + " " if grown else "")
        + note(power_line, n, apart, family, f"{missing} runs" if missing else "", tokens))


def last_over_middle(p):
    """Ψ_L over the mean Ψ of the middle layers 3..L−1: how far the last layer stands out at any depth (ζ_L is an
    absolute rise, and each layer of a deeper model moves the stream less)."""
    middle = p["psi"][2:-1]
    return p["psi"][-1] / (sum(middle) / len(middle))


def depth(runs, conditions, lrs):
    """What doubling the depth does: the baseline's ζ_L and Ψ_L over the middle layers' mean Ψ at 8 and at 16 layers
    (paired by seed: the same data order; one arithmetic), and whether each condition's mean difference from the
    baseline keeps its sign, in ζ_L and validation loss."""
    eight, zeta, loss = RC.load("table"), METRICS["zeta_L"][2], METRICS["val_loss"][2]
    at = lambda table, s: table.get(RC.name("base", lrs["base"], s))                  # noqa: E731
    base = [(at(runs, s), at(eight, s)) for s in RC.DEEP_SEEDS if at(runs, s) and at(eight, s)]
    base = [(a, b) for a, b in base if a["machine"]["arithmetic"] == b["machine"]["arithmetic"]]
    if len(base) < 2:
        return ""
    grow = [zeta(a["profile"]) - zeta(b["profile"]) for a, b in base]
    means = [S.mean_sd([zeta(pair[k]["profile"]) for pair in base])[0] for k in (1, 0)]
    out = (f"The baseline's ζ_L is {means[0]:.2f} at 8 layers and {means[1]:.2f} at {RC.DEEP_LAYERS} over the same "
           f"{len(base)} seeds ({RC.DEEP_LAYERS} − 8 layers: {interval(S.bootstrap_interval(grow), 2)}, "
           f"{p_text(S.sign_flip_p(grow))}, the exact sign-flip test" + (
               f", whose smallest p at {len(grow)} seeds is {floor:.4f}"
               if (floor := untestable(len(grow), 1)) else "") + ").")
    ratio = [[last_over_middle(pair[k]["profile"]) for pair in base] for k in (1, 0)]
    rise = [b - a for a, b in zip(*ratio)]
    out += (f" Yet Ψ_L over the mean Ψ of layers 3..L−1 is {S.mean_sd(ratio[0])[0]:.2f} at 8 layers and "
            f"{S.mean_sd(ratio[1])[0]:.2f} at {RC.DEEP_LAYERS} ({interval(S.t_interval(rise), 2)}, "
            f"{p_text(S.t_p(rise))}, paired t; ζ_L is an absolute rise, and each layer of a deeper model moves the "
            "stream less: the ratio reads the last layer against the layers below it).")
    paired = {c: [pairs(table, c, "base", lrs[c], lrs["base"], RC.DEEP_SEEDS)[0] for table in (eight, runs)]
              for c in conditions}                            # {condition: [{seed: pair} at 8 layers, at 16]}
    kept, flipped = [], []
    for c, at in paired.items():
        for m, f, digits in (("ζ_L", zeta, 2), ("val loss", loss, 4)):
            d = [[f(a["profile"]) - f(b["profile"]) for a, b in by_seed.values()] for by_seed in at]
            if all(d):
                d = [sum(x) / len(x) for x in d]
                text = f"{NAMES[c]}'s {m} {d[0]:+.{digits}f} → {d[1]:+.{digits}f}"
                sign = [(x > 0) - (x < 0) for x in d]
                (kept if sign[0] == sign[1] else flipped).append(text)
    below = [c for c, at in paired.items() if all(zeta(a["profile"]) < zeta(b["profile"]) for a, b in at[1].values())]
    out += f" At {RC.DEEP_LAYERS} layers ζ_L is below the baseline's in every seed for {listed(below)}."
    return out + (f" Against the baseline, 8 → {RC.DEEP_LAYERS} layers (mean differences over the seeds each has; a "
                  "sign says something only where the tables mark the difference *): the sign is kept by "
                  f"{'; '.join(kept) or 'none'}, and changes for {'; '.join(flipped) or 'none'}.")


def steps():
    """Each condition's training step as a ratio to the baseline's (scripts/bench.py --steps, interleaved rounds)."""
    if not os.path.exists(STEP_TIME):
        return "Not measured yet: python -m scripts.bench --steps configs/kjv.py ... --json " \
               "results/methods/step_time.json."
    r = json.load(open(STEP_TIME))
    res, config = r["results"], {os.path.splitext(os.path.basename(p))[0]: p for p in r["results"]["configs"]}
    of = {v: c for c, v in RC.CONDITIONS.items()}
    lines = ["| condition | step (ms) | × baseline [quartiles of the rounds' ratios] |", "|---|---|---|"]
    for name, ms in res["step_ms"].items():
        q = res["ratio_quartiles"][name]
        lines.append(f"| {NAMES.get(of.get(config[name]), name)} | {ms:.0f} | {res['ratio'][name]:.3f} "
                     f"[{q[0]:.3f}, {q[1]:.3f}] |")
    return "\n".join(lines) + (
        f"\n\nOne process ({r['machine'].get('cpu', '?')}, {res['threads']} thread, commit {r['git_commit']}): a "
        "training step of each config (its model, methods, objective and optimizer; one micro-batch of random tokens "
        f"at its shape), {res['repeats']} rounds with the configs interleaved, each round's time over the baseline's "
        "in "
        "the same round: the median ratio and its quartiles: a method's cost, the machine's load hitting every "
        "config alike (the runs' own step times record that load: two runs at a time on 2 cores)"
        + (f"; the load average was {res['load_average'][0]:.1f} at the start and {res['load_average'][1]:.1f} at "
           f"the end on {res['cpus']} CPUs (other work widens the quartiles)" if res.get("load_average") else
           "; measured beside two other training processes (other work widens the quartiles)") + ".")


def readme():
    """The README's two sentences: what the main table says once it is complete, else what is under way."""
    lrs, chosen = own_lrs()
    runs = RC.load("table")
    done = all(chosen[c][1] for c in RC.METHODS) and all(RC.name(c, lrs[c], s) in runs for c in RC.METHODS
                                                        for s in RC.SEEDS)
    if done:
        return finding(short=True)
    have = sum(RC.name(c, lrs[c], s) in runs for c in RC.METHODS for s in RC.SEEDS)
    return (f"The comparison (each method as its authors run it, its lr chosen on held-out seeds, {len(RC.SEEDS)} "
            f"seeds) is under way: {have} of its {len(RC.METHODS) * len(RC.SEEDS)} runs are in.")


def finding(short=False, part="table"):
    """What the main table (part "table") or the second ("shared") says, in two sentences from its runs: ζ_L (which
    methods end at 0.00 in every seed, which are below or above the baseline after Holm's correction of the exact
    sign-flip test) and validation loss (a cost or a gain named only where it survives the correction; otherwise no
    difference detected, with the interval; short: the names alone, for the README)."""
    lrs, chosen = own_lrs()
    if not all(chosen[c][1] for c in RC.METHODS):
        return "Not yet: the lr sweep is under way (python results/methods/run_comparison.py sweep)."
    runs = RC.load("table")
    if part == "shared":
        conditions, seeds = [c for c in RC.CONDITIONS if c not in RC.OPTIMIZER and c != "base"], RC.SHARED_SEEDS
        lrs, how = {c: RC.STUDY_LR for c in RC.CONDITIONS}, f"every condition at the study's lr {lr_text(RC.STUDY_LR)}"
    else:
        conditions, seeds = [c for c in RC.METHODS if c != "base"], RC.SEEDS
        how = "every method at its own lr (chosen on held-out seeds)"
    rows = {c: pairs(runs, c, "base", lrs[c], lrs["base"], seeds)[0] for c in conditions}
    rows = {c: v for c, v in rows.items() if len(v) > 1}
    if not rows:
        return f"No runs yet: python results/methods/run_comparison.py {part}."
    diff = lambda c, m: [METRICS[m][2](a["profile"]) - METRICS[m][2](b["profile"]) for a, b in rows[c].values()]  # noqa
    n = min(len(v) for v in rows.values())
    zp = {c: S.sign_flip_p(diff(c, "zeta_L")) for c in rows}
    zeta_held = [c for c, a in zip(zp, S.holm(list(zp.values()))) if a < 0.05]
    lower = [c for c in zeta_held if sum(diff(c, "zeta_L")) < 0]
    higher = [c for c in zeta_held if c not in lower]
    floor = untestable(n, len(rows))
    if floor:                                       # too few seeds for the test to pass Holm: what every seed says
        below = [c for c in rows if all(d < 0 for d in diff(c, "zeta_L"))]
        zeta_text = (f"ζ_L is below the baseline's in every seed for {listed(below)} (at {n} seeds the exact sign-flip "
                     f"test cannot pass Holm's correction: its smallest p, {floor:.4f}, is above 0.05/{len(rows)})")
    else:
        zeta_text = (f"ζ_L is below the baseline's after Holm's correction (the exact sign-flip test) for "
                     f"{listed(lower)}" + (f", above it for {listed(higher)}" if higher else ""))
    lt = {c: (S.t_interval(diff(c, "val_loss")), S.t_p(diff(c, "val_loss"))) for c in rows}
    held = {c: a < 0.05 for c, a in zip(lt, S.holm([p for _, p in lt.values()]))}
    zero = [c for c in rows if all(round(a["profile"]["zeta"][-1], 2) == 0 for a, _ in rows[c].values())]
    cell = lambda c: NAMES[c] if short else f"{NAMES[c]} {interval(lt[c][0], 4)}, {p_text(lt[c][1])}"   # noqa
    worse = [c for c in rows if held[c] and lt[c][0][0] > 0]
    better = [c for c in rows if held[c] and lt[c][0][0] < 0]
    return (f"Over {n} seeds, {how}: {listed(zero)} "
            f"{'ends' if len(zero) == 1 else 'end'} with ζ_L = 0.00 in every seed, and {zeta_text}. In validation "
            f"loss, {listed(worse)} {'costs' if len(worse) == 1 else 'cost'} more than the baseline after the "
            "correction"
            + (f" ({'; '.join(cell(c) for c in worse)})" if worse and not short else "")
            + f", {listed(better)} {'gains' if len(better) == 1 else 'gain'}"
            + (f" ({'; '.join(cell(c) for c in better)})" if better and not short else "")
            + ", and no difference is detected for "
            + ("; ".join(cell(c) for c in rows if c not in worse and c not in better) if not short
               else listed(c for c in rows if c not in worse and c not in better)) + ".")


FIGURE = os.path.join(HERE, "comparison.png")


def picked_runs(conditions):
    """{condition: {seed: run}} of the table's runs at each condition's pick, each paired by seed with the baseline's
    on one arithmetic (pairs()), or None while the sweep has not picked every one's lr."""
    chosen = RC.picks(RC.load("sweep"), conditions)
    if not all(done for _, done in chosen.values()):
        return None
    runs = RC.load("table")
    return {c: {s: a for s, (a, _) in pairs(runs, c, "base", chosen[c][0], chosen["base"][0], RC.SEEDS)[0].items()}
            for c in conditions}


def complete(by):
    """by when every condition has a run on every seed of the tables, else None."""
    return by if by and all(len(v) == len(RC.SEEDS) for v in by.values()) else None


def main_runs():
    """The main table's runs (every method of RC.METHODS at its pick) once every one is in, else None."""
    return complete(picked_runs(RC.METHODS))


def plot(path=FIGURE):
    """results/methods/comparison.png, once every run of the main table is in: the mean Ψ profile of every method in
    one panel, and ζ_L with its 95% bootstrap interval per method, in lib/style.py's colours (the baseline blue and JREG
    α = 1 orange, as in every figure; each other method a colour and a marker of its own) and layout (the legend below
    the panels)."""
    by = main_runs()
    if by is None:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
    from lib.style import LABELS, MARKERS, legend, line_styles, psi_per_layer, save
    shown = [c for c in NAMES if by.get(c)]
    colours = {c: style["color"] for c, style in line_styles(shown).items()}
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 3.8), layout="constrained",
                                      gridspec_kw={"width_ratios": [3, 2]})
    for i, c in enumerate(shown):
        profiles = [r["profile"]["psi"] for r in by[c].values()]
        mean = [sum(col) / len(col) for col in zip(*profiles)]
        left.plot(range(1, len(mean) + 1), mean, marker=MARKERS[i % len(MARKERS)], ms=4, color=colours[c],
                  label=f"{LABELS.get(c, NAMES[c])} ({len(profiles)} seeds)")
        m, lo, hi = S.bootstrap_interval([r["profile"]["zeta"][-1] for r in by[c].values()])
        right.errorbar([m], [i], xerr=[[m - lo], [hi - m]], fmt=MARKERS[i % len(MARKERS)], color=colours[c],
                       capsize=3)
    psi_per_layer(left)
    right.set_yticks(range(len(shown)), [LABELS.get(c, NAMES[c]) for c in shown], fontsize=8.5)
    right.invert_yaxis()
    right.set(xlabel=r"$\zeta_L$ (%): mean, 95% bootstrap interval", title="final-layer jump rate")
    for axis in (left.xaxis, right.xaxis):                         # layers; ζ_L in whole percent
        axis.set_major_locator(MaxNLocator(integer=True))
    for ax in (left, right):
        ax.grid(alpha=0.3)
    legend(fig, *left.get_legend_handles_labels())
    return save(fig, path)


def figure():
    return ("![Ψ per layer and ζ_L of every method at its own lr](../results/methods/comparison.png)"
            if main_runs() else "Not drawn yet: the main table's runs are under way.")


def cost():
    """The study's CPU time so far: the sum of its runs' wall-clock (each one thread), by part."""
    parts = {part: RC.load(part) for part in ("sweep", "table", "deep")}
    hours = {part: sum(r.get("wall_seconds", 0) for r in runs.values()) / 3600 for part, runs in parts.items()}
    unknown = sum("wall_seconds" not in r for runs in parts.values() for r in runs.values())
    return (f"{sum(map(len, parts.values()))} runs so far, {sum(hours.values()):.1f} CPU-hours (each run one thread, "
            "its wall-clock from train.py's start to the profile's end, two at a time on 2 cores): "
            + ", ".join(f"{part} {len(parts[part])} runs, {hours[part]:.1f} h" for part in parts)
            + (f"; {unknown} runs without a recorded time" if unknown else "") + ".")


BLOCKS = {"comparison-readme": readme, "comparison-sweep": sweep, "comparison-finding": finding,
          "comparison-table": table, "comparison-shared": shared,
          "comparison-shared-finding": lambda: finding(part="shared"), "comparison-steps": steps,
          "comparison-deep": deep, "comparison-cost": cost, "comparison-figure": figure}

if __name__ == "__main__":
    for block in BLOCKS.values():
        print(block(), end="\n\n")
