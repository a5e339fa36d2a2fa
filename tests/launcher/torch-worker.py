#!/usr/bin/python3
"""torch-worker.py: an unmodified PyTorch DDP-style worker for kiln-run's tests.

It uses only what a torchrun worker uses: init_process_group(init_method="env://")
reads MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE, and with
TORCHELASTIC_USE_AGENT_STORE=True torch connects to kiln-run's store as a
client (keys prefixed /worker/attempt_<TORCHELASTIC_RESTART_COUNT>).  It
all-reduces a tensor and checks the sum, then prints one line the tests grep:
  torch-ok rank R world W sum S
Backend: gloo (CPU), or nccl with --nccl (GPU machines)."""
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def main():
    backend = "nccl" if "--nccl" in sys.argv else "gloo"
    dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(dev)
    t = torch.arange(4, dtype=torch.float64, device=dev) + rank + 1
    dist.all_reduce(t)
    want = torch.arange(4, dtype=torch.float64, device=dev) * world + world * (world + 1) / 2
    if not torch.equal(t, want):
        print(f"torch-bad rank {rank} got {t.tolist()} want {want.tolist()}", flush=True)
        return 3
    dist.barrier()
    print(f"torch-ok rank {rank} world {world} sum {t[0].item():g}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
