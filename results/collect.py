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


# ----------------------------------------------------------------------------------------------------------
# The 600-step runs of two seeds (results/kjv/profiles.json: evaluate.py --profile of the five runs at step 600)

RUNS600 = ("base", "jreg_a1", "jreg_a3", "base_seed1", "jreg_a1_seed1")


def profiles600():
    """{run: profile} and {run: seed} of the 600-step runs."""
    models = json.load(open(os.path.join(KJV, "profiles.json")))["models"]
    seeds = {r: json.load(open(os.path.join(KJV, f"{r}.json")))["config"].get("seed") or 1337 for r in RUNS600}
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
    return (f"The baselines grow a final-layer jump: Ψ_{L} = {b['psi'][-1]:.3f} and {b1['psi'][-1]:.3f} against "
            f"{min(middle):.3f}–{max(middle):.3f} in layers 2–{L - 2}, ζ_L = {b['zeta'][-1]:.2f} and "
            f"{b1['zeta'][-1]:.2f} for the two seeds, and ζ_L rises over training ({ckpts[50]:.2f} at step 50, "
            f"{ckpts[200]:.2f} at 200, {ckpts[600]:.2f} at 600, lower than the checkpoint before at "
            f"{', '.join(map(str, dips))}; `results/kjv/base_checkpoints.json`), as the paper reports for its models. "
            f"JREG with α = 1 removes it in both seeds (ζ_L = {a1['zeta'][-1]:.2f} and {a1s['zeta'][-1]:.2f}, Ψ_{L} = "
            f"{a1['psi'][-1]:.3f} and {a1s['psi'][-1]:.3f}); its validation loss differs from the same seed's "
            f"baseline by {a1['loss'] - b['loss']:+.4f} and {a1s['loss'] - b1['loss']:+.4f}. Under JREG the middle "
            f"layers become more readable: the logit-lens loss of h_3..h_{L - 1} drops by {min(lens_drop):.2f}–"
            f"{max(lens_drop):.2f} nats, and skipping the last block costs "
            f"{a1['skip_block_loss_increase'][-1]:+.3f} nats instead of {b['skip_block_loss_increase'][-1]:+.3f}. "
            f"α = 3, which puts about 95% of the weight on layer L, moves the jump one layer down (Ψ_{L - 1} = "
            f"{a3['psi'][-2]:.3f}, ζ_{{L−2}} = {a3['zeta'][-3]:.2f}). α = 1 keeps ζ_{{L−2}} at {a1['zeta'][-3]:.2f} "
            f"in seed 1337 but {a1s['zeta'][-3]:.2f} in seed 1: the penalty removes the last layer's jump, not "
            f"always the one below it.")


# ----------------------------------------------------------------------------------------------------------
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


def cpu_drift():
    """The largest move another CPU (same code) gave, in final val loss, mid-run val loss, Ψ_L and ζ_L."""
    runs, evals, committed = other_cpus()
    cpus = [r for r in runs if r["what"] == "cpu"]
    final = max(abs(r["profile"]["val_loss"] - committed["val_loss"]) for r in cpus)
    midrun = max(abs(r["val_loss"][s] - evals[s]) for r in cpus for s in evals)
    psi = max(abs(r["profile"][k] - committed[k]) for r in cpus for k in ("psi_L", "psi_L1", "psi_mid"))
    zeta = max(abs(r["profile"][k] - committed[k]) for r in cpus for k in ("zeta_L", "zeta_L2", "zeta_L_normed"))
    return final, midrun, psi, zeta, len(cpus)


def determinism():
    final, _, _, zeta, n = cpu_drift()
    return (f"**Determinism.** Bit-exact on the same CPU and code (any thread count); {n} other CPUs moved the final "
            f"validation loss by up to {final:.4f} and ζ_L by up to {zeta:.2f} (600-step runs), less than the seed "
            f"does: [reproduction](docs/reproduction.md#which-digits-are-exact).")


def cpu_finding():
    final, midrun, psi, zeta, n = cpu_drift()
    runs, _, committed = other_cpus()
    zetas = [committed["zeta_L"]] + [r["profile"]["zeta_L"] for r in runs]
    psis = [committed["psi_L"]] + [r["profile"]["psi_L"] for r in runs]
    jreg = [r["jreg_profile"]["zeta_L"] for r in runs if "jreg_profile" in r]
    return (f"Across the {n} other CPUs, the same code moved the final validation loss by up to {final:.4f}, a mid-run "
            f"one by up to {midrun:.4f}, Ψ by up to {psi:.4f} and ζ by up to {zeta:.2f}; a reordering of the "
            f"arithmetic moves them as much. Every variant tells the same story: the baseline ends with Ψ_L between "
            f"{min(psis):.4f} and {max(psis):.4f} and ζ_L between {min(zetas):.2f} and {max(zetas):.2f}, and the JREG "
            f"runs recorded beside two of them with ζ_L = {max(jreg):.2f}.")


# ----------------------------------------------------------------------------------------------------------
# Fine-tuning (results/sft_kjv/profile_kjv.json and profile_chat.json)

SFT_ROWS = {"base": "base (pre-trained)", "sft_base": "base → SFT (λ = 0)", "jreg_a1": "JREG (pre-trained)",
            "sft_jreg_a1": "JREG → SFT with JREG (λ = 1)", "sft_jreg_a1_off": "JREG → SFT without JREG (λ = 0)"}


def sft_profiles():
    load = lambda name: json.load(open(os.path.join(ROOT, "results", "sft_kjv", name)))["models"]   # noqa: E731
    return load("profile_kjv.json"), load("profile_chat.json")


def sft_table():
    kjv, chat = sft_profiles()
    lines = ["| model | KJV loss | KJV Ψ_L | KJV ζ_L | KJV ζ_{L−2} | chat loss | chat Ψ_L | chat ζ_L | chat ζ_{L−2} | "
             "answers ζ_L | answers ζ_{L−2} |", "|---" * 11 + "|"]
    for r, name in SFT_ROWS.items():
        k, c = kjv[r]["profile"], chat[r]["profile"]
        a = c["assistant"]
        lines.append(f"| {name} | {k['loss']:.4f} | {k['psi'][-1]:.4f} | {k['zeta'][-1]:.2f} | {k['zeta'][-3]:.2f} | "
                     f"{c['loss']:.4f} | {c['psi'][-1]:.4f} | {c['zeta'][-1]:.2f} | {c['zeta'][-3]:.2f} | "
                     f"{a['zeta'][-1]:.2f} | {a['zeta'][-3]:.2f} |")
    return "\n".join(lines) + (f"\n\nKJV: {kjv['base']['profile']['n_tokens']:,} tokens a row; the conversations: "
                               f"{chat['base']['profile']['n_tokens']:,} real tokens, and under \"answers\" the "
                               f"{chat['base']['profile']['assistant']['n_tokens']:,} of them that precede an "
                               f"assistant token. One run each (n = 1): no interval.")


