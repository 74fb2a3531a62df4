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
import torch.nn.functional as F

WEIGHTINGS = ("index", "depth", "uniform", "last")


def streams(out, final_norm=False):
    """The hidden states to measure: raw h_L (default) or h_L after the final norm (HF convention)."""
    return out.hidden_states[:-1] + [out.final_hidden] if final_norm else out.hidden_states


def displacement(hidden_states, mask=None, skip_first=False):
    """Ψ_1..Ψ_L: a tensor of L values, each the mean over tokens of (1 - cos(h_{l-1}, h_l)) / 2.

    mask: optional [B, T] bool/0-1 tensor, True for tokens to include (e.g. non-padding).
    skip_first: drop position 0 from the average. Computed in fp32 whatever the input dtype; differentiable."""
    h = hidden_states
    psi = torch.stack([(1 - F.cosine_similarity(a.float(), b.float(), dim=-1)) / 2 for a, b in zip(h[:-1], h[1:])])
    # psi: [L, B, T] per-token displacements
    weight = torch.ones_like(psi[0]) if mask is None else mask.to(psi.dtype).expand_as(psi[0]).clone()
    if skip_first:
        weight[:, 0] = 0
    return (psi * weight).sum(dim=(1, 2)) / weight.sum()


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
        return F.one_hot(torch.tensor(n_layer - 1), n_layer).float()
    raise ValueError(f"unknown weighting {weighting!r}; choose one of {WEIGHTINGS}")


def jreg_penalty(hidden_states, alpha, weighting="index", mask=None, skip_first=False, psi=None):
    """Σ_l w_l Ψ_l, a differentiable scalar. Pass `psi` if displacement() was already computed."""
    if psi is None:
        psi = displacement(hidden_states, mask=mask, skip_first=skip_first)
    return (layer_weights(len(psi), alpha, weighting).to(psi.device) * psi).sum()
