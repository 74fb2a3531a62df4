"""
The zero-shot tasks, built and scored exactly as lm-evaluation-harness does per request (prompts, target
delimiters, acc / acc_norm, rolling perplexity), for our models and for any Hugging Face causal LM; also read out at
every layer (early exit). Task formats: docs/evaluation.md and ../shared EVAL.md's harness references.

    lm = ModelLM(model, enc)                      # or HFModelLM(hf_model, hf_tokenizer)
    results = evaluate_tasks(lm, ["piqa", "sciq"], data_dir=None, limit=200)
"""
import ast
import json
import math
import os
import re
import sys
from collections import Counter, namedtuple

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from files import one_line
from lib.profiles import forward_streams, readout
from lib.hf import hf_max_length
from lib.progress import Progress
from tokenizer import HFTokenizer


# A task: its hub dataset (path, config) and the split the harness evaluates, with its number of documents n; build:
# document -> (context, choices, gold), or (context, target) for a loglikelihood task, (text, words, bytes) for rolling
TaskSpec = namedtuple("TaskSpec", "path config split build metrics n")
MC, MC_NORM, LAMBADA, ROLLING = ("acc",), ("acc", "acc_norm"), ("acc", "perplexity"), \
    ("word_perplexity", "byte_perplexity", "bits_per_byte")

TaskData = namedtuple("TaskData", "name source split docs built")     # built: build_doc(row) for each row (docs)


def hellaswag_preprocess(text):                       # the last replace is one pass: three spaces become two
    return re.sub(r"\[.*?\]", "", text.strip().replace(" [title]", ". ")).replace("  ", " ")


def lambada_doc(doc):
    words = doc["text"].split(" ")
    return " ".join(words[:-1]), " " + words[-1]


def boolq_doc(doc):
    label = doc["label"] if "label" in doc else doc["answer"]        # super_glue: label 0/1; google/boolq: answer
    return doc["passage"] + "\nQuestion: " + doc["question"] + "?\nAnswer:", ["no", "yes"], int(label)


def arc_doc(doc):
    text, labels = list(doc["choices"]["text"]), list(doc["choices"]["label"])
    return "Question: " + doc["question"] + "\nAnswer:", text, labels.index(doc["answerKey"])


def hellaswag_doc(doc):
    context = hellaswag_preprocess(doc["activity_label"] + ": " + doc["ctx_a"] + " " + doc["ctx_b"].capitalize())
    return context, [hellaswag_preprocess(e) for e in doc["endings"]], int(doc["label"])


def piqa_doc(doc):
    return "Question: " + doc["goal"] + "\nAnswer:", [doc["sol1"], doc["sol2"]], int(doc["label"])


def race_doc(doc):
    """Only the last problem is scored; the article's earlier problems are solved examples in the context (v3.0)."""
    problems = ast.literal_eval(doc["problems"]) if isinstance(doc["problems"], str) else doc["problems"]
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


TASKS = {
    "lambada_openai": TaskSpec("EleutherAI/lambada_openai", "default", "test", lambada_doc, LAMBADA, 5153),
    "lambada_standard": TaskSpec("cimec/lambada", None, "test", lambada_doc, LAMBADA, 5153),
    "boolq": TaskSpec("aps/super_glue", "boolq", "validation", boolq_doc, MC, 3270),
    "arc_easy": TaskSpec("allenai/ai2_arc", "ARC-Easy", "test", arc_doc, MC_NORM, 2376),
    "arc_challenge": TaskSpec("allenai/ai2_arc", "ARC-Challenge", "test", arc_doc, MC_NORM, 1172),
    "hellaswag": TaskSpec("Rowan/hellaswag", None, "validation", hellaswag_doc, MC_NORM, 10042),
    "piqa": TaskSpec("baber/piqa", None, "validation", piqa_doc, MC_NORM, 1838),
    "race": TaskSpec("EleutherAI/race", "high", "test", race_doc, MC, 1045),
    "social_iqa": TaskSpec("lighteval/siqa", None, "validation", siqa_doc, MC, 1954),
    "sciq": TaskSpec("allenai/sciq", None, "test", sciq_doc, MC_NORM, 1000),
    "swag": TaskSpec("allenai/swag", "regular", "validation", swag_doc, MC_NORM, 20006),
    "wikitext": TaskSpec("EleutherAI/wikitext_document_level", "wikitext-2-raw-v1", "test", wikitext_doc, ROLLING, 62),
}


PAPER_TASKS = ["lambada_openai", "boolq", "arc_easy", "hellaswag", "piqa", "race", "social_iqa", "sciq", "swag"]


