"""
The runs notebooks/tour.ipynb opens and trains, kept out of its cells:

    tour = start()             the quick start's baseline and JREG runs, loaded (trained here first where missing)
    tour.sweep(lambdas, ...)   the baseline continued with JREG at each λ; a run already trained is reused
    train(jobs)                python train.py runs, two at a time, one thread each, a line as each ends
    zeta_log(run)              ζ over training, from the run's log.jsonl
    seed_runs()                the committed 5-seed study (results/kjv/seeds/*.json)
    edit_from_docs(name), check_weighting(name, expected)    the exercise: docs/ablations.md's diff, and whether
                               jreg.py (as train.py would import it) has it

Fast mode (JREG_NOTEBOOK_FAST=1, or notebooks/run.py --fast; the tests use it): a slice of the KJV and runs of a few
steps in a temporary folder. It shows that every cell runs; its numbers mean nothing.

The training runs are child processes, and they end with the kernel that started them:
  - each is started through this file run as a script (`launch`), which asks Linux (prctl PR_SET_PDEATHSIG) to send it
    SIGTERM when its parent dies, however the parent dies (killed, SIGKILL included), and then becomes train.py;
  - `train` stops its runs before it returns on any error, KeyboardInterrupt included (Jupyter's stop button).
On SIGTERM or SIGINT train.py saves a checkpoint and stops; the next `train` of the same folder resumes from it.
Only the standard library is imported at the top, so the launcher starts quickly.
"""
import ctypes
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = os.environ.get("JREG_NOTEBOOK_FAST") == "1"
QUICK = os.environ.get("JREG_QUICKSTART_OUT", "out/quickstart")   # where quickstart.sh trained (its OUT)
DATA = "data/kjv_bytes"                                           # and the shards it prepared
# continuing the baseline (the λ sweep, the exercise): lr 1e-3, no warm-up, 2,048 tokens a step (8 windows of 256);
# evaluated at its start and end on the 128 validation windows the notebook profiles (eval_batches x micro_batch)
CONTINUE = ["--lr=1e-3", "--warmup_steps=0", "--batch_tokens=2048", "--micro_batch=8", "--eval_batches=16"]
FAST_STEPS, FAST_BATCH = 2, ["--batch_tokens=1024", "--micro_batch=4"]             # and 4 windows
BANNER = ("FAST MODE (JREG_NOTEBOOK_FAST=1): a smoke test on a slice of the text with runs of a few steps. "
          "It checks that every cell runs; the numbers and plots below are NOT meaningful results.")

STARTED = time.time()

if __name__ != "__main__":                            # imported by the notebook:
    os.chdir(ROOT)                                    # its paths (configs/, data/, out/) are the repository's
    sys.path.insert(0, ROOT)
    warnings.filterwarnings("ignore", message="IProgress not found")   # tqdm's, in a notebook without ipywidgets


# ---- training: child processes that end with this one

def launch(run, args):
    """python train.py ARGS in the background, its output in RUN.log, one thread; through this file's __main__ (below),
    so that it gets SIGTERM when this process dies."""
    os.makedirs(os.path.dirname(run) or ".", exist_ok=True)
    with open(f"{run}.log", "w") as log:
        return subprocess.Popen([sys.executable, os.path.abspath(__file__), str(os.getpid()), "train.py", *args],
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})


def done(run):
    """Whether `run` holds a checkpoint at its max_steps (a run stopped early is resumed when trained again)."""
    from checkpoint import list_checkpoints
    path = os.path.join(run, "config.json")
    steps = json.load(open(path))["config"]["max_steps"] if os.path.exists(path) else None
    return steps is not None and any(step >= steps for step, _ in list_checkpoints(run))


def stop(jobs, wait=20):
    """SIGTERM to each job still running (train.py saves a checkpoint and stops), SIGKILL after `wait` seconds."""
    for job in jobs:
        if job.poll() is None:
            job.terminate()
    for job in jobs:
        try:
            job.wait(wait)
        except subprocess.TimeoutExpired:
            job.kill()
            job.wait()


def train(jobs, at_once=2):
    """Train each {run folder: train.py arguments} not already done, at most `at_once` at a time, printing a line as
    each ends. Raises if a run fails or stops short of its max_steps; stops the others first, whatever ends it."""
    waiting, running, t0 = [], {}, time.time()
    for run, args in jobs.items():
        if done(run):
            print(f"  {run}: trained before, reused")
        else:
            waiting.append((run, args))
    try:
        while waiting or running:
            while waiting and len(running) < at_once:
                run, args = waiting.pop(0)
                running[run] = (launch(run, args), time.time())
            time.sleep(0.5)
            for run, (job, started) in list(running.items()):
                if job.poll() is None:
                    continue
                del running[run]
                if job.returncode or not done(run):
                    raise RuntimeError(f"train.py stopped short for {run}:\n" + open(f"{run}.log").read()[-3000:])
                print(f"  {run}: trained in {time.time() - started:.0f} s ({time.time() - t0:.0f} s so far)",
                      flush=True)
    finally:
        stop([job for job, _ in running.values()])


