"""The planner: from decisions to the exact tokens a request decodes, and where its prefix is cut.

It owns what the model's template and vocabulary fix once at load (the scaffold around the user
content, the head and tail tokens, the option labels) and turns each request into a plan: the shared
prefix, each decision's suffix and label tokens, and the prefix's cuts (``chunking``). Everything a
caller can get wrong is refused here, before anything is decoded: the schema for direct callers, one
state per request, label capacity, context and token budgets, and oversized states, without tokenizing
all of a multi-megabyte one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from semif_adapter.engine.chunking import Cuts, block_cuts, event_anchors, event_cuts, stable_end, token_ends
from semif_adapter.engine.labels import LabelSet, build_label_set
from semif_adapter.engine.llama_backend import LlamaRuntime
from semif_adapter.engine.prompt import DecisionText, Scaffold, build_scaffold, decision_text
from semif_adapter.errors import DecisionValidationError, TokenBudgetExceeded
from semif_adapter.protocol import Decision, check_decision_count, check_shared_batch
from semif_adapter.settings import EngineSettings

# Oversized-state check: slice length in characters, and tokens a cut may add over the whole text's count.
SLICE_CHARS = 16_384
CUT_ALLOWANCE = 4


@dataclass(frozen=True)
class Planned:
    """A validated decision with its tokens, ready to score."""

    decision: Decision
    labels: list[str]
    label_ids: list[int]
    suffix_tokens: list[int]


class Planner:
    """Renders and tokenizes requests for one model; holds no per-request state."""

    def __init__(self, runtime: LlamaRuntime, settings: EngineSettings) -> None:
        self.runtime = runtime
        self.settings = settings
        specials = {"bos_token": runtime.piece(runtime.bos), "eos_token": runtime.piece(runtime.eos)}
        self.scaffold: Scaffold = build_scaffold(runtime.chat_template(), specials)
        self.head_tokens = runtime.tokenize(self.scaffold.head, True)
        if runtime.add_bos and (not self.head_tokens or self.head_tokens[0] != runtime.bos):
            self.head_tokens.insert(0, runtime.bos)
        self.tail_tokens = runtime.tokenize(self.scaffold.tail, True)
        self.labels: LabelSet = build_label_set(
            runtime.tokenize, self.scaffold.tail, self.scaffold.label_prefix, settings.max_options
        )
        self.block_tokens = min(settings.prefix_block_tokens, runtime.n_batch)
        # the head ends a chunk and its state is pinned (``chunking``)
        self.head_cut = len(self.head_tokens)

    def parse(self, decisions: Sequence[Decision | Mapping[str, Any]]) -> list[Decision]:
        if not isinstance(decisions, Sequence) or isinstance(decisions, (str, bytes)):
            raise DecisionValidationError("decisions must be a list", loc=("decisions",))
        check_decision_count(len(decisions), self.settings.max_decisions)  # before validating any item
        parsed: list[Decision] = []
        for index, item in enumerate(decisions):
            if isinstance(item, Decision):
                parsed.append(item)
                continue
            try:
                parsed.append(Decision.model_validate(item))
            except ValidationError as exc:
                first = exc.errors()[0]
                raise DecisionValidationError(first["msg"], loc=("decisions", index, *first["loc"])) from exc
        check_shared_batch(parsed, self.settings.max_decisions, self.settings.max_options)
        return parsed

    def plan(self, decisions: list[Decision], budget: bool = True) -> tuple[list[int], list[Planned], Cuts]:
        """Tokens, labels and cuts of a request; ``budget=False`` skips the context and token limits
        (the scoring version's reference requests are planned whatever the context size)."""
        tokenize = self.runtime.tokenize
        state_text = decisions[0].state_text
        prefix_text = decision_text(self.scaffold, state_text, "", [])
        if budget:
            self.refuse_oversized(prefix_text.prefix_user)
        user_tokens = tokenize(prefix_text.prefix_user, False)
        prefix_tokens = self.head_tokens + user_tokens
        n_prefix = len(prefix_tokens)
        n_ctx = self.runtime.n_ctx if budget else math.inf
        if n_prefix >= n_ctx:
            raise TokenBudgetExceeded(
                f"the state alone needs {n_prefix} tokens; the context holds {n_ctx}",
                loc=("decisions", 0, "state"),
            )
        planned: list[Planned] = []
        total = n_prefix
        for index, decision in enumerate(decisions):
            labels, label_ids = self.labels.take(len(decision.options), loc=("decisions", index, "options"))
            text = decision_text(
                self.scaffold,
                decision.state_text,
                decision.question,
                [(label, option.shown_text) for label, option in zip(labels, decision.options, strict=True)],
            )
            suffix_tokens = tokenize(text.suffix_user, False) + self.tail_tokens
            needed = n_prefix + len(suffix_tokens)
            if needed > n_ctx:
                raise TokenBudgetExceeded(
                    f"decision needs {needed} tokens ({n_prefix} state + {len(suffix_tokens)} "
                    f"question and options); the context holds {n_ctx}",
                    loc=("decisions", index),
                )
            total += len(suffix_tokens)
            planned.append(Planned(decision, labels, label_ids, suffix_tokens))
        if budget and total > self.settings.max_request_tokens:
            raise TokenBudgetExceeded(
                f"request needs {total} tokens (state once + every decision); "
                f"the limit is {self.settings.max_request_tokens}",
                loc=("decisions",),
            )
        return prefix_tokens, planned, self.cuts_for(prefix_text, state_text, user_tokens)

    def cuts_for(self, text: DecisionText, state_text: str, user_tokens: list[int]) -> Cuts:
        """Where the prefix (the head, then ``user_tokens`` spelling ``text.prefix_user``) is cut
        (``chunking``): a JSON array's elements, or the head and blocks up to the state's end."""
        n_head = len(self.head_tokens)
        n_tokens = n_head + len(user_tokens)
        ends = token_ends(text.prefix_user, user_tokens, self.runtime.token_length)
        if ends is None:  # the tokens do not spell the text byte for byte: plain blocks
            return self.block_cuts(n_tokens)
        if state_text.startswith("["):
            anchors = event_anchors(text.prefix_user, text.state_at, state_text, ends)
            if anchors:
                return event_cuts([n_head + a for a in anchors], n_tokens, self.block_tokens, self.head_cut)
        end = stable_end(text.prefix_user, text.state_at, state_text, ends)
        return self.block_cuts(n_tokens, None if end is None else n_head + end)

    def block_cuts(self, n_tokens: int, limit: int | None = None) -> Cuts:
        return block_cuts(n_tokens, self.block_tokens, self.head_cut, limit)

    def refuse_oversized(self, prefix_user: str) -> None:
        """Refuse a state that cannot fit without tokenizing all of it (a 6 MB state is 2.6 M tokens and
        seconds of engine time): count it in slices cut at a space or comma and stop once the count has passed
        what the context or SEMIF_MAX_REQUEST_TOKENS allows. Slices count a few tokens more than the whole
        text would (a merge across a cut is lost), so CUT_ALLOWANCE tokens a cut are taken off first; a
        state that may fit is tokenized whole as before, so answers never depend on this."""
        if len(prefix_user) <= SLICE_CHARS:
            return
        limit = min(self.runtime.n_ctx - 1, self.settings.max_request_tokens) - len(self.head_tokens)
        counted = cuts = start = 0
        while start < len(prefix_user):
            end = min(len(prefix_user), start + SLICE_CHARS)
            if end < len(prefix_user):
                lo = start + SLICE_CHARS // 2  # cut where a token is unlikely to span: a space or a comma
                cut = max(prefix_user.rfind(mark, lo, end) for mark in (" ", "\n", ","))
                end = cut if cut > start else end
            counted += len(self.runtime.tokenize(prefix_user[start:end], False))
            cuts += 1 if end < len(prefix_user) else 0
            start = end
            if counted - CUT_ALLOWANCE * cuts > limit:
                at_least = counted - CUT_ALLOWANCE * cuts + len(self.head_tokens)
                where = (
                    f"the context holds {self.runtime.n_ctx}"
                    if self.runtime.n_ctx - 1 <= self.settings.max_request_tokens
                    else f"the limit is {self.settings.max_request_tokens} (SEMIF_MAX_REQUEST_TOKENS)"
                )
                raise TokenBudgetExceeded(
                    f"the state alone needs more than {at_least} tokens (counted {start} of "
                    f"{len(prefix_user)} characters, then stopped); {where}",
                    loc=("decisions", 0, "state"),
                )

    def reference_text(self, request: Sequence[Mapping[str, Any]]) -> list[str]:
        """The exact text a request renders to: the template around it, each decision's prompt."""
        scaffold = self.scaffold
        texts = [scaffold.head, scaffold.tail, scaffold.label_prefix]
        for decision in self.parse(request):
            labels = self.labels.take(len(decision.options))[0]
            shown = [(label, o.shown_text) for label, o in zip(labels, decision.options, strict=True)]
            text = decision_text(scaffold, decision.state_text, decision.question, shown)
            texts.append(text.prefix_user + text.suffix_user)
        return texts

    def reference_plan(self, request: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """What a request decodes: the prefix tokens and cuts, each suffix and its label tokens."""
        prefix_tokens, planned, cuts = self.plan(self.parse(request), budget=False)
        return {
            "prefix": prefix_tokens,
            "cuts": list(cuts),
            "suffixes": [p.suffix_tokens for p in planned],
            "labels": [p.label_ids for p in planned],
        }
