#!/usr/bin/env bash
# Regenerate benchmarks/results/: one full run (tables, JSON, plot), the
# callgrind instruction counts, and the machine description.
# Usage: benchmarks/make_results.sh   (from a checkout, after tools/build_inplace.sh)
# Extra arguments go to `leasequeue bench`, e.g. --repeats 7 on a slow machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
out=benchmarks/results
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
{
  echo "date (UTC): $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
  echo "cores: $(nproc)"
  if command -v lscpu > /dev/null; then
    lscpu | grep -E '^(L1d|L2|L3) cache' | sed 's/  */ /g' || true
  fi
  echo "memory: $(free -h | awk '/^Mem:/ {print $2}')"
  echo "kernel: $(uname -srm)"
  echo "python: $("$PY" -c 'import sys; print(sys.version.replace(chr(10), " "))')"
  echo "cython: $("$PY" -c 'import Cython; print(Cython.__version__)' 2>/dev/null || echo none)"
  echo "leasequeue: $("$PY" -m leasequeue --version)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$out/machine.txt"
"$PY" -m leasequeue bench --full --markdown "$out/full.md" --json "$out/full.json" --plot "$out/cycle.png" "$@" > /dev/null
# The same cycle with each implementation alone in its process: at 1M the
# working set outgrows the caches, and in the interleaved run the other
# implementations' samples evict it between samples.
{
  echo "# Full cycle, each implementation alone in its own process (G = N/10)"
  echo
  echo "In the interleaved run the other implementations run between samples and evict"
  echo "this one's data from the caches; at N = 1M (a working set larger than L3) that"
  echo "costs the Cython transport a few tens of ns per cycle. Median [min–max] of 11 repeats."
  echo
  echo "| implementation | N=10k | N=1M | 1M / 10k |"
  echo "|---|---:|---:|---:|"
  for impl in cython floor queue pure; do
    "$PY" -m leasequeue bench --sizes 10k,1M --groups N/10 --workloads cycle --impls "$impl" \
      --repeats 11 --ops 50000 --no-memory --no-progress --json "$out/.alone-$impl.json" > /dev/null
    "$PY" - "$out/.alone-$impl.json" "$impl" <<'PYEOF'
import json, sys
from leasequeue.bench import fmt_ns
r = {x["n"]: x for x in json.load(open(sys.argv[1]))["results"]}
a, b = r[10_000], r[1_000_000]
cell = lambda x: f"{fmt_ns(x['median_ns'])} [{fmt_ns(x['min_ns'])}–{fmt_ns(x['max_ns'])}]"
print(f"| {sys.argv[2]} | {cell(a)} | {cell(b)} | {b['median_ns'] / a['median_ns']:.2f}× |")
PYEOF
    rm -f "$out/.alone-$impl.json"
  done
} > "$out/cycle-alone.md"
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"
if command -v valgrind > /dev/null; then
  "$PY" benchmarks/callgrind.py --json "$out/callgrind.json" > "$out/callgrind.md"
  # Cache misses explain the time that instruction counts do not (10k vs 1M).
  "$PY" benchmarks/callgrind.py --impls cython,floor,queue --cache-sim \
    --json "$out/callgrind-cachesim-10k.json" > "$out/callgrind-cachesim-10k.md"
  "$PY" benchmarks/callgrind.py --impls cython,floor,queue --cache-sim --n 1000000 --groups 100000 \
    --json "$out/callgrind-cachesim-1M.json" > "$out/callgrind-cachesim-1M.md"
  # The batched cycle, per message, for each batch size (next to callgrind.md's single calls).
  for k in 1 16 64 256; do
    "$PY" benchmarks/callgrind.py --impls cython,pure --batch "$k" --json "$out/callgrind-batch-$k.json"
  done > "$out/callgrind-batches.md"
else
  echo "valgrind not installed: callgrind.md not regenerated" >&2
fi
echo "results written to $out/"