def sft_finding():
    kjv, chat = sft_profiles()
    k = {r: m["profile"] for r, m in kjv.items()}
    c = {r: m["profile"] for r, m in chat.items()}
    middle = [v for r in ("base", "jreg_a1") for v in k[r]["psi"][1:-2]]
    last = [p[r]["psi"][-1] for p in (k, c) for r in ("base", "sft_base")]
    on = c["sft_jreg_a1"]
    return (f"The baseline's jump survives fine-tuning (ζ_L {c['base']['zeta'][-1]:.2f} → "
            f"{c['sft_base']['zeta'][-1]:.2f} on the conversations, {k['base']['zeta'][-1]:.2f} → "
            f"{k['sft_base']['zeta'][-1]:.2f} on the KJV; Ψ_L = {min(last):.3f}–{max(last):.3f} against "
            f"{min(middle):.3f}–{max(middle):.3f} in the base models' layers 2..L−2 on the KJV), and the JREG model kept "
            f"under JREG stays jump-free over its last three layers on the conversations (ζ_L = {on['zeta'][-1]:.2f}, "
            f"ζ_{{L−1}} = {on['zeta'][-2]:.2f}, ζ_{{L−2}} = {on['zeta'][-3]:.2f}). Fine-tuned *without* the penalty, "
            f"the JREG model's Ψ_L on the conversations grows ×{c['sft_jreg_a1_off']['psi'][-1] / c['jreg_a1']['psi'][-1]:.1f} "
            f"in 200 steps ({c['jreg_a1']['psi'][-1]:.4f} → {c['sft_jreg_a1_off']['psi'][-1]:.4f}) and ζ_{{L−2}} "
            f"rises from {c['jreg_a1']['zeta'][-3]:.2f} to {c['sft_jreg_a1_off']['zeta'][-3]:.2f} while ζ_L stays "
            f"{c['sft_jreg_a1_off']['zeta'][-1]:.2f}. One run each (n = 1).")


def packing_effect():
    """results/sft_kjv/packing_effect.json: the assistant-token loss of val conversations packed as in training vs
    each alone."""
    m = json.load(open(os.path.join(ROOT, "results", "sft_kjv", "packing_effect.json")))["measurements"]
    full, short = m
    lines = ["| val conversations | windows | after another in their window | loss packed | loss alone | packed − alone |",
             "|---|---|---|---|---|---|",
             f"| as prepared for the run (`--seq_len {full['prepared_seq_len']}`) | {full['windows']} | "
             f"{full['later_in_window']['conversations']} | {full['loss_packed']:.4f} | {full['loss_alone']:.4f} | "
             f"{full['difference_packed_minus_alone']:+.4f} |",
             f"| cut to {short['prepared_seq_len'] + 1} tokens (`--seq_len {short['prepared_seq_len']}`), packed into "
             f"{full['prepared_seq_len'] + 1} | {short['windows']} | {short['later_in_window']['conversations']} | "
             f"{short['loss_packed']:.4f} | {short['loss_alone']:.4f} | {short['difference_packed_minus_alone']:+.4f} |"]
    later = short["later_in_window"]
    first_same = all(x["first_in_window"]["max_abs_difference_of_sums"] == 0 for x in m)
    return "\n".join(lines) + (
        f"\n\nMost ShareGPT conversations fill a {full['prepared_seq_len'] + 1}-byte window alone (only "
        f"{full['train_conversations'] - full['train_windows']:,} of the run's {full['train_conversations']:,} training "
        f"conversations follow another in their window), so here packing changes almost nothing. Where conversations do "
        f"share windows, the earlier ones cost the later ones a little (those {later['conversations']}: "
        f"{later['loss_packed']:.4f} packed vs {later['loss_alone']:.4f} alone, "
        f"{later['loss_packed'] - later['loss_alone']:+.4f} nats). The first conversation of each window gives "
        + ("the same loss both ways to the last bit" if first_same else "DIFFERENT losses") + " (a check of the measurement).")


def sft_skip_finding():
    """What the chat layer analysis shows about the last block (results/sft_kjv/profile_chat.json)."""
    models = json.load(open(os.path.join(ROOT, "results", "sft_kjv", "profile_chat.json")))["models"]
    last = {r: m["profile"]["skip_block_loss_increase"][-1] for r, m in models.items()}
    n = models["base"]["profile"]["analysis_tokens"]
    sign = "lowers its loss" if last["jreg_a1"] < 0 else "raises its loss"
    return (f"On the conversations ({n:,} tokens), skipping the last block of the pre-trained JREG model {sign} by "
            f"{abs(last['jreg_a1']):.4f} nats, where skipping the baseline's costs {last['base']:+.4f}: on text it was "
            f"not trained on, the last block of the JREG model, which the penalty kept from moving h_L, does not help "
            f"the prediction. Fine-tuning gives that block work again ({last['sft_jreg_a1']:+.4f} with JREG kept on, "
            f"{last['sft_jreg_a1_off']:+.4f} without it; the baseline's {last['sft_base']:+.4f}). One run each.")


# ----------------------------------------------------------------------------------------------------------
# Speed and memory (results/speed/*.json, written by `python -m scripts.bench ... --json`)

def speed(name):
    return json.load(open(os.path.join(ROOT, "results", "speed", f"{name}.json")))


def machine_line(*records):
    ms = {(r["machine"]["cpu"], r["machine"]["gpu"], r["machine"]["threads"], r["machine"]["torch"]) for r in records}
    return "; ".join(f"{gpu or cpu}, {threads} thread{'s' * (threads > 1)}, torch {torch}"
                     for cpu, gpu, threads, torch in sorted(ms, key=str))


def speed_training():
    rows = {"train_vocab50304": "vocab 50,304, batch 4 × 256, eager", "train_vocab512": "vocab 512, batch 8 × 256, eager",
            "train_vocab512_compile": "vocab 512, batch 8 × 256, `--compile`"}
    records = [speed(n) for n in rows]
    lines = ["| setting | fwd+bwd ours / HF | train step ours / HF | JREG overhead (λ=1 vs λ=0 step) | command |",
             "|---|---|---|---|---|"]
    for (n, label), rec in zip(rows.items(), records):
        r = rec["results"]
        fb, st = r["fwd_bwd_ms"], r["step_ms"]
        lines.append(f"| {label} | {fb['HF'] / fb['ours']:.2f}× ({fb['ours']:.0f} vs {fb['HF']:.0f} ms) | "
                     f"{st['HF λ=0'] / st['ours λ=0']:.2f}× ({st['ours λ=0']:.0f} vs {st['HF λ=0']:.0f} ms) | "
                     f"{100 * r['jreg_overhead']:+.1f}% | `{rec['command']}` |")
    return "\n".join(lines) + f"\n\nMeasured on {machine_line(*records)} (`results/speed/train_*.json`)."


