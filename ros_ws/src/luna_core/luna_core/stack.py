"""The composition root of the stack: its parts built from typed configs, and the steps every runner shares.

The ROS nodes (``luna_nodes``) and the in-process runners (``luna_bridge``: evaluation, reflection
rounds) assemble the same parts; this module is the one place that does it, so a node and a closed-loop
run cannot decide, detect or explain differently:

* ``build_heuristic_system(HeuristicStackConfig)``: student + prompt manager + memory bank
  (``decision_inference`` / ``explainer``; the eval stack planners).
* ``build_llm_client(LLMClientConfig)``: the reflection LLM at an OpenAI-compatible endpoint, or None
  (``reflection_client``; ``luna-bridge reflect``). The API key is read from the environment variable
  the config NAMES, never given, stored or printed.
* ``build_progress_monitor(MonitorConfig)``: the progress monitor with its failure gate; its
  ``tick(now)`` is the ``progress_monitor`` node's check every T_d (the bridge replays a log through it).
* ``executed_decision(decisions, failure)``: the decision the explainer explains for a failure.
* ``SceneDescriber``: xi_t of a decision instant with the prompt's recent actions (``scene_descriptor``;
  the simulator's decision source).

Pure Python (no rclpy): nodes map their parameters to these configs, the bridge its settings. A bad
config raises :class:`StackConfigError` naming the field. The student and the bank are imported and
loaded only by the builder that needs them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

from luna_core.failure_gate import FailureGate
from luna_core.geometry import DEVICE_NAMES, is_device_name
from luna_core.lessons import DEFAULT_LESSON_WEIGHT
from luna_core.monitor import MonitorParameters, ProgressMonitor
from luna_core.scene import SceneConfig, SceneDescriptor, build_scene
from luna_core.types import (DecisionDistribution, EgoState, FailureEvent, LaneGraph, Route, TrackedObjects,
                             TrafficLights, VehicleParameters)

if TYPE_CHECKING:  # loading them pulls in torch / the bank's indexes
    from luna_core.heuristic import HeuristicConfig, HeuristicSystem
    from luna_core.llm import OpenAIChatModel
    from luna_core.memory.bank import MemoryBank
    from luna_core.student import DualHeadStudent

NO_BANK = "none"  # memory_bank value: decide without retrieval
DEFAULT_BANKS = ("live", "bundled")
# A decision executed at a failure is matched by stamp: stamps travel as float seconds through ROS
# messages (builtin_interfaces/Time), which round them to the nanosecond; 1 ms is far below T_d.
STAMP_TOLERANCE = 1e-3


class StackConfigError(ValueError):
    """A stack config with a bad field; the message names the config class and the field."""


def _fail(config: object, name: str, need: str, value: object, show: bool = True) -> None:
    shown = f", got {value!r}" if show else ""
    raise StackConfigError(f"{type(config).__name__}.{name} {need}{shown}")


def _check_finite(config: object, name: str, low: float, high: float = math.inf) -> None:
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        _fail(config, name, f"must be a number in [{low:g}, {high:g}]", value)


def _check_int(config: object, name: str, low: int) -> None:
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        _fail(config, name, f"must be an integer >= {low}", value)


# --------------------------------------------------------------------------------------------------
# Heuristic system
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeuristicStackConfig:
    """What the heuristic system is built from (the ``decision_inference`` node's model parameters)."""

    student: str = ""  # student folder; "" = the bundled models/student
    base_model: str = ""  # base LM overriding the student's saved base (same hash); "" = the saved one
    memory_bank: str = ""  # bank folder; "" = the default bank (``default_bank``); "none" = no retrieval
    # Which bank "" means: "live" = the one the vehicle learns into ($LUNA_DATA, seeded from the bundled
    # one; luna_core.assets.live_memory_bank), "bundled" = models/memory_bank as built (evaluation).
    default_bank: str = "live"
    device: str = "auto"  # "auto" = the device the student was saved for; "cpu", "cuda", "cuda:<n>"
    # The dtype of the base's matrix products (StudentConfig.autocast): "" = the student's own ("none"),
    # "bfloat16". Checked by StudentConfig when the student loads (importing it here would import torch).
    autocast: str = ""
    max_context_tokens: int = 0  # student's prompt budget; 0 = the one it was trained with
    k: int = 3  # retrieved memory items per decision (K)
    gamma_p: float = 0.1  # candidate-set threshold (Eq. 19)
    retrieval_margin: float = 0.005  # keep the previous K items within this similarity (KV-cache reuse)
    min_similarity: float = -1.0  # retrieved items less similar (cosine) are not shown; -1 = all K
    lesson_weight: float = DEFAULT_LESSON_WEIGHT  # w of retrieved reflection lessons (luna_core.lessons); 0 = the paper's

    def __post_init__(self) -> None:
        for name in ("student", "base_model", "memory_bank"):
            if not isinstance(getattr(self, name), str):
                _fail(self, name, "must be a folder path as a string ('' for the default)", getattr(self, name))
        if self.default_bank not in DEFAULT_BANKS:
            _fail(self, "default_bank", f"must be one of {', '.join(DEFAULT_BANKS)}", self.default_bank)
        if not is_device_name(self.device):  # "auto": the device the student was saved for
            _fail(self, "device", f"must be one of {', '.join(DEVICE_NAMES)} or cuda:<n>", self.device)
        _check_int(self, "max_context_tokens", 0)
        _check_int(self, "k", 0)
        _check_finite(self, "gamma_p", 0.0, 1.0)
        _check_finite(self, "retrieval_margin", 0.0, 1.0)
        _check_finite(self, "min_similarity", -1.0, 1.0)
        _check_finite(self, "lesson_weight", 0.0, 1.0)

    @property
    def retrieves(self) -> bool:
        """Whether a memory bank is opened (``memory_bank`` is not "none")."""
        return self.memory_bank != NO_BANK

    def heuristic_config(self) -> HeuristicConfig:
        from luna_core.heuristic import HeuristicConfig

        return HeuristicConfig(k=self.k, gamma_p=self.gamma_p, retrieval_margin=self.retrieval_margin,
                               min_similarity=self.min_similarity, lesson_weight=self.lesson_weight)


def load_student(config: HeuristicStackConfig) -> DualHeadStudent:
    """The student of ``config``; raises StudentError (or FileNotFoundError) naming the folder."""
    from luna_core.assets import resolve
    from luna_core.student import DualHeadStudent

    return DualHeadStudent.from_pretrained(resolve(config.student, "student"),
                                           device=None if config.device == "auto" else config.device,
                                           base_model=config.base_model or None,
                                           max_context_tokens=config.max_context_tokens or None,
                                           autocast=config.autocast or None)


def open_memory_bank(config: HeuristicStackConfig) -> MemoryBank | None:
    """The bank decisions retrieve from, read-only (None for "none"); raises FileNotFoundError or
    MemoryBankError naming the folder."""
    from luna_core.assets import live_memory_bank, resolve
    from luna_core.memory.bank import MemoryBank

    if not config.retrieves:
        return None
    path = live_memory_bank(config.memory_bank) if config.default_bank == "live" \
        else resolve(config.memory_bank, "memory_bank")
    return MemoryBank.open(path, writable=False)


class _FromConfig:
    """Marks a part ``build_heuristic_system`` loads itself (None is a valid bank: no retrieval)."""

    def __repr__(self) -> str:
        return "FROM_CONFIG"


FROM_CONFIG: Any = _FromConfig()


def build_heuristic_system(config: HeuristicStackConfig, *, student: Any = FROM_CONFIG,
                           bank: Any = FROM_CONFIG) -> HeuristicSystem:
    """Student + prompt manager + memory bank of ``config``. A caller that shares loaded parts (the
    bridge keeps one student and bank per process for all its planners, and may wrap the bank in a
    view) passes them; whatever is not passed is loaded here."""
    from luna_core.heuristic import HeuristicSystem
    from luna_core.prompts import PromptManager

    if not isinstance(config, HeuristicStackConfig):
        raise StackConfigError(f"build_heuristic_system needs a HeuristicStackConfig, got {type(config).__name__}")
    if student is FROM_CONFIG:
        student = load_student(config)
    if bank is FROM_CONFIG:
        bank = open_memory_bank(config)
    return HeuristicSystem(student, PromptManager(), bank, config.heuristic_config())


# --------------------------------------------------------------------------------------------------
# Reflection LLM
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LLMClientConfig:
    """An OpenAI-compatible endpoint for reflection; ``endpoint`` "" = none (the hindsight check writes)."""

    endpoint: str = ""  # base URL
    model: str = ""  # model name at the endpoint
    api_key_env: str = ""  # NAME of the environment variable holding the key; "" = no key
    timeout: float = 60.0  # s per request

    def __post_init__(self) -> None:
        # A key pasted where its variable's name belongs must not end up in an error message or a log.
        if self.api_key_env and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.api_key_env):
            _fail(self, "api_key_env", "must be the NAME of an environment variable (letters, digits, _), "
                                       "not the key itself (the value is not shown)", None, show=False)
        _check_finite(self, "timeout", 0.0)
        if self.timeout <= 0.0:
            _fail(self, "timeout", "must be > 0 s", self.timeout)


