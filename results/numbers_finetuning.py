"""
The numbers docs/finetuning.md quotes, from results/sft_kjv/: the profiles before and after fine-tuning
(profile_kjv.json, profile_chat.json) and the packing measurement (packing_effect.json).
"""
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def jump_free(p):
    """How many of the last three layers have ζ = 0 (ζ_L, ζ_{L−1}, ζ_{L−2}, from the last), and what that is in words."""
    k = next((i for i, z in enumerate(reversed(p["zeta"][-3:])) if z != 0), 3)
    return k, ("not jump-free at its last layer", "jump-free at its last layer only",
               "jump-free over its last two layers", "jump-free over its last three layers")[k]


def sft_finding():
    kjv, chat = sft_profiles()
    k = {r: m["profile"] for r, m in kjv.items()}
    c = {r: m["profile"] for r, m in chat.items()}
    on = c["sft_jreg_a1"]
    jumps = []
    for source, p, where in (("the KJV", k, "its layers 2..L−2 there"), ("the conversations", c, "the same layers")):
        middle = [v for r in ("base", "sft_base") for v in p[r]["psi"][1:-2]]
        jumps.append(f"{p['base']['psi'][-1]:.3f} → {p['sft_base']['psi'][-1]:.3f} on {source} against "
                     f"{min(middle):.3f}–{max(middle):.3f} in {where}")
    n, words = jump_free(on)
    paper = ("as the paper's fine-tuned 3.4B JREG model is" if n == 3 else
             "where the paper's fine-tuned 3.4B JREG model is jump-free over its last three")
    return (f"The baseline's jump survives fine-tuning (ζ_L {c['base']['zeta'][-1]:.2f} → "
            f"{c['sft_base']['zeta'][-1]:.2f} on the conversations, {k['base']['zeta'][-1]:.2f} → "
            f"{k['sft_base']['zeta'][-1]:.2f} on the KJV; Ψ_L {jumps[0]}, {jumps[1]}), and the JREG model kept "
            f"under JREG is {words} on the conversations (ζ_L = {on['zeta'][-1]:.2f}, ζ_{{L−1}} = "
            f"{on['zeta'][-2]:.2f}, ζ_{{L−2}} = {on['zeta'][-3]:.2f}), {paper}. Fine-tuned *without* the penalty, "
            f"the JREG model's Ψ_L on the conversations grows ×{c['sft_jreg_a1_off']['psi'][-1] / c['jreg_a1']['psi'][-1]:.1f} "
            f"in 200 steps ({c['jreg_a1']['psi'][-1]:.4f} → {c['sft_jreg_a1_off']['psi'][-1]:.4f}) and ζ_{{L−2}} "
            f"rises from {c['jreg_a1']['zeta'][-3]:.2f} to {c['sft_jreg_a1_off']['zeta'][-3]:.2f} while ζ_L stays "
            f"{c['sft_jreg_a1_off']['zeta'][-1]:.2f}. One run each (n = 1): no estimate of how much another run "
            f"would differ.")


def sft_readme():
    """The README's line on the small fine-tuning."""
    kjv, chat = sft_profiles()
    c = {r: m["profile"] for r, m in chat.items()}
    survives = c["sft_base"]["zeta"][-1] > 0
    return (f"After instruction tuning of the small models the baseline's jump "
            f"{'survives' if survives else 'is gone'} (ζ_L {c['sft_base']['zeta'][-1]:.2f} on the conversations) and "
            f"JREG's model kept under JREG is {jump_free(c['sft_jreg_a1'])[1]} (ζ_L "
            f"{c['sft_jreg_a1']['zeta'][-1]:.2f}, ζ_{{L−1}} {c['sft_jreg_a1']['zeta'][-2]:.2f}); one run each.")


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


def chat_profile_tokens():
    """docs/evaluation.md's example of a profile's token count below --profile_tokens: the fine-tuning windows'
    (results/sft_kjv/profile_chat.json)."""
    d = json.load(open(os.path.join(ROOT, "results", "sft_kjv", "profile_chat.json")))
    p = d["models"]["base"]["profile"]
    return (f"{p['n_tokens']:,} of {d['config']['profile_tokens']:,} on the fine-tuning windows of "
            f"[finetuning.md](finetuning.md), {p['assistant']['n_tokens']:,} of them before an answer token")


BLOCKS = {"sft-table": sft_table, "sft-finding": sft_finding, "sft-readme": sft_readme, "packing-effect": packing_effect,
          "sft-skip-finding": sft_skip_finding, "chat-profile-tokens": chat_profile_tokens}
