"""One planning cycle with the stack's degraded modes, for any ``luna_core.types.Planner`` (pure: no ROS).

The planner node runs this every replan period and only maps the outcome to its topics and
``/diagnostics``; the policy is here, where it is unit-tested:

* no odometry yet: nothing to plan from, nothing published (``trajectory`` None);
* no lane graph or route yet, an empty lane graph, or odometry older than ``max_input_age``: a
  comfortable stop (straight ahead without a map);
* the latest valid decision goes to the planner as it is; whether it is still in force is the decision
  contract's (``luna_core.decision.DecisionTiming``), reported for planners that follow decisions;
* planner exception, or a non-finite or one-point trajectory: a comfortable stop along the route;
* the planner's own degraded modes (its ``degraded_reason`` and ``cycle_info``) are passed on.

Under sim time the node first waits for the inputs of its instant (``instant_missing``): the odometry
and acceleration (``EgoHistory.missing_at``), objects and lights once heard, and at a decision instant
of T_d (``DecisionTiming.due``) the decision, for a planner that follows decisions.

Conditions are keyed as the node's diagnostics: ``inputs``, ``decision``, ``planning``; a key set to
None clears it, a key absent leaves it as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from luna_core.decision import DecisionTiming
from luna_core.ego_history import EgoHistory, heard_at, unheard
from luna_core.planning.fallback import comfortable_stop
from luna_core.types import (DecisionDistribution, EgoState, LaneGraph, PlannerInput, Route, TrackedObjects,
                             Trajectory, TrafficLights, VehicleParameters)

WARN = "warn"
ERROR = "error"


@dataclass(frozen=True)
class Condition:
    severity: str  # WARN or ERROR
    message: str


@dataclass(frozen=True)
class CyclePolicy:
    max_input_age: float  # s: older odometry -> comfortable stop
    timing: DecisionTiming  # T_d and the decision timeout (the planner ages decisions with the same)
    follows_decisions: bool  # the planner uses decisions: their absence or staleness is reported
    vehicle: VehicleParameters = field(default_factory=VehicleParameters)  # the ego's geometry


@dataclass
class CycleInputs:
    """The latest inputs at ``now``; None = not received yet."""

    now: float
    history: list[EgoState]  # oldest first
    objects: TrackedObjects | None = None
    lights: TrafficLights | None = None
    graph: LaneGraph | None = None
    route: Route | None = None
    decision: DecisionDistribution | None = None


@dataclass
class CycleOutcome:
    trajectory: Trajectory | None  # stamped ``now``; None: nothing to plan from
    planned: bool = False  # the planner's own trajectory (its candidates are worth showing)
    conditions: dict[str, Condition | None] = field(default_factory=dict)
    counts: list[str] = field(default_factory=list)  # counters to increment


def inputs_missing(ego: EgoHistory, now: float, graph: LaneGraph | None, route: Route | None,
                   objects: TrackedObjects | None, lights: TrafficLights | None) -> list[str]:
    """What a lock-step instant ``now`` waits for and is not in yet, each named with its latest stamp (empty:
    complete): the lane graph and route, the odometry with its reported values (``EgoHistory.missing_at``),
    and the objects and lights once heard. The planner node and the scene descriptor both wait on this."""
    missing = [what for what, value in (("lane graph", graph), ("route", route)) if value is None]
    missing += ego.missing_at(now)
    return missing + [unheard(what, m.stamp) for what, m in (("objects", objects), ("lights", lights))
                      if m is not None and not heard_at(m.stamp, now)]


def instant_missing(ego: EgoHistory, inputs: CycleInputs, policy: CyclePolicy) -> list[str]:
    """``inputs_missing`` for the planner's instant ``inputs.now``, and at a decision instant the decision.
    ``inputs.history`` is not read: ``ego`` is the live history, whose acceleration stamps tell whether
    the instant's acceleration came."""
    now = inputs.now
    missing = inputs_missing(ego, now, inputs.graph, inputs.route, inputs.objects, inputs.lights)
    if policy.follows_decisions and policy.timing.due(now):
        decision = inputs.decision
        if decision is None or not heard_at(decision.stamp, now):
            missing.append(unheard("decision", decision.stamp if decision is not None else None))
    return missing


def planner_input(inputs: CycleInputs, policy: CyclePolicy,
                  conditions: dict[str, Condition | None]) -> PlannerInput | None:
    """The planner input of this cycle (None without odometry), its conditions added to ``conditions``."""
    now, history = inputs.now, inputs.history
    if not history:
        conditions["inputs"] = Condition(WARN, "waiting for odometry: nothing to plan from")
        return None
    objects, lights = inputs.objects or TrackedObjects(now), inputs.lights or TrafficLights(now)
    missing = [n for n, v in (("lane graph", inputs.graph), ("route", inputs.route)) if v is None]
    if missing:
        # Without a map or route there is nothing to follow: a comfortable stop straight ahead.
        conditions["inputs"] = Condition(WARN, f"waiting for {', '.join(missing)}: comfortable stop")
        return PlannerInput(now, history, objects, lights, LaneGraph(), Route(now, []), None, policy.vehicle)
    age = now - history[-1].stamp
    conditions["inputs"] = Condition(WARN, f"odometry is stale ({age:.2f} s old)") \
        if age > policy.max_input_age else None
    decision = inputs.decision
    why = "no valid decision received" if decision is None else policy.timing.stale(decision.stamp, now)
    conditions["decision"] = Condition(WARN, f"{why}: fallback objective without the decision term") \
        if why and policy.follows_decisions else None
    return PlannerInput(now, history, objects, lights, inputs.graph, inputs.route, decision, policy.vehicle)


def plan_cycle(planner: Any, inputs: CycleInputs, policy: CyclePolicy) -> CycleOutcome:
    """One cycle of ``planner`` on ``inputs`` under the degraded modes of the module docstring."""
    out = CycleOutcome(None)
    pin = planner_input(inputs, policy, out.conditions)
    if pin is None:
        return out
    if inputs.now - pin.ego.stamp > policy.max_input_age or not pin.lane_graph.lanes:
        # Stale odometry, or no map (missing or empty): nothing to plan on; stop comfortably.
        trajectory = comfortable_stop(pin.ego, pin.lane_graph, pin.route)
        if not pin.lane_graph.lanes:
            out.conditions["planning"] = Condition(WARN, "lane graph has no lanes: comfortable stop straight ahead")
    else:
        try:
            trajectory = planner.plan(pin)
            if not trajectory.is_finite() or len(trajectory) < 2:
                raise ValueError("planner returned a non-finite or empty trajectory")
            out.planned = True
            reason = getattr(getattr(planner, "last", None), "degraded_reason", "")
            cycle = getattr(planner, "cycle_info", dict)()
            if cycle.get("mode"):  # cycles per mode: decision, fallback, least_bad, emergency_brake, ...
                out.counts.append(f"mode_{cycle['mode']}")
            if cycle.get("flip"):
                out.counts.append("decision_flips")
            if cycle.get("safety_gated"):  # safety first changed a* from the paper's Eq. 22 pick
                out.counts.append("safety_gated")
            out.conditions["planning"] = Condition(WARN, reason) if reason else None
        except Exception as exc:  # noqa: BLE001 - any planner failure -> comfortable stop
            out.conditions["planning"] = Condition(ERROR, f"planner failed ({exc}): comfortable stop")
            out.counts.append("planner_failures")
            trajectory = comfortable_stop(pin.ego, pin.lane_graph, pin.route)
    trajectory.stamp = inputs.now
    out.trajectory = trajectory
    return out
