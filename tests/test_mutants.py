"""Behaviours of the periphery that mutation testing found unguarded: profiles (analysis tokens, windows), survey
(ζ_(L−2), sorting, token counts, revisions), generation and chat (temperature, stop texts, context), SFT preparation
(lengths, roles, START), the judge's and chat evaluation's caches, seeds and statistics, the run folder
(RUN@latest, resume checks, a run's own tokenizer) and export (pad token, RUN@STEP with --step). Each test fails under the mutant its docstring names."""
import ast
import dataclasses
import json
import os

import numpy as np
import pytest
import torch

from scripts import chat
from scripts import chat_eval as ce
import config as CF
import model as M
from lib import conversations as CV
from scripts import export
from lib import generation
from lib import judge as J
from scripts import prepare_sft
from lib import profiles as P
from lib import commands
import runs as R
import checkpoint as CK
from scripts import survey
from lib import tasks as TK
from lib.conversations import prompt_ids
from tokenizer import get_tokenizer
from lib.generation import generate
from test_chat import A, U, enc, random_model, run_chat, trained  # noqa: F401 (fixtures)
from test_chat import save_run as chat_run
from test_chat_eval import PROMPTS, _records, _tiny_model, fake_answers, judge_server, mt_bench  # noqa: F401
from test_evaluate import DOCS, TOK, tiny_llama, write_jsonl
from test_evaluate import save_run as eval_run
from test_export import save_run as export_run
from test_prepare_sft import conversations as sft_conversations, hf_tokenizer, prep
from test_survey import TEXT, tokenizer as bpe_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")      # conftest.py


# ---- profiles.py -------------------------------------------------------------------------------------------

def test_analysis_tokens_count_scored_tokens_not_padding():
    """Mutant: an_tokens += valid.numel() (padding counted): the second batch is never analysed."""
    windows = torch.randint(0, TOK.n_vocab, (2, 13))
    mask = torch.zeros(2, 13, dtype=torch.bool)
    mask[:, :6] = True                                                  # 5 scored tokens per window
    p = P.profile_model(tiny_llama(), [(windows[:1], mask[:1]), (windows[1:], mask[1:])], analysis_tokens=8)
    assert p["analysis_tokens"] == 10


def test_text_windows_read_past_a_document_that_ends_at_n_windows(tmp_path):
    """Mutant: `len(stream) >= n * seq_len` stops reading with n * seq_len tokens, one short of n windows."""
    lm = TK.ModelLM(tiny_llama(), TOK)
    write_jsonl(tmp_path / "d.jsonl", [{"text": "abcdefg"}, {"text": "hijklmn"}])     # 7 tokens + EOT = 2 × 4
    stream = TOK.encode("abcdefg") + [TOK.eot_token] + TOK.encode("hijklmn") + [TOK.eot_token]
    assert len(stream) == 16
    assert P.text_windows(lm, [str(tmp_path / "d.jsonl")], n=2, seq_len=4).tolist() == [stream[0:5], stream[4:9]]


def test_context_windows_score_at_least_n_tokens():
    """Mutant: have += len(window) (not the len - 1 scored tokens): a context short of n_tokens ends the list."""
    lm = TK.ModelLM(tiny_llama(), TOK)
    data = TK.TaskData("arc_easy", "x", "test", DOCS["arc_easy"], [TK.build_doc("arc_easy", d) for d in DOCS["arc_easy"]])
    first = len(TOK.encode(data.built[0]["context"].rstrip()))
    windows, mask = P.context_windows(lm, data, n_tokens=first, seq_len=64)
    assert int((mask[:, :-1] & mask[:, 1:]).sum()) >= first and len(windows) == 2


# ---- survey.py ---------------------------------------------------------------------------------------------

def _profile(zeta, zeta_normed):
    L = len(zeta) + 1                                                   # zeta: ζ_2..ζ_L
    psi = [0.1 * (l + 1) for l in range(L)]
    return {"n_layer": L, "psi": psi, "zeta": zeta, "psi_normed": psi[::-1], "zeta_normed": zeta_normed,
            "n_tokens": 64}


def test_survey_summary_takes_zeta_of_layer_L_minus_2():
    """Mutant: zeta[-2] (ζ_(L−1)). The end-to-end test cannot see it: random tiny models have raw ζ = 0 throughout."""
    s = survey.summary(_profile([2.0, 3.0, 4.0, 5.0], [20.0, 30.0, 40.0, 50.0]))     # L = 5
    assert (s["raw"]["zeta_L"], s["raw"]["zeta_L_minus_2"]) == (5.0, 3.0)
    assert (s["normed"]["zeta_L"], s["normed"]["zeta_L_minus_2"]) == (50.0, 30.0)


