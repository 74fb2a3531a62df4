"""
Conversations: the chat template and the prompt of a chat. The template, the loss mask, the prepared folder and
what packing shares between conversations (measured): docs/finetuning.md; the packed stream that fine-tuning reads
from a folder prepared by prepare_sft.py is data.PackedStream.

    ids, mask = render(messages, enc)       # ours: <|endoftext|>, then "<|user|>\n" + content + "\n", ...,
                                            # "<|assistant|>\n" + content + <|endoftext|> (mask 1: these last two)
    ids = chat_prompt(messages, enc)        # ours, or a Hugging Face tokenizer's own template (render_template)

Each piece is encoded on its own with tiktoken's encode_ordinary, so role headers are ordinary text. A mask shard
(tokenizer "loss-mask") holds 1 where the token is a target; a conversation starts at its leading EOT, the only EOT
with mask 0. In a model's template the eos may also close user turns, so there the mask has vocabulary 3 and a
conversation's first token has mask data.START (2), never a target.
"""


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
