"""Tests of sft.py: chat template, conversation loading, preparation, packing (tiny, CPU, no network)."""
import tiktoken

import sft


def byte_enc():
    """Real tiktoken code on a byte vocabulary: one token per UTF-8 byte, <|endoftext|> = 256."""
    return tiktoken.Encoding(name="bytes", pat_str=r"""\s+|\S+""", mergeable_ranks={bytes([i]): i for i in range(256)},
                             special_tokens={"<|endoftext|>": 256})


CONV = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"}]


def test_render_matches_hand_written_tokens():
    b = lambda s: list(s.encode())  # noqa: E731 -- one token per byte
    E = 256
    ids, mask = sft.render(CONV, byte_enc())
    expected = [(E, 0), *[(t, 0) for t in b("<|system|>\nBe brief.\n")], *[(t, 0) for t in b("<|user|>\nHi\n")],
                *[(t, 0) for t in b("<|assistant|>\n")], *[(t, 1) for t in b("Hello")], (E, 1), (10, 0),
                *[(t, 0) for t in b("<|user|>\n2+2?\n")], *[(t, 0) for t in b("<|assistant|>\n")], (ord("4"), 1), (E, 1)]
    assert list(zip(ids, mask)) == expected


def test_prompt_ids_ends_with_assistant_header():
    enc = byte_enc()
    p = sft.prompt_ids(CONV[:4], enc)
    assert p[-len("<|assistant|>\n"):] == list(b"<|assistant|>\n")
    assert p == sft.render(CONV, enc)[0][:len(p)]
