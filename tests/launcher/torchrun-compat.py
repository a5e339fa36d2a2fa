#!/usr/bin/python3
"""torchrun-compat.py: runs Debian's torchrun (torch 1.13) under Python 3.11.

torch 1.13's Std.from_str("0") iterates an IntFlag, and Python 3.11 no longer
yields the zero member, so every torchrun launch dies in to_map() with
"'NoneType' object has no attribute 'get'".  This wrapper fixes that one
function and then runs torch.distributed.run unchanged; kiln-run's benchmark
uses it as the torchrun baseline."""
import sys

import torch.distributed.elastic.multiprocessing.api as api
from torch.distributed.run import main

_orig = api.Std.from_str


def _fixed(cls, vm):
    r = _orig(vm)
    if r is None:
        return api.Std(int(vm))
    if isinstance(r, dict):
        return {k: (v if v is not None else api.Std(0)) for k, v in r.items()}
    return r


api.Std.from_str = classmethod(_fixed)

if __name__ == "__main__":
    sys.argv[0] = "torchrun"
    sys.exit(main())
