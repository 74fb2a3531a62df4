"""
A compact Llama that returns every residual stream.

Pre-norm RMSNorm, rotary position embeddings (precomputed buffer), grouped-query attention through
F.scaled_dot_product_attention, SwiGLU MLP, no biases, final RMSNorm, LM head. Nothing distributed.

    model = Llama(cfg)                       # Llama(cfg, activation_checkpointing=True, loss_chunk=1024): training's
    out = model(idx)                         # out.logits [B, T, vocab]
    out = model(idx, targets)                # out.loss: mean cross-entropy over targets != -1, logits None (training
                                             # and evaluation: loss.cross_entropy, loss_chunk positions at a time
                                             # through lm_head, so full logits never exist); out.loss_terms its terms
    out.hidden_states   [h_0, h_1, ..., h_L]: h_0 the embedding output (normed with embedding_norm), h_l the raw
                        residual stream after block l
    out.final_hidden    head_input(h_L) = norm(h_L), the vector the LM head reads (what Hugging Face reports as its
                        last hidden state); model.lm_head(model.head_input(h_l, out.hidden_states)): layer l's logits

    cache = KVCache(cfg, B, max_len, device, dtype, pad=pad)   # generation: pad[b] left-padding slots of row b
    out = model(idx, cache=cache)            # appends idx after the positions already cached; out.logits [B, 1, vocab]
                                             # of the last position. The same modules and attention as training.

The streams are the tensors autograd keeps for the backward pass anyway, so returning them is free. An edit to any
module (attention, the head: a bias, a soft-cap) reaches training, evaluation and generation alike.
Conversion to and from Hugging Face's LlamaForCausalLM: lib/hf.py.
"""
import math
import re
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from loss import cross_entropy


