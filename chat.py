"""
Talk to a model: batched generation with a key/value cache, and an interactive chat in the terminal.

    python chat.py out/sft                                    # a run folder's latest checkpoint
    python chat.py out/sft --step 2000 --temperature 0 --system "You are a concise assistant."
    python chat.py --hf HuggingFaceTB/SmolLM2-135M-Instruct   # any Hugging Face Llama (converted to our Llama)
    python chat.py --hf DIR --gguf model.gguf
    python chat.py --bench --preset small                     # generation speed, cached vs uncached

In the chat, each line you type is a user turn and the reply streams as it is generated. The conversation keeps its
whole history while its prompt fits the model's context (max_seq_len); the reply is then capped at the tokens left
(said on stderr when the cap bites), and only when the prompt alone no longer fits are the oldest turns dropped (said
on stderr). `/clear` starts over; Ctrl-C during a reply stops it there and the part shown stays in the conversation
as the reply (a reply stopped before any text is dropped with its question); Ctrl-C at the prompt gives a fresh
prompt; Ctrl-D (end of input) quits. Prompts use the chat template of sft.py (plain-text role headers,
`<|endoftext|>` closing each assistant turn); a --hf model whose tokenizer has its own chat template uses that one.

    generate(model, prompts, max_new_tokens=256, temperature=0.0, top_p=1.0, stop_ids=None,
             stop_texts=("<|user|>",), enc=None, seed=None, *, top_k=50, vocab_limit=None, on_token=None)
             -> [[new token ids] per prompt]

Prompts of different lengths run as one left-padded batch; an attention mask hides the padding and the position
ids start at 0 in every row, so a row's tokens do not depend on its batch. The model's own forward does the work
(Llama.forward with model.KVCache: the attention of training, reading earlier keys from the cache).
Only ids the tokenizer can decode are generated: the head's padded rows (320 for 257 byte tokens, 50,304 for GPT-2's
50,257) are masked before greedy choice and sampling, up to vocab_limit (default: enc.n_vocab of a tiktoken
Encoding, len() of a Hugging Face tokenizer; without enc, the whole head). Sampling: temperature, then the top_k
most likely tokens (default 50, Hugging Face generate's default, so answers are sampled as FastChat's
gen_model_answer samples them; 0 = off), then the top_p nucleus. A row stops at a token of stop_ids (default: enc's
end-of-text), when its decoded text contains one of stop_texts past its first character (needs enc; as FastChat,
`text.find(stop) > 0`: a stop text at the very start of the reply neither ends nor cuts it), after max_new_tokens,
or when the context (max_seq_len) is full; the stop token or text is not returned. on_token(row, token) is called
for each token as it is kept (a stop text's first tokens are taken back when it completes: chat.py's stream holds
back any text that could begin one).
"""
import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

from model import PRESETS, KVCache, Llama


# ----------------------------------------------------------------------------------------------------------
# Generation through the model's forward with a key/value cache

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
    """tokens up to the one where a stop text starts past the first character (FastChat's `find(stop) > 0`), or None
    when the decoded text holds no such stop text."""
    text = enc.decode(tokens)
    starts = [i for s in stop_texts if (i := text.find(s)) > 0]
    if not starts:
        return None
    k = len(tokens)
    while k and len(enc.decode(tokens[:k])) > min(starts):
        k -= 1
    return tokens[:k]


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
    stop_ids = set((eot_of(enc),) if stop_ids is None and enc is not None else stop_ids or ())
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
    real = torch.arange(P, device=device) >= (P - lengths)[:, None]
    positions = (torch.arange(P, device=device) - (P - lengths)[:, None]).clamp(min=0)
    cache = KVCache(cfg, B, P + max(limits), device, dtype)
    logits = model(idx, cache=cache, positions=positions, real=real, logits_to_keep=1).logits[:, -1]
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
        positions = (lengths + step).clamp(max=cfg.max_seq_len - 1)[:, None]     # finished rows: any position
        logits = model(next_ids[:, None], cache=cache, positions=positions).logits[:, -1]
    return out


@torch.inference_mode()
def generate_uncached(model, prompts, max_new_tokens):
    """Greedy decoding of prompts of one length by Llama.forward over the whole growing sequence (the reference)."""
    idx = torch.tensor(prompts, device=model.tok_emb.weight.device)
    for _ in range(max_new_tokens):
        next_ids = model(idx).logits[:, -1].argmax(-1, keepdim=True)
        idx = torch.cat([idx, next_ids], dim=1)
    return idx[:, len(prompts[0]):].tolist()


# ----------------------------------------------------------------------------------------------------------
# Loading a model and its tokenizer; the prompt of a conversation

class HFTokenizer:
    """The face of a tiktoken Encoding (encode_ordinary, decode, eot_token) on a Hugging Face tokenizer."""

    def __init__(self, hf):
        self.hf, self.eot_token, self.n_vocab = hf, hf.eos_token_id, len(hf)

    def encode_ordinary(self, text):
        return self.hf.encode(text, add_special_tokens=False)

    def decode(self, ids):
        return self.hf.decode(ids)


