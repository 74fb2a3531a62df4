"""The layout's rule (README, "Where things are"): the top level is what a training step runs plus the design's
commands; the training core never imports lib/ or scripts/; no core module is over 400 lines; no entry point imports
another; every top-level module is in the README's table."""
import ast
import glob
import os

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository
ENTRY_POINTS = {"train", "prepare_fineweb", "evaluate"}


def imports(path):
    """Every module a file imports, at its top or inside a function: dotted names (`lib.hf`, `torch.nn`)."""
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def top_level():
    return {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(HERE, "*.py"))}


def training_core():
    """train.py and every top-level module it imports, directly or through another."""
    core, todo, ours = set(), ["train"], top_level()
    while todo:
        name = todo.pop()
        if name not in core:
            core.add(name)
            todo += [m for m in imports(os.path.join(HERE, f"{name}.py")) if m in ours]
    return core


def test_the_training_core_imports_nothing_from_lib_or_scripts_and_reads_in_one_sitting():
    core = training_core()
    assert {"train", "model", "loss", "jreg", "config", "data", "parallel", "checkpoint", "runs"} <= core
    for name in core:
        outside = {m for m in imports(os.path.join(HERE, f"{name}.py")) if m.split(".")[0] in ("lib", "scripts")}
        assert not outside, f"{name}.py (the training core) imports {sorted(outside)}"
        lines = len(open(os.path.join(HERE, f"{name}.py"), encoding="utf-8").read().splitlines())
        assert lines <= 400, f"{name}.py has {lines} lines: a core module reads in one sitting (STYLE.md, 'Size')"


def test_no_entry_point_imports_another():
    scripts = {f"{folder}.{os.path.basename(p)[:-3]}" for folder in ("scripts", "notebooks")
               for p in glob.glob(os.path.join(HERE, folder, "*.py")) if "__main__" in open(p, encoding="utf-8").read()}
    for name in ENTRY_POINTS | scripts:
        path = os.path.join(HERE, *name.split(".")) + ".py"
        others = (ENTRY_POINTS | scripts) - {name}
        assert not imports(path) & others, f"{name} imports the entry point(s) {sorted(imports(path) & others)}"


def test_every_top_level_module_is_in_the_readmes_table():
    readme = open(os.path.join(HERE, "README.md"), encoding="utf-8").read()
    missing = {name for name in top_level() - {"conftest"} if f"| `{name}.py` |" not in readme}
    assert not missing, f"README's 'Where things are' lacks {sorted(missing)}"


def test_the_core_modules_import_one_another_without_a_circle():
    """Each core module is entered for its own part: the imports among the top-level modules form no circle (data.py
    and tokenizer.py once imported each other, one of them inside a function)."""
    ours = top_level() - {"conftest", "test_jreg"}
    edges = {name: {m for m in imports(os.path.join(HERE, f"{name}.py")) if m in ours} for name in ours}

    def reach(start):
        seen, todo = set(), list(edges[start])
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo += edges[name]
        return seen
    assert not [name for name in ours if name in reach(name)], {name: sorted(edges[name]) for name in ours}

