"""The planning context: everything a planning cycle derives from its ``PlannerInput`` and the map
before any planner searches, built once per cycle by ``build_planning_context``.

Every core planner (the decision-guided planner and Diffusion-ES without decisions, PDM-Closed, IDM)
starts from the same set-up, so it lives here, once:

* the input, sanitised: the ego state is the latest finite one of the history, the objects follow
  ``usable_objects`` (unknown size: default footprint; unknown position: left out); what was wrong
  is in ``input_problems`` (the planners' reasons);
* the lane map of the whole graph and the local one of the lanes within reach of the scored horizon
  (the scorer tests every footprint corner against every lane of the map it is given);
* the lane sequence of each lateral decision (one map search, ``reference_paths.lane_sequences``)
  and their reference paths cropped for the search (``paths``, long enough for 8 s at well above
  the current speed) and, on first use, the route centreline cropped for the IDM proposals
  (``route_reference``, what the ego covers at IDM's a_max plus 30 m, as PDM-Closed does);
* the constant-velocity forecast over the output horizon of the objects as far as 8 s trajectories
  reach (``forecast``: the warm starts' IDM and the published tail stop behind them), its subset
  within PDM-Closed's 50 m plus the red lights (``near_forecast``: PDM-Closed's and IDM's forecast),
  and the scorer's view of it over the scored horizon;
* the scoring context along a reference path (``scoring_context``; ``scoring`` along the current lane).

A context belongs to one input (``planner_input``) and one time grid (``output_steps``, ``scored_steps``,
``dt``); a planner handed one checks both (``check``), so two planners given the same context plan
from exactly the same set-up. Off the map, ``off_map`` says why and there are no paths, forecast or
scoring context (the decision-guided planner stops comfortably, the baselines raise ``OffMapError``).
"""

from __future__ import annotations

import math
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from luna_core.lanes import LaneMap, lane_map
from luna_core.planning.forecast import FORECAST_RADIUS, constant_velocity_forecast
from luna_core.planning.reference_paths import OffMapError, ReferencePath, crop_reference_path, lane_sequences
from luna_core.planning.scorer import ObjectBoxes, ScoringContext
from luna_core.types import EgoState, LaneGraph, PlannerInput, TrackedObjects, usable_objects


class PlannerInputError(ValueError):
    """The input holds nothing a trajectory can start from (no finite ego state)."""


#: m between the resampled points of the reference paths.
PATH_SPACING = 2.0
#: m/s^2: IDM's a_max (PDM-Closed 1.5) the baselines' centreline length assumes.
ROUTE_MAX_ACCEL = 1.5


