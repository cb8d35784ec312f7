"""nuPlan's two-stage controller: an LQR tracker driving a kinematic bicycle on the rear axle.

Stage 1, the tracker, turns a reference trajectory into commands (acceleration, steering rate) with
two decoupled one-step LQR problems over a 10-step (1 s) look-ahead:

* longitudinal: state velocity, input acceleration held over the horizon, target = the reference
  velocity at the look-ahead (q 10, r 1); below 0.2 m/s with a stopping reference, a P controller
  (gain 0.5) replaces it;
* lateral: state (lateral error, heading error, steering angle), input steering rate, dynamics
  linearised along the velocity the longitudinal command produces and the reference curvature
  (q (1, 10, 0), r 1).

Reference velocity and curvature come from regularised least-squares fits of the reference poses
(jerk penalty 1e-4, curvature-rate penalty 1e-2), so they stay defined at standstill.

Stage 2, the kinematic bicycle, low-pass filters the commands (acceleration time constant 0.2 s,
steering 0.05 s), integrates with forward Euler at dt 0.1 s and clips steering to pi/3.

Everything is batched over B vehicles (the planner's scorer rolls 15..128 proposals at once);
``track_step`` is the one-vehicle convenience the simulator uses. States are (B, 8) arrays laid
out by ``StateIndex``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum
from functools import lru_cache

import numpy as np

from luna_core.blas import single_threaded_blas
from luna_core.types import EgoState, Trajectory, VehicleParameters, wrap_angle


class StateIndex(IntEnum):
    X = 0
    Y = 1
    HEADING = 2
    VELOCITY = 3  # longitudinal, rear axle (m/s)
    ACCELERATION = 4  # longitudinal (m/s^2)
    STEERING_ANGLE = 5  # rad
    STEERING_RATE = 6  # rad/s
    YAW_RATE = 7  # rad/s


STATE_SIZE = len(StateIndex)


@dataclass(frozen=True)
class TrackerParameters:
    """LQR tracker settings; defaults are nuPlan's."""

    q_longitudinal: float = 10.0
    r_longitudinal: float = 1.0
    q_lateral: tuple[float, float, float] = (1.0, 10.0, 0.0)  # lateral error, heading error, steering
    r_lateral: float = 1.0
    dt: float = 0.1  # s
    horizon: int = 10  # steps of look-ahead
    jerk_penalty: float = 1e-4
    curvature_rate_penalty: float = 1e-2
    stopping_gain: float = 0.5
    stopping_velocity: float = 0.2  # m/s


@dataclass(frozen=True)
class BicycleParameters:
    """Kinematic bicycle settings; defaults are nuPlan's."""

    max_steering_angle: float = math.pi / 3
    accel_time_constant: float = 0.2  # s
    steering_time_constant: float = 0.05  # s


# --------------------------------------------------------------------------------------------------
# Conversions
# --------------------------------------------------------------------------------------------------


def state_from_ego(ego: EgoState) -> np.ndarray:
    """(8,) controller state of an ``EgoState``; an unmeasured steering angle (None) counts as 0 (planning
    replaces it with the kinematic estimate first: ``planning.context.sanitised_ego``)."""
    s = np.zeros(STATE_SIZE)
    steering = 0.0 if ego.steering_angle is None else ego.steering_angle
    s[[StateIndex.X, StateIndex.Y, StateIndex.HEADING, StateIndex.VELOCITY, StateIndex.ACCELERATION,
       StateIndex.STEERING_ANGLE, StateIndex.YAW_RATE]] = (
        ego.x, ego.y, ego.heading, ego.velocity, ego.acceleration, steering, ego.yaw_rate)
    return s


