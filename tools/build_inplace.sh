#!/usr/bin/env bash
# Developer helper: compile the extension(s) and drop them into src/leasequeue/
# atomically (rename), so test processes already running keep their mapping.
# Usage: tools/build_inplace.sh   then   PYTHONPATH=src python -m pytest
# The build runs in a small venv (.venv-dev) holding the project's build
# requirements, since an interpreter's own setuptools may be too old for
# pyproject.toml (PEP 639 license metadata needs setuptools >= 77).
set -euo pipefail
cd "$(dirname "$0")/.."
BASE="${PYTHON:-python3}"
DEV="${LEASEQUEUE_DEV_VENV:-.venv-dev}"
if [ ! -x "$DEV/bin/python" ]; then
  "$BASE" -m venv "$DEV"
  "$DEV/bin/python" -m pip install -q "setuptools>=77" "Cython>=3.1"
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
LEASEQUEUE_REQUIRE_EXTENSIONS=1 "$DEV/bin/python" setup.py -q build_ext --build-lib "$tmp/lib" --build-temp "$tmp/tmp" >/dev/null
(cd "$tmp/lib" && find leasequeue -name '*.so') | while read -r rel; do
  dest="src/$rel"
  dir="$(dirname "$dest")"
  name="$(basename "$dest")"
  cp "$tmp/lib/$rel" "$dir/.$name.new"
  mv -f "$dir/.$name.new" "$dest"
  echo "built $dest"
done
