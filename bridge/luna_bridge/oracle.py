"""Oracle decision sources: the simulation-grounded teacher deciding from the closed-loop state.

``luna-oracle`` decides every T_d like the student would, but with the teacher's machinery
(``action_scorer``): the allowed actions of the current scene (xi_t's action mask) are executed from
the *current closed-loop* ego state against the scenario's logged agents for 6 s (IDM along each
action's reference lane, LQR + bicycle, PDM-style score x J_dec), and M scored voters turn the outcomes
into the Eq. 10 distribution, exactly as ``luna-offline collect`` labels a frame. It sees the logged
future, which no onboard student can, so its row in a results table is an upper bound for any student
distilled from that teacher: it separates "the planner cannot use good decisions" from "the student
is weak". ``luna-onehot-oracle`` issues its argmax with probability 1 (C_t = {a*}).

``luna-oracle-cv`` is the same machinery on what the planner sees instead of the log
(``privileged=False``): the perceived objects of the planner input run on at their present velocity
(the planner's own constant-velocity forecast), the lights keep their present state, and no expert
progress is known (no making-progress multiplier). It uses nothing an onboard policy lacks, so the gap
between it and ``luna-oracle`` is what the logged future is worth: a student of this teacher cannot be
expected to close it from the present scene alone.

In reactive runs the agents follow IDM and leave their logs; the oracle still scores against the logs,
so its reactive rows are an upper bound only in the non-reactive sense.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from luna_core.prompts import allowed_actions
from luna_core.teacher import ScoredVoterPool, TeacherConfig, aggregate, derive_seed
from luna_core.types import ACTION_CODES, DecisionDistribution, PlannerInput, SceneDescriptor, candidate_set

from luna_bridge.action_scorer import SimulationActionScorer
from luna_bridge.reflection_round import SceneDecisionSource
from luna_bridge.scenario import Scenario


class _ScenarioScorer:
    """``luna_core.teacher.ActionScorer`` for one decision: the run's scenario from a given ego state
    (``privileged``), or only what the planner input holds (module docstring)."""

    def __init__(self, scorer: SimulationActionScorer, scenario: Scenario, planner_input: PlannerInput,
                 privileged: bool = True) -> None:
        self.scorer, self.scenario, self.planner_input = scorer, scenario, planner_input
        self.privileged = privileged

    def score(self, scene: SceneDescriptor, context: Any, actions: list[str]) -> dict:
        pin = self.planner_input
        if self.privileged:
            return self.scorer.score_scenario(self.scenario, pin.time, actions, ego=pin.ego)
        return self.scorer.score_present(pin, actions, where=self.scenario.name)


class OracleDecisionSource(SceneDecisionSource):
    """The teacher's Eq. 10 distribution for the closed-loop state (module docstring)."""

    def __init__(self, scenario: Scenario, gamma_p: float = 0.1, one_hot: bool = False,
                 teacher: TeacherConfig | None = None, privileged: bool = True) -> None:
        super().__init__(heuristic=None)
        self.scenario = scenario
        self.gamma_p = gamma_p
        self.one_hot = one_hot
        self.privileged = privileged
        self.teacher = teacher or TeacherConfig()
        self.scorer = SimulationActionScorer()

    def reset(self) -> None:
        self.decisions.clear()
        self.scenes.clear()
        self.scene_errors.clear()

    def decision_for(self, scene: SceneDescriptor, planner_input: PlannerInput) -> DecisionDistribution | None:
        voters = ScoredVoterPool(_ScenarioScorer(self.scorer, self.scenario, planner_input, self.privileged),
                                 self.teacher)
        seed = derive_seed(self.scenario.name, round(planner_input.time, 3))
        record = voters.cast(scene, "", allowed_actions(scene), {}, seed)
        if not record.ballots:  # the scorer could not run here (e.g. off the map): no decision
            reasons = "; ".join(f.reason for f in record.failures) or "no ballot"
            self.scene_errors.append(f"t={planner_input.time:.1f}s: oracle: {reasons}")
            return None
        p, _ = aggregate(record.ballots)
        if self.one_hot:
            top = int(np.argmax(p))
            p = np.zeros_like(p)
            p[top] = 1.0
            chosen = [ACTION_CODES[top]]
        else:
            chosen = candidate_set(p, self.gamma_p)
        return DecisionDistribution(stamp=planner_input.time, probabilities=p, candidate_set=chosen,
                                    scene_stamp=scene.stamp)