@dataclass
class LlamaConfig:
    vocab_size: int = 50304        # rows of the embedding and the head (GPT-2's 50257 padded to a multiple of 64)
    n_layer: int = 12              # blocks L
    n_head: int = 12               # query heads
    n_kv_head: int = 12            # key/value heads (< n_head: grouped-query attention)
    d_model: int = 768             # width of the residual stream
    ffn_hidden: int = 2048         # SwiGLU hidden size
    max_seq_len: int = 2048        # RoPE table length (train.py: at least seq_len)
    rope_theta: float = 10000.0    # RoPE base
    norm_eps: float = 1e-5         # RMSNorm epsilon
    tie_embeddings: bool = False   # share the embedding and the head
    init_std: float = 0.02         # std of the initial weights
    depth_scaled_init: bool = True  # o_proj/down_proj from init_std/√(2L) (GPT-2's); False: init_std for every matrix
    # other fixes for the last layers (docs/methods.md), each off by default: off is today's model to the last bit
    layernorm_scaling: bool = False  # LayerNorm Scaling: block ℓ's pre-norm outputs × 1/√ℓ (arXiv 2502.05795)
    mix_ln: float = 0.0            # Mix-LN: the first ⌊mix_ln · L⌋ blocks Post-LN (arXiv 2412.13795 uses 0.25)
    peri_ln: bool = False          # Peri-LN: a norm on each sublayer's output too, y = x + N(F(N(x))) (2502.02732)
    backout_layer: int = 0         # Backout: the head reads N(h_L − λ·h_k), k this layer, λ learned from 0.5 (0: off)
    embedding_norm: bool = False   # a norm on the embedding's output, h_0 = N(E[x]) (Peri-LN's, in OLMo-core)

    @property
    def head_dim(self):
        return self.d_model // self.n_head

    def __post_init__(self):
        """Each field in range, as one ValueError line (not an assert: python -O would drop it)."""
        heads = f"(n_head, n_kv_head, d_model = {self.n_head}, {self.n_kv_head}, {self.d_model})"
        for ok, what in (
                (self.d_model % self.n_head == 0, f"d_model must be divisible by n_head {heads}"),
                (self.n_head % self.n_kv_head == 0, f"n_head must be a multiple of n_kv_head {heads}"),
                (self.head_dim % 2 == 0, f"RoPE needs an even head dimension {heads}"),
                (0 <= self.mix_ln <= 1, f"mix_ln = {self.mix_ln} is a fraction of the layers, 0 to 1"),
                (not self.mix_ln or int(self.mix_ln * self.n_layer) > 0, f"mix_ln = {self.mix_ln} of {self.n_layer} "
                 f"layers turns no block Post-LN (⌊{self.mix_ln * self.n_layer:g}⌋ = 0): use at least "
                 f"{1 / self.n_layer:.3g}, or 0 for off"),
                (0 <= self.backout_layer < self.n_layer, f"backout_layer = {self.backout_layer} is a block 1..L-1 "
                 f"(L = n_layer = {self.n_layer}; 0: off)")):
            if not ok:
                raise ValueError(what)


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
    """Keys and values of every layer for batch × max_len slots, and how many slots are filled (len). Row b starts
    with pad[b] slots of left padding (default none): no query attends to them, and the RoPE position of slot j is
    j − pad[b], so a left-padded row is computed as if it started at its first real token. `mask` is the attention
    mask of the forward in progress."""

    def __init__(self, cfg: LlamaConfig, batch, max_len, device, dtype, pad=None):
        shape = (cfg.n_layer, batch, cfg.n_kv_head, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.pad = (torch.zeros(batch, dtype=torch.long) if pad is None else pad).to(device).view(batch, 1)
        self.max_pos, self.len, self.mask = cfg.max_seq_len - 1, 0, None

    def start(self, T):
        """Open slots len..len+T for T new tokens: their RoPE positions [B, T], and the mask by which a query sees the
        real keys up to its own slot, and itself (so a padding query is never all-masked: no NaN)."""
        slot = torch.arange(self.len + T, device=self.pad.device)
        query = slot[self.len:, None]
        real = slot >= self.pad                                                     # [B, len + T]
        self.mask = ((real[:, None, :] & (slot <= query)) | (slot == query)).unsqueeze(1)   # [B, 1, T, len + T]
        return (slot[self.len:] - self.pad).clamp(0, self.max_pos)                  # finished rows: any position

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
    def __init__(self, cfg: LlamaConfig, layer=0):
        """layer: this block's index, 0-based (ℓ = layer + 1)."""
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)
        self.scale = 1 / math.sqrt(layer + 1) if cfg.layernorm_scaling else 1.0   # a float: meta init cannot wipe it
        self.post_ln = layer < int(cfg.mix_ln * cfg.n_layer)                       # Mix-LN's first blocks
        peri = cfg.peri_ln and not self.post_ln                                    # Peri-LN's output norms
        self.attn_out_norm = RMSNorm(cfg.d_model, cfg.norm_eps) if peri else None
        self.mlp_out_norm = RMSNorm(cfg.d_model, cfg.norm_eps) if peri else None

    def forward(self, x, cos, sin, cache=None, layer=0):
        if self.post_ln:                                        # h = N(x + Attn(x)), y = N(h + MLP(h))
            x = self.attn_norm(x + self.attn(x, cos, sin, cache, layer))
            return self.mlp_norm(x + self.mlp(x))
        x = x + self.out(self.attn_out_norm, self.attn(self.pre(self.attn_norm, x), cos, sin, cache, layer))
        return x + self.out(self.mlp_out_norm, self.mlp(self.pre(self.mlp_norm, x)))

    def pre(self, norm, x):                                     # the sublayer's input: N(x), × 1/√ℓ with LNS
        return norm(x) if self.scale == 1.0 else norm(x) * self.scale

    def out(self, norm, y):                                     # the sublayer's output: N(y) with Peri-LN
        return y if norm is None else norm(y)


class LlamaOutput(NamedTuple):
    logits: Optional[torch.Tensor]                 # None when targets are given (the loss is chunked)
    loss: Optional[torch.Tensor]                   # the mean loss over targets != -1 (loss.cross_entropy)
    hidden_states: list
    final_hidden: torch.Tensor
    loss_terms: Optional[dict] = None              # each named term of the loss, its mean (detached): {"ce": ...}