def build_doc(task, doc):
    """One document -> {"context", "continuations", "choices", "gold"}: its requests, before the whitespace move."""
    spec = TASKS[task]
    if spec.metrics is ROLLING:                         # rolling log-likelihood of a whole document
        text, words, n_bytes = spec.build(doc)
        return {"context": None, "continuations": [text], "choices": None, "gold": None, "words": words, "bytes": n_bytes}
    if spec.metrics is LAMBADA:                         # one loglikelihood request; the target starts with " "
        context, target = spec.build(doc)
        return {"context": context, "continuations": [target], "choices": None, "gold": None}
    context, choices, gold = spec.build(doc)
    return {"context": context, "continuations": [" " + c for c in choices], "choices": choices, "gold": gold}


LOCAL_FORMATS = ("", ".jsonl", ".jsonl.gz", ".json", ".parquet")     # "": a save_to_disk folder


def parse_tasks(names):
    names = [t.strip() for t in (names.split(",") if isinstance(names, str) else names) if t.strip()]
    unknown = [t for t in names if t not in TASKS]
    if unknown or not names:
        raise SystemExit(f"error: unknown task {', '.join(unknown) or '(none given)'}; known tasks: {', '.join(TASKS)}")
    return names


def local_task_path(task, data_dir):
    for suffix in LOCAL_FORMATS:
        if os.path.exists(path := os.path.join(data_dir, task + suffix)):
            return path
    raise SystemExit(f"error: no data for task {task} in {data_dir} (looked for {task}[{'|'.join(LOCAL_FORMATS[1:])}])")


def load_task(task, data_dir=None, limit=None):
    """The first `limit` documents of the split the harness evaluates, built into requests. With data_dir, a
    manifest.json there (written by offline_tasks.py) names the split each task's data actually holds, and how the
    data differs from the harness's where it does (its "variant", reported with the split)."""
    import datasets
    spec, entry = TASKS[task], {}
    split, source = spec.split, f"{spec.path}/{spec.config}" if spec.config else spec.path
    try:
        if data_dir:
            source = local_task_path(task, data_dir)
            if os.path.exists(manifest := os.path.join(data_dir, "manifest.json")):
                with open(manifest) as f:
                    entry = json.load(f).get(task, {})
                split = entry.get("split", split)
            if os.path.isdir(source):
                ds = datasets.load_from_disk(source)
                if isinstance(ds, datasets.DatasetDict):
                    ds = next(iter(ds.values())) if len(ds) == 1 and split not in ds else ds[split]
            else:
                ds = datasets.load_dataset("parquet" if source.endswith(".parquet") else "json", data_files=source,
                                           split="train")
        else:
            ds = datasets.load_dataset(spec.path, spec.config, split=spec.split)
            if limit is None and len(ds) != spec.n:
                print(f"warning: {task} has {len(ds)} documents, the harness's split has {spec.n}", file=sys.stderr)
    except Exception as e:
        raise SystemExit(f"error: task {task}: cannot read {source} ({split} split): {one_line(e)}"
                         + ("" if data_dir else " (offline? use --data_dir)")) from e
    rows = (ds.select(range(min(limit, len(ds)))) if limit else ds).to_list()
    if not rows:
        raise SystemExit(f"error: task {task}: {source} holds no documents")
    try:
        built = [build_doc(task, r) for r in rows]
    except (KeyError, ValueError, TypeError, SyntaxError) as e:
        raise SystemExit(f"error: task {task}: a document of {source} is not in the hub's schema ({one_line(e)})")
    return TaskData(task, source, split + (f" ({entry['variant']})" if "variant" in entry else ""), rows, built)


class ModelLM:
    """Our Llama with its tokenizer, encoded as the harness encodes: encode(str) -> ids; logits(tokens) -> fp32
    [B, T, V]. tiktoken: no BOS, special-token text read as its token, EOT the prefix of an empty context. A Hugging
    Face tokenizer (a run's tokenizer.HFTokenizer, or HFModelLM's own) as HFLM: its default add_special_tokens, BOS (else
    EOS) the prefix."""

    def __init__(self, model, tokenizer, name="model", max_length=None, hf=None):
        self.model, self.tokenizer, self.name = model.eval(), tokenizer, name
        self.max_length = max_length or model.config.max_seq_len
        self.device = next(model.parameters()).device
        self.hf = hf or (tokenizer.hf if isinstance(tokenizer, HFTokenizer) else None)
        if self.hf is None:
            self.eot = self.prefix_token = tokenizer.eot_token
            return
        self.eot, bos = self.hf.eos_token_id, self.hf.bos_token_id
        self.prefix_token = bos if bos is not None else self.eot
        self._bos_text = self.hf.decode(self.prefix_token) if self.prefix_token is not None else None

    def encode(self, text, add_special_tokens=None):
        """Hugging Face: the tokenizer's default add_special_tokens (the harness's, add_bos_token unset), but no second
        BOS."""
        if self.hf is None:
            return self.tokenizer.encode(text, allowed_special="all")
        if add_special_tokens is None and self._bos_text is not None and text.startswith(self._bos_text):
            add_special_tokens = False
        kwargs = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        return self.hf.encode(text, **kwargs)

    def logits(self, tokens):
        return self.model(tokens.to(self.device)).logits.float()


