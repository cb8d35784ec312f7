"""Strict parsers for model answers (M_act, M_conf of Eq. 6-8, the ranked answer of Eq. 25-28, reflection).

Model output is untrusted text. Every parser either returns a fully validated value or raises
``MalformedModelOutput`` naming the response kind, the problem and an excerpt; nothing is guessed.
Two repairs exist for the student's own explanations, whose action set is known: an action named
wrongly after its code ("CK: Cruise x Left Lane-Change") is renamed from the code
(``repair_action_names``), and text cut by the token budget ends at its last complete sentence
(``complete_sentences``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from luna_core.types import ACTION_CODES, Action
from luna_core.prompts.knowledge import (ACTION_SET_TAG, CONFIDENCE_TAG, DECISION_TAG, EXPLANATION_TAG,
                                         NORMAL_ANSWER, RANKED_SEPARATOR, RANKED_TAG)

_EXCERPT_CHARS = 160
# Below this share of ASCII among the letters, an answer is treated as not written in English.
_MIN_ASCII_LETTER_SHARE = 0.9
# Words that reveal the analytical system's internals in a summary (Table II, third row).
_LEAK_WORDS = ("confidence", "agent", "voter", "voting", "reviewer", "assessment")


class MalformedModelOutput(ValueError):
    """A model answer that does not follow the required format.

    ``kind``: the response kind ("vote", "confidence", "summary", "reflection", "query");
    ``problem``: a short machine tag ("empty", "missing", "ambiguous", "unknown_action",
    "masked_action", "action_name", "out_of_range", "language", "truncated", "leak", "format", "ranking",
    "normal_after_collision", "hindsight"); ``reason``: a sentence for people; ``excerpt``: the offending
    text.
    """

    def __init__(self, kind: str, problem: str, reason: str, excerpt: str = "") -> None:
        self.kind = kind
        self.problem = problem
        self.reason = reason
        self.excerpt = excerpt[:_EXCERPT_CHARS]
        super().__init__(f"malformed {kind} output ({problem}): {reason}"
                         + (f" [excerpt: {self.excerpt!r}]" if excerpt else ""))

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "problem": self.problem, "reason": self.reason, "excerpt": self.excerpt}


@dataclass
class RankedAnswer:
    """A parsed answer in the 'Recommended decisions / Explanations' format."""

    ranked: list[str]
    explanations: dict[str, str]
    text: str  # the normalised full answer


@dataclass
class ReflectionAnswer:
    normal: bool
    ranked: list[str] = field(default_factory=list)
    text: str = ""  # the revised answer A_refl ("" when normal)


def _check_text(text: object, kind: str) -> str:
    if not isinstance(text, str):
        raise MalformedModelOutput(kind, "format", f"expected text, got {type(text).__name__}")
    stripped = text.strip()
    if not stripped:
        raise MalformedModelOutput(kind, "empty", "the answer is empty")
    letters = [c for c in stripped if c.isalpha()]
    if letters:
        ascii_share = sum(c.isascii() for c in letters) / len(letters)
        if ascii_share < _MIN_ASCII_LETTER_SHARE:
            raise MalformedModelOutput(kind, "language",
                                       f"only {ascii_share:.0%} of the letters are Latin; answers must be "
                                       "English", stripped)
    return stripped


def _missing_or_truncated(text: str) -> str:
    """An answer without its final line either stops mid-sentence (cut off) or just omits it."""
    return "missing" if text.rstrip()[-1:] in ".!?)\"'*" else "truncated"


def _allowed_set(allowed: Iterable[str] | None) -> tuple[str, ...]:
    if allowed is None:
        return ACTION_CODES
    codes = tuple(allowed)
    unknown = [c for c in codes if c not in ACTION_CODES]
    if unknown or not codes:
        raise ValueError(f"invalid action set {codes!r}")
    return codes


def _check_code(code: str, allowed: tuple[str, ...], kind: str, excerpt: str) -> str:
    if code not in ACTION_CODES:
        raise MalformedModelOutput(kind, "unknown_action",
                                   f"{code!r} is not an action code ({', '.join(ACTION_CODES)})", excerpt)
    if code not in allowed:
        raise MalformedModelOutput(kind, "masked_action",
                                   f"{code} is not in the action set of the question ({', '.join(allowed)})",
                                   excerpt)
    return code


# An action code followed by a name in the notation Xi(a) ("CK: Cruise x Lane Keep", "AK (Accelerate x
# Lane Keep)"): the longitudinal word, "x", then the known lateral names or the next word or two (to
# catch a wrong or cut-off name such as "Decelerate x Lane").
_NAMED_CODE = re.compile(
    r"\b(?P<code>[ACDS][KLR])\b[ \t]*[:(\-\u2013\u2014][ \t]*"
    r"(?P<name>(?i:(?:accelerate|cruise|decelerate|stop)[ \t]*[x\u00d7][ \t]*"
    r"(?:left[ \t]+lane[- \t]?change|right[ \t]+lane[- \t]?change|lane[- \t]?keep|[a-z]+(?:[- \t][a-z]+)?)))")


def _normalised_name(name: str) -> str:
    return re.sub(r"[\s\-\u00d7]+", " ", name.lower().replace("\u00d7", " x ")).strip()


def action_name_errors(text: str) -> list[tuple[str, str]]:
    """(code, name) for every action named wrongly after its code: the name must be the code's
    notation Xi(a) (``types.Action.description``, e.g. CK -> "Cruise x Lane Keep")."""
    errors = []
    for m in _NAMED_CODE.finditer(text):
        code, name = m.group("code"), m.group("name")
        if code in ACTION_CODES and _normalised_name(name) != _normalised_name(Action.from_code(code).description):
            errors.append((code, name))
    return errors


def repair_action_names(text: str) -> tuple[str, int]:
    """Rename every wrongly named action from its code; returns the text and how many were renamed."""
    count = 0

    def fix(m: re.Match) -> str:
        nonlocal count
        code, name = m.group("code"), m.group("name")
        right = Action.from_code(code).description
        if code not in ACTION_CODES or _normalised_name(name) == _normalised_name(right):
            return m.group(0)
        count += 1
        return m.group(0)[:m.start("name") - m.start(0)] + right

    return _NAMED_CODE.sub(fix, text), count


def complete_sentences(text: str, keep: int = 0) -> str:
    """``text`` up to its last complete sentence (a full stop, '!' or '?' at the end or before white
    space: "7.65 m/s" does not end one); the first ``keep`` characters (a prefix that is no sentence,
    e.g. Delta A_md of Eq. 26) are never cut. Unchanged when it already ends a sentence."""
    body = text[keep:].rstrip()
    if not body or body[-1] in ".!?":
        return text[:keep] + body
    ends = [m.end() for m in re.finditer(r"[.!?](?=\s)", body)]
    return text[:keep] + (body[:ends[-1]] if ends else "")


def _tagged_lines(text: str, tag: str) -> list[str]:
    """Values of the lines that start with ``tag`` (case-sensitive, markdown emphasis tolerated)."""
    values = []
    for line in text.splitlines():
        line = line.strip().strip("*#> ").strip()
        if line.startswith(tag):
            values.append(line[len(tag):].strip().strip("*").strip())
    return values


def _agreed_value(text: str, kind: str, tag: str, pattern: str, format_error: str, what: str,
                  convert: Callable[[str], Any] = str) -> tuple[Any, str]:
    """The one value on the lines starting with ``tag``: each must match ``pattern`` (the value is its
    group 1, passed through ``convert``) and all must agree; also the last such line's value (for errors)."""
    values = _tagged_lines(text, tag)
    if not values:
        raise MalformedModelOutput(kind, _missing_or_truncated(text), f"no line starting with {tag!r}",
                                   text[-_EXCERPT_CHARS:])
    found = set()
    for value in values:
        m = re.fullmatch(pattern, value)
        if not m:
            raise MalformedModelOutput(kind, "format", format_error, value)
        found.add(convert(m.group(1)))
    if len(found) > 1:
        raise MalformedModelOutput(kind, "ambiguous", f"conflicting {what} {sorted(found)}", text[-_EXCERPT_CHARS:])
    return found.pop(), values[-1]


