"""
Layer analyses on fixed windows, outside any compiled graph: the Ψ / ζ profile on both h_L conventions
(jreg.Profile), logit-lens losses at every layer, the loss with one block skipped, the windows they read (a run's
validation windows, text files, task contexts), and the plots.

    windows = text_windows(lm, ["corpus.txt"], n=64, seq_len=256)
    p = profile_model(model, windows)             # psi, zeta, psi_normed, ..., loss, per-layer analyses
"""
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from tqdm import tqdm

from conversations import is_conversations, read_manifest
from data import get_tokenizer, list_shards, read_shard
from jreg import Profile
from model import Llama


def profile_target(hf_model):
    """What to profile for a Hugging Face model: our Llama when it converts (raw streams from our code), else itself."""
    if type(hf_model).__name__ == "LlamaForCausalLM":
        try:
            return Llama.from_hf(hf_model).to(next(hf_model.parameters()).device).eval()
        except NotImplementedError:
            pass
    return hf_model


def blocks_and_norm(model):
    """The block list and final norm of our Llama or a transformers causal LM (Llama, Qwen, Gemma, GPT-2, NeoX...)."""
    inner = getattr(model, "model", None)
    for obj in (model, inner, getattr(inner, "decoder", None), getattr(model, "transformer", None),
                getattr(model, "gpt_neox", None)):
        layers = next((getattr(obj, a) for a in ("layers", "h") if hasattr(obj, a)), None)
        norm = next((getattr(obj, a) for a in ("norm", "ln_f", "final_layer_norm") if hasattr(obj, a)), None)
        if layers is not None and norm is not None:
            return layers, norm
    raise SystemExit(f"error: cannot find the blocks and final norm of {type(model).__name__} for a layer profile")


def forward_streams(model, idx, skip=None):
    """(logits, [h_0..h_L] raw residual streams, h_L after the final norm) of one forward. Our Llama returns them;
    otherwise forward hooks record the first block's input, each block's output and the final norm's output.
    skip = i: block i (0-based) passes its input through unchanged."""
    if isinstance(model, Llama) and skip is None:
        out = model(idx)
        return out.logits, list(out.hidden_states), out.final_hidden
    layers, norm = blocks_and_norm(model)
    hidden, normed = [None] * (len(layers) + 1), [None]

    def block_output(i):
        def hook(module, args, kwargs, output):
            x = args[0] if args else kwargs["hidden_states"]
            hidden[0] = x if i == 0 else hidden[0]
            if i == skip:
                output = x if torch.is_tensor(output) else (x,) + tuple(output[1:])
            hidden[i + 1] = output if torch.is_tensor(output) else output[0]
            return output
        return hook

    handles = [norm.register_forward_hook(lambda m, a, o: normed.__setitem__(0, o))]
    handles += [layer.register_forward_hook(block_output(i), with_kwargs=True) for i, layer in enumerate(layers)]
    try:
        logits = model(idx).logits
    finally:
        for h in handles:
            h.remove()
    return logits, hidden, normed[0]


def readout(model, h):
    """The logits of a hidden state read through the final norm and the LM head (the logit lens)."""
    head = model.lm_head if isinstance(model, Llama) else model.get_output_embeddings()
    return head(blocks_and_norm(model)[1](h))


def skip_block_logits(model, idx, hidden, i):
    """The logits with block i's (0-based) update removed: our Llama reruns only the blocks above it from h_i."""
    if not isinstance(model, Llama):
        return forward_streams(model, idx, skip=i)[0]
    x, cos, sin = hidden[i], model.rope_cos[:idx.size(1)], model.rope_sin[:idx.size(1)]
    for block in model.layers[i + 1:]:
        x = block(x, cos, sin)
    return readout(model, x)


def loss_sum(logits, targets, valid):
    """Summed next-token cross-entropy over the valid positions (fp32)."""
    ce = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none")
    return (ce * valid.flatten()).sum()


