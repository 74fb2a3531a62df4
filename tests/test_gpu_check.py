"""scripts/gpu_check.sh, the GPU check that a rarely lent CUDA machine runs in one ~10-minute call, checked here end
to end by its CPU dry run (DRY_RUN=1: the same script and code paths, 2 processes on gloo, the tiny preset): every
step runs and passes, the FSDP run resumes, the run folders are removed, and the summary has a row of numbers per
config. Also its one-line refusals (no python with torch, no GPU, a STEPS typo), which cost nothing where they fire."""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository
SCRIPT = os.path.join(HERE, "scripts", "gpu_check.sh")
STEPS = ["probe", "prepare", "estimate", "probe_3.4b", "loss_chunks_170m", "train_170m_jreg", "train_1b", "full_disk_1b",
         "train_1b_resume", "resume_matches_1b", "bench_170m", "probe_170m"]
# the environment probe first, then the cheap eager probes; a full disk at the 1B run's checkpoint (dry run); the
# resumed steps compared with the first run's
PROBE_ROWS = [f"{p} {v}" for p in ("probe_170m", "probe_3.4b")
              for v in ("full logits", "chunked loss", "chunked + checkpointing")]
NUMBER = re.compile(r"^[\d,]+(\.\d+)?$")


def gpu_check(tmp_path, timeout=600, path=None, **env):
    env = {**os.environ, "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"), **env}
    env.pop("RANK", None)
    # the script's `python` is the one running the tests, whether or not its environment is activated
    env["PATH"] = path or f"{os.path.dirname(sys.executable)}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(["bash", SCRIPT], env=env, capture_output=True, text=True, timeout=timeout)


