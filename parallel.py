"""
How a training step is spread over processes and devices, and nothing of what it computes: torchrun's environment,
the device of each process, DDP and FSDP2 as torchtitan sets them for a compiled model, and the micro-batches' copies
to the GPU. The calls whose order matters are here, each named for what it guarantees:

    proc = processes()                           # rank, local_rank, world, local_world; proc.distributed
    device, autocast = place(cfg, proc)          # this process's device; bf16 autocast over fp32 weights, or none
    group = Group(proc, device, cfg)             # the process group (torchrun's processes), before the model is built
    shard_fsdp(model, cfg)                       # fsdp=True: blocks compiled, then sharded (in train.build_model)
    group.wrap(objective, model)                 # group.forward: DDP before torch.compile; group.set_gradient_sync(on)
    group.close()                                # DDP's reducer freed while the group lives, then the group
"""
import dataclasses
import gc
import inspect
import os
from contextlib import nullcontext
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
    """(device, autocast) of this process: its device (process_device; cfg.device set to it) made current, TF32
    matmuls allowed, and bf16 autocast over the fp32 weights where dtype asks for it (auto: on CUDA)."""
    if cfg.fsdp and not proc.distributed:
        fail("fsdp=True needs torch.distributed: launch with torchrun (--nproc_per_node=1 for one GPU)")
    cfg.device = process_device(cfg.device, proc.local_rank, proc.local_world)
    device = torch.device(cfg.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    bf16 = cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and device.type == "cuda")
    return device, torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()


class Group:
    """The processes torchrun started, as one training step: the process group (NCCL on CUDA, gloo on CPU), made before
    the model is built; wrap() gives the step's forward, close() ends it all in the order that cannot hang. One process
    (no torchrun): no group, the objective as it is."""

    def __init__(self, proc, device, cfg):
        self.distributed, self.fsdp, self.compile = proc.distributed, cfg.fsdp, cfg.compile
        if self.distributed:
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                    timeout=timedelta(minutes=cfg.dist_timeout_min))
        self.device = device

    def wrap(self, objective, model):
        """self.forward (the objective, DDP-wrapped before torch.compile as PyTorch documents, so that gradient buckets
        overlap the backward; under FSDP the blocks were compiled as they were sharded, the penalty apart) and
        self.set_gradient_sync(on) (whether this micro-batch's backward reduces gradients: only the last one's does)."""
        if self.distributed and not self.fsdp:
            objective = wrap_ddp(objective, self.device)
        self.forward = torch.compile(objective) if self.compile and not self.fsdp else objective
        self.set_gradient_sync = gradient_sync(model, objective, self.fsdp, self.distributed)

    def close(self):
        """DDP's reducer goes first, while the group lives: were it the last holder of a gloo group, freeing it after
        destroy_process_group would join the group's thread holding the GIL (a deadlock). So every handle to it goes:
        ours (the caller keeps none) and compiled code's."""
        if not self.distributed:
            return
        del self.forward, self.set_gradient_sync
        torch._dynamo.reset()
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


def shard_fsdp(model, cfg):
    """FSDP2 in torchtitan's placement: each block compiled (when cfg.compile), then sharded; the top level compiled in
    parts (the final norm, the loss's chunks; the objective compiles the penalty). Groups: the embedding (resharded
    after forward), each block, and the root with the final norm and head (kept gathered after forward: the backward
    starts there; a tied embedding stays with them, one matrix). Weights gathered in fsdp_param_dtype, gradients
    reduced in fp32 (docs/training.md, "Numerics")."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    policy = dict(mp_policy=MixedPrecisionPolicy(param_dtype=getattr(torch, cfg.fsdp_param_dtype),
                                                 reduce_dtype=torch.float32))
    if cfg.compile:
        model.norm.compile()
        model.loss_fn.compile()
    if not model.config.tie_embeddings:
        fully_shard(model.tok_emb, **policy)
    for block in model.layers:
        if cfg.compile:
            block.compile()                             # in place: parameter names unchanged
        fully_shard(block, **policy)
    fully_shard(model, **policy)


def wrap_ddp(module, device):
    """DDP as torchtitan sets it for a compiled model: no broadcast of buffers (the only ones, RoPE's tables, never
    change) and 100 MB gradient buckets (compiled DDP breaks the graph at each bucket: 25 MB cut a 170M model's into
    ~26 pieces)."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    no_sync = "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP).parameters else \
        "broadcast_buffers"                                      # its name before torch 2.13
    return DDP(module, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=100,
               **{no_sync: False})


def gradient_sync(model, wrapped, fsdp, distributed):
    """set(on): whether this micro-step's backward reduces gradients across processes (only the last one's does)."""
    if fsdp:
        return model.set_requires_gradient_sync
    if distributed:
        return lambda on: setattr(wrapped, "require_backward_grad_sync", on)
    return lambda on: None


def to_device(batches, device):
    """A step's micro-batches on the device: copied from pinned memory, so the copies do not stop the host (a copy from
    pageable memory to a GPU waits for the GPU)."""
    if device.type == "cpu":
        return batches
    move = lambda t: None if t is None else t.pin_memory().to(device, non_blocking=True)   # noqa: E731
    return [tuple(move(t) for t in batch) for batch in batches]
