"""The heuristic system at run time (LUNA-AD Sec. III-C3, III-E1): decide periodically, explain on failure.

``decide(scene)``: Q_md from the scene (P_md, Eq. 11), K memory items retrieved by cosine similarity,
one forward pass of the student (Eq. 16) with impossible actions masked, the retrieved reflection
lessons weighted in when ``lesson_weight`` > 0 (``luna_core.lessons``), the candidate set (Eq. 19).
``explain(decision, failure)``: the student's explanation of that decision (Eq. 25-28), prefixed by
its probability-ranked candidate actions, generated greedily and interruptible; an action the student
names wrongly after its code is renamed from the code, and text cut by the budget ends at its last
complete sentence (``prompts.parsers``). The token budget is shorter when the student runs on the CPU,
where every generated token competes with the periodic decision.

Used by the ``decision_inference`` / ``explainer`` nodes; in-process closed-loop runs and offline
evaluation are meant to call the same object so that everything decides the same way.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from luna_core.lessons import DEFAULT_LESSON_WEIGHT, absent_causes, lessons_of, repeated_reflections, weigh_lessons
from luna_core.prompts.parsers import complete_sentences, repair_action_names
from luna_core.scene import head_scene_values, scene_vector
from luna_core.types import (DecisionDistribution, DecisionExplanation, FailureEvent, MemoryItem, SceneDescriptor,
                             candidate_set)

if TYPE_CHECKING:  # the bank is imported by whoever builds the system (faiss loads with it)
    from luna_core.memory.bank import MemoryBank


class InvalidSceneError(ValueError):
    """A scene descriptor that cannot be decided on; the message names the field and the value."""


def check_scene(scene: SceneDescriptor) -> None:
    """Reject a scene with non-finite numbers or an impossible lane layout (``InvalidSceneError``).

    A whole scene is refused rather than the bad object dropped: an object whose distance is unknown
    may be the one right in front, and a decision that silently ignored it would look trustworthy.
    """
    where = f"scene at {scene.stamp:.3f} s"
    if not math.isfinite(scene.stamp):
        raise InvalidSceneError(f"scene: stamp is {scene.stamp}")
    for name in ("ego_speed", "ego_acceleration", "ego_length", "ego_width"):
        value = getattr(scene, name)
        if not math.isfinite(value):
            raise InvalidSceneError(f"{where}: {name} is {value}")
    if math.isnan(scene.junction_distance):
        raise InvalidSceneError(f"{where}: junction_distance is nan")
    for i, point in enumerate(scene.exit_points):
        if not all(math.isfinite(v) for v in point):
            raise InvalidSceneError(f"{where}: exit_points[{i}] is {tuple(point)}")
    if scene.num_lanes < 0 or not 0 <= scene.ego_lane_index <= scene.num_lanes:
        raise InvalidSceneError(f"{where}: ego lane {scene.ego_lane_index} of {scene.num_lanes} lanes")
    for i, o in enumerate(scene.objects):
        for name in ("distance", "bearing", "heading", "speed", "length", "width"):
            value = getattr(o, name)
            if not math.isfinite(value):
                raise InvalidSceneError(f"{where}: objects[{i}] ({o.id!r}) {name} is {value}")


def retrieval_key(bank: MemoryBank, scene: SceneDescriptor, query: str) -> str | np.ndarray:
    """What a decision retrieves with from ``bank``: the scene vector for a scene-vector bank, else the
    decision query Q_md (text, embedded by the bank's embedder)."""
    name = str(bank.manifest["embedder"].get("name", ""))
    return scene_vector(scene) if name.startswith("scene-vector:") else query


@dataclass(frozen=True)
class HeuristicConfig:
    k: int = 3  # retrieved examples at inference (LUNA-AD Sec. IV-B)
    # Keep the previous decision's K items while their mean cosine similarity to the current query is
    # within this margin of the best K's: consecutive prompts then share the examples, whose KV cache
    # the student reuses. On the default bank (frames 2 s apart) 0.005 kept the items in 77% of
    # consecutive frames at a mean similarity cost of 0.001; 0 = always exactly the top K.
    retrieval_margin: float = 0.005
    # Retrieved items less similar than this (cosine in the bank's embedding space) are not shown: a scene
    # far from every item (e.g. real traffic against a bank of procedural roads) decides with fewer examples
    # or none, as the student was trained to (random K in [0, 3]). -1 = every item, the paper's behaviour.
    min_similarity: float = -1.0
    gamma_p: float = 0.1  # candidate-set threshold (Eq. 19)
    explanation_max_tokens: int = 200  # on an accelerator
    # On the CPU a token costs tens of ms and waits for each decision: about the first ranked action's
    # rationale (the teacher's are 60-80 tokens each).
    explanation_cpu_max_tokens: int = 96
    explanation_max_time: float = 60.0  # s; an explanation is abandoned after this
    # w of pi' = (1 - w) pi_hat + w q: how much the retrieved reflection items' recommended decisions
    # weigh against the student's own distribution (luna_core.lessons); with w > 0 a reflection item is
    # retrieved only where the scene has its cause; 0 = the paper's behaviour (every retrieved reflection
    # item is only an example in the prompt).
    lesson_weight: float = DEFAULT_LESSON_WEIGHT


class HeuristicSystem:
    """Student + prompt manager + (optional) memory bank; thread-safe for one decider and one explainer."""

    def __init__(self, student, prompts, bank=None, config: HeuristicConfig = HeuristicConfig()) -> None:
        self.student = student
        self.prompts = prompts
        self.bank = bank
        self.config = config
        self._bank_lock = threading.Lock()
        self._previous_ids: list[str] = []  # the items the last decision retrieved

    # -- memory ------------------------------------------------------------------------------------

    @property
    def memory_version(self) -> int:
        return int(self.bank.version) if self.bank is not None else 0

    def refresh_memory(self) -> bool:
        """Load items another process appended (reflection); True if the bank changed."""
        if self.bank is None:
            return False
        with self._bank_lock:
            return self.bank.refresh()

    def retrieve(self, scene: SceneDescriptor, query: str) -> list[tuple[MemoryItem, float]]:
        """The K items most similar to the scene with their cosine similarity, best first, or the
        previous decision's items while they are nearly as similar (``retrieval_margin``). A reflection
        item repeating a better one, and with lessons on (w > 0) one whose cause the scene lacks, is
        replaced by the next item (``luna_core.lessons``). Items below ``min_similarity`` are left out, so
        a scene far from the bank gets fewer than K items or none."""
        if self.bank is None or self.config.k <= 0:
            return []
        with self._bank_lock:
            q = self.bank.embedder.embed_query(retrieval_key(self.bank, scene, query))
            best = self.bank.retrieve(q, self.config.k)
            excluded: set[str] = set()
            while more := self._out_of_place(best, scene) - excluded:
                excluded |= more
                best = self.bank.retrieve(q, self.config.k, exclude_ids=excluded)
            best = [(item, score) for item, score in best if score >= self.config.min_similarity]
            previous = [self.bank.get(i) for i in self._previous_ids if i in self.bank]
            if best and len(previous) == len(best) == len(self._previous_ids) \
                    and not self._out_of_place([(item, 0.0) for item in previous], scene):
                kept = [float(np.dot(item.embedding, q)) for item in previous]
                near = float(np.mean([score for _, score in best])) - self.config.retrieval_margin
                if min(kept) >= self.config.min_similarity and np.mean(kept) >= near:
                    return list(zip(previous, kept))
            self._previous_ids = [item.id for item, _ in best]
            return best

    def _out_of_place(self, retrieved: list[tuple[MemoryItem, float]], scene: SceneDescriptor) -> set[str]:
        """The retrieved reflection items not to show for ``scene`` (``retrieve``)."""
        out = repeated_reflections(retrieved)
        return out | absent_causes(retrieved, scene) if self.config.lesson_weight > 0.0 else out

    def reset(self) -> None:
        """A new episode: the next decision retrieves the exact top K (no previous items to keep)."""
        with self._bank_lock:
            self._previous_ids = []

    # -- decisions ---------------------------------------------------------------------------------

    def decide(self, scene: SceneDescriptor) -> DecisionDistribution:
        """pi_hat for ``scene``; raises ``InvalidSceneError`` for a scene with non-finite numbers and
        ``ContextOverflowError`` when even the shortened prompt does not fit the context window."""
        started = time.perf_counter()
        check_scene(scene)
        query = self.prompts.decision_query(scene)
        retrieved = self.retrieve(scene, query)
        # Scene values only for a head that reads them (StudentConfig.head_scene_dim): nothing extra otherwise
        xi = head_scene_values(scene) if self.student.config.head_scene_dim else None
        mask = scene.action_mask()
        student_p, prompt = self.student.predict(query, [item for item, _ in retrieved], mask=mask, scene_vector=xi)
        used = retrieved[:prompt.examples_used]  # the least similar items are dropped first
        lessons = lessons_of(used, scene, mask) if self.config.lesson_weight > 0.0 else []
        probabilities = weigh_lessons(student_p, lessons, self.config.lesson_weight)
        return DecisionDistribution(stamp=scene.stamp, probabilities=probabilities,
                                    candidate_set=candidate_set(probabilities, self.config.gamma_p), query=query,
                                    retrieved_ids=[item.id for item, _ in used],
                                    retrieved_similarities=[round(score, 6) for _, score in used],
                                    student_probabilities=student_p if lessons else None,
                                    latency=time.perf_counter() - started, scene_stamp=scene.stamp,
                                    memory_version=self.memory_version,
                                    examples_dropped=len(retrieved) - len(used),
                                    objects_dropped=prompt.objects_dropped)

    @property
    def on_cpu(self) -> bool:
        """Whether the student runs on the CPU (where explanations get the shorter budget)."""
        return str(getattr(self.student, "device", "cpu")).startswith("cpu")

    def explanation_budget(self) -> int:
        """Generated tokens per explanation on the student's device."""
        return self.config.explanation_cpu_max_tokens if self.on_cpu else self.config.explanation_max_tokens

    def explain(self, decision: DecisionDistribution, failure: FailureEvent, stop: threading.Event | None = None,
                max_tokens: int | None = None, max_time: float | None = None) -> DecisionExplanation:
        """Explain ``decision`` (the one executed when ``failure`` happened) with the same retrieved
        context it was made with (items that vanished from the bank are skipped). ``max_tokens`` /
        ``max_time`` (s) override the config's (the explainer's parameters, on a shared system; default
        budget: ``explanation_budget()``)."""
        retrieved = []
        if self.bank is not None:
            with self._bank_lock:
                retrieved = [self.bank.get(i) for i in decision.retrieved_ids if i in self.bank]
        ranked = decision.candidate_set or candidate_set(decision.probabilities, self.config.gamma_p)
        result = self.student.explain(decision.query, retrieved, ranked,
                                      max_new_tokens=max_tokens or self.explanation_budget(), stop=stop,
                                      max_time=max_time or self.config.explanation_max_time)
        text, repaired = repair_action_names(result.text)
        if result.stop_reason != "eos":  # cut by the budget: end at the last complete sentence
            text = complete_sentences(text, keep=len(result.prefix))
        return DecisionExplanation(stamp=failure.stamp, decision_stamp=decision.stamp,
                                   failure_stamp=failure.stamp, query=decision.query, candidate_set=list(ranked),
                                   text=text, latency=result.latency, stop_reason=result.stop_reason,
                                   names_repaired=repaired)
