"""The full LUNA stack as evaluable planners: heuristic decisions every T_d + the decision-guided planner.

``luna-bridge eval --planner luna`` drives the stack in process: every T_d of simulation time the
scene descriptor is built from the planner input (as the ``scene_descriptor`` node builds it) and the
heuristic system (student + K retrieved memory items, ``luna_core.heuristic``) issues a decision; the
decision-guided Diffusion-ES planner plans with it (Eq. 19-22). Variants, each a named planner of the
eval registry so they land in one Table III layout (ablations in the spirit of LUNA-AD Table V):

=====================  ==========================================================================
``luna``               the full stack: K = 3 retrieved items from the bank as given
``luna-k0``            no retrieval (K = 0)
``luna-onehot``        one-hot decisions: the student's argmax with probability 1 (C_t = {a*})
``luna-no-reflection`` the same bank, its reflection items never retrieved
``luna-oracle``        the simulation-grounded teacher deciding from the closed-loop state (an upper
                       bound: it sees the logged future; ``luna_bridge.oracle``)
``luna-onehot-oracle`` its argmax with probability 1
``luna-oracle-cv``     the oracle without the logged future: agents at constant velocity from now, lights
                       held, no expert progress (what the logged future is worth)
``diffusion-es``       the same search without decisions (J_gen only; no student)
=====================  ==========================================================================

``decision_source`` is the one factory of a variant's decision source, from the stack's settings: the
eval registry attaches it to the planner here, and ``make_decision_source`` (the same settings as
keywords) is what the nuPlan devkit's hydra config (``luna_bridge.nuplan``,
``config/planner/luna_stack_planner.yaml``) hands to ``LunaNuPlanPlanner``.

The planner searches under a wall-clock budget on the vehicle; for reproducible batch evaluation
``StackSettings.time_budget = 0`` (the default here) runs it in deterministic mode (fixed stage sizes:
``population`` members per candidate action, ``iterations`` renoise-denoise rounds), so results do
not depend on the machine's load. Settings reach worker processes through ``use_settings``
(``luna_bridge.evaluate`` calls it with the job's settings before building the planner).
"""

from __future__ import annotations

import argparse
import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from luna_core.geometry import AUTOCASTS
from luna_core.lessons import DEFAULT_LESSON_WEIGHT
from luna_core.types import ACTION_CODES, DecisionDistribution, MemoryItem, PlannerInput, Trajectory

from luna_bridge.scenario import SIM_DT, Scenario

if TYPE_CHECKING:  # imported when a stack is built: it pulls in the reflection machinery
    from luna_bridge.reflection_round import SceneDecisionSource
    from luna_core.stack import HeuristicStackConfig

STUDENT_PLANNERS = ("luna", "luna-k0", "luna-onehot", "luna-no-reflection")  # the student decides
# the teacher decides from the closed-loop state (luna-oracle-cv: on the present only)
ORACLE_PLANNERS = ("luna-oracle", "luna-onehot-oracle", "luna-oracle-cv")
STACK_PLANNERS = (*STUDENT_PLANNERS, *ORACLE_PLANNERS)  # everything that decides every T_d
SEARCH_PLANNERS = (*STACK_PLANNERS, "diffusion-es")  # everything built on the decision-guided planner


class StackConfigError(ValueError):
    """Invalid stack settings, or a variant that cannot run with the given artifacts."""


