#!/usr/bin/env bash
# The whole test suite (unit, ROS integration, closed loop) in the project venv. `make test` runs the
# bootstrap first; extra arguments go to pytest (e.g. `scripts/run_tests.sh tests/unit -x`).
# Two phases: everything but the `realtime` tests on two pytest-xdist workers (LUNA_TEST_WORKERS; much
# of the suite waits on node processes and DDS, so two workers fill two cores; whole files go to one
# worker, so a module's model fixtures load once), then the `realtime` tests (wall-clock bounds) alone.
# LUNA_TEST_WORKERS=0 runs everything in this process, in one phase.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LUNA_VENV:-$ROOT/.venv}"
export LUNA_COMMONROAD_DIR="${LUNA_COMMONROAD_DIR:-$ROOT/../shared/scenarios/commonroad}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export MPLBACKEND=Agg
cd "$ROOT"
PYTEST=("$VENV/bin/python" -m pytest)
WORKERS="${LUNA_TEST_WORKERS:-2}"
if [ "$WORKERS" = 0 ]; then
  exec "${PYTEST[@]}" "$@"
fi
NO_TESTS=5  # pytest's exit code when a selection is empty (e.g. a file without realtime tests)
"${PYTEST[@]}" -n "$WORKERS" --dist loadfile -m "not realtime" "$@"
parallel=$?
"${PYTEST[@]}" -m realtime "$@"
alone=$?
for code in "$parallel" "$alone"; do
  if [ "$code" != 0 ] && [ "$code" != "$NO_TESTS" ]; then
    exit "$code"
  fi
done
# Both empty: nothing matched the arguments at all.
[ "$parallel" = "$NO_TESTS" ] && [ "$alone" = "$NO_TESTS" ] && exit "$NO_TESTS"
exit 0
