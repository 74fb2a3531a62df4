"""
The results numbers that README.md and docs/ quote are written by this script from committed files, between markers

    <!-- results/collect.py: NAME -->
    ...generated text...
    <!-- end -->

so a quoted number cannot drift from its source. tests/test_results.py runs `--check` and fails when a generated block
no longer equals what the committed files give.

    python results/collect.py            # rewrite the blocks in README.md and docs/, and the seed study's plots
    python results/collect.py --check    # exit 1 and name the blocks that differ (no file is written)

What `--check` guards (docs/tests.md, "What the results check guards"): every block equals what its function gives
now and stands where PLACES puts it; the prose of README.md and docs/*.md (outside blocks, code, link targets and
comments) holds no result-like number (a decimal, thousands separators, a percentage, a number before a unit) that a
settings file or command does not hold or a phrase of FACTS does not explain; and every number of that prose, digits
or words, with the words around it, is in the committed ledger results/prose_numbers.txt (`--accept-prose` rewrites
it when nothing else fails).

    python results/collect.py --accept-prose     # after a meant change of a number in prose: the ledger anew

Each block is a function of the module for its page, which reads the committed files and says how:
numbers_reproduction.py (the seed study, the 600-step runs, other CPUs, the quick start), numbers_finetuning.py,
numbers_retrofit.py, numbers_layers.py (layer analyses and task scores), numbers_speed.py (results/speed/) and
methods/numbers_methods.py (the comparison of docs/methods.md).
"""
import glob
import os
import re
import sys
from collections import Counter

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


# where each block stands: a block deleted from (or added to) a page, or moved, fails the check
PLACES = {
    "README.md": ("kjv-setup", "kjv-seeds", "kjv-finding", "kjv-alpha3", "sft-readme", "retrofit-finding",
                  "smollm2-finding", "methods-finding", "methods-lr-summary", "kjv-scale", "determinism",
                  "param-counts", "readme-estimate"),
    "docs/data.md": ("kjv-data", "tokenize-speed"),
    "docs/evaluation.md": ("smollm2-load", "chat-profile-tokens", "smollm2-tasks"),
    "docs/finetuning.md": ("packing-effect", "kjv-size", "sft-table", "sft-skip-finding", "sft-finding", "kjv-size"),
    "docs/layers.md": ("smollm2-profile-finding", "smollm2-early-exit", "smollm2-exit-finding", "kjv-exit-finding",
                       "kjv-tasks", "kjv-boolq", "kjv-lens", "kjv-lens-finding", "survey-table", "survey-finding"),
    "docs/methods.md": ("methods-finding", "methods-table", "methods-lr-finding", "methods-lr", "methods-lr-seeds"),
    "docs/reproduction.md": ("quickstart-time", "kjv-seeds", "kjv-paired", "kjv-finding", "kjv-alpha3", "kjv-runs",
                             "kjv-layers", "kjv-layers-finding", "cpu-loss", "cpu-profile", "cpu-finding",
                             "kjv-corpus", "kjv-params", "kjv600-runs", "kjv600-layers", "kjv600-finding", "kjv-size"),
    "docs/retrofit.md": ("retrofit-data", "retrofit-time", "retrofit-table", "retrofit-training", "retrofit-tasks",
                         "retrofit-exit", "retrofit-moved", "retrofit-normed", "retrofit-tokens", "retrofit-noise",
                         "retrofit-full-scale"),
    "docs/speed.md": ("speed-training", "speed-against", "loss-chunks", "speed-generation", "full-scale-assumptions",
                      "full-scale-estimate"),
    "docs/training.md": ("gradient-copy", "ckpt-size", "ckpt-kept", "memory-table", "memory-probe"),
}

# numbers in prose that are neither results nor settings: each phrase as the pages write it
FACTS = ("arXiv 2601.18302", "[2601.18302", "DOI 10.18653", "Python 3.10+", "a line every 30 s",
         "the baseline's ζ_L = 5.14 after fine-tuning",          # the paper's own number, quoted
         "a wheel of 86 MB",                                      # a package's download (pip download)
         "17,671 whole ones", "196,794 characters of KJV Genesis")  # inputs: ShareGPT's whole records, Genesis's text
SKIPPED = re.compile(r"```[\s\S]*?```|`[^`\n]*`|\]\([^)]*\)|<!--[\s\S]*?-->")
# a decimal, a number with thousands separators, a percentage, a number before a unit of time, memory or a ratio
RESULT_LIKE = re.compile(r"(?<![\w.,])(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d+(?= ?(?:%|h|min|s|ms|GiB|GB|MiB|MB|×)"
                         r"(?!\w)))(?![\w.,]*\d)")
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
# every number a reader could be told: digits, and the number words (a changed count: "Five seeds" -> "Seven seeds")
ANY_NUMBER = re.compile(r"(?<![\w.,])\d[\d,]*(?:\.\d+)?%?|\b(?:two|three|four|five|six|seven|eight|nine|ten|eleven|"
                        r"twelve|thirteen|fourteen|fifteen|sixteen|twenty|thirty|forty|fifty|hundred|thousand|million|"
                        r"billion|twice|half|dozen)\b", re.IGNORECASE)
