"""
The paper's metrics and penalty, as pure functions on a list of hidden states [h_0, h_1, ..., h_L].

    Ψ_l = (1 - SC(h_{l-1}, h_l)) / 2                      displacement of block l, mean over tokens, in [0, 1]
    ζ_l = 100 · Σ_{k=l..L} max(0, Ψ_k - Ψ_{k-1})          jump rate, l = 2..L  (ζ_L: the final-layer jump)
    JREG = Σ_l w_l Ψ_l,  w = softmax_l(α · l)             the penalty; loss = CE + λ · JREG

Which vector is h_L is the caller's choice, made by what it passes (see `streams`):
    out.hidden_states                                     raw residual stream after block L (our default)
    out.hidden_states[:-1] + [out.final_hidden]           after the final RMSNorm (Hugging Face's convention)
"""
import torch
import torch.nn as nn


WEIGHTINGS = ("index", "depth", "uniform", "last")


def streams(out, final_norm=False):
    """The hidden states to measure: raw h_L (default) or h_L after the final norm (HF convention)."""
    return out.hidden_states[:-1] + [out.final_hidden] if final_norm else out.hidden_states


def displacement(hidden_states, mask=None, skip_first=False):
    """Ψ_1..Ψ_L: a tensor of L values, each the mean over tokens of (1 - cos(h_{l-1}, h_l)) / 2.

    mask: optional [B, T] bool/0-1 tensor, True for tokens to include (e.g. non-padding).
    skip_first: drop position 0 from the average. Computed in fp32 whatever the input dtype; differentiable.
    No token to average (an all-padding mask, or one position with skip_first): zeros, with a zero gradient."""
    h = [x.float() for x in hidden_states]
    norms = [torch.linalg.vector_norm(x, dim=-1).clamp_min(1e-8) for x in h]       # |h_l| per token, once each
    weight = None                                                                   # None: every token counts
    if mask is not None or skip_first:
        weight = torch.ones(h[0].shape[:2], device=h[0].device) if mask is None else \
            mask.to(torch.float32).expand(h[0].shape[:2]).clone()
        weight[:, :int(skip_first)] = 0
        count = weight.sum().clamp(min=1e-12)
    psi = []
    for a, b, na, nb in zip(h[:-1], h[1:], norms[:-1], norms[1:]):                 # layer by layer: no [L, B, T]
        per_token = (1 - (a * b).sum(-1) / (na * nb)) / 2
        psi.append(per_token.mean() if weight is None else (per_token * weight).sum() / count)
    return torch.stack(psi)


def jump_rate(psi):
    """ζ_2..ζ_L from Ψ_1..Ψ_L: a tensor of L-1 values, so [-1] is ζ_L. In percent, as in the paper."""
    rises = (psi[1:] - psi[:-1]).clamp(min=0)              # rises[i] = max(0, Ψ_{i+2} - Ψ_{i+1})
    return 100 * rises.flip(0).cumsum(0).flip(0)           # ζ_l sums the rises from l-1 up to the top


def layer_weights(n_layer, alpha, weighting="index"):
    """Per-layer penalty weights w_1..w_L (sum to 1).
    index: softmax(α·l)   depth: softmax(α·l/L)   uniform: 1/L   last: all weight on layer L."""
    l = torch.arange(1, n_layer + 1, dtype=torch.float32)
    if weighting == "index":
        return torch.softmax(alpha * l, dim=0)
    if weighting == "depth":
        return torch.softmax(alpha * l / n_layer, dim=0)
    if weighting == "uniform":
        return torch.full((n_layer,), 1.0 / n_layer)
    if weighting == "last":
        return nn.functional.one_hot(torch.tensor(n_layer - 1), n_layer).float()
    raise ValueError(f"unknown weighting {weighting!r}; choose one of {WEIGHTINGS}")


def jreg_penalty(hidden_states, alpha, weighting="index", mask=None, skip_first=False, psi=None):
    """Σ_l w_l Ψ_l, a differentiable scalar. Pass `psi` if displacement() was already computed."""
    psi = displacement(hidden_states, mask=mask, skip_first=skip_first) if psi is None else psi
    return (layer_weights(len(psi), alpha, weighting).to(psi.device) * psi).sum()


class Profile:
    """Ψ averaged over every token of many batches (each batch weighted by its token count), for both h_L conventions,
    with and without position 0, and the loss; ζ is computed from the averaged Ψ. train.py's periodic eval and
    evaluate.py's layer profiles both use it, so their numbers agree by construction."""

    VARIANTS = {"psi": dict(final_norm=False, skip_first=False), "psi_normed": dict(final_norm=True, skip_first=False),
                "psi_skip_first": dict(final_norm=False, skip_first=True),
                "psi_normed_skip_first": dict(final_norm=True, skip_first=True)}

    def __init__(self):
        self.sums = {}                                # name -> running float64 sum: Ψ·tokens per variant, counts, loss

    def add(self, hidden_states, final_hidden, mask=None, loss_sum=0.0, n_loss=0):
        """One batch: hidden_states = [h_0..h_L] (raw), final_hidden = h_L after the final norm, mask [B, T] of the
        tokens to count (None: all), loss_sum over n_loss predicted tokens."""
        h = hidden_states[0]
        mask = torch.ones(h.shape[:2], dtype=torch.bool, device=h.device) if mask is None else mask.bool()
        batch = {"n_tokens": mask.sum(), "n_tokens_skip_first": mask[:, 1:].sum(),
                 "loss_sum": torch.as_tensor(loss_sum, device=h.device), "n_loss": torch.as_tensor(n_loss, device=h.device)}
        for name, variant in self.VARIANTS.items():
            hs = hidden_states[:-1] + [final_hidden] if variant["final_norm"] else hidden_states
            count = batch["n_tokens_skip_first" if variant["skip_first"] else "n_tokens"]
            batch[name] = displacement(hs, mask, variant["skip_first"]) * count if count > 0 else \
                h.new_zeros(len(hs) - 1, dtype=torch.float32)
        for name, value in batch.items():
            self.sums[name] = self.sums.get(name, 0) + value.double()

    def result(self, all_reduce=None):
        """A dict of lists: psi (Ψ_1..Ψ_L), zeta (ζ_2..ζ_L; empty for one layer), the normed / skip-first variants,
        n_tokens, n_tokens_skip_first, loss. all_reduce: e.g. torch.distributed.all_reduce, to sum over processes."""
        sums = {name: value.clone() for name, value in self.sums.items()}
        for name in sorted(sums):                     # the same order on every process
            if all_reduce is not None:
                all_reduce(sums[name])
        n_tokens, n_skip = int(sums["n_tokens"]), int(sums["n_tokens_skip_first"])
        out = {"n_layer": len(sums["psi"]), "n_tokens": n_tokens, "n_tokens_skip_first": n_skip,
               "loss": (sums["loss_sum"] / sums["n_loss"]).item() if sums["n_loss"] else None}
        for name, variant in self.VARIANTS.items():
            if count := (n_skip if variant["skip_first"] else n_tokens):
                psi = sums[name] / count
                out[name], out[name.replace("psi", "zeta")] = psi.tolist(), jump_rate(psi).tolist()
        return out