@dataclass(frozen=True)
class StackSettings:
    student: str = ""  # student folder; "" = the bundled default (models/student)
    memory_bank: str = ""  # memory bank folder; "" = the bundled default (models/memory_bank)
    k: int = 3  # retrieved items per decision (the K = 0 variant overrides it)
    min_similarity: float = -1.0  # retrieved items less similar (cosine) are not shown; -1 = all K
    gamma_p: float = 0.1
    lesson_weight: float = DEFAULT_LESSON_WEIGHT  # w of retrieved reflection lessons (luna_core.lessons); 0 = the paper's
    decision_every: int = 20  # simulation steps (0.1 s) between decisions: T_d = 2.0 s (CALMM-Drive C_d)
    population: int = 128  # Diffusion-ES members per candidate action
    iterations: int = 2  # renoise-denoise rounds
    # Seed of the Diffusion-ES search (DiffusionESConfig.seed): another seed is another deterministic run of
    # the same planner, so a result-altering change can be judged over several seeds, not one draw.
    search_seed: int = 0
    time_budget: float = 0.0  # s of wall time per planning call; 0 = deterministic mode (no budget)
    device: str = "cpu"
    # The matrix products of the denoiser and the student under torch autocast (faster on AVX512-BF16 /
    # AMX CPUs; changes results): "none" or "bfloat16".
    autocast: str = "none"
    # Eq. 22 safety first (DecisionGuidedConfig.safety_first): a* among the candidates that keep the TTC bound,
    # when any does; False = the paper's Eq. 22 over every candidate.
    safety_first: bool = True
    # A lane change the map does not allow gives its probability to keeping the lane at its speed
    # (DecisionGuidedConfig.blocked_lateral_to_keep); False drops it.
    blocked_lateral_to_keep: bool = True

    def __post_init__(self) -> None:
        if self.k < 0 or self.decision_every < 1 or self.population < 4 or self.iterations < 0 \
                or self.search_seed < 0 or self.time_budget < 0 or not 0.0 <= self.gamma_p <= 1.0 \
                or not 0.0 <= self.lesson_weight <= 1.0 or not -1.0 <= self.min_similarity <= 1.0 \
                or self.autocast not in AUTOCASTS:
            raise StackConfigError(f"invalid stack settings {self}: need k >= 0, decision_every >= 1, "
                                   "population >= 4, iterations >= 0, search_seed >= 0, time_budget >= 0, "
                                   "0 <= gamma_p <= 1, 0 <= lesson_weight <= 1, -1 <= min_similarity <= 1, "
                                   f"autocast one of {', '.join(AUTOCASTS)}")

    @property
    def decision_period(self) -> float:
        return self.decision_every * SIM_DT

    def for_planner(self, name: str) -> "StackSettings":
        """The settings that matter to planner ``name``, the others at their defaults (so that, e.g.,
        ``diffusion-es`` runs are the same whatever the student, and the oracles' whatever the bank)."""
        d = StackSettings()
        if name in STUDENT_PLANNERS:
            return self
        if name in ORACLE_PLANNERS:
            return replace(self, student=d.student, memory_bank=d.memory_bank, k=d.k, min_similarity=d.min_similarity,
                           lesson_weight=d.lesson_weight)
        return replace(self, student=d.student, memory_bank=d.memory_bank, k=d.k, min_similarity=d.min_similarity,
                       gamma_p=d.gamma_p, lesson_weight=d.lesson_weight, decision_every=d.decision_every,
                       safety_first=d.safety_first, blocked_lateral_to_keep=d.blocked_lateral_to_keep)

    def describe(self, decisions: bool = True) -> str:
        """One line for result tables (``decisions``: also how the stack decides)."""
        seed = f", search seed {self.search_seed}" if self.search_seed else ""
        search = (f"deterministic search (population {self.population} per action, {self.iterations} "
                  f"renoise-denoise round(s){seed}, no wall-clock budget)" if self.time_budget == 0 else
                  f"anytime search with a {self.time_budget * 1e3:.0f} ms wall-clock budget (population "
                  f"{self.population}, {self.iterations} round(s))")
        if not decisions:
            return search
        floor = f" at cosine >= {self.min_similarity:g}" if self.min_similarity > -1.0 else ""
        eq22 = ("safety-first Eq. 22" if self.safety_first else "the paper's Eq. 22") + \
            ("" if self.blocked_lateral_to_keep else ", lane changes the map does not allow dropped")
        return (f"decisions every T_d = {self.decision_period:.1f} s of sim time (student "
                f"{self.student or 'models/student'}, bank {self.memory_bank or 'models/memory_bank'}, "
                f"K = {self.k}{floor}, lesson weight {self.lesson_weight:g}, {eq22}); {search}")


