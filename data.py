"""
What a training step reads: token shards and their manifest, the training streams (text windows, or conversations
packed with their loss mask) and the fixed validation windows (atomic writes, locks and one-line errors: files.py).

    write_shard(path, ids, tokenizer=enc, vocab_size=enc.n_vocab, eot_token=enc.eot_token)
    tokens, header = read_shard(path, tokenizer="gpt2")          # checked memmap; a mismatch is one error line
    paths = list_shards(data_dir, "train")                       # as manifest.json records them, never guessed
    stream = ShardStream(data_dir, "train", seq_len, seed, tokenizer, vocab_size)     # text windows
    stream = PackedStream(data_dir, "train", seq_len, seed, tokenizer, vocab_size)    # best-fit packed conversations

Shard: a 256-byte header (magic JREGTOKS, version, bytes per token, vocabulary size, end-of-text id, token count,
tokenizer_tag) then uint16 tokens (uint32 when the vocabulary exceeds 65,536). Writes are atomic (write_atomic).
ShardStream is a deterministic, resumable stream of (seq_len + 1)-token windows whose whole state is one integer;
PackedStream the same over conversations prepared by scripts/prepare_sft.py: a mask shard (tokenizer "loss-mask")
beside each token shard holds 1 where the token is a target, and a conversation starts at its leading EOT (the only
EOT with mask 0), or, in a model's template (mask vocabulary 3), where the mask is START (2). Tokenizers: tokenizer.py;
preparing a folder: prepare_fineweb.py, scripts/prepare_sft.py and lib/preparation.py.
"""
import hashlib
import json
import os
import struct

import numpy as np
import torch

from files import one_line, write_atomic
from tokenizer import same_tokenizer, tokenizer_tag


MAGIC, VERSION, HEADER_BYTES = b"JREGTOKS", 1, 256
HEADER = struct.Struct("<8sIIIIQ64s")  # magic, version, bytes per token, vocab size, eot, num_tokens, tokenizer
DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}
MANIFEST = "manifest.json"
MASK_TOKENIZER, START = "loss-mask", 2  # START: the mask value of a conversation's first token (model templates)


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


def is_conversations(data_dir):
    """Whether data_dir holds conversations prepared by prepare_sft.py (its manifest says kind "sft"), not plain text:
    train.py and evaluate.py ask this to choose between packed conversations and text windows."""
    return os.path.isdir(data_dir) and (load_manifest(data_dir) or {}).get("kind") == "sft"


def read_manifest(data_dir):
    """The manifest of a complete prepare_sft.py preparation (one error line for anything else)."""
    path = os.path.join(data_dir, MANIFEST)
    if (manifest := load_manifest(data_dir, lambda m: all(isinstance(s["mask"], str) for s in m["shards"]))) is None:
        raise SystemExit(f"error: {data_dir}: no {MANIFEST}; prepare the conversations with prepare_sft.py")
    if manifest.get("kind") != "sft" or not manifest.get("complete"):
        raise SystemExit(f"error: {path}: not a complete prepare_sft.py preparation (kind {manifest.get('kind')!r}, "
                         f"complete {manifest.get('complete')}); rerun its prepare_sft.py command")
    return manifest


def best_fit(lengths, order, capacity):
    """Windows (lists of conversation indices) filled best-fit, conversations taken in `order`: each goes into
    the open window with the least free room that holds it, else opens a new window."""
    windows, by_room, nonempty = [], [[] for _ in range(capacity + 1)], 0  # bit r of nonempty: by_room[r] has windows
    for c in order:
        n = int(lengths[c])
        fits = nonempty >> n
        if fits:
            room = n + (fits & -fits).bit_length() - 1
            w = by_room[room].pop()
            if not by_room[room]:
                nonempty &= ~(1 << room)
        else:
            w, room = len(windows), capacity
            windows.append([])
        windows[w].append(c)
        if room > n:
            by_room[room - n].append(w)
            nonempty |= 1 << (room - n)
    return windows