def ego_from_state(state: np.ndarray, stamp: float) -> EgoState:
    s = np.asarray(state, dtype=np.float64)
    return EgoState(stamp=stamp, x=float(s[StateIndex.X]), y=float(s[StateIndex.Y]),
                    heading=float(s[StateIndex.HEADING]), velocity=float(s[StateIndex.VELOCITY]),
                    acceleration=float(s[StateIndex.ACCELERATION]),
                    yaw_rate=float(s[StateIndex.YAW_RATE]),
                    steering_angle=float(s[StateIndex.STEERING_ANGLE]))


# --------------------------------------------------------------------------------------------------
# Reference profiles
# --------------------------------------------------------------------------------------------------


@lru_cache(maxsize=32)
def _velocity_fit_operator(num_displacements: int, dt: float, jerk_penalty: float) -> np.ndarray:
    """Matrix K with [v0, a_0 .. a_{M-2}] = K @ d for M along-heading displacements d.

    Displacement k is modelled as dt * (v0 + dt * sum_{i<k} a_i); projecting each xy displacement on
    the pose heading makes the least-squares problem heading independent, so one operator per
    length serves the whole batch.
    """
    m = num_displacements
    c = np.column_stack([np.full(m, dt), np.tril(np.full((m, m - 1), dt * dt), k=-1)]) if m > 1 else \
        np.full((1, 1), dt)
    reg = np.zeros((max(m - 2, 0), m))
    for k in range(m - 2):  # jerk = differences of consecutive accelerations
        reg[k, k + 1], reg[k, k + 2] = -1.0, 1.0
    return np.linalg.solve(c.T @ c + jerk_penalty * reg.T @ reg + 1e-12 * np.eye(m), c.T)


def fit_velocity_curvature(poses: np.ndarray, dt: float, jerk_penalty: float = 1e-4,
                           curvature_rate_penalty: float = 1e-2) -> tuple[np.ndarray, np.ndarray]:
    """Velocity and curvature profiles (B, N-1) of pose sequences (B, N, 3) sampled every ``dt``.

    Regularised least squares as in nuPlan's tracker: velocity with a jerk penalty, then curvature
    (given that velocity) with a curvature-rate penalty and a tiny initial-curvature penalty that
    keeps the problem well posed at standstill.
    """
    poses = np.asarray(poses, dtype=np.float64)
    if poses.ndim != 3 or poses.shape[1] < 2 or poses.shape[2] != 3:
        raise ValueError(f"poses must be (B, N>=2, 3), got {poses.shape}")
    b, n, _ = poses.shape
    m = n - 1
    disp = np.diff(poses[..., :2], axis=1)
    h = poses[:, :-1, 2]
    along = disp[..., 0] * np.cos(h) + disp[..., 1] * np.sin(h)  # (B, M)
    x = along @ _velocity_fit_operator(m, dt, jerk_penalty).T  # (B, M)
    velocity = x[:, :1] + np.concatenate([np.zeros((b, 1)), np.cumsum(x[:, 1:] * dt, axis=1)], axis=1)

    dh = wrap_angle(np.diff(poses[..., 2], axis=1))
    if m == 1:
        curvature = dh / np.maximum(velocity * dt, 1e-3) * (np.abs(velocity) > 1e-3)
        return velocity, curvature
    # dh_k = v_k dt (kappa_0 + dt sum_{i<k} kr_i): a lower-triangular model per batch item.
    a = np.tril(np.ones((m, m)))[None].repeat(b, axis=0)
    a[:, :, 0] = velocity * dt
    a[:, 1:, 1:] *= (velocity[:, 1:] * dt * dt)[:, :, None]
    q = curvature_rate_penalty * np.eye(m)
    q[0, 0] = 1e-10
    at = a.transpose(0, 2, 1)
    sol = np.linalg.solve(at @ a + q, (at @ dh[..., None]))[..., 0]
    curvature = sol[:, :1] + np.concatenate([np.zeros((b, 1)), np.cumsum(sol[:, 1:] * dt, axis=1)], axis=1)
    return velocity, curvature


# --------------------------------------------------------------------------------------------------
# Tracker and bicycle
# --------------------------------------------------------------------------------------------------


