"""The prompt manager: the mappings P_av, P_ca, P_sum, P_md, P_refl of LUNA-AD Eq. 1-3, 5, 7, 9, 11, 29.

Each mapping reads only its dependency set D_j over the five input sources: K (``Knowledge``), S_traf
(the scene descriptor xi_t), S_fail (a ``FailureEvent``), F (answers of other agents) and Q (queries of
earlier mappings). Queries are user texts; chat prompts are lists of {"role", "content"} messages whose
system message carries K_j(B, A).

A user query always holds the traffic state between ``TRAFFIC_STATE_BEGIN`` / ``TRAFFIC_STATE_END``
(the part retrieval embeds) followed by one ``Action set:`` line (the only decisions allowed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from luna_core.prompts import knowledge as K
from luna_core.prompts.compact import compact_query
from luna_core.prompts.parsers import MalformedModelOutput
from luna_core.scene import render_traffic_state, safe_id
from luna_core.types import ACTION_CODES, FailureEvent, MemoryItem, SceneDescriptor

Message = dict[str, str]


@dataclass(frozen=True)
class Knowledge:
    """K_j(B, A) for each task; override to change the instruction texts (e.g. from configuration)."""

    action_voting: str = K.ACTION_VOTING
    confidence_assessment: str = K.CONFIDENCE_ASSESSMENT
    summarization: str = K.SUMMARIZATION
    decision_making: str = K.DECISION_MAKING
    reflection: str = K.REFLECTION


def allowed_actions(scene: SceneDescriptor) -> list[str]:
    """The action set of a scene: the 10 codes minus those masked (no lane there, or in a junction)."""
    mask = scene.action_mask()
    return [code for code, ok in zip(ACTION_CODES, mask) if ok]


def traffic_state_text(query: str) -> str:
    """The traffic-state part of a query (what the memory bank embeds for retrieval)."""
    start = query.find(K.TRAFFIC_STATE_BEGIN)
    end = query.find(K.TRAFFIC_STATE_END)
    if start < 0 or end < start:
        raise MalformedModelOutput("query", "missing", "the query has no traffic-state section",
                                   query[:160])
    return query[start + len(K.TRAFFIC_STATE_BEGIN):end].strip()


def _msg(role: str, content: str) -> Message:
    return {"role": role, "content": content}


class PromptManager:
    def __init__(self, knowledge: Knowledge | None = None) -> None:
        self.knowledge = knowledge or Knowledge()

    # ---- S_traf -> the shared question body ------------------------------------------------------
    @staticmethod
    def scene_question(scene: SceneDescriptor) -> str:
        return (f"{K.TRAFFIC_STATE_BEGIN}\n{render_traffic_state(scene)}\n{K.TRAFFIC_STATE_END}\n"
                f"{K.ACTION_SET_TAG} {', '.join(allowed_actions(scene))}")

    traffic_state_text = staticmethod(traffic_state_text)

    # ---- P_md (Eq. 11, 13, 26) -----------------------------------------------------------------
    def decision_query(self, scene: SceneDescriptor) -> str:
        """Q_md user text (Eq. 11); K_md is carried by the system message of ``md_messages``."""
        return self.scene_question(scene) + "\nWhich decisions do you recommend?"

    def md_messages(self, query: str, examples: Sequence[MemoryItem] = ()) -> list[Message]:
        """Eq. 13: K retrieved [Q_md || A_sum] examples as earlier turns, then the current query last.

        Every Q_md goes into the prompt in the student's compact form (``compact_query``); an example
        whose stored query is not a Q_md raises ``MalformedModelOutput``.

        The decision commitment position is the last prompt token after the chat template's
        generation prompt (``add_generation_prompt=True``).
        """
        messages = [_msg("system", self.knowledge.decision_making)]
        for item in examples:
            messages += [_msg("user", compact_query(item.query)), _msg("assistant", item.answer.strip())]
        messages.append(_msg("user", compact_query(query)))
        return messages

    @staticmethod
    def explanation_prefix(ranked_codes: Sequence[str]) -> str:
        """Delta A_md of Eq. 26: u_pref, the probability-ranked codes joined by u_sep, and a newline, so
        that generation continues with the ``Explanations:`` line of the answer format."""
        bad = [c for c in ranked_codes if c not in ACTION_CODES]
        if bad or not ranked_codes:
            raise ValueError(f"explanation prefix needs valid action codes, got {list(ranked_codes)!r}")
        return f"{K.RANKED_TAG} {K.RANKED_SEPARATOR.join(ranked_codes)}\n"

    # ---- P_av (Eq. 5) ----------------------------------------------------------------------------
    def voting_query(self, scene: SceneDescriptor) -> str:
        """Q_av user text."""
        return (self.scene_question(scene)
                + "\nFollow the three steps, then state your decision.")

    def av_messages(self, query_av: str) -> list[Message]:
        return [_msg("system", self.knowledge.action_voting), _msg("user", query_av)]

    # ---- P_ca (Eq. 7): one voter's answer, in isolation -----------------------------------------
    def ca_messages(self, query_av: str, answer_av: str) -> list[Message]:
        body = (f"Question given to the driver:\n{query_av}\n\n"
                f"The driver's answer:\n{answer_av.strip()}\n\n"
                "How likely is this reasoning and its decision to be correct? Judge briefly, then give "
                f"the last line '{K.CONFIDENCE_TAG} <0.0 to 1.0>'.")
        return [_msg("system", self.knowledge.confidence_assessment), _msg("user", body)]

    # ---- P_sum (Eq. 9) ---------------------------------------------------------------------------
    def sum_messages(self, query_av: str, analyses: Sequence[tuple[str, str]],
                     ranking: Sequence[str]) -> list[Message]:
        """``analyses``: (A_av, A_ca) per surviving voter; ``ranking``: the codes ordered by Eq. 10."""
        parts = [f"Traffic state and question:\n{query_av}\n"]
        for i, (answer_av, answer_ca) in enumerate(analyses, start=1):
            parts.append(f"Analysis {i}:\n{answer_av.strip()}\nReview of analysis {i}:\n{answer_ca.strip()}\n")
        parts.append(f"Required ranking: {K.RANKED_SEPARATOR.join(ranking)}\n"
                     "Write the final recommendation in the answer format.")
        return [_msg("system", self.knowledge.summarization), _msg("user", "\n".join(parts))]

    # ---- P_refl (Eq. 29) -------------------------------------------------------------------------
    @staticmethod
    def failure_text(failure: FailureEvent) -> str:
        """S_fail rendered as the outcome of the executed decision (Eq. 24)."""
        issued = failure.issued_decision or "no decision"
        outcome = []
        if failure.collision:
            outcome.append(f"the ego vehicle collided with object(s) {', '.join(map(safe_id, failure.colliding_ids))}")
        if failure.near_miss:
            closest = ", ".join(f"{safe_id(i)} ({t:.1f} s)" for i, t in failure.near_misses.items())
            outcome.append(f"the ego vehicle nearly collided: its time to collision with object(s) {closest} "
                           "fell below 1 s")
        if failure.stall:
            outcome.append("the ego vehicle nearly stopped although no red light or obstacle required it, "
                           "so it made no progress")
        if failure.blocked:
            outcome.append(f"the ego vehicle stood behind the stopped object {safe_id(failure.blocked_by)} in its lane "
                           "and made no progress while it did not move")
        if not outcome:
            outcome.append("no collision and no stall occurred")
        return f"Executed decision: {issued}. Outcome: {'; '.join(outcome)}."

    def refl_messages(self, query_md: str, answer_md: str, failure: FailureEvent, hindsight: str = "",
                      best: str = "") -> list[Message]:
        """Q_refl from the original Q_md (without retrieved context), A_md and zeta_t; ``hindsight`` lists
        what each decision would have led to (``luna_core.hindsight``) and ``best`` the decision it
        names, which the corrected answer must rank first."""
        body = (f"Question:\n{query_md}\n\nAnswer given:\n{answer_md.strip()}\n\n"
                f"{self.failure_text(failure)}\n\n")
        if hindsight:
            body += (f"{K.HINDSIGHT_TAG}\n{hindsight.strip()}\n"
                     + (f"The best decision that neither collides nor stalls is {best}: rank it first.\n\n"
                        if best else "\n"))
        body += f"Reply '{K.NORMAL_ANSWER}' or a corrected answer in the same format."
        return [_msg("system", self.knowledge.reflection), _msg("user", body)]
