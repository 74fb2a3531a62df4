"""
How a training step is spread over processes and devices, and nothing of what it computes: torchrun's environment,
the device and process group of each process, DDP or FSDP2 and torch.compile as torchtitan applies them, and the
micro-batches' copies to the GPU. Every decision of that kind is made here, in two calls, so the loop never asks
whether anything is distributed, sharded or compiled:

    proc = processes()                           # rank, local_rank, world, local_world; proc.distributed
    device, autocast = place(cfg, proc)          # this process's device, its process group (before any model), and
                                                 # bf16 autocast over fp32 weights, or none
    objective = parallelize(objective, cfg, device)   # DDP before torch.compile, or FSDP2 over compiled blocks, or as
                                                 # it is; before the optimizer (FSDP's parameters are its shards)
    objective(x, y, mask)                        # a micro-batch's forward, as the objective returns it
    objective.jreg_lambda                        # the objective's λ (loss.Objective)
    objective.at_step(step)                      # the objective at this step (LayerSkip's rotating early exits)
    objective.set_gradient_sync(on)              # whether this micro-batch's backward reduces gradients
    objective.clip_grad_norm(max_norm)           # the global gradient norm (a plain tensor), gradients clipped
    objective.evaluate(x, y)                     # the model's forward, eager (validation: no compile, no hooks)
    objective.close()                            # DDP's reducer freed while the group lives, then the group
    gather(values, device)                       # every process's tuple of ints, in rank order (an all-gather)
    compile_seconds()                            # what torch.compile has spent so far in this process
"""
import dataclasses
import gc
import inspect
import os
import re
import sys
from contextlib import nullcontext, suppress
from datetime import timedelta

import torch
import torch.distributed as dist

from config import fail


@dataclasses.dataclass
class Processes:
    """This process's place: torchrun's environment, or one process."""
    rank: int
    local_rank: int
    world: int
    local_world: int

    @property
    def distributed(self):
        return "RANK" in os.environ


def processes():
    env = lambda key, default: int(os.environ.get(key, default))          # noqa: E731
    return Processes(env("RANK", 0), env("LOCAL_RANK", 0), env("WORLD_SIZE", 1), env("LOCAL_WORLD_SIZE", 1))


