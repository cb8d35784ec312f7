"""IDM proposals along a path (PDM-Closed's proposal generator) and the IDM route-following planner.

A proposal = one lateral offset of a reference path x one IDM policy (target speed). Its ego
progress along the offset path is rolled out with IDM behind the nearest forecast object in its
corridor, turned into rear-axle poses on the path, and (for scoring) tracked by the LQR + kinematic
bicycle of ``luna_core.control`` so the scorer sees what the vehicle would actually drive.

The path is any ``Polyline``: PDM-Closed's route centreline, or an action's reference lane when the
LUNA planner warm-starts Diffusion-ES (``idm_proposals(ego, reference.centerline, forecast, ...)``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from luna_core.control import simulate_proposals, state_from_ego
from luna_core.idm import IDMParameters, idm_acceleration, pdm_policy
from luna_core.lanes import Polyline
from luna_core.planning.scorer import ObjectBoxes
from luna_core.planning.context import PlanningContext, build_planning_context
from luna_core.types import EgoState, PlannerInput, Trajectory, VehicleParameters, wrap_angle


@dataclass
class ProposalSet:
    """P proposals: IDM poses over the full horizon and, if simulated, the tracked states."""

    poses: np.ndarray  # (P, K+1, 3) rear-axle x, y, heading every dt, [:, 0] on the path at the ego
    velocity: np.ndarray  # (P, K+1) IDM velocity
    acceleration: np.ndarray  # (P, K+1) IDM acceleration
    offsets: np.ndarray  # (P,) lateral offset of the path (m, left positive)
    target_speeds: np.ndarray  # (P,) IDM target velocity (m/s)
    states: np.ndarray | None = None  # (P, T+1, 8) LQR + bicycle simulation of the first T steps
    dt: float = 0.1

    def trajectory(self, index: int, stamp: float) -> Trajectory:
        t = np.arange(self.poses.shape[1]) * self.dt
        p = self.poses[index]
        return Trajectory(stamp, t, p[:, 0].copy(), p[:, 1].copy(), p[:, 2].copy(),
                          self.velocity[index].copy(), self.acceleration[index].copy())


def corridor_leaders(path: Polyline, objects: ObjectBoxes, vehicle: VehicleParameters
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per object and step: arc length of its rear end along the path (N, K+1), whether it blocks
    the ego's corridor, and its speed along the path; plus its half extent along the path."""
    pose = objects.pose
    proj = path.project(pose[..., :2])
    rel = wrap_angle(pose[..., 2] - proj.heading)
    length, width = objects.size[:, 0:1], objects.size[:, 1:2]
    half_along = 0.5 * (np.abs(np.cos(rel)) * length + np.abs(np.sin(rel)) * width)
    half_across = 0.5 * (np.abs(np.sin(rel)) * length + np.abs(np.cos(rel)) * width)
    blocks = np.abs(proj.lateral) < half_across + vehicle.width / 2
    # A reversing object's forecast moves against its heading: its speed along the path is negative.
    travel = pose[:, -1, :2] - pose[:, 0, :2]
    backwards = travel[:, 0] * np.cos(pose[:, 0, 2]) + travel[:, 1] * np.sin(pose[:, 0, 2]) < 0.0
    v_along = np.where(backwards, -1.0, 1.0)[:, None] * objects.speed[:, None] * np.cos(rel)
    return proj.s - half_along, blocks, v_along, half_along


