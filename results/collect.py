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
now and stands where PLACES puts it; every number of the prose of README.md and docs/*.md (outside blocks, code, link
targets, comments and the phrases of FACTS), digits or words, with the words around it, is in the committed ledger
results/prose_numbers.txt; and no result number stands in that prose but as the ledger holds it.

A result number is a result-like one (a decimal, thousands separators, a percentage, a number before a unit) that is
no setting. A setting is a number that a settings file binds to a name: an assignment of a configs/ file; in config.py,
model.py, the top-level commands, lib/ and scripts/ (not their tests) a module- or class-level assignment (Config's
defaults, PRESETS), a parameter's default or a command's `default=`; an option or a variable of scripts/*.sh; a size in
a config's name (3.4B). It must be written the same (1.00 is not 1.0, 1.5e-4 is); before a unit of time or memory, a
name of that unit must hold it (540 s: BUDGET_S); a percentage is a setting when a setting named ...ratio holds its
fraction (10%: min_lr_ratio = 0.1). A number that stands anywhere else in the code (a comment, a help text, an
expression, a test) is no evidence.

    python results/collect.py --accept-prose     # after a meant change of a number in prose: the ledger anew

`--accept-prose` rewrites the ledger only when nothing else fails, and never for a result number changed or typed in by
hand: it refuses with an `error:` line for each, naming it and its sentence, since a result changes only through its
generator. Words moved beside an unchanged result number (the same number on the same page, the same four words on one
side of it) are accepted. Any other argument is one `error:` line and exit status 2, with nothing done.

Each block is a function of the module for its page, which reads the committed files and says how:
numbers_reproduction.py (the seed study, the 600-step runs, other CPUs, the quick start), numbers_finetuning.py,
numbers_retrofit.py, numbers_layers.py (layer analyses and task scores), numbers_speed.py (results/speed/) and
methods/numbers_comparison.py (the comparison of docs/methods.md) and methods/numbers_optimizer.py (docs/optimizer.md).
"""
import ast
import glob
import os
import re
import sys
from collections import Counter
from decimal import Decimal

import numbers_finetuning
import numbers_layers
import numbers_reproduction
import numbers_retrofit
import numbers_speed

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "methods"))
import numbers_comparison  # noqa: E402
import numbers_optimizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = (numbers_reproduction, numbers_finetuning, numbers_retrofit, numbers_layers, numbers_speed, numbers_comparison,
         numbers_optimizer)
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
                  "smollm2-finding", "comparison-readme", "optimizer-readme", "kjv-scale", "determinism",
                  "param-counts", "readme-estimate"),
    "docs/data.md": ("kjv-data", "tokenize-speed"),
    "docs/evaluation.md": ("smollm2-load", "chat-profile-tokens", "smollm2-tasks"),
    "docs/finetuning.md": ("packing-effect", "kjv-size", "sft-table", "sft-skip-finding", "sft-finding", "kjv-size"),
    "docs/layers.md": ("smollm2-profile-finding", "smollm2-early-exit", "smollm2-exit-finding", "kjv-exit-finding",
                       "kjv-tasks", "kjv-boolq", "kjv-lens", "kjv-lens-finding", "survey-table", "survey-finding"),
    "docs/methods.md": ("comparison-cost", "comparison-sweep", "comparison-finding", "comparison-table",
                        "comparison-figure", "comparison-shared", "comparison-shared-finding", "comparison-steps",
                        "comparison-deep"),
    "docs/optimizer.md": ("optimizer-sweep", "optimizer-table", "optimizer-profile", "optimizer-over-time",
                          "optimizer-finding", "optimizer-figure"),
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
         "arXiv 2502.05795", "arXiv 2412.13795", "arXiv 2502.02732", "arXiv 2404.16710",   # the methods' papers
         "the baseline's ζ_L = 5.14 after fine-tuning",          # the paper's own number, quoted
         "a wheel of 86 MB",                                      # a package's download (pip download)
         "17,671 whole ones", "196,794 characters of KJV Genesis")  # inputs: ShareGPT's whole records, Genesis's text
SKIPPED = re.compile(r"```[\s\S]*?```|`[^`\n]*`|\]\([^)]*\)|<!--[\s\S]*?-->")
# a decimal, a number with thousands separators, a percentage, a number before a unit of time, memory or a ratio
RESULT_LIKE = re.compile(r"(?<![\w.,])(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d+(?= ?(?:%|h|min|s|ms|GiB|GB|MiB|MB|×)"
                         r"(?!\w)))(?![\w.,]*\d)")
# every number a reader could be told: digits, and the number words (a changed count: "Five seeds" -> "Seven seeds")
ANY_NUMBER = re.compile(r"(?<![\w.,])\d[\d,]*(?:\.\d+)?%?|\b(?:two|three|four|five|six|seven|eight|nine|ten|eleven|"
                        r"twelve|thirteen|fourteen|fifteen|sixteen|twenty|thirty|forty|fifty|hundred|thousand|million|"
                        r"billion|twice|half|dozen)\b", re.IGNORECASE)
# the settings files: the numbers they bind to a name are the settings (their tests, test_*.py and conftest.py, are not)
SETTINGS = ("*.py", "configs/*.py", "lib/*.py", "scripts/*.py", "scripts/*.sh")
# the names that a number before a unit needs: a percentage, a fraction's; a time or a memory, its unit's
UNIT_NAMES = {"%": re.compile(r"ratio|frac|pct|percent", re.IGNORECASE),
              "time": re.compile(r"(?:^|_)(?:h|min|s|ms|sec|seconds|minutes|hours|time|timeout|budget)(?:_|$)", re.I),
              "memory": re.compile(r"(?:^|_)(?:mb|mib|gb|gib|bytes|memory)(?:_|$)", re.IGNORECASE)}
UNIT = re.compile(r" ?(%|h|min|s|ms|GiB|GB|MiB|MB|×)(?!\w)")
SIZE = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)[mb](?![a-z])")       # a config's size: 170m, 3.4b, smollm2_1.7b
LITERAL = re.compile(r"\d+(?:\.\d*)?(?:e[-+]?\d+)?", re.IGNORECASE)
SHELL = re.compile(r"--(\w+)[= ](\d[\d_]*(?:\.\d+)?(?:e-?\d+)?)\b|\$\{(\w+):-(\d[\d_]*(?:\.\d+)?)\}"
                   r"|(?<![\w$])(\w+)=(\d[\d_]*(?:\.\d+)?)\b")
RESULTS = ("result numbers outside the generated blocks, changed or typed in by hand: no setting holds them (no "
           "assignment of configs/, no default of the code) and the ledger does not (a result is written into a block "
           "by its generator, results/numbers_*.py; a fact of the inputs goes in results/collect.py's FACTS):")
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


def named_numbers(path):
    """(name, number as written, without _) of every number that a settings file binds to a name: of a Python file,
    the module- and class-level assignments (a number passed as a keyword there is named by it), the parameters'
    defaults and the `default=` of calls (named by the option); of a shell script, the --option values and variables
    (comments left out). A number anywhere else (a comment, a string, an expression in a function) is none."""
    text = open(path).read()
    if path.endswith(".sh"):
        text = re.sub(r"(?m)(^|\s)#.*$", r"\1", text)
        return [(m.group(1) or m.group(3) or m.group(5), (m.group(2) or m.group(4) or m.group(6)).replace("_", ""))
                for m in SHELL.finditer(text)]
    tree, out = ast.parse(text), []

    def numbers(node, name):
        if isinstance(node, ast.keyword):
            name, node = node.arg or name, node.value
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            written = (ast.get_source_segment(text, node) or "").replace("_", "")
            out.append((name, written if LITERAL.fullmatch(written) else repr(node.value)))
        for child in ast.iter_child_nodes(node):
            numbers(child, name)

    def assigned(body):
        for stmt in body:
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                numbers(stmt.value, next((t.id for t in targets if isinstance(t, ast.Name)), ""))
            elif isinstance(stmt, ast.ClassDef):
                assigned(stmt.body)

    assigned(tree.body)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args.posonlyargs + node.args.args
            for arg, default in list(zip(args[len(args) - len(node.args.defaults):], node.args.defaults)) + list(
                    zip(node.args.kwonlyargs, node.args.kw_defaults)):
                if default is not None:
                    numbers(default, arg.arg)
        elif isinstance(node, ast.Call):
            option = next((a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)), "")
            for keyword in node.keywords:
                if keyword.arg == "default":
                    numbers(keyword.value, option.lstrip("-"))
    return out


def settings():
    """{number as written (without commas or _): the names that hold it} of every settings file but the tests, and
    the sizes in configs/' names (named "size")."""
    named = []
    for pattern in SETTINGS:
        for path in sorted(glob.glob(os.path.join(ROOT, pattern))):
            name = os.path.basename(path)
            if name.startswith("test_") or name == "conftest.py":
                continue
            named += named_numbers(path)
            if os.path.dirname(path) == os.path.join(ROOT, "configs"):
                named += [("size", size) for size in SIZE.findall(name)]
    known = {}
    for name, n in named:
        known.setdefault(n, set()).add(name)
    return known


def is_setting(text, m, known):
    """Whether the result-like match m of text writes a setting's number (known: settings()): the same number as
    written (with its exponent: 1.5e-4); before a unit of time or memory, one that a name of the unit holds (BUDGET_S,
    gpu_gib); a percentage, the fraction that a ...ratio setting holds (10%: min_lr_ratio = 0.1)."""
    written, rest = m.group().replace(",", ""), text[m.end():]
    unit = UNIT.match(rest)
    unit = unit and ("%" if unit.group(1) == "%" else "time" if unit.group(1) in ("h", "min", "s", "ms")
                     else "memory" if unit.group(1) != "×" else None)
    if unit == "%":
        fraction = Decimal(written) / 100
        return any(UNIT_NAMES["%"].search(name) for n, names in known.items() if Decimal(n) == fraction
                   for name in names)
    exponent = re.match(r"e[-−]?\d+", rest)
    names = known.get(written + (exponent.group().replace("−", "-") if exponent else ""), ())
    return any(UNIT_NAMES[unit].search(name) for name in names) if unit else bool(names)


def context(text, m, words=4):
    """The words either side of match m."""
    return text[:m.start()].split()[-words:], text[m.end():].split()[:words]


def around(text, m, words=4):
    """The number of match m with the words either side, on one line."""
    before, after = context(text, m, words)
    return " ".join(before + [f"[{m.group()}]"] + after)


def result_numbers(text, known):
    """The result numbers of text's prose (result-like, no setting: known is settings()), each as (the ledger's words
    and number, the number, the words before, the words after). That some block writes the same number is no source:
    the sentence may quote it wrongly."""
    outside = prose(text)
    numbers = {m.start(): m for m in ANY_NUMBER.finditer(outside)}
    out = []
    for m in RESULT_LIKE.finditer(outside):
        if not is_setting(outside, m, known):
            n = numbers.get(m.start(), m)
            out.append((around(outside, n), n.group(), *context(outside, n)))
    return out


def prose_numbers():
    """Every number of every page's prose, as the ledger writes it: "PAGE: words [number] words"."""
    return [f"{page}: {around(outside, m)}" for page in pages()
            for outside in [prose(open(os.path.join(ROOT, page)).read())] for m in ANY_NUMBER.finditer(outside)]


def committed_ledger():
    path = os.path.join(ROOT, LEDGER)
    return open(path).read().splitlines() if os.path.exists(path) else []


def unheld(known):
    """The result numbers of the prose (known: settings()) that the committed ledger does not hold, as (line, number):
    a line of the ledger is held, and so is an unchanged number whose words moved on one side only (it stands in a
    line gone from the ledger with the same page, number and words before or after it)."""
    now, committed = prose_numbers(), committed_ledger()
    added, gone = Counter(now) - Counter(committed), list((Counter(committed) - Counter(now)).elements())
    out = []
    for page in pages():
        for words, number, before, after in result_numbers(open(os.path.join(ROOT, page)).read(), known):
            line = f"{page}: {words}"
            if not added[line]:
                continue
            added[line] -= 1
            head, tail = f"{page}: " + " ".join(before + [f"[{number}]"]), " ".join([f"[{number}]"] + after)
            moved = next((g for g in gone if g == head or g.startswith(head + " ")
                          or g.startswith(f"{page}: ") and g.endswith(" " + tail)), None)
            if moved is None:
                out.append((line, number))
            else:
                gone.remove(moved)
    return out


def ledger_changes():
    """The lines of the prose's numbers that are not in the committed ledger (-) or not in the prose (+)."""
    committed, now = committed_ledger(), prose_numbers()
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
    loose = [line for line, _ in unheld(settings())]
    if loose:
        out.append(RESULTS + "\n  " + "\n  ".join(loose))
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
    if argv in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if len(argv) > 1 or argv and argv[0] not in ("--check", "--accept-prose"):
        bad = next((a for a in argv if a not in ("--check", "--accept-prose")), None)
        print((f"error: unknown argument {bad!r}" if bad else f"error: {' '.join(argv)}: one mode at a time")
              + ": nothing done (python results/collect.py [--check | --accept-prose])", file=sys.stderr)
        return 2
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
        refused = [p for p in problems(generated) if not p.startswith(("numbers in prose", RESULTS))]
        if refused:
            print("\n".join(refused) + f"\nerror: {LEDGER} not written: the problems above first")
        for line, number in unheld(settings()):
            print(f"error: {line}: {number} is a result number, changed or typed in by hand (no setting holds it, nor "
                  f"the ledger): change it through its generator (a block of results/numbers_*.py); {LEDGER} not "
                  "written")
            refused.append(line)
        if refused:
            return 1
        lines = prose_numbers()
        with open(os.path.join(ROOT, LEDGER), "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"wrote {LEDGER}: {len(lines)} numbers in the prose of {len(pages())} pages")
        return 0
    numbers_reproduction.plots(*numbers_reproduction.seed_study())
    numbers_comparison.plot()
    numbers_optimizer.plot()
    print("\n\n".join(generated.values()))
    print("rewrote: " + (", ".join(stale) or "nothing changed"))
    found = problems(generated)
    print("\n".join(found))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
