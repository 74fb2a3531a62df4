"""
lm-evaluation-harness itself, request by request, on the documents of an `evaluate.py --log_samples` report: the
harness's own task YAML builds the prompts from the same documents, its HFLM scores them on the run's checkpoint
exported to transformers (lib.hf.llama_to_hf), and each request's log-likelihood, each document's acc, and which
answer the model prefers are compared with ours. Tells a model's own bias from a prompt or label-order bug.

    python evaluate.py out/kjv_seeds/base_seed1337 --tasks boolq --data_dir data/tasks --limit 300 --log_samples \
        --out out/boolq_check.json
    python -m scripts.harness_check out/boolq_check.json            # every task of the report; --out FILE.json

One run folder per report, with the byte tokenizer (`bytes`: a byte-level Hugging Face tokenizer with the same ids is
built here) or a Hugging Face one; multiple-choice and LAMBADA tasks (not WikiText). Needs lm_eval
(requirements-dev.txt). Exit status 1 when a prompt, log-likelihood (beyond --atol) or acc differs.
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np

from files import write_atomic
from lib import tasks as TK
from lib.hf import llama_to_hf
from lib.commands import load_run
from tokenizer import HFTokenizer

HARNESS_YAML = {"lambada_openai": "lambada/lambada_openai.yaml", "boolq": "super_glue/boolq/default.yaml",
                "arc_easy": "arc/arc_easy.yaml", "arc_challenge": "arc/arc_challenge.yaml",
                "hellaswag": "hellaswag/hellaswag.yaml", "piqa": "piqa/piqa.yaml", "race": "race/race.yaml",
                "social_iqa": "siqa/siqa.yaml", "sciq": "sciq/sciq.yaml", "swag": "swag/swag.yaml"}


def byte_tokenizer():
    """A Hugging Face fast tokenizer with tokenizer.get_tokenizer("bytes")'s ids: byte b is token b, <|endoftext|> 256, no
    BOS, no merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = {}, 0                                  # GPT-2's byte -> printable character map
    for b in range(256):
        chars[b] = chr(b) if b in printable else chr(256 + extra)
        extra += b not in printable
    tk = Tokenizer(models.BPE({chars[b]: b for b in range(256)}, []))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    hf = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>")   # added as id 256
    assert hf.convert_tokens_to_ids("<|endoftext|>") == 256
    return hf


def harness_task(task, rows, folder):
    """The harness's own task config (its YAML, its prompt code) reading `rows` (the hub's schema; google/boolq's
    `answer` given as SuperGLUE's `label`) from a file in `folder`."""
    from pathlib import Path
    import lm_eval
    from lm_eval.tasks._factory import TaskFactory
    from lm_eval.tasks._index import TaskIndex
    path, split = os.path.join(folder, f"{task}.jsonl"), TK.TASKS[task].split
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({**r, "label": int(r["answer"])} if task == "boolq" and "label" not in r else r) + "\n")
    entry = TaskIndex.entry_from_path(Path(lm_eval.__file__).parent / "tasks" / HARNESS_YAML[task])
    overrides = {"dataset_path": "json", "dataset_name": None, "training_split": None, "fewshot_split": None,
                 "validation_split": split if split == "validation" else None,
                 "test_split": split if split == "test" else None,
                 "dataset_kwargs": {"data_files": {split: path}, "cache_dir": os.path.join(folder, "cache")}}
    return TaskFactory().build(entry, overrides=overrides, registry={})