# Each parameter's start, by its name (re.fullmatch, the first rule that matches): one place per parameter. A new
# parameter needs its rule here; one that no rule names is refused when the model is built, never guessed.
# ("normal", s): N(0, s · init_std); ("normal_depth", s): N(0, s · init_std / √(2L)), the residual outputs (init_std
# alone with depth_scaled_init off); a number: that constant. Only the normal rules draw from the generator: the order
# of the parameters fixes the numbers.
INIT = {
    r"tok_emb\.weight|lm_head\.weight": ("normal", 1.0),
    r"layers\.\d+\.attn\.[qkv]_proj\.weight|layers\.\d+\.mlp\.(gate|up)_proj\.weight": ("normal", 1.0),
    r"layers\.\d+\.attn\.o_proj\.weight|layers\.\d+\.mlp\.down_proj\.weight": ("normal_depth", 1.0),
    r"(layers\.\d+\.(attn|mlp|attn_out|mlp_out)_|embedding_)?norm\.weight": 1.0,   # RMSNorm gains
    r"backout_lambda": 0.5,                                                # Backout's λ
    r".*\.bias": 0.0,                                                     # none in a Llama; an ablation's start
}


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig, activation_checkpointing=False, loss_chunk=1024):
        """The model of cfg, its weights drawn by INIT. activation_checkpointing: in training, each block keeps only
        its input stream and recomputes the rest in the backward pass (the same numbers, a fraction of the memory,
        about one more forward's compute). loss_chunk: positions per chunk of the loss (loss.cross_entropy)."""
        super().__init__()
        self.config, self.activation_checkpointing = cfg, activation_checkpointing
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.embedding_norm = RMSNorm(cfg.d_model, cfg.norm_eps) if cfg.embedding_norm else None
        self.layers = nn.ModuleList([Block(cfg, i) for i in range(cfg.n_layer)])
        if cfg.backout_layer:
            self.backout_lambda = nn.Parameter(torch.empty(1))            # 1-D: FSDP shards no scalar
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.loss, self.loss_chunk = cross_entropy, loss_chunk        # loss.py (under FSDP parallel.py compiles it)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        cos, sin = rope_cache(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self):
        """Every parameter from its INIT rule, in the order of named_parameters."""
        for name, p in self.named_parameters():
            rule = next((rule for pattern, rule in INIT.items() if re.fullmatch(pattern, name)), None)
            if rule is None:
                raise ValueError(f"parameter {name} {tuple(p.shape)} has no initialisation rule: add its pattern to "
                                 "model.INIT")
            if isinstance(rule, tuple):
                kind, scale = rule
                scaled = kind == "normal_depth" and self.config.depth_scaled_init
                depth = math.sqrt(2 * self.config.n_layer) if scaled else 1.0
                nn.init.normal_(p, 0.0, scale * self.config.init_std / depth)
            else:
                nn.init.constant_(p, rule)

    def head_input(self, h, hidden_states):
        """The vector the LM head reads from the stream h (any layer's: the logit lens; h_L: the model's own output):
        N(h), or with Backout N(h − λ·h_k). The loss, the lenses, generation and export all read through here."""
        if self.config.backout_layer:
            h = h - self.backout_lambda * hidden_states[self.config.backout_layer]
        return self.norm(h)

    def forward(self, idx, targets=None, cache=None):
        """See the module docstring."""
        B, T = idx.shape
        if cache is None:
            assert T <= self.config.max_seq_len, f"sequence length {T} > max_seq_len {self.config.max_seq_len}"
            cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        else:
            positions = cache.start(T)
            cos, sin = self.rope_cos[positions].unsqueeze(1), self.rope_sin[positions].unsqueeze(1)   # [B, 1, T, hd]
        x = self.tok_emb(idx)
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        hidden_states = [x]
        recompute = self.activation_checkpointing and cache is None and torch.is_grad_enabled()
        for i, block in enumerate(self.layers):
            x = checkpoint(block, x, cos, sin, use_reentrant=False) if recompute else block(x, cos, sin, cache, i)
            hidden_states.append(x)
        final_hidden = self.head_input(x, hidden_states)
        if cache is not None:
            cache.len += T
            return LlamaOutput(self.lm_head(final_hidden[:, -1:]), None, hidden_states, final_hidden)
        if targets is None:
            return LlamaOutput(self.lm_head(final_hidden), None, hidden_states, final_hidden)
        loss, terms = self.loss(self.lm_head, final_hidden, targets, self.loss_chunk)
        return LlamaOutput(None, loss, hidden_states, final_hidden, terms)

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
