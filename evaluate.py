"""
Zero-shot tasks scored exactly as lm-evaluation-harness scores them (also read out at every layer: early exit), and
layer profiles (Ψ, ζ, logit lens, skipped blocks), for our checkpoints and for any Hugging Face causal LM. Options,
output schema, numbers: README, "Evaluation". A user error (bad option, missing file, unreadable checkpoint) is one
`error:` line and exit status 1.

    python evaluate.py out/base                                       # the paper's nine tasks, latest checkpoint
    python evaluate.py out/base out/jreg --limit 500 --out cmp.json   # one table, a column per model, Δ = 2nd − 1st
    python evaluate.py --hf gpt2 --tasks lambada_openai,hellaswag --log_samples --out gpt2.json
    python evaluate.py --hf DIR --gguf model.gguf --data_dir tasks_offline --limit 200   # offline_tasks.py builds DIR
    python evaluate.py out/base out/jreg --profile --plot plots/      # Ψ profiles on the runs' validation windows
    python evaluate.py out/base --profile --all_ckpts --plot plots/   # ζ_L over training
    python evaluate.py out/base out/jreg --tasks piqa,sciq --exit_layers all --plot plots/   # early exit at every layer
    python evaluate.py out/sft_base --profile                         # a fine-tuning run: its val conversations
"""
import argparse
import ast
import importlib.util
import json
import math
import os
import re
import sys
from collections import namedtuple

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from tqdm import tqdm

import jreg
import sft
import train
from model import Llama, LlamaConfig
from prepare_fineweb import get_tokenizer, list_shards, read_shard, write_atomic


def _first_line(e, limit=240):
    """An exception as one line: its type and its message with the line breaks folded, cut at `limit` characters."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:limit] + '…' if len(text) > limit else text}"


# ==========================================================================================================
# 1. Tasks: a document -> (context, choices, gold), or (context, target) for LAMBADA, as the harness's YAMLs build it

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


# A task: its hub dataset (path, config) and the split the harness evaluates, with its number of documents n; build:
# document -> (context, choices, gold), or (context, target) for a loglikelihood task, (text, words, bytes) for rolling
TaskSpec = namedtuple("TaskSpec", "path config split build metrics n")
MC, MC_NORM, LAMBADA, ROLLING = ("acc",), ("acc", "acc_norm"), ("acc", "perplexity"), \
    ("word_perplexity", "byte_perplexity", "bits_per_byte")
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


# ==========================================================================================================
# 2. Task data: the hub by default, or --data_dir files with the hub's column names (read by `datasets`)

LOCAL_FORMATS = ("", ".jsonl", ".jsonl.gz", ".json", ".parquet")     # "": a save_to_disk folder
TaskData = namedtuple("TaskData", "name source split docs built")     # built: build_doc(row) for each row (docs)


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
    manifest.json there (written by offline_tasks.py) names the split each task's data actually holds."""
    import datasets
    spec = TASKS[task]
    split, source = spec.split, f"{spec.path}/{spec.config}" if spec.config else spec.path
    try:
        if data_dir:
            source = local_task_path(task, data_dir)
            manifest = os.path.join(data_dir, "manifest.json")
            if os.path.exists(manifest):
                with open(manifest) as f:
                    split = json.load(f).get(task, {}).get("split", split)
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
        raise SystemExit(f"error: task {task}: cannot read {source} ({split} split): {_first_line(e)}"
                         + ("" if data_dir else " (offline? use --data_dir)")) from e
    rows = (ds.select(range(min(limit, len(ds)))) if limit else ds).to_list()
    if not rows:
        raise SystemExit(f"error: task {task}: {source} holds no documents")
    try:
        built = [build_doc(task, r) for r in rows]
    except (KeyError, ValueError, TypeError, SyntaxError) as e:
        raise SystemExit(f"error: task {task}: a document of {source} is not in the hub's schema ({_first_line(e)})")
    return TaskData(task, source, split, rows, built)


# ==========================================================================================================
# 3. Models: one small interface (encode, logits, max_length, eot, prefix_token) for our runs and for transformers

class ModelLM:
    """Our Llama with a tiktoken tokenizer: encode(str) -> ids (no BOS), logits(tokens) -> fp32 [B, T, V]."""

    def __init__(self, model, tokenizer, name="model"):
        self.model, self.tokenizer, self.name = model.eval(), tokenizer, name
        self.max_length = model.config.max_seq_len
        self.eot = self.prefix_token = tokenizer.eot_token    # the context of an empty-context request, as the harness
        self.device = next(model.parameters()).device

    def encode(self, text, add_special_tokens=None):
        return self.tokenizer.encode(text, allowed_special="all")

    @torch.no_grad()
    def logits(self, tokens):
        return self.model(tokens.to(self.device)).logits.float()


class HFModelLM(ModelLM):
    """A transformers causal LM, encoded and called as the harness's HFLM does (model(ids).logits, no mask)."""

    def __init__(self, model, tokenizer, name="hf", max_length=None):
        self.model, self.tokenizer, self.name = model.eval(), tokenizer, name
        self.max_length = max_length or hf_max_length(model.config, tokenizer)
        self.eot = tokenizer.eos_token_id
        self.prefix_token = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        self._bos_text = tokenizer.decode(self.prefix_token) if self.prefix_token is not None else None
        self.device = next(model.parameters()).device

    def encode(self, text, add_special_tokens=None):
        """The tokenizer's default add_special_tokens (the harness's, add_bos_token unset), but no second BOS."""
        if add_special_tokens is None and self._bos_text is not None and text.startswith(self._bos_text):
            add_special_tokens = False
        kwargs = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        return self.tokenizer.encode(text, **kwargs)


def hf_max_length(config, tokenizer=None, default=2048):
    """As the harness: n_positions, max_position_embeddings, n_ctx (text_config first), model_max_length, 2048."""
    cfg = getattr(config, "text_config", None) or config
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        if getattr(cfg, attr, None) is not None:
            return int(getattr(cfg, attr))
    mml = getattr(tokenizer, "model_max_length", None)
    return int(mml) if mml is not None and mml != 1000000000000000019884624838656 else default


