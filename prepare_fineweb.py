"""Tokenise FineWeb-edu (or local text) into self-describing token shards, recorded in manifest.json.

    python prepare_fineweb.py --name sample-10BT --out_dir data/fineweb10B            # streamed from the hub
    python prepare_fineweb.py --input "corpus/*.parquet" --out_dir data/local --max_tokens 50_000_000
    python prepare_fineweb.py --input corpus.jsonl --out_dir data/smol --tokenizer hf:path/to/model_folder
    python prepare_fineweb.py --bench --workers 2 [--tokenizer hf:DIR]           # vs the tokenizer's own batch call
Shard format, layout, manifest, resume and errors: docs/data.md.
"""
import argparse
import itertools
import json
import os
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from data import DTYPES, MANIFEST, VERSION, _strays, load_manifest, read_shard, write_shard
from files import one_line, write_atomic
from lib.preparation import DATASET, _builder, kjv_path, lock_preparation, open_sources, remove_preparation
from tokenizer import HFTokenizer, get_tokenizer, tokenizer_fingerprint


BATCH_DOCS = 1024  # documents read, and tokenised by one thread, at a time
VAL_MAX, VAL_SHARE = 10_000_000, 10  # default val split: the first tenth of the tokens, at most VAL_MAX


def _batches(sources, field, resume):
    """((source index, dataset state before the batch), texts) for each batch of documents from ``resume`` on."""
    for i in range(resume["source"], len(sources)):
        desc, ds = sources[i]
        if ds is None:
            continue
        if field in (ds.column_names or []):  # read only the text (when the columns are known in advance)
            ds = ds.select_columns([field])
        text_file = os.path.isfile(desc) and _builder(desc) == "text"  # one document, or none when it is empty
        if (state := resume["state"] if i == resume["source"] else None) is not None:
            ds.load_state_dict(state)
        batches = ds.iter(batch_size=BATCH_DOCS)
        while True:
            try:
                if (batch := next(batches, None)) is None:
                    break
            except Exception as e:  # a malformed or truncated file, invalid UTF-8, ...
                raise SystemExit(f"error: {desc}: {one_line(e)}") from None
            if (texts := batch.get(field)) is None:
                raise SystemExit(f"error: {desc}: no text field {field!r} (fields: {', '.join(batch)}); choose one "
                                 "with --text_field")
            if not all(isinstance(t, str) for t in texts):
                raise SystemExit(f"error: {desc}: a {field!r} value is missing or not a string")
            yield (i, state), [t for t in texts if t] if text_file else texts
            state = ds.state_dict()  # exactly after this batch: resuming from it continues with the next document


def _encode(enc, texts):
    """<|endoftext|> + encode_ordinary(text) for each text, as one uint32 array (a Hugging Face tokenizer: through
    its own batch call)."""
    if isinstance(enc, HFTokenizer):
        return np.fromiter(itertools.chain.from_iterable((enc.eot_token, *ids) for ids in enc.encode_ordinary_batch(
            texts)), np.uint32)
    eot, parts = np.array([enc.eot_token], np.uint32), []
    for text in texts:
        try:
            parts += [eot, enc.encode_to_numpy(text, disallowed_special=())]  # = encode_ordinary, without int lists
        except UnicodeEncodeError:  # lone surrogates, which encode_ordinary repairs
            parts += [eot, np.array(enc.encode_ordinary(text), np.uint32)]
    return np.concatenate(parts) if parts else np.zeros(0, np.uint32)


def _tokenized(batches, enc, workers):
    """(key, tokens) for each (key, texts), in order; ``workers`` threads tokenise (tiktoken and Hugging Face's
    tokenizers release the GIL)."""
    with ThreadPoolExecutor(workers) as pool:
        pending = []
        for key, texts in batches:
            pending.append((key, pool.submit(_encode, enc, texts)))
            if len(pending) > 2 * workers:
                key, future = pending.pop(0)
                yield key, future.result()
        yield from ((key, future.result()) for key, future in pending)


def check_options(**options):
    """Every numeric option in range, before any work: one error line naming the option."""
    for opt, value in options.items():
        if value is not None and (not isinstance(value, int) or value < (low := int(opt != "val_tokens"))):
            raise SystemExit(f"error: --{opt} must be an integer >= {low}, got {value!r}")