def load_model(args):
    """(our Llama, tokenizer, name) from a run folder or a Hugging Face model (converted to our Llama)."""
    if args.hf:
        from evaluate import load_hf
        hf_model, hf_tok = load_hf(args.hf, args.gguf, args.device)
        if hf_model.config.model_type != "llama":
            raise SystemExit(f"error: {args.hf} is a {hf_model.config.model_type!r} model; chat.py runs Llama models")
        return Llama.from_hf(hf_model).to(args.device).eval(), HFTokenizer(hf_tok), args.hf
    from evaluate import load_run
    if not os.path.isdir(args.run_dir):
        raise SystemExit(f"error: run folder {args.run_dir} does not exist")
    model, enc, meta = load_run(args.run_dir, args.step, args.device)
    return model, enc, f"{args.run_dir} (step {meta['step']})"


def chat_prompt(messages, enc):
    """sft.py's chat template; a Hugging Face tokenizer's own chat template where it has one."""
    hf = getattr(enc, "hf", None)
    if hf is not None and getattr(hf, "chat_template", None):
        return list(hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))
    from sft import prompt_ids
    return prompt_ids(messages, enc)


def fit_context(messages, enc, max_seq_len, room):
    """Drop the oldest turns (a system message stays) until the prompt leaves `room` tokens of the context (the chat:
    room 1, all the history that fits); (messages, prompt ids), or (messages without the last one, None) when that
    last message alone is too long."""
    first = 1 if messages[0]["role"] == "system" else 0
    while True:
        ids = chat_prompt(messages, enc)
        if len(ids) + room <= max_seq_len or len(messages) == first + 1:
            break
        drop = first + 1 + (messages[first + 1]["role"] == "assistant")     # the oldest user turn and its reply
        messages = messages[:first] + messages[drop:]
    return (messages, ids) if len(ids) < max_seq_len else (messages[:-1], None)


# ----------------------------------------------------------------------------------------------------------
# Entry points: the terminal chat and the speed measurement

def shown_part(text, stop_texts):
    """What a partial reply can show already: not its incomplete last character (U+FFFD while a multi-byte
    character is still arriving), trailing white space, or an end that could begin a stop text."""
    text = text.rstrip().rstrip("\ufffd").rstrip()
    for s in stop_texts:
        k = next((k for k in range(min(len(s) - 1, len(text)), 0, -1) if text.endswith(s[:k])), 0)
        text = text[:len(text) - k].rstrip()
    return text


def reply(model, enc, ids, args, stop_texts=("<|user|>",)):
    """Generate the reply to prompt ids, printed as it comes; (its text, True when Ctrl-C stopped it)."""
    tokens, shown = [], ""

    def on_token(row, token):
        nonlocal shown
        tokens.append(token)
        now = shown_part(enc.decode(tokens).lstrip(), stop_texts)
        if now.startswith(shown):
            print(now[len(shown):], end="", flush=True)
            shown = now
    print("assistant> ", end="", flush=True)
    try:
        new = generate(model, [ids], args.max_new_tokens, args.temperature, args.top_p, stop_texts=stop_texts,
                       enc=enc, seed=args.seed, top_k=args.top_k, on_token=on_token)[0]
    except KeyboardInterrupt:
        print(flush=True)
        return shown, True
    text = enc.decode(new).strip()
    print(text[len(shown):] if text.startswith(shown) else "\n" + text, flush=True)
    room = model.config.max_seq_len - len(ids)
    if room < args.max_new_tokens and len(new) == room:
        print(f"(reply cut at {room} tokens: the context of {model.config.max_seq_len} is full)", file=sys.stderr)
    return text, False


def chat(model, enc, name, args):
    interactive, ctx = sys.stdin.isatty(), model.config.max_seq_len
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(system)
    print(f"chatting with {name}: {model.num_params() / 1e6:.1f}M parameters, temperature {args.temperature}, "
          f"top_k {args.top_k}, top_p {args.top_p}; /clear starts over, Ctrl-C stops a reply, Ctrl-D quits",
          file=sys.stderr)
    while True:
        try:
            line = input("user> " if interactive else "").strip()
        except EOFError:
            break
        except KeyboardInterrupt:                            # a fresh prompt
            print(file=sys.stderr)
            continue
        if line in ("/quit", "/exit"):
            break
        if line == "/clear":
            messages = list(system)
            continue
        if not line:
            continue
        kept, ids = fit_context(messages + [{"role": "user", "content": line}], enc, ctx, 1)
        if ids is None:
            print(f"(message too long for the model's context of {ctx} tokens)", file=sys.stderr)
            continue
        if len(kept) <= len(messages):
            print(f"(the oldest {len(messages) + 1 - len(kept)} messages dropped: the conversation outgrew the "
                  f"context of {ctx} tokens)", file=sys.stderr)
        text, stopped = reply(model, enc, ids, args)
        if stopped:
            print("(stopped: " + ("the part shown is kept as the reply)" if text else "question dropped)"),
                  file=sys.stderr)
        if text or not stopped:
            messages = kept + [{"role": "assistant", "content": text}]