def checkpoint_path(run_dir, step=None):
    """The path of the checkpoint of `step` (default: the latest) in a run folder (train.list_checkpoints)."""
    ckpts = dict(train.list_checkpoints(run_dir))
    if not ckpts:
        raise SystemExit(f"error: no checkpoints (ckpt_*.pt) in {run_dir}")
    if step is not None and step not in ckpts:
        raise SystemExit(f"error: --step {step}: no such checkpoint in {run_dir} (steps: {sorted(ckpts)})")
    return ckpts[max(ckpts) if step is None else step]


def load_run(run_dir, step=None, device="cpu", dtype=torch.float32, tokenizer=None):
    """(model, tokenizer, meta) of the latest checkpoint of a run folder, or of `step`; train.py's checkpoint format.
    tokenizer: a tiktoken Encoding to use instead of get_tokenizer(the run's config["tokenizer"])."""
    ckpt = train.load_checkpoint(path := checkpoint_path(run_dir, step))
    model = Llama(LlamaConfig(**ckpt["model_config"]))
    model.load_state_dict(ckpt["model"])
    config = ckpt.get("config") or {}
    meta = {"run_dir": run_dir, "checkpoint": path, "step": ckpt.get("step", step), "tokens": ckpt.get("tokens"),
            "config": config, "model_config": ckpt["model_config"]}
    return model.to(device=device, dtype=dtype).eval(), tokenizer or get_tokenizer(config.get("tokenizer", "gpt2")), meta


def _hf_kwargs(gguf_file=None, revision=None):
    return {k: v for k, v in (("gguf_file", gguf_file), ("revision", revision)) if v}


def hf_name(name_or_path, gguf_file=None, revision=None):
    """How messages name a Hugging Face model: the folder or hub name, its GGUF file, @revision."""
    return (os.path.join(name_or_path, gguf_file) if gguf_file else name_or_path) + (f"@{revision}" if revision else "")


def check_hf_source(path, gguf_file=None, revision=None, local=False):
    """A local model (a path, or `local`) must exist and be a Hugging Face folder or a GGUF file there, and takes no
    revision (from_pretrained ignores it for a folder); a hub name is checked when it is loaded."""
    if not (local or os.path.isabs(path) or path.startswith(".") or os.path.exists(path)):
        return
    where = hf_name(path, gguf_file)
    if revision:
        raise SystemExit(f"error: {where}@{revision}: a revision is a hub branch, tag or commit, but {where} is local "
                         "(give the folder of that checkpoint instead)")
    if gguf_file and not os.path.isfile(where):
        raise SystemExit(f"error: GGUF file {where} does not exist")
    if not os.path.isdir(path):
        raise SystemExit(f"error: Hugging Face model folder {path} does not exist")
    if not gguf_file and not os.path.isfile(os.path.join(path, "config.json")):
        run = " (a run folder of train.py: give it without --hf)" if train.list_checkpoints(path) else ""
        raise SystemExit(f"error: {path} is not a Hugging Face model folder: it has no config.json{run}")


def load_hf(name_or_path, gguf_file=None, device="cpu", dtype=torch.float32, revision=None):
    """A transformers causal LM and its tokenizer; gguf_file and revision (a hub branch, tag or commit, e.g. Pythia's
    "step1000") are passed to both from_pretrained calls. A failure (missing, offline, not a causal LM, broken files,
    out of memory) is one error line naming the model and the part that failed."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    kwargs, part = _hf_kwargs(gguf_file, revision), "tokenizer"
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
        part = "weights"
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, **kwargs).to(device).eval()
    except Exception as e:
        raise SystemExit(f"error: could not load the {part} of Hugging Face model "
                         f"{hf_name(name_or_path, gguf_file, revision)}: {_first_line(e)}") from e
    return model, tokenizer


def max_length_of(kind, path, step=None, gguf_file=None):
    """The longest input of a model before loading its weights: a run's max_seq_len, an HF config's positions."""
    if kind == "run":
        return train.load_checkpoint(checkpoint_path(path, step))["model_config"]["max_seq_len"]
    from transformers import AutoConfig
    try:
        return hf_max_length(AutoConfig.from_pretrained(path, **_hf_kwargs(gguf_file)))
    except Exception as e:
        raise SystemExit(f"error: could not load the config of Hugging Face model {hf_name(path, gguf_file)}: "
                         f"{_first_line(e)}") from e


def profile_target(hf_model):
    """What to profile for a Hugging Face model: our Llama when it converts (raw streams from our code), else itself."""
    if type(hf_model).__name__ == "LlamaForCausalLM":
        try:
            return Llama.from_hf(hf_model).to(next(hf_model.parameters()).device).eval()
        except NotImplementedError:
            pass
    return hf_model


# ==========================================================================================================
# 4. Scoring requests: the harness's loglikelihood

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
        if not cont:
            raise SystemExit(f"error: continuation {continuation!r} encodes to no tokens after context "
                             f"...{context[-40:]!r} (a token spans the join; the harness fails here too)")
        encoded.append((ctx, cont))
    return score_tokens(lm, encoded, batch_size, progress, desc, exits)


def _score(logits, cont):
    """(summed fp32 log-probability of the tokens cont, whether each is the argmax) from their rows of logits."""
    logprobs = F.log_softmax(logits.float(), dim=-1)
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
    bar = tqdm(total=len(encoded), desc=desc, disable=not progress)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        tokens = pad_sequence([torch.tensor(x) for x in chunk], batch_first=True)        # right-padded with 0
        reqs = [(i, cont, row, len(x) - len(cont), len(x)) for row, x in enumerate(chunk) for i, cont in inputs[x]]
        if exits is None:
            logits = lm.logits(tokens)
            for i, cont, row, a, b in reqs:
                results[i] = _score(logits[row, a:b], cont)
            bar.update(len(reqs))
            continue
        logits, hidden, _ = forward_streams(lm.model, tokens.to(lm.device))
        rows = torch.tensor([row for _, _, row, a, b in reqs for _ in range(a, b)], device=logits.device)
        pos = torch.tensor([p for *_, a, b in reqs for p in range(a, b)], device=logits.device)
        per_exit = []
        for l in exits:
            if l is None or l == len(hidden) - 1:
                per_exit.append([_score(logits[row, a:b], cont) for _, cont, row, a, b in reqs])
            else:
                lens = readout(lm.model, hidden[l][rows, pos]).split([b - a for *_, a, b in reqs])
                per_exit.append([_score(lg, cont) for lg, (_, cont, *_) in zip(lens, reqs)])
        for k, (i, *_) in enumerate(reqs):
            results[i] = [scores[k] for scores in per_exit]
        bar.update(len(reqs))
    bar.close()
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
    windows, owner = [], []
    for d, text in enumerate(texts):
        for w in rolling_windows(lm.encode(text), lm.prefix_token, lm.max_length):
            windows.append(w)
            owner.append(d)
    totals = [[0.0] * len(exits or [None]) for _ in texts]
    for d, scores in zip(owner, score_tokens(lm, windows, batch_size, progress, desc, exits)):
        for k, (ll, _) in enumerate(scores if exits else [scores]):
            totals[d][k] += ll
    return totals if exits else [t[0] for t in totals]


# ==========================================================================================================
# 5. Metrics and the task loop

def mc_metrics(lls, choices, gold):
    """acc and acc_norm (ll / characters of the choice) of one multiple-choice document; np.argmax: the first index
    wins a tie; a gold index out of range counts as wrong, as in the harness."""
    gold = gold if gold < len(choices) else -100
    return {"acc": float(np.argmax(lls) == gold),
            "acc_norm": float(np.argmax([ll / len(c) for ll, c in zip(lls, choices)]) == gold)}


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
    expected acc of a uniform guess per multiple-choice task; LAMBADA 0)."""
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
            out["chance"][task] = float(np.mean([1 / len(d["choices"]) if d["choices"] else 0.0 for d in docs]))
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
    """The paper's average: the mean of acc over the tasks reporting it (and of acc_norm likewise)."""
    accs = [r["acc"] for r in results.values() if "acc" in r]
    norms = [r["acc_norm"] for r in results.values() if "acc_norm" in r]
    return {"acc": float(np.mean(accs)) if accs else None, "n_tasks": len(accs),
            "acc_norm": float(np.mean(norms)) if norms else None, "n_tasks_acc_norm": len(norms)}


