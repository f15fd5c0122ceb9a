#!/bin/sh
# libbrigade.so must load on machines without CUDA: its NEEDED entries may
# not name libcuda or libcudart (the CUDA module is opened with dlopen).
# Usage: test_no_cuda_dep.sh path/to/libbrigade.so
lib=${1:?usage: test_no_cuda_dep.sh libbrigade.so}
if ! command -v readelf >/dev/null 2>&1; then
  echo "readelf not found (binutils): skipped"
  exit 77
fi
needed=$(readelf -d "$lib" | grep '(NEEDED)') || { echo "readelf -d $lib failed"; exit 1; }
echo "$needed"
if echo "$needed" | grep -E 'lib(cuda|cudart|nvidia|nccl)[^]]*\]' >/dev/null; then
  echo "FAIL: $lib needs a CUDA library at load time"
  exit 1
fi
echo "ok: $lib does not need libcuda or libcudart"