SETTINGS = ("config.py", "model.py", "configs/*.py", "*.py", "lib/*.py", "scripts/*.py", "scripts/*.sh")
LEDGER = os.path.join("results", "prose_numbers.txt")


def pages():
    """README.md and docs/*.md, relative to ROOT."""
    return ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))


def prose(text):
    """text outside its blocks, code spans, code blocks, link targets, comments and the phrases of FACTS."""
    outside = SKIPPED.sub(" ", MARKER.sub(" ", text))
    for phrase in FACTS:
        outside = outside.replace(phrase, " ")
    return outside


def settings_numbers():
    """Every number a settings file or command holds (its text and, for configs/, its name), without commas."""
    texts = []
    for pattern in SETTINGS:
        for path in sorted(glob.glob(os.path.join(ROOT, pattern))):
            texts += [open(path).read(), os.path.basename(path)]
    return {n.replace(",", "") for text in texts for n in NUMBER.findall(text)}


def around(text, m, words=4):
    """The number of match m with the words either side, on one line."""
    before, after = text[:m.start()].split()[-words:], text[m.end():].split()[:words]
    return " ".join(before + [f"[{m.group()}]"] + after)


def unsourced(text, known):
    """The result-like numbers of text's prose not in known (the settings files'), each with the words around it: a
    result belongs in a generated block (a number some block writes is not enough: the sentence may quote it wrongly)."""
    outside = prose(text)
    return [around(outside, m) for m in RESULT_LIKE.finditer(outside) if m.group().replace(",", "") not in known]


def prose_numbers():
    """Every number of every page's prose, as the ledger writes it: "PAGE: words [number] words"."""
    return [f"{page}: {around(outside, m)}" for page in pages()
            for outside in [prose(open(os.path.join(ROOT, page)).read())] for m in ANY_NUMBER.finditer(outside)]


def ledger_changes():
    """The lines of the prose's numbers that are not in the committed ledger (-) or not in the prose (+)."""
    path = os.path.join(ROOT, LEDGER)
    committed = open(path).read().splitlines() if os.path.exists(path) else []
    now = prose_numbers()
    return ([f"+ {line}" for line in Counter(now) - Counter(committed)]
            + [f"- {line}" for line in Counter(committed) - Counter(now)])


def misplaced():
    """Pages whose blocks, in order, are not those PLACES names."""
    found = {page: tuple(m.group(2) for m in MARKER.finditer(open(os.path.join(ROOT, page)).read()))
             for page in pages()}
    return [f"{page}: blocks {list(found.get(page, ()))}, expected {list(PLACES.get(page, ()))}"
            for page in sorted(set(found) | set(PLACES)) if found.get(page, ()) != PLACES.get(page, ())]


def problems(generated):
    """What fails the check besides a stale block, as printable paragraphs."""
    out = []
    known = settings_numbers()
    loose = [f"{page}: {line}" for page in pages()
             for line in unsourced(open(os.path.join(ROOT, page)).read(), known)]
    if loose:
        out.append("result-like numbers outside the generated blocks that no settings file holds (generate them from a "
                   "committed file, or name the phrase in results/collect.py's FACTS):\n  " + "\n  ".join(loose))
    placed = {name for names in PLACES.values() for name in names}
    wrong = misplaced() + [f"block {name!r} is written by a generator and stands nowhere" for name in generated
                           if name not in placed]
    if wrong:
        out.append("blocks not where results/collect.py's PLACES puts them:\n  " + "\n  ".join(wrong))
    changed = ledger_changes()
    if changed:
        out.append(f"numbers in prose added (+) or gone (-) against {LEDGER} (a changed number is both; when the "
                   "change is meant, python results/collect.py --accept-prose):\n  " + "\n  ".join(changed))
    return out


def main(argv):
    check, accept = "--check" in argv, "--accept-prose" in argv
    generated, stale = blocks(), []
    for page in pages():
        path = os.path.join(ROOT, page)
        text = open(path).read()
        new = rewrite(text, generated, path, stale)
        if new != text and not check:
            open(path, "w").write(new)
    if check:
        found = problems(generated) + (["stale blocks (run python results/collect.py):\n  " + "\n  ".join(stale)]
                                       if stale else [])
        print("\n".join(found))
        return 1 if found else 0
    if accept:
        refused = [p for p in problems(generated) if not p.startswith("numbers in prose")]
        if refused:
            print("\n".join(refused) + f"\nerror: {LEDGER} not written: the problems above first")
            return 1
        lines = prose_numbers()
        with open(os.path.join(ROOT, LEDGER), "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"wrote {LEDGER}: {len(lines)} numbers in the prose of {len(pages())} pages")
        return 0
    numbers_reproduction.plots(*numbers_reproduction.seed_study())
    numbers_methods.plot()
    print("\n\n".join(generated.values()))
    print("rewrote: " + (", ".join(stale) or "nothing changed"))
    found = problems(generated)
    print("\n".join(found))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
