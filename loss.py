"""
What training minimises: the language-model loss, computed a chunk of positions at a time so that the full
[B·T, vocab] logits never exist, and the objective of a training step around it.

    loss, terms = cross_entropy(model.lm_head, hidden, targets, loss_chunk)
        # == F.cross_entropy(lm_head(hidden).float().flatten(0, 1), targets.flatten(), ignore_index=-1), with
        # chunk_loss as shipped; terms: each named term's mean (detached), {"ce": ...}
    objective = Objective(model, jreg_lambda=1.0, alpha=1.0, early_exit=0.0)
    objective.at_step(step)                                        # the exits LayerSkip's curriculum trains now
    loss, penalty, per_target, per_token = objective(x, y, mask)   # train.train_step: loss + λ · penalty

chunk_loss, just below, is the loss of one chunk: a plain function that autograd differentiates. An edit to it (a
z-loss, label smoothing) or to the head module (a bias, a soft-cap) reaches training, evaluation and their gradients,
and a term it returns under a new name is logged by itself (docs/ablations.md). Objective adds the losses that read
other layers (the early-exit loss) and the JREG penalty (jreg.py). The rest of this file is how the chunks are run;
nothing in it needs editing for a new loss.
"""
import functools

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, vjp

from jreg import displacement, layer_weights, streams

EARLY_EXIT_SCALES = ("uniform", "sum_l")                     # how Objective weighs the early exits' losses


def chunk_loss(logits, targets):
    """The loss of one chunk of positions, as named sums over its targets != -1, in fp32: training minimises their
    total, and logs each one's mean per predicted position under its name (a term added here is logged by itself)."""
    logits = logits.float()
    return {
        "ce": F.cross_entropy(logits, targets, ignore_index=-1, reduction="sum"),
    }


def cross_entropy(head, hidden, targets, loss_chunk):
    """(loss, terms): the mean over targets != -1 of the total of chunk_loss(head(hidden)), computed `loss_chunk`
    positions at a time, and each term's mean (detached). As shipped it equals F.cross_entropy(head(hidden), targets,
    ignore_index=-1) (test_jreg.py holds it to that). With gradients, each chunk's are made as it is computed
    (ChunkedGradients: no chunk's logits kept for the backward pass); eager or inside torch.compile (the chunks then
    run compiled)."""
    hidden, targets = hidden.flatten(0, 1), targets.reshape(-1)
    count = (targets != -1).sum()
    if torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in head.parameters())):
        terms = {}                                          # filled by the chunks: each term's sum, detached
        total = chunked_gradients(hidden, targets, head, loss_chunk, terms, torch.compiler.is_compiling())
    else:                                                   # no gradients: a chunk's logits live one at a time
        total, terms = 0.0, {}
        for i in range(0, len(hidden), loss_chunk):
            parts = chunk_loss(head(hidden[i:i + loss_chunk]), targets[i:i + loss_chunk])
            total = total + sum(parts.values())
            terms = {name: terms.get(name, 0.0) + value for name, value in parts.items()}
    return total / count, {name: value.detach() / count for name, value in terms.items()}


