"""NVIDIA NIM's ranking dialect: ``POST /v1/ranking``, answered with logits.

The body is ``{"model", "query": {"text"}, "passages": [{"text"}], "truncate"}``; the answer
``{"rankings": [{"index", "logit"}]}``, best first. NIM clients (LlamaIndex's and LangChain's
``NVIDIARerank``) find the model through ``GET /v1/models``, which genscore already serves.
"""

from __future__ import annotations

from typing import Literal

from fastapi import FastAPI
from pydantic import BaseModel, StrictStr

from genscore_core.server.schemas import RequestBody
from genscore_core.server.served import (
    Served,
    errors_renamed,
    logit_of,
    refuse_truncated,
    request_instruction,
)


class NimText(BaseModel):
    text: StrictStr


class NimRankingRequest(RequestBody):
    """NIM's ``/v1/ranking`` body."""

    request_name = "NIM ranking"

    model: str | None = None
    query: NimText
    passages: list[NimText]
    truncate: Literal["NONE", "END"] | None = None
    """``NONE``: refuse a passage that does not fit, as NIM does; ``END`` or left out: cut its end
    (genscore keeps the template's prompt around it)."""
    instruction: StrictStr | None = None
    """This request's task instruction, instead of the server's (a genscore extension)."""
    instruct: StrictStr | None = None
    """SGLang's name for ``instruction``."""


class NimRanking(BaseModel):
    index: int
    """Position of the passage in the request."""
    logit: float
    """The passage's logit (:func:`~genscore_core.server.served.logit_of` of its score)."""


class NimRankingResponse(BaseModel):
    rankings: list[NimRanking]
    """Best first; ties keep request order."""


def add_nim_routes(app: FastAPI, served: Served) -> None:
    @app.post("/v1/ranking", response_model=NimRankingResponse, responses=served.errors)
    async def nim_ranking(request: NimRankingRequest) -> NimRankingResponse:
        served.check_model(request.model)
        instruction = request_instruction(request.instruction, request.instruct)
        passages = [passage.text for passage in request.passages]
        with errors_renamed("passages"):
            ranked = await served.rerank(request.query.text, passages, instruction=instruction)
            if request.truncate == "NONE":
                refuse_truncated(ranked, "documents", "truncate=NONE")
        mode = served.score_mode
        return NimRankingResponse(
            rankings=[NimRanking(index=result.index, logit=logit_of(result.score, mode)) for result in ranked]
        )
