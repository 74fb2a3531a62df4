"""What a newcomer following the manual meets: every page starts from what the quick start leaves (or says which page
to run first, with the exact override), no command writes to a fixed path under /tmp that two users of one machine
would share, long work shows progress in a log as well as on a terminal, chat_eval.py explains an empty comparison and
leaves no lock file after a clean run, and evaluate.py prints huge perplexities readably (CPU, offline, seconds)."""
import glob
import io
import os
import re
import subprocess
import time

import pytest
import torch

import data as D
import files as FILES
import evaluate as E
from lib import judge as J
from lib import progress as P
from lib.profiles import profile_model
from scripts import chat_eval as ce
from test_chat_eval import PROMPTS, FakeJudge, _fake_runs, fake_answers, mt_bench   # tests/ is on sys.path

pytestmark = pytest.mark.usefixtures("one_thread")      # conftest.py
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(*parts):
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as f:
        return f.read()


# ---- 1. every page starts from the quick start's runs, or says which page to run first --------------------------

def test_pages_using_the_reproductions_runs_give_the_quick_start_override_at_their_top():
    """(Before: finetuning.md, layers.md, evaluation.md and export.md used out/kjv/base and out/kjv/jreg_a1, which
    only reproduction.md makes; someone who ran only quickstart.sh was told no override, or only further down.)"""
    qs = read("quickstart.sh")
    assert 'OUT=${OUT:-out/quickstart}' in qs and '--out_dir="$OUT/base"' in qs and '--out_dir="$OUT/jreg"' in qs
    for page in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))):
        text = read(page)
        if os.path.basename(page) == "reproduction.md" or not re.search(r"out/kjv/(base|jreg_a1)\b", text):
            continue
        top = text.split("```", 1)[0]                    # what a reader sees before the first command
        assert "out/quickstart/" in top and "reproduction.md" in top, page
    training = read("docs", "training.md").split("```", 1)[0]   # configs/tiny.py reads data/kjv, made in data.md
    assert "data/kjv" in training and "data.md" in training
    fine = read("docs", "finetuning.md")
    assert "--init_from=out/quickstart/base" in fine and "--init_from=out/quickstart/jreg" in fine
    for name, run in (("sft_kjv.py", "base"), ("sft_kjv_jreg.py", "jreg")):
        assert f"--init_from=out/quickstart/{run}" in read("configs", name), name


# ---- 2. no fixed path under /tmp ---------------------------------------------------------------------------------

def test_no_command_writes_to_a_fixed_path_under_tmp():
    """Two users of one machine would write over each other's /tmp/plots, /tmp/smol/hf, /tmp/sharegpt.jsonl, ...
    (Before: 36 lines of docs/ and scripts/gpu_check.sh named such paths.) The replacements lie in folders of
    the repository that git ignores."""
    files = ["README.md", "quickstart.sh"] + [os.path.relpath(p, ROOT) for pattern in (
        "docs/*.md", "scripts/*", "configs/*.py", "results/*.py", "results/*/*.py") for p in glob.glob(
        os.path.join(ROOT, pattern)) if os.path.isfile(p)]
    found = [f"{f}: {line.strip()}" for f in files for line in read(f).splitlines()
             if re.search(r"(?<![\w<>.])/tmp/\w", line)]
    assert not found, "\n".join(found)
    used = ["out/plots/psi_profiles.png", "data/kjv_genesis.txt", "data/sharegpt.jsonl",
            "hf/smollm2-135m-instruct/config.json", "out/gpu_check/summary.md", "out/gpu_check_work/x"]
    assert all(subprocess.run(["git", "check-ignore", "-q", p], cwd=ROOT).returncode == 0 for p in used)


# ---- 3. progress in a log as well as on a terminal ----------------------------------------------------------------

