"""
A compact Llama that returns every residual stream.

Pre-norm RMSNorm, rotary position embeddings (precomputed buffer), grouped-query attention through
F.scaled_dot_product_attention, SwiGLU MLP, no biases, final RMSNorm, LM head. Nothing distributed.

    out = model(idx, targets)
    out.logits          [B, T, vocab]
    out.loss            mean cross-entropy over targets != -1 (None without targets)
    out = model(idx, targets, return_logits=False)     # training: logits None, the loss computed loss_chunk positions
                                                       # at a time, so full fp32 logits never exist (chunked_cross_entropy)
    out.hidden_states   [h_0, h_1, ..., h_L]: h_0 the embedding output, h_l the raw residual stream after block l
    out.final_hidden    norm(h_L), the vector the LM head reads (what Hugging Face reports as its last hidden state)

    out = model(idx, cache=KVCache(cfg, B, max_len, device, dtype), positions=pos, real=real)   # generation
        appends idx after the cache.len positions already cached: the same modules and attention as training, the
        keys and values of earlier positions read from the cache. positions [B, T] are the RoPE positions (default:
        cache.len onwards), real [B, T] is False at left padding, which no query attends to. Without a cache the
        forward is exactly the training forward (causal attention over idx, positions 0..T-1).

The streams are the tensors autograd keeps for the backward pass anyway, so returning them is free.
model.checkpoint_blocks = True (activation checkpointing): in training, each block keeps only its input stream and
recomputes the rest in the backward pass: the same numbers, a fraction of the memory, about one more forward's compute.
Llama.from_hf / Llama.to_hf convert to and from transformers' LlamaForCausalLM (imported only there).
"""
import math
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


@dataclass
class LlamaConfig:
    vocab_size: int = 50304        # GPT-2's 50257 padded up to a multiple of 64
    n_layer: int = 12
    n_head: int = 12
    n_kv_head: int = 12            # < n_head: grouped-query attention
    d_model: int = 768
    ffn_hidden: int = 2048         # SwiGLU hidden size
    max_seq_len: int = 2048
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    init_std: float = 0.02

    @property
    def head_dim(self):
        return self.d_model // self.n_head

    def __post_init__(self):
        assert self.d_model % self.n_head == 0, "d_model must be divisible by n_head"
        assert self.n_head % self.n_kv_head == 0, "n_head must be a multiple of n_kv_head"
        assert self.head_dim % 2 == 0, "RoPE needs an even head dimension"


# The paper's sizes (its layers and widths; heads, FFN widths and the 3.4B shape are our choices) and small CPU sizes.
PRESETS = {
    "tiny": LlamaConfig(n_layer=8, n_head=4, n_kv_head=2, d_model=128, ffn_hidden=352, max_seq_len=256),
    "small": LlamaConfig(n_layer=8, n_head=4, n_kv_head=4, d_model=256, ffn_hidden=688, max_seq_len=512),
    "170m": LlamaConfig(n_layer=12, n_head=12, n_kv_head=12, d_model=768, ffn_hidden=2048),
    "1b": LlamaConfig(n_layer=16, n_head=16, n_kv_head=16, d_model=2048, ffn_hidden=5632),
    "3.4b": LlamaConfig(n_layer=28, n_head=24, n_kv_head=24, d_model=3072, ffn_hidden=8192),
}


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # normalise in fp32, as Hugging Face's LlamaRMSNorm does, then scale in the input dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_cache(cfg: LlamaConfig):
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim))
    freqs = torch.outer(torch.arange(cfg.max_seq_len, dtype=torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)                      # [T, head_dim], "rotate half" layout
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):
    # x: [B, H, T, hd]; cos/sin: [T, hd]
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