def check_task(task, report, harness, lm, folder):
    """The comparison of one task: prompts, per-request log-likelihoods, per-document acc, preferred answers."""
    config, samples = report["config"], report["samples"][task]
    data = TK.load_task(task, config["data_dir"], config["limit"])
    ht = harness_task(task, data.docs, folder)
    ht.build_all_requests(rank=0, world_size=1)
    instances = sorted(ht.instances, key=lambda i: (i.doc_id, i.idx))
    requests = [list(i.args) for i in instances]
    ours_requests = [r for s in samples for r in s["requests"]]
    for context, continuation in requests:                # the same token ids as ours, whole strings and contexts
        for text in (context, context + continuation):
            if text and lm.encode(text) != harness.tok_encode(text):
                raise SystemExit(f"error: {task}: the tokenizers differ on {text[:60]!r}")
    responses = harness.loglikelihood(instances, disable_tqdm=True)
    ours = [ll for s in samples for ll in s["loglikelihoods"]]
    diffs = np.abs(np.array([ll for ll, _ in responses]) - np.array(ours))
    greedy_same = [g for s in samples for g in s["is_greedy"]] == [bool(g) for _, g in responses]
    out = {"n_docs": len(samples), "n_requests": len(instances), "prompts_identical": requests == ours_requests,
           "max_abs_ll_difference": float(diffs.max()), "is_greedy_identical": greedy_same}
    k, accs, picks, golds = 0, [], [], []
    for s in samples:
        n = len(s["requests"])
        metrics = ht.process_results(ht.eval_docs[s["doc_index"]], [tuple(r) for r in responses[k:k + n]])
        accs.append((s["acc"], float(metrics["acc"])))
        if n > 1:
            picks.append(int(np.argmax([ll for ll, _ in responses[k:k + n]])))   # the first index wins a tie
            golds.append(s["gold"])
        k += n
    out["acc_ours"], out["acc_harness"] = (float(np.mean(a)) for a in zip(*accs))
    out["acc_identical"] = all(a == b for a, b in accs)
    if picks:                                             # which answer the model prefers, which is right
        doc = data.built[0]
        names = doc["choices"] if task == "boolq" else [str(i) for i in range(max(len(d["choices"]) for d in data.built))]
        out["preferred_share"] = {names[i]: picks.count(i) / len(picks) for i in sorted(set(picks))}
        out["gold_share"] = {names[i]: golds.count(i) / len(golds) for i in sorted(set(golds))}
        out["chance"], out["majority"] = TK.class_rates(data.built)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.error = lambda message: sys.exit(f"error: {message}")
    p.add_argument("report", help="an evaluate.py --out JSON of one run folder, written with --log_samples")
    p.add_argument("--tasks", help="comma-separated (default: every task of the report with samples)")
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--atol", type=float, default=1e-4, help="largest log-likelihood difference taken as equal")
    p.add_argument("--out", help="write the comparison here as JSON")
    args = p.parse_args(argv)
    from lm_eval.models.huggingface import HFLM
    try:
        report = json.load(open(args.report))
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: {args.report}: {e}")
    config = report.get("config", {})
    if "samples" not in report or len(config.get("runs", [])) != 1 or config.get("hf"):
        raise SystemExit(f"error: {args.report}: not the report of one run folder written with --log_samples")
    tasks = TK.parse_tasks(args.tasks) if args.tasks else [t for t in report["samples"] if t in HARNESS_YAML]
    model, tokenizer, meta = load_run(config["runs"][0], config.get("step"))
    if isinstance(tokenizer, HFTokenizer):
        hf_tok = tokenizer.hf
    elif tokenizer.name == "bytes":
        hf_tok = byte_tokenizer()
    else:
        raise SystemExit(f"error: tokenizer {tokenizer.name!r}: only bytes or a Hugging Face tokenizer")
    lm = TK.ModelLM(model, tokenizer)
    harness = HFLM(pretrained=llama_to_hf(model).eval(), tokenizer=hf_tok, batch_size=args.batch_size,
                   max_length=model.config.max_seq_len, device="cpu")
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for task in tasks:
            results[task] = r = check_task(task, report, harness, lm, folder)
            print(f"{task} ({meta['checkpoint']}, {r['n_docs']} documents, {r['n_requests']} requests): prompts "
                  f"{'identical' if r['prompts_identical'] else 'DIFFER'}, max |Δ log-likelihood| "
                  f"{r['max_abs_ll_difference']:.2e}, acc {r['acc_ours']:.4f} (harness {r['acc_harness']:.4f}, "
                  f"{'the same per document' if r['acc_identical'] else 'DIFFERENT documents'})")
            if "preferred_share" in r:
                share = lambda d: ", ".join(f"{k} {v:.4f}" for k, v in d.items())        # noqa: E731
                print(f"  the model prefers: {share(r['preferred_share'])}; gold: {share(r['gold_share'])}; "
                      f"chance {r['chance']:.4f}, majority {r['majority']:.4f}")
    if args.out:
        write_atomic(args.out, json.dumps({"report": args.report, "checkpoint": meta["checkpoint"], "tasks": results},
                                          indent=1))
    bad = [t for t, r in results.items() if not (r["prompts_identical"] and r["acc_identical"]
                                                 and r["is_greedy_identical"] and r["max_abs_ll_difference"] <= args.atol)]
    if bad:
        raise SystemExit(f"error: {', '.join(bad)}: not what the harness gives")


if __name__ == "__main__":
    main()