class Objective(nn.Module):
    """What a training step minimises, from one forward of `model` (one graph for torch.compile, one module for DDP):
    loss + jreg_lambda · penalty, where
      loss     the mean over the targets != -1 of the model's loss (cross_entropy: CE and any term of chunk_loss) plus,
               with early_exit = w > 0, LayerSkip's early-exit loss on the logit lens of the blocks below L,
               CE_ℓ = CE(head(head_input(h_ℓ)), y): early_exit_scale "uniform", CE_L + w · mean over ℓ < L of CE_ℓ;
               "sum_l", Σ_ℓ s_ℓ · CE_ℓ over the trained exits and L, s_ℓ ∝ the sum of the trained depths up to ℓ
               (ℓ(ℓ+1)/2 when every exit trains), × w for ℓ < L, Σ s = 1 (torchtune's early_exit_loss with
               sum_l_loss_scale, read at the blocks' outputs); with early_exit_every = R > 0 only the exits that the
               step's rotation names train (at_step: torchtune's RotationalEarlyExitCurriculum);
      penalty  JREG, Σ_l w_l Ψ_l (jreg.py) over the tokens of mask: w = layer_weights(L, alpha, weighting), h_L raw or
               after the final norm (final_norm), position 0 left out or not (skip_first).
    The loop weighs the two by their micro-batch's share of the global batch's targets and tokens (train.train_step),
    with this objective's jreg_lambda; at jreg_lambda = 0 (the baseline) Ψ is computed for the log only, outside
    autograd. (Compiled, sharded or wrapped for the loop: parallel.parallelize.)"""

    def __init__(self, model, jreg_lambda=1.0, alpha=1.0, weighting="index", final_norm=False, skip_first=False,
                 early_exit=0.0, early_exit_scale="uniform", early_exit_every=0):
        super().__init__()
        self.model, self.jreg_lambda, self.early_exit = model, jreg_lambda, early_exit
        self.final_norm, self.skip_first = final_norm, skip_first
        self.displacement = displacement
        self.register_buffer("weights", layer_weights(model.config.n_layer, alpha, weighting), persistent=False)
        self.scale, self.every = early_exit_scale, early_exit_every
        self.register_buffer("exits", torch.ones(model.config.n_layer), persistent=False)   # trained now: h_1..h_L
        self.trained = list(range(1, model.config.n_layer))       # the same, as the blocks ℓ < L (eager: the rest skip)

    def at_step(self, step):
        """The exits this step trains: all, or with early_exit_every = R those of LayerSkip's rotation, torchtune's
        RotationalEarlyExitCurriculum over the layers "::R" rolled by one a step (here at the blocks' outputs:
        exit ℓ ↔ index ℓ − 1), and h_L always."""
        if self.every:
            L = self.model.config.n_layer
            self.trained = [ell for ell in range(1, L) if (ell - 1 - step) % L % self.every == 0]
            self.exits.copy_(torch.tensor([float(ell in self.trained or ell == L) for ell in range(1, L + 1)]))

    def early_exit_loss(self, loss, out, y):
        """(the loss with the early exits, their part alone): see the class docstring."""
        m, L = self.model, self.model.config.n_layer
        every = self.trained if not torch.compiler.is_compiling() else range(1, L)   # compiled: zero weights, no guard
        lens = {ell: m.loss(m.lm_head, m.head_input(out.hidden_states[ell], out.hidden_states), y, m.loss_chunk)[0]
                for ell in every}
        if self.scale == "uniform" and not self.every:            # w · mean over ℓ < L (as before the options)
            part = self.early_exit * sum(lens.values()) / (L - 1)
            return loss + part, part
        ell = torch.arange(1, L + 1, dtype=torch.float32, device=self.exits.device)
        if self.scale == "uniform":                               # w · mean over the trained exits
            s = self.early_exit * self.exits[:-1] / self.exits[:-1].sum().clamp(min=1)
            part = sum((s[i - 1] * lens[i] for i in lens), loss.new_zeros(()))
            return loss + part, part
        s = torch.cumsum(ell * self.exits, 0) * self.exits * torch.where(ell < L, self.early_exit, 1.0)   # sum_l
        s = s / s.sum()
        part = sum((s[i - 1] * lens[i] for i in lens), loss.new_zeros(()))
        return s[-1] * loss + part, part

    def forward(self, x, y, mask=None):
        """(loss, penalty, per_target, per_token): the loss and the penalty above, and the named values to log, means
        over the same targets (the loss's parts: ce, early_exit, ...) and tokens (jreg, psi = Ψ_1..Ψ_L)."""
        out = self.model(x, y)                                  # the loss chunked: no full logits
        loss, terms = out.loss, out.loss_terms
        if self.early_exit:                                     # the logit lens of the blocks below L, trained
            loss, part = self.early_exit_loss(loss, out, y)
            terms = {**terms, "early_exit": part.detach()}
        hs = streams(out, self.final_norm)
        if not self.jreg_lambda:
            hs = [h.detach() for h in hs]
        psi = self.displacement(hs, mask=mask, skip_first=self.skip_first)
        penalty = (self.weights * psi).sum()
        return loss, penalty, terms, {"jreg": penalty.detach(), "psi": psi.detach()}