class KVCache:
    """Keys and values of every layer for batch × max_len slots, which slots hold real tokens (not left padding),
    and how many slots are filled (len); `mask` is the attention mask of the forward in progress."""

    def __init__(self, cfg: LlamaConfig, batch, max_len, device, dtype):
        shape = (cfg.n_layer, batch, cfg.n_kv_head, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.real = torch.zeros(batch, max_len, dtype=torch.bool, device=device)
        self.len, self.mask = 0, None

    def start(self, real):
        """Open slots len..len+T for the new tokens (real [B, T]); a query sees the real keys up to its own slot, and
        itself (so a padding query is never all-masked: no NaN)."""
        start, end = self.len, self.len + real.size(1)
        self.real[:, start:end] = real
        slot, query = torch.arange(end, device=real.device), torch.arange(start, end, device=real.device)[:, None]
        self.mask = ((self.real[:, None, :end] & (slot <= query)) | (slot == query)).unsqueeze(1)   # [B, 1, T, end]

    def update(self, layer, k, v):
        """Store this layer's new keys and values [B, kv_heads, T, hd]; return those of every slot so far."""
        end = self.len + k.size(2)
        self.k[layer, :, :, self.len:end], self.v[layer, :, :, self.len:end] = k, v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_head * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_head * cfg.head_dim, cfg.d_model, bias=False)

    def forward(self, x, cos, sin, cache=None, layer=0):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.update(layer, k, v)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None if cache is None else cache.mask,
                                           is_causal=cache is None, enable_gqa=self.n_kv_head != self.n_head)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_hidden, cfg.d_model, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, cache=None, layer=0):
        x = x + self.attn(self.attn_norm(x), cos, sin, cache, layer)
        return x + self.mlp(self.mlp_norm(x))


def cross_entropy_chunk(h, weight, t, dtype, grads):
    """One chunk of positions: the sum of its cross-entropy over targets != -1 and, with grads, its gradients for h
    and the weight (d(loss)/d(logits) = softmax - one-hot); its logits die here. dtype: the matmuls' gradient dtype."""
    logits, real, t = F.linear(h, weight).float(), (t != -1).float()[:, None], t.clamp(min=0)[:, None]
    lse = logits.logsumexp(-1, keepdim=True)
    loss = ((lse - logits.gather(1, t)) * real).sum()
    if not grads:
        return loss, None, None
    g = (logits.sub_(lse).exp_().scatter_add_(1, t, -real) * real).to(dtype)
    return loss, g @ weight, g.t() @ h


