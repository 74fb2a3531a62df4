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

from lib.conversations import is_conversations, read_manifest
from data import HFTokenizer, get_tokenizer, list_shards, read_shard, tokenizer_fingerprint
from jreg import Profile
from lib.hf import llama_from_hf
from lib.progress import Progress
from model import Llama


def profile_target(hf_model):
    """What to profile for a Hugging Face model: our Llama when it converts (raw streams from our code), else itself."""
    if type(hf_model).__name__ == "LlamaForCausalLM":
        try:
            return llama_from_hf(hf_model).to(next(hf_model.parameters()).device).eval()
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


def _scored(batch, device):
    """(x, y, valid, psi_mask) of one batch: what the model reads, its targets, the positions scored, and those of
    Ψ (the same tensor as valid, except for packed conversations: every real token)."""
    if isinstance(batch, (tuple, list)) and len(batch) == 3:          # packed conversations
        x, y, real = (t.to(device) for t in batch)
        return x, y.clamp(min=0), y != -1, real.bool()
    w, mask = batch if isinstance(batch, (tuple, list)) else (batch, torch.ones_like(batch, dtype=torch.bool))
    w, mask = w.to(device), mask.to(device).bool()
    valid = mask[:, :-1] & mask[:, 1:]                                # the positions read that have a target
    return w[:, :-1], w[:, 1:], valid, valid


@torch.no_grad()
def profile_model(model, windows, analysis_tokens=None, progress=False):
    """The layer profile of `model` (our Llama, or a transformers causal LM through hooks) over `windows`.

    windows: iterable of LongTensor [B, T + 1], or (windows, mask) with mask True on real tokens (right padding):
    the model reads w[:, :-1] and is scored on w[:, 1:], as train.py's eval; or (x, y, real) of conversations.PackedStream:
    Ψ over the real tokens and the loss over the targets y != -1, as train.py's eval of a fine-tuning run, plus
    "assistant": the profile over the positions whose next token is a loss target (the assistant's answers).
    Ψ, ζ and the loss: jreg.Profile, token-weighted over all batches (psi: Ψ_1..Ψ_L, zeta: ζ_2..ζ_L, empty for one
    layer). On the first `analysis_tokens` scored tokens (whole batches; None: all; 0: none): logit_lens_loss
    (h_0..h_L) and skip_block_loss_increase (blocks 1..L: the loss with that block's update removed, minus the loss).
    progress: a bar over the batches and, inside each analysed batch, one over its read-outs and skipped blocks
    (lib.progress: plain lines in a log), since those take most of the time: 2L + 1 passes, a skipped block rerunning
    the blocks above it (139 s for one batch of 2,048 tokens through SmolLM2's 30 layers on CPU)."""
    model.eval()
    device = next(model.parameters()).device
    profile, assistant, sums, an_tokens = Profile(), Profile(), None, 0   # sums: loss, tokens, lens, skips
    batches = Progress(total=len(windows) if hasattr(windows, "__len__") else None, desc="profile", unit="batch",
                       enabled=progress)
    with batches:
        for i, batch in enumerate(windows, 1):
            x, y, valid, psi_mask = _scored(batch, device)
            logits, hidden, final_hidden = forward_streams(model, x)
            loss = loss_sum(logits, y, valid)
            profile.add(hidden, final_hidden, mask=psi_mask, loss_sum=loss, n_loss=valid.sum())
            if psi_mask is not valid:
                assistant.add(hidden, final_hidden, mask=valid, loss_sum=loss, n_loss=valid.sum())
            if analysis_tokens is None or an_tokens < analysis_tokens:
                an_tokens += int(valid.sum())
                with Progress(total=2 * len(hidden) - 1, desc=f"layer analysis of batch {i} (logit lens and "
                              "skipped blocks)", unit="pass", enabled=progress, leave=False) as passes:
                    per_layer = []
                    for h in hidden:
                        per_layer.append(loss_sum(readout(model, h), y, valid))
                        passes.update()
                    for block in range(len(hidden) - 1):
                        per_layer.append(loss_sum(skip_block_logits(model, x, hidden, block), y, valid))
                        passes.update()
                batch_sums = torch.stack([loss, valid.sum(), *per_layer]).double()
                sums = batch_sums if sums is None else sums + batch_sums
            batches.update()
    if not profile.sums:                                  # jreg.Profile starts empty
        raise SystemExit("error: no tokens to profile")
    out = profile.result()
    if assistant.sums:
        out["assistant"] = assistant.result()
    if sums is not None:
        L, n, base = out["n_layer"], sums[1], sums[0] / sums[1]
        out.update(analysis_tokens=int(n), analysis_loss=float(base), logit_lens_loss=(sums[2:3 + L] / n).tolist(),
                   skip_block_loss_increase=(sums[3 + L:] / n - base).tolist())
    return out


