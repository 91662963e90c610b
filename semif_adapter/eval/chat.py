"""Decision by generation: ask a chat model to reply with one label, then read the label back.

This is the comparison baseline for decision-by-logits (the stock DLC path, or llama-cpp-python's
own server running the same GGUF). The reply is either exactly a label (ignoring case, quotes and
trailing punctuation) or contains exactly one label as a whole word; anything else is invalid, so a
chatty or ambiguous model is not credited with a guess. Probabilities are one-hot on the parsed label.
"""

from __future__ import annotations

import re
from typing import Any

from semif_adapter.eval.mapping import AnswerError, Prediction, render_text, task_options
from semif_adapter.eval.tasks import Task

SYSTEM_PROMPT = (
    "You make one decision about the state you are given. "
    "Answer with exactly one of the allowed labels and nothing else: no explanation, no punctuation."
)
_STRIP = " \t\r\n\"'`*.,:;!()[]{}"


class ChatReplyError(AnswerError):
    """An unusable reply; ``reply`` keeps the text for the report."""

    def __init__(self, message: str, reply: str | None) -> None:
        super().__init__(message)
        self.reply = reply


def build_messages(task: Task) -> list[dict[str, str]]:
    lines = []
    for option in task_options(task):
        description = option["description"]
        lines.append(f"- {option['id']}: {description}" if description else f"- {option['id']}")
    allowed = ", ".join(task.labels)
    user = (
        f"State:\n{render_text(task.state)}\n\n"
        f"Question: {render_text(task.question.instructions)}\n\n"
        f"Options:\n" + "\n".join(lines) + f"\n\nReply with exactly one label from: {allowed}"
    )
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def build_chat_request(task: Task, model: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "messages": build_messages(task),
        "temperature": 0.0,
        "max_tokens": max_tokens,
        "stream": False,
    }


def match_label(reply: str, labels: list[str]) -> int | None:
    """Index of the label the reply names, or None when it names none or several."""
    text = reply.strip().strip(_STRIP).casefold()
    folded = [label.casefold() for label in labels]
    if text in folded:
        return folded.index(text)
    found = {
        i
        for i, label in enumerate(folded)
        if re.search(rf"(?<![\w]){re.escape(label)}(?![\w])", reply.casefold())
    }
    return found.pop() if len(found) == 1 else None


def parse_chat_reply(task: Task, payload: Any) -> Prediction:
    try:
        reply = payload["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError) as exc:
        raise ChatReplyError("response has no choices[0].message.content", None) from exc
    if not isinstance(reply, str):
        raise ChatReplyError("reply content is not text", None)
    index = match_label(reply, task.labels)
    if index is None:
        raise ChatReplyError(f"reply names no single label of {task.labels}", reply)
    probabilities = [0.0] * len(task.labels)
    probabilities[index] = 1.0
    return Prediction(probabilities=probabilities, reply=reply)