def build_llm_client(config: LLMClientConfig) -> OpenAIChatModel | None:
    """The reflection LLM, or None without an endpoint. It makes one attempt per request: the durable
    outbox retries with backoff, so a retrying client would only hold the worker. Raises
    LLMConfigError when the named key variable is not set."""
    if not isinstance(config, LLMClientConfig):
        raise StackConfigError(f"build_llm_client needs an LLMClientConfig, got {type(config).__name__}")
    if not config.endpoint:
        return None
    from luna_core.llm import EndpointConfig, OpenAIChatModel

    return OpenAIChatModel(EndpointConfig(model=config.model, base_url=config.endpoint,
                                          api_key_env=config.api_key_env or None, timeout=config.timeout,
                                          max_retries=0))


# --------------------------------------------------------------------------------------------------
# Scene
# --------------------------------------------------------------------------------------------------

RECENT_ACTIONS = 2  # the prompt's "Recent decisions": the top actions of the last two decisions


@dataclass
class SceneDescriber:
    """xi_t of each decision instant (``build_scene``) with the prompt's recent actions: the top actions of
    the last ``RECENT_ACTIONS`` decisions heard (``on_decision``). Raises ``SceneInputError`` like
    ``build_scene``."""

    config: SceneConfig = field(default_factory=SceneConfig)
    recent_actions: list[str] = field(default_factory=list)

    def on_decision(self, decision: DecisionDistribution) -> None:
        self.recent_actions = (self.recent_actions + [decision.top_action])[-RECENT_ACTIONS:]

    def reset(self) -> None:
        self.recent_actions = []

    def describe(self, ego: EgoState, objects: TrackedObjects | None, lights: TrafficLights | None, route: Route,
                 graph: LaneGraph, vehicle: VehicleParameters | None = None) -> SceneDescriptor:
        return build_scene(ego, objects, lights, route, graph, self.recent_actions, vehicle, self.config)