# ----------------------------------------------------------------------------------------------------------
# How the chunks' gradients are made

def chunk_loss_and_grads(head, params, hidden, targets, sums):
    """The total of chunk_loss(head(hidden)) and its terms, and the gradient for hidden, by torch.func.vjp through the
    head module and the loss, whatever either computes; the gradient for each of the head's parameters (a dict) is added
    into sums[name], one fp32 buffer each, inside the step (compiled, the add fuses with the cast to fp32)."""
    def total(p, h):
        parts = chunk_loss(functional_call(head, p, (h,)), targets)
        return sum(parts.values()), {name: value.detach() for name, value in parts.items()}
    loss, backward, terms = vjp(total, params, hidden, has_aux=True)
    grad_params, grad_hidden = backward(torch.ones_like(loss))
    for name, grad in grad_params.items():
        sums[name].add_(grad)
    return loss.detach(), terms, grad_hidden


@functools.cache
def compiled_chunk_loss_and_grads():
    return torch.compile(chunk_loss_and_grads)


class ChunkedGradients(torch.autograd.Function):
    """Σ_c loss(head(h_c), t_c) over chunks c of `loss_chunk` positions, with each chunk's gradients made in the forward pass.

    The loss is a sum over positions, so chunk c's gradients depend on chunk c alone: ∂loss/∂h_c is chunk c's own, and
    ∂loss/∂θ = Σ_c (chunk c's). Plain autograd over the whole would keep every chunk's logits for the backward pass, or
    (checkpointed) compute them twice. Here each chunk's gradients are computed at once and summed, its logits freed;
    the backward pass only scales the sums by the incoming gradient. Memory: one chunk's logits and what autograd keeps
    of them, and gradient buffers shaped like hidden and θ. Each term's sum (detached) is added into `terms`."""

    @staticmethod
    def forward(ctx, hidden, targets, head, loss_chunk, chunk_fn, terms, *params):
        names = [name for name, _ in head.named_parameters()]
        total, grad_hidden = 0.0, torch.empty_like(hidden)
        sums = {name: torch.zeros_like(p, dtype=torch.float32) for name, p in zip(names, params)}
        for start in range(0, hidden.size(0), loss_chunk):
            part = slice(start, start + loss_chunk)
            loss, parts, grad_hidden[part] = chunk_fn(head, dict(zip(names, params)), hidden[part], targets[part], sums)
            total = total + loss
            terms.update({name: terms.get(name, 0.0) + value for name, value in parts.items()})
        ctx.save_for_backward(grad_hidden, *(sums[name].to(p.dtype) for name, p in zip(names, params)))
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grad_hidden, *grad_params = ctx.saved_tensors
        return (grad_hidden * grad_total, None, None, None, None, None, *(g * grad_total for g in grad_params))


def outside_compiled_graphs(fn):
    """torch.compiler.disable(fn), applied at the first call instead of at import: it imports the compiler (about 1.5 s
    of every process's start, evaluate.py and a config error included). Traced, the same graph break."""
    @functools.wraps(fn)
    def run(*args):
        disabled = getattr(fn, "_outside_compiled_graphs", None)
        if disabled is None:
            disabled = fn._outside_compiled_graphs = torch.compiler.disable(fn)
        return disabled(*args)
    return run


@outside_compiled_graphs
def chunked_gradients(hidden, targets, head, loss_chunk, terms, compiled):
    """Outside any compiled graph: inductor would fuse the chunks' gradient sums into one kernel that needs every
    chunk's partial sums at once. Each chunk runs compiled when the caller is."""
    chunk_fn = compiled_chunk_loss_and_grads() if compiled else chunk_loss_and_grads
    return ChunkedGradients.apply(hidden, targets, head, loss_chunk, chunk_fn, terms, *head.parameters())
