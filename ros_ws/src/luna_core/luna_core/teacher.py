"""The multi-agent analytical system (LUNA-AD Sec. III-B, Eq. 5-12): the offline teacher.

Three stages per frame: action voting by M voters, one confidence per voter, summarisation; the
decision distribution is Eq. 10 over the ballots. Voters are pluggable:

* ``LLMVoterPool`` (the paper): M chat calls at temperature ~0.7 with top-k sampling and the 3-step
  guideline (Eq. 5-6), each answer parsed strictly (M_act), then one confidence assessment per voter
  at temperature 0, in isolation (Eq. 7-8).
* ``ScoredVoterPool``: simulation-grounded voters. An ``ActionScorer`` scores each allowed action
  (e.g. by rolling out a planner with that action's reference lane and speed interval in the
  simulator); each voter samples an action from the scores and takes its score as confidence.

Every failure (endpoint error, malformed answer) is recorded with its stage and reason and the run
continues (except ``BudgetExceeded``, which propagates: the spending cap stops the collection): a
failed voter is dropped and counted, and a frame fails only when no voter survives.
When a weak model's free text does not parse and the backend can score fixed continuations
(``ChoiceModel``), the answer is completed by constrained decoding; that is recorded per ballot
(``vote_source`` / ``confidence_source``), never hidden. The rationale comes from the summarisation
LLM when one is configured and its answer validates, else from a template that states only facts
of the scene descriptor (and of the scorer's outcomes).
"""

from __future__ import annotations

import hashlib
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from luna_core.llm.base import BudgetExceeded, ChatModel, ChoiceModel, LLMError
from luna_core.prompts import (CONFIDENCE_TAG, DECISION_TAG, MalformedModelOutput, PromptManager,
                               allowed_actions, format_ranked_answer, parse_confidence,
                               parse_ranked_answer, parse_vote)
from luna_core.scene import JUNCTION, LEFT_LANE, RIGHT_LANE, SAME_LANE, TARGET_ROAD, safe_id
from luna_core.types import (ACTION_CODES, ACTION_INDEX, NUM_ACTIONS, Action, MemoryItem, ObjectClass,
                             ObjectDescription, RoadSection, SceneDescriptor, TrafficLightPhase, candidate_set,
                             validate_distribution)

_CONFIDENCE_LEVELS = tuple(f"{k / 10:.1f}" for k in range(11))


@dataclass(frozen=True)
class TeacherConfig:
    num_voters: int = 10  # M
    vote_temperature: float = 0.7  # tau~ of Eq. 6
    top_k: int | None = 40
    vote_max_tokens: int = 512
    confidence_max_tokens: int = 160
    summary_max_tokens: int = 512
    constrained_fallback: bool = True  # complete unparsable answers by constrained decoding (recorded)
    parallel: int = 1  # voters run concurrently (useful with remote endpoints)
    # Scored voters: softmax temperature over outcome scores in [0, 1]. Reasonable alternatives differ
    # by 0.05-0.2 in simulated outcome scores; at 0.05 a gap of 0.1 weighs e^2 (M = 10 samples then
    # rarely let a clearly worse action win, while close calls stay spread).
    score_temperature: float = 0.05
    # The template answer (A_sum without a summarisation LLM) recommends the codes of at least this
    # probability (the candidate set of Eq. 19), at most ``answer_max_codes``, each with a brief
    # rationale: the student reads K answers in every prompt, so they must stay short (~40 tokens).
    answer_gamma: float = 0.1
    answer_max_codes: int = 3


@dataclass
class Ballot:
    """One voter's hypothesis a^(m) with confidence c^(m) and the texts behind them."""

    voter: int
    action: str
    confidence: float
    vote_text: str = ""  # A_av^(m)
    assessment_text: str = ""  # A_ca^(m)
    vote_source: str = "parsed"  # "parsed" | "constrained" | "scored"
    confidence_source: str = "parsed"  # "parsed" | "constrained_expectation" | "scored"


@dataclass
class StageFailure:
    stage: str  # "vote" | "confidence" | "summary" | "scorer"
    voter: int | None
    problem: str
    reason: str
    excerpt: str = ""


@dataclass
class ActionOutcome:
    """What executing one action from this frame led to (a simulation-grounded voter's evidence)."""

    score: float  # in [0, 1], higher is better
    collision: bool = False
    progress: float = 0.0  # m travelled along the route in the rollout
    reason: str = ""  # one faithful sentence, e.g. "collided with v3 after 2.1 s"
    issue: str = ""  # the decisive problem in a few words ("hits v3 in 2.1 s"); "" when none
    j_dec: float = 1.0  # how well the rollout kept the action's lane and speed interval (CALMM-Drive Eq. 4)
    executable: bool = True  # the traffic let the rollout execute the action as asked


