"""
The optimizer of a run, and which parameters each of its parts updates: AdamW over every parameter (the default), or,
with optimizer = "muon", PyTorch's torch.optim.Muon for the blocks' 2-D matrices (the attention and MLP projections)
and AdamW for the rest (the token embedding, the head, the norms, any scalar), as Moonlight, OLMo-core and the
modded-nanogpt records split them.

    optimizer = build_optimizer(model, cfg, device)   # torch.optim.AdamW, or Optimizers([Muon, AdamW])
    optimizer.param_groups                            # every group of every part; the loop sets each one's lr to the
                                                      # schedule's × its "lr_mult" (1 unless named)
    optimizer.step(); optimizer.zero_grad()           # each part; its state dict by parameter name (checkpoint.py)

AdamW's groups: the ≥ 2-D weights with weight decay (the token embedding too with decay_embeddings; tied: the shared
matrix), the norms and biases without, Backout's λ alone at backout_lr_mult × the lr. Muon takes the run's lr, weight
decay and muon_momentum, and muon_adjust_lr as its adjust_lr_fn (Moonlight's match_rms_adamw: the update's RMS that of
AdamW's, so one lr serves both).
"""
import torch


class Optimizers(list):
    """Several torch optimizers stepped as one: what the loop and checkpoint.py call on an optimizer (DCP's
    get_state_dict and set_state_dict take the list, keyed by parameter name)."""

    @property
    def param_groups(self):
        return [group for optimizer in self for group in optimizer.param_groups]

    def step(self):
        for optimizer in self:
            optimizer.step()

    def zero_grad(self, set_to_none=True):
        for optimizer in self:
            optimizer.zero_grad(set_to_none=set_to_none)


def is_block_matrix(name, p):
    """The parameters Muon updates: the 2-D weights inside the blocks (layers.N.…), not the embedding or the head."""
    return name.startswith("layers.") and p.dim() == 2


def build_optimizer(model, cfg, device):
    """AdamW over the model's parameters as spread (DDP or FSDP), or Muon for the blocks' matrices and AdamW for the
    rest (cfg.optimizer); see the module docstring."""
    muon = [p for name, p in model.named_parameters() if cfg.optimizer == "muon" and is_block_matrix(name, p)]
    decay, no_decay, own_lr = [], [], []
    for name, p in model.named_parameters():
        if any(p is q for q in muon):
            continue
        decays = p.dim() >= 2 and (cfg.decay_embeddings or p is not model.tok_emb.weight)
        (own_lr if name == "backout_lambda" and cfg.backout_lr_mult != 1 else decay if decays else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    groups += [{"params": own_lr, "weight_decay": 0.0, "lr_mult": cfg.backout_lr_mult}] if own_lr else []   # × lr
    adamw = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=device.type in ("cuda", "cpu"))
    if not muon:
        return adamw
    return Optimizers([torch.optim.Muon(muon, lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=cfg.muon_momentum,
                                        adjust_lr_fn=cfg.muon_adjust_lr), adamw])