def idm_rollout(ego_velocity: float, start_s: np.ndarray, path_index: np.ndarray, paths: list[Polyline],
                objects: ObjectBoxes, params: IDMParameters, target_speeds: np.ndarray, steps: int,
                dt: float, vehicle: VehicleParameters, stop_short: bool = False
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IDM progress, velocity and acceleration (P, steps+1) of P policies (one target speed each)
    on their paths behind the nearest forecast object whose box blocks the corridor ahead (objects
    hold at their last forecast step). ``stop_short``: a step never carries the ego's front past that
    object's rear (it stops there), where IDM's bounded braking starts too close to stop in time; off
    for PDM-Closed's proposals, whose scorer must see such a collision."""
    p = len(path_index)
    s = np.zeros((p, steps + 1))
    v = np.zeros((p, steps + 1))
    a = np.zeros((p, steps + 1))
    s[:, 0] = start_s
    v[:, 0] = max(ego_velocity, 0.0)
    n = objects.num_objects
    front = vehicle.front_length
    if n:
        per_path = [corridor_leaders(path, objects, vehicle) for path in paths]
        # Stacked per proposal: (P, N, K+1) rear-end arc length, corridor blocking, speed, centre.
        rear, blocks, v_along, half = (np.stack([pp[i] for pp in per_path])[path_index] for i in range(4))
        centre = rear + half
        last = objects.pose.shape[1] - 1
    for k in range(steps):
        gap = np.full(p, np.inf)
        lead_v = np.zeros(p)
        if n:
            kk = min(k, last)
            ahead = blocks[:, :, kk] & (centre[:, :, kk] > s[:, k, None])  # (P, N)
            g = np.where(ahead, rear[:, :, kk] - (s[:, k, None] + front), np.inf)
            j = np.argmin(g, axis=1)
            rows = np.arange(p)
            gap = g[rows, j]
            # The leader's velocity projected on the path, negative when it comes towards the ego
            # (PDM-Closed projects on the ego heading and does not clip): IDM's approach term then
            # sees the true closing speed and brakes harder for oncoming or crossing-against traffic.
            lead_v = np.where(np.isfinite(gap), v_along[rows, j, kk], 0.0)
        acc = idm_acceleration(v[:, k], gap, lead_v, params, target_speeds)
        a[:, k] = acc
        step = v[:, k] * dt
        v[:, k + 1] = np.maximum(v[:, k] + acc * dt, 0.0)
        if stop_short:
            room = np.maximum(gap, 0.0)
            short = step > room
            step = np.where(short, room, step)
            v[:, k + 1] = np.where(short, 0.0, v[:, k + 1])
        s[:, k + 1] = s[:, k] + step
    a[:, steps] = a[:, steps - 1] if steps else 0.0
    return s, v, a


FREE_SPEED = 15.0  # m/s: IDM's target where the limit is unknown (PDM-Closed's 15 m/s default)


def following_speed_cap(ego: EgoState, path: Polyline, objects: ObjectBoxes, speed_limit: float, steps: int,
                        dt: float, vehicle: VehicleParameters) -> np.ndarray:
    """(steps,) m/s at tau = 1..steps: the speed IDM (PDM-Closed's policy, target the limit) drives along
    ``path`` behind the forecast ``objects`` where a leader holds it below its free-road speed, inf
    elsewhere (the J_dec speed cap of ``objectives``)."""
    target = speed_limit if speed_limit > 0.0 else max(ego.velocity, FREE_SPEED)
    start = np.array([float(path.project(np.array([ego.x, ego.y])).s)])
    rollout = [idm_rollout(ego.velocity, start, np.zeros(1, dtype=int), [path], boxes, pdm_policy(target),
                           np.array([target]), steps, dt, vehicle)[1][0, 1:]
               for boxes in (objects, ObjectBoxes.empty(objects.pose.shape[1]))]
    led, free = rollout
    return np.where(led < free - 1e-6, led, np.inf)


def idm_proposals(ego: EgoState, path: Polyline, objects: ObjectBoxes, *,
                  offsets: tuple[float, ...] = (0.0, -1.0, 1.0),
                  target_speeds: tuple[float, ...] = (3.0, 6.0, 9.0, 12.0, 15.0),
                  steps: int = 80, simulate_steps: int = 40, dt: float = 0.1,
                  vehicle: VehicleParameters = VehicleParameters(),
                  idm_params: IDMParameters | None = None) -> ProposalSet:
    """len(offsets) x len(target_speeds) proposals (offset-major order) over ``steps`` steps.

    IDM parameters are PDM-Closed's (``pdm_policy``) unless ``idm_params`` gives others; the
    target velocity is always the proposal's own. ``simulate_steps`` > 0 also tracks the first
    ``simulate_steps`` steps with LQR + bicycle from the ego state (``ProposalSet.states``).
    """
    paths = [path if off == 0.0 else path.offset(off) for off in offsets]
    path_index = np.repeat(np.arange(len(offsets)), len(target_speeds))
    speeds = np.tile(np.asarray(target_speeds, dtype=np.float64), len(offsets))
    params = idm_params if idm_params is not None else pdm_policy(float(speeds.max()) if len(speeds) else 1.0)
    start = np.array([float(paths[o].project(np.array([ego.x, ego.y])).s) for o in range(len(paths))])
    s, v, a = idm_rollout(ego.velocity, start[path_index], path_index, paths, objects, params, speeds, steps,
                          dt, vehicle)
    poses = np.empty(s.shape + (3,))
    for o, pth in enumerate(paths):
        rows = path_index == o
        poses[rows] = pth.interpolate(s[rows])
    out = ProposalSet(poses, v, a, np.asarray(offsets, dtype=np.float64)[path_index], speeds, dt=dt)
    if simulate_steps > 0:
        out.states = simulate_proposals(state_from_ego(ego), poses[:, :simulate_steps + 1], vehicle)
    return out


#: nuPlan's IDMPlanner settings (target velocity 10 m/s, capped by the lane's speed limit).
NUPLAN_IDM_PLANNER = IDMParameters(target_velocity=10.0, min_gap=1.0, headway=1.5, accel_max=1.0,
                                   decel_max=3.0)


class IDMPlanner:
    """The IDM baseline: one IDM policy along the route centreline, stopping for forecast objects
    in its corridor and for red lights on the route (nuPlan's IDMPlanner behaviour)."""

    name = "idm"

    def __init__(self, horizon: float = 8.0, dt: float = 0.1,
                 params: IDMParameters = NUPLAN_IDM_PLANNER) -> None:
        self.steps = int(round(horizon / dt))
        self.dt = dt
        self.params = params
        self.last_context: PlanningContext | None = None  # the last cycle's set-up

    def reset(self) -> None:
        """Stateless: the centreline is re-planned every call."""
        self.last_context = None

    def plan(self, planner_input: PlannerInput, context: PlanningContext | None = None) -> Trajectory:
        """The IDM trajectory along the route centreline of ``context`` (built from ``planner_input``
        here if not given); ``OffMapError`` off the map."""
        if context is None:
            # IDM scores nothing: the scored horizon is the context's default.
            context = build_planning_context(planner_input, output_horizon=self.steps * self.dt, dt=self.dt)
        context.check(planner_input, self.steps, context.scored_steps, self.dt, self.name)
        self.last_context = context
        context.require_map(self.name)
        ref = context.route_reference
        target = min(self.params.target_velocity, ref.speed_limit)
        props = idm_proposals(context.ego, ref.centerline, context.near_forecast, offsets=(0.0,),
                              target_speeds=(target,), steps=self.steps, simulate_steps=0, dt=self.dt,
                              vehicle=planner_input.vehicle, idm_params=self.params)
        return props.trajectory(0, context.ego.stamp)