@torch.no_grad()
def profile_model(model, windows, analysis_tokens=None, progress=False):
    """The layer profile of `model` (our Llama, or a transformers causal LM through hooks) over `windows`.

    windows: iterable of LongTensor [B, T + 1], or (windows, mask) with mask True on real tokens (right padding):
    the model reads w[:, :-1] and is scored on w[:, 1:], as train.py's eval; or (x, y, real) of conversations.PackedStream:
    Ψ over the real tokens and the loss over the targets y != -1, as train.py's eval of a fine-tuning run, plus
    "assistant": the profile over the positions whose next token is a loss target (the assistant's answers).
    Ψ, ζ and the loss: jreg.Profile, token-weighted over all batches (psi: Ψ_1..Ψ_L, zeta: ζ_2..ζ_L, empty for one
    layer). On the first `analysis_tokens` scored tokens (whole batches; None: all; 0: none): logit_lens_loss
    (h_0..h_L) and skip_block_loss_increase (blocks 1..L: the loss with that block's update removed, minus the loss)."""
    model.eval()
    device = next(model.parameters()).device
    profile, assistant, sums, an_tokens = Profile(), Profile(), None, 0   # sums: loss, tokens, lens, skips
    for batch in tqdm(windows, desc="profile", disable=not progress):
        if isinstance(batch, (tuple, list)) and len(batch) == 3:          # packed conversations
            x, y, real = (t.to(device) for t in batch)
            psi_mask, valid, y = real.bool(), y != -1, y.clamp(min=0)
        else:
            w, mask = batch if isinstance(batch, (tuple, list)) else (batch, torch.ones_like(batch, dtype=torch.bool))
            w, mask = w.to(device), mask.to(device).bool()
            x, y, valid = w[:, :-1], w[:, 1:], mask[:, :-1] & mask[:, 1:]     # the positions read that have a target
            psi_mask = valid
        logits, hidden, final_hidden = forward_streams(model, x)
        loss = loss_sum(logits, y, valid)
        profile.add(hidden, final_hidden, mask=psi_mask, loss_sum=loss, n_loss=valid.sum())
        if psi_mask is not valid:
            assistant.add(hidden, final_hidden, mask=valid, loss_sum=loss, n_loss=valid.sum())
        if analysis_tokens is None or an_tokens < analysis_tokens:
            an_tokens += int(valid.sum())
            per_layer = [loss_sum(readout(model, h), y, valid) for h in hidden]
            per_layer += [loss_sum(skip_block_logits(model, x, hidden, i), y, valid) for i in range(len(hidden) - 1)]
            batch_sums = torch.stack([loss, valid.sum(), *per_layer]).double()
            sums = batch_sums if sums is None else sums + batch_sums
    if profile.sums is None:
        raise SystemExit("error: no tokens to profile")
    out = profile.result()
    if assistant.sums is not None:
        out["assistant"] = assistant.result()
    if sums is not None:
        L, n, base = out["n_layer"], sums[1], sums[0] / sums[1]
        out.update(analysis_tokens=int(n), analysis_loss=float(base), logit_lens_loss=(sums[2:3 + L] / n).tolist(),
                   skip_block_loss_increase=(sums[3 + L:] / n - base).tolist())
    return out


