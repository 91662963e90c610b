"""Option labels: ``A``…``Z`` then two-letter labels that the vocabulary encodes as ONE token.

Each label is read from the logit of exactly one token, so a label must be a single token, distinct
from the others, and appending it after the prompt's last text must add exactly that token (else the
model would be scored on a token it would never emit there). All of this is verified once per model.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from dataclasses import dataclass

from semif_adapter.errors import DecisionValidationError, ModelLoadError

MAX_LABELS = 255

Tokenize = Callable[[str, bool], list[int]]


def candidate_labels() -> list[str]:
    letters = string.ascii_uppercase
    return list(letters) + [a + b for a in letters for b in letters]


@dataclass(frozen=True)
class LabelSet:
    labels: tuple[str, ...]
    token_ids: tuple[int, ...]

    @property
    def capacity(self) -> int:
        return len(self.labels)

    def take(self, n_options: int, loc: tuple[str | int, ...] = ("options",)) -> tuple[list[str], list[int]]:
        """Labels for ``n_options`` options, or a validation error before any scoring."""
        if n_options > self.capacity:
            raise DecisionValidationError(
                f"{n_options} options requested but this model supplies only {self.capacity} "
                "single-token labels",
                loc=loc,
            )
        return list(self.labels[:n_options]), list(self.token_ids[:n_options])


def build_label_set(tokenize: Tokenize, tail: str, label_prefix: str, wanted: int = MAX_LABELS) -> LabelSet:
    """Pick and verify up to ``wanted`` labels for a model whose prompt ends with ``tail``."""
    tail_tokens = tokenize(tail, True)
    labels: list[str] = []
    ids: list[int] = []
    seen: set[int] = set()
    for label in candidate_labels():
        if len(labels) == wanted:
            break
        pieces = tokenize(label_prefix + label, False)
        if len(pieces) != 1 or pieces[0] in seen:
            continue
        if tokenize(tail + label_prefix + label, True) != [*tail_tokens, pieces[0]]:
            continue  # label would merge with the prompt's last token
        labels.append(label)
        ids.append(pieces[0])
        seen.add(pieces[0])
    if len(labels) < 2:
        raise ModelLoadError(
            f"the model's vocabulary supplies only {len(labels)} single-token option labels; need at least 2"
        )
    return LabelSet(labels=tuple(labels), token_ids=tuple(ids))
