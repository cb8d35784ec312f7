"""The prompt manager (P_av, P_ca, P_sum, P_md, P_refl) and the strict parsers of model answers."""

from luna_core.prompts.knowledge import (CONFIDENCE_TAG, DECISION_TAG, EXPLANATION_TAG, NORMAL_ANSWER,
                                         RANKED_SEPARATOR, RANKED_TAG)
from luna_core.prompts.compact import compact_query
from luna_core.prompts.manager import Knowledge, Message, PromptManager, allowed_actions, traffic_state_text
from luna_core.prompts.parsers import (MalformedModelOutput, RankedAnswer, ReflectionAnswer, action_set_of,
                                       format_ranked_answer, parse_confidence, parse_ranked_answer,
                                       parse_reflection, parse_summary, parse_vote)

__all__ = [
    "CONFIDENCE_TAG", "DECISION_TAG", "EXPLANATION_TAG", "NORMAL_ANSWER", "RANKED_SEPARATOR", "RANKED_TAG",
    "compact_query", "Knowledge", "Message", "PromptManager", "allowed_actions", "traffic_state_text",
    "MalformedModelOutput", "RankedAnswer", "ReflectionAnswer", "action_set_of", "format_ranked_answer",
    "parse_confidence", "parse_ranked_answer", "parse_reflection", "parse_summary", "parse_vote",
]
