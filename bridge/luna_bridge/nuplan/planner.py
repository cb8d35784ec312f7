"""``LunaNuPlanPlanner``: a nuPlan devkit ``AbstractPlanner`` that runs a ``luna_core`` planner.

This module imports the devkit (https://github.com/motional/nuplan-devkit) and is only imported by
the devkit's hydra configs (``config/planner/luna_planner.yaml``: a planner on its own;
``luna_stack_planner.yaml``: the full stack, with the decision source of
``luna_bridge.stack_planner.make_decision_source``); the rest of the project never
imports it, so the project works without the devkit. The conversions live in ``convert``.

Per call: the history buffer's ego states and current ``DetectionsTracks`` plus the traffic lights
become a ``luna_core.types.PlannerInput``; the lane graph holds the route roadblocks' lanes
(converted once at ``initialize``) and grows with the lanes and lane connectors within
``map_radius`` of the ego; the luna planner's ``Trajectory`` is returned as an
``InterpolatedTrajectory`` of rear-axle ``EgoState``s.
"""

from __future__ import annotations

from typing import Any, Type

try:
    from nuplan.common.actor_state.ego_state import EgoState as NuPlanEgoState
    from nuplan.common.actor_state.state_representation import Point2D, StateSE2, StateVector2D, TimePoint
    from nuplan.common.maps.maps_datatypes import SemanticMapLayer
    from nuplan.planning.simulation.observation.observation_type import DetectionsTracks, Observation
    from nuplan.planning.simulation.planner.abstract_planner import (AbstractPlanner, PlannerInitialization,
                                                                     PlannerInput)
    from nuplan.planning.simulation.trajectory.abstract_trajectory import AbstractTrajectory
    from nuplan.planning.simulation.trajectory.interpolated_trajectory import InterpolatedTrajectory
except ImportError as exc:  # pragma: no cover - depends on the user's installation
    raise ImportError("luna_bridge.nuplan.planner needs the nuPlan devkit (nuplan-devkit, not on PyPI); "
                      "install it as https://github.com/motional/nuplan-devkit describes") from exc

from luna_core.planning.factory import make_planner
from luna_core.types import LaneGraph, Trajectory

from luna_bridge.nuplan.convert import (collect_lane_edges, extend_lane_graph, planner_input_from_nuplan,
                                        rear_axle_samples, route_from_nuplan, vehicle_from_nuplan)
from luna_bridge.sim.simulator import DecisionSource


class LunaNuPlanPlanner(AbstractPlanner):
    """The LUNA stack's planner (``luna``; or ``diffusion-es``, ``pdm``, ``idm``) inside nuPlan.

    ``planner_options`` go to the planner's config (``luna_core.planning.factory``);
    ``replan_every`` > 1 re-uses the last trajectory between planner calls (the LUNA planner replans
    every 0.5 s = 5 devkit steps); ``decision_source`` (the LUNA stack's:
    ``luna_bridge.stack_planner.make_decision_source``) is asked for a decision on the planner
    calls at devkit steps that are multiples of ``decision_every`` (as ``luna_bridge.sim`` does;
    20 = T_d = 2.0 s), and its ``reset()``, if it has one, is called at ``initialize``; without a
    decision source the ``luna`` planner runs its fallback objective (no decision term).
    ``planner_name`` labels the runs in the devkit's results (default ``luna_<planner>``).
    """

    requires_scenario: bool = False  # fair evaluation: no access to the scenario's future

    def __init__(self, planner: str = "luna", planner_options: dict[str, Any] | None = None,
                 replan_every: int = 1, map_radius: float = 60.0, decision_source: DecisionSource | None = None,
                 decision_every: int = 20, planner_name: str = "") -> None:
        if replan_every < 1 or decision_every < 1:
            raise ValueError(f"replan_every ({replan_every}) and decision_every ({decision_every}) must be >= 1")
        if decision_source is not None and decision_every % replan_every:
            raise ValueError(f"decision_every ({decision_every}) must be a multiple of replan_every ({replan_every}): "
                             "decisions are made on planner calls")
        self._planner_name = planner_name or f"luna_{planner}"
        self._planner = make_planner(planner, dict(planner_options or {}))
        self._replan_every = int(replan_every)
        self._map_radius = float(map_radius)
        self._decision_source = decision_source
        self._decision_every = int(decision_every)
        self._map_api: Any = None
        self._route = None
        self._graph = LaneGraph()
        self._last: InterpolatedTrajectory | None = None
        self._decision = None

    def name(self) -> str:
        return self._planner_name

    def observation_type(self) -> Type[Observation]:
        return DetectionsTracks  # type: ignore[return-value]

    def initialize(self, initialization: PlannerInitialization) -> None:
        self._map_api = initialization.map_api
        self._route = route_from_nuplan(initialization.route_roadblock_ids, initialization.mission_goal, 0.0)
        self._graph = LaneGraph()
        extend_lane_graph(self._graph, collect_lane_edges(self._map_api, self._route.road_ids,
                                                          layers=SemanticMapLayer))
        self._planner.reset()
        reset = getattr(self._decision_source, "reset", None)
        if callable(reset):  # per-scenario records and retrieval state of the LUNA stack's source
            reset()
        self._last = None
        self._decision = None

    def compute_planner_trajectory(self, current_input: PlannerInput) -> AbstractTrajectory:
        if self._route is None:
            raise RuntimeError("LunaNuPlanPlanner.compute_planner_trajectory called before initialize")
        step = current_input.iteration.index
        if self._last is not None and step % self._replan_every != 0:
            return self._last
        ego_states = current_input.history.ego_states
        current = ego_states[-1]
        _, observation = current_input.history.current_state
        extend_lane_graph(self._graph, collect_lane_edges(
            self._map_api, (), Point2D(current.rear_axle.x, current.rear_axle.y), self._map_radius,
            layers=SemanticMapLayer))
        vehicle_params = current.car_footprint.vehicle_parameters
        pin = planner_input_from_nuplan(ego_states, observation, current_input.traffic_light_data, self._graph,
                                        self._route, vehicle_from_nuplan(vehicle_params))
        if self._decision_source is not None and step % self._decision_every == 0:
            self._decision = self._decision_source.decide(pin)
        pin.decision = self._decision
        trajectory: Trajectory = self._planner.plan(pin)
        samples = rear_axle_samples(trajectory, pin.vehicle, origin_s=pin.ego.stamp,
                                    origin_us=current.time_point.time_us)
        self._last = InterpolatedTrajectory([
            NuPlanEgoState.build_from_rear_axle(
                rear_axle_pose=StateSE2(s.x, s.y, s.heading),
                rear_axle_velocity_2d=StateVector2D(s.velocity, 0.0),
                rear_axle_acceleration_2d=StateVector2D(s.acceleration, 0.0),
                tire_steering_angle=s.steering_angle, time_point=TimePoint(s.time_us),
                vehicle_parameters=vehicle_params, angular_vel=s.yaw_rate)
            for s in samples])
        return self._last
