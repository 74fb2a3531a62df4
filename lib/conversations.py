"""
Conversations: the chat template, the prompt of a chat, and the packed stream that fine-tuning reads from a folder
prepared by prepare_sft.py. The template, the loss mask, the prepared folder and what packing shares between
conversations (measured): docs/finetuning.md.

    ids, mask = render(messages, enc)       # ours: <|endoftext|>, then "<|user|>\n" + content + "\n", ...,
                                            # "<|assistant|>\n" + content + <|endoftext|> (mask 1: these last two)
    ids = chat_prompt(messages, enc)        # ours, or a Hugging Face tokenizer's own template (render_template)
    stream = PackedStream(data_dir, "train", seq_len, seed, tokenizer, vocab_size)   # best-fit packed windows

Each piece is encoded on its own with tiktoken's encode_ordinary, so role headers are ordinary text. A mask shard
(tokenizer "loss-mask") holds 1 where the token is a target; a conversation starts at its leading EOT, the only EOT
with mask 0. In a model's template the eos may also close user turns, so there the mask has vocabulary 3 and a
conversation's first token has mask START (2), never a target.
"""
import os

import numpy as np
import torch

from data import MANIFEST, load_manifest, read_shard


MASK_TOKENIZER, START = "loss-mask", 2  # START: the mask value of a conversation's first token (model templates)
HEADERS = {"system": "<|system|>\n", "user": "<|user|>\n", "assistant": "<|assistant|>\n"}


def render(messages, enc):
    """Token ids and loss mask (1 = assistant content and its closing EOT, else 0) of a conversation.

    messages: [{"role": "system" | "user" | "assistant", "content": str}, ...]; enc: a tiktoken Encoding."""
    ids, mask = [enc.eot_token], [0]

    def add(tokens, loss):
        ids.extend(tokens)
        mask.extend([loss] * len(tokens))

    for i, m in enumerate(messages):
        role, content = m["role"], m["content"]
        if role not in HEADERS:
            raise ValueError(f"unknown role {role!r} (expected system, user or assistant)")
        add(enc.encode_ordinary(HEADERS[role]), 0)
        if role == "assistant":
            add(enc.encode_ordinary(content) + [enc.eot_token], 1)
            if i + 1 < len(messages):
                add(enc.encode_ordinary("\n"), 0)
        else:
            add(enc.encode_ordinary(content) + enc.encode_ordinary("\n"), 0)
    return ids, mask


def prompt_ids(messages, enc):
    """Token ids that ask the model for the next assistant turn: render(messages) + "<|assistant|>\\n"."""
    if messages and messages[-1]["role"] == "assistant":
        raise ValueError("a generation prompt ends with a user (or system) message, not an assistant one")
    return render(messages, enc)[0] + enc.encode_ordinary(HEADERS["assistant"])


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
    """Window k of an endless stream of packed conversations (the interface of data.ShardStream).

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


def chat_template(enc):
    """enc's Hugging Face tokenizer when it has a chat template of its own (else None: ours is used)."""
    hf = getattr(enc, "hf", None)
    return hf if hf is not None and getattr(hf, "chat_template", None) else None


def template_ids(messages, enc, prompt=False):
    """The token ids of apply_chat_template (with add_generation_prompt=prompt) of enc's tokenizer; control-token
    text in a message (e.g. "<|im_end|>") is ordinary text, only the template writes control tokens."""
    return list(chat_template(enc).apply_chat_template(messages, add_generation_prompt=prompt, tokenize=True,
                                                       return_dict=False, sanitize_control_tokens=True))


def render_template(messages, enc, limit=None):
    """Token ids and loss mask of a conversation in the chat template of enc's Hugging Face tokenizer, or None when
    the template does not render it prefix by prefix. It is rendered up to each assistant turn as a generation prompt
    (as the chat asks), then to the end of that turn, ..., then whole; each rendering must extend the one before
    token for token. A turn's loss tokens are those its end adds to its prompt, up to and including the last eos
    among them (the end-of-turn token; all of them when there is none). limit: stop at a rendering longer."""
    from jinja2 import TemplateError

    ids, mask = [], []
    if not messages:  # nothing to render (no answer: dropped as such)
        return ids, mask
    steps = [(messages[:i + end], ("prompt", "turn")[end]) for i, m in enumerate(messages) if m["role"] == "assistant"
             for end in (0, 1)]
    for part, kind in steps + [(messages, "rest")]:
        try:
            new = template_ids(part, enc, prompt=kind == "prompt")
        except TemplateError:
            return None
        if new[:len(ids)] != ids:
            return None
        added, loss = new[len(ids):], 0
        if kind == "turn":  # the turn, up to and including its last eos
            loss = len(added) - added[::-1].index(enc.eot_token) if enc.eot_token in added else len(added)
        ids, mask = new, mask + [1] * loss + [0] * (len(added) - loss)
        if limit is not None and len(ids) > limit:
            break
    return ids, mask


def chat_prompt(messages, enc):
    """The prompt of a chat: our template (prompt_ids), or the tokenizer's own chat template if it has one."""
    return template_ids(messages, enc, prompt=True) if chat_template(enc) else prompt_ids(messages, enc)


def fit_context(messages, enc, max_seq_len, room):
    """Drop the oldest turns (a system message stays) until the prompt leaves `room` tokens of the context (the chat:
    room 1, all the history that fits); (messages, prompt ids), or (messages without the last one, None) when that
    last message alone is too long."""
    first = 1 if messages[0]["role"] == "system" else 0
    while len(ids := chat_prompt(messages, enc)) + room > max_seq_len and len(messages) != first + 1:
        drop = first + 1 + (messages[first + 1]["role"] == "assistant")     # the oldest user turn and its reply
        messages = messages[:first] + messages[drop:]
    return (messages, ids) if len(ids) < max_seq_len else (messages[:-1], None)