def open_folder(out_dir, config, enc, overwrite):
    """The folder's manifest to resume (complete: nothing to do), or a new one; what a kill left is removed, and
    anything else that does not belong to this preparation is refused in one line."""
    prefix, val_tokens = config["prefix"], config["val_tokens"]
    if overwrite:
        remove_preparation(out_dir)
    if m := load_manifest(out_dir, lambda m: m.get("complete") or {"source", "state", "skip", "tokens", "next"} <=
                          set(m["resume"])):
        old = {"tokenizer_fingerprint": config["tokenizer_fingerprint"], **m.get("config", {})}  # older: tiktoken
        if diffs := [f"{k}: {str(old.get(k))[:150]} there, {str(config.get(k))[:150]} now"
                     for k in sorted(set(old) | set(config)) if old.get(k) != config.get(k)]:
            raise SystemExit(f"error: {out_dir} was prepared with other arguments ({'; '.join(diffs)}); use another "
                             "--out_dir, or --overwrite to start again")
        if m["complete"]:
            return m
    m = m or {"config": config, "complete": False, "shards": [],
              "resume": {"source": 0, "state": None, "skip": 0, "tokens": 0, "next": int(val_tokens == 0)}}
    for f in set(os.listdir(out_dir)) - {s["file"] for s in m["shards"]}:  # what a kill left: a .tmp, or a shard
        if re.fullmatch(re.escape(prefix) + r"_(val|train)_\d{6,}\.bin(\.tmp)?", f):  # renamed but not yet recorded
            os.remove(os.path.join(out_dir, f))
    if stray := _strays(out_dir, m):
        raise SystemExit(f"error: {out_dir} holds shard files of another preparation, {stray}; use --overwrite")
    for s in m["shards"]:  # the shards recorded so far are intact
        if read_shard(os.path.join(out_dir, s["file"]), enc)[1]["num_tokens"] != s["num_tokens"]:
            raise SystemExit(f"error: {out_dir}/{s['file']} does not match {MANIFEST}; use --overwrite")
    return m


