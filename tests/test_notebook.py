"""notebooks/tour.ipynb runs top to bottom without an error, executed by `notebooks/run.py --fast` (a slice of the KJV
and runs of a few steps in a temporary folder, the committed notebook untouched), which says that its numbers mean
nothing; the runner, stopped by SIGTERM, SIGHUP (its terminal closed) or SIGKILL while the notebook trains, leaves no
training process behind, and but for SIGKILL no temporary folder; Ctrl-C or SIGTERM ends it in one line naming the
signal; notebooks/tour_runs.py --help is a usage; the exercise's check tells jreg.py as shipped from jreg.py with
docs/ablations.md's edit; and the committed notebook holds the outputs of a full run, in order, without an error."""
import glob
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import nbformat
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "tour.ipynb")


def notebook_module(name):
    spec = importlib.util.spec_from_file_location(f"notebook_{name}", os.path.join(ROOT, "notebooks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tour_runs_without_an_error(tmp_path, capsys):
    before = os.path.getmtime(NOTEBOOK)
    notebook_module("run").main(["--fast", "--out", str(tmp_path / "tour.ipynb")])   # a cell that raises: here
    assert "FAST MODE" in capsys.readouterr().err                                   # the runner's banner
    assert os.path.getmtime(NOTEBOOK) == before
    nb = nbformat.read(tmp_path / "tour.ipynb", as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert all(cell.outputs for cell in code[1:])                   # all but the knobs print or draw
    images = [o for cell in code for o in cell.outputs if "image/png" in o.get("data", {})]
    assert len(images) == 5             # Ψ and ζ, ζ_L over training, the weights, the layer analysis, the λ sweep
    text = "".join(o.get("text", "") for cell in code for o in cell.outputs)
    assert "FAST MODE" in text and "not yet added" in text and "skipped until" in text
    assert "trained before, reused" not in text                     # the fast mode's runs are its own


def trainers(folder):
    """{pid: command line} of the processes whose command line holds train.py and `folder`."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:                                             # ended meanwhile
            continue
        if "train.py" in cmdline and str(folder) in cmdline:
            found[int(pid)] = cmdline
    return found


def finished_runs(folder):
    """The run folders under folder/*/ that hold a checkpoint at their max_steps."""
    found = []
    for path in glob.glob(os.path.join(folder, "*", "*", "config.json")):
        steps = json.load(open(path))["config"]["max_steps"]
        ckpts = [os.path.basename(c) for c in glob.glob(os.path.join(os.path.dirname(path), "ckpt_*"))]
        if any(int(c[5:].removesuffix(".pt")) >= steps for c in ckpts if not c.endswith(".tmp")):
            found.append(os.path.dirname(path))
    return found


def start_runner(tmp_path, *args):
    """notebooks/run.py ARGS in its fast mode, its temporary folders in tmp_path (through TMPDIR), its output in
    tmp_path/runner.log."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "JREG_NOTEBOOK_FAST": "1"}
    with open(tmp_path / "runner.log", "w") as log:
        return subprocess.Popen([sys.executable, os.path.join(ROOT, "notebooks", "run.py"), *args], cwd=ROOT, env=env,
                                stdout=log, stderr=log)


def wait_for_training(runner, tmp_path):
    """Until the runner's first training runs have started."""
    deadline = time.time() + 120
    while not trainers(tmp_path) and runner.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert trainers(tmp_path), "no training started:\n" + open(tmp_path / "runner.log").read()[-3000:]


@pytest.mark.allow_skip
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL], ids=lambda sig: sig.name)
def test_a_stopped_runner_leaves_no_training_behind(tmp_path, sig):
    """The runner in its fast mode, signalled as soon as its first training runs have started: within 30 s no process
    of them is left, and none trained on to its end; but for SIGKILL, nothing is left in its temporary folder (the
    slice of the text, the runs) when it has ended."""
    runner = start_runner(tmp_path, "--out", str(tmp_path / "tour.ipynb"))
    try:
        wait_for_training(runner, tmp_path)
        runner.send_signal(sig)
        runner.wait(60)
        deadline = time.time() + 30
        while trainers(tmp_path) and time.time() < deadline:
            time.sleep(0.2)
        left, finished = trainers(tmp_path), finished_runs(tmp_path)
        assert not left, f"left running after {sig.name} to the runner: " + "; ".join(
            f"pid {pid} (parent {open(f'/proc/{pid}/stat').read().split()[3]}): {cmd}" for pid, cmd in left.items())
        assert not finished, f"trained on to their last step after {sig.name} to the runner: {finished}"
        if sig != signal.SIGKILL:
            assert sorted(os.listdir(tmp_path)) == ["runner.log"], f"left after {sig.name}: {os.listdir(tmp_path)}"
    finally:
        runner.kill()
        for pid in trainers(tmp_path):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.allow_skip
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda sig: sig.name)
def test_an_interrupted_runner_says_so_in_one_line(tmp_path, sig):
    """Ctrl-C or SIGTERM to the runner while the notebook trains: it exits non-zero with one line naming the signal,
    without a traceback (nbclient's or the kernel's), and leaves nothing behind: not the executed copy's folder."""
    runner = start_runner(tmp_path)
    try:
        wait_for_training(runner, tmp_path)
        runner.send_signal(sig)
        assert runner.wait(60) != 0
        log = open(tmp_path / "runner.log").read()
        assert log.splitlines()[-1].startswith(f"interrupted by {sig.name}: "), log[-3000:]
        assert "Traceback" not in log and "Error" not in log, log[-3000:]
        assert sorted(os.listdir(tmp_path)) == ["runner.log"], f"left after {sig.name}: {os.listdir(tmp_path)}"
    finally:
        runner.kill()
        for pid in trainers(tmp_path):
            os.kill(pid, signal.SIGKILL)


def test_the_launchers_help_is_a_usage():
    """notebooks/tour_runs.py run as a script is the launcher of one training run: --help says so, a wrong call is a
    usage line and one error line."""
    launcher = [sys.executable, os.path.join(ROOT, "notebooks", "tour_runs.py")]
    shown = subprocess.run([*launcher, "--help"], cwd=ROOT, capture_output=True, text=True)
    assert shown.returncode == 0 and shown.stdout.startswith("usage: ") and "PARENT_PID PROGRAM" in shown.stdout
    assert "tour = start()" in shown.stdout and not shown.stderr                # and what the notebook imports
    for wrong in ([], ["train.py"], [str(os.getpid())]):
        refused = subprocess.run([*launcher, *wrong], cwd=ROOT, capture_output=True, text=True)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        assert len(refused.stderr.splitlines()) == 2 and "error: " in refused.stderr.splitlines()[1]


def edited_jreg(folder, diff):
    """jreg.py with a diff of docs/ablations.md applied, written into folder (each hunk's context and - lines occur
    once in the file, as whole lines)."""
    source = "\n" + open(os.path.join(ROOT, "jreg.py")).read()
    for hunk in diff.split("\n@@")[1:]:
        lines = [line for line in hunk.split("\n")[1:] if line]
        old = "".join(f"\n{line[1:]}" for line in lines if line[0] in " -") + "\n"
        new = "".join(f"\n{line[1:]}" for line in lines if line[0] in " +") + "\n"
        assert source.count(old) == 1, f"docs/ablations.md's diff no longer applies to jreg.py:{old}"
        source = source.replace(old, new)
    (folder / "jreg.py").write_text(source[1:])
    return str(folder)


def test_the_exercise_check_tells_the_edit(tmp_path, capsys):
    """The exercise's check on jreg.py as shipped, with the diff the notebook prints applied, with wrong weights, and
    with an edit that does not import."""
    tour_runs = notebook_module("tour_runs")
    diff = tour_runs.edit_from_docs("linear")
    assert diff.startswith("--- a/jreg.py\n") and '"linear"' in diff
    l = torch.arange(1, 9, dtype=torch.float32)
    expected = (l / l.sum()).tolist()
    assert not tour_runs.check_weighting("linear", expected)
    assert "not yet added" in capsys.readouterr().out
    edited = edited_jreg(tmp_path, diff)
    assert tour_runs.check_weighting("linear", expected, pythonpath=edited)
    assert capsys.readouterr().out.startswith("added:")
    assert not tour_runs.check_weighting("linear", expected[::-1], pythonpath=edited)
    assert "added, but" in capsys.readouterr().out
    (tmp_path / "jreg.py").write_text(diff)                        # the diff pasted as it is: not Python
    assert not tour_runs.check_weighting("linear", expected, pythonpath=edited)
    assert "jreg.py does not import" in capsys.readouterr().out


def test_the_committed_tour_holds_the_outputs_of_a_full_run():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1))
    outputs = [o for cell in code for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs)
    assert "jreg_tour_" not in text and "FAST MODE" not in text     # not the fast mode's
    assert "at step 300" in text and "λ = 10 " in text              # the quick start's runs, and the whole sweep
