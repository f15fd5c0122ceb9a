#!/bin/bash
# The GPU check of brigade, in one call of at most 7 minutes on a machine
# with one NVIDIA GPU (nvcc, meson and ninja; no MPI, no cmocka, no
# network): build for this GPU alone, then what has never been seen first
# (a kernel-mode allreduce on a real GPU), then the figures, then the
# kernel-mode cases and the tests, each stage with a time limit of its own
# so that one hang cannot take the budget, every stage's log under OUT, and
# one summary block at the end, ready to paste.
#
#   tests/gpu/device-check.sh OUT        (from anywhere; OUT is created)
#
#   DEVICE_CHECK_BUDGET_S   seconds for all stages (default 420)
#   DEVICE_CHECK_BUILD      the build folder (default /tmp/brigade-device-build;
#                           set up afresh each time)
#   DEVICE_CHECK_CUDA       meson's -Dcuda (default: enabled where a GPU and
#                           nvcc are found, else disabled)
#   DEVICE_CHECK_ARCHS      meson's -Dgpu_archs (default auto: the GPU's
#                           compute capability, nvidia-smi's compute_cap:
#                           9.0 -> 90; a GPU newer than nvcc: PTX of the
#                           newest nvcc knows)
#   DEVICE_CHECK_KEEP=1     keep a build folder that is there (a second call
#                           on a warm machine goes on with ninja)
#
# Stages, in order of what they tell (each with its limit, in seconds):
#   env         nvidia-smi, the toolkit, whether a GPU is there
#   setup  45   meson setup: the CUDA module for this GPU's architecture only
#   build  150  ninja: the kernels are ten nvcc jobs, one per dtype
#               (kernels/cuda/ring_kernel_dtype.cu), run in parallel
#   first  25   the first kernel-mode allreduce: test_device_threads 2 in
#               kernel mode (ranks as threads, own streams, 1,000,003
#               float32, every element checked)
#   perf   30 each  device_perf (tests/gpu/device_perf.c): ranks as threads
#               of one process on the one GPU, separate streams, float32
#               sum, 8 B to 1 GiB, in and out of place, kernel mode at
#               N = 2, 4, 8 and step mode at N = 2, 8; busbw beside the
#               GPU's device-to-device copy rate (the roofline of ranks
#               that share one HBM), NCCL's allreduce at N = 1 beside it
#               where libnccl.so.2 loads
#   kernel cases  20 to 40 each  kernel mode forced (BRIGADE_DEVICE_MODE=kernel),
#               the strict cases: ranks as threads at N = 4 and 8
#               (test_device_threads); test_device_cases streams (one
#               communicator, 64 collectives over 3 streams), shared (two
#               threads on one stream, refused), mismatch at N = 2 and 3
#               (BRG_ERR_MISMATCH naming both calls), stuck (the kernel
#               stopped at the timeout, named). The test_device_cases ranks
#               are processes: on one GPU without MPS their kernels take
#               turns (time slices), so these are the slow ones
#   kernels 30  bench/gpu_kernel_bench: the reduce kernels' rates, every
#               dtype, against the copy rate
#   nccl-tests  build 60, runs 25 each: NVIDIA's nccl-tests against
#               libbrigade_nccl.so and against the toolkit's NCCL, N = 1,
#               from the tarball in build-peers/ (an ignored path; put it
#               there with
#               mkdir -p build-peers && cp ../shared/peers/nccl-tests-*.tar.gz build-peers/
#               and name build-peers among the paths carried to the machine)
#   tests  what is left  meson test --suite gpu (every element of every
#               result checked), each test's timeout scaled down so that
#               one stuck test cannot take the rest
# Without a GPU (a rehearsal), the same stages run on the emulated module
# (tiny sizes; its times are not GPU figures) with its strict rules on
# (BRIGADE_EMU_STRICT=1), which checks the script and the programs end to
# end; the stages that need the real module (kernels, nccl-tests) say they
# were skipped.
set -u
OUT=${1:?usage: device-check.sh OUT}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${DEVICE_CHECK_BUILD:-/tmp/brigade-device-build}
BUDGET=${DEVICE_CHECK_BUDGET_S:-420}
START=$(date +%s)
STAGES=$OUT/stages.txt
: >"$STAGES"
rm -f "$OUT"/[0-9][0-9]-*.log "$OUT/summary.txt"
N_STAGE=0
# seconds kept back for the summary
RESERVE=5

