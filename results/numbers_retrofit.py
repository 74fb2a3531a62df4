"""
The numbers README.md and docs/retrofit.md quote about the retrofit of SmolLM2-135M-Instruct, from results/retrofit/:
before.json, after_*.json, the runs' logs and the checkpoints' profiles (one run each).
"""
import functools
import json
import math
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RETRO = os.path.join(ROOT, "results", "retrofit")
RETRO_RUNS = {"before": "source (step 0)", "after_base": "base (λ = 0, step 120)", "after_jreg": "jreg (λ = 1, step 120)",
              "after_jreg_normed": "jreg_normed (λ = 1 on normed h_L, step 120)"}


@functools.cache
def retrofit_runs():
    """{name: run json} of before/after_*, and {run: {step: eval}} of the runs' logs, read once."""
    runs = {n: json.load(open(os.path.join(RETRO, f"{n}.json"))) for n in RETRO_RUNS}
    evals = {run: {r["step"]: r for r in map(json.loads, open(os.path.join(RETRO, f"{run}_log.jsonl")))
                   if "val_loss" in r} for run in ("base", "jreg", "jreg_normed")}
    return runs, evals


def trained_tokens():
    """The tokens each run trained on, from its log's last record (the three runs alike)."""
    evals = retrofit_runs()[1]
    counts = {max(by_step.values(), key=lambda e: e["step"])["tokens"] for by_step in evals.values()}
    assert len(counts) == 1, counts
    return counts.pop()


def mean_acc_se(run):
    """The mean acc over the tasks and its standard error (each task's binomial standard error, the tasks independent)."""
    r = [t for t in run["results"].values() if "acc" in t]
    return sum(t["acc"] for t in r) / len(r), math.sqrt(sum(t["acc_stderr"] ** 2 for t in r)) / len(r)


def acc_change(run, source):
    """(difference, low, high): mean acc of run − source's, with a 95% interval that treats the two as independent
    (they score the same documents, but the per-document scores were not kept for a paired one)."""
    (_, sa), (_, sb) = mean_acc_se(run), mean_acc_se(source)
    half, d = 1.96 * math.sqrt(sa ** 2 + sb ** 2), run["average"]["acc"] - source["average"]["acc"]
    return d, d - half, d + half


def retrofit_finding():
    """SmolLM2-135M-Instruct before and after 245,760 tokens of continued pre-training on the KJV (one run each), on
    the same 16,384 KJV validation tokens in its own tokenizer (windows of 256) and the same 8 tasks (50 documents
    each): results/retrofit/."""
    before, base, jreg, normed = retrofit_runs()[0].values()
    z = lambda r, key="zeta": r["profile"][key][-1]                                                   # noqa: E731
    loss = lambda r: r["profile"]["loss"] - base["profile"]["loss"]                                  # noqa: E731
    changes = {name: acc_change(r, before) for name, r in (("baseline", base), ("JREG", jreg),
                                                           ("JREG on the normed h_L", normed))}
    clear = [name for name, (_, low, high) in changes.items() if high < 0 or low > 0]
    verdict = (f"no run's change in task accuracy is clear of the noise" if not clear else
               f"the change in task accuracy is clear of the noise for {', '.join(clear)} only")
    return (f"Continued pre-training of SmolLM2-135M-Instruct for {trained_tokens():,} tokens (one run each, so no interval between "
            f"runs): with JREG on the raw h_L its raw ζ_L goes {z(before):.2f} → {z(jreg):.2f} (the baseline run's "
            f"{z(base):.2f}) for {loss(jreg):+.3f} in validation loss against the baseline run, but its normed ζ_L does "
            f"not fall ({z(before, 'zeta_normed'):.2f} → {z(jreg, 'zeta_normed'):.2f}); the penalty on the normed h_L "
            f"takes that one to {z(normed, 'zeta_normed'):.2f} (the baseline run's {z(base, 'zeta_normed'):.2f}) for "
            f"{loss(normed):+.3f}. Against the source model {verdict} (mean acc over 8 tasks, 50 documents each, and "
            f"a 95% interval from the tasks' standard errors, the two scores taken as independent: "
            + ", ".join(f"{name} {d:+.3f} [{low:+.3f}, {high:+.3f}]" for name, (d, low, high) in changes.items())
            + "); ζ here is on 16,384 KJV validation tokens in windows of 256.")


def retrofit_table():
    lines = ["| model | val loss | Ψ_L raw | Ψ_L normed | ζ_L raw | ζ_(L−2) raw | ζ_L normed | mean acc (8 tasks) | "
             "mean acc_norm (5) |", "|---" * 9 + "|"]
    for name, label in RETRO_RUNS.items():
        r = retrofit_runs()[0][name]
        p, a = r["profile"], r["average"]
        lines.append(f"| {label} | {p['loss']:.4f} | {p['psi'][-1]:.4f} | {p['psi_normed'][-1]:.4f} | "
                     f"{p['zeta'][-1]:.2f} | {p['zeta'][-3]:.2f} | {p['zeta_normed'][-1]:.2f} | {a['acc']:.4f} | "
                     f"{a['acc_norm']:.4f} |")
    return "\n".join(lines)


