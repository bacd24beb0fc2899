"""vLLM's score dialect: ``POST /score`` and ``/v1/score`` with ``text_1`` and ``text_2``.

As vLLM defines the pairs: each side is a string or a list of strings; one ``text_1`` is scored
against every ``text_2`` (1:1 or 1:N), and N ``text_1`` against N ``text_2`` pairwise (N:N); other
lengths are refused. The answer is vLLM's ``{"id", "object": "list", "created", "model", "data":
[{"index", "object": "score", "score"}], "usage"}``, ``data`` in pair order. ``text_1`` is the query
of the server's template and ``text_2`` the document.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Literal

from fastapi import Depends, FastAPI, Request
from pydantic import BaseModel, Field, StrictInt, StrictStr

from genscore_core.errors import InvalidRequestError, ServerHTTPError
from genscore_core.protocol import ScoreData, UsageInfo
from genscore_core.results import RankedResults
from genscore_core.server.schemas import RequestBody
from genscore_core.server.served import Served, errors_renamed, request_instruction


class ScoreRequest(RequestBody):
    """vLLM's ``/score`` body."""

    request_name = "score"

    model: str | None = None
    text_1: StrictStr | list[StrictStr]
    """The query, or one query per pair."""
    text_2: StrictStr | list[StrictStr]
    """The documents."""
    truncate_prompt_tokens: StrictInt | None = Field(default=None, ge=-1)
    """vLLM's prompt cap: -1, left out, or the server's max_length (all the same: prompts are cut to
    max_length); a larger cap is refused, as vLLM does, and a smaller one too (genscore cuts the
    document, never the template: send a shorter text_2)."""
    instruction: StrictStr | None = None
    """This request's task instruction, instead of the server's (a genscore extension)."""
    instruct: StrictStr | None = None
    """SGLang's name for ``instruction``."""


class ScoreResponse(BaseModel):
    id: str = Field(default_factory=lambda: f"score-{uuid.uuid4().hex[:16]}")
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[ScoreData]
    """One score per pair, in pair order."""
    usage: UsageInfo


def score_pairs(text_1: str | list[str], text_2: str | list[str]) -> list[tuple[str, str]]:
    """The (query, document) pairs of a request, as vLLM pairs ``text_1`` and ``text_2``."""
    queries = [text_1] if isinstance(text_1, str) else text_1
    documents = [text_2] if isinstance(text_2, str) else text_2
    if not queries:
        raise InvalidRequestError("text_1 must hold at least one text", param="text_1")
    if not documents:
        raise InvalidRequestError("text_2 must hold at least one text", param="text_2")
    if len(queries) == 1:
        return [(queries[0], document) for document in documents]
    if len(queries) != len(documents):
        raise InvalidRequestError(
            f"text_1 has {len(queries)} texts and text_2 {len(documents)}: the lengths must be 1:1, 1:N or "
            "N:N (one text_1 for every text_2, or as many of each)",
            param="text_1",
        )
    return list(zip(queries, documents))


async def refuse_sglang_body(request: Request) -> None:
    """A 404 for SGLang's scoring request (``query``, ``items``, ``label_token_ids``), which SGLang takes
    at this same path: not served here, and a client sending it has the wrong server kind set.

    A dependency, so that it answers before the body is validated as vLLM's (a 422 naming ``text_1``
    would not say what to fix). FastAPI has parsed the body already; the parse is cached."""
    body = await request.json()
    if isinstance(body, dict) and "items" in body and "text_1" not in body:
        raise ServerHTTPError(
            404,
            f"{request.url.path} here is vLLM's score API (text_1, text_2); SGLang's scoring request "
            "(query, items, label_token_ids) is not served: send it to /generative_scoring, the generative "
            "scoring protocol (genscore's client: server_kind='genscore')",
        )


def add_score_routes(app: FastAPI, served: Served) -> None:
    async def score(request: ScoreRequest) -> ScoreResponse:
        served.check_model(request.model)
        instruction = request_instruction(request.instruction, request.instruct)
        cap = request.truncate_prompt_tokens
        max_length = served.serving.max_length
        if cap is not None and cap != -1 and cap > max_length:
            # As vLLM refuses it.
            raise InvalidRequestError(
                f"truncate_prompt_tokens={cap} is greater than this server's max_length ({max_length})",
                param="truncate_prompt_tokens",
            )
        if cap is not None and cap != -1 and cap < max_length:
            raise InvalidRequestError(
                f"truncate_prompt_tokens={cap} is below this server's max_length ({max_length}); genscore "
                "truncates the document (text_2) to fit max_length and keeps the template whole, so it "
                "takes -1 or max_length",
                param="truncate_prompt_tokens",
            )
        pairs = score_pairs(request.text_1, request.text_2)
        served.check_items(len(pairs), "text_2")
        # One ranking call per distinct query (1:N is one call); the batcher scores them together.
        positions: dict[str, list[int]] = {}
        for position, (query, _) in enumerate(pairs):
            positions.setdefault(query, []).append(position)

        async def ranked(query: str, at: list[int]) -> RankedResults:
            with errors_renamed("text_2", lambda index: at[index]):
                return await served.rerank(query, [pairs[p][1] for p in at], instruction=instruction)

        answers = await asyncio.gather(*(ranked(query, at) for query, at in positions.items()))
        scores = [0.0] * len(pairs)
        tokens = 0
        for at, answer in zip(positions.values(), answers):
            tokens += answer.prompt_tokens
            for result in answer:
                scores[at[result.index]] = result.score
        return ScoreResponse(
            model=request.model or served.name,
            data=[ScoreData(index=index, score=value) for index, value in enumerate(scores)],
            usage=UsageInfo(prompt_tokens=tokens, total_tokens=tokens),
        )

    for path in ("/score", "/v1/score"):
        app.post(
            path,
            response_model=ScoreResponse,
            responses=served.errors,
            dependencies=[Depends(refuse_sglang_body)],
        )(score)