# ---- the runs the tour opens

class Tour:
    """The runs the notebook opens: data (the shards), out (where the notebook trains its own runs), runs {"base",
    "jreg": folder}, models {name: model}, meta {name: load_run's meta}, enc (the tokenizer), n_layer."""

    def __init__(self, data, out, runs, continue_batch):
        from lib.commands import load_run
        self.data, self.out, self.runs, self.continue_batch = data, out, runs, continue_batch
        self.models, self.meta = {}, {}
        for name, run in runs.items():
            self.models[name], self.enc, self.meta[name] = load_run(run)   # the latest checkpoint, as evaluate.py
        self.n_layer = self.models["base"].config.n_layer

    def sweep(self, lambdas, alpha, weighting, steps):
        """{λ: run folder}: the baseline continued for `steps` steps (fast mode: FAST_STEPS) with JREG at each λ, this
        α and weighting, two runs at a time, each evaluated at its start and end (its log.jsonl: zeta_log); runs
        already trained (the same folder name) are reused."""
        steps = FAST_STEPS if FAST else steps
        runs = {lam: f"{self.out}/sweep/lambda{lam:g}_alpha{alpha:g}_{weighting}_{steps}steps" for lam in lambdas}
        tokens = int(next(a for a in self.continue_batch if a.startswith("--batch_tokens="))[15:])
        print(f"{len(runs)} run{'s' * (len(runs) > 1)} of {steps} steps x {tokens:,} tokens from "
              f"{self.runs['base']}, two at a time")
        train({run: ["configs/kjv_jreg.py", f"--init_from={self.runs['base']}", f"--out_dir={run}",
                     f"--data_dir={self.data}", f"--jreg_lambda={lam}", f"--jreg_alpha={alpha}",
                     f"--jreg_weighting={weighting}", f"--max_steps={steps}", f"--eval_interval={steps}",
                     f"--ckpt_interval={steps}", "--keep_ckpts=1", *self.continue_batch] for lam, run in runs.items()})
        return runs

    def close(self):
        """The fast mode's temporary folder removed (its data and runs); the notebook's own runs otherwise kept."""
        if FAST:
            shutil.rmtree(self.out, ignore_errors=True)


