"""
Hugging Face input and output: our Llama to and from transformers' LlamaForCausalLM (the same weights under other
names), and loading a transformers model and its tokenizer (a hub name, a folder or a GGUF file) with one error line
for each way it fails. Training starts from a Hugging Face Llama converted once to a run folder: scripts/convert_hf.py.

    model = llama_from_hf(hf_model)        # NotImplementedError for what our Llama does not compute
    hf_model = llama_to_hf(model)          # every weight mapped, or one error line naming those that are not
    check_vocabulary(model.config.vocab_size, enc)   # the model must have a row for every token of its tokenizer
    hf_model, hf_tokenizer = load_hf("HuggingFaceTB/SmolLM2-135M-Instruct")
"""
import glob
import os
import shutil

import torch

from files import one_line
from lib.progress import timed
from model import Llama, LlamaConfig, rope_cache
from tokenizer import HFTokenizer, get_tokenizer, tokenizer_fingerprint


def hf_names(n_layer):
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

def llama_from_hf(hf_model):
    """Our Llama from a transformers LlamaForCausalLM (weights copied, dtype kept); NotImplementedError for what our
    model does not compute (another RoPE, biases, another activation, a head_dim of its own)."""
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
        model = Llama(cfg)
    model = model.to_empty(device="cpu")
    model.rope_cos, model.rope_sin = rope_cache(cfg)
    sd = {ours: hf_sd[theirs] for ours, theirs in hf_names(cfg.n_layer).items()
          if not (cfg.tie_embeddings and ours == "lm_head.weight")}
    model.load_state_dict(sd, strict=not cfg.tie_embeddings)
    if cfg.tie_embeddings:
        model.lm_head.weight = model.tok_emb.weight
    return model.to(dtype)


# the methods of model.LlamaConfig that a Llama cannot compute (LayerNorm Scaling folds into the norm gains)
NOT_A_LLAMA = {"mix_ln": "Post-LN blocks", "peri_ln": "norms on the sublayers' outputs",
               "backout_layer": "the head reading h_L − λ·h_k", "embedding_norm": "a norm on the embedding's output"}


def llama_to_hf(model):
    """An equivalent transformers LlamaForCausalLM (fp32 unless our model is in another dtype). LayerNorm Scaling is a
    reparametrisation (N(x)·w/√ℓ = N(x)·(w/√ℓ)): folded into the norm gains; a method no Llama computes is one line,
    and so is any entry of the state dict that hf_names does not map (an ablation's new weight or scalar, which the
    logit check alone would pass while it is near its start): the export carries every weight or refuses."""
    from transformers import LlamaConfig as HFConfig, LlamaForCausalLM
    cfg = model.config
    if on := [f"{key} = {getattr(cfg, key)!r} ({what})" for key, what in NOT_A_LLAMA.items() if getattr(cfg, key)]:
        raise SystemExit(f"error: the model has {', '.join(on)}: a Hugging Face Llama cannot compute it; nothing "
                         "written (evaluate.py, chat.py and survey.py read the run folder itself)")
    names = hf_names(cfg.n_layer)
    if unmapped := [key for key in model.state_dict() if key not in names]:
        raise SystemExit(f"error: the model has {', '.join(unmapped)}, which a Hugging Face Llama has no weight for "
                         "(model.py is no standard Llama); nothing written (evaluate.py, chat.py and survey.py read "
                         "the run folder itself)")
    hf_cfg = HFConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.ffn_hidden,
        num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_kv_head,
        max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta,
        tie_word_embeddings=cfg.tie_embeddings, initializer_range=cfg.init_std,
        attention_bias=False, mlp_bias=False, hidden_act="silu")
    hf = LlamaForCausalLM(hf_cfg).to(next(model.parameters()).dtype)
    sd = dict(model.state_dict())
    for i, block in enumerate(model.layers):                    # LayerNorm Scaling's 1/√ℓ (1 without it)
        for norm in ("attn_norm", "mlp_norm"):
            sd[f"layers.{i}.{norm}.weight"] = sd[f"layers.{i}.{norm}.weight"] * block.scale
    hf_sd = {theirs: sd[ours] for ours, theirs in names.items()}
    missing, unexpected = hf.load_state_dict(hf_sd, strict=False)
    assert not unexpected and all("rotary" in k or "inv_freq" in k for k in missing), (missing, unexpected)
    return hf


