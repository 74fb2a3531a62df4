"""
Talk to a model: batched generation with a key/value cache, and an interactive chat in the terminal.

    python -m scripts.chat out/sft                                    # a run folder's latest checkpoint
    python -m scripts.chat out/sft --step 2000 --temperature 0 --system "You are a concise assistant."
    python -m scripts.chat --hf HuggingFaceTB/SmolLM2-135M-Instruct   # any Hugging Face Llama (converted to our Llama)
    python -m scripts.chat --hf DIR --gguf model.gguf

In the chat, each line you type is a user turn and the reply streams as it is generated. The conversation keeps its
whole history while its prompt fits the model's context (max_seq_len); the reply is then capped at the tokens left
(said on stderr when the cap bites), and only when the prompt alone no longer fits are the oldest turns dropped (said
on stderr). `/clear` starts over; Ctrl-C during a reply stops it there and the part shown stays in the conversation
as the reply (a reply stopped before any text is dropped with its question); Ctrl-C at the prompt gives a fresh
prompt; Ctrl-D (end of input) quits. Prompts use the chat template of prepare_sft.py (plain-text role headers,
`<|endoftext|>` closing each assistant turn); a --hf model whose tokenizer has its own chat template uses that one.

Generation (one left-padded batch through the model's own KV-cached forward): generation.py; the manual:
docs/finetuning.md, "Chat".
"""
import argparse
import math
import sys

from lib.conversations import fit_context
from lib.generation import generate
from lib.commands import check_device, int_at_least, load_llama


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


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.error = lambda message: sys.exit(f"error: {message}")      # one line and exit status 1, as every user error
    p.add_argument("run_dir", nargs="?", help="a run folder of train.py (or of SFT), or RUN_DIR@STEP")
    p.add_argument("--step", type=int_at_least(0), help="checkpoint step (default: the latest)")
    p.add_argument("--hf", help="a Hugging Face Llama: hub name or local folder")
    p.add_argument("--gguf", help="a GGUF file inside the --hf folder")
    p.add_argument("--temperature", type=float, default=0.7, help="0: greedy")
    p.add_argument("--top_k", type=int_at_least(0), default=50, help="sample among the k most likely tokens; 0: off "
                   "(default 50, as Hugging Face's generate)")
    p.add_argument("--top_p", type=float, default=0.9, help="nucleus sampling mass, in (0, 1]")
    p.add_argument("--max_new_tokens", type=int_at_least(1), default=256, help="per reply (default 256)")
    p.add_argument("--system", default="", help="a system message opening the conversation")
    p.add_argument("--seed", type=int_at_least(0), help="seed of the sampler (default: unseeded)")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise SystemExit(f"error: --temperature must be finite and >= 0, not {args.temperature}")
    if not (0 < args.top_p <= 1):
        raise SystemExit(f"error: --top_p must be in (0, 1], not {args.top_p}")
    if args.run_dir and args.hf:
        raise SystemExit("error: give a run folder or --hf, not both")
    if not (args.run_dir or args.hf):
        raise SystemExit("error: give a run folder or --hf NAME_OR_DIR")
    if args.gguf and not args.hf:
        raise SystemExit("error: --gguf needs --hf DIR")
    if args.hf and args.step is not None:
        raise SystemExit("error: --step is for run folders, not --hf")
    args.device = check_device(args.device)
    return args


def main(argv=None):
    args = parse_args(argv)
    model, enc, name = load_llama(args.run_dir, args.step, args.hf, args.gguf, args.device)
    chat(model, enc, name, args)


if __name__ == "__main__":
    main()
