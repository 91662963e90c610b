"""Where a prefix is cut into ``llama_decode`` chunks: a function of the prompt alone.

The chunk a token is decoded in changes its numbers (the CPU kernels tile rows and attention cells by
chunk), so every prefill of one prompt (cold, warm, cache on or off) uses the same cuts, and a saved
state is reusable at a cut two prompts share with the same cuts before it. A prefix is decoded as
``[0, c1), [c1, c2), ..., [ck, n)``; the state at ``ck`` is what the prefix cache files.

* **head**: the template's own text before the user content (system prompt, turn markers) is the same
  for every request, so it ends a chunk of its own; its state is kept for good (``PrefixCache.pin``)
  and no cold request decodes it again.
* **blocks** (plain-text states): fixed blocks of ``block`` tokens from position 0, up to the state's
  last letter or digit (``stable_end``): a cut in the prompt's trailer would save a state the next turn
  cannot use, and where a state cannot be cut back that turn would start cold. A transcript that grew
  reuses its whole blocks and decodes the partial last block again.
* **events** (the state is a compact JSON array of at least two elements: an agent's transcript of
  messages or tool events): blocks up to the last whole block before the last element's end, then a
  cut after each element past it. An element ends at an *anchor*, the token boundary after its last
  letter or digit (the closing ``"}`` merges with the next separator in the tokenizer, so that is the
  last place a transcript and its grown successor tokenize alike). A cold prefill decodes whole blocks
  (what llama.cpp decodes fastest) and only the last partial block element by element; the next turn,
  which appends an element, shares every cut and decodes only the new element. When the new element
  crosses a block boundary, the blocks it completes and its part past them are decoded again (as a
  plain-text transcript does at every turn). That turn resumes at the last block before the element
  cuts: attention-only memory cuts the saved state back to it; memory that cannot (recurrent, hybrid, a
  sliding window shorter than the state) has a second state saved there (``PrefixCache.checkpoint``).
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Callable, Sequence
from itertools import pairwise

#: Chunk ends inside a prefix, ascending, each in ``(0, n]``; the state at the last one is saved.
Cuts = tuple[int, ...]


def head_cuts(head: int, block: int) -> Cuts:
    """The cuts up to the head's end: whole blocks inside it, then the head's end (none without a head)."""
    return (*range(block, head, block), head) if head > 0 else ()


def block_cuts(n_tokens: int, block: int, head: int = 0, limit: int | None = None) -> Cuts:
    """The block rule: the head's end (when ``0 < head < n_tokens``) among every whole block from 0 up to
    ``limit`` (default: ``n_tokens``)."""
    last = n_tokens if limit is None else min(limit, n_tokens)
    blocks = range(block, last // block * block + 1, block)
    if not 0 < head < n_tokens:
        return tuple(blocks)
    return tuple(sorted({head, *blocks}))


def element_spans(state_text: str) -> list[tuple[int, int]] | None:
    """Character spans of a compact JSON array's elements, or None when the text is not exactly one.

    Only text equal to its own compact rendering qualifies (what a JSON-array state renders to), so the
    rule depends on the text alone: the same text sent as a string or as an array is cut alike.
    """
    if len(state_text) < 2 or state_text[0] != "[" or state_text[-1] != "]":
        return None
    try:
        parsed = json.loads(state_text)
    except ValueError:
        return None
    if not isinstance(parsed, list):
        return None
    spans: list[tuple[int, int]] = []
    position = 1
    for element in parsed:
        text = json.dumps(element, ensure_ascii=False, separators=(",", ":"))
        if state_text[position : position + len(text)] != text:
            return None
        spans.append((position, position + len(text)))
        position += len(text) + 1
    if position != len(state_text) + (0 if parsed else 1):
        return None
    return spans


def token_ends(text: str, tokens: Sequence[int], token_bytes: Callable[[int], int]) -> list[int] | None:
    """Each token's end as a byte offset into ``text``, or None when the tokens do not spell it byte for
    byte (a tokenizer that adds a leading space, say): then only the plain block rule applies."""
    ends: list[int] = []
    total = 0
    for token in tokens:
        total += token_bytes(token)
        ends.append(total)
    return ends if total == len(text.encode("utf-8")) else None


def event_anchors(prefix_user: str, state_at: int, state_text: str, ends: Sequence[int]) -> list[int] | None:
    """Token positions (within the tokens of ``prefix_user``, ending at byte offsets ``ends``) after each
    element's last letter or digit of the state that starts at character ``state_at``, or None."""
    spans = element_spans(state_text)
    if spans is None or len(spans) < 2 or prefix_user[state_at : state_at + len(state_text)] != state_text:
        return None
    anchors: list[int] = []
    char_at, byte_at = state_at, len(prefix_user[:state_at].encode("utf-8"))
    for start, end in spans:
        keep = _alnum_end(state_text[start:end])
        if not keep:
            continue
        byte_end = byte_at + len(prefix_user[char_at : state_at + start + keep].encode("utf-8"))
        char_at, byte_at = state_at + start + keep, byte_end
        anchor = bisect_right(ends, byte_end)
        if anchor and (not anchors or anchor > anchors[-1]):
            anchors.append(anchor)
    return anchors


def stable_end(prefix_user: str, state_at: int, state_text: str, ends: Sequence[int]) -> int | None:
    """Token position (within the tokens of ``prefix_user``, ending at byte offsets ``ends``) after the
    state's last letter or digit, or None.

    A state that grows at its end (a transcript, a log) keeps every token before that point in its next
    prompt; the tokens after it (closing punctuation merged with the text that follows, ``Question:``)
    change. The block rule cuts no further, so the state it saves is one the next turn can use whole.
    """
    keep = _alnum_end(state_text)
    if not keep or prefix_user[state_at : state_at + len(state_text)] != state_text:
        return None
    return bisect_right(ends, len(prefix_user[: state_at + keep].encode("utf-8")))


def _alnum_end(text: str) -> int:
    """Characters of ``text`` up to its last letter or digit (0: none)."""
    keep = len(text)
    while keep and not text[keep - 1].isalnum():
        keep -= 1
    return keep


def event_cuts(anchors: Sequence[int], n_tokens: int, block: int, head: int = 0) -> Cuts:
    """The event rule over prefix positions ``anchors``: the block rule up to the last anchor, then one
    cut per anchor after the last block."""
    inside = [a for a in anchors if 0 < a < n_tokens]
    if not inside:
        return block_cuts(n_tokens, block, head)
    blocks = block_cuts(n_tokens, block, head, limit=inside[-1])
    last = blocks[-1] if blocks else 0
    return (*blocks, *(a for a in inside if a > last))


def chunks(cuts: Cuts, start: int, end: int) -> list[tuple[int, int]]:
    """The ``[a, b)`` chunks between ``start`` (a cut or 0) and ``end`` (a cut)."""
    points = [start, *(c for c in cuts if start < c <= end)]
    return list(pairwise(points))


def shared_cut(a: Sequence[int], a_cuts: Cuts, b: Sequence[int], b_cuts: Cuts) -> int:
    """The furthest cut ``a`` and ``b`` share, with equal tokens and the same cuts before it (0: none)."""
    best = 0
    for x, y in zip(a_cuts, b_cuts, strict=False):
        if x != y or x > len(a) or x > len(b) or a[best:x] != b[best:x]:
            break
        best = x
    return best
