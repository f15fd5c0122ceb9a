#!/bin/bash
# GPU check of brigade on a machine with an NVIDIA GPU, in under 8 minutes:
# builds the tree with the CUDA module, then runs the GPU test suite and the
# GPU benchmarks twice, without the MPS daemon and (when
# nvidia-cuda-mps-control exists) with it. Every log goes into the results
# folder given as the first argument (at most 8 files, no subfolders):
#
#   summary.txt   one line per step with its exit status and time
#   env.log       nvidia-smi, tool versions, meson setup
#   build.log     ninja
#   nomps.log     GPU tests (kernels, device calls, device collectives
#                 N = 1..4 through the public API), kernel benchmark,
#                 all_reduce_perf -G for N = 2 and 4 on the one GPU, and
#                 --peer nccl, without MPS
#   mps.log       device collectives N=2 and all_reduce_perf -G N=2 under
#                 MPS (or why it was not run)
#   nccl-tests.log  NVIDIA's nccl-tests built against libbrigade_nccl.so and
#                 run with -c 1 (all_reduce, all_gather, reduce_scatter)
#
# Usage: tests/gpu/device-check.sh RESULTS_DIR   (from the repository root)
# nvcc, meson and ninja may be Python packages; cmocka is not needed (the
# GPU tests do not use it, so -Dtests=auto just leaves the unit tests out).
set -u
OUT=${1:?usage: device-check.sh RESULTS_DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BRIGADE_CHECK_BUILD:-/tmp/brigade-device-build}
START=$(date +%s)
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"

note() { echo "$*" | tee -a "$SUMMARY"; }

# Everything must end within 8 minutes: each step gets at most what is left.
BUDGET=${BRIGADE_CHECK_BUDGET_S:-470}

# step NAME LOG TIMEOUT_S CMD...: runs CMD with a time limit, appending to LOG.
step() {
  local name=$1 log=$2 limit=$3
  shift 3
  local t0 rc left
  t0=$(date +%s)
  left=$((BUDGET - (t0 - START)))
  if [ "$left" -lt 15 ]; then
    note "$(printf '%-40s skipped: the 8-minute budget is spent' "$name")"
    return 124
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "=== $name: $* (limit ${limit}s)" >>"$log"
  timeout -k 10 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  note "$(printf '%-40s rc=%-3s %4ss' "$name" "$rc" $(($(date +%s) - t0)))"
  return $rc
}

# ---- tools: PATH first, then the CUDA toolkit, then Python packages ----
PY=$(command -v python3 || true)
if ! command -v nvcc >/dev/null 2>&1; then
  for d in /usr/local/cuda/bin $(ls -d /usr/local/cuda-*/bin 2>/dev/null); do
    [ -x "$d/nvcc" ] && PATH=$d:$PATH && break
  done