def test_survey_table_is_sorted_by_raw_zeta_L():
    """Mutant: sorted by the normed ζ_L (the end-to-end test's raw ζ_L are all 0, so any order passes there)."""
    def result(raw, normed):
        p = _profile([0.0, 0.0, raw], [0.0, 0.0, normed])
        return {"params": 1e6, "n_layer": 4, "profile": p, "summary": survey.summary(p), "load_s": 0, "profile_s": 0}
    text = survey.table({"a": result(0.1, 0.9), "b": result(0.5, 0.2), "c": result(0.3, 0.5)})
    assert [line.split(" | ")[0].removeprefix("| ") for line in text.splitlines()[2:]] == ["b", "c", "a"]


def _survey_run(tmp_path):
    from model import Llama, LlamaConfig
    run = tmp_path / "run"
    run.mkdir()
    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=320, n_layer=4, n_head=2, n_kv_head=1, d_model=32, ffn_hidden=64,
                              max_seq_len=64))
    torch.save({"model": model.state_dict(), "model_config": dataclasses.asdict(model.config),
                "config": {"tokenizer": "bytes"}, "step": 1}, run / "ckpt_0000001.pt")
    (tmp_path / "text.txt").write_text(TEXT)
    return str(run), str(tmp_path / "text.txt")


def test_survey_analysis_tokens_minus_one_analyses_all(tmp_path):
    """Mutant: --analysis_tokens -1 passed on as -1 (no logit lens at all) instead of None (every token)."""
    run, text = _survey_run(tmp_path)
    survey.main(["--runs", run, "--text", text, "--tokens", "32", "--seq_len", "16", "--analysis_tokens", "-1",
                 "--out", str(tmp_path / "s.json")])
    p = json.loads((tmp_path / "s.json").read_text())["models"][run]["profile"]
    assert p["analysis_tokens"] == 32 and len(p["logit_lens_loss"]) == 5


