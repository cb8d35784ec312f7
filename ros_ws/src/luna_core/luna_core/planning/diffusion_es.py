"""Diffusion-ES (Yang et al.; LUNA-AD Eq. 21, CALMM-Drive Eq. 7): gradient-free optimisation of
trajectories under a black-box objective with a trajectory diffusion prior.

One search runs G objective *groups* at once (the candidate actions of C_t, each with its own J_a;
or a single J_gen group without decisions). Per group the population has ``population`` members:

1. warm starts (at most ``warm_starts`` per group, e.g. IDM proposals along the action's reference
   lane at speeds inside its interval) are scored first, so a usable answer exists at once;
2. prior samples: ``population`` trajectories denoised from noise, conditioned on the ego history
   only. They do not depend on the objective, so one batch is shared by every group (each group
   takes the first ``population - W_g`` of them next to its W_g warm starts): G times fewer network
   evaluations than sampling per group, the same distribution;
3. ``iterations`` rounds, all groups batched: resample ``population`` members per group with
   probability proportional to exp(temperature x J) (Eq. 7b-c), renoise them to the noise level
   from which ``renoise_steps[i]`` DDIM steps remain (7d) and denoise those steps (7e), then score.

The best member ever seen per group is the result (Eq. 21b). Scoring is split in two so that the
expensive part (tracking every trajectory with LQR + bicycle and the PDM-style J_gen) runs once per
batch for all groups, and only the cheap per-group part (J_dec and Eq. 20) runs per group.

Anytime: stage costs per member are measured as the search runs (and carried over from earlier
calls, ``StageTimer``); a stage that would end past the deadline runs with as many members as fit
(skipped below ``MIN_MEMBERS``), and denoising stops between DDIM steps at the deadline; whatever
is best by then is returned, with the reasons.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np
import torch
from scipy.interpolate import CubicSpline

from luna_core.planning.diffusion import TrajectoryDiffusionPrior, verlet_decode, verlet_encode


MIN_MEMBERS = 8  # a stage that cannot afford this many members per group is skipped
PLAN_MARGIN = 0.8  # stages are sized to this share of the time left: costs vary from call to call


@dataclass(frozen=True)
class DiffusionESConfig:
    population: int = 128  # per group (CALMM-Drive uses 128)
    warm_starts: int = 16  # at most this many members per group come from warm starts (15 IDM + the last plan)
    iterations: int = 2  # renoise-denoise rounds (the efficient Diffusion-ES)
    renoise_steps: tuple[int, ...] = (5, 1)  # DDIM steps left after renoising, per round (cycled)
    temperature: float = 10.0  # exp(temperature x score) elite resampling (Eq. 7b)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.population < 1 or self.warm_starts < 0 or self.iterations < 0:
            raise ValueError(f"DiffusionESConfig: population >= 1, warm_starts >= 0, iterations >= 0 "
                             f"(got {self.population}, {self.warm_starts}, {self.iterations})")
        if self.iterations and not self.renoise_steps:
            raise ValueError("DiffusionESConfig.renoise_steps is empty but iterations > 0")
        if self.temperature < 0:
            raise ValueError(f"DiffusionESConfig.temperature must be >= 0, got {self.temperature}")


@dataclass
class Evaluation:
    """The expensive, objective-independent part of scoring a batch of M trajectories."""

    states: np.ndarray  # (M, T+1, 8) tracked states
    j_gen: np.ndarray  # (M,)


class PopulationObjective(Protocol):
    """What Diffusion-ES needs from the planner: shared evaluation, then per-group scores."""

    def evaluate(self, poses: np.ndarray) -> Evaluation:
        """Track and score ego-frame waypoints (M, N, 3) (the shared, expensive part)."""

    def group_terms(self, group: int, evaluation: Evaluation, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Per-row terms of ``group``'s objective for ``evaluation`` rows; key "score" is J."""


@dataclass
class GroupBest:
    """The best member found for one group: ego-frame waypoints, objective terms and tracked states."""

    poses: np.ndarray  # (N, 3)
    score: float
    terms: dict[str, float]
    states: np.ndarray  # (T+1, 8)
    origin: str  # "warm_start", "prior" or "iteration <k>"


@dataclass
class ESResult:
    best: list[GroupBest | None]
    stages_done: list[str] = field(default_factory=list)
    budget_cut: str = ""  # non-empty: which stage the deadline cut, and why
    network_evaluations: int = 0  # denoiser forward passes (any batch size)
    members_scored: int = 0
    timings: dict[str, float] = field(default_factory=dict)


def densify(poses: np.ndarray, seed: np.ndarray, waypoint_dt: float, dt: float, steps: int) -> np.ndarray:
    """Cubic-spline ego-frame waypoints (B, N, 3) at ``waypoint_dt`` to (B, steps+1, 3) poses every
    ``dt`` from now. Knots: the seed's previous pose at -waypoint_dt, the current pose at 0 and the
    waypoints, so the start of the curve agrees with the recent motion."""
    poses = np.asarray(poses, dtype=np.float64)
    b, n, _ = poses.shape
    knots = np.concatenate([np.broadcast_to(seed, (b, 2, 3)), poses], axis=1)
    times = waypoint_dt * np.arange(-1, n + 1)
    return CubicSpline(times, knots, axis=1)(dt * np.arange(steps + 1))