# ==========================================================================================================
# 6. Layer profiles: Ψ and ζ (jreg.Profile), the logit lens and skipped blocks, from one forward's hidden states

def blocks_and_norm(model):
    """The block list and final norm of our Llama or a transformers causal LM (Llama, Qwen, Gemma, GPT-2, NeoX...)."""
    inner = getattr(model, "model", None)
    for obj in (model, inner, getattr(inner, "decoder", None), getattr(model, "transformer", None),
                getattr(model, "gpt_neox", None)):
        layers = next((getattr(obj, a) for a in ("layers", "h") if hasattr(obj, a)), None)
        norm = next((getattr(obj, a) for a in ("norm", "ln_f", "final_layer_norm") if hasattr(obj, a)), None)
        if layers is not None and norm is not None:
            return layers, norm
    raise SystemExit(f"error: cannot find the blocks and final norm of {type(model).__name__} for a layer profile")


def forward_streams(model, idx, skip=None):
    """(logits, [h_0..h_L] raw residual streams, h_L after the final norm) of one forward. Our Llama returns them;
    otherwise forward hooks record the first block's input, each block's output and the final norm's output.
    skip = i: block i (0-based) passes its input through unchanged."""
    if isinstance(model, Llama) and skip is None:
        out = model(idx)
        return out.logits, list(out.hidden_states), out.final_hidden
    layers, norm = blocks_and_norm(model)
    hidden, normed = [None] * (len(layers) + 1), [None]

    def block_output(i):
        def hook(module, args, kwargs, output):
            x = args[0] if args else kwargs["hidden_states"]
            hidden[0] = x if i == 0 else hidden[0]
            if i == skip:
                output = x if torch.is_tensor(output) else (x,) + tuple(output[1:])
            hidden[i + 1] = output if torch.is_tensor(output) else output[0]
            return output
        return hook

    handles = [norm.register_forward_hook(lambda m, a, o: normed.__setitem__(0, o))]
    handles += [layer.register_forward_hook(block_output(i), with_kwargs=True) for i, layer in enumerate(layers)]
    try:
        logits = model(idx).logits
    finally:
        for h in handles:
            h.remove()
    return logits, hidden, normed[0]


def readout(model, h):
    """The logits of a hidden state read through the final norm and the LM head (the logit lens)."""
    head = model.lm_head if isinstance(model, Llama) else model.get_output_embeddings()
    return head(blocks_and_norm(model)[1](h))


def skip_block_logits(model, idx, hidden, i):
    """The logits with block i's (0-based) update removed: our Llama reruns only the blocks above it from h_i."""
    if not isinstance(model, Llama):
        return forward_streams(model, idx, skip=i)[0]
    x, cos, sin = hidden[i], model.rope_cos[:idx.size(1)], model.rope_sin[:idx.size(1)]
    for block in model.layers[i + 1:]:
        x = block(x, cos, sin)
    return readout(model, x)


def loss_sum(logits, targets, valid):
    """Summed next-token cross-entropy over the valid positions (fp32)."""
    ce = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none")
    return (ce * valid.flatten()).sum()