def speed_generation():
    records = [speed(f"generate_batch{b}") for b in (1, 8)]
    lines = ["| batch | cached | uncached | speed-up | same tokens |", "|---|---|---|---|---|"]
    for rec in records:
        r = rec["results"]
        lines.append(f"| {r['batch']} | {r['cached_tok_per_s']:.1f} tok/s | {r['uncached_tok_per_s']:.1f} tok/s | "
                     f"{r['cached_tok_per_s'] / r['uncached_tok_per_s']:.1f}× | {r['same_tokens']} |")
    return "\n".join(lines) + (f"\n\nMeasured on {machine_line(*records)}: `{records[0]['command']}` "
                               f"(`results/speed/generate_batch*.json`).")


def speed_against():
    rec = speed("against_b6b6601")
    r = rec["results"]
    return (f"Measured against `{r['against']}` (the code before the loss went through `lm_head`): training forward + "
            f"backward {r['ms']['now']:.0f} ms now vs {r['ms']['then']:.0f} ms then, speed now / then = "
            f"{r['speed_ratio']:.3f}×, the same loss bit for bit: {r['same_loss']} (`{rec['command']}`, "
            f"{machine_line(rec)}; `results/speed/against_b6b6601.json`).")


def memory_probe():
    """Measured peaks (torch.profiler's tensor bytes) beside the estimate, on CPU: fp32 and bf16 autocast, chunks of
    128 positions; and the bytes per logit of the loss at a 32,768 vocabulary."""
    fp32, bf16, big = speed("memory_probe"), speed("memory_probe_bf16"), speed("memory_probe_v32768")
    r, rb = fp32["results"], bf16["results"]
    ratio = ", ".join(f"{r['estimate_mb'][k] / r['peak_mb'][k]:.3f}" for k in r["peak_mb"])
    bpl = big["results"]["bytes_per_logit"]
    return (f"With `{fp32['command']}` (small preset, fp32, eager) the estimate is {ratio} of the measured peak (full "
            f"logits, chunked, chunked + checkpointing); the loss takes {r['bytes_per_logit']['full']:.1f} bytes per "
            f"logit with the full fp32 logits and {r['bytes_per_logit']['chunked']:.1f} chunked ({r['loss_chunk']} "
            f"positions a chunk); checkpointing the blocks took a step's peak from {r['peak_mb']['chunked loss']:.1f} "
            f"to {r['peak_mb']['chunked + checkpointing']:.1f} MB in fp32 and from {rb['peak_mb']['chunked loss']:.1f} "
            f"to {rb['peak_mb']['chunked + checkpointing']:.1f} MB under bf16 autocast, and took "
            f"{r['step_ms']['chunked + checkpointing'] / r['step_ms']['chunked loss']:.2f}× the step time in fp32. At "
            f"a 32,768 vocabulary (`{big['command']}`) the loss takes {bpl['full']:.2f} bytes per logit full and "
            f"{bpl['chunked']:.2f} chunked. Measured on {machine_line(fp32, bf16, big)} "
            f"(`results/speed/memory_probe*.json`).")


def memory_table():
    """bench.py --memory's predictions: the configs as they run, then eager, then eager with checkpointing."""
    records = [speed(n) for n in ("memory_8gpu", "memory_8gpu_eager", "memory_8gpu_ckpt")]
    cols = ("weights", "gradients", "optimizer", "buffers", "activations", "logits", "total")
    lines = ["| config | mode | micro × accum | " + " | ".join(cols) + " | margin |", "|---" * (len(cols) + 4) + "|"]
    for rec in records:
        for path, r in rec["results"]["configs"].items():
            name = os.path.basename(path).removesuffix(".py")
            lines.append(f"| {name} | {r['mode']} | {r['micro_batch']} × {r['grad_accum']} | "
                         + " | ".join(f"{r[c]:.2f}" for c in cols) + f" | {100 * r['margin']:.0f}% |")
    return "\n".join(lines) + "\n\n" + "; ".join(f"`{rec['command']}`" for rec in records) + \
        " (`results/speed/memory_8gpu*.json`)."

def tokenize_speed():
    """prepare_fineweb.py's pipeline against the bare tokenizer (results/speed/tokenize_*.json)."""
    names = ("tokenize_kjv_verses", "tokenize_kjv_chapters", "tokenize_kjv_smollm2")
    records = [speed(n) for n in names]
    lines = ["| documents | tokenizer | tokens | bare, tokens/s | pipeline, tokens/s | pipeline / bare |", "|---" * 6 + "|"]
    for rec in records:
        r = rec["results"]
        tok = "SmolLM2's (a GGUF file)" if rec["tokenizer"].startswith("hf:") else rec["tokenizer"]
        lines.append(f"| {rec['documents']} | {tok} | {r['tokens']:,} | {r['bare_tokens_per_s'] / 1e6:.2f}M | "
                     f"{r['pipeline_tokens_per_s'] / 1e6:.2f}M | {r['ratio']:.2f}× |")
    return "\n".join(lines) + (f"\n\nBest of {records[0]['results']['rounds']}, on {machine_line(*records)} "
                               f"(`results/speed/tokenize_*.json`, made by "
                               f"`results/speed/tokenize_bench.py`).")


def full_scale_estimate(mfu=0.35, peak=989e12, gpus=8, tokens=104.9e9):
    """Not a measurement: each config's FLOPs per token (Llama.flops_per_token, in memory_8gpu.json) at an assumed MFU
    on 8 × H100 SXM (989 TFLOP/s dense bf16 each), and the time for the paper's 104.9B tokens."""
    configs = speed("memory_8gpu")["results"]["configs"]
    lines = ["| size | parameters | GFLOP / token | tokens/s per 8 × H100 (est.) | 104.9B tokens on 1 node (est.) |",
             "|---|---|---|---|---|"]
    for path, r in configs.items():
        if "jreg" in path:
            continue
        rate = mfu * peak * gpus / r["flops_per_token"]
        hours = tokens / rate / 3600
        n = r["params"]
        size = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"
        lines.append(f"| {os.path.basename(path).removesuffix('.py')} | {size} | {r['flops_per_token'] / 1e9:.2f} | "
                     f"{rate / 1e6:.2f}M | {hours:.0f} h (4 nodes: {hours / 4:.0f} h) |")
    return "\n".join(lines) + f"\n\nAssumed: {100 * mfu:.0f}% MFU, {peak / 1e12:.0f} TFLOP/s per GPU, {gpus} GPUs a node."