def parse_vote(text: str, allowed: Iterable[str] | None = None) -> str:
    """M_act: the action code on the answer's ``Decision:`` line(s); all such lines must agree."""
    kind = "vote"
    text = _check_text(text, kind)
    allowed_codes = _allowed_set(allowed)
    code, last = _agreed_value(text, kind, DECISION_TAG, r"([A-Za-z]{2})\.?",
                               f"{DECISION_TAG} must be followed by one code only", "decisions")
    return _check_code(code, allowed_codes, kind, last)


def parse_confidence(text: str) -> float:
    """M_conf: the number on the answer's ``Confidence:`` line, required to lie in [0, 1]."""
    kind = "confidence"
    text = _check_text(text, kind)
    c, last = _agreed_value(text, kind, CONFIDENCE_TAG, r"([-+]?\d+(?:\.\d+)?|[-+]?\.\d+)\.?",
                            f"{CONFIDENCE_TAG} must be followed by a plain number", "confidences", float)
    if not math.isfinite(c) or not 0.0 <= c <= 1.0:
        raise MalformedModelOutput(kind, "out_of_range", f"confidence {c} is outside [0, 1]", last)
    return c


def parse_ranked_answer(text: str, allowed: Iterable[str] | None = None, kind: str = "summary",
                        check_leaks: bool = True) -> RankedAnswer:
    """Parse 'Recommended decisions: C1,C2,...' then 'Explanations:' with one '- Ci: ...' line per code."""
    text = _check_text(text, kind)
    allowed_codes = _allowed_set(allowed)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    head = lines[0].strip("*# ")
    if not head.startswith(RANKED_TAG):
        raise MalformedModelOutput(kind, "format", f"the answer must start with {RANKED_TAG!r}", lines[0])
    codes_text = head[len(RANKED_TAG):].strip()
    if not re.fullmatch(r"[A-Za-z]{2}(\s*" + re.escape(RANKED_SEPARATOR) + r"\s*[A-Za-z]{2})*", codes_text):
        raise MalformedModelOutput(kind, "format",
                                   f"expected codes separated by {RANKED_SEPARATOR!r} after {RANKED_TAG!r}",
                                   head)
    ranked = [c.strip() for c in codes_text.split(RANKED_SEPARATOR)]
    for code in ranked:
        _check_code(code, allowed_codes, kind, head)
    if len(set(ranked)) != len(ranked):
        raise MalformedModelOutput(kind, "format", "a decision is listed twice", head)
    if len(lines) < 2 or lines[1].strip("*# ") != EXPLANATION_TAG:
        raise MalformedModelOutput(kind, "truncated" if len(lines) < 2 else "format",
                                   f"the second line must be {EXPLANATION_TAG!r}", "\n".join(lines[:2]))
    explanations: dict[str, str] = {}
    current = ""
    for line in lines[2:]:
        m = re.match(r"^[-*]?\s*([A-Za-z]{2})\s*:\s*(.*)$", line)
        if m and m.group(1) in ACTION_CODES:
            current = m.group(1)
            if current not in ranked:
                raise MalformedModelOutput(kind, "format", f"explanation for {current}, which is not ranked",
                                           line)
            if current in explanations:
                raise MalformedModelOutput(kind, "format", f"{current} is explained twice", line)
            explanations[current] = m.group(2).strip()
        elif current:
            explanations[current] = (explanations[current] + " " + line).strip()
        else:
            raise MalformedModelOutput(kind, "format", "explanation lines must start with '- <code>:'", line)
    missing = [c for c in ranked if not explanations.get(c)]
    if missing:
        raise MalformedModelOutput(kind, "truncated" if explanations else "missing",
                                   f"no rationale for {', '.join(missing)}", text[-_EXCERPT_CHARS:])
    if [c for c in explanations] != ranked:
        raise MalformedModelOutput(kind, "format", "rationales are not in the ranked order",
                                   text[-_EXCERPT_CHARS:])
    last = explanations[ranked[-1]]
    if last[-1] not in ".!)\"'":
        raise MalformedModelOutput(kind, "truncated", "the last rationale stops mid-sentence", last)
    wrong = action_name_errors(text)
    if wrong:
        code, name = wrong[0]
        raise MalformedModelOutput(kind, "action_name", f"{code} is named {name!r}; {code} is "
                                   f"{Action.from_code(code).description}", name)
    if check_leaks:
        lowered = text.lower()
        for word in _LEAK_WORDS:
            if re.search(r"\b" + word, lowered):
                raise MalformedModelOutput(kind, "leak", f"the answer mentions {word!r}", text)
    return RankedAnswer(ranked, explanations, format_ranked_answer(ranked, explanations))


