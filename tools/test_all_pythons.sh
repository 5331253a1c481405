#!/usr/bin/env bash
# Run the test suite on every CPython installed here, twice each:
#   cython  the package installed with its extension (strict build:
#           LEASEQUEUE_REQUIRE_EXTENSIONS=1, so a failed compile is an error)
#   python  the package built and run with LEASEQUEUE_NO_EXTENSIONS=1
# Each run uses a fresh venv and a regular (non-editable) install of a
# snapshot of the working tree (tracked and untracked files, not ignored
# ones), so the tests exercise the installed package, never src/ directly.
#
# Usage:  tools/test_all_pythons.sh [pytest args...]
#   PYTHONS="python3.12 /opt/py/bin/python3.14t" tools/test_all_pythons.sh -x -q
# Interpreters default to pyenv's CPython 3.9+ versions and any python3.N(t)
# on PATH.  Needs the package index (or pip's cache) for setuptools, Cython,
# pytest, pytest-xdist and hypothesis.  Prints a summary table; exits non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

find_pythons() {
  local seen=" " py real
  {
    if command -v pyenv >/dev/null 2>&1; then
      printf '%s\n' "$(pyenv root)"/versions/3.*/bin/python3 | sort -V
    fi
    for v in 9 10 11 12 13 14; do
      command -v "python3.$v" 2>/dev/null
      command -v "python3.${v}t" 2>/dev/null
    done
  } | while read -r py; do
    [ -x "$py" ] || continue
    # CPython 3.9 or newer only, and each interpreter once.
    "$py" -c 'import sys; sys.exit(not (sys.implementation.name == "cpython" and sys.version_info >= (3, 9)))' \
      2>/dev/null || continue
    real="$("$py" -c 'import os, sys; print(os.path.realpath(sys.executable))')"
    case "$seen" in *" $real "*) continue ;; esac
    seen="$seen$real "
    echo "$py"
  done
}

if [ -n "${PYTHONS:-}" ]; then
  read -r -a pythons <<<"$PYTHONS"
else
  mapfile -t pythons < <(find_pythons)
fi
[ "${#pythons[@]}" -gt 0 ] || { echo "no CPython >= 3.9 found" >&2; exit 2; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
snap="$work/src"
mkdir -p "$snap"
git ls-files -co --exclude-standard -z | xargs -0 tar -cf - | tar -xf - -C "$snap"

unset PYTHONPATH LEASEQUEUE_NO_EXTENSIONS LEASEQUEUE_REQUIRE_EXTENSIONS CIBUILDWHEEL
export PIP_DISABLE_PIP_VERSION_CHECK=1
summary=()
failed=0

for py in "${pythons[@]}"; do
  ver="$("$py" -c 'import sys, sysconfig; print("%d.%d.%d%s" % (sys.version_info[:3] + ("t" if sysconfig.get_config_var("Py_GIL_DISABLED") else "",)))')"
  for impl in cython python; do
    label="$ver $impl"
    echo "=============================== $label ($py)"
    venv="$work/venv-$ver-$impl"
    log="$work/$ver-$impl.log"
    rm -rf "$snap/build"
    if [ "$impl" = cython ]; then
      switch=(env LEASEQUEUE_REQUIRE_EXTENSIONS=1)
    else
      switch=(env LEASEQUEUE_NO_EXTENSIONS=1)
    fi
    if ! { "$py" -m venv "$venv" &&
      "${switch[@]}" "$venv/bin/python" -m pip install -q "${snap}[test]"; } >"$log" 2>&1; then
      tail -30 "$log"
      summary+=("$label: INSTALL FAILED")
      failed=1
      continue
    fi
    "${switch[@]}" "$venv/bin/python" -c \
      'import leasequeue; print("installed", leasequeue.__version__, leasequeue.IMPLEMENTATION, leasequeue.__file__)'
    # From the snapshot root: src/ is not on sys.path, the installed package is tested.
    (cd "$snap" && "${switch[@]}" "$venv/bin/python" -m pytest -p no:cacheprovider "$@") 2>&1 | tee "$log"
    rc="${PIPESTATUS[0]}"
    result="$(grep -E '[0-9]+ (passed|failed|errors?)[ ,].* in [0-9.]+s' "$log" | tail -1 | tr -d '=' | sed 's/^ *//;s/ *$//')"
    if [ "$rc" -eq 0 ]; then
      summary+=("$label: ok ($result)")
    else
      summary+=("$label: FAILED rc=$rc ($result)")
      failed=1
    fi
    rm -rf "$venv"
  done
done

echo
echo "=============================== summary"
printf '%s\n' "${summary[@]}"
exit "$failed"