def quickstart_time():
    q = json.load(open(os.path.join(KJV, "quickstart_run.json")))
    yours = [line for line in q["printed"] if "| yours |" in line]
    same = all(line.replace("yours", "committed") in q["printed"] for line in yours)
    m, sec = divmod(round(q["seconds"]), 60)
    return (f"From a fresh clone of `{q['commit']}` the quick start took {m} min {sec} s (`time bash quickstart.sh`, the "
            f"packages already installed; {q['machine']['cpu']}, torch {q['machine']['torch']}), and its table "
            + ("equalled the committed seed-1337 rows to the last printed digit" if same else "differed from the "
               "committed rows") + " (`results/kjv/quickstart_run.json`).")


# ----------------------------------------------------------------------------------------------------------
# The retrofit (results/retrofit/: before.json, after_*.json, the runs' logs, the checkpoints' profiles)

RETRO = os.path.join(ROOT, "results", "retrofit")
RETRO_RUNS = {"before": "source (step 0)", "after_base": "base (λ = 0, step 120)", "after_jreg": "jreg (λ = 1, step 120)",
              "after_jreg_normed": "jreg_normed (λ = 1 on normed h_L, step 120)"}


def retrofit_table():
    lines = ["| model | val loss | Ψ_L raw | Ψ_L normed | ζ_L raw | ζ_(L−2) raw | ζ_L normed | mean acc (8 tasks) | "
             "mean acc_norm (5) |", "|---" * 9 + "|"]
    for name, label in RETRO_RUNS.items():
        r = json.load(open(os.path.join(RETRO, f"{name}.json")))
        p, a = r["profile"], r["average"]
        lines.append(f"| {label} | {p['loss']:.4f} | {p['psi'][-1]:.4f} | {p['psi_normed'][-1]:.4f} | "
                     f"{p['zeta'][-1]:.2f} | {p['zeta'][-3]:.2f} | {p['zeta_normed'][-1]:.2f} | {a['acc']:.4f} | "
                     f"{a['acc_norm']:.4f} |")
    return "\n".join(lines)


