#!/usr/bin/env bash
# brigade quick start on Debian 12 (run as root, or with sudo available).
#
#   ./quickstart.sh bench   build, then run all_reduce_perf on 4 local ranks
#   ./quickstart.sh test    build with -Werror, run the whole test suite (the
#                           Python package's pytest files included), then
#                           run it again under AddressSanitizer + UBSan, then
#                           run the threaded and multi-process tests (suite
#                           tsan) under ThreadSanitizer
#
# Both install the Debian packages they need when they are missing.
set -euo pipefail
cd "$(dirname "$0")"

need_pkgs() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "quickstart: installing ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

base_pkgs=(gcc libc6-dev meson ninja-build pkg-config libcmocka-dev)

# Every C, C++ and CUDA file as .clang-format lays it out; the files that
# differ are listed with the command that fixes them.
check_format() {
  local files bad=()
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    files=$(git ls-files '*.c' '*.h' '*.cc' '*.cu' '*.cuh')
  else
    files=$(find base include kernels transport runtime reducer tools bench tests \
              -name '*.c' -o -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh')
  fi
  for f in $files; do
    clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done
  if [ ${#bad[@]} -gt 0 ]; then
    echo "quickstart: ${#bad[@]} file(s) differ from .clang-format:" >&2
    printf '  %s\n' "${bad[@]}" >&2
    echo "quickstart: fix with: clang-format -i ${bad[*]}" >&2
    exit 1
  fi
  echo "quickstart: formatting checked ($(echo "$files" | wc -w) files)"
}
jobs=$(nproc)
# Most tests wait more than they compute (ranks meeting, timeouts met,
# interpreters starting): one more test than cores keeps the cores busy.
# Runs that measure time or failures are marked is_parallel: false and run
# alone.
test_jobs=$((jobs + 1))

# The ten slowest tests of a tree and the phase's wall time, from meson's
# test log, so that what a CI run costs is in its own output.
phase_start=$SECONDS
report_phase() {
  local log="$1/meson-logs/testlog.json"
  echo "quickstart: $1: $((SECONDS - phase_start)) s"
  if [ -f "$log" ]; then
    python3 - "$log" <<'PY' || true
import json, sys
runs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
runs.sort(key=lambda r: -r.get("duration", 0))
print("quickstart: slowest tests (%d run, %.0f s of test time):" %
      (len(runs), sum(r.get("duration", 0) for r in runs)))
for r in runs[:10]:
    print("  %7.1f s  %s" % (r.get("duration", 0), r.get("name", "?")))
PY
  fi
  phase_start=$SECONDS
}

# What each failed test printed last, at the very end of the output, where a
# CI log cut to its tail still shows why (meson prints the logs early, in
# the middle of the run).
show_failures() {
  local log="$1/meson-logs/testlog.json"
  [ -f "$log" ] && python3 - "$log" <<'PY' || true
import json, sys
runs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
bad = [r for r in runs if r.get("result") not in ("OK", "SKIP", "EXPECTEDFAIL")]
for r in bad:
    out = (r.get("stdout") or "") + (r.get("stderr") or "")
    tail = out.splitlines()[-60:]
    print("quickstart: FAILED %s (%s, %.0f s); its last %d lines:" %
          (r.get("name"), r.get("result"), r.get("duration", 0), len(tail)))
    for line in tail:
        print("  | " + line)
PY
  echo "quickstart: $1: $((SECONDS - phase_start)) s, failed" >&2
  exit 1
}

case "${1:-}" in
  bench)
    need_pkgs "${base_pkgs[@]}"
    [ -d build ] || meson setup build --buildtype=release
    ninja -C build
    shift
    exec ./build/tools/brigade-run -n 4 ./build/bench/all_reduce_perf -b 8 -e 256M -f 2 "$@"
    ;;
  test)
    # Everything the suites build and run on a fresh Debian 12: the real
    # verbs backend's headers (so -Werror covers it), a C++ compiler (the
    # CUDA kernel body run on the CPU), ip for the multi-host namespaces,
    # clang-format to check the code against .clang-format, matplotlib for
    # brigade-trace's timeline (its test draws one). Only CUDA and
    # the optional bench peers (Open MPI, Gloo) stay unbuilt.
    # brigade-trace draws with matplotlib; the Python package's tests
    # (suite python) need pytest and NumPy; python3-torch (1.13, CPU) adds
    # the torch.distributed backend's tests; python3-mypy checks the package
    # with mypy --strict (python-mypy); python3-venv holds the wheel-install
    # check's fresh environment; cmake builds a program against
    # brigadeConfig.cmake (install-devel, wheel-install), which skips that
    # half without it; openmpi-bin's mpirun serves PMIx to the ranks it
    # starts (pmix-mpirun-N3, the rendezvous through PMIx; the bench peers
    # need libopenmpi-dev too and stay unbuilt).
    need_pkgs "${base_pkgs[@]}" libibverbs-dev g++ iproute2 clang-format python3-matplotlib \
      python3-pytest python3-numpy python3-torch python3-mypy python3-venv clang libclang-rt-14-dev \
      cmake openmpi-bin
    check_format
    phase_start=$SECONDS
    [ -d build-test ] || meson setup build-test --buildtype=debugoptimized --werror
    ninja -C build-test
    # Suite wheel (pip builds the wheel with the CUDA module and checks it
    # installed: minutes of nvcc and a build of its own) runs on request:
    # meson test -C build-test --suite wheel
    meson test -C build-test --print-errorlogs --num-processes "$test_jobs" --no-suite wheel ||
      show_failures build-test
    report_phase build-test
    # The sanitizer trees leave out what they cannot watch: the CUDA module
    # (built by nvcc, never instrumented, and without a GPU only loaded to
    # say so, which the first tree checks) and the bench peers. Their
    # device tests run on the emulated module, which is instrumented.
    [ -d build-asan ] || meson setup build-asan --buildtype=debug --werror \
      -Db_sanitize=address,undefined -Db_lundef=false -Dcuda=disabled -Dbench_peers=disabled
    ninja -C build-asan
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
      meson test -C build-asan --print-errorlogs --num-processes "$test_jobs" --timeout-multiplier 3 ||
      show_failures build-asan
    report_phase build-asan
    # ThreadSanitizer slows code 5-15x, so only suite tsan runs under it.
    [ -d build-tsan ] || meson setup build-tsan --buildtype=debugoptimized --werror \
      -Db_sanitize=thread -Db_lundef=false -Dcuda=disabled -Dbench_peers=disabled
    ninja -C build-tsan
    TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp" \
      meson test -C build-tsan --print-errorlogs --num-processes "$jobs" --timeout-multiplier 3 \
      --suite tsan || show_failures build-tsan
    report_phase build-tsan
    # libFuzzer over what brigade reads before it trusts a peer (bootstrap
    # hello, unique id, the root's service and table, ring frames, the ring
    # and tree hellos against a challenge, the challenge itself, the tcp
    # and ibverbs hellos), 25 s from the committed corpus; new inputs go to a
    # scratch folder. Any crash, sanitizer report, leak or failed check of
    # the target fails the run; the input that did it is left in build-fuzz/.
    [ -d build-fuzz ] || CC=clang meson setup build-fuzz --buildtype=debugoptimized -Dfuzz=enabled \
      -Db_sanitize=address,undefined -Db_lundef=false -Dcuda=disabled -Dbench_peers=disabled \
      -Dpython=disabled
    ninja -C build-fuzz tests/fuzz/fuzz_bootstrap
    fuzz_scratch=$(mktemp -d)
    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
      ./build-fuzz/tests/fuzz/fuzz_bootstrap -max_total_time=25 -max_len=4096 -timeout=10 \
      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix=build-fuzz/ \
      "$fuzz_scratch" tests/fuzz/corpus
    rm -rf "$fuzz_scratch"
    ;;
  *)
    echo "usage: $0 bench|test" >&2
    exit 2
    ;;
esac