def add_stack_arguments(group: argparse._ArgumentGroup, memory_bank_help: str = "memory bank folder") -> None:
    """The stack's settings as options of a command (``luna-bridge eval`` and ``reflect``), with
    StackSettings' defaults; ``stack_settings_from_args`` reads them back."""
    d = StackSettings()
    group.add_argument("--student", default=d.student, help="student folder (default: the bundled models/student)")
    group.add_argument("--memory-bank", default=d.memory_bank,
                       help=f"{memory_bank_help} (default: the bundled models/memory_bank)")
    group.add_argument("--k", type=int, default=d.k, help=f"retrieved memory items per decision (default {d.k})")
    group.add_argument("--min-similarity", type=float, default=d.min_similarity,
                       help="retrieved items whose cosine similarity to the scene is below this are not shown, so a "
                            "scene far from every item decides with fewer examples or none (default "
                            f"{d.min_similarity:g}; -1 = all K, the paper's)")
    group.add_argument("--lesson-weight", type=float, default=d.lesson_weight,
                       help="weight w of the retrieved reflection items' recommended decisions in each decision, "
                            f"pi' = (1 - w) pi_hat + w q (luna_core.lessons; default {d.lesson_weight:g}); with w > 0 a "
                            "reflection item is used only where the scene has its cause; 0 = the paper's (every "
                            "retrieved reflection item is only an example in the prompt)")
    group.add_argument("--decision-every", type=int, default=d.decision_every,
                       help=f"simulation steps between decisions (default {d.decision_every}: "
                            f"T_d = {d.decision_period:.1f} s)")
    group.add_argument("--population", type=int, default=d.population,
                       help=f"Diffusion-ES members per action (default {d.population})")
    group.add_argument("--iterations", type=int, default=d.iterations,
                       help=f"renoise-denoise rounds (default {d.iterations})")
    group.add_argument("--search-seed", type=int, default=d.search_seed,
                       help=f"seed of the Diffusion-ES search (default {d.search_seed}); another seed is another "
                            "deterministic run, for results over several seeds")
    group.add_argument("--time-budget", type=float, default=d.time_budget,
                       help="wall-clock budget per planning call in s; 0 (default) = deterministic mode")
    group.add_argument("--paper-eq22", action="store_true",
                       help="arbitrate the candidate actions by the paper's Eq. 22 over all of them (default: safety "
                            "first, a* among those whose best trajectory keeps the time-to-collision bound, when any "
                            "does; docs/nodes/planner.md)")
    group.add_argument("--drop-blocked-lateral", action="store_true",
                       help="drop a candidate lane change the map does not allow here (default: its probability goes "
                            "to keeping the lane at its speed, CL -> CK; docs/nodes/planner.md)")
    group.add_argument("--autocast", choices=AUTOCASTS, default=d.autocast,
                       help="the matrix products of the denoiser and the student in this dtype (torch autocast; "
                            f"faster on AVX512-BF16 / AMX CPUs, changes results); default {d.autocast}")


def stack_settings_from_args(args: argparse.Namespace, **other: Any) -> StackSettings:
    """StackSettings from the options of ``add_stack_arguments`` (and ``other`` fields, e.g. ``device``)."""
    return StackSettings(student=args.student, memory_bank=args.memory_bank, k=args.k,
                         min_similarity=args.min_similarity, lesson_weight=args.lesson_weight,
                         decision_every=args.decision_every, population=args.population, iterations=args.iterations,
                         search_seed=args.search_seed, time_budget=args.time_budget, autocast=args.autocast,
                         safety_first=not args.paper_eq22, blocked_lateral_to_keep=not args.drop_blocked_lateral,
                         **other)


_settings = StackSettings()
_cache_lock = threading.Lock()
_students: dict[tuple[str, str], Any] = {}
_banks: dict[str, Any] = {}


def use_settings(settings: StackSettings) -> None:
    """Settings for the stack planners built from now on in this process."""
    global _settings
    _settings = settings


def current_settings() -> StackSettings:
    return _settings


# --------------------------------------------------------------------------------------------------
# Decision sources
# --------------------------------------------------------------------------------------------------


