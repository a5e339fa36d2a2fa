#!/usr/bin/python3
"""torch-steps.py: a PyTorch training-loop stand-in for kiln-run's benchmarks.

Runs unchanged under kiln-run and under torchrun: init_process_group("gloo",
init_method="env://"), then STEPS steps of all_reduce + sleep, rank 0
checkpointing the step count to CKPT.  Appends to LOG:
  spawned <unix time> world W rank R          (first thing, before importing torch)
  start <unix time> world W rank R step S     (when the worker is up, after init)
  finish <unix time> world W rank R
Usage: torch-steps.py LOG CKPT STEPS STEP_SECONDS"""
import os
import sys
import time

with open(sys.argv[1], "a") as _f:
    _f.write(f"spawned {time.time():.3f} world {os.environ['WORLD_SIZE']} rank {os.environ['RANK']}\n")

from datetime import timedelta  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def log(path, line):
    with open(path, "a") as f:
        f.write(line + "\n")


def main():
    logp, ckpt, steps, dt = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    step = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
    log(logp, f"start {time.time():.3f} world {world} rank {rank} step {step}")
    t = torch.zeros(1)
    while step < steps:
        t.fill_(1.0)
        dist.all_reduce(t)
        assert t.item() == world
        time.sleep(dt)
        step += 1
        if rank == 0:
            with open(ckpt + ".tmp", "w") as f:
                f.write(str(step))
            os.replace(ckpt + ".tmp", ckpt)
    log(logp, f"finish {time.time():.3f} world {world} rank {rank}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