@lru_cache(maxsize=8)
def _horizon_steps(horizon: int) -> np.ndarray:
    k = np.arange(horizon, dtype=np.float64)
    k.setflags(write=False)  # cached: shared by every call
    return k


@lru_cache(maxsize=8)
def _dt_sums(horizon: int, dt: float) -> np.ndarray:
    """(H + 1,) 0, dt, dt + dt, ...: dt added k times in order (not k * dt, which rounds differently)."""
    sums = _running_sum(np.full((horizon, 1), dt))[:, 0]
    sums.setflags(write=False)  # cached: shared by every call
    return sums


def _running_sum(terms: np.ndarray) -> np.ndarray:
    """(H + 1, ...) sums of ``terms`` (H, ...) over the first axis before each step and after the
    last, added from 0 in order (``np.cumsum`` accumulates sequentially, unlike ``np.sum``), as a
    loop ``s = s + terms[k]`` computes them."""
    return np.cumsum(np.concatenate([np.zeros((1,) + terms.shape[1:]), terms]), axis=0)


def lqr_commands(states: np.ndarray, reference_pose: np.ndarray, reference_velocity: np.ndarray,
                 curvature: np.ndarray, wheelbase: float,
                 params: TrackerParameters = TrackerParameters()) -> tuple[np.ndarray, np.ndarray]:
    """Acceleration and steering-rate commands (B,) for states (B, 8).

    ``reference_pose`` (B, 3): the reference at the current time; ``reference_velocity`` (B,): at
    the look-ahead; ``curvature`` (B, H): the reference curvature over the look-ahead steps.
    """
    dt, horizon = params.dt, params.horizon
    v0 = states[:, StateIndex.VELOCITY]
    dx = states[:, StateIndex.X] - reference_pose[:, 0]
    dy = states[:, StateIndex.Y] - reference_pose[:, 1]
    ref_h = reference_pose[:, 2]
    lateral_error = -dx * np.sin(ref_h) + dy * np.cos(ref_h)
    heading_error = wrap_angle(states[:, StateIndex.HEADING] - ref_h)
    steering = states[:, StateIndex.STEERING_ANGLE]

    stop = (reference_velocity <= params.stopping_velocity) & (v0 <= params.stopping_velocity)
    # Longitudinal: v_N = v_0 + (N dt) a with the acceleration held over the horizon.
    b_lon = horizon * dt
    accel = -(b_lon * params.q_longitudinal * (v0 - reference_velocity)) / (
        b_lon * params.q_longitudinal * b_lon + params.r_longitudinal)
    accel = np.where(stop, -params.stopping_gain * (v0 - reference_velocity), accel)

    # Lateral: compose the H per-step affine maps x_{k+1} = M_k x_k + B u + g_k, where M_k is unit
    # upper-triangular with (0,1) = v_k dt and (1,2) = v_k dt / L, so the product stays in closed
    # form (entries a01, a02, a12). Each entry is a running sum over k, taken over (H, B) arrays
    # from 0 and in order, so it equals the step-by-step recursion to the last bit (a loop over k
    # cost 10x more NumPy calls).
    v_k = v0[None] + accel[None] * dt * _horizon_steps(horizon)[:, None]  # (H, B)
    m01 = v_k * dt
    m12 = v_k * dt / wheelbase
    b2_k = _dt_sums(horizon, dt)  # b2 before each step: dt added k times, (H + 1,)
    # Entries before each step k and after the last, (H + 1, B) each; the recursion's g1 - x adds -x
    # exactly. a01, a12, b1, g1 first, then the entries that grow with them (a02, b0, g0).
    a01_k, a12_k, b1_k, g1_k = _running_sum(np.stack(
        [m01, m12, m12 * b2_k[:-1, None], -(v_k * curvature[:, :horizon].T * dt)], axis=1)).transpose(1, 0, 2)
    a02, b0, g0 = _running_sum(m01[:, None] * np.stack([a12_k[:-1], b1_k[:-1], g1_k[:-1]], axis=1))[-1]
    a01, a12, b1, g1 = a01_k[-1], a12_k[-1], b1_k[-1], g1_k[-1]
    b2 = np.full_like(v0, b2_k[-1])
    e0 = lateral_error + a01 * heading_error + a02 * steering + g0
    e1 = wrap_angle(heading_error + a12 * steering + g1)
    e2 = wrap_angle(steering)
    q0, q1, q2 = params.q_lateral
    steering_rate = -(q0 * b0 * e0 + q1 * b1 * e1 + q2 * b2 * e2) / (
        q0 * b0 * b0 + q1 * b1 * b1 + q2 * b2 * b2 + params.r_lateral)
    steering_rate = np.where(stop, 0.0, steering_rate)
    return accel, steering_rate


