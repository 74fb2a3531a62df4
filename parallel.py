"""
How a training step is spread over processes and devices, and nothing of what it computes: torchrun's environment,
the device of each process, DDP and FSDP2 as torchtitan sets them for a compiled model, and the micro-batches' copies
to the GPU.

    proc = processes()                           # rank, local_rank, world, local_world; proc.distributed
    device = process_device("auto", proc.local_rank, proc.local_world)
    shard_fsdp(model, cfg)                       # fsdp=True: blocks compiled, then sharded
    objective = wrap_ddp(objective, device)      # DDP (not FSDP), before torch.compile
"""
import dataclasses
import inspect
import os

import torch

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


def gradient_sync(model, wrapped, cfg, distributed):
    """set(on): whether this micro-step's backward reduces gradients across processes (only the last one's does)."""
    if cfg.fsdp:
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