# stage NAME LIMIT_S CMD...: runs CMD with at most LIMIT_S seconds (and no
# more than the budget has left), its output in OUT/NN-NAME.log; a line in
# stages.txt says how it ended. Returns CMD's status (124: the limit).
stage() {
  local name=$1 limit=$2
  shift 2
  N_STAGE=$((N_STAGE + 1))
  local log
  log=$OUT/$(printf '%02d' "$N_STAGE")-${name// /_}.log
  log=${log//=/}
  local t0 left rc
  t0=$(date +%s)
  left=$((BUDGET - RESERVE - (t0 - START)))
  if [ "$left" -lt 5 ]; then
    printf '%-34s skipped: the %ss budget is spent\n' "$name" "$BUDGET" | tee -a "$STAGES"
    return 124
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "=== $name: $* (limit ${limit}s)" >"$log"
  timeout -k 5 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  local how=ok
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && how="TIMED OUT at ${limit}s"
  [ $rc -ne 0 ] && [ "$how" = ok ] && how="failed (rc $rc)"
  [ $rc -eq 77 ] && how="skipped (77)"
  printf '%-34s %-24s %4ss  %s\n' "$name" "$how" $(($(date +%s) - t0)) "$(basename "$log")" |
    tee -a "$STAGES"
  return $rc
}
note() { printf '%-34s %s\n' "$1" "$2" | tee -a "$STAGES"; }

# ---- tools: PATH, then the CUDA toolkit, then Python packages ----
PY=$(command -v python3 || true)
if ! command -v nvcc >/dev/null 2>&1; then
  for d in /usr/local/cuda/bin $(ls -d /usr/local/cuda-*/bin 2>/dev/null); do
    [ -x "$d/nvcc" ] && PATH=$d:$PATH && break
  done
fi
if ! command -v ninja >/dev/null 2>&1 && [ -n "$PY" ]; then
  d=$("$PY" -c 'import ninja; print(ninja.BIN_DIR)' 2>/dev/null) && PATH=$d:$PATH
fi
MESON=(meson)
command -v meson >/dev/null 2>&1 || MESON=("$PY" -m mesonbuild.mesonmain)
export PATH

# (a function: timeout cannot run one, so each command here has its own)
envinfo() {
  echo "date: $(date -u)  host: $(hostname)  cores: $(nproc)  load: $(cut -d' ' -f1-3 /proc/loadavg)"
  timeout 20 nvidia-smi || echo "nvidia-smi: none or failed"
  timeout 20 nvidia-smi topo -m 2>/dev/null
  echo "nvcc: $(command -v nvcc || echo none)"
  nvcc --version 2>&1 | tail -2
  echo "meson: $("${MESON[@]}" --version 2>&1)  ninja: $(ninja --version 2>&1)"
  ls /usr/local/cuda/lib64/libnccl.so* /usr/lib/x86_64-linux-gnu/libnccl.so* 2>/dev/null
}
N_STAGE=1
envinfo >"$OUT/01-env.log" 2>&1
GPU=0
timeout 20 nvidia-smi -L >/dev/null 2>&1 && GPU=1
GPU_NAME=$(timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
# the compute capability of GPU 0 (9.0 -> 90): the one architecture built
CAP=$(timeout 20 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
  head -1 | tr -d ' .')
ARCHS=${DEVICE_CHECK_ARCHS:-${CAP:-90}}
printf '%-34s %-24s %4ss  %s\n' env "GPU: $GPU, sm_$ARCHS" $(($(date +%s) - START)) 01-env.log |
  tee -a "$STAGES"
[ $GPU = 1 ] || GPU_NAME="none (rehearsal on the emulated module)"
CUDA=${DEVICE_CHECK_CUDA:-}
if [ -z "$CUDA" ]; then
  CUDA=disabled
  [ $GPU = 1 ] && command -v nvcc >/dev/null 2>&1 && CUDA=enabled
fi

# ---- build ----
if [ "${DEVICE_CHECK_KEEP:-0}" = 1 ] && [ -f "$BUILD/build.ninja" ]; then
  note setup "kept $BUILD"
else
  rm -rf "$BUILD"
  stage setup 45 "${MESON[@]}" setup "$BUILD" "$SRC" --buildtype=release -Dcuda="$CUDA" \
    -Dgpu_archs="${DEVICE_CHECK_ARCHS:-auto}" -Dtests=auto -Dbench_peers=disabled -Dpython=disabled || true
fi
EMU=$BUILD/tests/gpu/libbrigade_cuda_emu.so
# what the stages run, and the programs of the gpu test suite with what
# they depend on (meson introspect: nothing else is built, the CPU
# emulator's C++ tests in particular)
targets() {
  "$PY" - "$BUILD" "$@" <<'PYEOF'
import json, os, subprocess, sys
build, want = sys.argv[1], set(sys.argv[2:])
intro = lambda what: json.loads(subprocess.run(
    os.environ["MESON_CMD"].split() + ["introspect", "--" + what, build],
    capture_output=True, text=True).stdout or "[]")
targets = intro("targets")
ids = set()
for t in intro("tests"):
    if "brigade:gpu" in t["suite"]:
        ids.update(t.get("depends") or [])
for t in targets:
    for f in t["filename"]:
        rel = os.path.relpath(f, build)
        if t["id"] in ids or rel in want:
            print(rel)
PYEOF
}
export MESON_CMD="${MESON[*]}"
if [ $GPU = 1 ]; then
  stage build 150 ninja -C "$BUILD" $(targets libbrigade_cuda.so tests/gpu/device_perf \
    tests/gpu/test_device_threads tests/gpu/test_device_cases bench/gpu_kernel_bench \
    compat/libbrigade_nccl.so.0.1.0 compat/libbrigade_nccl.so) || true
  # meson builds the module at the top of the build folder
  MODULE=$BUILD/libbrigade_cuda.so
  [ -e "$MODULE" ] || note module "MISSING: $MODULE was not built"
else
  stage build 150 ninja -C "$BUILD" tests/gpu/device_perf tests/gpu/libbrigade_cuda_emu.so \
    tests/gpu/test_cuda_ipc_link tests/gpu/test_device_cases tests/gpu/test_device_threads \
    tests/gpu/test_device_calls || true
  MODULE=$EMU
fi
export BRIGADE_CUDA_MODULE=$MODULE BRIGADE_TIMEOUT_MS=30000
# The emulated module as strict as a GPU: synchronizing calls, hardware
# queues, co-residency, lazy loading (its settings; unknown ones are
# ignored). A failure must be named, never skipped.
if [ $GPU = 0 ]; then
  export BRIGADE_EMU_STRICT=1 BRIGADE_TEST_NO_SKIP=1
fi
# The emulator's spinning blocks are OS threads: its runs take kernel
# mode's shape of CI's emulated runs (tests/gpu/meson.build, emu_shape_env).
SHAPE=()
[ $GPU = 1 ] || SHAPE=(BRIGADE_DEVICE_CHANNELS=2 BRIGADE_SLICE_BYTES=128K)
THREADS=$BUILD/tests/gpu/test_device_threads
CASES=$BUILD/tests/gpu/test_device_cases

# ---- first: a kernel-mode allreduce on the GPU ----
stage "first kernel allreduce N=2" 25 env "${SHAPE[@]}" BRIGADE_DEVICE_MODE=kernel \
  BRIGADE_DEBUG=INFO "$THREADS" 2 || true

# ---- figures ----
PERF=$BUILD/tests/gpu/device_perf
if [ $GPU = 1 ]; then
  SIZES=8,64K,1M,16M,256M,1G
  ITERS=10
  RUNS="kernel:2 kernel:4 kernel:8 step:2 step:8"
else
  SIZES=8,64K,1M
  ITERS=2
  RUNS="kernel:2 step:2"
fi
for r in $RUNS; do
  mode=${r%:*} n=${r#*:}
  nccl=""
  [ "$mode" = kernel ] && [ "$n" = 2 ] && nccl=1
  stage "perf $mode N=$n" 30 env "${SHAPE[@]}" BRIGADE_DEVICE_MODE="$mode" DEVICE_PERF_NCCL=$nccl \
    "$PERF" "$n" "$SIZES" "$ITERS" || true
done

# ---- kernel mode's strict cases on the GPU ----
for n in 4 8; do
  stage "kernel threads N=$n" 25 env "${SHAPE[@]}" BRIGADE_DEVICE_MODE=kernel "$THREADS" "$n" ||
    true
done
# CASE N TIMEOUT_MS MODE LIMIT_S (tests/gpu/meson.build's kernel-mode
# cases; mismatch runs 6 calls at N = 2, 8 at N = 3, each a setup of its own)
for c in "shared 2 3000 auto 25" "streams 2 30000 kernel 25" "mismatch 2 5000 kernel 30" \
  "mismatch 3 5000 kernel 40" "stuck 2 2000 kernel 20"; do
  set -- $c
  stage "kernel $1 N=$2" "$5" env BRIGADE_DEVICE_MODE="$4" BRIGADE_DEVICE_CHANNELS=2 \
    BRIGADE_TRANSPORTS=cuda_ipc,shm BRIGADE_TIMEOUT_MS="$3" "$CASES" "$1" "$2" || true
done

if [ $GPU = 1 ] && [ -x "$BUILD/bench/gpu_kernel_bench" ]; then
  stage kernels 30 "$BUILD/bench/gpu_kernel_bench" -b 1M -e 1G -n 20 -w 5 || true
elif [ $GPU = 0 ]; then
  note kernels "skipped: no GPU"
else
  note kernels "skipped: bench/gpu_kernel_bench was not built"
fi

# ---- nccl-tests, N = 1, against brigade's NCCL and the toolkit's ----
TARBALL=$(ls "$SRC"/build-peers/nccl-tests-*.tar.gz "$SRC"/../shared/peers/nccl-tests-*.tar.gz \
  2>/dev/null | head -1)
NCCL_SO=$(ls /usr/local/cuda/lib64/libnccl.so.2 /usr/lib/x86_64-linux-gnu/libnccl.so.2 \
  2>/dev/null | head -1)
if [ $GPU = 0 ]; then
  note nccl-tests "skipped: no GPU"
elif [ -z "$TARBALL" ]; then
  note nccl-tests "skipped: no nccl-tests-*.tar.gz in build-peers/"
elif [ ! -e "$BUILD/compat/libbrigade_nccl.so" ]; then
  note nccl-tests "skipped: libbrigade_nccl.so was not built"
else
  NT=/tmp/brigade-nccl-tests
  rm -rf "$NT" && mkdir -p "$NT/home/lib" "$NT/home/include"
  tar xzf "$TARBALL" -C "$NT"
  cp "$(dirname "$(command -v nvcc)")/../include/nccl.h" "$NT/home/include/" 2>/dev/null ||
    cp /usr/local/cuda/include/nccl.h "$NT/home/include/" 2>/dev/null
  ln -sf "$BUILD/compat/libbrigade_nccl.so" "$NT/home/lib/libnccl.so"
  stage "nccl-tests build" 60 make -C "$(ls -d "$NT"/nccl-tests-*/src)" -j "$(nproc)" \
    NCCL_HOME="$NT/home" MPI=0 NVCC_GENCODE="-gencode=arch=compute_$ARCHS,code=sm_$ARCHS" \
    BUILDDIR="$NT/bin" "$NT/bin/all_reduce_perf" || true
  stage "nccl-tests brigade N=1" 25 env LD_LIBRARY_PATH="$BUILD/compat" \
    "$NT/bin/all_reduce_perf" -b 8 -e 256M -f 16 -c 1 -n 10 -w 3 || true
  if [ -n "$NCCL_SO" ]; then
    stage "nccl-tests NCCL N=1" 25 env LD_LIBRARY_PATH="$(dirname "$NCCL_SO")" \
      "$NT/bin/all_reduce_perf" -b 8 -e 256M -f 16 -c 1 -n 10 -w 3 || true
  else
    note "nccl-tests NCCL N=1" "skipped: no libnccl.so.2 in the toolkit"
  fi
fi

# ---- tests: what the budget has left ----
# Each test's own timeout (up to 300 s) scaled down, so one that hangs ends
# before the stage does and the others still report.
LEFT=$((BUDGET - RESERVE - ($(date +%s) - START)))
MULT=$(awk -v l="$LEFT" 'BEGIN { m = (l - 10) / 300; if (m < 0.05) m = 0.05; if (m > 1) m = 1; printf "%.2f", m }')
if [ $GPU = 1 ]; then
  # the full products of device_collectives at N = 3 and 4 (processes that
  # share the one GPU) last, in what is left
  LONG="device_collectives-N3 device_collectives-N4"
  QUICK=$("${MESON[@]}" test -C "$BUILD" --no-rebuild --list --suite gpu 2>/dev/null | sed 's/^brigade://' |
    sed 's/^ *[^ ]* *\/ *//' | grep -v -x -F -e device_collectives-N3 -e device_collectives-N4)
  stage "tests gpu" 200 "${MESON[@]}" test -C "$BUILD" --no-rebuild --print-errorlogs \
    --num-processes 4 --timeout-multiplier "$MULT" $QUICK || true
  LEFT=$((BUDGET - RESERVE - ($(date +%s) - START)))
  MULT=$(awk -v l="$LEFT" 'BEGIN { m = (l - 10) / 300; if (m < 0.05) m = 0.05; if (m > 1) m = 1; printf "%.2f", m }')
  stage "tests gpu long" 240 "${MESON[@]}" test -C "$BUILD" --no-rebuild --print-errorlogs \
    --num-processes 2 --timeout-multiplier "$MULT" $LONG || true
else
  stage "tests emulated" 120 "${MESON[@]}" test -C "$BUILD" --no-rebuild --print-errorlogs \
    --timeout-multiplier "$MULT" cuda_ipc_link_emu device_cases_emu-mps-disagree-N2 \
    device_cases_emu-mps-off-N2 device_cases_emu-graphdestroy-N2 device_threads_emu \
    device_calls_emu || true
fi

# ---- the summary ----
{
  echo "===== brigade device-check: $(cd "$SRC" && git rev-parse --short HEAD 2>/dev/null)" \
    "on $GPU_NAME, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "-- stages (limit each; budget ${BUDGET}s)"
  cat "$STAGES"
  echo "-- the first kernel-mode allreduce"
  grep -h -E '^test_device_threads|^rank [0-9]+: ' "$OUT"/*first*.log 2>/dev/null |
    head -8
  grep -h -E 'CUDA module loaded|device ring: (kernel|step) mode \(' "$OUT"/*first*.log 2>/dev/null |
    head -2
  echo "-- device allreduce, float32 sum, ranks as threads on one GPU (busbw vs copy)"
  grep -h -E '^# copy|^(kernel|step) +N=|^nccl +N=|^# nccl|device_perf: FAILED' \
    "$OUT"/*perf*.log 2>/dev/null | head -80
  echo "-- kernel-mode cases"
  grep -h -E '^test_device_threads N=|^(ok|FAIL) |^no GPU' "$OUT"/*kernel_*.log 2>/dev/null |
    head -30
  if ls "$OUT"/*kernels.log >/dev/null 2>&1; then
    echo "-- reduce kernels (bench/gpu_kernel_bench)"
    grep -E '^#|GB/s' "$OUT"/*kernels.log | head -30
  fi
  if ls "$OUT"/*nccl-tests*N1.log >/dev/null 2>&1; then
    echo "-- nccl-tests all_reduce_perf, N = 1"
    grep -h -E '^===|^ +268435456|^ +8 |Avg bus|wrong|Out of bounds' "$OUT"/*nccl-tests*N1.log
  fi
  echo "-- tests (timeouts x$MULT)"
  grep -h -E '^(Ok|Expected Fail|Fail|Unexpected Pass|Skipped|Timeout): ' "$OUT"/*tests*.log 2>/dev/null
  grep -h -E ' (FAIL|TIMEOUT) ' "$OUT"/*tests*.log 2>/dev/null | head -20
  echo "-- total $(($(date +%s) - START))s of ${BUDGET}s"
} >"$OUT/summary.txt"
cat "$OUT/summary.txt"
