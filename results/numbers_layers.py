"""
The numbers README.md, docs/layers.md and docs/evaluation.md quote about layer analyses and task scores, from
results/layers/ (early exit of SmolLM2 and of the KJV models, the survey), results/smollm2/ and the BoolQ check of
results/kjv/; chance and majority of older results from results/task_rates_N.json.
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KJV = os.path.join(ROOT, "results", "kjv")
LAYERS = os.path.join(ROOT, "results", "layers")


def smollm2_finding():
    p = json.load(open(os.path.join(ROOT, "results", "smollm2", "profile.json")))
    cfg, prof = p["config"], p["profile"]
    quantised = "Q4_1" in p["model"]                            # the GGUF file that installs offline
    return (f"SmolLM2-135M-Instruct, a real open-weight Llama"
            + (" (its 4-bit quantised Q4_1 GGUF file, dequantised to fp32)" if quantised else "")
            + f", has ζ_L = {prof['zeta'][-1]:.2f} on the raw h_L and "
            f"{prof['zeta_normed'][-1]:.2f} on the final-normed one ({prof['n_tokens']:,} tokens of Genesis in windows "
            f"of {cfg['seq_len']}; other text moves these numbers, so compare them only on the same windows).")


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
    """The logit lens of the 600-step runs of seed 1337 (results/layers/kjv/early_exit.json), then of the seed study's
    five seeds (results/kjv/seeds/: 300 steps, the first 4,096 validation tokens), layer by layer and seed by seed."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import numbers_reproduction as repro
    d = json.load(open(os.path.join(LAYERS, "kjv", "early_exit.json")))["models"]
    base, jreg = (d[m]["profile"] for m in ("base", "jreg_a1"))
    gains = [b - j for b, j in zip(base["logit_lens_loss"][1:-1], jreg["logit_lens_loss"][1:-1])]
    L = len(gains) + 1
    every = "Every intermediate layer" if min(gains) > 0 else f"{sum(g > 0 for g in gains)} of the {len(gains)} intermediate layers"
    runs, seeds, _ = repro.seed_study()
    lens, lower = repro.paired(runs, seeds, repro.LAYER_ROWS["lens_mid"][2], "jreg_a1")
    worse = [(s, l, runs["jreg_a1"][s]["profile"]["logit_lens_loss"][l] - runs["base"][s]["profile"]["logit_lens_loss"][l])
             for s in seeds for l in range(1, L)]
    worse = [w for w in worse if w[2] > 0]
    n = len(seeds)
    seeds_text = (f"Over the seed study's {n} seeds (300 steps; the first 4,096 validation tokens) the mean logit-lens "
                  f"loss of h_3..h_{L - 1} is {abs(lens[0]):.3f} nats {'lower' if lens[0] < 0 else 'higher'} under JREG "
                  f"({lens[0]:+.3f} [{lens[1]:+.3f}, {lens[2]:+.3f}], lower in {lower} of {n} seeds), and JREG's layer "
                  f"is the worse at {len(worse)} of the {n * (L - 1)} (seed, layer) pairs of layers 1..{L - 1}"
                  + (": " + ", ".join(f"seed {s} h_{l} by {g:.2f}" for s, l, g in worse) if worse else "") + ".")
    return (f"In the 600-step runs of seed 1337 (one run each), {every[0].lower() + every[1:]} of the JREG model "
            f"{'is a better next-byte predictor' if min(gains) > 0 else 'are better next-byte predictors'} than the "
            f"baseline's (by {min(gains):.2f}–{max(gains):.2f} nats) at about the same final loss "
            f"({jreg['logit_lens_loss'][-1]:.3f} vs {base['logit_lens_loss'][-1]:.3f}), and skipping its last block "
            f"costs {jreg['skip_block_loss_increase'][-1]:+.2f} nats against {base['skip_block_loss_increase'][-1]:+.2f} "
            f"for the baseline. {seeds_text}")


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


def smollm2_load():
    """How long loading SmolLM2's GGUF file took in the survey (results/layers/survey/survey.json), for
    docs/evaluation.md."""
    models = json.load(open(os.path.join(LAYERS, "survey", "survey.json")))["models"]
    smol = next(r for name, r in models.items() if name.endswith(".gguf"))
    return f"{smol['load_s']:.0f} s for SmolLM2 in the survey of [layers.md](layers.md#survey-surveypy)"


BLOCKS = {"smollm2-finding": smollm2_finding, "smollm2-profile-finding": smollm2_profile_finding,
          "smollm2-tasks": smollm2_tasks, "smollm2-early-exit": smollm2_early_exit,
          "smollm2-exit-finding": smollm2_exit_finding, "kjv-exit-finding": kjv_exit_finding, "kjv-tasks": kjv_tasks,
          "kjv-boolq": kjv_boolq, "kjv-lens": kjv_lens, "kjv-lens-finding": kjv_lens_finding,
          "survey-table": survey_table, "survey-finding": survey_finding, "smollm2-load": smollm2_load}