def propagate(states: np.ndarray, accel_command: np.ndarray, steering_rate_command: np.ndarray,
              wheelbase: float, dt: float = 0.1,
              params: BicycleParameters = BicycleParameters()) -> np.ndarray:
    """One forward-Euler step of the kinematic bicycle (rear axle) for states (B, 8)."""
    out = states.copy()
    v = states[:, StateIndex.VELOCITY]
    h = states[:, StateIndex.HEADING]
    accel = states[:, StateIndex.ACCELERATION]
    steer = states[:, StateIndex.STEERING_ANGLE]
    # First-order lag on both commands (actuator delay).
    new_accel = accel + dt / (dt + params.accel_time_constant) * (accel_command - accel)
    ideal_steer = steer + dt * steering_rate_command
    new_steer = steer + dt / (dt + params.steering_time_constant) * (ideal_steer - steer)
    steer_rate = (new_steer - steer) / dt

    out[:, StateIndex.X] = states[:, StateIndex.X] + v * np.cos(h) * dt
    out[:, StateIndex.Y] = states[:, StateIndex.Y] + v * np.sin(h) * dt
    out[:, StateIndex.HEADING] = wrap_angle(h + v * np.tan(steer) / wheelbase * dt)
    out[:, StateIndex.VELOCITY] = v + new_accel * dt
    out[:, StateIndex.ACCELERATION] = new_accel
    out[:, StateIndex.STEERING_ANGLE] = np.clip(steer + steer_rate * dt, -params.max_steering_angle,
                                                params.max_steering_angle)
    out[:, StateIndex.STEERING_RATE] = steer_rate
    out[:, StateIndex.YAW_RATE] = (out[:, StateIndex.VELOCITY] * np.tan(out[:, StateIndex.STEERING_ANGLE])
                                   / wheelbase)
    return out


def simulate_proposals(initial_state: np.ndarray, proposals: np.ndarray,
                       vehicle: VehicleParameters = VehicleParameters(),
                       tracker: TrackerParameters = TrackerParameters(),
                       bicycle: BicycleParameters = BicycleParameters()) -> np.ndarray:
    """Track B pose sequences (B, T+1, 3), sampled every ``tracker.dt`` from now, from one initial
    state (8,) or per-proposal states (B, 8). Returns the simulated states (B, T+1, 8), [:, 0] = start.

    As in PDM-Closed, velocity and curvature are fitted once per proposal; step i tracks the pose
    at index i with the velocity at index min(i + H, T - 1) as the longitudinal target.
    """
    proposals = np.asarray(proposals, dtype=np.float64)
    b, n, _ = proposals.shape
    states = np.broadcast_to(np.asarray(initial_state, dtype=np.float64), (b, STATE_SIZE)).copy()
    with single_threaded_blas():  # small batched products and solves (luna_core.blas)
        velocity, curvature = fit_velocity_curvature(proposals, tracker.dt, tracker.jerk_penalty,
                                                     tracker.curvature_rate_penalty)
    m = velocity.shape[1]
    # Curvature look-ahead windows, padded with the last value past the end.
    pad = np.concatenate([curvature, np.repeat(curvature[:, -1:], tracker.horizon, axis=1)], axis=1)
    out = np.empty((b, n, STATE_SIZE))
    out[:, 0] = states
    for i in range(n - 1):
        ref_idx = min(i + tracker.horizon, m - 1)
        window = pad[:, i:i + tracker.horizon].copy()
        window[:, max(ref_idx - i, 0):] = curvature[:, ref_idx, None]
        accel, rate = lqr_commands(states, proposals[:, i], velocity[:, ref_idx], window,
                                   vehicle.wheelbase, tracker)
        states = propagate(states, accel, rate, vehicle.wheelbase, tracker.dt, bicycle)
        out[:, i + 1] = states
    return out


