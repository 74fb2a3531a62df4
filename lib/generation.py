"""
Generation through the model's own forward with its key/value cache (model.KVCache): one attention path for
training and generation.

    generate(model, prompts, max_new_tokens=256, temperature=0.0, top_p=1.0, stop_ids=None,
             stop_texts=("<|user|>",), enc=None, seed=None, *, top_k=50, vocab_limit=None, on_token=None)
             -> [[new token ids] per prompt]

Prompts of different lengths run as one left-padded batch; an attention mask hides the padding and the position ids
start at 0 in every row, so a row's tokens do not depend on its batch. Only ids the tokenizer can decode are
generated: the head's padded rows (320 for 257 byte tokens, 50,304 for GPT-2's 50,257) are masked before greedy
choice and sampling, up to vocab_limit (default: enc.n_vocab, len() of a Hugging Face tokenizer; without enc, the
whole head). Sampling: temperature, then the top_k most likely tokens (default 50, Hugging Face generate's default,
so answers are sampled as FastChat's gen_model_answer samples them; 0 = off), then the top_p nucleus. A row stops at
a token of stop_ids (default: enc.stop_ids if it has them, else its end-of-text), when its decoded text contains one
of stop_texts past its first character (as FastChat, `text.find(stop) > 0`), after max_new_tokens, or when the
context (max_seq_len) is full; the stop token or text is not returned. on_token(row, token) is called for each token
as it is kept (a stop text's first tokens are taken back when it completes).
"""
import math

import torch
import torch.nn.functional as F

from model import KVCache


def sample(logits, temperature, top_p, generator, top_k=0):
    """Greedy (temperature 0) or a sample from softmax(logits / temperature) restricted to the top_k most likely
    tokens (0: all), then to the smallest set of those whose mass reaches top_p (the most likely is always kept)."""
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if 0 < top_k < logits.size(-1):
        logits = logits.masked_fill(logits < logits.topk(top_k).values[:, -1:], float("-inf"))
    probs = F.softmax(logits, dim=-1)
    if top_p < 1:
        p, order = probs.sort(-1, descending=True)
        p[(p.cumsum(-1) - p) >= top_p] = 0                   # mass before the token already reaches top_p
        probs = torch.zeros_like(probs).scatter_(-1, order, p)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def eot_of(enc):
    """The end-of-text id of a tiktoken Encoding or a Hugging Face tokenizer."""
    return enc.eot_token if hasattr(enc, "eot_token") else enc.eos_token_id


def vocab_of(enc):
    """How many ids a tokenizer decodes: a tiktoken Encoding's n_vocab, len() of a Hugging Face tokenizer."""
    return enc.n_vocab if hasattr(enc, "n_vocab") else len(enc)


def cut_at_stop_text(tokens, enc, stop_texts):
    """tokens whose text is the text before the first stop text that starts past the first character (FastChat's
    `output[:output.find(stop)]` where that is > 0): those before the token the stop text starts in, then the text of
    that token before it, encoded anew; None when the decoded text holds no such stop text."""
    text = enc.decode(tokens)
    starts = [i for s in stop_texts if (i := text.find(s)) > 0]
    if not starts:
        return None
    k = len(tokens)
    while k and len(enc.decode(tokens[:k])) > min(starts):
        k -= 1
    return tokens[:k] + enc.encode_ordinary(text[len(enc.decode(tokens[:k])):min(starts)])


@torch.inference_mode()
def generate(model, prompts, max_new_tokens=256, temperature=0.0, top_p=1.0, stop_ids=None,
             stop_texts=("<|user|>",), enc=None, seed=None, *, top_k=50, vocab_limit=None, on_token=None):
    """New tokens for each prompt (lists of ids), as one left-padded batch. See the module docstring."""
    cfg = model.config
    if not prompts or min(map(len, prompts)) < 1:
        raise ValueError("generate needs at least one prompt, each of at least one token")
    if max(map(len, prompts)) >= cfg.max_seq_len:
        raise ValueError(f"a prompt of {max(map(len, prompts))} tokens leaves no room in max_seq_len {cfg.max_seq_len}")
    if not (max_new_tokens >= 0 and math.isfinite(temperature) and temperature >= 0 and 0 < top_p <= 1
            and top_k >= 0 and (vocab_limit is None or vocab_limit >= 1)):
        raise ValueError(f"bad settings: max_new_tokens={max_new_tokens}, temperature={temperature}, top_p={top_p}, "
                         f"top_k={top_k}, vocab_limit={vocab_limit}")
    stop_texts = tuple(stop_texts or ())
    if stop_texts and enc is None:
        raise ValueError("stop_texts need enc (a tokenizer) to decode the generated tokens")
    stop_ids = set(getattr(enc, "stop_ids", (eot_of(enc),)) if stop_ids is None and enc is not None else stop_ids or ())
    vocab = min(vocab_limit or (vocab_of(enc) if enc is not None else cfg.vocab_size), cfg.vocab_size)
    device, dtype = model.tok_emb.weight.device, model.tok_emb.weight.dtype
    B, P = len(prompts), max(map(len, prompts))
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    limits = [min(max_new_tokens, cfg.max_seq_len - len(p)) for p in prompts]   # total length <= max_seq_len
    out, done = [[] for _ in prompts], [n == 0 for n in limits]
    if all(done):
        return out
    generator = torch.Generator(device).manual_seed(seed) if seed is not None else None
    idx = torch.tensor([[0] * (P - len(p)) + list(p) for p in prompts], device=device)
    cache = KVCache(cfg, B, P + max(limits), device, dtype, pad=P - lengths)      # prompts left-padded to P
    logits = model(idx, cache=cache).logits[:, -1]
    for step in range(max(limits)):
        logits[:, vocab:] = float("-inf")                   # the head's padded rows: ids the tokenizer cannot decode
        next_ids = sample(logits, temperature, top_p, generator, top_k)
        for b, token in enumerate(next_ids.tolist()):
            if done[b]:
                continue
            if token in stop_ids:
                done[b] = True
                continue
            out[b].append(token)
            cut = cut_at_stop_text(out[b], enc, stop_texts) if stop_texts else None
            if cut is not None:
                out[b], done[b] = cut, True
            elif on_token is not None:
                on_token(b, token)
            done[b] = done[b] or len(out[b]) >= limits[b]
        if all(done):
            break
        logits = model(next_ids[:, None], cache=cache).logits[:, -1]
    return out


@torch.inference_mode()
def generate_uncached(model, prompts, max_new_tokens):
    """Greedy decoding of prompts of one length by Llama.forward over the whole growing sequence (the reference)."""
    idx = torch.tensor(prompts, device=model.tok_emb.weight.device)
    for _ in range(max_new_tokens):
        next_ids = model(idx).logits[:, -1].argmax(-1, keepdim=True)
        idx = torch.cat([idx, next_ids], dim=1)
    return idx[:, len(prompts[0]):].tolist()