def retrofit_training():
    """Each run's own evals (val loss; ζ_L in the run's penalty convention) and its checkpoints' profiles (the other
    convention), step 0 being the source."""
    evals = retrofit_runs()[1]
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
    runs = {name: r["results"] for name, r in retrofit_runs()[0].items()}
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
  {avg['after_jreg']['acc_norm'] - avg['after_base']['acc_norm']:+.3f} acc_norm, inside the noise (the standard error of a mean of {noise_bound()[1]} tasks at n = {noise_bound()[0]} is
  at most {noise_bound()[2]:.3f}). One run each, so no interval. Early exit differs between JREG and the baseline by at most {exit_gap:.3f} at
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
    removed = normed["zeta_normed"][-1] == 0 and jreg["zeta"][-1] == 0
    what = "removes the jump it sees" if removed else "reduces the jump it sees without removing it"
    return f"""- **Each penalty {what}, and only that one.** On the normed h_L, ζ_L went from {src['zeta_normed'][-1]:.2f} to {normed['zeta_normed'][-1]:.2f} (Ψ_L
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
  {avg['after_jreg']['acc']:.4f} / {avg['after_jreg']['acc_norm']:.4f}), inside the noise of {noise_bound()[0]} documents a task (at most {noise_bound()[2]:.3f} for the mean of {noise_bound()[1]}).
  The logit lens reads layer L−1 better (loss {normed['logit_lens_loss'][-2]:.3f} vs {base['logit_lens_loss'][-2]:.3f} for the baseline and {jreg['logit_lens_loss'][-2]:.3f} for jreg). Block L
  matters less: removing it costs {normed['skip_block_loss_increase'][-1]:+.3f} nats against {min(skip):+.3f} to {max(skip):+.3f}. Early exit at layer 29: {exit29:.3f}."""


def retrofit_tokens(pretraining=2e12):
    """The retrofit's tokens as a share of SmolLM2's pre-training (2T tokens, its model card)."""
    tokens = trained_tokens()
    mantissa, exponent = f"{tokens / pretraining:.1e}".split("e")
    power = str(int(exponent)).translate(str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹"))
    return (f"{tokens:,} tokens of one narrow text (the KJV) are {mantissa}·10{power} of SmolLM2's "
            f"pre-training ({pretraining / 1e12:.0f}T tokens)")


def retrofit_data():
    """The retrofit's data, the KJV in SmolLM2's tokenizer: its tokens and documents as the tokenizer benchmark counted
    them on the same file (results/speed/tokenize_kjv_smollm2.json)."""
    r = json.load(open(os.path.join(ROOT, "results", "speed", "tokenize_kjv_smollm2.json")))["results"]
    return f"{r['tokens']:,} tokens, {r['documents']:,} verses"


def retrofit_time():
    """The runs' training time, the sum of their logged steps (batch tokens / tok_per_s of each step's record)."""
    minutes = {}
    for run in ("base", "jreg", "jreg_normed"):
        steps = [r for r in map(json.loads, open(os.path.join(RETRO, f"{run}_log.jsonl"))) if "tok_per_s" in r]
        assert [r["step"] for r in steps] == list(range(1, len(steps) + 1)), run        # every step logged once
        tokens = [b["tokens"] - a["tokens"] for a, b in zip([{"tokens": 0}] + steps, steps)]
        minutes[run] = sum(t / r["tok_per_s"] for t, r in zip(tokens, steps)) / 60
    return (f"Time: the training steps took {minutes['base']:.0f} min (base) and {minutes['jreg']:.0f} min (jreg), the "
            f"two runs side by side on 2 cores (one thread each) with the source's evaluation beside them, and "
            f"{minutes['jreg_normed']:.0f} min (jreg_normed), alone on 2 cores after them: the sum of each log's steps "
            f"(tokens / `tok_per_s`), evaluations and checkpoints not counted (`results/retrofit/*_log.jsonl`).")


def noise_bound():
    """(documents a task, tasks, the standard error of the mean of the tasks' accuracies at an accuracy of one half:
    its largest), from the runs' task results."""
    tasks = [[t for t in r["results"].values() if "acc" in t] for r in retrofit_runs()[0].values()]
    (n,), (k,) = {t["n"] for ts in tasks for t in ts}, {len(ts) for ts in tasks}     # the same in every run
    return n, k, math.sqrt(0.25 / n) / math.sqrt(k)


def retrofit_noise():
    """The tasks' binomial standard errors at 50 documents (results/retrofit/before.json, after_*.json) and that of the
    mean of the eight."""
    runs = retrofit_runs()[0].values()
    tasks = [[t for t in r["results"].values() if "acc" in t] for r in runs]
    se, mean = [t["acc_stderr"] for ts in tasks for t in ts], [mean_acc_se(r)[1] for r in runs]
    (n,), (k,) = {t["n"] for ts in tasks for t in ts}, {len(ts) for ts in tasks}     # the same in every run
    return (f"The tasks use {n} documents each: a task's accuracy has a standard error of {min(se):.2f}–{max(se):.2f}, "
            f"the mean of {({8: 'eight'}).get(k, k)} about {sum(mean) / len(mean):.3f} (at most "
            f"{math.sqrt(0.25 / n) / math.sqrt(k):.3f}, at an accuracy of one half)")


BLOCKS = {"retrofit-finding": retrofit_finding, "retrofit-table": retrofit_table, "retrofit-training": retrofit_training,
          "retrofit-tasks": retrofit_tasks, "retrofit-exit": retrofit_exit, "retrofit-moved": retrofit_moved,
          "retrofit-normed": retrofit_normed, "retrofit-tokens": retrofit_tokens, "retrofit-data": retrofit_data,
          "retrofit-time": retrofit_time, "retrofit-noise": retrofit_noise}