class ActionScorer(Protocol):
    """Scores each action from a frame, e.g. by a closed-loop rollout of a planner that follows the
    action's reference lane and speed interval. ``context`` identifies the frame for the scorer
    (scenario name and suite, time, ...), as written by ``luna-offline frames``."""

    def score(self, scene: SceneDescriptor, context: Mapping[str, Any],
              actions: Sequence[str]) -> Mapping[str, ActionOutcome]:
        ...


@dataclass
class VotingRecord:
    """Everything the voting stages produced for one frame."""

    ballots: list[Ballot] = field(default_factory=list)
    failures: list[StageFailure] = field(default_factory=list)
    outcomes: dict[str, ActionOutcome] = field(default_factory=dict)
    dropped_voters: int = 0


class VoterPool(Protocol):
    def cast(self, scene: SceneDescriptor, query_av: str, allowed: Sequence[str],
             context: Mapping[str, Any], seed: int) -> VotingRecord:
        ...


@dataclass
class TeacherResult:
    ok: bool
    query: str  # Q_md (Eq. 11)
    distribution: np.ndarray | None  # pi(.|xi_t) over ACTION_CODES (Eq. 10)
    ranked: list[str]
    answer: str  # A_sum
    rationale_source: str  # "summary_llm" | "template"
    voting: VotingRecord
    failures: list[StageFailure]
    reason: str = ""  # why the frame failed (ok=False)
    notes: list[str] = field(default_factory=list)

    def memory_item(self, item_id: str, created: float, scene_vector: np.ndarray | None = None) -> MemoryItem:
        if not self.ok or self.distribution is None:
            raise ValueError(f"frame {item_id} has no teacher result to store: {self.reason}")
        return MemoryItem(id=item_id, query=self.query, answer=self.answer, distribution=self.distribution,
                          source="teacher", created=created, scene_vector=scene_vector)

    def record(self) -> dict[str, Any]:
        """JSON-safe provenance of the frame (votes, confidences, sources, failures)."""
        return {"ok": self.ok, "reason": self.reason, "ranked": self.ranked,
                "distribution": None if self.distribution is None else [round(float(p), 6)
                                                                        for p in self.distribution],
                "rationale_source": self.rationale_source, "notes": self.notes,
                "dropped_voters": self.voting.dropped_voters,
                "ballots": [asdict(b) for b in self.voting.ballots],
                "outcomes": {a: asdict(o) for a, o in self.voting.outcomes.items()},
                "failures": [asdict(f) for f in self.failures]}


