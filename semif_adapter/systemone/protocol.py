"""Wire schema of the Jev-compatible System One API (``POST /v1/systemone``, ``GET /v1/models``).

The field names and shapes follow the public TypeSafe schema so that its clients (the official
``typesafe_sdk`` among them) parse our answers unchanged. Requests are lenient where the schema
allows it (unknown fields are ignored); answers are strict (finite floats, exact option keys).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Text, or structured content (object/array) that the model reads as compact JSON.
Content = str | dict[str, Any] | list[Any]

MIN_CHOICES = 2
MAX_CHOICES = 255
MIN_LEVELS = 2
MAX_LEVELS = 10


class _Lenient(BaseModel):
    """Unknown fields are ignored, so newer clients keep working against this server."""

    model_config = ConfigDict(extra="ignore")


class NoulCriteria(_Lenient):
    true: Content | None = Field(default=None, description="What counts as a yes answer.")
    false: Content | None = Field(default=None, description="What counts as a no answer.")


class NoulQuestion(_Lenient):
    type: Literal["noul"]
    instructions: Content | None = Field(
        default=None, description="The yes/no question or statement to evaluate."
    )
    criteria: NoulCriteria | None = Field(
        default=None, description="What counts as yes (true) and no (false); either may be left out."
    )


class ChoiceQuestion(_Lenient):
    type: Literal["choice"]
    instructions: Content | None = Field(default=None, description="What to decide.")
    criteria: dict[str, Content | None] = Field(
        min_length=MIN_CHOICES,
        max_length=MAX_CHOICES,
        description="Choice names (any non-empty string) and when each applies; null = judge by the name.",
    )

    @field_validator("criteria")
    @classmethod
    def _names_not_empty(cls, criteria: dict[str, Content | None]) -> dict[str, Content | None]:
        if "" in criteria:
            raise ValueError("choice names must be non-empty strings")
        return criteria


class ScoreQuestion(_Lenient):
    type: Literal["score"]
    instructions: Content | None = Field(default=None, description="What to rate.")
    criteria: list[Content] = Field(
        min_length=MIN_LEVELS,
        max_length=MAX_LEVELS,
        description="Ordered level descriptions, lowest first; a level's position is its score.",
    )


class BoxQuestion(_Lenient):
    """Parsed only so it can be refused with a clear message: this server serves text models."""

    type: Literal["box"]
    instructions: Content | None = None


Question = Annotated[NoulQuestion | ChoiceQuestion | ScoreQuestion | BoxQuestion, Field(discriminator="type")]
TextQuestion = NoulQuestion | ChoiceQuestion | ScoreQuestion


class SystemOneRequest(_Lenient):
    model: str = Field(description="Served model name or one of its aliases (see GET /v1/models).")
    state: Content = Field(description="The content every question refers to: text or JSON.")
    questions: dict[str, Question] = Field(
        min_length=1, description="Questions keyed by caller-chosen ids; answers use the same keys."
    )
    assets: dict[str, Any] | None = Field(
        default=None, description="Image assets; refused (422): this server serves text models."
    )


# --- answers -------------------------------------------------------------------------------------


class _Extras(BaseModel):
    """Diagnostics beyond the Jev schema live under ``x_`` keys, which strict clients ignore."""

    x_option_logits: dict[str, float] | None = Field(
        default=None, description="Raw last-position logit of each option's label token."
    )
    x_allowed_token_mass: float | None = Field(
        default=None, description="Full-vocabulary probability mass on the option labels (0-1)."
    )
    x_scoring_version: str | None = Field(
        default=None, description="What fixes the numbers: equal versions, equal answers (see /invocations)."
    )


class NoulAnswer(_Extras):
    type: Literal["noul"] = "noul"
    noul: float = Field(description="Probability of yes / true, 0-1.")


class ChoiceAnswer(_Extras):
    type: Literal["choice"] = "choice"
    choice: str = Field(description="The most probable choice name (first in criteria order on ties).")
    probabilities: dict[str, float] = Field(description="Probability per choice name; sums to 1.")
    confidence: float = Field(description="(n·p_max − 1)/(n − 1): 0 = uniform, 1 = certain.")


class ScoreAnswer(_Extras):
    type: Literal["score"] = "score"
    score: float = Field(description="Expected level: Σ i·p_i.")
    legend: dict[str, Content] = Field(description="Level index (as a string) → the level's criteria.")
    probabilities: dict[str, float] = Field(description="Probability per level index; sums to 1.")
    confidence: float = Field(
        description="max(0, 1 − Σ p_i·|i − k| / D), k = most likely level, D = mean |i − (n−1)/2|."
    )


Answer = Annotated[NoulAnswer | ChoiceAnswer | ScoreAnswer, Field(discriminator="type")]


class Usage(BaseModel):
    input_tokens: int = Field(description="Shared state prefix counted once, plus every question's suffix.")
    output_tokens: int = Field(
        default=0, description="Always 0: answers are read from logits, not generated."
    )


class SystemOneResponse(BaseModel):
    model: str = Field(description="The served model's name (also when an alias was requested).")
    answers: dict[str, Answer]
    usage: Usage


class ModelCard(BaseModel):
    name: str
    description: str
    release_date: str = Field(description="YYYY-MM-DD")


class ModelList(BaseModel):
    models: list[ModelCard]


# --- errors --------------------------------------------------------------------------------------


class ValidationIssue(BaseModel):
    """One entry of FastAPI's 422 ``detail`` list."""

    loc: list[str | int]
    msg: str
    type: str


class HTTPValidationError(BaseModel):
    detail: list[ValidationIssue]


class ErrorDetail(BaseModel):
    error_type: str
    message: str


class ErrorBody(BaseModel):
    """Every non-validation error: ``{"detail": {"error_type", "message"}}``."""

    detail: ErrorDetail