def format_ranked_answer(ranked: Sequence[str], explanations: dict[str, str]) -> str:
    """The one canonical text form of a ranked answer (A_sum, A_md, A_refl)."""
    lines = [f"{RANKED_TAG} {RANKED_SEPARATOR.join(ranked)}", EXPLANATION_TAG]
    lines += [f"- {code}: {explanations[code]}" for code in ranked]
    return "\n".join(lines)


def parse_summary(text: str, allowed: Iterable[str] | None = None) -> tuple[list[str], str]:
    """A_sum: (ranked codes, explanation text after the 'Explanations:' line)."""
    answer = parse_ranked_answer(text, allowed, kind="summary")
    return answer.ranked, answer.text.split(EXPLANATION_TAG, 1)[1].strip()


def action_set_of(query: str) -> list[str]:
    """The action set stated in a decision query (the line starting with 'Action set:')."""
    values = _tagged_lines(query, ACTION_SET_TAG)
    if len(values) != 1:
        raise MalformedModelOutput("query", "missing", f"the query must state one {ACTION_SET_TAG!r} line",
                                   query[-_EXCERPT_CHARS:])
    codes = re.findall(r"\b([A-Z]{2})\b", values[0])
    if not codes or any(c not in ACTION_CODES for c in codes):
        raise MalformedModelOutput("query", "format", "the action set lists unknown codes", values[0])
    return codes


def parse_reflection(text: str, original_query: str, collision: bool) -> ReflectionAnswer:
    """A_refl: exactly 'normal' (allowed only without a collision) or a corrected ranked answer whose
    decisions come from the action set of the original question."""
    kind = "reflection"
    stripped = _check_text(text, kind)
    if stripped.strip("'\"`. ").lower() == NORMAL_ANSWER:
        if collision:
            raise MalformedModelOutput(kind, "normal_after_collision",
                                       f"'{NORMAL_ANSWER}' is not allowed after a collision", stripped)
        return ReflectionAnswer(normal=True)
    if re.search(r"\b" + NORMAL_ANSWER + r"\b", stripped.lower()) and RANKED_TAG not in stripped:
        raise MalformedModelOutput(kind, "format", f"say exactly '{NORMAL_ANSWER}' or give a corrected answer",
                                   stripped)
    answer = parse_ranked_answer(stripped, action_set_of(original_query), kind=kind)
    return ReflectionAnswer(normal=False, ranked=answer.ranked, text=answer.text)
