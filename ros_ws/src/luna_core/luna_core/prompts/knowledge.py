"""K: the prior knowledge and instructions of each agent (LUNA-AD Sec. III-A/B, structure of Table II).

The basic concepts (coordinate system B, action space A) are shared verbatim by every prompt; only the
task description and the guideline differ per role, so K_j(B, A) = basics + role text. The texts are the
project's own wording. Answer formats are fixed here and parsed strictly in ``parsers``.
"""

from __future__ import annotations

from luna_core.types import ACTION_CODES

# ---- answer-format tokens (shared with the parsers and the student's explanation prefix) ----------
DECISION_TAG = "Decision:"
CONFIDENCE_TAG = "Confidence:"
RANKED_TAG = "Recommended decisions:"  # u_pref of Eq. 26
RANKED_SEPARATOR = ","  # u_sep of Eq. 26
EXPLANATION_TAG = "Explanations:"
NORMAL_ANSWER = "normal"
HINDSIGHT_TAG = "What each decision would have led to, executed from that moment against what the other road " \
                "users then did:"

# ---- section markers inside a user query: the traffic state is what retrieval embeds -------------
TRAFFIC_STATE_BEGIN = "[Traffic state]"
TRAFFIC_STATE_END = "[End of traffic state]"
ACTION_SET_TAG = "Action set:"

COORDINATE_SYSTEM = (
    "Coordinates: polar, centred on the ego vehicle's bounding box. Distances in m; the line-of-sight "
    "angle in degrees is 0 straight ahead, positive to the left, negative to the right, 180 behind. "
    "Object headings are relative to the ego heading (0 = same direction). Speeds in m/s, box sizes in m. "
    "Lanes are numbered from the left, starting at 1."
)


def action_space_text() -> str:
    """Definition of the action space A = A_lon x A_lat and its two-letter codes."""
    return (
        "Actions: a two-letter code, longitudinal then lateral. Longitudinal: A accelerate, C cruise, "
        "D decelerate, S stop. Lateral: K keep lane, L change to the left lane, R change to the right lane. "
        f"The {len(ACTION_CODES)} codes are {', '.join(ACTION_CODES)} (S only with K). In a junction the "
        "lateral action is K: follow the navigation path. Use only codes from the question's action set."
    )


BASICS = (
    "You assist the decision-making of an automated vehicle (the ego vehicle). Priorities: safety, "
    "traffic rules, progress along the route, comfort.\n" + COORDINATE_SYSTEM + "\n" + action_space_text()
)

ACTION_VOTING = BASICS + "\n\n" + (
    "Task: choose the single best decision for the ego vehicle in the traffic state you are given. "
    "Reason in three explicit steps and write each step under its heading.\n"
    "Step 1 - Scene understanding: describe the road section, the lanes, the traffic light, the "
    "navigation (where given) and how the surrounding traffic moves, and what this means for the ego "
    "vehicle.\n"
    "Step 2 - Key objects: name only the objects that constrain the ego vehicle, for example a vehicle in "
    "the ego lane, a vehicle about to enter the ego lane, a vehicle in the lane the ego vehicle might "
    "move to, vehicles in or close to the junction ahead, a pedestrian or cyclist within 15 m moving "
    "towards the ego path, or a static object blocking the ego path. Refer to objects by their id.\n"
    "Step 3 - Decision: using steps 1 and 2 and common driving sense, pick one decision from the action "
    "set of the question.\n"
    f"End your answer with one last line of exactly this form: {DECISION_TAG} <code>"
)

CONFIDENCE_ASSESSMENT = BASICS + "\n\n" + (
    "Task: you review one driver's reasoning for the traffic state shown. Judge how likely this "
    "reasoning and its decision are correct: check the facts it uses against the traffic state, whether "
    "it overlooks a key object, and whether the decision is safe and sensible. Explain your judgement in "
    "at most three sentences.\n"
    f"End your answer with one last line of exactly this form: {CONFIDENCE_TAG} <number between 0.0 and "
    "1.0>"
)

SUMMARIZATION = BASICS + "\n\n" + (
    "Task: you are given several analyses of the same traffic state, each with a proposed decision. Write "
    "the final recommendation as if it were entirely your own reasoning.\n"
    "- List every proposed decision, ordered exactly as given in the required ranking (most probable "
    "first; the ranking follows Pr(D) = sum_m 1(d_m = D) c_m / sum_m c_m over the proposals d_m and their "
    "reliabilities c_m).\n"
    "- For each decision give its rationale: the key objects (by id, with their distance and motion) and "
    "why this way of driving is advisable.\n"
    "- Do not mention reliabilities, scores or probabilities, and do not mention that there were several "
    "analyses, reviewers or any workflow.\n"
    "Answer format, nothing before it:\n"
    f"{RANKED_TAG} <codes separated by '{RANKED_SEPARATOR}' without spaces>\n"
    f"{EXPLANATION_TAG}\n"
    "- <code>: <rationale>\n"
    "(one line per decision, in the same order, each ending with a full stop)"
)

DECISION_MAKING = BASICS + "\n\n" + (
    "Task: for the traffic state in the question, recommend the plausible decisions from its action set, "
    "most advisable first, and explain each with the key objects and the reason.\n"
    # The student's queries are compact (luna_core.prompts.compact): units and the object layout live here.
    "Numbers in the traffic state carry no units: m, m/s, m/s^2 and degrees. Each object line reads: id "
    "type, relation: distance,line-of-sight angle,heading,speed,length x width (static objects: no "
    "speed).\n"
    "Answer format:\n"
    f"{RANKED_TAG} <codes separated by '{RANKED_SEPARATOR}'>\n"
    f"{EXPLANATION_TAG}\n"
    "- <code>: <rationale>"
)

# The student's brief prompt form (``StudentConfig.prompt_form``, luna_core.prompts.compact.brief_query) says
# this once in its system message, whose KV cache is reused, instead of in every traffic state.
BRIEF_FORM = (
    "The traffic states are brief: the ego line reads speed,acceleration; 'Recent' lists "
    "the last decisions; a traffic light or navigation line is there only when there is one; only the "
    "nearest objects are listed, and in an example also those its answer names."
)

# The rounded form (``prompts.compact.rounded_query``) adds this to BRIEF_FORM.
ROUNDED_FORM = BRIEF_FORM + (" Object lines give distances, speeds and sizes in whole metres and m/s; the action "
                             "set, the recent decisions and the traffic light come before the ego line.")

REFLECTION = BASICS + "\n\n" + (
    "Task: you are shown a driving question, the answer that was given to it, and what happened after the "
    "first recommended decision was executed. Check the answer for mistakes such as wrong priorities, "
    "overlooked objects or rationales that do not hold, and write a corrected answer.\n"
    f"- If nothing collided and the cautious driving in the answer is justified, reply exactly "
    f"'{NORMAL_ANSWER}' and nothing else.\n"
    "- Otherwise reply with a corrected answer in exactly the same format and structure as the original "
    "answer.\n"
    "- Do not mention the earlier answer, its author, or that this is a review.\n"
    "- Use only decisions from the action set of the original question.\n"
    "- When you are told what each decision would have led to, rank first the decision named as the best "
    "one, list no decision that collides, and name each decision correctly (e.g. CK is Cruise x Lane Keep)."
)
