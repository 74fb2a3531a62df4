"""
prepare_fineweb.py's pipeline (read with datasets, tokenise on 2 threads, write shards) against the tokenizer's own
batch call on the same documents in memory (prepare_fineweb.bench), written as results/speed/NAME.json.

    python results/speed/tokenize_bench.py tokenize_kjv_verses gpt2          # 31,103 short documents
    python results/speed/tokenize_bench.py tokenize_kjv_chapters gpt2 --chapters   # 1,189 chapters, the file x 3
    python results/speed/tokenize_bench.py tokenize_kjv_smollm2 hf:GGUF      # SmolLM2's tokenizer, a GGUF file
"""
import datetime
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
import prepare_fineweb  # noqa: E402
from lib.preparation import kjv_path  # noqa: E402
from runs import git  # noqa: E402
from scripts.bench import machine  # noqa: E402


def main(name, tokenizer, *flags):
    inputs, what = [kjv_path()], "the KJV's 31,103 verses, one document each"
    with tempfile.TemporaryDirectory() as tmp:
        if "--chapters" in flags:              # documents of a web page's length, FineWeb-like
            chapters = {}
            for line in open(kjv_path()):
                verse = json.loads(line)
                chapters.setdefault((verse["book"], verse["chapter"]), []).append(verse["text"])
            path = os.path.join(tmp, "chapters.jsonl")
            with open(path, "w") as f:
                f.writelines(json.dumps({"text": " ".join(v)}) + "\n" for v in chapters.values())
            inputs, what = [path] * 3, f"the KJV's {len(chapters):,} chapters, one document each, the file named 3 times"
        result = prepare_fineweb.bench(inputs, tokenizer, workers=2)
    record = {"command": f"python results/speed/tokenize_bench.py {name} {tokenizer} {' '.join(flags)}".strip(),
              "documents": what, "tokenizer": tokenizer, "machine": machine(), "git_commit": git("rev-parse", "--short", "HEAD"),
              "date": datetime.date.today().isoformat(), "results": result}
    json.dump(record, open(os.path.join(ROOT, "results", "speed", f"{name}.json"), "w"), indent=1)


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4) or sys.argv[3:] not in ([], ["--chapters"]) or "-h" in sys.argv or "--help" in sys.argv:
        raise SystemExit(__doc__ + "\nusage: python results/speed/tokenize_bench.py NAME TOKENIZER [--chapters]")
    main(*sys.argv[1:])
