#!/usr/bin/env bash
# Developer helper: compile the extension(s) and drop them into src/leasequeue/
# atomically (rename), so test processes already running keep their mapping.
# Usage: tools/build_inplace.sh   then   PYTHONPATH=src python -m pytest
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
LEASEQUEUE_REQUIRE_EXTENSIONS=1 "$PY" setup.py -q build_ext --build-lib "$tmp/lib" --build-temp "$tmp/tmp" >/dev/null
for so in "$tmp"/lib/leasequeue/*.so; do
  name="$(basename "$so")"
  cp "$so" "src/leasequeue/.$name.new"
  mv -f "src/leasequeue/.$name.new" "src/leasequeue/$name"
  echo "built src/leasequeue/$name"
done
