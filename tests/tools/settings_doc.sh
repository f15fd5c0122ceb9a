#!/bin/sh
# docs/settings.md must be what `brigade-info --markdown` prints: the
# settings table is generated from the library's own tables, never edited
# by hand. usage: settings_doc.sh BRIGADE_INFO DOCS_SETTINGS_MD
set -u
info=$1
doc=$2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$info" --markdown >"$out" || { echo "FAIL: $info --markdown exited $?"; exit 1; }
if ! diff -u "$doc" "$out"; then
  echo "FAIL: $doc differs from brigade-info --markdown; regenerate it with:"
  echo "  build/tools/brigade-info --markdown > docs/settings.md"
  exit 1
fi
echo "ok: $doc matches brigade-info --markdown ($(grep -c '^| `BRIGADE_' "$doc") settings)"