def table(summary):
    """The summary's main table: {step: {column: cell}}."""
    lines = [line for line in summary.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[1:]:                          # (the |---| line does not start with "| ")
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != len(header):
            break                                   # the steps table below
        rows[cells[0]] = dict(zip(header, cells))
    return rows


def test_gpu_check_parses():
    assert subprocess.run(["bash", "-n", SCRIPT], capture_output=True).returncode == 0


def test_dry_run_runs_every_step_resumes_and_summarizes(tmp_path):
    done = gpu_check(tmp_path, DRY_RUN="1")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    out, work = tmp_path / "out", tmp_path / "work"

    # the versions come first, in the log and the summary
    log = (out / "gpu_check.log").read_text()
    first = log.splitlines()[0]
    assert first.startswith("torch ") and all(k in first for k in ("CUDA", "transformers", "GPU", "git on PATH",
                                                                   "torchrun on PATH")), first
    summary = (out / "summary.md").read_text()
    assert first in summary

    # every step ran, in order, and passed
    steps = [line.split("\t") for line in (out / "steps.tsv").read_text().splitlines()]
    assert [s[0] for s in steps] == STEPS
    assert all(rc == ("1" if name == "full_disk_1b" else "0") for name, rc, _ in steps), steps
    assert all(f"| {name} | {1 if name == 'full_disk_1b' else 0} |" in summary for name in STEPS)
    assert re.match(r"free disk: \S+ in ", log.splitlines()[1]), log.splitlines()[1]

    # a full disk at the sharded checkpoint: one error line, nothing half-written, the run resumes from the one before
    full = (out / "steps" / "full_disk_1b.txt").read_text()
    errors = [line for line in full.splitlines() if line.startswith("error:")]
    assert errors and all(re.fullmatch(r"error: cannot write checkpoint \S+/ckpt_0000006: .*\. [\d.]+ GiB free in "
                                       r"\S+\. The last good checkpoint is \S+/ckpt_0000003; rerun to resume from "
                                       r"it, once there is room", line) for line in errors), errors
    assert "CheckpointException" not in full, full[-3000:]     # the ranks' own error, no gathered traceback

    rows = table(summary)
    assert set(rows) == {"train_170m_jreg", "train_1b", "train_1b_resume", "bench_170m ours λ=0",
                         "bench_170m ours λ=1", *PROBE_ROWS, "loss_chunks_170m chunk 16",
                         "loss_chunks_170m chunk 128"}, list(rows)
    assert re.fullmatch(r"8 chunks; speed vs chunk 16: 1\.000x; [\d.]+ bytes per logit; head-gradient traffic [\d.]+ GB",
                        rows["loss_chunks_170m chunk 16"]["notes"]), rows["loss_chunks_170m chunk 16"]
    for name, row in rows.items():
        assert NUMBER.match(row["tok/s"]) and float(row["tok/s"].replace(",", "")) > 0, (name, row)
        assert row["MFU"] == "n/a", (name, row)                       # no peak FLOP/s on a CPU
    for name in ("train_170m_jreg", "train_1b", "train_1b_resume"):   # train.py: CUDA peak n/a, the estimate a number
        assert rows[name]["peak GiB"] == "n/a" and NUMBER.match(rows[name]["estimate GiB"]), rows[name]
    for name in PROBE_ROWS:                                           # the probes measure on CPU too (profiler)
        assert NUMBER.match(rows[name]["peak GiB"]) and NUMBER.match(rows[name]["estimate GiB"]), rows[name]
        assert float(rows[name]["peak GiB"]) > 0
    assert rows["train_1b"]["how"].startswith("FSDP2 x2") and rows["train_170m_jreg"]["how"].startswith("DDP x2")
    overhead = rows["bench_170m ours λ=1"]["JREG overhead (λ=1 / λ=0)"]
    assert re.fullmatch(r"\d+\.\d{3}x step time \([+-]\d+\.\d%\)", overhead), overhead

    # the 1B (here tiny) FSDP run resumed from its sharded checkpoint and went on to twice its steps
    resume = (out / "steps" / "train_1b_resume.txt").read_text()
    assert re.search(r"resuming from \S+/ckpt_0*3 at step 3", resume), resume[-2000:]
    assert "resumed at step 3" in rows["train_1b_resume"]["notes"]
    assert rows["train_1b_resume"]["notes"].startswith("steps 4-6")
    assert "vs train_1b: loss 0.0e+00, grad_norm 0.0e+00" in rows["train_1b_resume"]["notes"]   # exact on a CPU
    assert (out / "steps" / "resume_matches_1b.txt").read_text().startswith(
        "steps 4-6 redone after the resume from step 3: worst relative difference: loss 0.0e+00, grad_norm 0.0e+00")
    probe = (out / "steps" / "probe.txt").read_text()
    assert re.match(r"probe: every module and tool the steps need is here; one tiny op compiled and run on cpu", probe)
    assert rows["train_1b"]["notes"].startswith("steps 1-6")
    assert "--keep_ckpts=1" in log and "--sharded_ckpt=True" in log and "torch.distributed.run" in log
    assert "--no_hf" in log                                           # no transformers comparison unless HF=1

    # bench.py --memory ran once, for both configs; the run folders are gone, their logs kept
    assert log.count("bench.py --memory ") == 1
    assert all(f"{out}/configs/{c}.py" in (out / "estimate.txt").read_text() for c in ("170m_jreg", "1b"))
    assert not (work / "170m_jreg").exists() and not (work / "1b").exists()
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["train_170m_jreg.jsonl", "train_1b.jsonl",
                                                                "train_1b_resume.jsonl"]


def test_the_probe_names_each_missing_piece_in_one_line_in_seconds(tmp_path):
    """Step 0 imports every module the steps need and compiles one tiny op, before anything else: transformers missing
    (HF=1 needs it) is one line and the call stops, seconds in; tiktoken missing is not a problem (shards name their
    tokenizer; nothing the steps run loads it). (Before: train.py and bench.py needed tiktoken through data.py, and a
    missing compiler showed only at the first compiled step, minutes in.)"""
    hidden = tmp_path / "hidden"
    for name in ("tiktoken", "tiktoken_ext", "transformers"):
        (hidden / name).mkdir(parents=True)
        (hidden / name / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named '{name}'\")\n")
    done = gpu_check(tmp_path, timeout=300, DRY_RUN="1", HF="1", PYTHONPATH=str(hidden))
    probe = (tmp_path / "out" / "steps" / "probe.txt").read_text()
    errors = [line for line in probe.splitlines() if line.startswith("error:")]
    assert done.returncode == 1 and errors == [
        "error: import transformers (HF=1 (step 3)): ModuleNotFoundError: No module named 'transformers'"], probe
    steps = [line.split("\t")[0] for line in (tmp_path / "out" / "steps.tsv").read_text().splitlines()]
    assert steps == ["probe"] and "the probe failed" in done.stdout


def stub(folder, name, body="#!/bin/sh\nexit 1\n"):
    (folder / name).write_text(body)
    (folder / name).chmod(0o755)


def test_no_python_with_torch_is_one_line(tmp_path):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    stub(bin_, "python")
    stub(bin_, "python3")
    done = gpu_check(tmp_path, timeout=60, path=f"{bin_}:/usr/bin:/bin")
    assert done.returncode == 1
    assert done.stderr == "error: neither python nor python3 can import torch\n"
    assert not (tmp_path / "out").exists()


def test_python3_is_used_when_python_lacks_torch_and_no_gpu_is_one_line(tmp_path):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    stub(bin_, "python")                                              # python without torch: python3 is chosen
    # python3 runs this Python by its own path (a symlink to a virtual environment's python would start the base
    # interpreter, which may lack torch), and leaves a mark that it was called
    stub(bin_, "python3", f'#!/bin/sh\ntouch "{tmp_path}/python3_called"\nexec "{sys.executable}" "$@"\n')
    done = gpu_check(tmp_path, timeout=120, path=f"{bin_}:/usr/bin:/bin", CUDA_VISIBLE_DEVICES="")
    assert done.returncode == 1
    assert done.stderr.startswith("error: no CUDA GPU visible to python3") and done.stderr.count("\n") == 1
    env = (tmp_path / "out" / "env.txt").read_text()
    assert env.startswith("torch ") and f"({sys.executable})" in env and "GPU none" in env
    assert (tmp_path / "python3_called").exists()
    assert not (tmp_path / "work" / "170m_jreg").exists()


def test_a_steps_typo_fails_before_anything_runs(tmp_path):
    done = gpu_check(tmp_path, timeout=60, STEPS="1 7")
    assert (done.returncode, done.stderr) == (1, "error: STEPS: no step 7 (1-6)\n")
    assert not (tmp_path / "out").exists()