# --------------------------------------------------------------------------------------------------
# Progress monitor
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MonitorConfig:
    """The progress monitor's parameters and the failure gate's cooldown (``progress_monitor`` node)."""

    parameters: MonitorParameters = field(default_factory=MonitorParameters)
    failure_cooldown: float = 5.0  # s: a lasting failure is reported again only after this long

    def __post_init__(self) -> None:
        if not isinstance(self.parameters, MonitorParameters):
            _fail(self, "parameters", "must be a MonitorParameters", type(self.parameters).__name__)
        _check_finite(self, "failure_cooldown", 0.0)


@dataclass(frozen=True)
class MonitorTick:
    detected: FailureEvent | None  # what the check found this period (None: no failure)
    admitted: FailureEvent | None  # the part of it that is new within the cooldown: what is published


@dataclass
class FailureDetector:
    """The progress monitor and its failure gate: feed ``monitor`` as inputs arrive, ``tick`` every T_d."""

    monitor: ProgressMonitor
    gate: FailureGate

    def tick(self, now: float) -> MonitorTick:
        """One check of the window ending at ``now``, debounced by the gate."""
        event = self.monitor.check(now)
        return MonitorTick(event, self.gate.admit(event) if event is not None else None)


def build_progress_monitor(config: MonitorConfig) -> FailureDetector:
    if not isinstance(config, MonitorConfig):
        raise StackConfigError(f"build_progress_monitor needs a MonitorConfig, got {type(config).__name__}")
    return FailureDetector(ProgressMonitor(config.parameters), FailureGate(config.failure_cooldown))


# --------------------------------------------------------------------------------------------------
# Explanation
# --------------------------------------------------------------------------------------------------


def executed_decision(decisions: Iterable[DecisionDistribution],
                      failure: FailureEvent) -> DecisionDistribution | None:
    """The decision executed when ``failure`` happened, among ``decisions`` (oldest first): the one
    issued at the failure's ``decision_stamp``; failing that (the monitor had none in force, or its
    decision never reached the caller) the last one issued before the failure; None if none was."""
    candidates = [d for d in decisions if d.stamp <= failure.stamp + 1e-6]
    exact = [d for d in candidates if abs(d.stamp - failure.decision_stamp) < STAMP_TOLERANCE]
    return (exact or candidates or [None])[-1]
