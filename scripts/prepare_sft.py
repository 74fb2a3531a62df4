"""Instruction data -> conversation shards with a loss mask, rendered with conversations.py's chat template, or with
the model's own (apply_chat_template) for a --tokenizer hf:... that has one (conversations.render_template).

    python -m scripts.prepare_sft --out_dir data/sft                     # Tulu v2 SFT mixture, streamed from the hub
    python -m scripts.prepare_sft --input chats.jsonl more.parquet --out_dir data/mine --seq_len 1024 --val_conversations 100

Records in any of three schemas (messages, ShareGPT conversations, Alpaca), trimmed or dropped as malformed; each
conversation cut to --seq_len + 1 tokens, its text cut before tokenising so that memory stays bounded; the val split
first, then train shards of --shard_conversations each, with a mask shard beside each; manifest.json records the
arguments, shards and COUNTS (records = kept + malformed + no_loss + cut_dropped), and is rewritten after each shard,
so a killed command rerun resumes after its last complete shard with byte-identical files. The manual:
docs/finetuning.md, "Data".
"""
import argparse
import hashlib
import itertools
import json
import os
import re
import sys
import time
from functools import lru_cache

import numpy as np

from lib.conversations import HEADERS, chat_template, render, render_template
from data import MANIFEST, MASK_TOKENIZER, START, load_manifest, write_shard
from files import one_line, write_atomic
from lib.preparation import lock_preparation, open_sources, remove_preparation
from tokenizer import get_tokenizer, tokenizer_fingerprint


DEFAULT_DATASET = "allenai/tulu-v2-sft-mixture"
COUNTS = ("records", "kept", "trimmed", "truncated", "malformed", "no_loss", "cut_dropped", "tokens", "loss_tokens")
SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant", "bard": "assistant"}


# ----------------------------------------------------------------------------------------------------------
# Conversations: records in three schemas -> [{role, content}]

def to_messages(record):
    """The record's turns as [{role, content}] (not yet checked), or None when no schema field holds a value (datasets
    gives a key that a record lacks as null): a malformed record, or, as a file's first record, an unknown schema."""
    if (turns := record.get("messages")) is not None:
        return [{"role": m.get("role"), "content": m.get("content")} if isinstance(m, dict) else {}
                for m in turns] if isinstance(turns, list) else [{}]
    if (turns := record.get("conversations")) is not None:
        return [{"role": SHAREGPT_ROLES.get(f, f) if isinstance(f := t.get("from"), str) else None,
                 "content": t.get("value")} if isinstance(t, dict) else {}
                for t in turns] if isinstance(turns, list) else [{}]
    if record.get("instruction") is not None or record.get("output") is not None:
        instruction, extra = record.get("instruction"), record.get("input")
        if isinstance(instruction, str) and isinstance(extra, str) and extra:
            instruction += "\n\n" + extra
        return [{"role": "user", "content": instruction}, {"role": "assistant", "content": record.get("output")}]
    return None


