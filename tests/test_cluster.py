"""What a GPU cluster run takes that a CPU test does not: device placement under torchrun, DDP and FSDP2 settings,
host-to-device copies, resuming on another node shape, machines without git, file systems without flock, the torch
floor, the peak FLOP/s behind MFU. Each is checked here as far as a CPU allows (the CUDA calls are stubbed where
they would run); scripts/gpu_check.sh runs the real thing on a GPU."""
import errno
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist

import config as CF
import files as FILES
import parallel
import runs as R
import train
from test_train import HERE, TINY, data_dir, read_log, run, torchrun  # noqa: F401 (data_dir: a fixture)


@pytest.fixture
def one_process_group(tmp_path):
    """A real gloo process group of one process, for the wrappers that need one."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_resume_needs_no_gpu_random_state(data_dir, tmp_path, monkeypatch):
    """Training draws no random numbers after its seeded initialisation, so checkpoints keep no RNG state and a resume
    restores none. (Before: every checkpoint held rank 0's states of all its visible GPUs and a resume set them with
    set_rng_state_all: an IndexError where fewer GPUs are visible, and every rank given rank 0's states.)"""
    def fewer_gpus(*args):
        raise IndexError("list index out of range")                     # what a 4-GPU node does with 8 states
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)      # a GPU machine, training on the CPU
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [torch.zeros(16, dtype=torch.uint8)] * 8)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", fewer_gpus)
    monkeypatch.setattr(torch.cuda, "set_rng_state", fewer_gpus)
    args = ["--device=cpu", "--eval_interval=0", "--ckpt_interval=2"]
    whole, _ = run(data_dir, tmp_path / "whole", "--max_steps=4", *args)
    run(data_dir, tmp_path / "cut", "--max_steps=2", *args)
    ckpt = torch.load(tmp_path / "cut" / "ckpt_0000002.pt", weights_only=False)
    ckpt["rng"] = {"torch": torch.get_rng_state(), "cuda": [torch.zeros(16, dtype=torch.uint8)] * 8}   # an older one's
    torch.save(ckpt, tmp_path / "cut" / "ckpt_0000002.pt")
    resumed, _ = run(data_dir, tmp_path / "cut", "--max_steps=4", *args)
    assert [r["loss"] for r in resumed] == [r["loss"] for r in whole]
    assert "rng" not in torch.load(tmp_path / "cut" / "ckpt_0000004.pt", weights_only=False)


def test_run_info_without_git_records_null(monkeypatch, tmp_path):
    """(Before: FileNotFoundError from subprocess killed rank 0 at start where git is not installed.)"""
    monkeypatch.setenv("PATH", str(tmp_path))                           # no git on this PATH
    info = R.run_info(torch.device("cpu"))
    assert info["git_commit"] is None and info["git_dirty"] is None and info["torch"] == torch.__version__


# torchrun's options in torch 2.6, the oldest supported (torch/distributed/run.py of v2.6.0): a documented command
# must not use one that came later, such as --shutdown_timeout (torch 2.12)
TORCHRUN_2_6 = {"nnodes", "nproc_per_node", "nproc-per-node", "rdzv_backend", "rdzv-backend", "rdzv_endpoint",
                "rdzv-endpoint", "rdzv_id", "rdzv-id", "rdzv_conf", "rdzv-conf", "standalone", "max_restarts",
                "max-restarts", "monitor_interval", "monitor-interval", "start_method", "start-method", "role",
                "module", "no_python", "no-python", "run_path", "run-path", "log_dir", "log-dir", "redirects", "tee",
                "local_ranks_filter", "local-ranks-filter", "node_rank", "node-rank", "master_addr", "master-addr",
                "master_port", "master-port", "local_addr", "local-addr", "logs_specs", "logs-specs"}


def test_documented_torchrun_commands_run_on_the_oldest_supported_torch():
    """(Before: the Slurm recipe passed --shutdown_timeout=110, which a torchrun older than 2.12 rejects: the job never
    started.) The grace period is TORCH_ELASTIC_SHUTDOWN_TIMEOUT, which an older torchrun ignores."""
    docs = [os.path.join(HERE, "README.md")] + [os.path.join(HERE, "docs", n) for n in os.listdir(f"{HERE}/docs")]
    commands = []
    for path in docs:
        text = open(path).read().replace("\\\n", " ")
        commands += [(path, line) for line in text.splitlines() if re.search(r"\btorchrun\b.*\.py", line)]
    assert len(commands) >= 5
    for path, line in commands:
        cmd = line[line.index("torchrun"):].split(".py")[0]
        used = set(re.findall(r"(?<=\s)--([\w-]+)", cmd))
        assert used <= TORCHRUN_2_6, (path, used - TORCHRUN_2_6)
    assert "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" in open(os.path.join(HERE, "docs", "training.md")).read()


