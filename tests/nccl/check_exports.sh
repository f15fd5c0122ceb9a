#!/bin/sh
# The library's exports against NCCL's: every function the CUDA toolkit's
# libnccl.so.2 exports (nccl* and pnccl*), and every NCCL call PyPI torch
# 2.15's libtorch_cuda.so binds (torch_2.15_nccl_calls.txt, from
# `nm -D --undefined-only libtorch_cuda.so`), must be defined by
# libbrigade_nccl.so; each one missing is named.
#   check_exports.sh LIBRARY TOOLKIT_ROOT CALLS_FILE
# Exits 77 when the toolkit has no libnccl.so.2 (the torch list is still
# checked first and fails on its own).
lib=$1 root=$2 calls=$3
[ -r "$lib" ] || { echo "no library at $lib"; exit 1; }
ours=$(mktemp) theirs=$(mktemp)
trap 'rm -f "$ours" "$theirs"' EXIT
nm -D --defined-only "$lib" | awk '$2 ~ /^[TtWiV]$/ {print $3}' | sed 's/@.*//' | sort -u >"$ours"
fail=0
missing=$(grep -v '^#' "$calls" | sort -u | comm -23 - "$ours")
if [ -n "$missing" ]; then
  for s in $missing; do echo "missing: $s (PyPI torch 2.15's libtorch_cuda.so binds it)"; done
  fail=1
fi
echo "torch 2.15: $(grep -vc '^#' "$calls") calls checked"
toolkit=
for d in lib64 lib targets/x86_64-linux/lib targets/sbsa-linux/lib; do
  [ -r "$root/$d/libnccl.so.2" ] && { toolkit=$root/$d/libnccl.so.2; break; }
done
if [ -z "$toolkit" ]; then
  echo "the toolkit at $root has no libnccl.so.2: its exports not compared"
  [ $fail = 1 ] && exit 1
  exit 77
fi
# Functions only: NCCL's profiler and plugin tables are data it exports for
# its plugins, not calls of its API.
nm -D --defined-only "$toolkit" | awk '$2 ~ /^[TtWi]$/ {print $3}' | sed 's/@.*//' | sort -u >"$theirs"
missing=$(comm -23 "$theirs" "$ours")
if [ -n "$missing" ]; then
  for s in $missing; do echo "missing: $s (exported by $toolkit)"; done
  fail=1
fi
echo "$toolkit: $(wc -l <"$theirs") functions checked"
[ $fail = 0 ] && echo "ok: every one is defined by $lib"
exit $fail