def retrofit_training():
    """Each run's own evals (val loss; ζ_L in the run's penalty convention) and its checkpoints' profiles (the other
    convention), step 0 being the source."""
    evals = {run: {r["step"]: r for r in map(json.loads, open(os.path.join(RETRO, f"{run}_log.jsonl")))
                   if "val_loss" in r} for run in ("base", "jreg", "jreg_normed")}
    models = json.load(open(os.path.join(RETRO, "profiles.json")))["models"]
    source = next(m["profile"] for name, m in models.items() if name.endswith(".gguf"))
    ckpts = {run: {c["step"]: c for c in models[run]["profile_checkpoints"]} for run in ("base", "jreg")}
    ckpts["jreg_normed"] = {c["step"]: c for c in json.load(open(os.path.join(RETRO, "profiles_jreg_normed.json")))
                            ["profile_checkpoints"]}
    lines = ["| step | " + " | ".join(f"{run}: val loss | ζ_L raw | ζ_L normed" for run in evals) + " |",
             "|---" * 10 + "|"]
    for step in sorted(evals["base"]):
        cells = []
        for run, by_step in evals.items():
            e, c = by_step[step], ckpts[run].get(step, source)
            raw = c["zeta"][-1] if run == "jreg_normed" else e["zeta"][-1]
            normed = e["zeta"][-1] if run == "jreg_normed" else c["zeta_normed"][-1]
            cells.append(f"{e['val_loss']:.4f} | {raw:.2f} | {normed:.2f}")
        lines.append(f"| {step}{' (source)' if step == 0 else ''} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def retrofit_tasks():
    runs = {name: json.load(open(os.path.join(RETRO, f"{name}.json")))["results"] for name in RETRO_RUNS}
    rates = json.load(open(os.path.join(ROOT, "results", "task_rates_50.json")))["rates"]
    lines = ["| task | source | base | jreg | jreg_normed | chance | majority |", "|---" * 7 + "|"]
    for task in runs["before"]:
        cells = []
        for r in runs.values():
            t = r[task]
            cells.append(f"{t['acc']:.2f}" + (f" / {t['acc_norm']:.2f}" if "acc_norm" in t else ""))
        rate = rates[task]
        lines.append(f"| {task} | " + " | ".join(cells) + f" | {rate['chance']:.2f} | {rate['majority']:.2f} |")
    boolq = {name: r["boolq"]["acc"] for name, r in runs.items()}
    always_no = 1 - rates["boolq"]["majority"]
    return "\n".join(lines) + ("\n\nChance and majority: `results/task_rates_50.json` (`results/task_rates.py`). "
                               f"Always answering \"no\" scores {always_no:.2f} on BoolQ's 50 documents; the four models "
                               f"score {min(boolq.values()):.2f}–{max(boolq.values()):.2f}.")


def retrofit_runs():
    """{name: run json} of before/after_*, and {run: {step: eval}} of the runs' logs."""
    runs = {n: json.load(open(os.path.join(RETRO, f"{n}.json"))) for n in RETRO_RUNS}
    evals = {run: {r["step"]: r for r in map(json.loads, open(os.path.join(RETRO, f"{run}_log.jsonl")))
                   if "val_loss" in r} for run in ("base", "jreg", "jreg_normed")}
    return runs, evals


def retrofit_exit(layers=(24, 29, 30)):
    runs, _ = retrofit_runs()
    lines = ["| model | " + " | ".join(f"early exit acc, layer {l}" for l in layers) + " | lens loss h_{L−1} | lens loss h_L | "
             "removing block L |", "|---" * (len(layers) + 4) + "|"]
    for name, r in runs.items():
        exits, p = {e["layer"]: e["average"]["acc"] for e in r["early_exit"]}, r["profile"]
        lines.append(f"| {name} | " + " | ".join(f"{exits[l]:.3f}" for l in layers) + f" | {p['logit_lens_loss'][-2]:.3f} | "
                     f"{p['logit_lens_loss'][-1]:.3f} | {p['skip_block_loss_increase'][-1]:+.3f} |")
    return "\n".join(lines) + (f"\n\nMean acc of the eight tasks read out at each layer; the logit lens and the skipped "
                               f"block on the first {runs['before']['profile']['analysis_tokens']:,} validation tokens, in nats.")


def retrofit_moved():
    """The raw-penalty run against the baseline and the source, each number from results/retrofit/."""
    runs, evals = retrofit_runs()
    src, base, jreg, normed = (runs[n]["profile"] for n in RETRO_RUNS)
    avg = {n: runs[n]["average"] for n in RETRO_RUNS}
    ev = lambda run, step: evals[run][step]["val_loss"]                                          # noqa: E731
    z = lambda run, step: evals[run][step]["zeta"][-1]                                           # noqa: E731
    exits = {n: {e["layer"]: e["average"]["acc"] for e in runs[n]["early_exit"]} for n in RETRO_RUNS}
    exit_gap = max(abs(exits["after_jreg"][l] - exits["after_base"][l]) for l in exits["after_base"] if l >= 20)
    psi_gap = max(abs(a - b) for a, b in zip(base["psi"][:-1], jreg["psi"][:-1]))
    lens = lambda p: p["logit_lens_loss"][-2] - p["logit_lens_loss"][-1]                         # noqa: E731
    finals = [p["logit_lens_loss"][-1] for p in (base, jreg, normed)]
    skip = lambda p: p["skip_block_loss_increase"][-1]                                           # noqa: E731
    return f"""- **The raw jump halves, and keeps falling.** JREG took ζ_L on the raw residual stream (the convention it penalises)
  from {src['zeta'][-1]:.2f} to {jreg['zeta'][-1]:.2f} and Ψ_L from {src['psi'][-1]:.3f} to {jreg['psi'][-1]:.3f}, while the baseline's stayed near the source's ({base['zeta'][-1]:.2f}, {base['psi'][-1]:.3f}). Most of
  the fall came in the first 40 steps ({z('jreg', 0):.2f} → {z('jreg', 40):.2f} on the training windows), then it slowed ({z('jreg', 120):.2f} at step 120), still
  falling when the budget ended: 245,760 tokens did not remove the jump. The layers before L did not take it over:
  Ψ_1..Ψ_{{L−1}} of the two runs agree to {psi_gap:.3f}, and ζ_(L−2) is {jreg['zeta'][-3]:.2f} against the baseline's {base['zeta'][-3]:.2f}.
- **The final-normed jump did not move** (rather, it grew: {src['zeta_normed'][-1]:.2f} → {base['zeta_normed'][-1]:.2f} base, {jreg['zeta_normed'][-1]:.2f} jreg). The penalty acts on the
  raw h_L, and the final RMSNorm's per-channel gain can turn a smaller raw step into a large angle. A retrofit meant to
  remove the jump that analyses of open-weight models report (they read HF's normed h_L) needs the penalty on that
  vector: the third run, below.
- **The cost in loss is small and stable**: validation loss {ev('jreg', 120) - ev('base', 120):+.4f} at step 120 on the training windows
  ({ev('jreg', 120):.4f} vs {ev('base', 120):.4f}), {jreg['loss'] - base['loss']:+.4f} on the profile's {jreg['n_tokens']:,} tokens ({jreg['loss']:.4f} vs {base['loss']:.4f}), a gap of
  {ev('jreg', 20) - ev('base', 20):+.4f} after the first 20 steps.
- **Tasks**: continued pre-training on the KJV cost both runs about the same (mean acc {avg['before']['acc']:.4f} → {avg['after_base']['acc']:.4f} base,
  {avg['after_jreg']['acc']:.4f} jreg; acc_norm {avg['before']['acc_norm']:.3f} → {avg['after_base']['acc_norm']:.3f}, {avg['after_jreg']['acc_norm']:.3f}); jreg vs base is {avg['after_jreg']['acc'] - avg['after_base']['acc']:+.3f} acc and
  {avg['after_jreg']['acc_norm'] - avg['after_base']['acc_norm']:+.3f} acc_norm, inside the noise (the standard error of a mean of eight tasks at n = 50 is
  about 0.025). One run each, so no interval. Early exit differs between JREG and the baseline by at most {exit_gap:.3f} at
  any layer from 20 on: the last block still does most of the work of reading out (the logit-lens loss falls from
  h_{{L−1}} to h_L by {lens(src):.2f} nats in the source model, {src['logit_lens_loss'][-2]:.3f} → {src['logit_lens_loss'][-1]:.3f}, and by {lens(base):.2f}, {lens(jreg):.2f} and {lens(normed):.2f} nats
  after the baseline, JREG and JREG-on-the-normed-h_L runs, to {min(finals):.2f}–{max(finals):.2f}; removing the last block costs
  {skip(src):+.3f} (source), {skip(base):+.3f}, {skip(jreg):+.3f} and {skip(normed):+.3f} nats: `logit_lens_loss` and `skip_block_loss_increase` of
  `results/retrofit/{{before,after_*}}.json`)."""


def retrofit_normed():
    runs, evals = retrofit_runs()
    src, base, jreg, normed = (runs[n]["profile"] for n in RETRO_RUNS)
    avg = {n: runs[n]["average"] for n in RETRO_RUNS}
    ev = lambda run, step: evals[run][step]["val_loss"]                                          # noqa: E731
    z = lambda step: evals["jreg_normed"][step]["zeta"][-1]                                      # noqa: E731
    exit29 = {e["layer"]: e["average"]["acc"] for e in runs["after_jreg_normed"]["early_exit"]}[29]
    skip = [p["skip_block_loss_increase"][-1] for p in (src, base, jreg)]
    return f"""- **Each penalty removes the jump it sees, and only that one.** On the normed h_L, ζ_L went from {src['zeta_normed'][-1]:.2f} to {normed['zeta_normed'][-1]:.2f} (Ψ_L
  {src['psi_normed'][-1]:.3f} → {normed['psi_normed'][-1]:.3f}), against {base['zeta_normed'][-1]:.2f} for the baseline: {normed['zeta_normed'][-1] / src['zeta_normed'][-1] - 1:+.0%}, where the raw run took {jreg['zeta'][-1] / src['zeta'][-1] - 1:+.0%} off its own
  convention. Over training (the table above): {z(0):.2f} → {z(20):.2f} after 20 steps, {z(60):.2f} after 60, {z(120):.2f} at 120, still falling
  slowly. The raw jump did not move ({src['zeta'][-1]:.2f} → {normed['zeta'][-1]:.2f}; the baseline {base['zeta'][-1]:.2f}), nor ζ_(L−2) ({normed['zeta'][-3]:.2f}). Likewise the raw run
  left the normed jump where it was ({jreg['zeta_normed'][-1]:.2f}). With the penalty on the normed vector, the normed step of the last
  layer came down to about the size of the raw one (Ψ_L {normed['psi_normed'][-1]:.3f} normed, {normed['psi'][-1]:.3f} raw), where the source's was
  {src['psi_normed'][-1] / src['psi'][-1]:.1f} times larger.
- **It costs more loss**: {ev('jreg_normed', 120) - ev('base', 120):+.3f} in validation loss on the training windows ({ev('jreg_normed', 120):.4f} vs {ev('base', 120):.4f} at step 120) and
  {normed['loss'] - base['loss']:+.3f} on the profile's {normed['n_tokens']:,} tokens ({normed['loss']:.4f} vs {base['loss']:.4f}), against {ev('jreg', 120) - ev('base', 120):+.3f} and {jreg['loss'] - base['loss']:+.3f} for the raw
  penalty. The gap was {ev('jreg_normed', 20) - ev('base', 20):+.3f} at step 20. A likely reason, not tested here: the normed h_L is the vector
  the head reads, so turning it costs the next-token loss directly.
- **Tasks and reading out**: mean acc {avg['after_jreg_normed']['acc']:.4f} and acc_norm {avg['after_jreg_normed']['acc_norm']:.4f} (base {avg['after_base']['acc']:.4f} / {avg['after_base']['acc_norm']:.4f}, jreg
  {avg['after_jreg']['acc']:.4f} / {avg['after_jreg']['acc_norm']:.4f}), inside the noise of 50 documents a task (about 0.025 for the mean of eight).
  The logit lens reads layer L−1 better (loss {normed['logit_lens_loss'][-2]:.3f} vs {base['logit_lens_loss'][-2]:.3f} for the baseline and {jreg['logit_lens_loss'][-2]:.3f} for jreg). Block L
  matters less: removing it costs {normed['skip_block_loss_increase'][-1]:+.3f} nats against {min(skip):+.3f} to {max(skip):+.3f}. Early exit at layer 29: {exit29:.3f}."""


# ----------------------------------------------------------------------------------------------------------
# Layer analyses (results/layers/: early exit of SmolLM2 and of the KJV models, the survey)

LAYERS = os.path.join(ROOT, "results", "layers")


def cell(r):
    return f"{r['acc']:.2f}" + (f" / {r['acc_norm']:.2f}" if "acc_norm" in r else "")


def smollm2_early_exit(shown=(0, 10, 20, 24, 27, 28, 29)):
    d = json.load(open(os.path.join(LAYERS, "smollm2", "early_exit.json")))
    rates = json.load(open(os.path.join(ROOT, "results", "task_rates_100.json")))["rates"]
    tasks = list(d["results"])
    lines = ["| exit layer | " + " | ".join(tasks) + " | average acc | average acc_norm |", "|---" * (len(tasks) + 3) + "|"]
    exits = {e["layer"]: e for e in d["early_exit"]}
    for l in shown:
        e = exits[l]
        lines.append(f"| {l}{' (embedding)' if l == 0 else ''} | " + " | ".join(cell(e["results"][t]) for t in tasks)
                     + f" | {e['average']['acc']:.3f} | {e['average']['acc_norm']:.3f} |")
    lines.append(f"| **{d['profile']['n_layer']} (the model)** | " + " | ".join(cell(d["results"][t]) for t in tasks)
                 + f" | **{d['average']['acc']:.3f}** | **{d['average']['acc_norm']:.3f}** |")
    for rate in ("chance", "majority"):
        values = [rates[t][rate] for t in tasks]
        lines.append(f"| {rate} | " + " | ".join(f"{v:.2f}" for v in values) + f" | {sum(values) / len(values):.3f} | |")
    return "\n".join(lines) + "\n\nChance and majority: `results/task_rates_100.json` (`results/task_rates.py`)."


def kjv_tasks():
    d = json.load(open(os.path.join(LAYERS, "kjv", "early_exit.json")))["models"]
    rates = json.load(open(os.path.join(ROOT, "results", "task_rates_300.json")))["rates"]
    tasks = list(d["base"]["results"])
    lines = ["| task | base | JREG α = 1 | chance | majority |", "|---" * 5 + "|"]
    for t in tasks:
        lines.append(f"| {t} | {cell(d['base']['results'][t])} | {cell(d['jreg_a1']['results'][t])} | "
                     f"{rates[t]['chance']:.2f} | {rates[t]['majority']:.2f} |")
    mean = lambda rate: sum(rates[t][rate] for t in tasks) / len(tasks)                         # noqa: E731
    lines.append(f"| **average** acc | {d['base']['average']['acc']:.3f} | {d['jreg_a1']['average']['acc']:.3f} | "
                 f"{mean('chance'):.3f} | {mean('majority'):.3f} |")
    return "\n".join(lines) + "\n\nChance and majority: `results/task_rates_300.json` (`results/task_rates.py`)."


def kjv_lens():
    d = json.load(open(os.path.join(LAYERS, "kjv", "early_exit.json")))["models"]
    base, jreg = (d[m]["profile"]["logit_lens_loss"] for m in ("base", "jreg_a1"))
    lines = ["| layer l | " + " | ".join(map(str, range(len(base)))) + " |", "|---" * (len(base) + 1) + "|",
             "| base | " + " | ".join(f"{v:.3f}" for v in base) + " |",
             "| JREG α = 1 | " + " | ".join(f"{v:.3f}" for v in jreg) + " |",
             "| Δ | " + " | ".join(f"{j - b:+.2f}".replace("-", "−") for b, j in zip(base, jreg)) + " |"]
    return "\n".join(lines) + f"\n\n{d['base']['profile']['analysis_tokens']:,} validation tokens."


def smollm2_exit_finding():
    d = json.load(open(os.path.join(LAYERS, "smollm2", "early_exit.json")))
    acc = {e["layer"]: e["average"]["acc"] for e in d["early_exit"]}
    lambada = {e["layer"]: e["results"]["lambada_openai"]["acc"] for e in d["early_exit"]}
    p, L = d["profile"], d["profile"]["n_layer"]
    chance = sum(d["chance"].values()) / len(d["chance"])
    gain, late = acc[L] - chance, acc[L] - acc[L - 3]
    lens = p["logit_lens_loss"]
    first_lambada = min(l for l, v in lambada.items() if v > 0)
    return (f"Through layer 23 the average accuracy stays near chance ({min(acc[l] for l in range(24)):.3f}–"
            f"{max(acc[l] for l in range(24)):.3f}, chance {chance:.3f}); it leaves it at layer 24 ({acc[24]:.3f}), and "
            f"{late / gain:.0%} of the final gain over chance ({gain:.3f}) comes from the last three blocks "
            f"({acc[L - 3]:.3f} → {acc[L]:.3f}); LAMBADA's last word is never the top prediction before layer "
            f"{first_lambada} and is in {lambada[L]:.0%} of the documents after block {L}. The logit-lens loss tells "
            f"the same story ({min(lens[1:21]):.1f}–{max(lens[1:21]):.1f} nats in layers 1–20, {lens[23]:.1f} at 23, "
            f"{lens[28]:.1f} at 28, {lens[L]:.2f} at {L}), and so does the profile (on {p['n_tokens']:,} tokens here): "
            f"Ψ between {min(p['psi'][2:23]):.3f} and {max(p['psi'][2:23]):.3f} in layers 3–23, Ψ_{L} = "
            f"{p['psi'][-1]:.3f} raw ({p['psi_normed'][-1]:.3f} normed), ζ_L = {p['zeta'][-1]:.2f}.")


def kjv_exit_finding():
    models = json.load(open(os.path.join(LAYERS, "kjv", "early_exit.json")))["models"]
    accs = [e["average"]["acc"] for m in models.values() for e in m["early_exit"]] + \
        [m["average"]["acc"] for m in models.values()]
    chance = models["base"]["chance"]
    return (f"Their task accuracy is **at chance** at every layer, full depth included (average acc "
            f"{min(accs):.3f}–{max(accs):.3f} at every exit layer for both, against {sum(chance.values()) / len(chance):.3f} "
            f"for a uniform guess; {models['base']['results']['boolq']['n']} documents per task), so early exit says "
            f"nothing about them.")


def smollm2_tasks():
    """results/smollm2/tasks.json (made before chance and majority were recorded: those of the same 200 documents,
    results/task_rates_200.json), as evaluate.py prints a task table."""
    d = json.load(open(os.path.join(ROOT, "results", "smollm2", "tasks.json")))
    rates = json.load(open(os.path.join(ROOT, "results", "task_rates_200.json")))["rates"]
    pm = lambda r, k: f"{r[k]:.4f} ± {r[k + '_stderr']:.4f}" if k in r else "–"                # noqa: E731
    lines = ["| task | split | n | acc | acc_norm | perplexity | chance | majority |", "|---" * 8 + "|"]
    for task, r in d["results"].items():
        ppl = f"{r['perplexity']:.2f}" if "perplexity" in r else "–"
        lines.append(f"| {task} | {r['split']} | {r['n']} | {pm(r, 'acc')} | {pm(r, 'acc_norm')} | {ppl} | "
                     f"{rates[task]['chance']:.4f} | {rates[task]['majority']:.4f} |")
    a, tasks = d["average"], list(d["results"])
    mean = lambda rate: sum(rates[t][rate] for t in tasks) / len(tasks)                         # noqa: E731
    lines.append(f"| **average** | | | **{a['acc']:.4f}** ({a['n_tasks']} tasks) | **{a['acc_norm']:.4f}** "
                 f"({a['n_tasks_acc_norm']} tasks) | | {mean('chance'):.4f} | {mean('majority'):.4f} |")
    boolq, sciq = d["results"]["boolq"], d["results"]["sciq"]
    return "\n".join(lines) + (
        f"\n\nBoolQ's {boolq['acc']:.3f} is under both its chance ({rates['boolq']['chance']:.2f}) and its majority rate "
        f"({rates['boolq']['majority']:.3f}, \"yes\"), as the KJV models' is "
        f"([layers.md](layers.md#the-small-reproductions-baseline-and-jreg-models)), and SciQ's {sciq['acc']:.2f} under "
        f"its majority rate, {rates['sciq']['majority']:.2f} (the answer is always the fourth).")


def smollm2_profile_finding():
    d = json.load(open(os.path.join(ROOT, "results", "smollm2", "profile.json")))
    p = d["profile"]
    psi, skip, lens, L = p["psi"], p["skip_block_loss_increase"], p["logit_lens_loss"], p["n_layer"]
    return (f"On {p['n_tokens']:,} tokens of KJV Genesis (sequences of {d['config']['seq_len']}; "
            f"`results/smollm2/profile.json`) it shows the jump: Ψ_l is {min(psi[2:23]):.3f}–{max(psi[2:23]):.3f} in "
            f"layers 3–23, {psi[23]:.3f} and {psi[24]:.3f} in layers 24–25 ({min(psi[25:29]):.3f}–{max(psi[25:29]):.3f} in "
            f"26–29; the first two blocks move the stream most, {psi[0]:.3f} and {psi[1]:.3f}), and Ψ_{L} = {psi[-1]:.3f} "
            f"on the raw stream; ζ_L = **{p['zeta'][-1]:.2f}** raw and **{p['zeta_normed'][-1]:.2f}** with the "
            f"final-normed h_L (ζ_{{L−2}} {p['zeta'][-3]:.2f} / {p['zeta_normed'][-3]:.2f}): the final norm's gains "
            f"multiply the apparent last-layer displacement by {p['psi_normed'][-1] / psi[-1]:.1f} (Ψ_{L} = "
            f"{p['psi_normed'][-1]:.3f} normed), which is why the convention must always be stated. Skipping one block "
            f"costs {skip[0]:+.1f} and {skip[1]:+.1f} nats for blocks 1–2 but only {min(skip[12:20]):+.2f} to "
            f"{max(skip[12:20]):+.2f} for blocks 13–20, and the logit lens stays at {min(lens[1:21]):.1f}–"
            f"{max(lens[1:21]):.1f} nats through layer 20 before falling to {lens[L]:.2f} at layer {L} (the first "
            f"{p['analysis_tokens']:,} tokens): the middle layers are under-used.")


def kjv_boolq():
    """The BoolQ check of the seed study's seed-1337 runs against lm-evaluation-harness (scripts/harness_check.py)."""
    checks = {m: json.load(open(os.path.join(KJV, f"boolq_harness_{m}_seed1337.json")))["tasks"]["boolq"]
              for m in ("base", "jreg_a1")}
    b, j = checks["base"], checks["jreg_a1"]
    r50 = json.load(open(os.path.join(ROOT, "results", "task_rates_50.json")))["rates"]["boolq"]
    return (f"The seed study's 300-step runs of seed 1337 (`results/kjv/run_seeds.py`; the quick start's config) score "
            f"{b['acc_ours']:.4f} and {j['acc_ours']:.4f} on these {b['n_docs']} documents: exactly the share of \"no\" "
            f"among them (gold \"yes\": {b['gold_share']['yes']:.4f}), because both prefer \" no\" to \" yes\" on "
            f"{b['preferred_share'].get('no', 0):.0%} and {j['preferred_share'].get('no', 0):.0%} of the documents (\" yes\" "
            f"is one byte longer). On the first 50 ({r50['majority']:.0%} \"yes\") always \"no\" scores "
            f"{1 - r50['majority']:.2f}, the BoolQ of the retrofit runs in [retrofit.md](retrofit.md). "
            f"lm-evaluation-harness agrees request by request: its own BoolQ YAML builds "
            f"{'the same' if b['prompts_identical'] and j['prompts_identical'] else 'OTHER'} {b['n_requests']} prompts "
            f"from these documents, its HFLM on the checkpoint exported to "
            f"transformers gives the same log-likelihoods (largest difference {b['max_abs_ll_difference']:g} and "
            f"{j['max_abs_ll_difference']:g}) and the same acc per document (`results/kjv/boolq_harness_*.json`; the "
            f"passages still lack SuperGLUE's titles, a data difference no offline check removes).")


def kjv_lens_finding():
    d = json.load(open(os.path.join(LAYERS, "kjv", "early_exit.json")))["models"]
    base, jreg = (d[m]["profile"] for m in ("base", "jreg_a1"))
    gains = [b - j for b, j in zip(base["logit_lens_loss"][1:-1], jreg["logit_lens_loss"][1:-1])]
    return (f"Every intermediate layer of the JREG model is a better next-byte predictor than the baseline's (by "
            f"{min(gains):.2f}–{max(gains):.2f} nats) at about the same final loss ({jreg['logit_lens_loss'][-1]:.3f} vs "
            f"{base['logit_lens_loss'][-1]:.3f}): its work is spread over the depth instead of left to the last block, "
            f"whose skip costs {jreg['skip_block_loss_increase'][-1]:+.2f} nats against "
            f"{base['skip_block_loss_increase'][-1]:+.2f} for the baseline.")


def survey_finding():
    models = json.load(open(os.path.join(LAYERS, "survey", "survey.json")))["models"]
    smol = next(r for name, r in models.items() if name.endswith(".gguf"))
    runs = lambda name: sorted((r for n, r in models.items() if n.startswith(name)), key=lambda r: r["step"])  # noqa
    base, jreg = runs("out/kjv/base@"), runs("out/kjv/jreg_a1@")
    s = lambda r, c="raw": r["summary"][c]                                                        # noqa: E731
    kjv_load = [r["load_s"] for r in base + jreg]
    kjv_prof = sorted(r["profile_s"] for r in base + jreg)
    return (f"**Time per model on CPU** (2 cores shared with other jobs): SmolLM2-135M took {smol['load_s']:.0f} s to "
            f"load (GGUF de-quantisation and conversion) and {smol['profile_s']:.0f} s to profile "
            f"{smol['profile']['n_tokens']:,} tokens; the 1.6M-parameter KJV checkpoints at most {max(kjv_load):.1f} s to "
            f"load and {kjv_prof[0]:.0f}–{kjv_prof[-3]:.0f} s to profile ({kjv_prof[-2]:.0f} and {kjv_prof[-1]:.0f} s when the "
            f"other jobs peaked). Profile time grows with parameters × tokens; `--tokens 4096` gives a rougher survey in "
            f"a quarter of the time. SmolLM2's raw last block moves the stream {s(smol)['psi_L_over_middle']:.1f}× as much "
            f"as its middle layers, {s(smol, 'normed')['psi_L_over_middle']:.1f}× with the final-normed h_L; the KJV "
            f"baseline's jump grows over training (ζ_L {s(base[0])['zeta_L']:.2f} → {s(base[-1])['zeta_L']:.2f}, "
            f"ζ_{{L−2}} {s(base[0])['zeta_L_minus_2']:.2f} → {s(base[-1])['zeta_L_minus_2']:.2f}) while the JREG run's "
            f"ζ_L stays {max(s(r)['zeta_L'] for r in jreg):.2f} and its Ψ_L sits at "
            f"{min(s(r)['psi_L_over_middle'] for r in jreg):.1f}–{max(s(r)['psi_L_over_middle'] for r in jreg):.1f} "
            f"times the middle layers' Ψ.")


def survey_table():
    sys.path.insert(0, ROOT)
    from scripts.survey import table                       # the table survey.py prints, from its committed JSON
    return table(json.load(open(os.path.join(LAYERS, "survey", "survey.json")))["models"])


def blocks():
    """{name: generated text} of every block."""
    runs = seed_runs()
    seeds, values = stats(runs)
    return {"kjv-seeds": seed_table(seeds, values), "kjv-paired": paired_table(seeds, values),
            "kjv-runs": run_table(runs), "kjv-finding": finding(seeds, values),
            "retrofit-finding": retrofit_finding(), "smollm2-finding": smollm2_finding(),
            "kjv600-runs": kjv600_runs(), "kjv600-layers": kjv600_layers(), "kjv600-finding": kjv600_finding(),
            "cpu-loss": cpu_loss_table(), "cpu-profile": cpu_profile_table(), "cpu-finding": cpu_finding(),
            "determinism": determinism(), "sft-table": sft_table(), "sft-finding": sft_finding(),
            "speed-training": speed_training(), "speed-generation": speed_generation(),
            "speed-against": speed_against(), "memory-probe": memory_probe(),
            "memory-table": memory_table(), "full-scale-estimate": full_scale_estimate(),
            "quickstart-time": quickstart_time(), "retrofit-table": retrofit_table(),
            "retrofit-training": retrofit_training(), "retrofit-tasks": retrofit_tasks(),
            "smollm2-early-exit": smollm2_early_exit(), "kjv-tasks": kjv_tasks(), "kjv-lens": kjv_lens(),
            "survey-table": survey_table(), "smollm2-exit-finding": smollm2_exit_finding(),
            "kjv-exit-finding": kjv_exit_finding(), "retrofit-moved": retrofit_moved(), "retrofit-exit": retrofit_exit(),
            "retrofit-normed": retrofit_normed(), "smollm2-tasks": smollm2_tasks(),
            "smollm2-profile-finding": smollm2_profile_finding(), "kjv-boolq": kjv_boolq(),
            "kjv-lens-finding": kjv_lens_finding(), "survey-finding": survey_finding(),
            "packing-effect": packing_effect(), "tokenize-speed": tokenize_speed(),
            "sft-skip-finding": sft_skip_finding()}, (runs, seeds, values)


MARKER = re.compile(r"(<!-- results/collect\.py: ([\w-]+) -->\n)((?:(?!<!-- )[\s\S])*?)(\n?<!-- end -->)")


def rewrite(text, generated, path, stale):
    def one(m):
        if m.group(2) not in generated:
            raise SystemExit(f"error: {path}: no block {m.group(2)!r} (blocks: {', '.join(generated)})")
        if m.group(3) != generated[m.group(2)]:
            stale.append(f"{os.path.relpath(path, ROOT)}: {m.group(2)}")
        return m.group(1) + generated[m.group(2)] + "\n<!-- end -->"
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
