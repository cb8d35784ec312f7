"""The student's compact form of a decision query Q_md (the user turns of P_md, Eq. 13).

Q_md as stored in the memory bank and published with each decision is the full text of
``PromptManager.decision_query``: readable by people and by the large teacher. The student reads every
token of every retrieved example and of the current query in each forward pass, so its prompt carries
the same facts in fewer tokens (about half): only the traffic state and the action set (the task is in
the system message), no section markers, numbers to 0.1, without units and without the spaces that cost
a token each, and a one-word object header.
The units and the object-line layout are stated once in the decision-making system message, whose KV
cache is reused between calls, so they cost nothing per decision.

Retrieved examples and the current query go through the same function, so the student sees one format
in context and at the decision commitment position, in distillation and at run time alike; it works on
any stored Q_md whatever was collected before this form existed.
"""

from __future__ import annotations

import re
from typing import Callable

from luna_core.prompts import knowledge as K
from luna_core.prompts.parsers import MalformedModelOutput

# Numbers rendered to 0.01 (distances, speeds, sizes) -> 0.1: the student's inputs need no finer grain.
_FINE_NUMBER = re.compile(r"-?\d+\.\d{2,}")
# Units after a number; the system message states them once (m, m/s, m/s^2, degrees).
_UNIT = re.compile(r"(?<=\d) (?:m/s\^2|m/s|m|deg)\b")
# The object header spells out the object-line layout, which the system message also states.
_OBJECT_HEADER = re.compile(r"^Objects \(.*\):$", re.MULTILINE)
_LANE_COUNTING = " counted from the left"  # lanes are numbered from the left in the basic concepts
# The tokenizer spends a token on each space before a digit: numbers in a list go without them.
_LIST_GAP = re.compile(r", (?=-?\d)")
_SIZE_GAP = re.compile(r"(?<=\d) x (?=\d)")
_HEADING_LABEL = re.compile(r"\bheading (?=-?\d)")  # its place in the object line says what it is


def _rounder(digits: int) -> Callable[[re.Match], str]:
    """A ``re.sub`` replacement writing the matched number to ``digits`` decimals (no "-0")."""
    def rounded(match: re.Match) -> str:
        text = f"{float(match.group(0)):.{digits}f}"
        return text.lstrip("-") if float(text) == 0 else text
    return rounded


_TENTH = _rounder(1)


def compact_query(query: str) -> str:
    """The traffic state and the action-set line of a full Q_md, shortened as described above.

    Raises ``MalformedModelOutput`` (kind "query") when ``query`` is not a Q_md (no traffic-state
    section or no action-set line), e.g. a corrupt memory item.
    """
    start = query.find(K.TRAFFIC_STATE_BEGIN)
    end = query.find(K.TRAFFIC_STATE_END)
    if start < 0 or end < start:
        raise MalformedModelOutput("query", "missing", "the query has no traffic-state section", query[:160])
    state = query[start + len(K.TRAFFIC_STATE_BEGIN):end].strip()
    action_lines = [ln.strip() for ln in query[end:].splitlines() if ln.strip().startswith(K.ACTION_SET_TAG)]
    if len(action_lines) != 1:
        raise MalformedModelOutput("query", "missing", f"the query must state one {K.ACTION_SET_TAG!r} line",
                                   query[-160:])
    state = _OBJECT_HEADER.sub("Objects:", state).replace(_LANE_COUNTING, "")
    state = _UNIT.sub("", _FINE_NUMBER.sub(_TENTH, state))
    state = _LIST_GAP.sub(",", _SIZE_GAP.sub("x", _HEADING_LABEL.sub("", state)))
    # Codes separated by spaces: "CK,DK" splits into more tokens than "CK DK".
    codes = action_lines[0][len(K.ACTION_SET_TAG):].replace(",", " ").split()
    return f"{state}\n{K.ACTION_SET_TAG} {' '.join(codes)}"


# The brief form (``brief_query``): the compact form's fixed words that the system message's BRIEF_FORM
# states once. Applied line by line to a compact traffic state.
_BRIEF_DROPPED = ("Traffic light: None.", "Navigation: None.")
_BRIEF_EGO = re.compile(r"^Ego: speed (\S+), acceleration (\S+), length (\S+), width (\S+)\.$")
_BRIEF_RECENT = "Recent decisions: "


def _brief_line(line: str) -> str | None:
    if line in _BRIEF_DROPPED:
        return None
    ego = _BRIEF_EGO.match(line)
    if ego:
        return f"Ego: {ego[1]},{ego[2]}."  # the ego's size is the vehicle's, the same in every decision
    if line.startswith(_BRIEF_RECENT):
        return "Recent: " + line[len(_BRIEF_RECENT):].replace(", ", " ")
    return line.replace("Road section: ", "Road: ", 1).replace(", ego in lane ", ", ego ", 1)


def brief_query(compact: str) -> str:
    """The student's brief form of a compact query (``compact_query``): no "None" traffic-light and
    navigation lines, the ego line's speed and acceleration without their names (not the ego's size, which
    does not change), "Recent:" for the recent decisions. The other facts are the compact form's; the
    words it drops are stated once in ``knowledge.BRIEF_FORM``. Which objects are listed is the caller's
    choice (``student.context``)."""
    return "\n".join(out for out in map(_brief_line, compact.split("\n")) if out is not None)


# The rounded form: the object lines' decimals cost a token per digit and the point, and a decision needs
# no object's distance, speed or size to 0.1 (the ego line keeps its 0.1: acceleration is small).
_OBJECT_LINE = re.compile(r"^(- [^:]*: )(.*)$")
_DECIMAL = re.compile(r"-?\d+\.\d+")
_WHOLE = _rounder(0)


# Lines that change from one decision to the next less often than the ego's, which the rounded form puts
# before it: a decision computes only what follows the first line that differs from the previous prompt's.
_BEFORE_EGO = (K.ACTION_SET_TAG, "Recent:", "Traffic light:")


def rounded_query(compact: str) -> str:
    """The brief form (``brief_query``) with every number of an object line in whole units (m, m/s, deg):
    about a third of an object line's tokens are digits. The action set, the recent decisions and the
    traffic light come before the ego line (in that order, the steadiest first), not after the objects."""
    lines = [(m[1] + _DECIMAL.sub(_WHOLE, m[2])) if (m := _OBJECT_LINE.match(line)) else line
             for line in brief_query(compact).split("\n")]
    moved = [line for tag in _BEFORE_EGO for line in lines if line.startswith(tag)]
    rest = [line for line in lines if line not in moved]
    ego = next((i for i, line in enumerate(rest) if line.startswith("Ego:")), len(rest))
    return "\n".join(rest[:ego] + moved + rest[ego:])