def clean(messages):
    """(messages, trimmed) with leading assistant turns and a trailing user turn removed, or (None, False) when
    there are none (None) or the roles do not alternate user/assistant after an optional first system message."""
    if messages is None or not all(m.get("role") in HEADERS and isinstance(m.get("content"), str) for m in messages):
        return None, False
    system = messages[:1] if messages and messages[0]["role"] == "system" else []
    turns = messages[len(system):]
    lead = next((i for i, m in enumerate(turns) if m["role"] != "assistant"), len(turns))
    turns = turns[lead:]
    tail = len(turns) % 2 == 1 and turns[-1]["role"] == "user"
    turns = turns[:len(turns) - tail]
    if [m["role"] for m in turns] != ["user", "assistant"] * (len(turns) // 2):
        return None, False
    return system + turns, bool(lead or tail)


def records(sources):
    """(where, record) for each record of [(description, dataset or None when the file holds none)], in order."""
    for desc, ds in sources:
        it = iter(() if ds is None else ds)
        for i in itertools.count():
            try:
                if (record := next(it, None)) is None:
                    break
            except Exception as e:  # a malformed or truncated file
                raise SystemExit(f"error: {desc}: {one_line(e, 300)}") from None
            yield f"{desc} record {i}", record


@lru_cache(maxsize=None)
def longest_token(enc):
    """The length in bytes of the encoding's longest token (a Hugging Face tokenizer: in characters, which for a
    byte-level vocabulary are bytes)."""
    return max(map(len, enc.hf.get_vocab() if hasattr(enc, "hf") else enc.token_byte_values()))


def cut(messages, chars):
    """The messages with their contents cut to `chars` characters in all (later messages left out)."""
    out = []
    for m in messages:
        if chars <= 0:
            break
        out.append({**m, "content": m["content"][:chars]})
        chars -= len(m["content"])
    return out


def conversations(source, enc, seq_len, counts):
    """Yield (ids, mask) arrays of each kept conversation; update counts (COUNTS) as records are consumed. In the
    chat template of enc's Hugging Face tokenizer when it has one: the first token's mask is then START."""
    room = (seq_len + 1) * longest_token(enc)  # characters that make more than seq_len + 1 tokens, whatever the text
    templated = chat_template(enc) is not None
    for where, record in source:
        counts["records"] += 1
        messages, trimmed = clean(to_messages(record))
        if messages is not None:  # text beyond `room` cannot reach the window: never tokenised
            kept = cut(messages, room)
            rendered = render_template(kept, enc, seq_len + 1) if templated else render(kept, enc)
        if messages is None or rendered is None:
            counts["malformed"] += 1
            continue
        ids, mask = rendered
        cut_off = len(ids) > seq_len + 1
        ids, mask = ids[:seq_len + 1], mask[:seq_len + 1]
        if templated and ids:
            mask[0] = START
        if (n_loss := mask.count(1)) == 0:
            counts["cut_dropped" if cut_off and any(m["role"] == "assistant" for m in messages) else "no_loss"] += 1
            continue
        counts["kept"] += 1
        counts["truncated"] += cut_off
        counts["trimmed"] += trimmed
        counts["tokens"] += len(ids)
        counts["loss_tokens"] += n_loss
        yield np.array(ids, dtype=np.int32), np.array(mask, dtype=np.uint8)


# ----------------------------------------------------------------------------------------------------------
# Preparation: token shards + mask shards + manifest.json, resumable

def prepare(out_dir, *, inputs=None, name=DEFAULT_DATASET, split="train", tokenizer="gpt2", seq_len=2048,
            val_conversations=200, shard_conversations=50_000, overwrite=False, log=print):
    """Render, truncate and shard the conversations into out_dir (see the module docstring); returns the manifest."""
    for option, value, low in (("--seq_len", seq_len, 1), ("--val_conversations", val_conversations, 0),
                               ("--shard_conversations", shard_conversations, 1)):
        if not isinstance(value, int) or value < low:
            raise SystemExit(f"error: {option} must be an integer >= {low}, got {value!r}")
    sources, described = open_sources(inputs, dataset=name, split=split, exclude=out_dir)  # read lazily, below
    for source in sources:  # a file's first record shows its schema (a later record that fits none is malformed)
        for where, record in itertools.islice(records([source]), 1):
            if to_messages(record) is None:
                keys = sorted(k for k, v in record.items() if v is not None)
                raise SystemExit(f"error: {where}: unknown conversation schema (keys {keys}); expected 'messages', "
                                 "'conversations' (ShareGPT) or 'instruction'/'input'/'output' (Alpaca)")
    enc = get_tokenizer(tokenizer)
    template = chat_template(enc) and chat_template(enc).chat_template
    config = {"kind": "sft", "source": described, "split": split, "tokenizer": enc.name, "vocab_size": enc.n_vocab,
              "eot_token": enc.eot_token, "tokenizer_fingerprint": tokenizer_fingerprint(enc), "chat_template": "ours"
              if template is None else hashlib.sha256(json.dumps(template).encode()).hexdigest()[:16],
              "seq_len": seq_len, "val_conversations": val_conversations, "shard_conversations": shard_conversations}
    lock = lock_preparation(out_dir)  # noqa: F841 (held until this returns)
    manifest_path = os.path.join(out_dir, MANIFEST)
    ours = lambda: [f for f in os.listdir(out_dir)  # noqa: E731 (our shard names, nothing else of the folder)
                    if re.fullmatch(r"sft_(val|train)_\d{6,}\.bin(\.mask)?(\.tmp)?", f)]
    if overwrite:
        remove_preparation(out_dir)
    if manifest := load_manifest(out_dir, lambda m: m.get("kind") != "sft" or set(COUNTS) <= set(m["counts"]) and
                                 all(isinstance(s["mask"], str) for s in m["shards"]) and "complete" in m):
        old = {"tokenizer_fingerprint": config["tokenizer_fingerprint"], "chat_template": "ours",  # older: tiktoken
               **manifest.get("config", {})}
        if diffs := [f"{k}: {old.get(k)!r} before, {config.get(k)!r} now" for k in sorted(set(old) | set(config))
                     if old.get(k) != config.get(k)]:
            raise SystemExit(f"error: {out_dir} was prepared with other arguments ({'; '.join(diffs)}); "
                             "use another --out_dir or --overwrite")
        if manifest["complete"]:
            return manifest
    else:  # a new preparation, or one killed within its first shard: what that left is removed below
        manifest = {"kind": "sft", "config": config, "shards": [], "complete": False, "elapsed_s": 0.0,
                    "counts": dict.fromkeys(COUNTS, 0)}
    listed = {f for s in manifest["shards"] for f in (s["file"], s["mask"])}
    for f in set(ours()) - listed:                    # a shard written after the last manifest update, or a .tmp
        os.remove(os.path.join(out_dir, f))
    manifest["argv"] = sys.argv
    counts, t0, elapsed = manifest["counts"], time.time(), manifest["elapsed_s"]
    if counts["records"]:
        log(f"resuming after {len(manifest['shards'])} shards ({counts['records']:,} records)")
    stream = conversations(itertools.islice(records(sources), counts["records"], None), enc, seq_len, counts)

    def write(split_name, index, convs):
        ids, mask = np.concatenate([c[0] for c in convs]), np.concatenate([c[1] for c in convs])
        file = f"sft_{split_name}_{index:06d}.bin"
        entry = {"file": file, "mask": file + ".mask", "split": split_name, "conversations": len(convs),
                 "num_tokens": len(ids), "loss_tokens": int((mask == 1).sum())}
        write_shard(os.path.join(out_dir, entry["file"]), ids, tokenizer=enc, vocab_size=enc.n_vocab,
                    eot_token=enc.eot_token)
        write_shard(os.path.join(out_dir, entry["mask"]), mask, tokenizer=MASK_TOKENIZER, vocab_size=2 + (template is
                    not None), eot_token=0)
        manifest["shards"].append(entry)
        manifest["elapsed_s"] = round(elapsed + time.time() - t0, 3)
        write_atomic(manifest_path, json.dumps(manifest, indent=1) + "\n")
        log(f"{entry['file']}: {len(convs):,} conversations, {len(ids):,} tokens ({counts['records']:,} records read)")

    index = len(manifest["shards"]) + (val_conversations == 0)
    while convs := list(itertools.islice(stream, val_conversations if index == 0 else shard_conversations)):
        write("val" if index == 0 else "train", index, convs)
        index += 1
    if counts["records"] == 0:
        raise SystemExit(f"error: no conversations in the input: {', '.join(d for d, _ in sources)}")
    if counts["kept"] == 0:
        raise SystemExit(f"error: no usable conversation in the input ({counts['records']:,} records, "
                         f"{counts['malformed']:,} malformed, {counts['no_loss']:,} without an answer, "
                         f"{counts['cut_dropped']:,} with no answer token within {seq_len + 1} tokens)")
    manifest["splits"] = {s: {k: sum(e[k] for e in manifest["shards"] if e["split"] == s)
                              for k in ("conversations", "num_tokens", "loss_tokens")} for s in ("val", "train")}
    manifest.update(complete=True, elapsed_s=round(elapsed + time.time() - t0, 3))
    write_atomic(manifest_path, json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--input", dest="inputs", nargs="+", metavar="PATH", help="local .json/.jsonl(.gz)/.parquet "
                     "files (globs) or one save_to_disk folder")
    src.add_argument("--name", default=DEFAULT_DATASET, help="hub dataset, streamed (default %(default)s)")
    p.add_argument("--split", default="train", help="hub / DatasetDict split (default %(default)s)")
    p.add_argument("--out_dir", required=True)
    p.add_argument("--seq_len", type=int, default=2048, help="training window; longer conversations are cut to "
                   "seq_len + 1 tokens (default %(default)s)")
    p.add_argument("--tokenizer", default="gpt2", help="tokenizer.get_tokenizer name: gpt2 (default), bytes, ..., or "
                   "hf:NAME_OR_DIR, hf:DIR/FILE.gguf (its chat template is used when it has one)")
    p.add_argument("--val_conversations", type=int, default=200, help="the first N kept conversations form the "
                   "val split (default %(default)s)")
    p.add_argument("--shard_conversations", type=int, default=50_000, help="conversations per train shard "
                   "(default %(default)s)")
    p.add_argument("--overwrite", action="store_true", help="delete a previous preparation in --out_dir first")
    args = p.parse_args(argv)
    m = prepare(**vars(args), log=lambda s: print(s, file=sys.stderr))
    c, sp = m["counts"], m["splits"]
    print(f"{args.out_dir}: {c['records']:,} records -> {c['kept']:,} conversations (val "
          f"{sp['val']['conversations']:,}, train {sp['train']['conversations']:,}); {c['tokens']:,} tokens, "
          f"{c['loss_tokens']:,} loss tokens; {c['truncated']:,} cut to {args.seq_len + 1} tokens, {c['trimmed']:,} "
          f"trimmed; dropped: {c['malformed']:,} malformed, {c['no_loss']:,} without an answer, {c['cut_dropped']:,} "
          f"with no answer token within {args.seq_len + 1} tokens; {m['elapsed_s']:.1f}s")
    if sp["train"]["conversations"] == 0:
        print("warning: no train conversations: all are in the val split (lower --val_conversations)", file=sys.stderr)


if __name__ == "__main__":
    main()
