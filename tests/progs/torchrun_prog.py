"""A torchrun program: gloo on CPU, one all_reduce, one probed split decision per rank.

Prints `rank <rank> of <world> pid <pid> sum <all_reduce result>` per rank.
"""

import os

import torch
import torch.distributed as dist

from mlatrace.reference import policies


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([rank + 1.0])
    dist.all_reduce(value)
    policies.num_kv_splits("legacy", 1, 1, 16, 1 + 4096 * rank)
    # one write(2) of a short line: atomic on a pipe, so two ranks' lines never interleave
    os.write(1, f"rank {rank} of {world} pid {os.getpid()} sum {int(value.item())}\n".encode())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