def test_survey_reads_at_most_tokens(tmp_path, capsys):
    """Mutant: ceil(tokens / seq_len) windows (48 tokens for --tokens 40). --tokens rounded down to whole windows is
    no warning; a text that runs out is. (Before: "the text gives 32 of --tokens 40" although the text held more.)"""
    run, text = _survey_run(tmp_path)
    survey.main(["--runs", run, "--text", text, "--tokens", "40", "--seq_len", "16", "--out", str(tmp_path / "s.json")])
    assert json.loads((tmp_path / "s.json").read_text())["models"][run]["profile"]["n_tokens"] == 32
    assert "warning" not in capsys.readouterr().err
    held = len(open(text, "rb").read())                    # bytes: a token a byte, plus end-of-text
    survey.main(["--runs", run, "--text", text, "--tokens", str(16 * (held // 16 + 4)), "--seq_len", "16"])
    assert f"warning: {run}: the text gives {16 * (held // 16)} of --tokens" in capsys.readouterr().err


def test_a_local_path_with_an_at_sign_is_not_a_revision(tmp_path):
    """Mutant: NAME@REVISION split even where the whole spec is an existing path."""
    (tmp_path / "model@v2").mkdir()
    m = survey.parse_model(str(tmp_path / "model@v2"), "hf")
    assert (m["path"], m["revision"], m["step"]) == (str(tmp_path / "model@v2"), None, None)


# ---- generation.py, chat.py, conversations.fit_context -----------------------------------------------------

def test_sampling_temperature_sharpens_the_distribution():
    """Mutant: logits not divided by the temperature (every test samples at temperature 1 or looks only at seeds)."""
    logits = torch.tensor([0.5, 0.3, 0.2]).log().expand(20000, 3)
    draws = generation.sample(logits, 0.5, 1.0, torch.Generator().manual_seed(0))   # ∝ p²: 0.25, 0.09, 0.04
    assert abs((draws == 0).float().mean().item() - 0.25 / 0.38) < 0.02
    draws = generation.sample(logits, 2.0, 1.0, torch.Generator().manual_seed(0))   # ∝ √p
    assert abs((draws == 0).float().mean().item() - 0.5 ** 0.5 / (0.5 ** 0.5 + 0.3 ** 0.5 + 0.2 ** 0.5)) < 0.02


def test_the_earliest_of_several_stop_texts_cuts(trained, enc):
    """Mutants: cut_at_stop_text keeping the text up to the last stop text (max(starts)); generate using only the
    first of stop_texts. Every other test passes one stop text."""
    ids = enc.encode_ordinary
    assert generation.cut_at_stop_text(ids("Hi ### x <|user|> y"), enc, ("<|user|>", "###")) == ids("Hi ")
    yes = prompt_ids([U("c")], enc)                                     # the model answers "Yes\n<|user|>\nc"
    assert generate(trained, [yes], 30, enc=enc, stop_texts=("<|user|>", "s\n"))[0] == ids("Ye")


def test_on_token_never_gets_the_token_that_completes_a_stop_text(trained, enc):
    """Mutant: on_token also called for the token that completes the stop text (chat.py would then stream it)."""
    seen = []
    out = generate(trained, [prompt_ids([U("c")], enc)], 30, enc=enc, on_token=lambda row, t: seen.append(t))[0]
    assert enc.decode(out) == "Yes\n" and enc.decode(seen).startswith("Yes\n") and "<|user|>" not in enc.decode(seen)


def test_chat_drops_old_turns_when_the_prompt_would_fill_the_context(enc, tmp_path, monkeypatch, capsys):
    """Mutant: chat.py asks fit_context for room 0: a prompt of exactly max_seq_len (64) tokens is then "too long"
    instead of losing its oldest exchange."""
    seen = []
    monkeypatch.setattr(chat, "reply", lambda model, enc, ids, args, *a: seen.append(ids) or ("ok", False))
    second = "x" * (64 - len(prompt_ids([U("a"), A("ok"), U("")], enc)))
    assert len(prompt_ids([U("a"), A("ok"), U(second)], enc)) == 64
    err = run_chat([chat_run(random_model(), tmp_path)], "a\n" + second + "\n", monkeypatch, capsys)[1]
    assert seen == [prompt_ids([U("a")], enc), prompt_ids([U(second)], enc)] and "too long" not in err


def test_a_single_message_that_fills_the_context_is_too_long(enc):
    """Mutant: fit_context accepting len(ids) == max_seq_len (generate then raises: no room for a token)."""
    msgs = [U("x" * 10)]
    n = len(prompt_ids(msgs, enc))
    assert CV.fit_context(msgs, enc, n, 1) == ([], None)
    assert CV.fit_context(msgs, enc, n + 1, 1) == (msgs, prompt_ids(msgs, enc))


# ---- prepare_sft.py -----------------------------------------------------------------------------------------

def test_a_conversation_of_exactly_seq_len_plus_one_tokens_is_not_truncated():
    """Mutant: cut_off = len(ids) >= seq_len + 1 (counted as truncated though nothing was cut)."""
    enc = get_tokenizer("bytes")
    conv = [U("hi"), A("yo")]
    n, counts = len(CV.render(conv, enc)[0]), dict.fromkeys(prepare_sft.COUNTS, 0)
    out = list(prepare_sft.conversations([("r", {"messages": conv})], enc, n - 1, counts))
    assert len(out) == 1 and len(out[0][0]) == n and counts["kept"] == 1 and counts["truncated"] == 0


def test_sharegpt_roles_of_every_assistant():
    """Mutant: "bing" (or another) left out of SHAREGPT_ROLES: its conversations become malformed."""
    for who in ("gpt", "chatgpt", "bing", "bard"):
        rec = {"conversations": [{"from": "human", "value": "q"}, {"from": who, "value": "a"}]}
        assert prepare_sft.to_messages(rec) == [U("q"), A("a")], who


def test_shard_loss_tokens_in_a_model_template_leave_out_start(tmp_path):
    """Mutant: a shard's loss_tokens = mask != 0, counting each conversation's START mark (2) as a loss token."""
    _, m = prep(tmp_path, sft_conversations(9), tokenizer=hf_tokenizer(tmp_path / "tok"))
    assert sum(e["loss_tokens"] for e in m["shards"]) == m["counts"]["loss_tokens"]
    assert m["splits"]["val"]["loss_tokens"] + m["splits"]["train"]["loss_tokens"] == m["counts"]["loss_tokens"]


# ---- judge.py -----------------------------------------------------------------------------------------------

def test_judgment_cache_names_the_judge_model_and_max_tokens_and_records_its_server(tmp_path, judge_server, capsys):
    """Mutants: the judgment's cache key without judge.model (another judge's scores reused) or max_tokens. A judgment
    records the server that made it, and reusing it for another server says so. (Before: the report named the second
    server beside the first one's scores, with nothing to tell them apart.)"""
    questions, refs = mt_bench(("writing",))
    cache = J.Cache(str(tmp_path / "c.jsonl"))
    answers = {"m": ce.answer_questions(questions, "m", "m", fake_answers(), cache, progress=False)}
    server, other = judge_server(), judge_server()
    for url, model, max_tokens, sent in ((server.url, "judge-x", 2048, 2), (server.url + "/", "judge-x", 2048, 2),
                                         (server.url, "judge-y", 2048, 4), (server.url, "judge-x", 512, 6),
                                         (other.url, "judge-x", 2048, 6)):
        records = J.judge_answers(J.Judge(url, model, backoff=0, max_tokens=max_tokens), PROMPTS, questions, answers,
                                  refs, cache, 1, progress=False)
        assert len(server.requests) == sent and {r["judge_url"] for r in records} == {server.url}, (url, model)
    assert not other.requests
    assert capsys.readouterr().err.splitlines() == [f"note: cached judgments of judge-x made at {server.url} are "
                                                    f"reused, not asked of {other.url} (another --cache judges again)"]


# ---- chat_eval.py -------------------------------------------------------------------------------------------

def test_answer_temperatures_are_fastchats():
    """Mutant: humanities at 0.7 (the other test checks writing, math and stem only). Read from FastChat's common.py."""
    tree = ast.parse(open(J.fastchat_data(os.pardir, "common.py"), encoding="utf-8").read())
    fastchat = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                    and any(getattr(t, "id", None) == "temperature_config" for t in n.targets))
    categories = {q["category"] for q in ce.load_questions(J.fastchat_data("mt_bench", "question.jsonl"))}
    assert categories <= set(ce.TEMPERATURE) and all(ce.TEMPERATURE[c] == fastchat[c] for c in ce.TEMPERATURE)


def test_answer_cache_key_names_max_new_tokens(tmp_path):
    """Mutant: the answer's cache key without max_new_tokens (answers capped at another length reused)."""
    calls, cache = [], J.Cache(str(tmp_path / "c.jsonl"))
    questions = {"vicuna": [{"question_id": 1, "category": "generic", "turns": ["Hi?"]}]}
    for n in (16, 16, 32):
        ce.answer_questions(questions, "m", "m", fake_answers(calls=calls), cache, max_new_tokens=n, progress=False)
    assert len(calls) == 2


def test_answers_are_seeded_per_conversation(monkeypatch):
    """Mutant: every conversation sampled with the same seed."""
    seeds = []
    monkeypatch.setattr(ce, "generate", lambda model, prompts, cap, **kw: seeds.append(kw["seed"]) or [[ord("a")]])
    answer = ce.model_answer_fn(_tiny_model(), get_tokenizer("bytes"), max_new_tokens=8, seed=0)
    for text in ("Hi?", "Bye?", "Hi?"):
        answer([{"role": "user", "content": text}], 0.7)
    assert seeds[0] == seeds[2] != seeds[1]


def test_an_answer_that_reaches_max_new_tokens_is_not_context_limited(monkeypatch):
    """Mutant: limit "context" whenever the answer fills its cap, also when the cap is max_new_tokens itself."""
    monkeypatch.setattr(ce, "generate", lambda model, prompts, cap, **kw: [[ord("a")] * cap])
    answer = ce.model_answer_fn(_tiny_model(max_seq_len=512), get_tokenizer("bytes"), max_new_tokens=8)
    assert answer([{"role": "user", "content": "Hi?"}], 0.0)["limit"] is None


def _rec(model, bench, qid, turn, score, category="c"):
    return {"model": model, "benchmark": bench, "question_id": qid, "turn": turn, "score": score,
            "category": category, "prompt": "single-v1"}


def test_a_score_of_zero_is_a_score():
    """Mutant: _mean keeping s > 0 (FastChat drops only -1: a judge's [[0]] counts)."""
    assert ce._mean([0.0, 10.0, -1.0]) == {"mean": 5.0, "n": 2, "unparseable": 1}


def test_average_needs_every_benchmark():
    """Mutant: the average over the benchmarks that have a mean (a benchmark left wholly unparseable drops out)."""
    recs = [_rec("A", "vicuna", 1, 1, 6.0), _rec("A", "wizardlm", 1, 1, -1.0)]
    s = ce.summarize(recs, "A", ["vicuna", "wizardlm"])
    assert s["vicuna"]["mean"] == 6.0 and s["wizardlm"]["mean"] is None and s["average"] is None


def test_mt_bench_per_turn_per_category_and_the_table_columns():
    """Mutants: per_turn over turns <= t; per_category over turn 1 only; the turn 1 / turn 2 columns swapped (the
    end-to-end test scores every answer alike)."""
    recs = [_rec("A", "mt_bench", q, t, s, c) for q, t, s, c in
            ((1, 1, 2.0, "math"), (1, 2, 4.0, "math"), (2, 1, 6.0, "writing"), (2, 2, 10.0, "writing"))]
    s = ce.summarize(recs, "A", ["mt_bench"])
    m = s["mt_bench"]
    assert (m["mean"], m["per_turn"][1]["mean"], m["per_turn"][2]["mean"]) == (5.5, 4.0, 7.0)
    assert m["per_category"] == {"math": 3.0, "writing": 8.0}
    text = ce.markdown({"benchmarks": ["mt_bench"], "judge": {"model": "j", "url": "u"}, "models": {"A": s}})
    assert "| A | 5.50 | 4.00 | 7.00 | 5.50 | 4 | 0 |" in text.splitlines()


def test_paired_difference_is_over_items_and_the_average_over_benchmarks():
    """Mutants: the difference as a mean of per-question means; the average comparison = the first benchmark's."""
    a, b = [5.0, 5.0, 5.0, -1.0], [7.0, 7.0, 4.0, 9.0]                  # items: +2, +2 (question 0), −1 (question 1)
    c = ce.paired_comparison(_records(a, b, turns=2), "A", "B", ["vicuna"], n_boot=200)
    assert c["vicuna"]["difference"] == pytest.approx(1.0)
    recs = _records([5.0] * 4, [6.0] * 4) + [{**r, "benchmark": "wizardlm"} for r in _records([5.0] * 4, [8.0] * 4)]
    c = ce.paired_comparison(recs, "A", "B", ["vicuna", "wizardlm"], n_boot=200)
    assert (c["vicuna"]["difference"], c["wizardlm"]["difference"], c["average"]["difference"]) == (1.0, 3.0, 2.0)


def test_paired_bootstrap_is_of_the_item_mean_and_a_95_percent_interval():
    """Mutants: the bootstrap of the mean of per-question means (centred away from the item mean); the 5th and 95th
    percentiles (a 90% interval labelled 95%)."""
    a, b = [5.0, 5.0] * 40, [6.0, 4.0] * 20 + [8.0, -1.0] * 20       # 20 questions of 2 items (0 in all), 20 of one (+3)
    c = ce.paired_comparison(_records(a, b, turns=2), "A", "B", ["vicuna"])["vicuna"]
    lo, hi = c["ci95"]
    assert c["difference"] == 1.0 and lo < 1.0 < hi and abs((lo + hi) / 2 - 1.0) < 0.15
    d = [0.0, 2.0] * 50                                               # one item each: mean 1, sd 1, se 0.1
    lo, hi = ce.paired_comparison(_records([5.0] * 100, [5.0 + x for x in d]), "A", "B", ["vicuna"])["vicuna"]["ci95"]
    assert 0.37 <= hi - lo <= 0.43                                    # 2 × 1.96 × 0.1; a 90% interval: 0.32


def test_paired_permutation_p_value():
    """Mutants: p = k / n (no +1: p = 0 is reported); the permuted statistic scaled per question instead of per item
    (p then depends on how many items a question has)."""
    a = [float(1 + i % 9) for i in range(40)]
    better = [s + 2 for s in a]
    assert ce.paired_comparison(_records(a, better), "A", "B", ["vicuna"], n_boot=2000)["vicuna"]["p"] == 1 / 2001
    b = [s + (2.0 if i % 3 == 0 else -0.5) for i, s in enumerate(a)]
    one = ce.paired_comparison(_records(a, b), "A", "B", ["vicuna"], n_boot=2000)["vicuna"]
    twice = ce.paired_comparison(_records([s for s in a for _ in (0, 1)], [s for s in b for _ in (0, 1)], turns=2),
                                 "A", "B", ["vicuna"], n_boot=2000)["vicuna"]     # each question's item twice
    assert 0.01 < one["p"] < 0.9 and twice["p"] == one["p"] and twice["ci95"] == pytest.approx(one["ci95"])


# ---- runs.py ------------------------------------------------------------------------------------------------

def test_init_from_latest_is_the_newest_checkpoint(tmp_path):
    """Mutant: RUN_DIR@latest (and RUN_DIR) taking the oldest checkpoint; train.py's test has one checkpoint only."""
    run = eval_run(str(tmp_path / "run"), steps=(10, 20))
    newest = torch.load(os.path.join(run, "ckpt_0000020.pt"), weights_only=False)["model"]
    for spec in (run + "@latest", run):
        state, _ = CK.init_weights(spec, "bytes")
        assert all(torch.equal(state[k], v) for k, v in newest.items()), spec


def _resume_case():
    cfg = CF.Config(model="tiny", data_dir="data/a", tokenizer="bytes", shape={"vocab_size": 320})
    mcfg = CF.model_config(cfg)
    return cfg, mcfg, {"config": dataclasses.asdict(cfg), "model_config": dataclasses.asdict(mcfg)}


def test_resume_of_a_checkpoint_without_a_data_identity_compares_the_path():
    """Mutants: a checkpoint without data_identity refused whatever the data (!= instead of `not in (None, id)`);
    data_dir free to change although there is no identity to check the data by."""
    cfg, mcfg, ckpt = _resume_case()
    assert R.check_resume(cfg, mcfg, ckpt, "ckpt", "identity-now") == {}
    with pytest.raises(SystemExit, match="data_dir: run 'data/a', now 'data/b'"):
        R.check_resume(dataclasses.replace(cfg, data_dir="data/b"), mcfg, ckpt, "ckpt", "identity-now")


def test_a_setting_the_checkpoint_predates_is_not_a_change():
    """Mutant: old.get(k) != v (a setting missing from an older checkpoint's config counts as changed and is refused).
    (The clean code takes a missing setting to equal whatever is asked now, even a non-default value.)"""
    cfg, mcfg, ckpt = _resume_case()
    del ckpt["config"]["jreg_skip_first"]
    assert R.check_resume(cfg, mcfg, ckpt, "ckpt", None) == {}


def test_a_model_setting_the_checkpoint_predates_resumes():
    """A model field added with a default after a run was written (tie_embeddings stands in for a later dropout): its
    checkpoint, without the field, resumes when the run asks the default, and is another model when it asks another
    value. (Before: model_config compared as written, so any new field stopped every older run.)"""
    cfg, mcfg, ckpt = _resume_case()
    assert mcfg.tie_embeddings == M.LlamaConfig().tie_embeddings
    del ckpt["model_config"]["tie_embeddings"]
    assert R.check_resume(cfg, mcfg, ckpt, "ckpt", None) == {}
    with pytest.raises(SystemExit, match="checkpoint ckpt is of another model"):
        R.check_resume(cfg, dataclasses.replace(mcfg, tie_embeddings=True), ckpt, "ckpt", None)


def test_load_run_reads_the_runs_own_copy_of_its_hugging_face_tokenizer(tmp_path):
    """Mutant: load_run loading config["tokenizer"] by its name, a folder that may be gone (or a hub name offline)."""
    tok = bpe_tokenizer()
    run = eval_run(str(tmp_path / "run"), steps=(1,), config={"tokenizer": f"hf:{tmp_path / 'gone'}"})
    tok.save_pretrained(os.path.join(run, "tokenizer"))
    _, enc, _ = commands.load_run(run)
    assert enc.encode_ordinary("In the beginning") == tok.encode("In the beginning", add_special_tokens=False)


# ---- export.py ----------------------------------------------------------------------------------------------

def test_export_keeps_the_own_tokenizers_pad_token(tmp_path):
    """Mutant: pad_token_id always the eos (SmolLM2, the only own tokenizer tested, pads with its eos)."""
    tok = bpe_tokenizer()
    tok.add_special_tokens({"pad_token": "<pad>"})
    tok.save_pretrained(tmp_path / "run" / "tokenizer")
    run = export_run(str(tmp_path / "run"), f"hf:{tmp_path / 'run' / 'tokenizer'}", vocab_size=320)
    export.export(run, str(tmp_path / "hf"))
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["pad_token_id"] == tok.pad_token_id != tok.eos_token_id


def test_export_refuses_run_at_step_with_another_step(tmp_path):
    """Mutant: RUN@5 parsed even with --step 10, which is then silently ignored (step 5 exported)."""
    run = export_run(str(tmp_path / "run"), steps=(5, 10))
    with pytest.raises(SystemExit):
        export.main([run + "@5", str(tmp_path / "hf"), "--step", "10"])
    assert not (tmp_path / "hf").exists()