class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_off_a_terminal_is_plain_lines(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    log = io.StringIO()
    with P.Progress(total=3, desc="work", file=log, every=0) as bar:     # every=0: a line per item
        for _ in range(3):
            bar.update()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and [line.split(",")[0] for line in lines] == [
        "work: 1/3 (33%)", "work: 2/3 (67%)", "work: 3/3 (100%)", "work: 3/3 done in 0 s"]
    slow = io.StringIO()                                 # one slow item: the heartbeat speaks while it works
    with P.Progress(total=1, desc="slow", file=slow, every=0.05) as bar:
        time.sleep(0.4)
        assert slow.getvalue().count("slow: 0/1") >= 2
        bar.update()
    assert slow.getvalue().splitlines()[-1].startswith("slow: 1/1 done in")
    assert list(P.progress(range(4), "quick", file=(q := io.StringIO()))) == [0, 1, 2, 3] and q.getvalue() == ""


def test_progress_on_a_terminal_is_tqdm_and_other_ranks_are_silent(monkeypatch):
    tty = Terminal()
    with P.Progress(total=2, desc="bar", file=tty) as bar:
        bar.update(2)
    assert "\r" in tty.getvalue() and "2/2" in tty.getvalue()
    monkeypatch.setenv("RANK", "1")                      # torchrun: rank 0 speaks for all
    quiet = io.StringIO()
    with P.Progress(total=2, desc="bar", file=quiet, every=0) as bar, P.timed("saving", file=quiet):
        bar.update(2)
    assert quiet.getvalue() == ""
    monkeypatch.setenv("RANK", "0")
    said = io.StringIO()
    with P.timed("saving x", file=said):
        pass
    assert said.getvalue().splitlines() == ["saving x ...", "saving x: done in 0 s"]
    assert [P.duration(s) for s in (0.4, 59.6, 139, 3725)] == ["0 s", "1 min 0 s", "2 min 19 s", "1 h 2 min"]


def _tiny_llama(n_layer=3, vocab_size=64):
    from model import Llama, LlamaConfig
    torch.manual_seed(0)
    return Llama(LlamaConfig(vocab_size=vocab_size, n_layer=n_layer, n_head=2, n_kv_head=1, d_model=32, ffn_hidden=64,
                             max_seq_len=64)).eval()


def test_the_layer_analyses_show_progress_within_a_batch(monkeypatch, capsys):
    """(Before: a 30-layer model's 139 s of logit lens and skipped blocks sat behind one `1/1` bar.) One batch, three
    layers: the analyses are 4 read-outs and 3 skipped blocks, each a step a log shows."""
    monkeypatch.setattr(P, "EVERY_S", 0)
    windows = [torch.randint(0, 64, (2, 17))]
    p = profile_model(_tiny_llama(), windows, analysis_tokens=None, progress=True)
    err = capsys.readouterr().err
    assert len(p["logit_lens_loss"]) == 4 and "\r" not in err
    assert [line.split(",")[0] for line in err.splitlines() if line.startswith("layer analysis")][-2:] == [
        "layer analysis of batch 1 (logit lens and skipped blocks): 7/7 (100%)",
        "layer analysis of batch 1 (logit lens and skipped blocks): 7/7 done in 0 s"]
    assert "profile: 1/1 done in" in err
    profile_model(_tiny_llama(), windows, analysis_tokens=None, progress=False)
    assert capsys.readouterr().err == ""


def test_answers_and_judging_show_progress_in_a_log(tmp_path, monkeypatch, capsys):
    """(Before: tqdm with disable=None: nothing at all where stderr is a file.)"""
    monkeypatch.setattr(P, "EVERY_S", 0)
    questions, refs = mt_bench(("writing",))
    cache = J.Cache(str(tmp_path / "c.jsonl"))
    answers = {"m": ce.answer_questions(questions, "m", "m", fake_answers(), cache)}
    server = FakeJudge()
    try:
        J.judge_answers(J.Judge(server.url, "judge-x", backoff=0), PROMPTS, questions, answers, refs, cache, 1)
    finally:
        server.close()
    err = capsys.readouterr().err
    assert "answers m: 2/2 done in" in err and "judging (judge-x): 2/2 done in" in err and "\r" not in err


def _hf_folder(tmp_path):
    from lib.hf import llama_to_hf
    path = tmp_path / "tiny_hf"
    llama_to_hf(_tiny_llama(2, vocab_size=320)).save_pretrained(path)   # room for the 257 byte tokens
    return str(path)


def test_loading_a_hugging_face_model_says_when_it_starts_and_how_long_it_took(tmp_path, capsys):
    """(Before: a GGUF load of 27 s, the start of a retrofit or a survey, said nothing.)"""
    from lib.hf import load_hf
    from scripts import convert_hf
    path = _hf_folder(tmp_path)
    with pytest.raises(SystemExit):                      # no tokenizer in the folder: the load fails, in one line
        load_hf(path)
    assert "loading Hugging Face model" in capsys.readouterr().err
    convert_hf.main([f"hf:{path}", str(tmp_path / "converted"), "--tokenizer", "bytes"])   # before a retrofit
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hf:")]
    assert torch.load(tmp_path / "converted" / "ckpt_0000000.pt")["model_config"]["n_layer"] == 2
    assert err[0] == f"hf:{path}: loading the weights ..."
    assert err[1].startswith(f"hf:{path}: loading the weights: done in ")


# ---- 4. chat_eval.py: an empty comparison says why; the cache's name; no lock file after a clean run ------------

def test_a_comparison_without_a_single_scored_pair_says_why_in_one_line(tmp_path, monkeypatch, capsys):
    """(Before: a table header with no rows when the judge never gave a rating.)"""
    runs = _fake_runs(tmp_path, monkeypatch, [])
    server = FakeJudge(lambda n, body: (200, "I'm thrilled to share my travel blog post."))
    try:
        assert ce.main(runs + ["--benchmarks", "mt_bench", "--limit", "1", "--judge_url", server.url,
                               "--judge_model", "j", "--out", str(tmp_path / "chat.json")]) == 0
    finally:
        server.close()
    out = capsys.readouterr().out
    assert "| benchmark | difference |" not in out
    assert ("jreg − base: no comparison: no item has a score from both models (base: 0 judged, 2 unparseable; "
            "jreg: 0 judged, 2 unparseable)") in out.splitlines()


def test_a_clean_run_leaves_no_lock_file_and_the_cache_is_named_as_documented(tmp_path, monkeypatch, capsys):
    """(Before: chat.json.lock and chat.cache.jsonl.lock stayed beside the outputs; finetuning.md said the cache was
    OUT.cache.jsonl, which it is not for --out chat.json.)"""
    runs = _fake_runs(tmp_path, monkeypatch, [])
    assert ce.main(runs[:1] + ["--benchmarks", "mt_bench", "--limit", "1", "--out", str(tmp_path / "chat.json")]) == 0
    assert sorted(os.listdir(tmp_path)) == ["base", "chat.cache.jsonl", "chat.json", "jreg"]
    fine = read("docs", "finetuning.md")
    assert "OUT.cache.jsonl" not in fine and "`--out chat.json`: `chat.cache.jsonl`" in fine
    capsys.readouterr()
    with pytest.raises(SystemExit):
        ce.parse_args(["--help"])
    assert "OUT.cache.jsonl" not in capsys.readouterr().out


def test_a_lock_file_removed_by_its_holder_is_never_held_twice(tmp_path, monkeypatch):
    """The holder removes its lock file at a clean end; a process that opened the file just before must not then
    lock the removed file while a third one locks a new file of that name."""
    path = str(tmp_path / "out.json.lock")
    first = FILES.lock_file(path, "held ({holder})")
    flock, done = FILES.fcntl.flock, []

    def late(f, op):                                     # the first process ends cleanly between open and flock
        if not done:
            done.append(FILES.release_lock(first))
        return flock(f, op)
    monkeypatch.setattr(FILES.fcntl, "flock", late)
    second = FILES.lock_file(path, "held ({holder})")
    monkeypatch.setattr(FILES.fcntl, "flock", flock)
    assert os.stat(path).st_ino == os.fstat(second.fileno()).st_ino
    with pytest.raises(SystemExit, match=f"held \\(pid {os.getpid()}"):
        FILES.lock_file(path, "held ({holder})")
    FILES.release_lock(second)
    assert not os.path.exists(path)


# ---- 5. evaluate.py's tables: large values for reading, the JSON untouched ----------------------------------------

def _result(ppl, acc):
    return {"results": {"lambada_openai": {"acc": acc, "acc_stderr": 0.01, "perplexity": ppl, "n": 10,
                                           "split": "test"}},
            "average": {"acc": acc, "acc_norm": None, "n_tasks": 1, "n_tasks_acc_norm": 0}}


def test_huge_perplexities_print_in_three_significant_digits():
    """(Before: `188251185.23` and a Δ of `-90236256.9075`.)"""
    two = E.results_table({"base": _result(188251185.23, 0.0), "jreg": _result(98014928.3225, 0.1)})
    row = next(line for line in two.splitlines() if "| perplexity |" in line)
    assert row == "| lambada_openai | perplexity | 1.88e+08 | 9.80e+07 | -9.02e+07 |"
    assert "| lambada_openai | acc | 0.0000 ± 0.0100 | 0.1000 ± 0.0100 | +0.1000 |" in two
    one = E.results_table({"base": _result(188251185.23, 0.0)})
    assert "| lambada_openai | test | 10 | 0.0000 ± 0.0100 | – | 1.88e+08 |" in one
    small = E.results_table({"base": _result(42.094, 0.3), "jreg": _result(40.0, 0.3)})
    assert "| lambada_openai | perplexity | 42.09 | 40.00 | -2.0940 |" in small
    exits = {"results": {"wikitext": {}}, "chance": {}, "early_exit": [
        {"layer": 0, "results": {"wikitext": {"word_perplexity": 3.2e9}}, "average": {"acc": None, "acc_norm": None}}]}
    assert "| 0 | 3.20e+09 | – | – |" in E.early_exit_table("m", exits)
