"""PyPI torch on libbrigade_nccl.so, as far as the machine allows (no CI
test: it needs a torch built with CUDA, a 3 GB download).

    LD_PRELOAD=build/compat/libbrigade_nccl.so \
    [BRIGADE_CUDA_MODULE=build/tests/gpu/libbrigade_cuda_emu.so] \
    python tests/nccl/torch_drop_in.py

Prints each step and where it stops. Exits 1 when a step that should work
fails: torch does not import, the NCCL torch runs on is not this library
(its runtime version is not 2.28.9), or, with a GPU, an allreduce on one
rank through init_process_group("nccl") gives a wrong sum.
"""
import datetime
import os
import sys

import torch
import torch.distributed as dist

print("import torch", torch.__version__)
pg = dist.ProcessGroupNCCL
runtime = pg.get_runtime_nccl_version()
print("NCCL torch was built with:", pg.get_build_nccl_version())
print("NCCL torch runs on (ncclGetVersion):", runtime)
if tuple(runtime) != (2, 28, 9):
    print("FAIL: torch does not run on libbrigade_nccl.so (LD_PRELOAD it)")
    sys.exit(1)
print("is_nccl_available:", dist.is_nccl_available())
ngpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
print("GPUs torch sees:", ngpu)
uid = torch.cuda.nccl.unique_id()
print("torch.cuda.nccl.unique_id():", len(uid), "bytes")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29571")
try:
    dist.init_process_group("nccl", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
except Exception as e:  # without a GPU torch stops here
    print("stops at init_process_group('nccl'):", type(e).__name__,
          str(e).splitlines()[0])
    sys.exit(0 if ngpu == 0 else 1)
t = torch.arange(8, dtype=torch.float32, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
ok = torch.equal(t.cpu(), torch.arange(8, dtype=torch.float32))
print("all_reduce on 1 rank:", "ok" if ok else "FAIL", t.cpu().tolist())
dist.destroy_process_group()
sys.exit(0 if ok else 1)
