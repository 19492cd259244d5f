#!/usr/bin/env bash
# The full test suite, then the linters. pytest's "no tests ran" (exit 5) is a failure.
# tests/support/tier_times.py prints how long each tier (tests/<tier>/) took, and the linters
# their own time below.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=.venv/bin/python
# The multi-host tier (tests/multihost) needs root, ip netns and sshd: say up front whether it runs.
PYTHONPATH="${PYTHONPATH:-$PWD}" "$PY" -m tests.multihost.hosts check || true
# The Slurm tier (tests/slurm) needs root and slurm-wlm: say up front whether it runs.
PYTHONPATH="${PYTHONPATH:-$PWD}" "$PY" -m tests.support.slurm_cluster check || true
# The Grid Engine tier (tests/gridengine) needs root and gridengine-*: say up front whether it runs.
PYTHONPATH="${PYTHONPATH:-$PWD}" "$PY" -m tests.support.gridengine_cluster check || true
# Two pytest-xdist workers (TEST_WORKERS=N for another count, 0 for one process): most
# tests wait on a launched job, its time-outs and its detection windows. Tests that share a
# costly fixture run on one worker, one after another (tests/conftest.py XDIST_GROUPS).
WORKERS="${TEST_WORKERS:-2}"
"$PY" -m pytest tests -q -p no:cacheprovider -p tests.support.tier_times -n "$WORKERS" "$@"
rc=$?
if [ "$rc" = 5 ]; then
    echo "error: pytest collected no tests" >&2
    exit 1
fi
[ "$rc" = 0 ] || exit "$rc"
start=$SECONDS
.venv/bin/ruff check poprun popdist popdist_torch popdist_lightning _popdist_poptorch tests examples benchmarks || exit 1
.venv/bin/mypy || exit 1
echo "linters (ruff, mypy): $((SECONDS - start)) s"
