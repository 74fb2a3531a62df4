"""
Layer analyses on fixed windows, outside any compiled graph: the Ψ / ζ profile on both h_L conventions
(jreg.Profile), logit-lens losses at every layer, the loss with one block skipped, the windows they read (a run's
validation windows, text files, task contexts), and the plots.

    windows = text_windows(lm, ["corpus.txt"], n=64, seq_len=256)
    p = profile_model(model, windows)             # psi, zeta, psi_normed, ..., loss, per-layer analyses
"""
import os
import re

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from data import is_conversations, list_shards, read_manifest, read_shard
from jreg import Profile
from lib.hf import llama_from_hf
from lib.progress import Progress
from lib.style import grid, legend, line_styles, pretty, save
from model import Llama
from tokenizer import HFTokenizer, get_tokenizer, tokenizer_fingerprint


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


def readout(model, h, hidden):
    """The logits of a hidden state h (the logit lens), as the model reads its own last one: our Llama through its
    head_input (the final norm, and Backout's − λ·h_k from `hidden`, the forward's streams [h_0..h_L], indexed as h
    is); another model through its final norm and output embeddings."""
    if isinstance(model, Llama):
        return model.lm_head(model.head_input(h, hidden))
    return model.get_output_embeddings()(blocks_and_norm(model)[1](h))


def skip_block_logits(model, idx, hidden, i):
    """The logits with block i's (0-based) update removed: our Llama reruns only the blocks above it from h_i (their
    streams replace the forward's, so a readout that reads a stream above i, Backout's h_k, reads the new one)."""
    if not isinstance(model, Llama):
        return forward_streams(model, idx, skip=i)[0]
    x, cos, sin = hidden[i], model.rope_cos[:idx.size(1)], model.rope_sin[:idx.size(1)]
    skipped = hidden[:i + 1] + [x]                                  # block i passes its input through
    for block in model.layers[i + 1:]:
        x = block(x, cos, sin)
        skipped.append(x)
    return readout(model, x, skipped)


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
    the model reads w[:, :-1] and is scored on w[:, 1:], as train.py's eval; or (x, y, real) of data.PackedStream:
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
                        per_layer.append(loss_sum(readout(model, h, hidden), y, valid))
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


ASSISTANT = " (assistant)"      # evaluate.py's name for a fine-tuning run's profile on the assistant's tokens only


def _family(name, names):
    """The model whose colour a profile takes: `NAME (assistant)` and `NAME_seedN` (another seed of a plotted NAME)
    are NAME's."""
    import re
    name = name.removesuffix(ASSISTANT)
    m = re.fullmatch(r"(.+)_seed\d+", name)
    return m.group(1) if m and m.group(1) in names else name


def _styles(plt, names, series):
    """{name: (legend label, line style, panel)} and {model or run: colour}: a series' checkpoints (NAME@STEP) share
    one panel, coloured by step on one scale for all series; other models in lib/style.py's colours (the baseline
    blue, JREG α = 1 orange, α = 3 green, the rest a colour each), the runs of one condition (NAME_seedN, sft_NAME)
    told apart by shade, marker and line style; `NAME (assistant)` in NAME's colour and marker, dashed. A path is
    shown by its last part, a GGUF file by its model and quantisation."""
    import re
    steps = {}
    for run, points in (series or {}).items():
        for name in names:
            m = re.fullmatch(re.escape(run) + r"@.*?(\d+)", name)
            if m and int(m.group(1)) in {pt["step"] for pt in points}:
                steps[name] = (run, int(m.group(1)))
    plain = list(dict.fromkeys([n.removesuffix(ASSISTANT) for n in names if n not in steps] + list(series or {})))
    lines = line_styles(plain, family=lambda name: _family(name, plain))
    colour = {name: style["color"] for name, style in lines.items()}
    lo, hi = np.log1p([min(s for _, s in steps.values()), max(s for _, s in steps.values())]) if steps else (0, 1)
    by_step = plt.get_cmap("viridis")
    styles = {name: (f"step {step}", {"color": by_step(0.9 * (np.log1p(step) - lo) / ((hi - lo) or 1)), "ls": "-",
                                      "marker": "o"}, f"{_short(run)}, checkpoints")
              for name, (run, step) in steps.items()}
    for name in names:
        if name not in steps:
            style = dict(lines[name.removesuffix(ASSISTANT)])
            if name.endswith(ASSISTANT):
                style["ls"] = "--"
            styles[name] = (_short(name), style, None)
    return styles, colour