@dataclass(frozen=True)
class PlanningContext:
    """One planning cycle's set-up (see the module docstring); build it with ``build_planning_context``."""

    planner_input: PlannerInput  # as received
    ego: EgoState  # the latest finite ego state of the history
    clean_input: PlannerInput  # ego history [ego], usable objects only
    input_problems: list[str]  # what was wrong with the input (non-finite latest ego, unusable objects)
    output_steps: int  # samples - 1 of the published trajectories (8 s)
    scored_steps: int  # steps the scorer sees (4 s)
    dt: float  # s between samples
    output_horizon: float  # s (output_steps * dt as configured)
    lanes: LaneMap  # the whole lane graph
    local_lanes: LaneMap  # the lanes within reach of the scored horizon
    off_map: str = ""  # why there is no reference path ("" on the map)
    sequences: dict[str, tuple[str, ...]] = field(default_factory=dict)  # lateral code -> lane ids
    paths: dict[str, ReferencePath] = field(default_factory=dict)  # the search's reference paths
    forecast: ObjectBoxes | None = None  # objects within the trajectories' reach, output_steps + 1 samples
    near: np.ndarray | None = None  # (N,) bool: the forecast rows within 50 m of the ego or red lights

    @property
    def on_map(self) -> bool:
        return not self.off_map

    def require_map(self, who: str) -> None:
        """Raise ``OffMapError`` naming ``who`` when the ego is off the map."""
        if self.off_map:
            raise OffMapError(f"{who}: {self.off_map}")

    def check(self, planner_input: PlannerInput, output_steps: int, scored_steps: int, dt: float, who: str) -> None:
        """Raise ``ValueError`` if this context was not built from ``planner_input`` on this time grid."""
        if self.planner_input is not planner_input:
            raise ValueError(f"{who}: the planning context was built from another planner input "
                             f"(t={self.planner_input.time:.2f}, this one t={planner_input.time:.2f})")
        if (self.output_steps, self.scored_steps, self.dt) != (output_steps, scored_steps, dt):
            raise ValueError(f"{who}: the planning context is for {self.output_steps} output / {self.scored_steps} "
                             f"scored steps of {self.dt} s, the planner uses {output_steps} / {scored_steps} of {dt} s")

    @cached_property
    def near_forecast(self) -> ObjectBoxes:
        """PDM-Closed's forecast: the objects within 50 m of the ego (nearest first, capped per class)
        and the red lights, over the output horizon. The same rows of ``forecast``: it selects the
        nearest first within a larger radius, so its rows within 50 m are exactly these."""
        self.require_map("near_forecast")
        return self.forecast.subset(self.near)

    @cached_property
    def scoring_forecast(self) -> ObjectBoxes:
        """What the scorer sees: ``near_forecast`` over the scored horizon."""
        return self.near_forecast.window(0, self.scored_steps + 1)

    def scoring_context(self, path: ReferencePath) -> ScoringContext:
        """The scorer's context with progress along ``path`` and its speed limit."""
        return ScoringContext(self.local_lanes, path.centerline, self.scoring_forecast, path.speed_limit,
                              self.planner_input.vehicle, self.dt)

    @cached_property
    def scoring(self) -> ScoringContext:
        """The scoring context along the current lane (the decision-guided planner's J_gen)."""
        self.require_map("scoring")
        return self.scoring_context(self.paths["K"])

    @cached_property
    def route_reference(self) -> ReferencePath:
        """The baselines' route centreline: the current lane's sequence cropped to what the ego can cover
        over the output horizon at IDM's a_max plus 30 m. The proposals and the scorer project hundreds
        of points on it every call, and the cost grows with its number of segments."""
        self.require_map("route_reference")
        horizon = self.output_steps * self.dt
        ahead = max(self.ego.velocity, 0.0) * horizon + 0.5 * ROUTE_MAX_ACCEL * horizon ** 2 + 30.0
        return crop_reference_path(self.planner_input.lane_graph, "K", self.sequences["K"], self.ego, ahead=ahead,
                                   spacing=PATH_SPACING)


#: m/s: below this speed the yaw rate says nothing about the steering angle, estimated as 0 then.
STEERING_MIN_SPEED = 0.2


def kinematic_steering_angle(velocity: float, yaw_rate: float, wheelbase: float) -> float:
    """rad: the front-wheel angle of the kinematic bicycle (rear axle) turning at ``yaw_rate`` (rad/s) at
    ``velocity`` (m/s): atan(L yaw_rate / v); 0 below ``STEERING_MIN_SPEED``."""
    if abs(velocity) < STEERING_MIN_SPEED:
        return 0.0
    return math.atan(wheelbase * yaw_rate / velocity)


def sanitised_ego(planner_input: PlannerInput) -> tuple[EgoState, list[str]]:
    """The state planning starts from: the latest finite ego state of the history (with a note if it is
    not the latest one), with its measured steering angle (the simulator's, the vehicle's steering
    report over ROS, nuPlan's tire angle), or, where none was measured, the one its yaw rate implies
    (``kinematic_steering_angle``).

    Why the measured one: at a standstill the yaw rate says nothing about the wheels, and a car that
    stopped in a turn still has them turned (planning from 0 there cost hard_stationary_in_traffic_05
    0.3 CLS). Over ROS the angle comes on its own topic, as the acceleration does, and is paired with
    the odometry by stamp (``luna_core.ego_history``), so a run in process and the same run over ROS plan
    from the same angle (issue 15's parity). A source without it (odometry alone, a bag without the
    topic) gets the kinematic estimate, the same angle as the simulator's bicycle while moving."""
    finite = [s for s in planner_input.ego_history if s.is_finite()]
    if not finite:
        raise PlannerInputError("the ego history has no finite state: no trajectory can start anywhere")
    ego = finite[-1]
    if ego.steering_angle is None:
        ego = replace(ego, steering_angle=kinematic_steering_angle(ego.velocity, ego.yaw_rate,
                                                                    planner_input.vehicle.wheelbase))
    if not planner_input.ego_history[-1].is_finite():
        return ego, [f"latest ego state is not finite; planning from the one at t={ego.stamp:.2f}"]
    return ego, []


