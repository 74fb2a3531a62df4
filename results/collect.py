"""
Every results number that README.md and docs/ quote is written by this script from committed files, between markers

    <!-- results/collect.py: NAME -->
    ...generated text...
    <!-- end -->

so a quoted number cannot drift from its source. tests/test_results.py runs `--check` and fails when a generated block
no longer equals what the committed files give.

    python results/collect.py            # rewrite the blocks in README.md and docs/, and the seed study's plots
    python results/collect.py --check    # exit 1 and name the blocks that differ (no file is written)

Each block is a function of the module for its page, which reads the committed files and says how:
numbers_reproduction.py (the seed study, the 600-step runs, other CPUs, the quick start), numbers_finetuning.py,
numbers_retrofit.py, numbers_layers.py (layer analyses and task scores) and numbers_speed.py (results/speed/).
"""
import glob
import os
import re
import sys

import numbers_finetuning
import numbers_layers
import numbers_reproduction
import numbers_retrofit
import numbers_speed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = (numbers_reproduction, numbers_finetuning, numbers_retrofit, numbers_layers, numbers_speed)
MARKER = re.compile(r"(<!-- results/collect\.py: ([\w-]+) -->\n)((?:(?!<!-- )[\s\S])*?)(\n?<!-- end -->)")


def blocks():
    """{name: generated text} of every block of every page's module."""
    return {name: make() for page in PAGES for name, make in page.BLOCKS.items()}


def rewrite(text, generated, path, stale):
    """text with every marked block replaced by its generated text; the names of those that differed go to stale."""
    def one(m):
        if m.group(2) not in generated:
            raise SystemExit(f"error: {path}: no block {m.group(2)!r} (blocks: {', '.join(generated)})")
        if m.group(3) != generated[m.group(2)]:
            stale.append(f"{os.path.relpath(path, ROOT)}: {m.group(2)}")
        return m.group(1) + generated[m.group(2)] + "\n<!-- end -->"
    return MARKER.sub(one, text)


def main(argv):
    check = "--check" in argv
    generated, stale = blocks(), []
    for path in [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))):
        text = open(path).read()
        new = rewrite(text, generated, path, stale)
        if new != text and not check:
            open(path, "w").write(new)
    if check:
        if stale:
            print("stale blocks (run python results/collect.py):\n  " + "\n  ".join(stale))
            return 1
        return 0
    numbers_reproduction.plots(*numbers_reproduction.seed_study())
    print("\n\n".join(generated.values()))
    print("rewrote: " + (", ".join(stale) or "nothing changed"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
