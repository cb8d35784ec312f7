#!/usr/bin/env bash
# The whole test suite (unit, ROS integration, closed loop) in the project venv. `make test` runs the
# bootstrap first; extra arguments go to pytest (e.g. `scripts/run_tests.sh tests/unit -x`).
# Two pytest-xdist workers by default (LUNA_TEST_WORKERS; 0 runs in this process): much of the suite
# waits on node processes and DDS, so two workers fill two cores. Whole files go to one worker
# (--dist loadfile): a module's model fixtures load once.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LUNA_VENV:-$ROOT/.venv}"
export LUNA_COMMONROAD_DIR="${LUNA_COMMONROAD_DIR:-$ROOT/../shared/scenarios/commonroad}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export MPLBACKEND=Agg
cd "$ROOT"
exec "$VENV/bin/python" -m pytest -n "${LUNA_TEST_WORKERS:-2}" --dist loadfile "$@"
