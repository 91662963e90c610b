"""The decision prompt: rendered with the GGUF's own chat template, split into a shareable prefix.

Layout of the user turn (state first, so every decision about one state shares the same prefix)::

    State:
    <state>

    Question: <question>

    Options:
    A. <option text>
    B. <option text>

The prefix runs to ``Question:``, which every decision shares; the suffix starts with the question.
The fixed instruction goes in the system turn (or, for templates without one, after the options).
User text is tokenized without special-token parsing, so it can never become a control token;
only the template's own scaffolding is tokenized with special tokens enabled.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from semif_adapter.errors import ModelLoadError

PROMPT_VERSION = "semif-decision-v1"

INSTRUCTION = (
    "You are a decision model. Read the state, the question and the labelled options, then reply "
    "with the label of the single best option and nothing else."
)
ANSWER_HINT = "Reply with one option label only."
_SENTINEL = "\u2063SEMIF-USER-CONTENT\u2063"
#: The words every decision about a state begins with: they end the shared prefix (decoded once).
QUESTION_LEAD = "\n\nQuestion:"
_STATE_LEAD = "State:\n"

#: Plain layout for GGUFs without a chat template (base models): the answer follows "Answer:".
PLAIN_TAIL = "\n\nAnswer:"
PLAIN_LABEL_PREFIX = " "


@dataclass(frozen=True)
class Scaffold:
    """The fixed text around the user content, found once per model by rendering a sentinel."""

    head: str  # template text before the user content (tokenized with special tokens)
    tail: str  # template text after it, ending with the generation prompt
    label_prefix: str  # text the answer label starts with ("" after a chat turn, " " after "Answer:")
    instruction_in_user: bool  # template had no system turn: the instruction closes the user content
    uses_chat_template: bool

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(
            "\x00".join([PROMPT_VERSION, self.head, self.tail, self.label_prefix]).encode()
        ).hexdigest()


@dataclass(frozen=True)
class DecisionText:
    """One decision's prompt as text pieces: ``prefix_user`` is shared by decisions on one state (it runs
    to ``Question:``), ``suffix_user`` is the decision's own; the state starts at ``state_at``."""

    prefix_user: str
    suffix_user: str
    state_at: int = 0


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now(timezone.utc).strftime(fmt)


def _render_chat(template: str, messages: list[dict[str, str]], specials: dict[str, str]) -> str:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    compiled = env.from_string(template)
    kwargs: dict[str, Any] = {
        "messages": messages,
        "add_generation_prompt": True,
        "enable_thinking": False,  # Qwen3-style templates close an empty think block
        "tools": None,
        **specials,
    }
    return compiled.render(**kwargs)


def build_scaffold(chat_template: str | None, specials: dict[str, str]) -> Scaffold:
    """Find head/tail of the template once; no template → documented plain layout."""
    if not chat_template:
        return Scaffold(
            head=INSTRUCTION + "\n\n",
            tail=PLAIN_TAIL,
            label_prefix=PLAIN_LABEL_PREFIX,
            instruction_in_user=False,
            uses_chat_template=False,
        )
    attempts: list[tuple[list[dict[str, str]], bool]] = [
        ([{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": _SENTINEL}], False),
        ([{"role": "user", "content": _SENTINEL}], True),
    ]
    errors: list[str] = []
    for messages, instruction_in_user in attempts:
        try:
            rendered = _render_chat(chat_template, messages, specials)
        except jinja2.TemplateError as exc:
            errors.append(str(exc))
            continue
        if rendered.count(_SENTINEL) != 1:
            errors.append("template does not reproduce the user content verbatim")
            continue
        head, tail = rendered.split(_SENTINEL)
        if not instruction_in_user and INSTRUCTION not in head:
            # The template silently dropped the system turn; put the instruction in the user turn.
            continue
        return Scaffold(
            head=head,
            tail=tail,
            label_prefix="",
            instruction_in_user=instruction_in_user,
            uses_chat_template=True,
        )
    raise ModelLoadError("cannot render the GGUF's chat template: " + "; ".join(errors))


def decision_text(
    scaffold: Scaffold, state_text: str, question: str, option_lines: Sequence[tuple[str, str]]
) -> DecisionText:
    """Lay out one decision; ``option_lines`` are (label, shown text) in the caller's order."""
    options = "\n".join(f"{label}. {text}" for label, text in option_lines)
    suffix = f" {question}\n\nOptions:\n{options}"
    if scaffold.instruction_in_user:
        suffix += f"\n\n{INSTRUCTION}"
    elif scaffold.uses_chat_template:
        suffix += f"\n\n{ANSWER_HINT}"
    return DecisionText(
        prefix_user=f"{_STATE_LEAD}{state_text}{QUESTION_LEAD}", suffix_user=suffix, state_at=len(_STATE_LEAD)
    )


class PromptHasher:
    """sha256 of the exact token ids a decision saw; the shared prefix is hashed once per request."""

    def __init__(self, prefix_tokens: Sequence[int]) -> None:
        self._prefix = hashlib.sha256(PROMPT_VERSION.encode())
        self._prefix.update(b"\x00")
        self._prefix.update(",".join(map(str, prefix_tokens)).encode())

    def hexdigest(self, suffix_tokens: Sequence[int]) -> str:
        digest = self._prefix.copy()
        digest.update(b"|")
        digest.update(",".join(map(str, suffix_tokens)).encode())
        return digest.hexdigest()