def text_windows(lm, files, n, seq_len):
    """The first n (or fewer) windows of seq_len + 1 tokens, seq_len apart as train.val_windows cuts them, of text
    files (.txt: one document; .jsonl[.gz] / .json: each record's `text`), each document followed by end-of-text."""
    import datasets
    stream = []
    for path in files:
        kind = "json" if path.endswith((".jsonl", ".jsonl.gz", ".json")) else "text"
        for row in datasets.load_dataset(kind, data_files=path, split="train", streaming=True,
                                         **({"sample_by": "document"} if kind == "text" else {})):
            if len(stream) > n * seq_len:
                break
            stream += lm.encode(row["text"]) + ([lm.eot] if lm.eot is not None else [])
    n = max(0, min(n, (len(stream) - 1) // seq_len))
    return torch.tensor([stream[i * seq_len:(i + 1) * seq_len + 1] for i in range(n)]).long().view(-1, seq_len + 1)


def context_windows(lm, task_data, n_tokens, seq_len):
    """A task's contexts, each one window (its last seq_len + 1 tokens), right-padded: (windows, mask)."""
    seqs, have = [], 0
    for doc in task_data.built:
        seqs.append(lm.encode(doc["context"].rstrip())[-(seq_len + 1):])
        have += len(seqs[-1]) - 1
        if have >= n_tokens:
            break
    return (pad_sequence([torch.tensor(s) for s in seqs], batch_first=True),
            pad_sequence([torch.ones(len(s), dtype=torch.bool) for s in seqs], batch_first=True))


PROBE = ("The quick brown fox, isn't it?  It's 3.14159 -- or 1,000,000!\n\n\tdef f(x): return x**2  # naïve café, "
         "Ünïcödé, 中文, русский, 😀\n   spaces   and 'quotes' ")


def shards_tokenizer(lm, source):
    """The tokenizer the val shards of `source` were written with (their header), if the transformers tokenizer of
    `lm` is that one: it has the shards' end-of-text id, decodes every id of their vocabulary to the same text and
    encodes PROBE to the same ids. Any other tokenizer is refused in one line: its Ψ and ζ would be meaningless."""
    files = ([os.path.join(source, e["file"]) for e in read_manifest(source)["shards"] if e["split"] == "val"]
             if is_conversations(source) else list_shards(source, "val"))
    if not files:
        raise SystemExit(f"error: --profile: {source} has no val shards")
    name, tok = read_shard(files[0])[1]["tokenizer"], lm.tokenizer
    enc = get_tokenizer(name)
    ids = list(range(enc.n_vocab))
    if len(tok) < enc.n_vocab:
        why = f"it has {len(tok)} tokens, the shards' {enc.n_vocab}"
    elif tok.eos_token_id != enc.eot_token:
        why = f"its end-of-text id is {tok.eos_token_id}, the shards' {enc.eot_token}"
    elif tok.decode(ids, clean_up_tokenization_spaces=False) != enc.decode(ids):
        why = "its ids decode to other text"
    elif tok.encode(PROBE, add_special_tokens=False) != enc.encode(PROBE):
        why = "it encodes a probe text to other ids"
    else:
        return name
    raise SystemExit(f"error: --profile: {source} holds {name} tokens, but the tokenizer of {lm.name} is not {name} "
                     f"({why}); profile it on --text, which every model encodes itself")


def _zeta_l(p, key="zeta"):
    return p[key][-1] if p[key] else float("nan")


def plot_profiles(profiles, out_dir, series=None, exits=None):
    """psi_profiles.png (Ψ per layer, raw and normed h_L), layer_analysis.png (logit lens, skipped blocks); given
    series {run: profiles of its checkpoints}, zeta_over_checkpoints.png (ζ_L, ζ_(L−2) against the step); given exits
    {model: evaluate_tasks output with early_exit}, early_exit.png (average accuracy per exit layer, beside the logit
    lens loss of the profiled models)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figures = {"psi_profiles.png": plt.subplots(1, 2, figsize=(11, 4))} if profiles else {}
    for ax, key, title in zip(figures["psi_profiles.png"][1] if profiles else [], ("psi", "psi_normed"),
                              ("raw residual stream h_L", "final-normed h_L (HF convention)")):
        for name, p in profiles.items():
            layers = range(1, p["n_layer"] + 1)
            zeta_l, dashed = _zeta_l(p, key.replace("psi", "zeta")), p.get(key + "_skip_first", [np.nan] * len(layers))
            line, = ax.plot(layers, p[key], marker="o", ms=3, label=f"{name} (ζ_L={zeta_l:.2f})")
            ax.plot(layers, dashed, ls="--", lw=1, color=line.get_color())
        ax.set(title=f"Ψ_l, {title}\n(dashed: without the first token)", xlabel="layer l",
               ylabel="Ψ_l = (1 − cos(h_{l−1}, h_l)) / 2")
    analysed = {name: p for name, p in profiles.items() if "logit_lens_loss" in p}

    def lens_panel(ax):
        for name, p in analysed.items():
            ax.plot(range(p["n_layer"] + 1), p["logit_lens_loss"], marker="o", ms=3, label=name)
        ax.set(title="logit lens: loss of head(norm(h_l))", xlabel="layer l (0 = embedding)", ylabel="cross-entropy",
               yscale="log")

    if analysed:
        fig, axes = figures["layer_analysis.png"] = plt.subplots(1, 2, figsize=(11, 4))
        lens_panel(axes[0])
        for name, p in analysed.items():
            axes[1].plot(range(1, p["n_layer"] + 1), p["skip_block_loss_increase"], marker="o", ms=3, label=name)
        axes[1].set(title="loss increase when block l is skipped", xlabel="block l", ylabel="Δ cross-entropy")
        axes[1].set_yscale("symlog", linthresh=1e-2)
    if series:
        fig, ax = figures["zeta_over_checkpoints.png"] = plt.subplots(figsize=(6, 4))
        for name, points in series.items():
            steps = [pt["step"] for pt in points]
            line, = ax.plot(steps, [_zeta_l(pt) for pt in points], marker="o", label=f"{name} ζ_L")
            ax.plot(steps, [pt["zeta"][pt["n_layer"] - 4] if pt["n_layer"] >= 4 else np.nan for pt in points],
                    marker="s", ls="--", color=line.get_color(), label=f"{name} ζ_(L−2)")
        ax.set(xlabel="training step", ylabel="jump rate ζ (raw h_L)", title="the final-layer jump during pre-training")
    if exits:                                             # accuracy per exit layer, beside the logit lens loss
        panels = 1 + bool(analysed)
        fig, axes = figures["early_exit.png"] = plt.subplots(1, panels, figsize=(5.5 * panels, 4), squeeze=False)
        axes = axes[0]
        for name, e in exits.items():
            layers, avgs = [r["layer"] for r in e["early_exit"]], [r["average"] for r in e["early_exit"]]
            line, = axes[0].plot(layers, [a["acc"] for a in avgs], marker="o", ms=3, label=f"{name} acc")
            if avgs[0]["acc_norm"] is not None:
                axes[0].plot(layers, [a["acc_norm"] for a in avgs], ls="--", color=line.get_color(), label=f"{name} acc_norm")
        chance = next(iter(exits.values()))["chance"]
        axes[0].axhline(np.mean(list(chance.values())), color="gray", ls=":", label="chance (average)")
        axes[0].set(title="early exit: tasks scored on head(norm(h_l))", xlabel="exit layer l (0 = embedding)",
                    ylabel=f"average accuracy ({len(next(iter(exits.values()))['results'])} tasks)")
        if analysed:
            lens_panel(axes[1])
    for file, (fig, axes) in figures.items():
        for ax in np.ravel(axes):
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, file), dpi=120)
        plt.close(fig)
    return [os.path.join(out_dir, file) for file in figures]
