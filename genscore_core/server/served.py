"""What every scoring route of ``genscore serve`` shares: the served model's name, the request limits,
and the scorer that answers a request, by the instruction it asks for.

The routes of each client dialect (Cohere, TEI, NIM, vLLM's ``/score``) differ only in their bodies;
each answers through :meth:`~genscore_core.scorer.GenerativeScorer.arerank` of the scorer
:meth:`Served.scorer_for` gives it, so every dialect scores a pair the same way.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from genscore_core.errors import InvalidRequestError, UnknownModelError
from genscore_core.results import RankedResults
from genscore_core.scorer import GenerativeScorer
from genscore_core.server.limits import ServerLimits
from genscore_core.server.metrics import count_usage
from genscore_core.templates import ScoreMode

INSTRUCTED_SCORERS = 64
"""Scorers kept for per-request instructions, least recently used dropped first: each is a prompt
builder (a few token ids), built in about a millisecond on a worker thread when first asked for."""

SATURATED_LOGIT = math.log(2.0**24 - 1)
"""The logit of the largest float32 probability below 1 (1 - 2**-24): what a probability of exactly 1
stands for. A probability computed in float32 tells logits apart only up to about this far."""
SATURATED_NEGATIVE_LOGIT = math.log(2.0**-149)
"""The logit of the smallest positive float32 (2**-149): what a probability of exactly 0 stands for."""


@dataclass
class Served:
    """The served model and the checks every route makes before scoring.

    Args:
        serving: The scorer over the server's batcher, with the server-wide instruction.
        name: The model name answered in responses (``--served-model-name``).
        limits: The server's request limits.
        errors: The OpenAPI entries of the errors a scoring route can answer.
    """

    serving: GenerativeScorer
    name: str
    limits: ServerLimits
    errors: dict[int | str, dict[str, Any]]
    _instructed: OrderedDict[str, GenerativeScorer] = field(
        default_factory=OrderedDict, init=False, repr=False
    )

    @property
    def score_mode(self) -> ScoreMode:
        return self.serving.score_mode

    def check_model(self, requested: str | None) -> None:
        # As vLLM: a request may leave the model out, but one it names must be the one served.
        if requested is not None and requested != self.name:
            raise UnknownModelError(requested, self.name)

    def check_items(self, count: int, param: str) -> None:
        if count > self.limits.max_items_per_request:
            raise InvalidRequestError(
                f"{param} has {count} entries; this server accepts at most "
                f"{self.limits.max_items_per_request} per request (--max-items); split the request",
                param=param,
            )

    async def scorer_for(self, instruction: str | None) -> GenerativeScorer:
        """The scorer writing ``instruction`` into its prompts; the server's own for ``None``.

        Raises:
            InvalidRequestError: The template has no instruction slot (``param="instruction"``).
        """
        if instruction is None:
            return self.serving
        scorer = self._instructed.get(instruction)
        if scorer is None:
            front_end = await asyncio.to_thread(self.serving.front_end.with_instruction, instruction)
            scorer = GenerativeScorer(front_end=front_end, backend=self.serving.backend)
            self._instructed[instruction] = scorer
            while len(self._instructed) > INSTRUCTED_SCORERS:
                self._instructed.popitem(last=False)
        self._instructed.move_to_end(instruction)
        return scorer

    async def rerank(
        self,
        query: str,
        documents: list[str],
        *,
        instruction: str | None = None,
        top_n: int | None = None,
        score_threshold: float | None = None,
        max_tokens_per_doc: int | None = None,
    ) -> RankedResults:
        """``documents`` ranked for ``query`` by the scorer of ``instruction``, within the limits;
        its pairs and prompt tokens counted in ``/metrics`` (:func:`~genscore_core.server.metrics.count_usage`)."""
        count_usage(pairs=len(documents))
        self.check_items(len(documents), "documents")
        scorer = await self.scorer_for(instruction)
        ranked = await scorer.arerank(
            query,
            documents,
            top_n=top_n,
            score_threshold=score_threshold,
            max_tokens_per_doc=max_tokens_per_doc,
            # Chunk mode: a huge document is refused before it is tokenized, not after.
            max_prompt_tokens=self.limits.max_prompt_tokens_per_request,
        )
        count_usage(prompt_tokens=ranked.prompt_tokens)
        return ranked


def request_instruction(instruction: str | None, instruct: str | None) -> str | None:
    """The instruction a request asks for: ``instruction``, or SGLang's name for it, ``instruct``."""
    if instruction is not None and instruct is not None:
        raise InvalidRequestError(
            "send the instruction once, as instruction or as instruct (SGLang's name), not both",
            param="instruct",
        )
    return instruction if instruction is not None else instruct


def refuse_protocol_instruction(body: Any) -> None:
    """A 400 for an instruction sent to the generative scoring protocol, rather than scores made
    without it: the protocol scores raw prompts (query and item as sent), with no template to write
    an instruction in."""
    if isinstance(body, dict):
        for key in ("instruction", "instruct"):
            if key in body:
                raise InvalidRequestError(
                    f"{key}: the generative scoring protocol scores the prompts as sent, with no template "
                    "to write an instruction in; put it in the query, or send the request to /v1/rerank "
                    "or /score, which template it",
                    param=key,
                )


def refuse_truncated(ranked: RankedResults, param: str, option: str) -> None:
    """A 400 naming the first document that had to be cut, for a request that asked for no cutting."""
    cut = sorted(result.index for result in ranked if result.truncated)
    if cut:
        raise InvalidRequestError(
            f"{param}.{cut[0]} does not fit in the prompt (max_length tokens) and {option} asks not to "
            f"truncate it; shorten it, or let the server truncate (its default)",
            param=param,
            index=cut[0],
        )


def logit_of(score: float, mode: ScoreMode) -> float:
    """The logit of a score of ``mode``: a ``logit`` mode's score itself, else ``log(p / (1 - p))``.

    For ``label-softmax`` with two labels that is the model's logit difference ``z_yes - z_no``, and
    for ``logit-sigmoid`` its logit; a probability of exactly 0 or 1 (beyond what float32 tells apart)
    stands for :data:`SATURATED_NEGATIVE_LOGIT` or :data:`SATURATED_LOGIT`.
    """
    if mode == "logit":
        return score
    if score >= 1.0:
        return SATURATED_LOGIT
    if score <= 0.0:
        return SATURATED_NEGATIVE_LOGIT
    return math.log(score) - math.log1p(-score)


@contextmanager
def errors_renamed(field: str, position: Callable[[int], int] | None = None) -> Iterator[None]:
    """Name the request's own field in errors about ``documents``: a dialect that calls them ``texts``
    or ``passages`` gets its name back (and, through ``position``, its own numbering of them)."""
    try:
        yield
    except InvalidRequestError as error:
        if error.param != "documents":
            raise
        index = error.index if error.index is None or position is None else position(error.index)
        message = re.sub(r"\bdocuments\[\d+\]", f"{field}[{index}]", error.message)
        message = re.sub(r"\bdocuments\b", field, message)
        raise InvalidRequestError(message, param=field, index=index) from error