@torch.no_grad()
def profile_model(model, windows, analysis_tokens=None, progress=False):
    """The layer profile of `model` (our Llama, or a transformers causal LM through hooks) over `windows`.

    windows: iterable of LongTensor [B, T + 1], or (windows, mask) with mask True on real tokens (right padding):
    the model reads w[:, :-1] and is scored on w[:, 1:], as train.py's eval; or (x, y, real) of sft.PackedStream:
    Ψ over the real tokens and the loss over the targets y != -1, as train.py's eval of a fine-tuning run, plus
    "assistant": the profile over the positions whose next token is a loss target (the assistant's answers).
    Ψ, ζ and the loss: jreg.Profile, token-weighted over all batches (psi: Ψ_1..Ψ_L, zeta: ζ_2..ζ_L, empty for one
    layer). On the first `analysis_tokens` scored tokens (whole batches; None: all; 0: none): logit_lens_loss
    (h_0..h_L) and skip_block_loss_increase (blocks 1..L: the loss with that block's update removed, minus the loss)."""
    model.eval()
    device = next(model.parameters()).device
    profile, assistant, sums, an_tokens = jreg.Profile(), jreg.Profile(), None, 0   # sums: loss, tokens, lens, skips
    for batch in tqdm(windows, desc="profile", disable=not progress):
        if isinstance(batch, (tuple, list)) and len(batch) == 3:          # packed conversations
            x, y, real = (t.to(device) for t in batch)
            psi_mask, valid, y = real.bool(), y != -1, y.clamp(min=0)
        else:
            w, mask = batch if isinstance(batch, (tuple, list)) else (batch, torch.ones_like(batch, dtype=torch.bool))
            w, mask = w.to(device), mask.to(device).bool()
            x, y, valid = w[:, :-1], w[:, 1:], mask[:, :-1] & mask[:, 1:]     # the positions read that have a target
            psi_mask = valid
        logits, hidden, final_hidden = forward_streams(model, x)
        loss = loss_sum(logits, y, valid)
        profile.add(hidden, final_hidden, mask=psi_mask, loss_sum=loss, n_loss=valid.sum())
        if psi_mask is not valid:
            assistant.add(hidden, final_hidden, mask=valid, loss_sum=loss, n_loss=valid.sum())
        if analysis_tokens is None or an_tokens < analysis_tokens:
            an_tokens += int(valid.sum())
            per_layer = [loss_sum(readout(model, h), y, valid) for h in hidden]
            per_layer += [loss_sum(skip_block_logits(model, x, hidden, i), y, valid) for i in range(len(hidden) - 1)]
            batch_sums = torch.stack([loss, valid.sum(), *per_layer]).double()
            sums = batch_sums if sums is None else sums + batch_sums
    if profile.sums is None:
        raise SystemExit("error: no tokens to profile")
    out = profile.result()
    if assistant.sums is not None:
        out["assistant"] = assistant.result()
    if sums is not None:
        L, n, base = out["n_layer"], sums[1], sums[0] / sums[1]
        out.update(analysis_tokens=int(n), analysis_loss=float(base), logit_lens_loss=(sums[2:3 + L] / n).tolist(),
                   skip_block_loss_increase=(sums[3 + L:] / n - base).tolist())
    return out


# ---- windows for profiles: a run's validation windows (train.val_windows), text files, or a task's contexts