class HFModelLM(ModelLM):
    """A transformers causal LM with its tokenizer, encoded and called as the harness's HFLM does (model(ids).logits,
    no mask)."""

    def __init__(self, model, tokenizer, name="hf", max_length=None):
        super().__init__(model, tokenizer, name, max_length or hf_max_length(model.config, tokenizer), hf=tokenizer)


def encode_pair(lm, context, continuation):
    """(context tokens, continuation tokens): trailing whitespace of the context moved to the continuation, the two
    encoded together and split at the context's token count. An empty context is [prefix_token]."""
    if context == "":
        cont = lm.encode(continuation, add_special_tokens=False)
        return ([lm.prefix_token], cont) if cont[:1] != [lm.prefix_token] else (cont[:1], cont[1:])
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    ctx = lm.encode(context)
    return ctx, lm.encode(context + continuation)[len(ctx):]


def score_requests(lm, requests, batch_size=16, progress=False, desc="requests", exits=None):
    """[(context, continuation)] -> [(summed log-probability, is_greedy)] in the order given (with exits, a list of them
    per request: score_tokens). A continuation that encodes to no tokens (a token spans the join) is an error, as the
    harness's assertion is."""
    encoded = []
    for context, continuation in requests:
        ctx, cont = encode_pair(lm, context, continuation)
        if not ctx:                                   # the harness asserts here too (a tokenizer adding no BOS)
            raise SystemExit(f"error: context {context!r} is only whitespace: moved into the continuation, it leaves "
                             "no token to condition on (give an empty context instead)")
        if not cont:
            raise SystemExit(f"error: continuation {continuation!r} encodes to no tokens after context "
                             f"...{context[-40:]!r} (a token spans the join; the harness fails here too)")
        encoded.append((ctx, cont))
    return score_tokens(lm, encoded, batch_size, progress, desc, exits)


def _score(logits, cont):
    """(summed fp32 log-probability of the tokens cont, whether each is the argmax) from their rows of logits."""
    logprobs = logits.float().log_softmax(-1)
    target = torch.tensor(cont, device=logprobs.device)
    return logprobs.gather(-1, target[:, None]).sum().item(), bool((logprobs.argmax(-1) == target).all())


@torch.no_grad()
def score_tokens(lm, encoded, batch_size=16, progress=False, desc="requests", exits=None):
    """[(context tokens, continuation tokens)] -> [(summed log-probability, is_greedy)]. A request's input is
    (context + continuation)[-(max_length + 1):][:-1]; its score, the fp32 log-softmax of the last len(continuation)
    positions gathered and summed; is_greedy: every argmax is the continuation's token. Requests with the same input
    (BoolQ's " yes" / " no") share one forward, like the harness's one-token cache. Inputs are sorted longest first
    and right-padded with token 0, batch_size per forward.
    exits: layers to read the model out at (None or L: its own logits; l < L: head(norm(h_l)), the logit lens, at the
    continuation's positions only); each result is then a list of (log-probability, is_greedy), one per exit, all
    from the one forward of each batch (forward_streams)."""
    inputs = {}                                           # model input -> [(request index, continuation)]
    for i, (ctx, cont) in enumerate(encoded):
        if len(cont) > lm.max_length:
            raise SystemExit(f"error: a continuation of {len(cont)} tokens is longer than max_length {lm.max_length}")
        inputs.setdefault(tuple((ctx + cont)[-(lm.max_length + 1):][:-1]), []).append((i, cont))
    order = sorted(inputs, key=lambda x: (-len(x), x))
    results = [None] * len(encoded)
    with Progress(total=len(encoded), desc=desc, unit="request", enabled=progress) as bar:   # lines in a log too
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            tokens = pad_sequence([torch.tensor(x) for x in chunk], batch_first=True)        # right-padded with 0
            reqs = [(i, cont, row, len(x) - len(cont), len(x)) for row, x in enumerate(chunk) for i, cont in inputs[x]]
            if exits is None:
                logits = lm.logits(tokens)
                for i, cont, row, a, b in reqs:
                    results[i] = _score(logits[row, a:b], cont)
            else:
                logits, hidden, _ = forward_streams(lm.model, tokens.to(lm.device))
                rows = torch.tensor([row for _, _, row, a, b in reqs for _ in range(a, b)], device=logits.device)
                pos = torch.tensor([p for *_, a, b in reqs for p in range(a, b)], device=logits.device)
                per_exit, picked = [], [h[rows, pos] for h in hidden]      # the scored positions of every stream
                for l in exits:
                    if l is None or l == len(hidden) - 1:
                        per_exit.append([_score(logits[row, a:b], cont) for _, cont, row, a, b in reqs])
                    else:
                        lens = readout(lm.model, picked[l], picked).split([b - a for *_, a, b in reqs])
                        per_exit.append([_score(lg, cont) for lg, (_, cont, *_) in zip(lens, reqs)])
                for k, (i, *_) in enumerate(reqs):
                    results[i] = [scores[k] for scores in per_exit]
            bar.update(len(reqs))
    return results