fi
if ! command -v nvcc >/dev/null 2>&1 && [ -n "$PY" ]; then
  site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null)
  n=$(ls "$site"/nvidia/*/bin/nvcc "$site"/nvidia/cuda_nvcc/bin/nvcc 2>/dev/null | head -1)
  [ -n "$n" ] && PATH=$(dirname "$n"):$PATH
fi
if ! command -v ninja >/dev/null 2>&1 && [ -n "$PY" ]; then
  d=$("$PY" -c 'import ninja; print(ninja.BIN_DIR)' 2>/dev/null) && PATH=$d:$PATH
fi
MESON=(meson)
command -v meson >/dev/null 2>&1 || MESON=("$PY" -m mesonbuild.mesonmain)
export PATH

{
  echo "date: $(date -u)"
  echo "host: $(hostname)  cores: $(nproc)"
  nvidia-smi || echo "nvidia-smi failed"
  nvidia-smi -q -d COMPUTE 2>/dev/null | grep -i "compute mode"
  echo "nvcc: $(command -v nvcc)"; nvcc --version 2>&1 | tail -2
  echo "meson: ${MESON[*]} $("${MESON[@]}" --version 2>&1)"
  echo "ninja: $(command -v ninja) $(ninja --version 2>&1)"
  echo "mps control: $(command -v nvidia-cuda-mps-control || echo none)"
} >"$OUT/env.log" 2>&1

# ---- build ----
rm -rf "$BUILD"
step "meson setup" "$OUT/env.log" 120 "${MESON[@]}" setup "$BUILD" "$SRC" \
  -Dcuda=enabled -Dtests=auto -Dbench_peers=auto -Dbuildtype=release ||
  { note "setup failed: see env.log"; exit 1; }
step "ninja" "$OUT/build.log" 240 ninja -C "$BUILD" || { note "build failed: see build.log"; exit 1; }

# ---- one round of GPU runs, into one log ----
PERF="$BUILD/bench/all_reduce_perf"
round() {
  local tag=$1 log=$2 full=$3
  # Most telling first, so a short budget still gets the targets measured:
  # the kernel benchmark, the ring at N = 2, then the test suite, N = 4, NCCL.
  if [ "$full" = full ]; then
    step "$tag: gpu_kernel_bench" "$log" 60 \
      "$BUILD/bench/gpu_kernel_bench" -b 1M -e 1G -n 20 -w 5
  fi
  step "$tag: all_reduce_perf -G N=2" "$log" 90 \
    "$BUILD/tools/brigade-run" -n 2 "$PERF" -G -b 16 -e 1G -f 4 -n 10 -w 3
  # The step mode's small-message latency: 8 B, many calls.
  step "$tag: all_reduce_perf -G N=2, 8 B" "$log" 30 \
    "$BUILD/tools/brigade-run" -n 2 "$PERF" -G -b 8 -e 8 -n 200 -w 20
  if [ "$full" = full ]; then
    step "$tag: meson test --suite gpu" "$log" 200 \
      "${MESON[@]}" test -C "$BUILD" --no-rebuild --suite gpu --print-errorlogs --num-processes 1
    cat "$BUILD/meson-logs/testlog.txt" >>"$log" 2>/dev/null
    step "$tag: all_reduce_perf -G N=4" "$log" 90 \
      "$BUILD/tools/brigade-run" -n 4 "$PERF" -G -b 16 -e 1G -f 4 -n 10 -w 3
    # The reducer on the GPU: ResNet-50 shapes, compute kernels on a stream.
    step "$tag: reducer_overlap -G N=2 resnet50" "$log" 60 \
      env BRIGADE_DEVICE_PROXY=1 "$BUILD/bench/reducer_overlap" -G -n 2 -m resnet50 -i 10 -w 3
    # NCCL beside it (NCCL refuses two ranks on one GPU; then it says so).
    if "$PERF" --help 2>&1 | grep -q nccl; then
      step "$tag: all_reduce_perf -G N=2 --peer nccl" "$log" 45 \
        "$BUILD/tools/brigade-run" -n 2 "$PERF" -G -b 1M -e 256M -f 16 -n 10 -w 3 --peer nccl
    fi
  else
    step "$tag: device_collectives N=2" "$log" 90 \
      "${MESON[@]}" test -C "$BUILD" --no-rebuild --print-errorlogs device_collectives-N2
  fi
  # The headline numbers, into the summary.
  grep -E '^# device|^# GPU|^ +268435456 |^ +8 |^# Roofline|^step|NCCL|nccl|reducer /' "$log" |
    head -40 |
    sed "s/^/$tag: /" >>"$SUMMARY"
}

round "no MPS" "$OUT/nomps.log" full

# ---- nccl-tests on libbrigade_nccl.so ----
# NVIDIA's nccl-tests (the untouched tarball in the peers folder beside the
# repository), built against the NCCL-compatible library and run with its
# own check (-c 1). Two ranks on one GPU need two processes (MPI) and
# NCCL_TESTS_DEVICE=0; without MPI only one rank runs.
NCCL_LOG=$OUT/nccl-tests.log
TARBALL=$(ls "$SRC"/../shared/peers/nccl-tests-*.tar.gz "$SRC"/shared/peers/nccl-tests-*.tar.gz \
  2>/dev/null | head -1)
if [ -z "$TARBALL" ] || [ ! -e "$BUILD/compat/libnccl.so.2" ]; then
  note "nccl-tests: skipped (tarball: ${TARBALL:-not found}; libbrigade_nccl.so built: \
$([ -e "$BUILD/compat/libnccl.so.2" ] && echo yes || echo no))"
else
  NT=/tmp/brigade-nccl-tests
  rm -rf "$NT" && mkdir -p "$NT/home/lib" "$NT/home/include"
  tar xzf "$TARBALL" -C "$NT"
  cp "$(dirname "$(command -v nvcc)")/../include/nccl.h" "$NT/home/include/" 2>/dev/null ||
    cp /usr/local/cuda/include/nccl.h "$NT/home/include/"
  ln -sf "$BUILD/compat/libbrigade_nccl.so" "$NT/home/lib/libnccl.so"
  MPIFLAG=MPI=0
  command -v mpicc >/dev/null && command -v mpirun >/dev/null && MPIFLAG="MPI=1 MPI_HOME=$(dirname "$(dirname "$(command -v mpicc)")")"
  # shellcheck disable=SC2086
  step "nccl-tests: build ($MPIFLAG)" "$NCCL_LOG" 120 make -C "$NT"/nccl-tests-*/src -j "$(nproc)" \
    NCCL_HOME="$NT/home" $MPIFLAG NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" \
    BUILDDIR="$NT/bin" "$NT/bin/all_reduce_perf" "$NT/bin/all_gather_perf" \
    "$NT/bin/reduce_scatter_perf"
  export LD_LIBRARY_PATH="$BUILD/compat:$BUILD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  for t in all_reduce all_gather reduce_scatter; do
    if [ "$MPIFLAG" != MPI=0 ]; then
      step "nccl-tests: ${t}_perf -c 1, 2 ranks (mpirun)" "$NCCL_LOG" 60 \
        mpirun --allow-run-as-root -np 2 -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH \
        "$NT/bin/${t}_perf" -b 8 -e 256M -f 8 -c 1 -n 5 -w 2
    else
      step "nccl-tests: ${t}_perf -c 1, 1 rank (no MPI here)" "$NCCL_LOG" 60 \
        "$NT/bin/${t}_perf" -b 8 -e 256M -f 8 -c 1 -n 5 -w 2
    fi
  done
  grep -E '^# Avg bus|Out of bounds|wrong|^step|Error|error' "$NCCL_LOG" | head -20 |
    sed 's/^/nccl-tests: /' >>"$SUMMARY"
fi

# ---- the same under MPS ----
if command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/brigade-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/brigade-mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d >>"$OUT/mps.log" 2>&1; then
    note "MPS control daemon started"
    round "MPS" "$OUT/mps.log" short
    echo quit | timeout 20 nvidia-cuda-mps-control >>"$OUT/mps.log" 2>&1
    cat "$CUDA_MPS_LOG_DIRECTORY"/*.log >>"$OUT/mps.log" 2>/dev/null
  else
    note "MPS: nvidia-cuda-mps-control -d failed (see mps.log)"
  fi
else
  echo "nvidia-cuda-mps-control not found: no MPS round" >"$OUT/mps.log"
  note "MPS: nvidia-cuda-mps-control not found, round skipped"
fi

note "total $(($(date +%s) - START))s"