def check_vocabulary(vocab_size, enc, where=""):
    """The model's vocabulary (its embedding rows) must hold every id of its tokenizer `enc`, or generation indexes past
    it: one error line (`where`: what the message names first)."""
    if vocab_size < enc.n_vocab:
        raise SystemExit(f"error: {where}the model's vocabulary ({vocab_size}) is smaller than that of tokenizer "
                         f"{enc.name!r} ({enc.n_vocab})")


def cannot_write(out, e):
    """A folder that could not be written (a full disk, say) as one error line with the free space where it goes."""
    place = os.path.dirname(os.path.abspath(out))
    free = shutil.disk_usage(place).free / 2**30
    raise SystemExit(f"error: cannot write {out}: {one_line(e)}. {free:.1f} GiB free in {place}; nothing written")


def _hf_kwargs(gguf_file=None, revision=None):
    return {k: v for k, v in (("gguf_file", gguf_file), ("revision", revision)) if v}


def hf_name(name_or_path, gguf_file=None, revision=None):
    """How messages name a Hugging Face model: the folder or hub name, its GGUF file, @revision."""
    return (os.path.join(name_or_path, gguf_file) if gguf_file else name_or_path) + (f"@{revision}" if revision else "")


def check_hf_source(path, gguf_file=None, revision=None, local=False):
    """A local model (a path, or `local`) must exist and be a Hugging Face folder or a GGUF file there, and takes no
    revision (from_pretrained ignores it for a folder); a hub name is checked when it is loaded."""
    if not (local or os.path.isabs(path) or path.startswith(".") or os.path.exists(path)):
        return
    where = hf_name(path, gguf_file)
    if revision:
        raise SystemExit(f"error: {where}@{revision}: a revision is a hub branch, tag or commit, but {where} is local "
                         "(give the folder of that checkpoint instead)")
    if gguf_file and not os.path.isfile(where):
        raise SystemExit(f"error: GGUF file {where} does not exist")
    if not os.path.isdir(path):
        raise SystemExit(f"error: Hugging Face model folder {path} does not exist")
    if not gguf_file and not os.path.isfile(os.path.join(path, "config.json")):
        run = " (a run folder of train.py: give it without --hf)" if glob.glob(os.path.join(path, "ckpt_*")) else ""
        raise SystemExit(f"error: {path} is not a Hugging Face model folder: it has no config.json{run}")


def load_hf(name_or_path, gguf_file=None, device="cpu", dtype=torch.float32, revision=None):
    """A transformers causal LM and its tokenizer; gguf_file and revision (a hub branch, tag or commit, e.g. Pythia's
    "step1000") are passed to both from_pretrained calls. A failure (missing, offline, not a causal LM, broken files,
    out of memory) is one error line naming the model and the part that failed."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    kwargs, part = _hf_kwargs(gguf_file, revision), "tokenizer"
    try:                                  # a GGUF file is dequantised here: SmolLM2-135M's took 27 s on 2 CPU cores
        with timed(f"loading Hugging Face model {hf_name(name_or_path, gguf_file, revision)}"
                   + (" (GGUF: dequantising)" if gguf_file else "")):
            tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
            part = "weights"
            model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, **kwargs).to(device).eval()
    except Exception as e:
        raise SystemExit(f"error: could not load the {part} of Hugging Face model "
                         f"{hf_name(name_or_path, gguf_file, revision)}: {one_line(e)}") from e
    return model, tokenizer


def hf_max_length(config, tokenizer=None, default=2048):
    """As the harness: n_positions, max_position_embeddings, n_ctx (text_config first), model_max_length, 2048."""
    cfg = getattr(config, "text_config", None) or config
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        if getattr(cfg, attr, None) is not None:
            return int(getattr(cfg, attr))
    mml = getattr(tokenizer, "model_max_length", None)
    return int(mml) if mml is not None and mml != 1000000000000000019884624838656 else default