def rolling_windows(tokens, prefix_token, max_length):
    """The harness's disjoint windows for a rolling log-likelihood (context_len = 1): window 1 is [prefix] -> the first
    max_length tokens; each next one predicts the next max_length tokens (or what is left) after the max_length
    tokens before its last prediction. Every token is predicted exactly once."""
    windows, done = [([prefix_token], tokens[:max_length])] if tokens else [], min(max_length, len(tokens))
    while done < len(tokens):
        end = min(done + max_length, len(tokens))
        windows.append((tokens[end - max_length - 1:done], tokens[done:end]))
        done = end
    return windows


def score_rolling(lm, texts, batch_size=16, progress=False, desc="rolling", exits=None):
    """[text] -> [summed log-probability of every token of the text] (with exits: a list, one per exit), each text
    scored on its own."""
    windows = [(d, w) for d, text in enumerate(texts)
               for w in rolling_windows(lm.encode(text), lm.prefix_token, lm.max_length)]
    totals = [[0.0] * len(exits or [None]) for _ in texts]
    for (d, _), scores in zip(windows, score_tokens(lm, [w for _, w in windows], batch_size, progress, desc, exits)):
        for k, (ll, _) in enumerate(scores if exits else [scores]):
            totals[d][k] += ll
    return totals if exits else [t[0] for t in totals]


def mc_metrics(lls, choices, gold):
    """acc and acc_norm (ll / characters of the choice) of one multiple-choice document; np.argmax: the first index
    wins a tie; a gold index out of range counts as wrong, as in the harness."""
    gold = gold if gold < len(choices) else -100
    return {"acc": float(np.argmax(lls) == gold),
            "acc_norm": float(np.argmax([ll / len(c) for ll, c in zip(lls, choices)]) == gold)}


def class_rates(docs):
    """(chance, majority) of a task's built documents, the baselines printed beside its accuracy: chance is the mean
    of 1 / number of choices (the expected acc of a uniform guess; LAMBADA 0), majority the share of the documents
    whose gold answer is the most frequent gold answer (the acc of always giving that answer: BoolQ's yes or no, a
    multiple-choice task's gold index, LAMBADA's last word; a gold index out of range is nobody's answer).
    (None, None) for a perplexity task."""
    if not docs or docs[0]["context"] is None:
        return None, None
    if docs[0]["choices"] is None:                        # LAMBADA: the target word
        return 0.0, Counter(d["continuations"][0] for d in docs).most_common(1)[0][1] / len(docs)
    golds = Counter(d["gold"] for d in docs if 0 <= d["gold"] < len(d["choices"]))
    return (float(np.mean([1 / len(d["choices"]) for d in docs])),
            (golds.most_common(1)[0][1] if golds else 0) / len(docs))


def mean_stderr(values):
    """Mean and sample std (ddof = 1) / sqrt(n), as the harness; stderr is None for n < 2."""
    values = np.asarray(values, dtype=np.float64)
    stderr = float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else None
    return float(values.mean()), stderr


