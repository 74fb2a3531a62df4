"""
What the studies' run scripts share (results/kjv/run_seeds.py, results/methods/run_comparison.py): a run is train.py
then evaluate.py --profile in processes of their own, one thread each, and the result is one JSON file per run,
written whole (a rerun goes on with the runs that have none).
"""
import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = ["--max_steps=300", "--eval_interval=50", "--ckpt_interval=300", "--keep_ckpts=1"]   # as quickstart.sh


def train_and_profile(config, folder, seed, *settings):
    """Train config into folder with this seed (and any --key=value settings) at the quick start's budget, then
    profile it: {config, evals (the periodic val loss, Ψ, ζ), steps (every 10th), last_step, profile, step_seconds
    (each step's wall-clock)}."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = lambda *cmd: subprocess.run([sys.executable, *cmd], cwd=ROOT, env=env, check=True,   # noqa: E731
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    run("train.py", config, f"--out_dir={folder}", f"--seed={seed}", *STEPS, *settings)
    run("evaluate.py", folder, "--profile", "--out", os.path.join(folder, "profile.json"))
    records = [json.loads(line) for line in open(os.path.join(folder, "log.jsonl"))]
    steps = [r for r in records if "loss" in r]
    return {"config": json.load(open(os.path.join(folder, "config.json")))["config"],
            "evals": [r for r in records if "val_loss" in r], "steps": [r for r in steps if r["step"] % 10 == 0],
            "last_step": steps[-1], "profile": json.load(open(os.path.join(folder, "profile.json")))["profile"],
            "step_seconds": [r["tokens"] / r["step"] / r["tok_per_s"] for r in steps]}


def machine():
    """The CPU, torch and commit a run is made with (each run's JSON records them)."""
    cpu = platform.processor()
    if os.path.exists("/proc/cpuinfo"):
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                   cpu)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    import torch
    return {"cpu": cpu, "torch": torch.__version__, "commit": commit.strip() or None}


def save(result, path):
    """Write the JSON whole or not at all (a killed run leaves no half file to be taken as done)."""
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(path + ".tmp", path)


def run_pending(one, conditions, seeds, folder, jobs):
    """one(condition, seed) for every pair whose folder/CONDITION_seedN.json is missing, `jobs` at a time."""
    os.makedirs(folder, exist_ok=True)
    todo = [(c, s) for s in seeds for c in conditions if not os.path.exists(os.path.join(folder, f"{c}_seed{s}.json"))]
    t0 = time.time()
    print(f"{len(todo)} runs to go, {jobs} at a time", flush=True)
    with ThreadPoolExecutor(jobs) as pool:
        for future in [pool.submit(one, c, s) for c, s in todo]:
            future.result()
    print(f"{len(todo)} runs in {time.time() - t0:.0f} s with {jobs} at a time")
