#!/usr/bin/env bash
# Branch coverage of the pure twin (_backends/inmemory/transport_py.py and the modules it imports),
# subprocesses and threads included, failing below the floor `fail_under` in
# pyproject.toml (tests/coverage_floor.py).  CI measures the same during its
# run of the README's test command (.ci/run sets LEASEQUEUE_COVERAGE=1); this
# script is the quicker way to the figure from a checkout.
#
# The Cython variants are skipped (LEASEQUEUE_NO_EXTENSIONS=1: they execute
# none of the measured code) and the PostgreSQL tests are not run (their
# backend is not measured), so this costs about what the plain suite does.
# Extra arguments go to pytest; a focused run prints the figure without
# enforcing the floor.
#
#   tools/coverage.sh                       # the figure and the floor
#   tools/coverage.sh tests/inmemory/test_edges.py   # the figure for one file
set -euo pipefail
cd "$(dirname "$0")/.."
export LEASEQUEUE_COVERAGE=1 LEASEQUEUE_NO_EXTENSIONS=1
unset LEASEQUEUE_REQUIRE_EXTENSIONS
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m pytest -p no:cacheprovider --ignore=tests/postgres "$@"