def evaluate_tasks(lm, tasks, data_dir=None, limit=None, batch_size=16, log_samples=False, progress=True,
                   task_data=None, on_task=None, exits=None):
    """Score `lm` on `tasks`: {"results": {task: metrics}, "average": {...}, "samples": {...} (log_samples)}.
    task_data: {task: TaskData} already loaded (several models share one load); on_task(partial output) is called
    after each task (the command line writes --out there). exits: layers at which the model is read out as well, in
    the same forwards (score_tokens): adds "early_exit": [{"layer", "results", "average"}] and "chance" (the
    expected acc of a uniform guess per multiple-choice task; LAMBADA 0). Every task's results hold its "chance" and
    "majority" rates on the documents scored (class_rates), a perplexity task's none."""
    out = {"results": {}, "average": None, **({"samples": {}} if log_samples else {})}
    if exits:
        out.update(early_exit=[{"layer": l, "results": {}, "average": None} for l in exits], chance={})
    views = [None] + list(exits) if exits else None       # None: the model's own logits (the normal evaluation)
    for task in parse_tasks(tasks):
        data = (task_data or {}).get(task) or load_task(task, data_dir, limit)
        spec, docs = TASKS[task], data.built
        if spec.metrics is ROLLING:                       # scores[doc][request][view] = (ll, is_greedy)
            texts = [d["continuations"][0] for d in docs]
            scores = [[[(ll, None) for ll in (lls if views else [lls])]]
                      for lls in score_rolling(lm, texts, batch_size, progress, task, views)]
        else:
            flat = iter(score_requests(lm, [(d["context"], c) for d in docs for c in d["continuations"]], batch_size,
                                       progress, task, views))
            scores = [[next(flat) if views else [next(flat)] for _ in d["continuations"]] for d in docs]
        out["results"][task], samples = task_metrics(task, data, [[r[0] for r in d] for d in scores], log_samples)
        out["average"] = average(out["results"])
        if log_samples:
            out["samples"][task] = samples
        for k, row in enumerate(out.get("early_exit", []), start=1):
            result, _ = task_metrics(task, data, [[r[k] for r in d] for d in scores])
            row["results"][task] = {m: v for m, v in result.items() if m not in ("split", "source")}
            row["average"] = average(row["results"])
        if exits and spec.metrics is not ROLLING:
            out["chance"][task] = out["results"][task]["chance"]
        if on_task:
            on_task(out)
    return out


def task_metrics(task, data, scores, log_samples=False):
    """(metrics, samples) of one task from scores[doc][request] = (summed log-likelihood, is_greedy)."""
    spec, docs, per_doc, samples = TASKS[task], data.built, [], []
    for i, (doc, doc_scores) in enumerate(zip(docs, scores)):
        lls, greedy = [s[0] for s in doc_scores], [s[1] for s in doc_scores]
        metrics = (mc_metrics(lls, doc["choices"], doc["gold"]) if doc["choices"] is not None
                   else {"acc": float(greedy[0])} if spec.metrics is LAMBADA else {})       # LAMBADA: all greedy
        per_doc.append({**metrics, "ll": lls[0]})
        if log_samples:
            samples.append({"doc_index": i, "requests": [[c] if doc["context"] is None else [doc["context"], c]
                            for c in doc["continuations"]], "loglikelihoods": lls, "is_greedy": greedy,
                            "gold": doc["gold"], **metrics})
    result = {"n": len(docs), "split": data.split, "source": data.source}
    if spec.metrics is not ROLLING:                       # the baselines of these documents (class_rates)
        result["chance"], result["majority"] = class_rates(docs)
    for m in ("acc", "acc_norm"):
        if m in spec.metrics:
            result[m], result[m + "_stderr"] = mean_stderr([r[m] for r in per_doc])
    total = sum(r["ll"] for r in per_doc)
    if "perplexity" in spec.metrics:                      # per word: exp(-mean of the target words' ll)
        result["perplexity"] = math.exp(-total / len(docs))
    if spec.metrics is ROLLING:                           # summed over documents, counted on the raw pages
        words, n_bytes = sum(d["words"] for d in docs), sum(d["bytes"] for d in docs)
        result.update(word_perplexity=math.exp(-total / words), byte_perplexity=math.exp(-total / n_bytes),
                      bits_per_byte=-total / n_bytes / math.log(2))
    return result, samples


def average(results):
    """The paper's average: the mean of acc over the tasks reporting it (and of acc_norm likewise); with the tasks'
    rates, the mean chance and majority rate over the same tasks as acc."""
    accs = [r["acc"] for r in results.values() if "acc" in r]
    norms = [r["acc_norm"] for r in results.values() if "acc_norm" in r]
    out = {"acc": float(np.mean(accs)) if accs else None, "n_tasks": len(accs),
           "acc_norm": float(np.mean(norms)) if norms else None, "n_tasks_acc_norm": len(norms)}
    for m in ("chance", "majority"):
        if accs and all(r.get(m) is not None for r in results.values() if "acc" in r):
            out[m] = float(np.mean([r[m] for r in results.values() if "acc" in r]))
    return out