def test_the_torch_floor_is_checked_and_is_the_requirements():
    """requirements.txt's floor is config.MIN_TORCH, and an older torch is one line before anything is built."""
    assert f"torch>={CF.MIN_TORCH}" in open(os.path.join(HERE, "requirements.txt")).read().replace(" ", "")
    with pytest.raises(SystemExit, match="torch 2.5.1 is older than 2.6"):
        CF.check_torch("2.5.1")
    CF.check_torch("2.6.0a0+git1234")                                 # a 2.6 nightly has the APIs
    CF.check_torch("2.11.0+cu130")


def test_a_bare_cuda_device_is_the_gpu_of_the_local_rank(monkeypatch):
    """(Before: --device=cuda under torchrun put every rank on GPU 0 and handed DDP device_ids=[None].)"""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    for k, v in {"RANK": "11", "LOCAL_RANK": "3", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}.items():
        monkeypatch.setenv(k, v)
    proc = parallel.processes()
    assert (proc.rank, proc.local_rank, proc.world, proc.local_world) == (11, 3, 16, 8)
    for name in ("cuda", "auto"):
        assert parallel.process_device(name, proc.local_rank, proc.local_world) == "cuda:3"
    with pytest.raises(SystemExit, match="puts all 8 processes of this node on one GPU"):
        parallel.process_device("cuda:0", proc.local_rank, proc.local_world)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")                       # one GPU per task (Slurm): its own index stays
    assert parallel.process_device("cuda:0", 0, 1) == "cuda:0"


def test_a_file_system_without_flock_is_named_not_taken_for_another_process(tmp_path, monkeypatch):
    """(Before: any OSError of flock, e.g. ENOLCK on Lustre mounted noflock, said "in use by another training
    process" on every start.)"""
    def no_locks(f, op):
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(FILES.fcntl, "flock", no_locks)
    with pytest.raises(SystemExit) as e:
        R.lock_run(str(tmp_path / "run"))
    assert "does not support flock" in str(e.value) and "in use" not in str(e.value)
    def held(f, op):
        raise BlockingIOError(errno.EWOULDBLOCK, "Resource temporarily unavailable")
    monkeypatch.setattr(FILES.fcntl, "flock", held)
    with pytest.raises(SystemExit, match="in use by another training process"):
        R.lock_run(str(tmp_path / "run"))


def test_batches_go_to_a_gpu_from_pinned_memory(monkeypatch):
    """(Before: x.to(device, non_blocking=True) from pageable memory, which waits for the GPU at every micro-step.)
    A 'meta' device stands for the GPU here; on the CPU nothing is copied."""
    pinned = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: pinned.append(t) or t)
    x, y = torch.zeros(2, 8, dtype=torch.long), torch.ones(2, 8, dtype=torch.long)
    moved = parallel.to_device([(x, y, None), (x, y, x.bool())], torch.device("meta"))
    assert len(pinned) == 5 and all(t.device.type == "meta" for b in moved for t in b if t is not None)
    assert moved[0][2] is None
    batches = [(x, y, None)]
    assert parallel.to_device(batches, torch.device("cpu")) is batches and len(pinned) == 5


def test_ddp_keeps_its_buffers_and_uses_large_buckets(one_process_group):
    """(Before: PyTorch's defaults: RoPE's tables broadcast on every forward, 25 MB buckets.)"""
    ddp = parallel.wrap_ddp(torch.nn.Linear(4, 4), torch.device("cpu"))
    assert getattr(ddp, "forward_sync_buffers", ddp.broadcast_buffers) is False    # its name since torch 2.13
    assert ddp.bucket_bytes_cap == 100 * 2 ** 20
    assert ddp.gradient_as_bucket_view                      # no second copy of every gradient


def test_processes_that_would_start_from_different_checkpoints_refuse_in_one_line(data_dir, tmp_path):
    """A node-local out_dir: each rank lists its own folder, rank 0 finds a step-2 checkpoint, rank 1 none. Every rank
    stops with one line naming what each would resume from, before the first collective of training, and nothing is
    written. (Before: rank 0 resumed at step 2 and rank 1 started afresh; DDP broadcast rank 0's weights, rank 0 ran out
    of steps first and rank 1 waited for it in an all-reduce: a hang or a gloo error, minutes later on a cluster.)"""
    run(data_dir, tmp_path / "node0", "--max_steps=2", "--eval_interval=0")      # rank 0's folder: a step-2 checkpoint
    log_before = (tmp_path / "node0" / "log.jsonl").read_text()
    (tmp_path / "node_local.py").write_text(f'out_dir = "{tmp_path}/node" + __import__("os").environ["RANK"]\n')
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           os.path.join(HERE, "train.py"), str(tmp_path / "node_local.py"), *TINY, f"--data_dir={data_dir}",
           "--max_steps=4", "--eval_interval=0"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, timeout=120, env={**os.environ,
                       "OMP_NUM_THREADS": "1"})
    errors = {line for line in (r.stdout + r.stderr).splitlines() if line.startswith("error: ")}
    # each rank names its own out_dir; the first to exit may take the other down before it prints (torchrun's agent)
    assert r.returncode != 0 and errors and errors <= {
        f"error: the processes would start from different points of {tmp_path}/node{rank}: rank 0 step 2 (sequence "
        "16), rank 1 step 0 (sequence 0); out_dir must be one folder that every node sees (a shared file system)"
        for rank in (0, 1)}, r.stdout + r.stderr
    assert (tmp_path / "node0" / "log.jsonl").read_text() == log_before and not (tmp_path / "node1").exists()


