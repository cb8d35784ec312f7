#!/usr/bin/env bash
# Real time over ROS (issue 14, item 3): the demo's stack (planner, scene descriptor, decision node,
# progress monitor, reflection client) on system time with its default parameters (T_d = 2 s,
# replanning every 0.5 s with the 0.4 s anytime budget), driven at wall-clock speed by
# `luna-bridge ros --realtime` on the demo's three scenarios. Writes OUT/realtime.json and
# OUT/realtime.md (per scenario: trajectory and decision delays with histograms, missed deadlines from
# /diagnostics, and where the time goes: each process's CPU over the run) and the stack's log OUT/stack.log.
#
#   benchmarks/realtime_ros.sh [OUT]        (default out/realtime; in your own ROS_DOMAIN_ID)
set -euo pipefail
out=${1:-out/realtime}
mkdir -p "$out"
export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
export FASTDDS_DEFAULT_PROFILES_FILE=${FASTDDS_DEFAULT_PROFILES_FILE:-$PWD/ros_ws/src/luna_bringup/config/fastdds_fast_discovery.xml}
data=bridge/luna_bridge/scenarios/data/hard
luna up --only planner,scene_descriptor,decision,progress_monitor,reflection_client > "$out/stack.log" 2>&1 &
stack=$!
trap 'kill -INT $stack 2>/dev/null; wait $stack || true' EXIT
luna-bridge ros --realtime --start-timeout 300 --report "$out" \
    --scenario "$data/hard_following_lane_with_lead_00.json.gz" \
    --scenario "$data/hard_stopping_with_lead_00.json.gz" \
    --scenario "$data/hard_waiting_for_pedestrian_to_cross_00.json.gz"