def _short(name):
    return pretty(name)


def _y_scale(ax, values):
    """Log y (ticks 1, 2, 5 × 10^k, plain numbers) where the values are all positive and span over a decade, else
    linear (a value ≤ 0 keeps the axis linear, so that its sign reads at a glance)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if not len(v) or v.min() <= 0 or v.max() < 10 * v.min():
        return
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0) if np.log10(v.max() / v.min()) <= 2.5 else (1.0,)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _off_scale(ax, first, rest, what, x, sign=""):
    """Where every model's first value (Ψ_1, the first block's skip) is over 2.5 × all the others, a linear axis fitted
    to the others (room below 0 where some are negative), the first said in words at the top (x: where the text
    starts, in data units)."""
    first, rest = np.asarray(first, dtype=float), np.asarray(rest, dtype=float)
    if not len(rest) or rest.max() <= 0 or first.min() <= 2.5 * rest.max():
        return
    lo, hi = min(rest.min(), 0.0), rest.max()
    ax.set_ylim(lo - (0.15 if lo < 0 else 0.05) * (hi - lo), hi + 0.12 * (hi - lo))
    values = " to ".join(dict.fromkeys(f"{v:{sign}.2f}" for v in (first.min(), first.max())))
    ax.text(x, 0.97, f"{what}: {values} (above the axis)", transform=ax.get_xaxis_transform(), va="top", fontsize=8)


def _psi_lines(ax, profiles, styles, names, first=1, nested=False, labelled=True):
    """Ψ_l on the raw stream from layer `first` on, and Ψ_L on the final-normed h_L as an open circle, every point on
    its layer's tick; nested: each model's markers a size of their own (the first, drawn first, the largest), so that
    equal values show one inside the other instead of one hiding the other."""
    for i, n in enumerate(names):
        (label, style, panel), p = styles[n], profiles[n]
        if labelled and p["zeta"] and not panel:            # a series' ζ: zeta_over_checkpoints.png
            label += rf" ($\zeta_L$ {_zeta_l(p):.2f}, normed {_zeta_l(p, 'zeta_normed'):.2f})"
        x = np.arange(first, p["n_layer"] + 1)
        grow = 2.5 * (len(names) - 1 - i) if nested else 0
        ax.plot(x, p["psi"][first - 1:], ms=4 + grow, label=label if labelled else "_zoom", **style)
        ax.plot(x[-1:], p["psi_normed"][-1:], marker="o", ms=7 + grow, mfc="none", ls="", color=style["color"])


def _wrap(title, width=40):
    """A title longer than `width` characters on several lines: broken after a colon or before a parenthesis where
    one is, else between words (a panel's title must not run over its neighbours or the legend)."""
    import re
    import textwrap
    if len(title) <= width:
        return title
    parts = [part for part in re.split(r"(?<=:) | (?=\()", title) if part]
    return "\n".join(line for part in parts for line in textwrap.wrap(part, width, break_on_hyphens=False))


ZOOM_DEPTH = 12         # a panel of two or more models this deep gets a second panel for its last layers


def _psi_figure(plt, profiles, styles, zeta=False):
    """Ψ_l on the raw residual stream, Ψ_L on the final-normed h_L as an open circle, one panel per depth or series
    (a fine-tuning run's assistant-token profiles in a panel of their own); Ψ without the first token dotted where it
    differs visibly (over 1% of the panel's range), else the gap is said; Ψ_1 above the axis, said in words, where it
    would flatten the other layers; deep models' last layers again in a panel of their own, side by side.
    zeta: a last panel of ζ_l (raw h_L) per layer, every model in it."""
    panels, split = {}, any(n.endswith(ASSISTANT) for n in profiles)
    for name, p in profiles.items():
        tokens = (": assistant tokens" if name.endswith(ASSISTANT) else ": all tokens") if split else ""
        panels.setdefault(styles[name][2] or f"models of {p['n_layer']} layers{tokens}", []).append(name)
    shown, depths = [], {profiles[names[0]]["n_layer"] for names in panels.values()}
    for title, names in panels.items():
        L = profiles[names[0]]["n_layer"]
        if title.startswith("models of"):
            title = f"{styles[names[0]][0]}, {L} layers" if len(names) == 1 else \
                rf"$\Psi_\ell$ per layer{title.partition(' layers')[2]}" if len(depths) == 1 else title
        shown.append((_wrap(title), names, 1))
        if len(names) >= 2 and L >= ZOOM_DEPTH and all(profiles[n]["n_layer"] == L for n in names):
            k = max(4, L // 5)
            shown.append((f"layers {L - k + 1}–{L}, enlarged", names, L - k + 1))
    count = len(shown) + bool(zeta)
    fig, axes, spare = grid(plt, count)
    dotted, hidden, depth = False, [], {}
    for ax, (title, names, first) in zip(axes, shown):
        ax.set(title=title, xlabel=r"layer $\ell$", ylabel=r"$\Psi_\ell = (1 - \cos(h_{\ell-1}, h_\ell))\,/\,2$")
        if first > 1:                                     # the last layers, the models side by side
            _psi_lines(ax, profiles, styles, names, first, nested=True, labelled=False)
            ax.set_ylim(bottom=0)
            continue
        _psi_lines(ax, profiles, styles, names)
        span = np.ptp([v for n in names for v in profiles[n]["psi"] + profiles[n]["psi_normed"][-1:]]) or 1
        for n in names:
            p, layers = profiles[n], range(1, profiles[n]["n_layer"] + 1)
            gap = np.abs(np.subtract(p["psi"], p["psi_skip_first"])).max() if "psi_skip_first" in p else np.nan
            if gap > 0.01 * span:
                dotted = ax.plot(layers, p["psi_skip_first"], ls=":", lw=1, color=styles[n][1]["color"])
            elif gap >= 0:
                hidden.append(gap)
        depth.setdefault(profiles[names[0]]["n_layer"], []).append((ax, names))
    for panels in depth.values():                         # panels of one depth on one y scale, to compare
        names = [n for _, names in panels for n in names]
        rest = [v for n in names for v in profiles[n]["psi"][1:] + profiles[n].get("psi_skip_first", [])[1:]]
        rest += [profiles[n]["psi_normed"][-1] for n in names if profiles[n]["n_layer"] > 1]
        first = [profiles[n][k][0] for n in names for k in ("psi", "psi_skip_first") if k in profiles[n]]
        for ax, names in panels:
            _off_scale(ax, first, rest, r"$\Psi_1$", 2.1)
        lo, hi = min(ax.get_ylim()[0] for ax, _ in panels), max(ax.get_ylim()[1] for ax, _ in panels)
        for ax, _ in panels:
            ax.set_ylim(lo, hi)
    if zeta:
        _zeta_panel(axes[len(shown)], profiles, styles)
    axes[0].plot([], [], marker="o", ms=7, mfc="none", ls="", color="gray", label=r"$\Psi_L$ on the final-normed $h_L$")
    if dotted:
        axes[0].plot([], [], ls=":", color="gray", label="without the first token")
    note = f"\n{'other lines ' if dotted else ''}without the first token: within {max(hidden):.1e}, not drawn" \
        if hidden else ""
    return fig, r"$\Psi_\ell$ on the raw residual stream" + note, spare


def _zeta_panel(ax, profiles, styles):
    """ζ_2..ζ_L of each profile against the layer (raw h_L), from 0."""
    for name, p in profiles.items():
        ax.plot(range(2, len(p["zeta"]) + 2), p["zeta"], ms=4, label="_zeta", **styles[name][1])
    ax.set_ylim(bottom=0)
    ax.set(title=r"jump rate $\zeta_\ell$ (raw $h_L$)", xlabel=r"layer $\ell$",
           ylabel=r"$\zeta_\ell = 100\,\sum_{k \geq \ell} \max(0, \Psi_k - \Psi_{k-1})$")


def _curves(ax, profiles, styles, key, first=0, **labels):
    """Each profile's p[key] against the layer, from layer `first` on, on a readable y scale."""
    for name, p in profiles.items():
        ax.plot(range(first, first + len(p[key])), p[key], ms=4, label=styles[name][0], **styles[name][1])
    _y_scale(ax, [v for p in profiles.values() for v in p[key]])
    ax.set(**labels)


def _skip_panel(ax, analysed, styles):
    """The loss increase when block ℓ is skipped: log where all are positive over a decade, else linear with the zero
    line, a first block that dwarfs the rest above the axis (in words), and the values below 0 (skipping the block
    lowers the loss) labelled, the three lowest."""
    key = "skip_block_loss_increase"
    _curves(ax, analysed, styles, key, 1, xlabel=r"block $\ell$", ylabel="Δ cross-entropy (nats)",
            title=r"loss increase when block $\ell$ is skipped")
    if ax.get_yscale() != "linear":
        return
    ax.axhline(0, color="gray", lw=0.8)
    _off_scale(ax, [p[key][0] for p in analysed.values()], [v for p in analysed.values() for v in p[key][1:]],
               "block 1", 2.1, sign="+")
    below = sorted((v, l, n) for n, p in analysed.items() for l, v in enumerate(p[key], 1) if v < 0)
    for v, l, n in below[:3]:
        ax.annotate(f"skipping block {l} lowers {styles[n][0]}'s loss by {-v:.4f}", xy=(l, v), xytext=(-12, -4),
                    textcoords="offset points", ha="right", va="top", fontsize=8, color=styles[n][1]["color"],
                    arrowprops={"arrowstyle": "-", "color": styles[n][1]["color"], "lw": 0.6})
    if len(below) > 3:
        ax.text(0.98, 0.02, f"{len(below)} values below 0", transform=ax.transAxes, ha="right", fontsize=8)


EXIT_LAYER = r"exit layer $\ell$ (0 = embedding)"
LENS = dict(key="logit_lens_loss", title=r"logit lens: loss of head(norm($h_\ell$))",
            xlabel=r"layer $\ell$ (0 = embedding)", ylabel="cross-entropy (nats)")


def _seed(name):
    """The seed a run's name gives (NAME_seedN), or None."""
    m = re.fullmatch(r".+_seed(\d+)", name.removesuffix(ASSISTANT))
    return m and int(m.group(1))


def _lens_difference(ax, analysed, styles):
    """Each model's logit-lens loss minus that of the first model of its own seed (NAME_seedN; the names without a
    seed are one seed), layer by layer, so that a seed's own effect does not enter the difference; a zero line in the
    first model's colour."""
    key, refs = LENS["key"], {}
    for name in analysed:
        refs.setdefault(_seed(name), name)
    for name, p in analysed.items():
        ref = refs[_seed(name)]
        if name != ref:
            ax.plot(range(len(p[key])), np.subtract(p[key], analysed[ref][key]), ms=4, label=styles[name][0],
                    **styles[name][1])
    first = next(iter(refs.values()))
    ax.axhline(0, color=styles[first][1]["color"], lw=1.2)
    seeds = len(refs) > 1                                 # each seed's differences from its own first run
    ax.set(title=f"logit lens minus {styles[first][0]}'s" + (", same seed" if seeds else ""),
           xlabel=LENS["xlabel"], ylabel="Δ cross-entropy (nats)")


def _mean_rate(rates, tasks):
    known = [rates[t] for t in tasks if rates.get(t) is not None]
    return float(np.mean(known)) if known else None


def _early_exit_accuracy(ax, exits, styles):
    """Average accuracy per exit layer, acc solid and acc_norm dashed (each averaged over its own tasks), with the
    chance (and, where the results have it, the majority-class) level of each, on an axis from 0."""
    first = next(iter(exits.values()))
    results = first["results"]
    tasks = {"acc": [t for t, r in results.items() if "acc" in r], "acc_norm": [t for t, r in results.items()
                                                                                 if "acc_norm" in r]}
    average = first["early_exit"][0]["average"]
    counts = {"acc": average.get("n_tasks", len(tasks["acc"])),
              "acc_norm": average.get("n_tasks_acc_norm", len(tasks["acc_norm"]))}
    drawn = []
    for name, e in exits.items():
        layers, avgs = [r["layer"] for r in e["early_exit"]], [r["average"] for r in e["early_exit"]]
        drawn += [a["acc"] for a in avgs]
        style = styles[name][1]
        ax.plot(layers, [a["acc"] for a in avgs], marker=style["marker"], ms=4, label=styles[name][0],
                color=style["color"])
        if avgs[0].get("acc_norm") is not None:
            drawn += [a["acc_norm"] for a in avgs]
            ax.plot(layers, [a["acc_norm"] for a in avgs], ls="--", color=style["color"])
    norm = any(r["average"].get("acc_norm") is not None for e in exits.values() for r in e["early_exit"])
    count = lambda metric: f"{counts[metric]} task{'s' * (counts[metric] != 1)}"      # noqa: E731
    ax.plot([], [], color="gray", label=f"acc ({count('acc')})")
    if norm:
        ax.plot([], [], color="gray", ls="--", label=f"acc_norm ({count('acc_norm')})")
    majority = first.get("majority") or {t: r["majority"] for t, r in results.items() if "majority" in r}
    for what, rates, colour in (("chance", first.get("chance") or {}, "gray"), ("majority class", majority, "black")):
        for metric, ls in (("acc", ":"), ("acc_norm", "-.")):
            level = _mean_rate(rates, tasks[metric]) if metric == "acc" or norm else None
            if level is not None:
                drawn.append(level)
                ax.axhline(level, color=colour, ls=ls, lw=1.2, label=f"{what}, {metric} ({level:.3f})")
    top = max([v for v in drawn if v is not None and np.isfinite(v)], default=0.5)
    ax.set_ylim(0, min(1.0, np.ceil(10 * (top + 0.04)) / 10))
    n = {r.get("n") for r in results.values() if "acc" in r}
    ax.set(title=r"early exit: tasks scored on head(norm($h_\ell$))", xlabel=EXIT_LAYER,
           ylabel="average accuracy" + (f" (n = {n.pop()} per task)" if len(n) == 1 and None not in n else ""))


FIGURES = ("psi_profiles.png", "layer_analysis.png", "zeta_over_checkpoints.png", "early_exit.png")


def profile_figures(profiles, series=None, exits=None, files=None, zeta=False):
    """{file name: matplotlib Figure}, drawn and not saved (plot_profiles saves them; a notebook shows them):
    psi_profiles.png (Ψ per layer, raw and normed h_L; zeta=True: and a panel of ζ_l per layer), layer_analysis.png
    (logit lens, with three or more models its difference from the first's, and skipped blocks); given series
    {run: profiles of its checkpoints}, zeta_over_checkpoints.png (ζ_L, ζ_(L−2) against the step, from 0, raw h_L
    and, where it differs, the final-normed h_L beside it); given exits {model: evaluate_tasks output with
    early_exit}, early_exit.png (average accuracy per exit layer over the tasks with acc, with the chance levels of
    acc and acc_norm, from 0; a task without acc (wikitext) by its word perplexity). lib/style.py's colours and
    layout: panels in at most two columns, one legend per figure in the grid's empty cell or below the panels.
    files: draw only these of FIGURES (default: all that the data allow)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    want = lambda file: files is None or file in files               # noqa: E731
    plain = [name.removesuffix(ASSISTANT) for name in profiles]      # another seed of a run beside it, in the legend
    rank = {f: i for i, f in enumerate(dict.fromkeys(_family(name, plain) for name in profiles))}
    profiles = dict(sorted(profiles.items(), key=lambda kv: (kv[0].endswith(ASSISTANT), rank[_family(kv[0], plain)])))
    styles, colour = _styles(plt, list(profiles) + list(exits or {}), series)
    figures, legend_titles, spares = {}, {}, {}
    if profiles and want("psi_profiles.png"):
        fig, legend_titles["psi_profiles.png"], spares["psi_profiles.png"] = _psi_figure(plt, profiles, styles, zeta)
        figures["psi_profiles.png"] = fig
    analysed = {name: p for name, p in profiles.items() if "logit_lens_loss" in p}
    if analysed and want("layer_analysis.png"):
        depth = {len(p[LENS["key"]]) for p in analysed.values()}
        panels = [lambda ax: _curves(ax, analysed, styles, **LENS)]
        if len(analysed) >= 3 and len(depth) == 1:
            panels.append(lambda ax: _lens_difference(ax, analysed, styles))
        skipped = {name: p for name, p in analysed.items() if p.get("skip_block_loss_increase")}
        if skipped:
            panels.append(lambda ax: _skip_panel(ax, skipped, styles))
        fig, axes, spares["layer_analysis.png"] = grid(plt, len(panels))
        figures["layer_analysis.png"] = fig
        for ax, draw in zip(axes, panels):
            draw(ax)
    if series and want("zeta_over_checkpoints.png"):
        def zeta(pt, key, back=0):                        # ζ_L (back 0), ζ_(L−2) (back 2)
            return pt[key][-1 - back] if len(pt.get(key, [])) > back else np.nan
        both = [(zeta(pt, "zeta", b), zeta(pt, "zeta_normed", b)) for points in series.values() for pt in points
                for b in (0, 2)]
        both = np.array([pair for pair in both if np.isfinite(pair).all()]).reshape(-1, 2)
        gap = float(np.abs(both[:, 1] - both[:, 0]).max()) if len(both) else 0.0
        conventions = [("zeta", r"raw $h_L$")]
        if gap > 0.05 * max(float(np.abs(both).max()) if len(both) else 0.0, 1e-9):
            conventions.append(("zeta_normed", r"final-normed $h_L$"))
        elif len(both):
            legend_titles["zeta_over_checkpoints.png"] = f"final-normed $h_L$: within {gap:.2g} of raw, not drawn"
        fig, axes, spares["zeta_over_checkpoints.png"] = grid(plt, len(conventions))
        figures["zeta_over_checkpoints.png"] = fig
        for ax, (key, what) in zip(axes, conventions):
            for name, points in series.items():
                steps, c = [pt["step"] for pt in points], colour[name]
                ax.plot(steps, [zeta(pt, key) for pt in points], marker="o", color=c,
                        label=f"{_short(name)} $\\zeta_L$")
                ax.plot(steps, [zeta(pt, key, 2) for pt in points], marker="s", ls="--", color=c,
                        label=f"{_short(name)} $\\zeta_{{L-2}}$")
            ax.set_ylim(bottom=0)
            ax.set(xlabel="checkpoint step", ylabel=rf"jump rate $\zeta$ ({what})",
                   title=rf"final-layer jump, {what}")
    if exits and want("early_exit.png"):    # average accuracy per exit layer; a task without acc by its perplexity
        results = next(iter(exits.values()))["results"]
        acc, ppl = any("acc" in r for r in results.values()), [t for t, r in results.items() if "acc" not in r]
        fig, axes, spares["early_exit.png"] = grid(plt, acc + len(ppl))
        figures["early_exit.png"] = fig
        if acc:
            _early_exit_accuracy(axes.pop(0), exits, styles)
        for task in ppl:
            ax = axes.pop(0)
            for name, e in exits.items():
                ax.plot([r["layer"] for r in e["early_exit"]], [r["results"][task]["word_perplexity"]
                        for r in e["early_exit"]], ms=4, label=styles[name][0], **styles[name][1])
            _y_scale(ax, [r["results"][task]["word_perplexity"] for e in exits.values() for r in e["early_exit"]])
            ax.set(title=rf"early exit: {task} on head(norm($h_\ell$))", xlabel=EXIT_LAYER, ylabel="word perplexity")
    for file, fig in figures.items():
        handles = {}
        for ax in fig.axes:
            ax.grid(alpha=0.3)
            ax.ticklabel_format(axis="both" if ax.get_yscale() == "linear" else "x", useOffset=False)  # no "+1e1"
            ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
            handles.update({label: h for h, label in zip(*ax.get_legend_handles_labels()) if label not in handles})
        legend(fig, list(handles.values()), list(handles), title=legend_titles.get(file), spare=spares.get(file))
    return figures


def plot_profiles(profiles, out_dir, series=None, exits=None, files=None):
    """The figures of profile_figures written into out_dir as PNGs (lib/style.py's DPI); returns the paths written."""
    import matplotlib
    matplotlib.use("Agg")
    figures = profile_figures(profiles, series, exits, files)
    return [save(fig, os.path.join(out_dir, file)) for file, fig in figures.items()]


def report_figures(report):
    """(profiles, series, exits) for plot_profiles from an evaluate.py report {model: its entry} (the `models` of a
    JSON of several models, or {name: the JSON} of one): a fine-tuning run's profile twice, on all tokens and as
    `NAME (assistant)` on the assistant's; the checkpoints of the runs that have some; the models with early exit."""
    profiles = {}
    for name, e in report.items():
        if "profile" in e:
            p = e["profile"]
            profiles[name] = p
            if "assistant" in p:
                profiles[name + ASSISTANT] = {**p["assistant"], **({"seq_len": p["seq_len"]} if "seq_len" in p else {})}
    series = {name: e["profile_checkpoints"] for name, e in report.items() if e.get("profile_checkpoints")}
    exits = {name: e for name, e in report.items() if "early_exit" in e}
    return profiles, series, exits