def test_an_error_line_is_one_write_so_two_processes_lines_never_interleave(tmp_path):
    """Under torchrun every rank writes to one stderr pipe, unbuffered on clusters (PYTHONUNBUFFERED=1). train.py writes
    an error as one line in one write. (Before: Python's own exit printed the message and its newline in two writes,
    and another rank's line landed between them: "...file system)error: the processes..." on one line.)"""
    (tmp_path / "bad.py").write_text("no_such_setting = 1\n")
    probe = ("import runpy, sys\nwrites = []\nclass Pipe:\n    def write(self, s): writes.append(s); return len(s)\n"
             "    def flush(self): pass\nsys.stderr = Pipe()\nimport atexit\n"
             "atexit.register(lambda: sys.__stdout__.write(repr(writes)))\n"
             f"sys.argv = ['train.py', {str(tmp_path / 'bad.py')!r}]\nrunpy.run_path('train.py', run_name='__main__')\n")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=HERE, timeout=120,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
    writes = eval(r.stdout)
    assert r.returncode == 1 and len(writes) == 1 and writes[0].startswith("error: ") and writes[0].endswith("\n") \
        and "no_such_setting" in writes[0], (writes, r.stderr)


def test_fsdp_groups_the_root_as_torchtitan_and_gathers_in_the_chosen_dtype(one_process_group):
    """The embedding is its own FSDP group, resharded after forward, so the root keeps only the final norm and head
    gathered (the backward starts there: torchtitan's grouping); fsdp_param_dtype=bfloat16 gathers the weights in
    bf16 (the residual stream is then bf16), float32 (the default) keeps DDP's numerics."""
    from torch.distributed.fsdp import FSDPModule
    for dtype in ("float32", "bfloat16"):
        cfg = CF.load_config(TINY + ["--device=cpu", "--fsdp=True", f"--fsdp_param_dtype={dtype}"])
        model, _, _ = train.build_model(cfg, CF.model_config(cfg), torch.device("cpu"), None)
        assert all(isinstance(m, FSDPModule) for m in (model, model.tok_emb, *model.layers))
        assert not isinstance(model.lm_head, FSDPModule)    # the loss calls it inside torch.func: no FSDP hooks there
        out = model(torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long))
        assert out.hidden_states[-1].dtype == getattr(torch, dtype) and out.loss.dtype == torch.float32


def test_fsdp_with_bf16_weights_on_two_processes_tracks_one_fp32_process(data_dir, tmp_path):
    """Gradients are reduced in fp32 whatever fsdp_param_dtype: two processes gathering bf16 weights train as one fp32
    process does, to bf16's rounding (stated tolerance: 2e-2 in loss over 6 steps; measured 9.9e-4 on CPU)."""
    args = ["--max_steps=6", "--eval_interval=0", "--ckpt_interval=6", "--jreg_lambda=1.0"]
    one, _ = run(data_dir, tmp_path / "one", *args)
    two, _ = torchrun(2, tmp_path / "two", data_dir, *args, "--fsdp=True", "--fsdp_param_dtype=bfloat16")
    np.testing.assert_allclose([r["loss"] for r in two], [r["loss"] for r in one], rtol=0, atol=2e-2)
    assert two[-1]["loss"] < two[0]["loss"]


@pytest.mark.parametrize("name, product, tflops", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989), ("NVIDIA H100 PCIe", "H100 PCIe", 756),
    ("NVIDIA H100 NVL", "H100 NVL", 835), ("NVIDIA H200", "H200 SXM", 989), ("NVIDIA H200 NVL", "H200 NVL", 835),
    ("NVIDIA GH200 480GB", "GH200", 989), ("NVIDIA A100-SXM4-80GB", "A100", 312), ("NVIDIA A100 80GB PCIe", "A100", 312),
    ("NVIDIA L4", "L4", 121), ("NVIDIA L40S", "L40S", 362), ("NVIDIA A10G", "A10G", 70),
    ("NVIDIA GeForce RTX 4090", "RTX 4090", 165), ("NVIDIA RTX A6000", None, None), ("NVIDIA H20", None, None)])
def test_mfu_peaks_match_whole_product_names(name, product, tflops):
    """(Before: "H100" and "H200" matched inside "H100 NVL" and "H200 NVL", whose dense bf16 peaks are 835, not 989,
    TFLOP/s; "L4" inside "L40"; "A10" inside "A100" would have, but for the order of the table.)"""
    got, peak = parallel.peak_flops_of(name)
    assert got == product and (peak is None if tflops is None else peak == tflops * 1e12)