def text_documents(files):
    """The documents of text files, read by datasets: a .txt file is one document, a .jsonl[.gz] / .json file a
    document per record (its `text`). A file that cannot be read so is one `error: --text FILE: ...` line."""
    import datasets
    for path in files:
        kind = "json" if path.endswith((".jsonl", ".jsonl.gz", ".json")) else "text"
        try:
            for row in datasets.load_dataset(kind, data_files=path, split="train", streaming=True,
                                             **({"sample_by": "document"} if kind == "text" else {})):
                if not isinstance(row.get("text"), str):
                    raise SystemExit(f"error: --text {path}: a record without a text field (fields: {', '.join(row)})")
                yield row["text"]
        except (OSError, ValueError) as e:               # a folder, not UTF-8, not JSON (ValueError of datasets, arrow)
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise SystemExit(f"error: --text {path}: cannot be read as {'UTF-8 text' if kind == 'text' else 'JSON'} "
                             f"({why})")


def text_windows(lm, files, n, seq_len):
    """The first n (or fewer) windows of seq_len + 1 tokens, seq_len apart as data.val_windows cuts them, of the
    documents of text files (text_documents), each followed by end-of-text."""
    stream = []
    for text in text_documents(files):
        if len(stream) > n * seq_len:
            break
        stream += lm.encode(text) + ([lm.eot] if lm.eot is not None else [])
    n = max(0, min(n, (len(stream) - 1) // seq_len))
    return torch.tensor([stream[i * seq_len:(i + 1) * seq_len + 1] for i in range(n)]).long().view(-1, seq_len + 1)


def context_windows(lm, task_data, n_tokens, seq_len):
    """A task's contexts (a perplexity task's: its documents), each one window (its last seq_len + 1 tokens),
    right-padded: (windows, mask)."""
    seqs, have = [], 0
    for doc in task_data.built:
        text = doc["continuations"][0] if doc["context"] is None else doc["context"]     # wikitext: the page
        seqs.append(lm.encode(text.rstrip())[-(seq_len + 1):])
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
    if name.startswith("hf:") and "#" in name:            # shards of a Hugging Face tokenizer: its fingerprint
        mine = tokenizer_fingerprint(HFTokenizer(tok))[:16]
        if mine == name.rsplit("#", 1)[1]:
            return name
        raise SystemExit(f"error: --profile: {source} holds tokens of {name}, but the tokenizer of {lm.name} has "
                         f"another vocabulary (fingerprint {mine}); profile it on --text, which every model encodes itself")
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


def _styles(plt, names, series):
    """{name: (legend label, line style, panel)} and {model or run: colour}: a series' checkpoints (NAME@STEP) share
    one panel, coloured by step on one scale for all series; other models a colour each, one panel per depth;
    `NAME (assistant)` dashed in NAME's colour. An absolute path is shown by its last part."""
    import re
    steps = {}
    for run, points in (series or {}).items():
        for name in names:
            m = re.fullmatch(re.escape(run) + r"@.*?(\d+)", name)
            if m and int(m.group(1)) in {pt["step"] for pt in points}:
                steps[name] = (run, int(m.group(1)))
    bases = list(dict.fromkeys([n.removesuffix(" (assistant)") for n in names if n not in steps] + list(series or {})))
    n = len(bases)
    colour = dict(zip(bases, plt.get_cmap("tab10" if n <= 10 else "tab20")(range(n)) if n <= 20 else
                      plt.get_cmap("turbo")(np.linspace(0, 1, n))))
    lo, hi = np.log1p([min(s for _, s in steps.values()), max(s for _, s in steps.values())]) if steps else (0, 1)
    by_step = plt.get_cmap("viridis")
    styles = {name: (f"step {step}", {"color": by_step(0.9 * (np.log1p(step) - lo) / ((hi - lo) or 1)), "ls": "-"},
                     f"{_short(run)}, checkpoints") for name, (run, step) in steps.items()}
    styles.update({name: (_short(name), {"color": colour[name.removesuffix(" (assistant)")],
                                         "ls": "--" if name.endswith(" (assistant)") else "-"}, None)
                   for name in names if name not in steps})
    return styles, colour


def _short(name):
    return os.path.basename(os.path.normpath(name)) if os.path.isabs(name) else name


def _y_scale(ax, values):
    """Log y (ticks 1, 2, 5 × 10^k, plain numbers) where the values span over a decade, symlog where some are ≤ 0
    as well, else linear."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, SymmetricalLogLocator
    v = np.asarray(values, dtype=float)
    v, pos = v[np.isfinite(v)], v[np.isfinite(v) & (v > 0)]
    if not len(pos) or pos.max() < 10 * pos.min() and v.min() > 0:
        return
    decades = np.log10(np.abs(v[v != 0]).max() / np.abs(v[v != 0]).min())
    subs = (1.0, 2.0, 5.0) if decades <= 2.5 else (1.0,)
    if v.min() > 0:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=subs))
    else:
        thresh = 10 ** np.floor(np.log10(max(np.abs(v[v != 0]).min(), np.abs(v).max() * 1e-3)))
        ax.set_yscale("symlog", linthresh=thresh, linscale=0.3)
        ax.yaxis.set_major_locator(SymmetricalLogLocator(linthresh=thresh, base=10, subs=subs))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _psi_figure(plt, profiles, styles):
    """Ψ_l on the raw residual stream, Ψ_L on the final-normed h_L as an open circle, one panel per depth or series;
    Ψ without the first token dotted where it differs visibly (over 1% of the panel's range), else the gap is said."""
    panels = {}
    for name, p in profiles.items():
        panels.setdefault(styles[name][2] or f"models of {p['n_layer']} layers", []).append(name)
    panels = {f"{styles[names[0]][0]} ({profiles[names[0]]['n_layer']} layers)" if len(names) == 1 and
              title.startswith("models of") else title: names for title, names in panels.items()}
    cols, rows = min(len(panels), 3), -(-len(panels) // 3)
    fig = plt.figure(layout="constrained", figsize=(4.6 * cols + 2.6, 3.6 * rows))
    axes, dotted, hidden = np.ravel(fig.subplots(rows, cols, squeeze=False)), False, []
    for ax, (title, names) in zip(axes, panels.items()):
        span = np.ptp([v for n in names for v in profiles[n]["psi"] + profiles[n]["psi_normed"][-1:]]) or 1
        for n in names:
            (label, style, panel), p, layers = styles[n], profiles[n], range(1, profiles[n]["n_layer"] + 1)
            if p["zeta"] and not panel:                   # a series' ζ: zeta_over_checkpoints.png
                label += rf" ($\zeta_L$ {_zeta_l(p):.2f}, normed {_zeta_l(p, 'zeta_normed'):.2f})"
            ax.plot(layers, p["psi"], marker="o", ms=3, label=label, **style)
            ax.plot(layers[-1:], p["psi_normed"][-1:], marker="o", ms=7, mfc="none", ls="", color=style["color"])
            gap = np.abs(np.subtract(p["psi"], p["psi_skip_first"])).max() if "psi_skip_first" in p else np.nan
            if gap > 0.01 * span:
                dotted = ax.plot(layers, p["psi_skip_first"], ls=":", lw=1, color=style["color"])
            elif gap >= 0:
                hidden.append(gap)
        ax.set(title=title, xlabel=r"layer $\ell$", ylabel=r"$\Psi_\ell = (1 - \cos(h_{\ell-1}, h_\ell))\,/\,2$")
    for ax in axes[len(panels):]:
        fig.delaxes(ax)
    axes[0].plot([], [], marker="o", ms=7, mfc="none", ls="", color="gray", label=r"$\Psi_L$ on the final-normed $h_L$")
    if dotted:
        axes[0].plot([], [], ls=":", color="gray", label="without the first token")
    note = f"\n{'other lines ' if dotted else ''}without the first token: within {max(hidden):.1e}, not drawn" \
        if hidden else ""
    return fig, r"$\Psi_\ell$ on the raw residual stream" + note


def _curves(ax, profiles, styles, key, first=0, **labels):
    """Each profile's p[key] against the layer, from layer `first` on, on a readable y scale."""
    for name, p in profiles.items():
        ax.plot(range(first, first + len(p[key])), p[key], marker="o", ms=3, label=styles[name][0], **styles[name][1])
    _y_scale(ax, [v for p in profiles.values() for v in p[key]])
    ax.set(**labels)


EXIT_LAYER = r"exit layer $\ell$ (0 = embedding)"
LENS = dict(key="logit_lens_loss", title=r"logit lens: loss of head(norm($h_\ell$))",
            xlabel=r"layer $\ell$ (0 = embedding)", ylabel="cross-entropy")


def plot_profiles(profiles, out_dir, series=None, exits=None):
    """psi_profiles.png (Ψ per layer, raw and normed h_L), layer_analysis.png (logit lens, skipped blocks); given
    series {run: profiles of its checkpoints}, zeta_over_checkpoints.png (ζ_L, ζ_(L−2) against the step); given exits
    {model: evaluate_tasks output with early_exit}, early_exit.png (average accuracy per exit layer over the tasks with
    acc, a task without (wikitext) by its word perplexity, beside the logit lens loss of the profiled models). One
    legend per figure, on its right."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    styles, colour = _styles(plt, list(profiles) + list(exits or {}), series)
    figures, legend_titles = {}, {}
    if profiles:
        figures["psi_profiles.png"], legend_titles["psi_profiles.png"] = _psi_figure(plt, profiles, styles)
    analysed = {name: p for name, p in profiles.items() if "logit_lens_loss" in p}
    if analysed:
        fig = figures["layer_analysis.png"] = plt.figure(layout="constrained", figsize=(12, 4))
        axes = fig.subplots(1, 2)
        _curves(axes[0], analysed, styles, **LENS)
        _curves(axes[1], analysed, styles, "skip_block_loss_increase", 1, xlabel=r"block $\ell$",
                title=r"loss increase when block $\ell$ is skipped", ylabel="Δ cross-entropy")
    if series:
        fig = figures["zeta_over_checkpoints.png"] = plt.figure(layout="constrained", figsize=(8, 4))
        ax = fig.subplots()
        for name, points in series.items():
            steps, c = [pt["step"] for pt in points], colour[name]
            ax.plot(steps, [_zeta_l(pt) for pt in points], marker="o", color=c, label=f"{_short(name)} $\\zeta_L$")
            ax.plot(steps, [pt["zeta"][pt["n_layer"] - 4] if pt["n_layer"] >= 4 else np.nan for pt in points],
                    marker="s", ls="--", color=c, label=f"{_short(name)} $\\zeta_{{L-2}}$")
        ax.set(xlabel="checkpoint step", ylabel=r"jump rate $\zeta$ (raw $h_L$)",
               title="the final-layer jump over the checkpoints")
    if exits:           # average accuracy per exit layer, a task without acc (wikitext) by its word perplexity
        results, chance = next(iter(exits.values()))["results"], next(iter(exits.values()))["chance"]
        n_acc, ppl = sum("acc" in r for r in results.values()), [t for t, r in results.items() if "acc" not in r]
        n_axes = bool(n_acc) + len(ppl) + bool(analysed)
        fig = figures["early_exit.png"] = plt.figure(layout="constrained", figsize=(0.5 + 5.5 * n_axes, 4))
        axes = list(np.ravel(fig.subplots(1, n_axes, squeeze=False)))
        if n_acc:
            ax = axes.pop(0)
            for name, e in exits.items():
                layers, avgs = [r["layer"] for r in e["early_exit"]], [r["average"] for r in e["early_exit"]]
                ax.plot(layers, [a["acc"] for a in avgs], marker="o", ms=3, label=styles[name][0],
                        color=styles[name][1]["color"])
                if avgs[0]["acc_norm"] is not None:
                    ax.plot(layers, [a["acc_norm"] for a in avgs], ls="--", color=styles[name][1]["color"])
            ax.plot([], [], color="gray", label="acc")
            ax.plot([], [], color="gray", ls="--", label="acc_norm")
            ax.axhline(np.mean(list(chance.values())), color="gray", ls=":", label="chance (average)")
            ax.set(title=r"early exit: tasks scored on head(norm($h_\ell$))", xlabel=EXIT_LAYER,
                   ylabel=f"average accuracy ({n_acc} task{'s' * (n_acc > 1)})")
        for task in ppl:
            ax = axes.pop(0)
            for name, e in exits.items():
                ax.plot([r["layer"] for r in e["early_exit"]], [r["results"][task]["word_perplexity"]
                        for r in e["early_exit"]], marker="o", ms=3, label=styles[name][0], **styles[name][1])
            _y_scale(ax, [r["results"][task]["word_perplexity"] for e in exits.values() for r in e["early_exit"]])
            ax.set(title=rf"early exit: {task} on head(norm($h_\ell$))", xlabel=EXIT_LAYER, ylabel="word perplexity")
        if analysed:
            _curves(axes.pop(0), analysed, styles, **LENS)
    for file, fig in figures.items():
        handles = {}
        for ax in fig.axes:
            ax.grid(alpha=0.3)
            ax.ticklabel_format(axis="both" if ax.get_yscale() == "linear" else "x", useOffset=False)  # no "+1e1"
            ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
            handles.update({label: h for h, label in zip(*ax.get_legend_handles_labels()) if label not in handles})
        fig.legend(handles.values(), handles.keys(), loc="outside right upper", fontsize=7,
                   title=legend_titles.get(file), title_fontsize=7, alignment="left", handlelength=3)
        fig.savefig(os.path.join(out_dir, file), dpi=120)
        plt.close(fig)
    return [os.path.join(out_dir, file) for file in figures]