def text_windows(lm, files, n, seq_len):
    """The first n (or fewer) windows of seq_len + 1 tokens, seq_len apart as train.val_windows cuts them, of text
    files (.txt: one document; .jsonl[.gz] / .json: each record's `text`), each document followed by end-of-text."""
    import datasets
    stream = []
    for path in files:
        kind = "json" if path.endswith((".jsonl", ".jsonl.gz", ".json")) else "text"
        for row in datasets.load_dataset(kind, data_files=path, split="train", streaming=True,
                                         **({"sample_by": "document"} if kind == "text" else {})):
            if len(stream) > n * seq_len:
                break
            stream += lm.encode(row["text"]) + ([lm.eot] if lm.eot is not None else [])
    n = max(0, min(n, (len(stream) - 1) // seq_len))
    return torch.tensor([stream[i * seq_len:(i + 1) * seq_len + 1] for i in range(n)]).long().view(-1, seq_len + 1)


def context_windows(lm, task_data, n_tokens, seq_len):
    """A task's contexts, each one window (its last seq_len + 1 tokens), right-padded: (windows, mask)."""
    seqs, have = [], 0
    for doc in task_data.built:
        seqs.append(lm.encode(doc["context"].rstrip())[-(seq_len + 1):])
        have += len(seqs[-1]) - 1
        if have >= n_tokens:
            break
    return (pad_sequence([torch.tensor(s) for s in seqs], batch_first=True),
            pad_sequence([torch.ones(len(s), dtype=torch.bool) for s in seqs], batch_first=True))


# ==========================================================================================================
# 7. Reports: markdown tables and plots

METRIC_ORDER = ("acc", "acc_norm", "perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte")


def _fmt(result, m):
    v, se = result.get(m), result.get(m + "_stderr")
    if v is None:
        return "–"
    if se is not None:
        return f"{v:.4f} ± {se:.4f}"
    return f"{v:.2f}" if m in ("perplexity", "word_perplexity") else f"{v:.4f}"


def results_table(models):
    """models: {name: evaluate_tasks output}. One model: a row per task; several: a column per model and Δ."""
    names = list(models)
    tasks = [t for t in TASKS if any(t in models[n]["results"] for n in names)]
    if len(names) == 1:
        lines = ["| task | split | n | acc | acc_norm | perplexity |", "|---|---|---|---|---|---|"]
        for t, r in ((t, models[names[0]]["results"][t]) for t in tasks):
            ppl = (f"word {r['word_perplexity']:.2f}, byte {r['byte_perplexity']:.4f}, bpb {r['bits_per_byte']:.4f}"
                   if "word_perplexity" in r else _fmt(r, "perplexity"))
            lines.append(f"| {t} | {r['split']} | {r['n']} | {_fmt(r, 'acc')} | {_fmt(r, 'acc_norm')} | {ppl} |")
        avg = models[names[0]]["average"]
        if avg["acc"] is not None:
            norm = f"{avg['acc_norm']:.4f} ({avg['n_tasks_acc_norm']} tasks)" if avg["acc_norm"] is not None else "–"
            lines.append(f"| **average** (acc, {avg['n_tasks']} tasks) | | | {avg['acc']:.4f} | {norm} | |")
        return "\n".join(lines)
    lines = ["| task | metric | " + " | ".join(names) + f" | Δ ({names[1]} − {names[0]}) |",
             "|---|---|" + "---|" * (len(names) + 1)]
    for t, m in ((t, m) for t in tasks for m in METRIC_ORDER):
        res = [models[n]["results"].get(t, {}) for n in names]
        if any(m in r for r in res):
            vals = [r.get(m) for r in res]
            delta = f"{vals[1] - vals[0]:+.4f}" if None not in vals[:2] else "–"
            lines.append(f"| {t} | {m} | " + " | ".join(_fmt(r, m) for r in res) + f" | {delta} |")
    avgs = [models[n]["average"]["acc"] for n in names]
    if None not in avgs:
        lines.append("| **average** | acc | " + " | ".join(f"{a:.4f}" for a in avgs) + f" | {avgs[1] - avgs[0]:+.4f} |")
    return "\n".join(lines)


def early_exit_table(name, entry):
    """A row per exit layer: acc / acc_norm of each task read out at that layer, and the averages; then chance."""
    tasks, chance = list(entry["results"]), entry["chance"]
    num = lambda v: "–" if v is None else f"{v:.3f}"                                      # noqa: E731
    lines = [f"**{name}**: early exit, h_l read through the final norm and the LM head (acc / acc_norm)", "",
             "| exit layer | " + " | ".join(tasks) + " | average acc | average acc_norm |",
             "|---" * (len(tasks) + 3) + "|"]
    for row in entry["early_exit"]:
        cells = [" / ".join(num(r[m]) for m in ("acc", "acc_norm") if m in r) or "–" for r in row["results"].values()]
        lines.append(f"| {row['layer']} | " + " | ".join(cells) + f" | {num(row['average']['acc'])} | "
                     f"{num(row['average']['acc_norm'])} |")
    avg = np.mean(list(chance.values())) if chance else None
    return "\n".join(lines + ["| chance | " + " | ".join(num(chance.get(t)) for t in tasks) + f" | {num(avg)} | |"])


def _layer(values, l, first=1, fmt=".2f"):
    """The value of layer l in a list that starts at layer `first`, or "–" (ζ starts at layer 2; a short model)."""
    return format(values[l - first], fmt) if first <= l < first + len(values) else "–"


def profile_table(profiles):
    """A row of headline numbers per model, then per model a row per layer: Ψ (raw, normed h_L, without position 0)
    and, where analysed, the logit-lens loss and the loss increase when the block is skipped."""
    lines = ["| model | layers | tokens | loss | Ψ_L | Ψ_(L-1) | ζ_L | ζ_(L-2) | ζ_L normed | window |",
             "|---" * 10 + "|"]
    for name, p in profiles.items():
        L, psi, zeta = p["n_layer"], p["psi"], p["zeta"]
        lines.append(f"| {name} | {L} | {p['n_tokens']} | {p['loss']:.4f} | {_layer(psi, L, fmt='.4f')} | "
                     f"{_layer(psi, L - 1, fmt='.4f')} | {_layer(zeta, L, 2)} | {_layer(zeta, L - 2, 2)} | "
                     f"{_layer(p['zeta_normed'], L, 2)} | {p.get('seq_len', '–')} |")
    for name, p in profiles.items():
        lines += ["", f"**{name}**" + (f": logit lens and skipped blocks on the first {p['analysis_tokens']} tokens "
                                       f"(loss there {p['analysis_loss']:.4f})" if "analysis_tokens" in p else ""), "",
                  "| layer | Ψ raw | Ψ normed | Ψ raw, skip first | logit-lens loss | skip-block Δloss |",
                  "|---" * 6 + "|"]
        columns = [(p["psi"], 1, ".4f"), (p["psi_normed"], 1, ".4f"), (p.get("psi_skip_first", []), 1, ".4f"),
                   (p.get("logit_lens_loss", []), 0, ".3f"), (p.get("skip_block_loss_increase", []), 1, "+.4f")]
        for l in range(1, p["n_layer"] + 1):
            lines.append(f"| {l} | " + " | ".join(_layer(v, l, first, fmt) for v, first, fmt in columns) + " |")
    return "\n".join(lines) + "\n"


def _zeta_l(p, key="zeta"):
    return p[key][-1] if p[key] else float("nan")


def plot_profiles(profiles, out_dir, series=None, exits=None):
    """psi_profiles.png (Ψ per layer, raw and normed h_L), layer_analysis.png (logit lens, skipped blocks); given
    series {run: profiles of its checkpoints}, zeta_over_checkpoints.png (ζ_L, ζ_(L−2) against the step); given exits
    {model: evaluate_tasks output with early_exit}, early_exit.png (average accuracy per exit layer, beside the logit
    lens loss of the profiled models)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figures = {"psi_profiles.png": plt.subplots(1, 2, figsize=(11, 4))} if profiles else {}
    for ax, key, title in zip(figures["psi_profiles.png"][1] if profiles else [], ("psi", "psi_normed"),
                              ("raw residual stream h_L", "final-normed h_L (HF convention)")):
        for name, p in profiles.items():
            layers = range(1, p["n_layer"] + 1)
            zeta_l, dashed = _zeta_l(p, key.replace("psi", "zeta")), p.get(key + "_skip_first", [np.nan] * len(layers))
            line, = ax.plot(layers, p[key], marker="o", ms=3, label=f"{name} (ζ_L={zeta_l:.2f})")
            ax.plot(layers, dashed, ls="--", lw=1, color=line.get_color())
        ax.set(title=f"Ψ_l, {title}\n(dashed: without the first token)", xlabel="layer l",
               ylabel="Ψ_l = (1 − cos(h_{l−1}, h_l)) / 2")
    analysed = {name: p for name, p in profiles.items() if "logit_lens_loss" in p}

    def lens_panel(ax):
        for name, p in analysed.items():
            ax.plot(range(p["n_layer"] + 1), p["logit_lens_loss"], marker="o", ms=3, label=name)
        ax.set(title="logit lens: loss of head(norm(h_l))", xlabel="layer l (0 = embedding)", ylabel="cross-entropy",
               yscale="log")

    if analysed:
        fig, axes = figures["layer_analysis.png"] = plt.subplots(1, 2, figsize=(11, 4))
        lens_panel(axes[0])
        for name, p in analysed.items():
            axes[1].plot(range(1, p["n_layer"] + 1), p["skip_block_loss_increase"], marker="o", ms=3, label=name)
        axes[1].set(title="loss increase when block l is skipped", xlabel="block l", ylabel="Δ cross-entropy")
        axes[1].set_yscale("symlog", linthresh=1e-2)
    if series:
        fig, ax = figures["zeta_over_checkpoints.png"] = plt.subplots(figsize=(6, 4))
        for name, points in series.items():
            steps = [pt["step"] for pt in points]
            line, = ax.plot(steps, [_zeta_l(pt) for pt in points], marker="o", label=f"{name} ζ_L")
            ax.plot(steps, [pt["zeta"][pt["n_layer"] - 4] if pt["n_layer"] >= 4 else np.nan for pt in points],
                    marker="s", ls="--", color=line.get_color(), label=f"{name} ζ_(L−2)")
        ax.set(xlabel="training step", ylabel="jump rate ζ (raw h_L)", title="the final-layer jump during pre-training")
    if exits:                                             # accuracy per exit layer, beside the logit lens loss
        panels = 1 + bool(analysed)
        fig, axes = figures["early_exit.png"] = plt.subplots(1, panels, figsize=(5.5 * panels, 4), squeeze=False)
        axes = axes[0]
        for name, e in exits.items():
            layers, avgs = [r["layer"] for r in e["early_exit"]], [r["average"] for r in e["early_exit"]]
            line, = axes[0].plot(layers, [a["acc"] for a in avgs], marker="o", ms=3, label=f"{name} acc")
            if avgs[0]["acc_norm"] is not None:
                axes[0].plot(layers, [a["acc_norm"] for a in avgs], ls="--", color=line.get_color(), label=f"{name} acc_norm")
        chance = next(iter(exits.values()))["chance"]
        axes[0].axhline(np.mean(list(chance.values())), color="gray", ls=":", label="chance (average)")
        axes[0].set(title="early exit: tasks scored on head(norm(h_l))", xlabel="exit layer l (0 = embedding)",
                    ylabel=f"average accuracy ({len(next(iter(exits.values()))['results'])} tasks)")
        if analysed:
            lens_panel(axes[1])
    for file, (fig, axes) in figures.items():
        for ax in np.ravel(axes):
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, file), dpi=120)
        plt.close(fig)
    return [os.path.join(out_dir, file) for file in figures]


# ==========================================================================================================
# 8. Command line: every option checked, and the outputs proven writable, before any model is loaded

def _int_at_least(minimum):
    def parse(text):
        value = int(text)                                 # "nan", "1.5": argparse's "invalid int value"
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {value}")
        return value
    parse.__name__ = "int"
    return parse


def _exit_layers(text):
    layers = text if text == "all" else sorted({int(t) if t.strip().isdigit() else -1 for t in text.split(",")})
    if layers != "all" and layers[0] < 0:
        raise argparse.ArgumentTypeError(f"'all' or comma-separated layers >= 0, got {text!r}")
    return layers


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.error = lambda message: sys.exit(f"error: {message}")      # one line and exit status 1, as every user error
    count = _int_at_least(1)
    p.add_argument("runs", nargs="*", help="run folders holding ckpt_*.pt (the latest is evaluated)")
    p.add_argument("--hf", help="a Hugging Face causal LM: hub name or local folder")
    p.add_argument("--gguf", help="a GGUF file inside --hf's folder, passed as gguf_file= to from_pretrained")
    p.add_argument("--step", type=_int_at_least(0), help="this checkpoint step of each run, not the latest")
    p.add_argument("--tasks", help=f"comma-separated (default: {','.join(PAPER_TASKS)}; with --profile: none)")
    p.add_argument("--data_dir", help="tasks from DIR/<task>[.jsonl|.jsonl.gz|.json|.parquet] (offline_tasks.py)")
    p.add_argument("--limit", type=count, help="only the first N documents of each task")
    p.add_argument("--batch_size", type=count, default=16, help="requests (or profile windows) per forward")
    p.add_argument("--out", help="write the results JSON here (rewritten after each task and model)")
    p.add_argument("--log_samples", action="store_true", help="store per-document requests and log-likelihoods")
    p.add_argument("--exit_layers", type=_exit_layers, help="also score the tasks read out at these layers (all, or "
                   "e.g. 4,8,12; 0 = the embedding): h_l through the final norm and LM head, in the same forwards")
    p.add_argument("--profile", action="store_true", help="layer profiles: Ψ, ζ, logit lens, skipped blocks")
    p.add_argument("--shards", help="profile on the val windows of this data folder (default for a run: its data_dir)")
    p.add_argument("--text", nargs="+", help="profile on these text files (.txt, .jsonl/.json with a text field)")
    p.add_argument("--profile_task", help="profile on the contexts of this task")
    p.add_argument("--profile_tokens", type=count, default=32768, help="tokens read by the model for Ψ / ζ")
    p.add_argument("--analysis_tokens", type=_int_at_least(-1), default=4096,
                   help="tokens for the logit lens and skipped blocks (whole batches; 0: off, -1: all profile tokens)")
    p.add_argument("--seq_len", type=_int_at_least(2), default=1024, help="profile window length (at most max_length)")
    p.add_argument("--all_ckpts", action="store_true", help="profile every checkpoint of each run (ζ over training)")
    p.add_argument("--plot", help="write PNG charts into this folder")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (default: cuda if available)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    return p.parse_args(argv)


def check_writable(path, option, folder=False):
    """Create the folder and write a probe file there (for --out: write_atomic's temporary file), or exit."""
    probe = os.path.join(path, ".probe.tmp") if folder else os.path.abspath(path) + ".tmp"
    try:
        if not folder and os.path.isdir(path):
            raise IsADirectoryError(21, "is a folder")
        os.makedirs(os.path.dirname(probe), exist_ok=True)
        open(probe, "w").close()
        os.remove(probe)
    except OSError as e:
        raise SystemExit(f"error: {option} {path} cannot be written: {e.strerror or e}")


def check_device(device):
    """auto -> cuda if available, else cpu; anything but cpu, mps, or an available cuda / cuda:N is an error."""
    device = device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.startswith("cuda")
    if not re.fullmatch(r"cpu|mps|cuda(:\d+)?", device) or (cuda and not torch.cuda.is_available()):
        raise SystemExit(f"error: --device {device}: choose cpu, mps, or cuda / cuda:N where CUDA is available")
    return device


def check_args(args):
    """Everything that can be checked without a model; returns the task list."""
    args.device = check_device(args.device)
    if not args.runs and not args.hf:
        raise SystemExit("error: give one or more run folders or --hf NAME_OR_PATH")
    if args.gguf and not args.hf:
        raise SystemExit("error: --gguf needs --hf DIR")
    if args.step is not None and not args.runs:
        raise SystemExit("error: --step selects a checkpoint of a run folder; no run folder given")
    tasks = parse_tasks(args.tasks) if args.tasks else ([] if args.profile else PAPER_TASKS)
    if args.profile_task:
        parse_tasks([args.profile_task])
    for run_dir in args.runs:
        checkpoint_path(run_dir, args.step)
    if args.hf:
        check_hf_source(args.hf, args.gguf)
    if args.profile and args.hf and not (args.shards or args.text or args.profile_task):
        raise SystemExit("error: --profile of --hf needs --shards, --text or --profile_task")
    for path in [args.shards, args.data_dir] + (args.text or []):
        if path and not os.path.exists(path):
            raise SystemExit(f"error: {path} does not exist")
    if args.out:
        check_writable(args.out, "--out")
    if args.exit_layers and not tasks:
        raise SystemExit("error: --exit_layers reads the tasks out at each layer: give --tasks")
    if args.plot and (not (args.profile or args.exit_layers) or importlib.util.find_spec("matplotlib") is None):
        raise SystemExit("error: --plot draws layer analyses: it needs --profile or --exit_layers, and matplotlib")
    if args.plot:
        check_writable(args.plot, "--plot", folder=True)
    return tasks


PROBE = ("The quick brown fox, isn't it?  It's 3.14159 -- or 1,000,000!\n\n\tdef f(x): return x**2  # naïve café, "
         "Ünïcödé, 中文, русский, 😀\n   spaces   and 'quotes' ")


def shards_tokenizer(lm, source):
    """The tokenizer the val shards of `source` were written with (their header), if the transformers tokenizer of
    `lm` is that one: it has the shards' end-of-text id, decodes every id of their vocabulary to the same text and
    encodes PROBE to the same ids. Any other tokenizer is refused in one line: its Ψ and ζ would be meaningless."""
    files = ([os.path.join(source, e["file"]) for e in sft.read_manifest(source)["shards"] if e["split"] == "val"]
             if sft.is_conversations(source) else list_shards(source, "val"))
    if not files:
        raise SystemExit(f"error: --profile: {source} has no val shards")
    name, tok = read_shard(files[0])[1]["tokenizer"], lm.tokenizer
    enc = get_tokenizer(name)
    ids = list(range(enc.n_vocab))
    if len(tok) < enc.n_vocab:
        why = f"it has {len(tok)} tokens, the shards' {enc.n_vocab}"
    elif tok.eos_token_id != enc.eot_token:
        why = f"its end-of-text id is {tok.eos_token_id}, the shards' {enc.eot_token}"
    elif tok.decode(ids, clean_up_tokenization_spaces=False) != enc.decode(ids):
        why = "its ids decode to other text"
    elif tok.encode(PROBE, add_special_tokens=False) != enc.encode(PROBE):
        why = "it encodes a probe text to other ids"
    else:
        return name
    raise SystemExit(f"error: --profile: {source} holds {name} tokens, but the tokenizer of {lm.name} is not {name} "
                     f"({why}); profile it on --text, which every model encodes itself")


def profile_windows(args, lm, meta, task_data, seq_len, tokenizer=None):
    """The windows a model is profiled on, in batches of --batch_size: by default a run's own validation windows
    (train.val_windows, the windows of train.py's periodic eval), else --shards, --text or --profile_task. Shards
    must hold the model's tokenizer's ids: a run's tiktoken name, or `tokenizer` (shards_tokenizer) for --hf."""
    n, source, mask = max(1, args.profile_tokens // seq_len), args.text or args.profile_task or args.shards, None
    if args.text:
        windows = text_windows(lm, args.text, n, seq_len)
    elif args.profile_task:
        windows, mask = context_windows(lm, task_data[args.profile_task], args.profile_tokens, seq_len)
    else:
        if not (source := source or meta["config"].get("data_dir")):
            raise SystemExit(f"error: --profile: the run {meta['run_dir']} names no data_dir; give --shards or --text")
        tokenizer = lm.tokenizer.name if meta else tokenizer
        if sft.is_conversations(source):                  # conversations: the val windows of a fine-tuning run
            val = sft.PackedStream(source, "val", seq_len, 0, tokenizer, lm.model.config.vocab_size)
            x, y, real = val.batch(0, min(n, val.per_epoch))
            return list(zip(x.split(args.batch_size), y.split(args.batch_size), real.split(args.batch_size)))
        windows = train.val_windows(source, tokenizer, lm.model.config.vocab_size, seq_len, n)
    if len(windows) == 0:
        raise SystemExit(f"error: --profile: {source} holds fewer than {seq_len + 1} tokens (one window)")
    mask = torch.ones_like(windows, dtype=torch.bool) if mask is None else mask
    return list(zip(windows.split(args.batch_size), mask.split(args.batch_size)))


def evaluate_model(args, name, kind, path, tasks, task_data, report, save, seq_len=None):
    """Load one model, score the tasks and profile it on windows of seq_len tokens (None: --seq_len, at most the
    model's max_length); report[name] is filled as results come in."""
    device, dtype = args.device, getattr(torch, args.dtype)
    if kind == "run":
        model, tokenizer, meta = load_run(path, args.step, device, dtype)
        lm, target = ModelLM(model, tokenizer, name), model
        source = {k: meta[k] for k in ("run_dir", "checkpoint", "step", "tokens")}
    else:
        hf_model, hf_tokenizer = load_hf(path, args.gguf, device, dtype)
        lm, meta = HFModelLM(hf_model, hf_tokenizer, name), None
        target = profile_target(hf_model) if args.profile else None
        source = {"hf": path, "gguf": args.gguf, "class": type(hf_model).__name__}
    report[name] = entry = {"source": {**source, "max_length": lm.max_length}}
    if args.profile:                                       # checked before any task is scored
        seq_len = seq_len or min(args.seq_len, lm.max_length)
        if seq_len > lm.max_length:
            raise SystemExit(f"error: --profile: {name} reads at most {lm.max_length} tokens, not {seq_len}")
        shards = None if kind == "run" or args.text or args.profile_task else shards_tokenizer(lm, args.shards)
    if exits := args.exit_layers:                          # checked against the depth as soon as it is known
        n_layer = len(blocks_and_norm(lm.model)[0])
        exits = list(range(n_layer + 1)) if exits == "all" else exits
        if exits[-1] > n_layer:
            raise SystemExit(f"error: --exit_layers {exits[-1]}: {name} has layers 0 (the embedding) to {n_layer}")
    if tasks:
        evaluate_tasks(lm, tasks, batch_size=args.batch_size, log_samples=args.log_samples, task_data=task_data,
                       on_task=lambda partial: (entry.update(partial), save()), exits=exits)
    if not args.profile:
        return
    batches = profile_windows(args, lm, meta, task_data, seq_len, shards)
    analysis = None if args.analysis_tokens == -1 else args.analysis_tokens
    entry["profile"] = {**profile_model(target, batches, analysis_tokens=analysis, progress=True), "seq_len": seq_len}
    save()
    ckpts = train.list_checkpoints(path) if kind == "run" else []
    if args.all_ckpts or (args.plot and len(args.runs) == 1 and not args.hf and len(ckpts) > 1):
        entry["profile_checkpoints"] = points = []
        for step, _ in ckpts:                             # ζ over training: the same windows at every checkpoint
            model, _, meta = load_run(path, step, device, dtype, tokenizer=lm.tokenizer)
            points.append({"step": step, "tokens": meta["tokens"], "checkpoint": meta["checkpoint"],
                           **profile_model(model, batches, analysis_tokens=0)})
            print(f"{name} step {step}: ζ_L = {_zeta_l(points[-1]):.2f} (raw h_L)")
            save()


def main(argv=None):
    args = parse_args(argv)
    tasks = check_args(args)
    data_tasks = list(dict.fromkeys(tasks + ([args.profile_task] if args.profile_task else [])))
    task_data = {t: load_task(t, args.data_dir, args.limit) for t in data_tasks}
    models = {}                                            # name (the folder's, or the path if taken) -> (kind, path)
    for kind, path in [("run", r) for r in args.runs] + ([("hf", args.hf)] if args.hf else []):
        name = os.path.basename(os.path.normpath(args.gguf if kind == "hf" and args.gguf else path))
        models[path if name in models or not name else name] = (kind, path)
    config, report = {**vars(args), "tasks": tasks}, {}      # every option, as resolved
    seq_len = None
    if args.profile and len(models) > 1:                 # one window length for all: the same windows
        lengths = {name: max_length_of(kind, path, args.step, args.gguf) for name, (kind, path) in models.items()}
        config["profile_seq_len"] = seq_len = min(args.seq_len, *lengths.values())
        if short := [f"{name} ({n})" for name, n in lengths.items() if n < args.seq_len]:
            print(f"profile windows: {seq_len} tokens for every model (--seq_len {args.seq_len}; max_length of "
                  f"{', '.join(short)})", file=sys.stderr)

    def save(complete=False):                            # --out is rewritten whenever a result comes in
        if not args.out:
            return
        if len(models) == 1:
            out = {"model": next(iter(models)), "config": config, **report.get(next(iter(models)), {})}
        else:
            out = {"config": config, "models": report}
            if tasks and len(report) >= 2 and all("results" in e for e in list(report.values())[:2]):
                a, b = (e["results"] for e in list(report.values())[:2])            # Δ = second − first
                out["difference"] = {t: {m: b[t][m] - a[t][m] for m in METRIC_ORDER if m in a[t] and m in b[t]}
                                     for t in a if t in b}
        write_atomic(args.out, json.dumps({**out, "complete": complete}, indent=1))
        if complete:
            print(f"wrote {args.out}")

    for name, (kind, path) in models.items():
        evaluate_model(args, name, kind, path, tasks, task_data, report, save, seq_len)
    save(complete=True)
    if tasks:
        print(results_table(report))
    exits = {name: e for name, e in report.items() if "early_exit" in e}
    for name, e in exits.items():
        print("\n" + early_exit_table(name, e))
    profiles = {}                                          # a fine-tuning run's profile: all tokens, then its answers
    for name, p in ((name, e["profile"]) for name, e in report.items() if "profile" in e):
        profiles.update({name: p, **({f"{name} (assistant)": {**p["assistant"], "seq_len": p["seq_len"]}}
                                     if "assistant" in p else {})})
    if profiles:
        print(profile_table(profiles))
    if args.plot:
        series = {name: e["profile_checkpoints"] for name, e in report.items() if "profile_checkpoints" in e}
        for path in plot_profiles(profiles, args.plot, series, exits):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