def derive_seed(*parts: object) -> int:
    """A stable 31-bit seed from any parts (frame id, voter index...): reruns sample identically."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:4], "big") & 0x7FFFFFFF


def _failure(stage: str, voter: int | None, exc: Exception) -> StageFailure:
    if isinstance(exc, BudgetExceeded):  # not a voter's failure: the whole collection must stop
        raise exc
    if isinstance(exc, MalformedModelOutput):
        return StageFailure(stage, voter, exc.problem, exc.reason, exc.excerpt)
    return StageFailure(stage, voter, type(exc).__name__, str(exc))


# --------------------------------------------------------------------------------------------------
# Voter pools
# --------------------------------------------------------------------------------------------------


class LLMVoterPool:
    """M LLM voters with per-voter confidence assessment (Eq. 5-8)."""

    def __init__(self, voter_model: ChatModel, prompts: PromptManager | None = None,
                 config: TeacherConfig | None = None, assessor_model: ChatModel | None = None) -> None:
        self.model = voter_model
        self.assessor = assessor_model or voter_model
        self.prompts = prompts or PromptManager()
        self.config = config or TeacherConfig()

    def cast(self, scene: SceneDescriptor, query_av: str, allowed: Sequence[str],
             context: Mapping[str, Any], seed: int) -> VotingRecord:
        cfg = self.config
        voters = range(cfg.num_voters)
        if cfg.parallel > 1:
            with ThreadPoolExecutor(cfg.parallel, thread_name_prefix="voter") as pool:
                results = list(pool.map(lambda m: self._one(query_av, allowed, m, seed), voters))
        else:
            results = [self._one(query_av, allowed, m, seed) for m in voters]
        record = VotingRecord()
        for ballot, failures in results:
            record.failures += failures
            if ballot is None:
                record.dropped_voters += 1
            else:
                record.ballots.append(ballot)
        return record

    def _one(self, query_av: str, allowed: Sequence[str], m: int,
             seed: int) -> tuple[Ballot | None, list[StageFailure]]:
        cfg = self.config
        failures: list[StageFailure] = []
        voter_seed = derive_seed(seed, "voter", m)
        messages = self.prompts.av_messages(query_av)
        # Stage 1: action voting (Eq. 6) and M_act.
        try:
            vote = self.model.chat(messages, temperature=cfg.vote_temperature, top_k=cfg.top_k,
                                   seed=voter_seed, max_tokens=cfg.vote_max_tokens)
        except LLMError as exc:
            return None, [_failure("vote", m, exc)]
        vote_text, vote_source = vote.text.strip(), "parsed"
        try:
            action = parse_vote(vote_text, allowed)
        except MalformedModelOutput as exc:
            failures.append(_failure("vote", m, exc))
            completed = self._constrained(self.model, messages, list(allowed), vote_text, DECISION_TAG,
                                          cfg.vote_temperature, voter_seed, "vote", m, failures)
            if completed is None:
                return None, failures
            action, vote_text = completed.text, self._completed_text(vote_text, DECISION_TAG, completed.text)
            vote_source = "constrained"
        # Stage 2: confidence assessment in isolation (Eq. 7-8), deterministic decoding.
        ca_messages = self.prompts.ca_messages(query_av, vote_text)
        try:
            assessment = self.assessor.chat(ca_messages, temperature=0.0, seed=voter_seed,
                                            max_tokens=cfg.confidence_max_tokens)
        except LLMError as exc:
            return None, failures + [_failure("confidence", m, exc)]
        ca_text, ca_source = assessment.text.strip(), "parsed"
        try:
            confidence = parse_confidence(ca_text)
        except MalformedModelOutput as exc:
            failures.append(_failure("confidence", m, exc))
            completed = self._constrained(self.assessor, ca_messages, list(_CONFIDENCE_LEVELS), ca_text,
                                          CONFIDENCE_TAG, 0.0, voter_seed, "confidence", m, failures)
            if completed is None:
                return None, failures
            # The expectation over the verbalised levels is deterministic and keeps the model's
            # uncertainty (the argmax of a weak model collapses to one level).
            lp = np.array([completed.logprobs[c] for c in _CONFIDENCE_LEVELS])
            p = np.exp(lp - lp.max())
            confidence = float(np.dot(p / p.sum(), [float(c) for c in _CONFIDENCE_LEVELS]))
            ca_text = self._completed_text(ca_text, CONFIDENCE_TAG, f"{confidence:.2f}")
            ca_source = "constrained_expectation"
        return Ballot(m, action, confidence, vote_text, ca_text, vote_source, ca_source), failures

    @staticmethod
    def _completed_text(text: str, tag: str, value: str) -> str:
        """The free text without any malformed answer line, ending with the constrained answer."""
        kept = [ln for ln in text.splitlines() if not ln.strip().strip("*#> ").startswith(tag)]
        return ("\n".join(kept).rstrip() + f"\n{tag} {value}").strip()

    def _constrained(self, model: ChatModel, messages: list[dict[str, str]], choices: list[str], text: str,
                     tag: str, temperature: float, seed: int, stage: str, m: int,
                     failures: list[StageFailure]):
        if not self.config.constrained_fallback or not isinstance(model, ChoiceModel):
            return None
        prefix = self._completed_text(text, tag, "")  # "...reasoning\n<tag>" to be completed
        try:
            # The space belongs to the answer token (" DK"), as the model would write it after the tag.
            chosen = model.choose(messages, [" " + c for c in choices], assistant_prefix=prefix,
                                  temperature=temperature, seed=seed)
        except LLMError as exc:
            failures.append(_failure(stage, m, exc))
            return None
        return replace(chosen, text=chosen.text.strip(),
                       logprobs={k.strip(): v for k, v in chosen.logprobs.items()})


class ScoredVoterPool:
    """Simulation-grounded voters: per-action outcome scores turned into M votes and confidences."""

    def __init__(self, scorer: ActionScorer, config: TeacherConfig | None = None) -> None:
        self.scorer = scorer
        self.config = config or TeacherConfig()

    def cast(self, scene: SceneDescriptor, query_av: str, allowed: Sequence[str],
             context: Mapping[str, Any], seed: int) -> VotingRecord:
        cfg = self.config
        record = VotingRecord()
        try:
            outcomes = dict(self.scorer.score(scene, context, list(allowed)))
        except Exception as exc:  # a scorer is external code (simulator): record and fail the frame
            record.failures.append(_failure("scorer", None, exc))
            record.dropped_voters = cfg.num_voters
            return record
        valid: dict[str, ActionOutcome] = {}
        for code in allowed:
            o = outcomes.get(code)
            if o is None or not math.isfinite(o.score) or not 0.0 <= o.score <= 1.0:
                record.failures.append(StageFailure("scorer", None, "out_of_range" if o else "missing",
                                                    f"no valid score in [0, 1] for {code}: {o}"))
            else:
                valid[code] = o
        record.outcomes = valid
        if not valid:
            record.dropped_voters = cfg.num_voters
            return record
        codes = list(valid)
        scores = np.array([valid[c].score for c in codes])
        z = (scores - scores.max()) / max(cfg.score_temperature, 1e-6)
        p = np.exp(z) / np.exp(z).sum()
        for m in range(cfg.num_voters):
            rng = np.random.default_rng(derive_seed(seed, "scored", m))
            code = codes[int(rng.choice(len(codes), p=p))]
            o = valid[code]
            text = f"Rollout of {code}: {o.reason or 'no details'}\n{DECISION_TAG} {code}"
            record.ballots.append(Ballot(m, code, o.score, text, f"{CONFIDENCE_TAG} {o.score:.2f}",
                                         "scored", "scored"))
        return record


# --------------------------------------------------------------------------------------------------
# Aggregation (Eq. 10) and rationale
# --------------------------------------------------------------------------------------------------


def aggregate(ballots: Sequence[Ballot]) -> tuple[np.ndarray, list[str]]:
    """Eq. 10: pi(a) = sum_m c_m 1(a_m = a) / sum_m c_m. If every confidence is 0 the ballots count
    equally (noted). Returns the distribution over ACTION_CODES and notes."""
    if not ballots:
        raise ValueError("Eq. 10 needs at least one ballot")
    notes = []
    weights = np.array([b.confidence for b in ballots], dtype=np.float64)
    if weights.sum() <= 0.0:
        weights = np.ones(len(ballots))
        notes.append("all confidences were 0; ballots weighted equally")
    p = np.zeros(NUM_ACTIONS)
    for b, w in zip(ballots, weights):
        p[ACTION_INDEX[b.action]] += w
    return validate_distribution(p / p.sum()), notes


def ranking(distribution: np.ndarray) -> list[str]:
    """Codes with non-zero probability, most probable first (ties in canonical code order)."""
    order = np.argsort(-distribution, kind="stable")
    return [ACTION_CODES[i] for i in order if distribution[i] > 0.0]


def key_objects(scene: SceneDescriptor, code: str) -> list[ObjectDescription]:
    """The objects that bear on one decision (Step 2 of the guideline): the nearest object ahead in
    the ego lane, vehicles cutting into it, the nearest ahead and behind in the target lane of a lane
    change, objects in the junction or on the target road (nearest two), VRUs within 15 m."""
    lateral = code[1]
    chosen: list[ObjectDescription] = []

    def nearest(relation: str, ahead: bool | None = None, n: int = 1) -> None:
        pool = [o for o in scene.objects if o.lane_relation == relation
                and (ahead is None or (math.cos(o.bearing) >= 0.0) == ahead)]
        chosen.extend(sorted(pool, key=lambda o: o.distance)[:n])

    nearest(SAME_LANE, ahead=True)
    chosen += [o for o in scene.objects if o.cutting_in and o not in chosen]
    if lateral == "L":
        nearest(LEFT_LANE, ahead=True)
        nearest(LEFT_LANE, ahead=False)
    if lateral == "R":
        nearest(RIGHT_LANE, ahead=True)
        nearest(RIGHT_LANE, ahead=False)
    if scene.road_section is not RoadSection.NORMAL_MULTI_LANE:
        nearest(JUNCTION, n=2)
        nearest(TARGET_ROAD, n=1)
    chosen += [o for o in scene.objects if o.object_class.is_vru and o.distance <= 15.0 and o not in chosen]
    return chosen


def _brief_object(o: ObjectDescription) -> str:
    kind = {ObjectClass.VEHICLE: "vehicle", ObjectClass.PEDESTRIAN: "pedestrian", ObjectClass.BICYCLE: "cyclist",
            ObjectClass.STATIC: "obstacle"}[o.object_class]
    where = "ahead" if math.cos(o.bearing) >= 0.0 else "behind"
    relation = "cutting in" if o.cutting_in else o.lane_relation
    moving = "" if o.object_class is ObjectClass.STATIC else f" at {o.speed:.0f} m/s"
    return f"{kind} {safe_id(o.id)} {o.distance:.0f} m {where} ({relation}){moving}"


def brief_rationale(scene: SceneDescriptor, code: str, outcome: ActionOutcome | None = None,
                    decisive_object: bool = True) -> str:
    """A few words for ``code`` stating only facts of xi_t and the rollout: the decisive object (the
    first key object, or a red light) when ``decisive_object``, then the outcome (the rollout's
    decisive problem, else its progress); without a rollout, the action itself."""
    parts = []
    if decisive_object:
        objs = key_objects(scene, code)
        if scene.traffic_light in (TrafficLightPhase.RED, TrafficLightPhase.YELLOW):
            parts.append(f"{scene.traffic_light.value.lower()} light")
        parts.append(_brief_object(objs[0]) if objs else "road clear")
    if outcome is not None and (outcome.issue or outcome.reason):
        parts.append(outcome.issue or f"clear, {max(outcome.progress, 0.0):.0f} m progress")
    elif not decisive_object:
        parts.append(Action.from_code(code).description)
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + "."


def answer_codes(distribution: np.ndarray, config: TeacherConfig) -> list[str]:
    """The codes a template answer recommends: the candidate set (Eq. 19, ``answer_gamma``), at most
    ``answer_max_codes``, at least the most probable one."""
    return candidate_set(distribution, config.answer_gamma)[:max(config.answer_max_codes, 1)]


# --------------------------------------------------------------------------------------------------
# The teacher
# --------------------------------------------------------------------------------------------------


class Teacher:
    def __init__(self, voters: VoterPool, summarizer: ChatModel | None = None,
                 prompts: PromptManager | None = None, config: TeacherConfig | None = None) -> None:
        self.voters = voters
        self.summarizer = summarizer
        self.prompts = prompts or PromptManager()
        self.config = config or TeacherConfig()

    def run(self, scene: SceneDescriptor, context: Mapping[str, Any] | None = None,
            seed: int = 0) -> TeacherResult:
        query_md = self.prompts.decision_query(scene)
        query_av = self.prompts.voting_query(scene)
        allowed = allowed_actions(scene)
        voting = self.voters.cast(scene, query_av, allowed, context or {}, seed)
        failures = list(voting.failures)
        if not voting.ballots:
            return TeacherResult(False, query_md, None, [], "", "", voting, failures,
                                 reason=f"no voter produced a valid ballot ({voting.dropped_voters} dropped, "
                                        f"{len(failures)} failures)")
        distribution, notes = aggregate(voting.ballots)
        ranked = ranking(distribution)
        explanations, source = None, "template"
        if self.summarizer is not None:
            explanations = self._summarize(query_av, voting, ranked, failures)
            source = "summary_llm" if explanations is not None else "template"
        if explanations is None:
            codes = answer_codes(distribution, self.config)
            explanations = {c: brief_rationale(scene, c, voting.outcomes.get(c), decisive_object=i == 0)
                            for i, c in enumerate(codes)}
            answer = format_ranked_answer(codes, explanations)
        else:
            answer = format_ranked_answer(ranked, explanations)
        return TeacherResult(True, query_md, distribution, ranked, answer, source, voting, failures, notes=notes)

    def _summarize(self, query_av: str, voting: VotingRecord, ranked: list[str],
                   failures: list[StageFailure]) -> dict[str, str] | None:
        """Stage 3 (Eq. 9): the summariser's explanations if its answer validates, else None."""
        analyses = [(b.vote_text, b.assessment_text) for b in voting.ballots]
        messages = self.prompts.sum_messages(query_av, analyses, ranked)
        try:
            completion = self.summarizer.chat(messages, temperature=0.0, max_tokens=self.config.summary_max_tokens)
            if completion.finish_reason == "length":
                raise MalformedModelOutput("summary", "truncated", "the answer hit the token limit",
                                           completion.text[-160:])
            answer = parse_ranked_answer(completion.text, ranked, kind="summary")
            if answer.ranked != ranked:
                raise MalformedModelOutput("summary", "ranking",
                                           f"ranked {answer.ranked} but Eq. 10 gives {ranked}", completion.text)
        except (LLMError, MalformedModelOutput) as exc:
            failures.append(_failure("summary", None, exc))
            return None
        return answer.explanations
