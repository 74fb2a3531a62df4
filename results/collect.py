"""
The results numbers that README.md and docs/ quote are written by this script from committed files, between markers

    <!-- results/collect.py: NAME -->
    ...generated text...
    <!-- end -->

so a quoted number cannot drift from its source. tests/test_results.py runs `--check` and fails when a generated block
no longer equals what the committed files give.

    python results/collect.py            # rewrite the blocks in README.md and docs/, and the seed study's plots
    python results/collect.py --check    # exit 1 and name the blocks that differ (no file is written)

What `--check` guards: (1) every block in README.md and docs/*.md equals what its function gives now; (2) in README.md,
every result-like number outside the blocks (a decimal such as 0.0224, a number with thousands separators such as
1,558,656, a number before a unit of time or memory such as 9 h) is one that some block writes or that a config file
sets (config.py, configs/*.py, model.py, and the configs' file names), or stands in one of the phrases of FACTS (the
paper's identifiers, the Python version). Code spans, code blocks, link targets and HTML comments are skipped. The
prose of docs/ outside the blocks is not checked: a number there that no block writes is a setting or a description,
and a reader should treat it as unchecked.

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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "methods"))
import numbers_methods  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = (numbers_reproduction, numbers_finetuning, numbers_retrofit, numbers_layers, numbers_speed, numbers_methods)
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


# README numbers that are neither results nor settings: each phrase as the README writes it
FACTS = ("arXiv 2601.18302", "[2601.18302", "DOI 10.18653", "Python 3.10+", "a line every 30 s")
SKIPPED = re.compile(r"```[\s\S]*?```|`[^`\n]*`|\]\([^)]*\)|<!--[\s\S]*?-->")
RESULT_LIKE = re.compile(r"(?<![\w.,])(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d+(?= ?(?:h|min|s|GiB|GB)\b))"
                         r"(?![\w.,]*\d)")
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
SETTINGS = ("config.py", "model.py", "configs/*.py")


def known_numbers(generated):
    """Every number a block writes or a settings file holds (its text and, for configs/, its name), without commas."""
    texts = list(generated.values())
    for pattern in SETTINGS:
        for path in sorted(glob.glob(os.path.join(ROOT, pattern))):
            texts += [open(path).read(), os.path.basename(path)]
    return {n.replace(",", "") for text in texts for n in NUMBER.findall(text)}


def unsourced(text, generated):
    """The result-like numbers of text outside its blocks that no block writes and no settings file holds, each with
    the words around it."""
    outside = MARKER.sub(" ", text)
    outside = SKIPPED.sub(" ", outside)
    for phrase in FACTS:
        outside = outside.replace(phrase, " ")
    known = known_numbers(generated)
    return [f"{m.group()} in \"…{outside[max(0, m.start() - 40):m.end() + 20].strip()}…\"".replace("\n", " ")
            for m in RESULT_LIKE.finditer(outside) if m.group().replace(",", "") not in known]


def main(argv):
    check = "--check" in argv
    generated, stale = blocks(), []
    for path in [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))):
        text = open(path).read()
        new = rewrite(text, generated, path, stale)
        if new != text and not check:
            open(path, "w").write(new)
    loose = unsourced(open(os.path.join(ROOT, "README.md")).read(), generated)
    if loose:
        print("README.md: numbers outside the generated blocks that no block writes and no config sets (generate "
              "them, or name the phrase in results/collect.py's FACTS):\n  " + "\n  ".join(loose))
    if check:
        if stale:
            print("stale blocks (run python results/collect.py):\n  " + "\n  ".join(stale))
        return 1 if stale or loose else 0
    numbers_reproduction.plots(*numbers_reproduction.seed_study())
    numbers_methods.plot()
    print("\n\n".join(generated.values()))
    print("rewrote: " + (", ".join(stale) or "nothing changed"))
    return 1 if loose else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