class WithoutReflections:
    """A read-only view of a memory bank whose retrieval never returns reflection items (the
    "no reflection" ablation: the bank as it was before reflection, without copying it)."""

    def __init__(self, bank: Any) -> None:
        self._bank = bank
        self._reflections: tuple[int, set[str]] = (-1, set())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bank, name)

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._bank

    def reflection_ids(self) -> set[str]:
        version = int(self._bank.version)
        if self._reflections[0] != version:
            self._reflections = (version, {i.id for i in self._bank if i.source == "reflection"})
        return self._reflections[1]

    def retrieve(self, query: Any, k: int = 3, exclude_ids: Any = ()) -> list[tuple[MemoryItem, float]]:
        return self._bank.retrieve(query, k, set(exclude_ids) | self.reflection_ids())


class ArgmaxDecisions:
    """The "one-hot decisions" ablation: the heuristic system's top action with probability 1."""

    def __init__(self, heuristic: Any) -> None:
        self.heuristic = heuristic
        self.bank = heuristic.bank

    def reset(self) -> None:
        self.heuristic.reset()

    def decide(self, scene: Any) -> DecisionDistribution:
        d = self.heuristic.decide(scene)
        top = int(np.argmax(d.probabilities))
        one_hot = np.zeros_like(d.probabilities)
        one_hot[top] = 1.0
        return replace(d, probabilities=one_hot, candidate_set=[ACTION_CODES[top]])


def heuristic_config(settings: StackSettings, k: int | None = None) -> HeuristicStackConfig:
    """The stack's heuristic config of ``settings`` ("" bank = the bundled one, read-only; K = 0
    opens no bank)."""
    from luna_core.stack import NO_BANK, HeuristicStackConfig, StackConfigError as CoreConfigError

    k = settings.k if k is None else k
    try:
        return HeuristicStackConfig(student=settings.student, memory_bank=settings.memory_bank if k > 0 else NO_BANK,
                                    default_bank="bundled", device=settings.device, autocast=settings.autocast, k=k,
                                    gamma_p=settings.gamma_p, min_similarity=settings.min_similarity,
                                    lesson_weight=settings.lesson_weight)
    except CoreConfigError as exc:
        raise StackConfigError(str(exc)) from None


def _student(settings: StackSettings) -> Any:
    from luna_core.stack import load_student
    from luna_core.student import StudentError

    key = (settings.student, settings.device, settings.autocast)
    with _cache_lock:
        if key not in _students:
            try:
                _students[key] = load_student(heuristic_config(settings))
            except (FileNotFoundError, StudentError) as exc:  # both name the folder or file
                raise StackConfigError(f"cannot load the stack's student: {exc}") from exc
        return _students[key]


def _bank(settings: StackSettings) -> Any:
    from luna_core.memory.bank import MemoryBankError
    from luna_core.stack import open_memory_bank

    with _cache_lock:
        if settings.memory_bank not in _banks:
            try:
                _banks[settings.memory_bank] = open_memory_bank(heuristic_config(settings))
            except (FileNotFoundError, MemoryBankError) as exc:  # both name the folder or file
                raise StackConfigError(f"cannot open the stack's memory bank: {exc}") from exc
        return _banks[settings.memory_bank]


def heuristic_for(variant: str, settings: StackSettings) -> Any:
    """The decision maker of a stack variant (student and bank loaded once per process, shared by all
    variants; ``luna_core.stack.build_heuristic_system`` assembles it)."""
    from luna_core.stack import build_heuristic_system

    if variant not in STUDENT_PLANNERS:
        raise StackConfigError(f"unknown stack variant {variant!r}; one of {', '.join(STUDENT_PLANNERS)} "
                               f"(the oracles {', '.join(ORACLE_PLANNERS)} need a scenario: make_stack_planner)")
    k = 0 if variant == "luna-k0" else settings.k
    bank = _bank(settings) if k > 0 else None
    if variant == "luna-no-reflection":
        bank = WithoutReflections(bank)
    system = build_heuristic_system(heuristic_config(settings, k), student=_student(settings), bank=bank)
    return ArgmaxDecisions(system) if variant == "luna-onehot" else system