def bench(model, args):
    """Greedy generation of --max_new_tokens tokens after --prompt_len random tokens, --batch rows: cached vs
    uncached (Llama.forward over the whole growing sequence), interleaved, median of --repeats."""
    from bench import race
    cfg, device = model.config, torch.device(args.device)
    n_new = min(args.max_new_tokens or 64, cfg.max_seq_len - args.prompt_len)
    if n_new < 1:
        raise SystemExit(f"error: --prompt_len {args.prompt_len} leaves no room in max_seq_len {cfg.max_seq_len}")
    torch.manual_seed(0)
    prompts = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt_len)).tolist()
    cached = lambda: generate(model, prompts, n_new, stop_ids=(), stop_texts=())
    uncached = lambda: generate_uncached(model, prompts, n_new)
    same = cached() == uncached()
    t = race({"cached": cached, "uncached": uncached}, device, warmup=1, repeats=args.repeats)
    print(f"{cfg.n_layer} layers, d={cfg.d_model}, vocab {cfg.vocab_size} | batch {args.batch}, prompt "
          f"{args.prompt_len} + {n_new} new tokens, greedy | {device} {next(model.parameters()).dtype} | "
          f"torch {torch.__version__}")
    for k, sec in t.items():
        print(f"{k:9s} {1e3 * sec:9.1f} ms   {args.batch * n_new / sec:8.1f} tok/s")
    print(f"speed-up of the cache: {t['uncached'] / t['cached']:.2f}x; same tokens: {same}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", nargs="?", help="a run folder of train.py (or of SFT)")
    p.add_argument("--step", type=int, help="checkpoint step (default: the latest)")
    p.add_argument("--hf", help="a Hugging Face Llama: hub name or local folder")
    p.add_argument("--gguf", help="a GGUF file inside the --hf folder")
    p.add_argument("--temperature", type=float, default=0.7, help="0: greedy")
    p.add_argument("--top_k", type=int, default=50, help="sample among the k most likely tokens; 0: off (default 50, "
                   "as Hugging Face's generate)")
    p.add_argument("--top_p", type=float, default=0.9, help="nucleus sampling mass, in (0, 1]")
    p.add_argument("--max_new_tokens", type=int, default=None, help="per reply (default 256; --bench: 64)")
    p.add_argument("--system", default="", help="a system message opening the conversation")
    p.add_argument("--seed", type=int, help="seed of the sampler (default: unseeded)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--bench", action="store_true", help="measure generation speed, cached vs uncached")
    p.add_argument("--preset", default="small", choices=sorted(PRESETS), help="--bench without a model: a random one")
    p.add_argument("--batch", type=int, default=1, help="--bench: rows")
    p.add_argument("--prompt_len", type=int, default=128, help="--bench: prompt tokens")
    p.add_argument("--repeats", type=int, default=3, help="--bench: timed repeats (median)")
    args = p.parse_args(argv)
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise SystemExit(f"error: --temperature must be finite and >= 0, not {args.temperature}")
    if not (0 < args.top_p <= 1):
        raise SystemExit(f"error: --top_p must be in (0, 1], not {args.top_p}")
    for key in ("max_new_tokens", "batch", "prompt_len", "repeats"):
        if getattr(args, key) is not None and getattr(args, key) < 1:
            raise SystemExit(f"error: --{key} must be >= 1, not {getattr(args, key)}")
    for key in ("step", "seed", "top_k"):
        if getattr(args, key) is not None and getattr(args, key) < 0:
            raise SystemExit(f"error: --{key} must be >= 0, not {getattr(args, key)}")
    if args.run_dir and args.hf:
        raise SystemExit("error: give a run folder or --hf, not both")
    if not (args.run_dir or args.hf or args.bench):
        raise SystemExit("error: give a run folder or --hf NAME_OR_DIR (or --bench)")
    if args.gguf and not args.hf:
        raise SystemExit("error: --gguf needs --hf DIR")
    if args.hf and args.step is not None:
        raise SystemExit("error: --step is for run folders, not --hf")
    from evaluate import check_device
    args.device = check_device(args.device)
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.run_dir or args.hf:
        model, enc, name = load_model(args)
    else:
        torch.manual_seed(0)
        model, enc, name = Llama(PRESETS[args.preset]).to(args.device).eval(), None, args.preset
    if args.bench:
        return bench(model, args)
    args.max_new_tokens = args.max_new_tokens or 256
    chat(model, enc, name, args)


if __name__ == "__main__":
    main()
