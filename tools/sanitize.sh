#!/usr/bin/env bash
# Run the Cython half of the test suite against a sanitizer build (issue 6).
#
#   tools/sanitize.sh                 # AddressSanitizer + UBSan build, Cython tests
#   tools/sanitize.sh valgrind        # the normal build under valgrind memcheck
#   tools/sanitize.sh asan tests/inmemory/test_leaks.py   # extra pytest arguments go to pytest
#   SANITIZE_K="not test_stress" tools/sanitize.sh valgrind   # narrow the selection
#
# asan: the extension is compiled with -fsanitize=address,undefined into a temp
# dir (the working tree's .so files are not touched), libasan is preloaded into
# the (uninstrumented) interpreter, and PYTHONMALLOC=malloc routes Python
# objects through malloc too, so ASan sees every allocation.  Leak detection is
# off: CPython itself frees little at exit; leaks are test_leaks.py's job.
# valgrind: slower (~30x); PYTHONMALLOC=malloc as well; a memcheck error whose
# stack passes through the extension fails the run (the interpreter's own
# known noise is ignored).
# Exit status: pytest's, or non-zero on any sanitizer report.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
# the interpreter itself, not a wrapper script (a pyenv shim is bash: valgrind would watch bash)
PY="$("$PY" -c 'import sys; print(sys.executable)')"
mode="${1:-asan}"
[ $# -gt 0 ] && shift
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

mkdir -p "$tmp/src"
cp -r src/leasequeue "$tmp/src/"
find "$tmp/src/leasequeue" \( -name "*.so" -o -name "*.c" \) -delete

# Compile every .pyx of the package with the directives setup.py uses, through a bare
# setuptools Distribution (no pyproject parsing: an older setuptools may reject it).
build() {
  "$PY" - "$tmp" <<'PYEOF'
import ast, glob, os, sys
from setuptools import Distribution, Extension
from Cython.Build import cythonize
tmp = sys.argv[1]
tree = ast.parse(open("setup.py").read())
directives = next(ast.literal_eval(n.value) for n in tree.body
                  if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "CYTHON_DIRECTIVES")
src = os.path.join(tmp, "src")
pyx = sorted(glob.glob(os.path.join(src, "leasequeue", "**", "*.pyx"), recursive=True))
headers = os.path.join(src, "leasequeue", "_backends", "inmemory")  # lq_platform.h, lq_build.h
exts = [Extension(os.path.relpath(p, src)[:-4].replace(os.sep, "."), [p], include_dirs=[headers]) for p in pyx]
dist = Distribution({"name": "leasequeue-sanitize", "ext_modules": cythonize(exts, compiler_directives=directives, quiet=True)})
cmd = dist.get_command_obj("build_ext")
cmd.build_lib = os.path.join(tmp, "lib")
cmd.build_temp = os.path.join(tmp, "tmp")
dist.run_command("build_ext")
print("built", ", ".join(e.name for e in exts))
PYEOF
  (cd "$tmp/lib" && find leasequeue -name '*.so') | while read -r rel; do cp "$tmp/lib/$rel" "$tmp/src/$rel"; done
}
# the Cython tests only (tests/test_build.py builds real venvs: not a sanitizer matter);
# SANITIZE_K adds to the selection, e.g. SANITIZE_K="not test_stress" (a -k among the
# extra pytest arguments would replace it instead)
select="cython and not test_build"
[ -n "${SANITIZE_K:-}" ] && select="$select and ($SANITIZE_K)"
# -p no:xdist: every test in the one process the sanitizer watches (valgrind
# does not follow xdist's workers), not spread over workers (tests/parallel.py)
selection=(-k "$select" -p no:cacheprovider -p no:xdist -q -x)

case "$mode" in
  asan)
    export CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1 -g"
    export LDFLAGS="-fsanitize=address,undefined"
    build >/dev/null
    unset CFLAGS LDFLAGS
    for so in $(find "$tmp/src/leasequeue" -name "*.so"); do
      n="$(nm -D --undefined-only "$so" | grep -c '__asan_report' || true)"
      echo "sanitize: $(basename "$so"): $n ASan check entry points"
      [ "$n" -gt 0 ] || { echo "sanitize: $so is not instrumented" >&2; exit 1; }
    done
    libasan="$(gcc -print-file-name=libasan.so)"
    log="$tmp/asan"
    echo "sanitize: ASan+UBSan build in $tmp, libasan $libasan"
    set +e
    LD_PRELOAD="$libasan" \
    ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:halt_on_error=1:exitcode=86:log_path=$log:allocator_may_return_null=1" \
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$log" \
    PYTHONMALLOC=malloc PYTHONPATH="$tmp/src" \
      "$PY" -m pytest tests "${selection[@]}" "$@"
    rc=$?
    set -e
    ;;
  valgrind)
    build >/dev/null
    log="$tmp/valgrind"
    echo "sanitize: valgrind memcheck, build in $tmp"
    set +e
    PYTHONMALLOC=malloc PYTHONPATH="$tmp/src" \
      valgrind --tool=memcheck --trace-children=no --num-callers=30 --log-file="$log.%p" \
        "$PY" -m pytest tests "${selection[@]}" "$@"
    rc=$?
    set -e
    ;;
  *)
    echo "usage: tools/sanitize.sh [asan|valgrind] [pytest args...]" >&2
    exit 2
    ;;
esac

reports=0
for f in "$log".*; do
  [ -e "$f" ] || continue
  if [ "$mode" = valgrind ]; then
    # the uninstrumented interpreter has its own known memcheck noise (CPython ships a
    # suppression file in its source tree, not installed): count only errors whose
    # stack passes through the extension
    found="$(awk '/^==[0-9]+== [A-Z]/ {blk=$0; next} /^==[0-9]+== +(at|by) / {blk=blk "\n" $0; next}
                  /^==[0-9]+== *$/ {if (blk ~ /transport_c|_floor/) {print blk; n++} blk=""} END {exit n == 0}' "$f")" && {
      reports=$((reports + 1))
      echo "---- memcheck errors in the extension: $f"
      printf '%b\n' "$found" | head -80
    }
  elif grep -qE "ERROR: AddressSanitizer|runtime error:" "$f"; then
    reports=$((reports + 1))
    echo "---- sanitizer report: $f"
    head -60 "$f"
  fi
done
echo "sanitize ($mode): pytest exit $rc, $reports sanitizer report(s)"
if [ "$rc" -ne 0 ] || [ "$reports" -ne 0 ]; then
  exit 1
fi