def make_decision_source(variant: str = "luna", student: str = "", memory_bank: str = "", k: int = 3,
                         gamma_p: float = 0.1, device: str = "cpu", autocast: str = "none",
                         lesson_weight: float = DEFAULT_LESSON_WEIGHT,
                         min_similarity: float = -1.0) -> SceneDecisionSource:
    """``decision_source`` of the settings given as keywords (the nuPlan planner config's form).
    ``student`` / ``memory_bank`` are folders ("" = the
    bundled models/student, models/memory_bank); ``k`` retrieved items (``luna-k0`` uses 0);
    ``gamma_p`` is the candidate-set threshold (Eq. 19); ``lesson_weight`` the weight of retrieved
    reflection lessons (``luna_core.lessons``, 0 = the paper's); retrieved items less similar than
    ``min_similarity`` (cosine) are not shown (-1 = all K)."""
    return decision_source(variant, StackSettings(student=student, memory_bank=memory_bank, k=k, gamma_p=gamma_p,
                                                  device=device, autocast=autocast, lesson_weight=lesson_weight,
                                                  min_similarity=min_similarity))


def decision_source(variant: str, settings: StackSettings) -> SceneDecisionSource:
    """The decision source of stack ``variant`` (one of ``STUDENT_PLANNERS``): xi_t from each planner
    input, then the variant's heuristic system with ``settings``' retrieval and candidate-set settings.
    Student and bank are loaded once per process. Raises ``StackConfigError`` naming the folder that
    cannot be loaded, or the bad setting."""
    from luna_bridge.reflection_round import SceneDecisionSource

    return SceneDecisionSource(heuristic_for(variant, settings))


# --------------------------------------------------------------------------------------------------
# Planners
# --------------------------------------------------------------------------------------------------


class StackPlanner:
    """A ``luna_core.types.Planner`` (the decision-guided planner) carrying the decision source the
    simulator calls every T_d (``simulate(..., decision_source=planner.decision_source)``)."""

    def __init__(self, name: str, planner: Any, decision_source: SceneDecisionSource | None) -> None:
        self.name = name
        self.planner = planner
        self.decision_source = decision_source

    def reset(self) -> None:
        self.planner.reset()
        if self.decision_source is not None:
            self.decision_source.reset()

    def plan(self, planner_input: PlannerInput) -> Trajectory:
        return self.planner.plan(planner_input)

    def debug_candidates(self) -> list:
        return self.planner.debug_candidates()

    def cycle_info(self) -> dict[str, object]:
        return self.planner.cycle_info()


def search_planner(use_decisions: bool, settings: StackSettings) -> Any:
    """The registry's ``luna`` (or, without decisions, ``diffusion-es``) planner with ``settings``."""
    from luna_core.planning.diffusion_es import DiffusionESConfig
    from luna_core.planning.factory import make_planner

    search = replace(DiffusionESConfig(), population=settings.population, iterations=settings.iterations,
                     seed=settings.search_seed)
    return make_planner("luna" if use_decisions else "diffusion-es", dict(
        search=search, gamma_p=settings.gamma_p, safety_first=settings.safety_first,
        blocked_lateral_to_keep=settings.blocked_lateral_to_keep,
        deterministic=settings.time_budget == 0, time_budget=settings.time_budget or 0.4,
        decision_period=settings.decision_period, autocast=settings.autocast))  # the timeout derives from T_d (luna_core.decision)


def make_stack_planner(variant: str, scenario: Scenario | None = None,
                       settings: StackSettings | None = None) -> StackPlanner:
    """Registry factory of the stack variants and ``diffusion-es``. Only the oracles read the scenario
    (its logged future is what makes them an upper bound); the student variants never do."""
    s = settings or _settings
    if variant == "diffusion-es":
        return StackPlanner(variant, search_planner(False, s), None)
    if variant in ORACLE_PLANNERS:
        from luna_bridge.oracle import OracleDecisionSource

        if scenario is None:
            # the log for the privileged oracles; for luna-oracle-cv the name that seeds its voters
            raise StackConfigError(f"{variant} decides with the run's scenario: it needs the scenario")
        return StackPlanner(variant, search_planner(True, s),
                            OracleDecisionSource(scenario, s.gamma_p, one_hot=variant == "luna-onehot-oracle",
                                                 privileged=variant != "luna-oracle-cv"))
    return StackPlanner(variant, search_planner(True, s), decision_source(variant, s))