class ChunkedCrossEntropy(torch.autograd.Function):
    """Sum of the cross-entropy over targets != -1 of hidden @ weight.T ([N, d], [V, d], [N]), `rows` positions at a
    time through `step` (cross_entropy_chunk, or it compiled): each chunk's gradients are made in the forward pass and summed
    in place, so one chunk's logits exist at a time (the same three matmuls as an unchunked loss, no recomputation)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, rows, grads, step):
        device = hidden.device.type                      # the matmuls' dtype: autocast's, or the inputs'
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        total = 0.0
        if grads:
            grad_h, grad_w = torch.empty_like(hidden), torch.zeros_like(weight, dtype=torch.float32)
        for start in range(0, hidden.size(0), rows):
            loss, gh, gw = step(hidden[start:start + rows], weight, targets[start:start + rows], dtype, grads)
            total = total + loss
            if grads:
                grad_h[start:start + rows] = gh
                grad_w += gw
        ctx.save_for_backward(*((grad_h, grad_w.to(weight.dtype)) if grads else ()))
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_total, grad_w * grad_total, None, None, None, None


@torch.compiler.disable
def compiled_chunks(*args):
    """Inside torch.compile: the loop over chunks stays out of the graph (inductor would fuse the chunks' gradient
    sums into one kernel that needs every chunk's partial sums at once); each chunk runs compiled."""
    global compiled_chunk
    if compiled_chunk is None:
        compiled_chunk = torch.compile(cross_entropy_chunk)
    return ChunkedCrossEntropy.apply(*args, compiled_chunk)


compiled_chunk = None


def chunked_cross_entropy(hidden, weight, targets, rows, compiled=False):
    """Mean cross-entropy over targets != -1 of the logits hidden @ weight.T, without ever holding more than `rows`
    positions' logits: memory O(rows · vocab) instead of O(B · T · vocab), eager or compiled."""
    hidden, targets = hidden.flatten(0, 1), targets.reshape(-1)
    grads = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    args = (hidden, weight, targets, rows, grads)
    total = compiled_chunks(*args) if compiled or torch.compiler.is_compiling() else \
        ChunkedCrossEntropy.apply(*args, cross_entropy_chunk)
    return total / (targets != -1).sum()


class LlamaOutput(NamedTuple):
    logits: Optional[torch.Tensor]                 # None with return_logits=False
    loss: Optional[torch.Tensor]
    hidden_states: list
    final_hidden: torch.Tensor


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.config = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        cos, sin = rope_cache(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.checkpoint_blocks = False     # activation checkpointing per block (set by the trainer)
        self.loss_chunk = 1024             # positions per chunk of the return_logits=False loss
        self.compile_loss = False          # its chunks (head and cross-entropy) compiled, when the model is not
        self.reset_parameters()

    def reset_parameters(self):
        std = self.config.init_std
        for name, p in self.named_parameters():
            if name.endswith("bias"):                            # none in a Llama; an ablation's start at 0
                nn.init.zeros_(p)
            elif p.dim() == 1:                                   # RMSNorm gains (a LayerNorm's too)
                nn.init.ones_(p)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * self.config.n_layer))   # depth-scaled residual outputs
            else:
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets=None, cache=None, positions=None, real=None, logits_to_keep=0, return_logits=True):
        """See the module docstring; logits_to_keep > 0: logits of the last that many positions only (as in HF);
        return_logits=False: no logits (None), the loss chunked."""
        B, T = idx.shape
        if cache is None:
            assert positions is None and real is None, "positions and real go with a cache"
            assert T <= self.config.max_seq_len, f"sequence length {T} > max_seq_len {self.config.max_seq_len}"
            cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        else:
            if positions is None:
                positions = torch.arange(cache.len, cache.len + T, device=idx.device).expand(B, T)
            cos, sin = self.rope_cos[positions].unsqueeze(1), self.rope_sin[positions].unsqueeze(1)   # [B, 1, T, hd]
            cache.start(torch.ones_like(idx, dtype=torch.bool) if real is None else real)
        x = self.tok_emb(idx)
        hidden_states = [x]
        recompute = self.checkpoint_blocks and cache is None and torch.is_grad_enabled()
        for i, block in enumerate(self.layers):
            x = checkpoint(block, x, cos, sin, use_reentrant=False) if recompute else block(x, cos, sin, cache, i)
            hidden_states.append(x)
        if cache is not None:
            cache.len += T
        final_hidden = self.norm(x)
        logits = self.lm_head(final_hidden[:, -logits_to_keep:]) if return_logits else None
        loss = None
        if targets is not None and logits is not None:
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.reshape(-1), ignore_index=-1)
        elif targets is not None:       # training's loss applies the head itself: edit cross_entropy_chunk with lm_head
            loss = chunked_cross_entropy(final_hidden, self.lm_head.weight, targets, self.loss_chunk, self.compile_loss)
        return LlamaOutput(logits, loss, hidden_states, final_hidden)

    # ---- accounting -------------------------------------------------------------------------------------
    def num_params(self, non_embedding=False):
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and not self.config.tie_embeddings:
            n -= self.tok_emb.weight.numel()                     # a lookup, no FLOPs
        return n

    def flops_per_token(self, seq_len):
        """Training FLOPs per token: 6N for the matmuls of forward + backward, plus attention scores 6·L·d·T
        (causal: half of the 12·L·d·T of a full attention matrix)."""
        cfg = self.config
        return 6 * self.num_params(non_embedding=True) + 6 * cfg.n_layer * cfg.d_model * seq_len

    # ---- Hugging Face conversion ------------------------------------------------------------------------
    @staticmethod
    def _hf_names(n_layer):
        """Our parameter name -> Hugging Face LlamaForCausalLM parameter name."""
        names = {"tok_emb.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
                 "lm_head.weight": "lm_head.weight"}
        sub = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm",
               "attn.q_proj": "self_attn.q_proj", "attn.k_proj": "self_attn.k_proj",
               "attn.v_proj": "self_attn.v_proj", "attn.o_proj": "self_attn.o_proj",
               "mlp.gate_proj": "mlp.gate_proj", "mlp.up_proj": "mlp.up_proj", "mlp.down_proj": "mlp.down_proj"}
        for i in range(n_layer):
            for ours, theirs in sub.items():
                names[f"layers.{i}.{ours}.weight"] = f"model.layers.{i}.{theirs}.weight"
        return names

    @classmethod
    def from_hf(cls, hf_model):
        """Build a Llama from a transformers LlamaForCausalLM (weights copied, dtype kept)."""
        c = hf_model.config
        rope = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise NotImplementedError(f"rope_type {rope_type!r} is not supported (only plain RoPE)")
        if getattr(c, "attention_bias", False) or getattr(c, "mlp_bias", False):
            raise NotImplementedError("attention/MLP biases are not supported")
        if getattr(c, "hidden_act", "silu") != "silu":
            raise NotImplementedError(f"hidden_act {c.hidden_act!r} is not supported (only silu)")
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        if head_dim != c.hidden_size // c.num_attention_heads:
            raise NotImplementedError("head_dim != hidden_size / num_attention_heads is not supported")
        theta = rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))
        cfg = LlamaConfig(
            vocab_size=c.vocab_size, n_layer=c.num_hidden_layers, n_head=c.num_attention_heads,
            n_kv_head=c.num_key_value_heads or c.num_attention_heads, d_model=c.hidden_size,
            ffn_hidden=c.intermediate_size, max_seq_len=c.max_position_embeddings, rope_theta=float(theta),
            norm_eps=c.rms_norm_eps, tie_embeddings=bool(getattr(c, "tie_word_embeddings", False)),
            init_std=getattr(c, "initializer_range", 0.02))
        hf_sd = hf_model.state_dict()
        dtype = next(hf_model.parameters()).dtype
        with torch.device("meta"):
            model = cls(cfg)
        model = model.to_empty(device="cpu")
        model.rope_cos, model.rope_sin = rope_cache(cfg)
        sd = {ours: hf_sd[theirs] for ours, theirs in cls._hf_names(cfg.n_layer).items()
              if not (cfg.tie_embeddings and ours == "lm_head.weight")}
        model.load_state_dict(sd, strict=not cfg.tie_embeddings)
        if cfg.tie_embeddings:
            model.lm_head.weight = model.tok_emb.weight
        return model.to(dtype)

    def to_hf(self):
        """Return an equivalent transformers LlamaForCausalLM (fp32 unless this model is in another dtype)."""
        from transformers import LlamaConfig as HFConfig, LlamaForCausalLM
        cfg = self.config
        hf_cfg = HFConfig(
            vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.ffn_hidden,
            num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_kv_head,
            max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta,
            tie_word_embeddings=cfg.tie_embeddings, initializer_range=cfg.init_std,
            attention_bias=False, mlp_bias=False, hidden_act="silu")
        hf = LlamaForCausalLM(hf_cfg).to(next(self.parameters()).dtype)
        sd = self.state_dict()
        hf_sd = {theirs: sd[ours] for ours, theirs in self._hf_names(cfg.n_layer).items()}
        missing, unexpected = hf.load_state_dict(hf_sd, strict=False)
        assert not unexpected and all("rotary" in k or "inv_freq" in k for k in missing), (missing, unexpected)
        return hf
