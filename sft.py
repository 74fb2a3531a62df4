"""Supervised fine-tuning data: the chat template, conversation loading, preparation into shards, packing.

Chat template (the documentation of record; GPT-2 vocabulary, Tulu / open-instruct style). A conversation
is rendered as plain text; each piece (role header, content, newline) is encoded separately with tiktoken
``encode_ordinary`` and the pieces are concatenated, so token boundaries are exact and the role headers are ordinary text, never
special tokens. EOT is the encoding's ``<|endoftext|>`` (``enc.eot_token``, 50256 for GPT-2):

    segment                                  loss
    <|endoftext|>                            0     one EOT token: the start of every conversation
    "<|system|>\\n" + content + "\\n"          0     only if there is a system message (it comes first)
    "<|user|>\\n" + content + "\\n"            0
    "<|assistant|>\\n"                        0
    content                                  1
    <|endoftext|>                            1     closes each assistant turn
    "\\n"                                     0     between turns (not after the last message)

Contents are used verbatim. A generation prompt is the conversation so far followed by "<|assistant|>\\n"
(``prompt_ids``); generation stops at EOT or when the text "<|user|>" appears.
"""
from __future__ import annotations

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
        if role == "assistant":
            add(enc.encode_ordinary(HEADERS[role]), 0)
            add(enc.encode_ordinary(content), 1)
            add([enc.eot_token], 1)
            if i + 1 < len(messages):
                add(enc.encode_ordinary("\n"), 0)
        else:
            add(enc.encode_ordinary(HEADERS[role]) + enc.encode_ordinary(content) + enc.encode_ordinary("\n"), 0)
    return ids, mask


def prompt_ids(messages, enc):
    """Token ids that ask the model for the next assistant turn: render(messages) + "<|assistant|>\\n"."""
    if messages and messages[-1]["role"] == "assistant":
        raise ValueError("a generation prompt ends with a user (or system) message, not an assistant one")
    return render(messages, enc)[0] + enc.encode_ordinary(HEADERS["assistant"])