class PackedStream:
    """Window k of an endless stream of packed conversations (the interface of ShardStream).

    The conversations of `split` are packed once, best-fit into windows of seq_len + 1 tokens, in an order drawn
    from seed (in stored order for val); epoch e = k // per_epoch visits the windows in an order drawn from
    (seed, e) (stored order for val). So every window starts at a conversation start, no conversation is split,
    each appears once per epoch, and batch(first, count) is a pure function of the indices: the loader's state is
    one integer and the global batch does not depend on the number of processes."""

    def __init__(self, data_dir, split, seq_len, seed, tokenizer, vocab_size):
        manifest = read_manifest(data_dir)
        entries = [e for e in manifest["shards"] if e["split"] == split]
        if not entries:
            raise SystemExit(f"error: {data_dir}: no {split} shards")
        self.seq_len, self.seed, self.shuffle = seq_len, seed, split == "train"
        self.tokens, self.masks, where, starts, lengths = [], [], [], [], []
        for i, e in enumerate(entries):
            tokens, header = read_shard(os.path.join(data_dir, e["file"]), tokenizer=tokenizer)
            mask, kinds = read_shard(os.path.join(data_dir, e["mask"]))
            if kinds["vocab_size"] not in (2, 3) or kinds["tokenizer"] != MASK_TOKENIZER:
                raise SystemExit(f"error: {data_dir}: {e['mask']} is not a loss mask")
            if header["vocab_size"] > vocab_size:
                raise SystemExit(f"error: {e['file']}: vocabulary of {header['vocab_size']} tokens does not fit the "
                                 f"model's vocab_size {vocab_size}")
            first = np.flatnonzero(mask == START if kinds["vocab_size"] == 3 else
                                   (tokens == header["eot_token"]) & (mask == 0))
            if len(mask) != len(tokens) or len(first) != e["conversations"] or (len(first) and first[0] != 0):
                raise SystemExit(f"error: {data_dir}: {e['file']} and its mask do not match {MANIFEST}")
            self.tokens.append(tokens)
            self.masks.append(mask)
            self.eot = header["eot_token"]
            where.append(np.full(len(first), i))
            starts.append(first)
            lengths.append(np.diff(first, append=len(tokens)))
        self.where, self.starts, self.lengths = (np.concatenate(a) for a in (where, starts, lengths))
        if self.lengths.max() > seq_len + 1:
            raise SystemExit(f"error: {data_dir} holds conversations of up to {self.lengths.max()} tokens (prepared "
                             f"with --seq_len {manifest['config']['seq_len']}): more than seq_len + 1 = {seq_len + 1}")
        n = len(self.lengths)
        order = np.random.default_rng([seed, 2]).permutation(n) if self.shuffle else np.arange(n)
        self.windows = best_fit(self.lengths, order, seq_len + 1)
        self.per_epoch = len(self.windows)
        self._epoch, self._order = None, None

    def window(self, k):
        """(tokens, mask, length) of window k: seq_len + 1 tokens, its conversations (length tokens in all), then
        EOT padding with mask 0."""
        epoch, i = divmod(k, self.per_epoch)
        if self.shuffle and self._epoch != epoch:
            self._epoch, self._order = epoch, np.random.default_rng([self.seed, 1, epoch]).permutation(self.per_epoch)
        convs = self.windows[int(self._order[i]) if self.shuffle else i]
        tokens = np.full(self.seq_len + 1, self.eot, dtype=np.int64)
        mask = np.zeros(self.seq_len + 1, dtype=bool)
        pos = 0
        for c in convs:
            s, start, n = self.where[c], self.starts[c], self.lengths[c]
            tokens[pos:pos + n] = self.tokens[s][start:start + n]
            mask[pos:pos + n] = self.masks[s][start:start + n] == 1
            pos += n
        return tokens, mask, pos

    def batch(self, first, count):
        """x, y: int64 [count, seq_len], y = -1 (ignored) where the target is not a loss token or is padding; and
        real: bool [count, seq_len], False on the padding (left out of Ψ)."""
        tokens, mask, length = zip(*(self.window(k) for k in range(first, first + count)))
        tokens, mask = np.stack(tokens), np.stack(mask)
        y = np.where(mask[:, 1:], tokens[:, 1:], -1)
        real = np.arange(self.seq_len)[None, :] < np.array(length)[:, None]
        return torch.from_numpy(tokens[:, :-1].copy()), torch.from_numpy(y), torch.from_numpy(real)


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
