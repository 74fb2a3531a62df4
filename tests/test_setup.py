"""The README's two set-up commands (quickstart.sh, .ci/run) choose their Python through scripts/python_env.sh: an
activated environment as it is, else the project's .venv/ (made once with python3 -m venv), else a python that already
imports torch. Here with stub interpreters on a bare PATH, as on a new machine (only python3, no packages)."""
import os
import re
import shutil
import subprocess

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASH = shutil.which("bash")

# A stub interpreter: records each call, imports torch only if TORCH=yes, and makes a venv folder with a stub python.
STUB = """#!/bin/sh
echo "$(basename "$0") $*" >> "{calls}"
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && exit 0
fi
[ "$1" = "-c" ] && [ "{torch}" = yes ] && exit 0
exit 1
"""


def project(tmp_path, **interpreters):
    """A project folder with scripts/python_env.sh and a bin/ of stub interpreters {name: imports torch?}."""
    root, bin_ = tmp_path / "project", tmp_path / "bin"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(os.path.join(HERE, "scripts", "python_env.sh"), root / "scripts")
    bin_.mkdir()
    for name, torch in interpreters.items():
        (bin_ / name).write_text(STUB.format(calls=tmp_path / "calls", torch="yes" if torch else "no"))
        (bin_ / name).chmod(0o755)
    return root, bin_


def choose(root, bin_, **env):
    """Source python_env.sh as the two commands do, on a bare environment: (PY, VIRTUAL_ENV, the first PATH entry)."""
    done = subprocess.run([BASH, "-c", 'set -eu; source scripts/python_env.sh; echo "$PY|${VIRTUAL_ENV:-}|${PATH%%:*}"'],
                          cwd=root, env={"PATH": f"{bin_}:/usr/bin:/bin", "HOME": str(root), **env},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[-1].split("|")


def calls(tmp_path):
    path = tmp_path / "calls"
    return path.read_text().splitlines() if path.exists() else []


def test_a_bare_machine_gets_one_project_venv_and_reuses_it(tmp_path):
    root, bin_ = project(tmp_path, python3=False)               # only the system's python3, without torch
    venv = str(root / ".venv")
    assert choose(root, bin_) == [f"{venv}/bin/python", venv, f"{venv}/bin"]
    made = ["python3 -c import torch", "python3 --version", "python3 -m venv .venv"]
    assert calls(tmp_path) == made
    assert choose(root, bin_) == [f"{venv}/bin/python", venv, f"{venv}/bin"]      # the second command: no new venv
    assert calls(tmp_path) == made


def test_an_activated_environment_is_used_as_it_is(tmp_path):
    root, bin_ = project(tmp_path, python3=False)
    mine = tmp_path / "mine"
    assert choose(root, bin_, VIRTUAL_ENV=str(mine)) == [f"{mine}/bin/python", str(mine), f"{mine}/bin"]
    assert choose(root, bin_, CONDA_PREFIX=str(mine)) == [f"{mine}/bin/python", "", f"{mine}/bin"]
    assert not (root / ".venv").exists() and calls(tmp_path) == []


def test_a_python_that_imports_torch_is_used_as_it_is(tmp_path):
    """A GPU image's Python with its CUDA torch, under python3 only: chosen, nothing made, its torch not replaced."""
    root, bin_ = project(tmp_path, python=False, python3=True)
    assert choose(root, bin_) == [f"{bin_}/python3", "", str(bin_)]
    assert not (root / ".venv").exists() and "python3 -m venv .venv" not in calls(tmp_path)


def test_no_python3_is_one_line(tmp_path):
    root, _ = project(tmp_path)
    done = subprocess.run([BASH, "-c", "source scripts/python_env.sh"], cwd=root, capture_output=True, text=True,
                          env={"PATH": str(tmp_path / "bin"), "HOME": str(root)}, timeout=60)
    assert (done.returncode, done.stderr) == (1, "error: no python3 on PATH; install Python 3.10 or newer\n")


def test_the_two_commands_call_only_the_chosen_python():
    """(Before: both called `python`, which a new machine lacks: exit 127 on the first line.)"""
    for script in ("quickstart.sh", ".ci/run"):
        text = open(os.path.join(HERE, script)).read()
        assert "source scripts/python_env.sh" in text, script
        bare = [line for line in text.splitlines() if re.search(r"(^|[\s($])python3? ", line.split("#")[0])
                and not line.strip().startswith("echo")]
        assert bare == [], (script, bare)
