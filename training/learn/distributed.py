"""torchrun / DistributedDataParallel plumbing (CPU on gloo, CUDA on nccl)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistributedContext:
    """Where this process stands in the job; a single process is rank 0 of 1."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str) -> DistributedContext:
    """Join the process group that torchrun describes in the environment (no-op without it)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistributedContext()
    if not dist.is_initialized():
        backend = "nccl" if device.startswith("cuda") else "gloo"
        dist.init_process_group(backend=backend)
    return DistributedContext(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
    )


def process_device(device: str, context: DistributedContext) -> torch.device:
    """This process' device: under torchrun on CUDA, the GPU of its local rank."""
    if device.startswith("cuda") and context.enabled:
        return torch.device("cuda", context.local_rank)
    return torch.device(device)


def ddp_device_ids(device: torch.device) -> list[int] | None:
    """DistributedDataParallel's `device_ids`: the one GPU, or None on the CPU."""
    return [device.index or 0] if device.type == "cuda" else None


def shutdown_distributed(context: DistributedContext) -> None:
    """Leave the group together: rank 0 hosts the rendezvous store, so a rank that tears down
    while another is still in its last collective makes gloo abort the straggler."""
    if context.enabled and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def gather_states(context: DistributedContext, state: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's copy of a uint8 RNG state, in rank order (a collective: all ranks call it)."""
    if not context.enabled:
        return [state]
    gathered: list[object] = [None] * context.world_size
    dist.all_gather_object(gathered, state)
    return [item for item in gathered if isinstance(item, torch.Tensor)]


def average_gradients(context: DistributedContext, parameters: list[torch.nn.Parameter]) -> None:
    """All-reduce mean of the gradients of parameters that DDP does not manage."""
    if not context.enabled:
        return
    for parameter in parameters:
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad)
            parameter.grad /= context.world_size


def barrier(context: DistributedContext) -> None:
    if context.enabled:
        dist.barrier()