def prepare(data, *limits):
    """The KJV as byte-level shards in `data`, by quickstart.sh's command (limits: a smaller slice): the command run,
    as the training runs are, not its main imported (no command imports another)."""
    from lib.preparation import kjv_path
    done = subprocess.run([sys.executable, "prepare_fineweb.py", "--input", kjv_path(), "--out_dir", data, "--prefix",
                           "kjv", "--tokenizer", "bytes", "--quiet", *limits], cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit((done.stderr.strip().splitlines() or [f"error: prepare_fineweb.py exited {done.returncode}"])[-1])


def train_pair(out, *settings):
    """quickstart.sh's two runs, the baseline (configs/kjv.py) and JREG (configs/kjv_jreg.py), trained with these
    settings into out/base and out/jreg (reused where done); {"base", "jreg": folder}."""
    runs = {name: f"{out}/{name}" for name in ("base", "jreg")}
    train({runs["base"]: ["configs/kjv.py", f"--out_dir={runs['base']}", *settings],
           runs["jreg"]: ["configs/kjv_jreg.py", f"--out_dir={runs['jreg']}", *settings]})
    return runs


def start():
    """The Tour of the quick start's two runs; without them, two runs of 150 steps trained into out/tour first (fast
    mode: two of 4 steps on a slice of the text, in a temporary folder)."""
    if FAST:
        print(BANNER)
        out = tempfile.mkdtemp(prefix="jreg_tour_")
        prepare(f"{out}/kjv_bytes", "--val_tokens", "20000", "--shard_tokens", "50000", "--max_tokens", "70000")
        runs = train_pair(out, f"--data_dir={out}/kjv_bytes", *FAST_BATCH, "--max_steps=4", "--warmup_steps=2",
                          "--eval_interval=2", "--ckpt_interval=4")
        return Tour(f"{out}/kjv_bytes", out, runs, FAST_BATCH + CONTINUE[:2] + ["--eval_batches=1"])
    if done(f"{QUICK}/base") and done(f"{QUICK}/jreg"):
        return Tour(DATA, "out/tour", {"base": f"{QUICK}/base", "jreg": f"{QUICK}/jreg"}, CONTINUE)
    if not os.path.exists(f"{DATA}/manifest.json"):
        prepare(DATA, "--val_tokens", "200000", "--shard_tokens", "1000000")
    print(f"no quick-start runs in {QUICK}: training two of 150 steps into out/tour first (several minutes)")
    runs = train_pair("out/tour", "--max_steps=150", "--eval_interval=25", "--ckpt_interval=150", "--keep_ckpts=1")
    return Tour(DATA, "out/tour", runs, CONTINUE)


# ---- what the cells read

def elapsed():
    """Seconds since the notebook imported this module."""
    return time.time() - STARTED


def zeta_log(run):
    """ζ over training from run/log.jsonl: {"step", "zeta_L"} of the step records (ζ_L of each step's training batch)
    and {"eval_step", "eval_zeta" (ζ_2..ζ_L), "eval_zeta_L", "val_loss"} of the eval records (the fixed validation
    windows, as profile_model measures them)."""
    records = []
    for line in open(os.path.join(run, "log.jsonl")):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:                  # a torn last line of a killed run
            pass
    steps = [r for r in records if r.get("zeta_L") is not None]
    evals = [r for r in records if "val_loss" in r and r.get("zeta")]
    return {"step": [r["step"] for r in steps], "zeta_L": [r["zeta_L"] for r in steps],
            "eval_step": [r["step"] for r in evals], "eval_zeta": [r["zeta"] for r in evals],
            "eval_zeta_L": [r["zeta"][-1] for r in evals],
            "val_loss": [r["val_loss"] for r in evals]}


def seed_runs():
    """{condition: {seed: profile}} of the committed seed study, results/kjv/seeds/*.json: the baseline (base) and JREG
    with α = 1 (jreg_a1) and α = 3 (jreg_a3), each trained as quickstart.sh trains, on 5 seeds, by
    results/kjv/run_seeds.py; each profile as evaluate.py --profile writes it (loss, psi, zeta, ...)."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "results", "kjv", "seeds", "*.json"))):
        run = json.load(open(path))
        runs.setdefault(run["condition"], {})[run["seed"]] = run["profile"]
    return runs


def edit_from_docs(name):
    """The diff of docs/ablations.md that adds the weighting `name` to jreg.py."""
    text = open(os.path.join(ROOT, "docs", "ablations.md")).read()
    section = next(part for part in text.split("\n## ") if part.startswith(tuple("0123456789")) and f"`{name}`" in
                   part.splitlines()[0])
    return section.split("```diff\n", 1)[1].split("```", 1)[0]


CHECK = """
import json, sys
sys.path[:0] = sys.argv[3:]                        # a folder searched first (the tests' edited jreg.py)
import config, jreg
name, n_layer = sys.argv[1], int(sys.argv[2])
found = {"weightings": list(jreg.WEIGHTINGS)}
try:
    found["weights"] = jreg.layer_weights(n_layer, 1.0, name).tolist()
    config.load_config(["configs/kjv_jreg.py", "--jreg_weighting=" + name])      # train.py's check of the settings
    found["accepted"] = True
except (ValueError, SystemExit) as e:
    found["error"] = str(e)
print(json.dumps(found))
"""


def check_weighting(name, expected, pythonpath=None):
    """Whether jreg.py, imported afresh as train.py imports it, has the weighting `name` with these weights (a list,
    w_1..w_L), and train.py accepts --jreg_weighting=name. Prints what it found; returns True or False.
    pythonpath: a folder searched before the repository (the tests: an edited copy of jreg.py)."""
    argv = [sys.executable, "-c", CHECK, name, str(len(expected)), *([pythonpath] if pythonpath else [])]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    found = json.loads(done.stdout) if done.returncode == 0 else {}
    weights = found.get("weights")
    if done.returncode:                                # an edit that breaks the import: its error's last line
        print(f"jreg.py does not import as train.py imports it: {done.stderr.strip().splitlines()[-1]}")
    elif name not in found["weightings"]:
        print(f"not yet added: jreg.WEIGHTINGS is {tuple(found['weightings'])}, without {name!r}")
    elif "error" in found:
        print(f"not yet working: {found['error']}")
    elif any(abs(a - b) > 1e-6 for a, b in zip(weights, expected)):
        print(f"added, but layer_weights gives {[round(w, 3) for w in weights]}, not {[round(w, 3) for w in expected]}")
    else:
        print(f"added: jreg.layer_weights({len(expected)}, α, {name!r}) = {[round(w, 3) for w in weights]}, and "
              f"train.py accepts --jreg_weighting={name}")
        return True
    return False


# ---- run as a script: the launcher of one training run (`launch`)

if __name__ == "__main__":                  # python tour_runs.py PARENT_PID PROGRAM ARGS...
    import argparse
    p = argparse.ArgumentParser(usage="python notebooks/tour_runs.py PARENT_PID PROGRAM [ARGS ...]",
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="The launcher of one of the notebook's training runs (`launch`): becomes "
                                "python PROGRAM ARGS, which gets SIGTERM\nwhen process PARENT_PID ends. The notebook "
                                "imports this file for the rest:\n" + __doc__)
    p.add_argument("parent", type=int, metavar="PARENT_PID", help="the process whose end stops the run")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="PROGRAM ARGS", help="what to run: python PROGRAM ARGS")
    a = p.parse_args()
    if not a.argv:
        p.error("PROGRAM is required")
    parent, argv = a.parent, a.argv
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:              # the parent died before the request: end now
        sys.exit(1)
    os.execv(sys.executable, [sys.executable, *argv])   # becomes python train.py ...; the request survives exec