class StageTimer:
    """Seconds per member (per denoising step for "denoise") of each stage kind, as a moving
    average. Keep one per planner so that even the first stage of a call is predicted from the
    previous calls."""

    def __init__(self, smoothing: float = 0.5) -> None:
        self.rates: dict[str, float] = {}
        self.smoothing = smoothing

    def estimate(self, kind: str, members: int) -> float:
        return self.rates.get(kind, 0.0) * members

    def affordable(self, kind: str, seconds: float) -> int | None:
        """How many members fit in ``seconds`` (None if the rate is not known yet or there is no limit)."""
        rate = self.rates.get(kind)
        return None if not rate or not np.isfinite(seconds) else int(max(seconds, 0.0) / rate)

    def record(self, kind: str, members: int, seconds: float) -> None:
        rate = seconds / max(members, 1)
        old = self.rates.get(kind)
        self.rates[kind] = rate if old is None else (1 - self.smoothing) * old + self.smoothing * rate


def diffusion_es(prior: TrajectoryDiffusionPrior, history: np.ndarray, seed: np.ndarray,
                 warm_starts: list[np.ndarray], objective: PopulationObjective,
                 config: DiffusionESConfig = DiffusionESConfig(), deadline: float | None = None,
                 generator: torch.Generator | None = None,
                 clock: Callable[[], float] = time.monotonic, timer: StageTimer | None = None) -> ESResult:
    """Run Diffusion-ES for ``len(warm_starts)`` groups.

    ``history`` (H, 7) and ``seed`` (2, 3): the prior's conditioning and Verlet seed
    (``diffusion.history_from_states``); ``warm_starts[g]``: (W_g, N, 3) ego-frame waypoints (W_g may
    be 0); ``deadline``: absolute ``clock()`` time after which the search returns what it has;
    ``timer``: stage-cost estimates carried over from earlier calls (the warm-start stage scores only
    as many warm starts, spread over each group's list, as the estimate says fit before the deadline).
    """
    groups = len(warm_starts)
    pop = config.population
    n = prior.config.num_waypoints
    gen = generator if generator is not None else torch.Generator().manual_seed(config.seed)
    rng = np.random.default_rng(int(torch.randint(0, 2 ** 31 - 1, (1,), generator=gen)))
    result = ESResult(best=[None] * groups)
    timer = timer if timer is not None else StageTimer()
    hist_t = prior.history_tensor(history)

    def time_left() -> float:
        return np.inf if deadline is None else deadline - clock()

    def stop_now() -> bool:
        return time_left() <= 0.0

    def score(poses: np.ndarray, members: list[np.ndarray], origin: str) -> list[np.ndarray]:
        """Evaluate unique poses once; return each group's J over its member rows; track bests."""
        t0 = clock()
        ev = objective.evaluate(poses)
        timer.record("evaluate", len(poses), clock() - t0)
        result.members_scored += len(poses)
        out = []
        for g, rows in enumerate(members):
            if len(rows) == 0:
                out.append(np.zeros(0))
                continue
            terms = objective.group_terms(g, ev, rows)
            j = np.nan_to_num(np.asarray(terms["score"], dtype=np.float64), nan=-1.0)
            k = int(np.argmax(j))
            cur = result.best[g]
            if cur is None or j[k] > cur.score:
                result.best[g] = GroupBest(poses[rows[k]].copy(), float(j[k]),
                                           {key: float(v[k]) for key, v in terms.items()},
                                           ev.states[rows[k]].copy(), origin)
            out.append(j)
        return out

    def denoise(noisy: torch.Tensor, steps: int, kind: str) -> torch.Tensor | None:
        members = noisy.shape[0]
        if timer.estimate(kind, members * steps) > time_left():
            _cut(result, f"skipped {kind} ({members} members x {steps} steps): not enough time left")
            return None
        t0 = clock()
        x = prior.denoise(noisy, hist_t, steps, should_stop=stop_now)
        result.network_evaluations += steps if x is not None else 0
        if x is None:
            _cut(result, f"deadline reached while denoising ({kind})")
            return None
        timer.record(kind, members * steps, clock() - t0)
        return x

    def members_that_fit(steps: int, groups_: int) -> int:
        """Members per group whose denoising (``steps``) and scoring fit in the time left (the
        full population while the stage costs are unknown)."""
        r_d, r_e = timer.rates.get("denoise"), timer.rates.get("evaluate")
        left = time_left()
        if not r_d or not r_e or not np.isfinite(left):
            return pop
        return min(pop, int(PLAN_MARGIN * left / (groups_ * (steps * r_d + r_e))))

    t_start = clock()
    # 1. Warm starts.
    warm = [np.asarray(w, dtype=np.float64).reshape(-1, n, 3)[: config.warm_starts] for w in warm_starts]
    fit = timer.affordable("evaluate", PLAN_MARGIN * time_left())
    total = sum(len(w) for w in warm)
    if fit is not None and fit < total:
        per_group = max(fit // max(groups, 1), 1)  # at least one per group: something to compare
        warm = [w[np.unique(np.linspace(0, len(w) - 1, min(per_group, len(w))).round().astype(int))]
                if len(w) else w for w in warm]
        _cut(result, f"scored {sum(len(w) for w in warm)} of {total} warm starts: not enough time")
    sizes = [len(w) for w in warm]
    warm_scores = [np.zeros(0) for _ in range(groups)]
    if sum(sizes):
        offsets = np.cumsum([0] + sizes)
        warm_scores = score(np.concatenate(warm), [np.arange(offsets[g], offsets[g + 1]) for g in range(groups)],
                            "warm_start")
        result.stages_done.append("warm_starts")
    result.timings["warm_starts"] = clock() - t_start

    # 2. Prior samples shared by all groups.
    t0 = clock()
    if stop_now():
        _cut(result, "deadline reached after scoring the warm starts")
        return result
    # Group g takes population - W_g prior samples: sampling more than the largest take (the group
    # with the fewest warm starts) would denoise and score members no population ever holds.
    wanted = max(pop - min(len(w) for w in warm), MIN_MEMBERS) if warm else pop
    fit = members_that_fit(prior.config.inference_steps, 1)
    n_prior = min(fit, wanted)
    if n_prior < MIN_MEMBERS:
        _cut(result, f"skipped the prior samples: time for {max(n_prior, 0)} of {wanted} only")
        return result
    if n_prior < wanted:
        _cut(result, f"{n_prior} of {wanted} prior samples: not enough time for all")
    # The noise is drawn for all that fit and the surplus dropped, so the random stream (and the
    # members kept) are those of a search that sampled them all.
    noise = prior.noise((fit, n, 3), gen)[:n_prior]
    clean = denoise(noise, prior.config.inference_steps, "denoise")
    if clean is None:
        return result
    prior_poses = _decode(prior, clean, seed)
    populations: list[np.ndarray] = []
    members = [np.arange(min(n_prior, pop - len(w))) for w in warm]
    if timer.estimate("evaluate", n_prior) > time_left():
        _cut(result, "skipped scoring the prior samples: not enough time left")
        return result
    prior_scores = score(prior_poses, members, "prior")
    scores: list[np.ndarray] = []
    for g in range(groups):
        populations.append(np.concatenate([prior_poses[members[g]], warm[g]]))
        scores.append(np.concatenate([prior_scores[g], warm_scores[g]]))
    result.stages_done.append("prior")
    result.timings["prior"] = clock() - t0

    # 3. Elite resampling, renoise, denoise.
    for it in range(config.iterations):
        t0 = clock()
        steps = config.renoise_steps[it % len(config.renoise_steps)]
        size = members_that_fit(steps, groups)
        if size < MIN_MEMBERS:
            _cut(result, f"skipped iteration {it + 1}: time for {max(size, 0)} members per action only")
            break
        if size < pop:
            _cut(result, f"iteration {it + 1} with {size} of {pop} members per action: not enough time for all")
        picks = []
        for g in range(groups):
            s = scores[g]
            logits = config.temperature * (s - s.max())
            p = np.exp(logits)
            p /= p.sum()
            picks.append(populations[g][rng.choice(len(s), size=size, p=p)])
        elites = np.concatenate(picks)
        seeds = np.broadcast_to(seed, (len(elites), 2, 3))
        x0 = prior.normalise(verlet_encode(elites, seeds))
        noisy = prior.renoise(x0, steps, gen)
        clean = denoise(noisy, steps, "denoise")
        if clean is None:
            break
        new = _decode(prior, clean, seed)
        if timer.estimate("evaluate", len(new)) > time_left():
            _cut(result, f"skipped scoring iteration {it + 1}: not enough time left")
            break
        rows = [np.arange(g * size, (g + 1) * size) for g in range(groups)]
        new_scores = score(new, rows, f"iteration {it + 1}")
        populations = [new[r] for r in rows]
        scores = new_scores
        result.stages_done.append(f"iteration {it + 1}")
        result.timings[f"iteration {it + 1}"] = clock() - t0
    return result


def _cut(result: ESResult, message: str) -> None:
    result.budget_cut = f"{result.budget_cut}; {message}" if result.budget_cut else message


def _decode(prior: TrajectoryDiffusionPrior, actions: torch.Tensor, seed: np.ndarray) -> np.ndarray:
    raw = prior.denormalise(actions)
    return verlet_decode(raw, np.broadcast_to(seed, (len(raw), 2, 3)))