def process_device(name, local_rank, local_world):
    """The device of this process: auto and a bare cuda are this node's GPU local_rank (torchrun's one GPU per process);
    cuda:N is refused where several processes of the node would all land on GPU N."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        return f"cuda:{local_rank}"
    if name.startswith("cuda:") and local_world > 1:
        fail(f"device = {name!r} puts all {local_world} processes of this node on one GPU: use device=cuda (or auto), "
             "which gives each process the GPU of its LOCAL_RANK")
    return name


def place(cfg, proc):
    """(device, autocast) of this process: its device (process_device) made current, TF32 matmuls allowed, the process
    group of torchrun's processes (NCCL on CUDA, gloo on CPU) made before any model is built, and bf16 autocast over
    the fp32 weights where dtype asks for it (auto: on CUDA)."""
    if cfg.fsdp and not proc.distributed:
        fail("fsdp=True needs torch.distributed: launch with torchrun (--nproc_per_node=1 for one GPU)")
    device = torch.device(process_device(cfg.device, proc.local_rank, proc.local_world))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    if proc.distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                timeout=timedelta(minutes=cfg.dist_timeout_min))
    bf16 = cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and device.type == "cuda")
    return device, torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()


def parallelize(objective, cfg, device):
    """The objective (an nn.Module over objective.model) as the loop calls it, spread as cfg says:
    - FSDP2 (fsdp=True, torchtitan's placement): each block compiled (compile=True), then sharded; the final norm, the
      loss's chunks and the penalty compiled apart (shard_fsdp);
    - DDP (torchrun's processes): the objective DDP-wrapped before torch.compile, as PyTorch documents, so that
      gradient buckets overlap the backward;
    - one process: the objective, compiled when compile=True.
    Call it before building the optimizer: under FSDP the model's parameters become its shards."""
    distributed = dist.is_initialized()
    if cfg.fsdp:
        shard_fsdp(objective.model, cfg)
        if cfg.compile:
            objective.displacement = torch.compile(objective.displacement)
        return Parallel(objective, objective, objective.model.set_requires_gradient_sync)
    wrapped = wrap_ddp(objective, device) if distributed else objective
    forward = torch.compile(wrapped) if cfg.compile else wrapped
    sync = (lambda on: setattr(wrapped, "require_backward_grad_sync", on)) if distributed else (lambda on: None)
    return Parallel(objective, forward, sync)


class Parallel:
    """What parallelize returns: the objective's forward (wrapped, compiled or both), and the calls around it whose
    behaviour depends on how it is spread."""

    def __init__(self, objective, forward, set_gradient_sync):
        self.model, self.forward, self.set_gradient_sync = objective.model, forward, set_gradient_sync
        self.jreg_lambda = objective.jreg_lambda                  # λ, by which the loop weighs the penalty
        self.at_step = objective.at_step                          # the step's early exits (loss.Objective)

    def __call__(self, *args):
        return self.forward(*args)

    def clip_grad_norm(self, max_norm):
        """The norm of every gradient together (under FSDP, of the whole, not this process's shard), clipped to
        max_norm (0: not clipped)."""
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm or float("inf"))
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def evaluate(self, *args):
        """The model's forward in eager mode, also under FSDP's compiled blocks (no-grad mode and a ragged last
        micro-batch would compile them again)."""
        with torch.compiler.set_stance("force_eager"):
            return self.model(*args)

    def close(self):
        """DDP's reducer goes first, while the group lives: were it the last holder of a gloo group, freeing it after
        destroy_process_group would join the group's thread holding the GIL (a deadlock). So every handle to it goes:
        ours (the caller keeps none) and compiled code's."""
        if not dist.is_initialized():
            return
        del self.forward, self.set_gradient_sync
        torch._dynamo.reset()
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


def shard_fsdp(model, cfg):
    """FSDP2 in torchtitan's placement: each block compiled (when cfg.compile), then sharded; the final norm and the
    loss compiled apart (its chunks then run compiled: loss.py). Groups: the embedding (resharded
    after forward), each block, and the root with the final norm and head (kept gathered after forward: the backward
    starts there; a tied embedding stays with them, one matrix). Weights gathered in fsdp_param_dtype, gradients
    reduced in fp32 (docs/training.md, "Numerics")."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    policy = dict(mp_policy=MixedPrecisionPolicy(param_dtype=getattr(torch, cfg.fsdp_param_dtype),
                                                 reduce_dtype=torch.float32))
    if cfg.compile:
        model.norm.compile()
        model.loss = torch.compile(model.loss)
    if not model.config.tie_embeddings:
        fully_shard(model.tok_emb, **policy)
    for block in model.layers:
        if cfg.compile:
            block.compile()                             # in place: parameter names unchanged
        fully_shard(block, **policy)
    fully_shard(model, **policy)


def gather(values, device):
    """Every process's `values` (a tuple of ints), in rank order; one process: [values]."""
    if not dist.is_initialized():
        return [tuple(values)]
    mine = torch.tensor(values, dtype=torch.long, device=device)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [tuple(t.tolist()) for t in every]


def compile_seconds():
    """Seconds this process has spent in torch.compile (tracing and code generation, forward and backward): 0 before
    any compile or where torch does not say (torch._dynamo.utils keeps the count)."""
    if "torch._dynamo" not in sys.modules:
        return 0.0
    with suppress(Exception):                          # a private API: it may move
        from torch._dynamo.utils import calculate_time_spent
        return float(calculate_time_spent().get("total_wall_time", 0.0))
    return 0.0


def wrap_ddp(module, device):
    """DDP as torchtitan sets it for a compiled model: no broadcast of buffers (RoPE's tables and the penalty's layer
    weights, never changed) and 100 MB gradient buckets (compiled DDP breaks the graph at each bucket: 25 MB cut a
    170M model's into ~26 pieces). Gradients are views into the buckets (gradient_as_bucket_view), not a second copy
    of each: 0.65 GB of fp32 at 170M, and a copy per bucket a step."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    no_sync = "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP).parameters else \
        "broadcast_buffers"                                      # its name before torch 2.13
    return DDP(module, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=100,
               gradient_as_bucket_view=True, **{no_sync: False})


def to_device(batches, device):
    """A step's micro-batches on the device: copied from pinned memory, so the copies do not stop the host (a copy from
    pageable memory to a GPU waits for the GPU)."""
    if device.type == "cpu":
        return batches
    move = lambda t: None if t is None else t.pin_memory().to(device, non_blocking=True)   # noqa: E731
    return [tuple(move(t) for t in batch) for batch in batches]


# Peak dense bf16 tensor FLOP/s for MFU, by the product name CUDA reports (a leading "NVIDIA " dropped), matched in
# full: an H100 PCIe or NVL is not an H100 SXM. An unknown device logs mfu = null.
PEAK_FLOPS = [(r"H100( 80GB HBM3| SXM5.*)?", "H100 SXM", 989e12), (r"H100 NVL", "H100 NVL", 835e12),
              (r"H100 PCIe", "H100 PCIe", 756e12), (r"H200( 141GB HBM3e)?", "H200 SXM", 989e12),
              (r"H200 NVL", "H200 NVL", 835e12), (r"GH200.*", "GH200", 989e12), (r"B200", "B200", 2250e12),
              (r"A100[- ].*", "A100", 312e12), (r"A800[- ].*", "A800", 312e12), (r"L40S", "L40S", 362e12),
              (r"L4", "L4", 121e12), (r"A10G", "A10G", 70e12), (r"A10", "A10", 125e12),
              (r"GeForce RTX 4090", "RTX 4090", 165e12), (r"GeForce RTX 3090", "RTX 3090", 71e12),
              (r"AMD Instinct MI300X.*", "MI300X", 1307e12), (r"AMD Instinct MI250X.*", "MI250X", 383e12)]


def peak_flops_of(name):
    """(the product whose peak applies, its peak FLOP/s) of a device name, or (None, None)."""
    name = name.removeprefix("NVIDIA ").strip()
    return next(((product, peak) for pattern, product, peak in PEAK_FLOPS if re.fullmatch(pattern, name)), (None, None))


def peak_flops(device):
    """(product, peak dense bf16 FLOP/s) of a CUDA device (peak_flops_of); (None, None) elsewhere."""
    return peak_flops_of(torch.cuda.get_device_name(device)) if device.type == "cuda" else (None, None)