def prepare(out_dir, *, inputs=None, name=None, text_field="text", tokenizer="gpt2",
            shard_tokens=100_000_000, val_tokens=None, max_tokens=None, workers=None, prefix="fineweb",
            overwrite=False, quiet=True):
    """Tokenise the source into ``out_dir``, resuming an interrupted preparation there; return the manifest.
    val_tokens None: the first tenth of the tokens, at most VAL_MAX, decided once VAL_SHARE x VAL_MAX tokens (or
    the whole input, when shorter) are read."""
    check_options(shard_tokens=shard_tokens, val_tokens=val_tokens, max_tokens=max_tokens, workers=workers)
    if max_tokens is not None and max_tokens <= (1 if val_tokens is None else val_tokens):
        raise SystemExit(f"error: --val_tokens {1 if val_tokens is None else val_tokens} leaves no training tokens "
                         f"within --max_tokens {max_tokens}")
    if not re.fullmatch(r"[A-Za-z0-9.\-]{1,40}", prefix):
        raise SystemExit(f"error: --prefix {prefix!r}: use 1 to 40 letters, digits, '.' and '-'")
    if inputs and name:
        raise SystemExit("error: use either --name (hub streaming) or --input (local files), not both")
    enc = get_tokenizer(tokenizer)
    sources, described = open_sources(inputs, name or "sample-10BT", exclude=out_dir)
    dtype = DTYPES[2 if enc.n_vocab <= 1 << 16 else 4]
    config = {"format_version": VERSION, "source": described, "text_field": text_field, "tokenizer": enc.name,
              "vocab_size": enc.n_vocab, "eot_token": enc.eot_token,
              "tokenizer_fingerprint": tokenizer_fingerprint(enc), "dtype": dtype.name, "prefix": prefix,
              "shard_tokens": shard_tokens, "val_tokens": val_tokens, "max_tokens": max_tokens}
    lock = lock_preparation(out_dir)  # noqa: F841 (held until this returns)
    m = open_folder(out_dir, config, enc, overwrite)
    if m["complete"]:
        return m
    start, t0, limit = m["resume"], time.perf_counter(), max_tokens or float("inf")
    written, index, fill, skip = start["tokens"], start["next"], 0, start["skip"]
    first = VAL_MAX * VAL_SHARE if val_tokens is None else val_tokens  # tokens read before the val shard is written
    buf = np.empty(0, dtype)  # grown as tokens are read, to at most the largest shard (first, or shard_tokens)
    capacity = lambda: min(first if index == 0 else shard_tokens, limit - written)  # noqa: E731

    def flush(resume, n=None):  # write the first n (default all) buffered tokens as the next shard, record it
        nonlocal written, index, fill
        n, split_name = fill if n is None else n, "val" if index == 0 else "train"
        file = f"{prefix}_{split_name}_{index:06d}.bin"
        write_shard(os.path.join(out_dir, file), buf[:n], tokenizer=enc, vocab_size=enc.n_vocab,
                    eot_token=enc.eot_token)
        m["shards"].append({"file": file, "split": split_name, "num_tokens": n,
                            "documents": int(np.count_nonzero(buf[:n] == enc.eot_token))})
        buf[:fill - n] = buf[n:fill]  # what is left of the buffer (after a default val split) moves to its start
        written, index, fill = written + n, index + 1, fill - n
        m["resume"] = {**resume, "tokens": written, "next": index}
        write_atomic(os.path.join(out_dir, MANIFEST), json.dumps(m, indent=1))
        if not quiet:
            print(f"{file}: {written:,} tokens in all, {time.perf_counter() - t0:.0f}s", file=sys.stderr)

    def split_val():  # default --val_tokens: the first tenth of what was read, at most VAL_MAX; then full train shards
        n = min(VAL_MAX, max(1, fill // VAL_SHARE))
        while n < fill:  # positions counted from the start of the source: no shard was recorded before these
            flush({"source": 0, "state": None, "skip": written + n}, n)
            n = shard_tokens if fill > shard_tokens else fill

    for (source, state), tokens in _tokenized(_batches(sources, text_field, start), enc, workers or os.cpu_count()):
        pos, skip = min(skip, len(tokens)), max(0, skip - len(tokens))  # after a resume, skip what shards hold
        while pos < len(tokens) and written < limit:
            take = min(capacity() - fill, len(tokens) - pos)
            if fill + take > len(buf):
                buf = np.concatenate([buf[:fill], np.empty(min(max(fill + take, 2 * len(buf)), capacity()) - fill,
                                                           dtype)])
            buf[fill:fill + take] = tokens[pos:pos + take]
            fill, pos = fill + take, pos + take
            if fill == capacity() and index == 0 and val_tokens is None:
                split_val()
            elif fill == capacity():
                flush({"source": source, "state": state, "skip": pos})
        if written >= limit:
            break
    if fill and index == 0 and val_tokens is None:  # the input is shorter: its size is known
        split_val()
    if fill:
        flush({"source": len(sources), "state": None, "skip": 0})
    if not m["shards"]:
        raise SystemExit(f"error: the input has no documents: {', '.join(d for d, _ in sources)}")
    if not any(s["split"] == "train" for s in m["shards"]):
        size = f"--val_tokens {val_tokens:,}" if val_tokens else "the default size"
        raise SystemExit(f"error: {out_dir}: the input holds {written:,} tokens, all in the val split ({size}): "
                         f"nothing to train on; prepare it again with --overwrite and a smaller --val_tokens (e.g. "
                         f"{written // VAL_SHARE:,}), or without it (a tenth, at most {VAL_MAX:,})")
    m.update(complete=True, tokens=written, documents=sum(s["documents"] for s in m["shards"]))
    write_atomic(os.path.join(out_dir, MANIFEST), json.dumps(m, indent=1))
    return m


def bench(inputs=None, tokenizer="gpt2", workers=None, rounds=3, text_field="text"):
    """Tokens/s, best of rounds: the pipeline (read, tokenise, write shards to a temporary folder) vs bare
    encode_ordinary_batch(docs, num_threads=workers) on the same documents, already in memory (for a Hugging Face
    tokenizer, its own batch call: encode_batch_fast of its fast tokenizer)."""
    check_options(workers=workers)
    inputs, workers, enc = inputs or [kjv_path()], workers or os.cpu_count(), get_tokenizer(tokenizer)
    docs = [t for _, ts in _batches(open_sources(inputs)[0], text_field, {"source": 0, "state": None}) for t in ts]
    bare, pipe = [], []
    for _ in range(rounds):
        t = time.perf_counter()
        n_tokens = sum(map(len, enc.encode_ordinary_batch(docs, num_threads=workers))) + len(docs)
        with tempfile.TemporaryDirectory() as tmp:
            t1 = time.perf_counter()
            m = prepare(tmp, inputs=inputs, tokenizer=tokenizer, workers=workers, text_field=text_field)
            bare, pipe = bare + [t1 - t], pipe + [time.perf_counter() - t1]
        assert m["tokens"] == n_tokens, (m["tokens"], n_tokens)
    result = {"documents": len(docs), "tokens": n_tokens, "workers": workers, "rounds": rounds,
              "bare_tokens_per_s": n_tokens / min(bare), "pipeline_tokens_per_s": n_tokens / min(pipe),
              "ratio": min(bare) / min(pipe)}
    print(f"bench: {len(docs):,} documents, {n_tokens:,} tokens, {workers} workers, best of {rounds}: bare "
          f"{'encode_batch_fast' if enc.name.startswith('hf:') else 'encode_ordinary_batch'} "
          f"{result['bare_tokens_per_s'] / 1e6:.2f}M tokens/s, pipeline (read, tokenise, write shards) "
          f"{result['pipeline_tokens_per_s'] / 1e6:.2f}M tokens/s, ratio pipeline / bare {result['ratio']:.2f}")
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--name", help=f"{DATASET} config: sample-10BT (default), sample-100BT, sample-350BT, ...")
    p.add_argument("--input", dest="inputs", nargs="+", metavar="PATH", help="local files or globs (.jsonl .ndjson "
                   ".json .txt, optionally .gz, .parquet; a .txt file is one document) or one save_to_disk folder")
    p.add_argument("--text_field", default="text", help="column holding the text (default %(default)s)")
    p.add_argument("--out_dir", help="output folder (required unless --bench)")
    p.add_argument("--prefix", default="fineweb", help="shard file name prefix (default %(default)s)")
    p.add_argument("--tokenizer", default="gpt2", help="gpt2 (default), cl100k_base, o200k_base, bytes, or a Hugging "
                   "Face tokenizer: hf:NAME_OR_DIR, hf:DIR/FILE.gguf")
    p.add_argument("--shard_tokens", type=int, default=100_000_000, help="tokens per train shard (default 100M)")
    p.add_argument("--val_tokens", type=int, help="tokens in the val shard (default: the first tenth, at most 10M; "
                   "0: none)")
    p.add_argument("--max_tokens", type=int, help="stop after this many tokens in all")
    p.add_argument("--workers", type=int, help="tokenising threads (default: all cores)")
    p.add_argument("--overwrite", action="store_true", help="remove the folder's previous preparation first")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--bench", action="store_true", help="pipeline vs the bare tokenizer on --input (default: the KJV)")
    a, t = vars(p.parse_args(argv)), time.perf_counter()
    if a.pop("bench"):
        return bench(a["inputs"], a["tokenizer"], a["workers"], text_field=a["text_field"])
    if not a["out_dir"]:
        raise SystemExit("error: --out_dir is required")
    m = prepare(**a)
    train = [s["num_tokens"] for s in m["shards"] if s["split"] == "train"]
    plural = lambda n, what: f"{n:,} {what}{'s' * (n != 1)}"
    print(f"{a['out_dir']}: {m['tokens']:,} tokens ({m['config']['tokenizer']}), {plural(m['documents'], 'document')};"
          f" val {m['tokens'] - sum(train):,} tokens, {plural(len(train), 'train shard')} ({sum(train):,} tokens);"
          f" {time.perf_counter() - t:.1f}s")


if __name__ == "__main__":
    main()