# Local lane maps by (graph, nearby lane ids): built again only when the set of nearby lanes changes,
# so their polygons are built once per change and not every cycle. A few entries: planners of several
# scenarios may alternate in one process.
_LOCAL: OrderedDict[tuple[int, tuple[str, ...]], tuple[weakref.ref, LaneMap]] = OrderedDict()
_LOCAL_SIZE = 8


def local_lane_map(graph: LaneGraph, ego: EgoState, scored_steps: int, dt: float) -> LaneMap:
    """The lane map of the lanes within reach of the scored trajectories (60 m plus twice what the ego
    covers over ``scored_steps`` steps of ``dt`` at its speed, at least 15 m/s)."""
    reach = 60.0 + 2.0 * scored_steps * dt * max(ego.velocity, 15.0)
    ids = tuple(sorted(lane_map(graph).lanes_within(ego.x, ego.y, reach)))
    key = (id(graph), ids)
    hit = _LOCAL.get(key)
    if hit is not None and hit[0]() is graph:
        _LOCAL.move_to_end(key)
        return hit[1]
    lm = lane_map(LaneGraph({i: graph.lanes[i] for i in ids}, graph.frame_id, graph.stamp))
    _LOCAL[key] = (weakref.ref(graph), lm)
    while len(_LOCAL) > _LOCAL_SIZE:
        _LOCAL.popitem(last=False)
    return lm


def build_planning_context(planner_input: PlannerInput, *, output_horizon: float = 8.0, scored_steps: int = 40,
                           dt: float = 0.1) -> PlanningContext:
    """The planning context of one cycle: published trajectories over ``output_horizon`` s, scored over
    ``scored_steps`` steps, both every ``dt`` s. Raises ``PlannerInputError`` when the ego history has
    no finite state; off the map the context says why (``off_map``)."""
    ego, problems = sanitised_ego(planner_input)
    usable = usable_objects(planner_input.objects.objects)
    if usable.problems():
        problems.append(usable.problems())
    output_steps = int(round(output_horizon / dt))
    graph = planner_input.lane_graph
    clean_input = replace(planner_input, ego_history=[ego],
                          objects=TrackedObjects(planner_input.objects.stamp, usable.objects))
    base = dict(planner_input=planner_input, ego=ego, clean_input=clean_input, input_problems=problems,
                output_steps=output_steps, scored_steps=scored_steps, dt=dt, output_horizon=output_horizon,
                lanes=lane_map(graph), local_lanes=local_lane_map(graph, ego, scored_steps, dt))
    try:
        sequences = lane_sequences(graph, planner_input.route, ego)
    except OffMapError as exc:
        return PlanningContext(**base, off_map=str(exc))
    # Long enough for 8 s at well above the current speed; shorter paths project faster.
    ahead = 40.0 + output_horizon * max(1.5 * ego.velocity, 20.0)
    paths = {code: crop_reference_path(graph, code, ids, ego, ahead=ahead, spacing=PATH_SPACING)
             for code, ids in sequences.items()}
    keep = paths["K"]
    # Objects as far as the 8 s trajectories reach; red lights on the current lane's route whatever
    # their distance (the whole map: a controlled lane may lie beyond the local lanes).
    reach = max(FORECAST_RADIUS, 30.0 + output_horizon * max(ego.velocity, keep.speed_limit))
    forecast = constant_velocity_forecast(clean_input, lane_map(graph), list(keep.lane_ids), output_steps + 1, dt,
                                          radius=reach)
    near = np.hypot(forecast.pose[:, 0, 0] - ego.x, forecast.pose[:, 0, 1] - ego.y) <= FORECAST_RADIUS
    return PlanningContext(**base, sequences=sequences, paths=paths, forecast=forecast,
                           near=near | forecast.red_light)


