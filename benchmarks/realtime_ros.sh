#!/usr/bin/env bash
# Real time over ROS (issue 14, item 3): the demo's stack (planner, scene descriptor, decision node,
# progress monitor, reflection client) on system time with its default parameters (T_d = 2 s,
# replanning every 0.5 s with the 0.4 s anytime budget), driven at wall-clock speed by
# `luna-bridge ros --realtime` on the demo's three scenarios. Writes OUT/realtime.json and
# OUT/realtime.md (per scenario: trajectory and decision delays with histograms, missed deadlines from
# /diagnostics, and where the time goes: each process's CPU over the run) and the stack's log OUT/stack.log.
#
#   benchmarks/realtime_ros.sh [OUT] [PARAMS_DIR]   (default out/realtime and the bundled parameter files;
#                                                   in your own ROS_DOMAIN_ID)
set -euo pipefail
out=${1:-out/realtime}
params=(${2:+--params-dir "$2"})
mkdir -p "$out"
export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
export FASTDDS_DEFAULT_PROFILES_FILE=${FASTDDS_DEFAULT_PROFILES_FILE:-$PWD/ros_ws/src/luna_bringup/config/fastdds_fast_discovery.xml}
data=bridge/luna_bridge/scenarios/data/hard
luna up "${params[@]}" --only planner,scene_descriptor,decision,progress_monitor,reflection_client > "$out/stack.log" 2>&1 &
stack=$!
trap 'kill -INT $stack 2>/dev/null; wait $stack || true' EXIT
# Drive once the stack is up as on a vehicle: both warm standbys ready (they start 10 s after their
# process and load the same models), so no model loading shares the cores with the run (at most 300 s).
for _ in $(seq 300); do
    [ "$(grep -c 'standby: ready' "$out/stack.log")" -ge 2 ] && break
    sleep 1
done
grep 'standby: ready' "$out/stack.log" || echo "realtime_ros.sh: the standbys were not ready after 300 s; driving anyway"
luna-bridge ros --realtime --start-timeout 300 --report "$out" \
    --scenario "$data/hard_following_lane_with_lead_00.json.gz" \
    --scenario "$data/hard_stopping_with_lead_00.json.gz" \
    --scenario "$data/hard_waiting_for_pedestrian_to_cross_00.json.gz"
