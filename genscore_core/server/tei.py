"""Hugging Face Text Embeddings Inference's rerank dialect: ``POST /rerank {"query", "texts"}``.

TEI answers a bare list ``[{"index", "score", "text"?}]``, best first, with no usage. genscore's
``/rerank`` takes both this body and Cohere's: a body with ``texts`` and no ``documents`` is TEI's
(:func:`rerank_dialect`). Clients: LlamaIndex's ``TextEmbeddingInference`` postprocessor, dify,
Continue, ragflow.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, StrictBool, StrictStr, Tag

from genscore_core.errors import InvalidRequestError
from genscore_core.server.schemas import RequestBody
from genscore_core.server.served import (
    Served,
    errors_renamed,
    logit_of,
    refuse_truncated,
    request_instruction,
)

TEI_TAG = "TEI rerank body"
COHERE_TAG = "Cohere/Jina/vLLM rerank body"


def rerank_dialect(body: Any) -> str:
    """Which rerank body ``body`` is: TEI's when it has ``texts`` and no ``documents``, else Cohere's
    (whose validation then names what is missing)."""
    if isinstance(body, dict) and "texts" in body and "documents" not in body:
        return TEI_TAG
    return COHERE_TAG


def rerank_body_type(cohere: type[BaseModel]) -> Any:
    """The body of ``/rerank``: ``cohere`` (the server's Cohere-shaped body) or TEI's, told apart by
    :func:`rerank_dialect` before either is validated, so that an error names one body's fields."""
    return Annotated[
        Annotated[cohere, Tag(COHERE_TAG)] | Annotated[TeiRerankRequest, Tag(TEI_TAG)],
        Discriminator(rerank_dialect),
    ]


class TeiRerankRequest(RequestBody):
    """TEI's ``/rerank`` body."""

    request_name = "TEI rerank"

    query: StrictStr
    texts: list[StrictStr]
    raw_scores: StrictBool = False
    """Answer the logit (:func:`~genscore_core.server.served.logit_of`) instead of the score."""
    return_text: StrictBool = False
    """Put each text in its result."""
    truncate: StrictBool | None = None
    """``false``: refuse a text that does not fit, as TEI does; ``true`` or left out: cut it, as TEI
    started with ``--auto-truncate`` does (genscore cuts the text's end and keeps the template)."""
    truncation_direction: Literal["Right", "Left", "right", "left"] = "Right"
    """Only ``Right`` (the end of the text is cut); ``Left`` is refused."""
    instruction: StrictStr | None = None
    """This request's task instruction, instead of the server's (a genscore extension)."""
    instruct: StrictStr | None = None
    """SGLang's name for ``instruction``."""


class TeiRank(BaseModel):
    index: int
    """Position of the text in the request."""
    score: float
    """The score under the server's score mode, or with ``raw_scores`` its logit."""
    text: str | None = None


async def tei_rerank(served: Served, request: TeiRerankRequest) -> list[TeiRank]:
    """Every text scored, best first (ties in request order)."""
    if request.truncation_direction.lower() == "left":
        raise InvalidRequestError(
            "truncation_direction Left is not supported: genscore cuts the end of a text that does not "
            "fit (Right) and keeps the template's prompt around it",
            param="truncation_direction",
        )
    instruction = request_instruction(request.instruction, request.instruct)
    with errors_renamed("texts"):
        ranked = await served.rerank(request.query, request.texts, instruction=instruction)
        if request.truncate is False:
            refuse_truncated(ranked, "documents", "truncate=false")
    mode = served.score_mode
    return [
        TeiRank(
            index=result.index,
            score=logit_of(result.score, mode) if request.raw_scores else result.score,
            text=result.document if request.return_text else None,
        )
        for result in ranked
    ]