def sample_trajectory(trajectory: Trajectory, times: np.ndarray) -> np.ndarray:
    """Poses (len(times), 3) of a trajectory at times from its stamp; past its end, the last pose
    runs on at the last velocity (so a short plan does not read as a request to stop)."""
    t = np.asarray(trajectory.t, dtype=np.float64)
    h = np.unwrap(trajectory.heading)
    tc = np.clip(times, t[0], t[-1])
    poses = np.column_stack([np.interp(tc, t, trajectory.x), np.interp(tc, t, trajectory.y),
                             np.interp(tc, t, h)])
    extra = np.maximum(times - t[-1], 0.0) * float(trajectory.velocity[-1])
    poses[:, 0] += extra * math.cos(h[-1])
    poses[:, 1] += extra * math.sin(h[-1])
    poses[:, 2] = wrap_angle(poses[:, 2])
    return poses


def track_step(ego: EgoState, trajectory: Trajectory, vehicle: VehicleParameters = VehicleParameters(),
               tracker: TrackerParameters = TrackerParameters(),
               bicycle: BicycleParameters = BicycleParameters()) -> EgoState:
    """Advance one vehicle by ``tracker.dt`` tracking ``trajectory`` as nuPlan's devkit tracker does
    (``LQRTracker.track_trajectory``): the whole reference is re-sampled every ``tracker.dt`` from its
    start to its end, velocity and curvature are fitted over all of it, and the fitted profiles are
    interpolated at the current time (curvature over the look-ahead steps, velocity at the end of
    the look-ahead, both held beyond the trajectory's end). Fitting only the look-ahead window
    instead smooths the velocity profile differently and lagged the devkit by up to 0.3 m/s when
    braking to a stop (benchmarks/nuplan_crosscheck.py)."""
    now = ego.stamp - trajectory.stamp
    t = np.asarray(trajectory.t, dtype=np.float64)
    grid = t[0] + tracker.dt * np.arange(int(np.floor((t[-1] - t[0]) / tracker.dt + 1e-9)) + 1)
    if len(grid) < 2:  # a reference shorter than one step: track its extrapolation over one step
        grid = t[0] + tracker.dt * np.arange(2)
    poses = sample_trajectory(trajectory, grid)[None]
    velocity, curvature = fit_velocity_curvature(poses, tracker.dt, tracker.jerk_penalty,
                                                 tracker.curvature_rate_penalty)
    knots = grid[:-1]  # the fitted profiles hold between consecutive poses
    reference_velocity = np.interp(now + tracker.horizon * tracker.dt, knots, velocity[0])
    window = np.interp(now + tracker.dt * np.arange(tracker.horizon), knots, curvature[0])
    state = state_from_ego(ego)[None]
    pose_now = sample_trajectory(trajectory, np.array([now]))
    accel, rate = lqr_commands(state, pose_now, np.array([reference_velocity]), window[None], vehicle.wheelbase,
                               tracker)
    nxt = propagate(state, accel, rate, vehicle.wheelbase, tracker.dt, bicycle)
    return ego_from_state(nxt[0], ego.stamp + tracker.dt)
