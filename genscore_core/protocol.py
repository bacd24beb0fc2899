"""Request and response types of the generative scoring protocol (vLLM's ``/generative_scoring``).

Structural problems (a missing field, a wrong type) fail pydantic validation; semantic problems that
need the model (label ids outside the vocabulary) or that the protocol reports as bad requests
(empty items, empty labels) are raised by :func:`check_request` as :class:`InvalidRequestError`, so a
server can answer them with HTTP 400 as the protocol does, and 422 for the rest.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

from genscore_core.errors import InvalidRequestError

MAX_LABEL_TOKENS = 128

# Strict: JSON ``true``, ``"9693"`` and ``9693.0`` are not token ids. Lax parsing would score token 1
# for ``true`` and accept the others silently.
TokenIds = list[StrictInt]

logger = logging.getLogger(__name__)


def log_ignored_fields(request: str, model: type[BaseModel], data: Any) -> None:
    """Warn, naming them, about the fields of a request body that ``model`` does not know.

    Request bodies ignore unknown fields, as vLLM's and Cohere-style servers do (clients send their
    own), but not silently: a misspelt option (``apply_sofmax``, ``top_k``) would change the answer
    without a word anywhere, so the server log names them, as vLLM's does."""
    if isinstance(data, dict):
        ignored = sorted(str(key) for key in data.keys() - model.model_fields.keys())
        if ignored:
            logger.warning("%s request: ignored unknown field(s) %s", request, ", ".join(ignored))


class GenerativeScoringRequest(BaseModel):
    """One query scored against many items by next-token label probabilities."""

    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _log_ignored_fields(cls, data: Any) -> Any:
        log_ignored_fields("generative scoring", cls, data)
        return data

    model: str | None = None
    """Model name; echoed back in the response."""
    query: StrictStr | TokenIds
    """The query as text, or as pre-tokenized ids."""
    items: list[StrictStr | TokenIds]
    """One prompt per item: all texts or all token-id lists."""
    label_token_ids: TokenIds
    """Token ids whose next-token probabilities are read; the score is that of the first."""
    # Strict booleans: lax parsing reads ``"false"``, ``"no"``, ``"off"``, ``0`` and ``"0"`` as False and
    # their opposites as True, so a client's typo or a string-typed config changes the scores asked
    # for without a word; JSON ``true`` and ``false`` only.
    apply_softmax: StrictBool = True
    """True: normalise over the label tokens only. False: the full-vocabulary probability."""
    item_first: StrictBool = False
    """Prompt is item + query instead of query + item."""
    add_special_tokens: StrictBool = True
    """Applied when encoding a text query; items never get special tokens."""


class ScoreData(BaseModel):
    index: int
    object: Literal["score"] = "score"
    score: float


class UsageInfo(BaseModel):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0
    prompt_tokens_details: None = None


def _response_id() -> str:
    return f"generative-score-{uuid.uuid4().hex[:16]}"


class GenerativeScoringResponse(BaseModel):
    id: str = Field(default_factory=_response_id)
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str | None = None
    data: list[ScoreData]
    usage: UsageInfo


def check_label_token_ids(label_token_ids: list[int], vocab_size: int) -> None:
    """Raise :class:`InvalidRequestError` unless the label ids are usable with this vocabulary."""
    if not label_token_ids:
        raise InvalidRequestError(
            "label_token_ids must contain at least one token ID.", param="label_token_ids"
        )
    if len(label_token_ids) > MAX_LABEL_TOKENS:
        raise InvalidRequestError(
            f"label_token_ids has {len(label_token_ids)} token IDs; at most {MAX_LABEL_TOKENS} are allowed.",
            param="label_token_ids",
        )
    seen: dict[int, int] = {}
    for position, token_id in enumerate(label_token_ids):
        if not 0 <= token_id < vocab_size:
            raise InvalidRequestError(
                f"label_token_id {token_id} is out of vocabulary range [0, {vocab_size}). "
                f"It is entry {position} of label_token_ids.",
                param="label_token_ids",
                index=position,
            )
        if token_id in seen:
            raise InvalidRequestError(
                f"label_token_ids contains {token_id} twice (entries {seen[token_id]} and {position}); "
                "each label must be a distinct token.",
                param="label_token_ids",
                index=position,
            )
        seen[token_id] = position


# Lone surrogates are what invalid UTF-8 (decoded with ``surrogateescape``) and a JSON ``"\\ud800"``
# escape turn into; no tokenizer can encode them.
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_text(value: object, param: str, index: int | None = None, *, where: str | None = None) -> None:
    """Raise :class:`InvalidRequestError` unless ``value`` is a string of valid Unicode text; the
    message names it ``where`` (by default ``param[index]``)."""
    if where is None:
        where = f"{param}[{index}]" if index is not None else param
    if not isinstance(value, str):
        raise InvalidRequestError(
            f"{where} must be a string, got {type(value).__name__}", param=param, index=index
        )
    if value.isascii():  # a flag CPython keeps on the string: no scan (W4's 20 documents: ~1 ms less)
        return
    bad = _SURROGATE.search(value)
    if bad is not None:
        raise InvalidRequestError(
            f"{where} is not valid text: it holds a lone surrogate U+{ord(bad.group()):04X} at character "
            f"{bad.start()} (text decoded from invalid UTF-8, or a broken \\u escape); send UTF-8 text",
            param=param,
            index=index,
        )


def _check_token_ids(ids: list[int], vocab_size: int, what: str, param: str, index: int | None) -> None:
    # min/max run in C: a 256-document request is checked in well under a millisecond.
    if not ids or (min(ids) >= 0 and max(ids) < vocab_size):
        return
    for token_id in ids:
        if not 0 <= token_id < vocab_size:
            raise InvalidRequestError(
                f"{what} contains token id {token_id}, outside the vocabulary range [0, {vocab_size}).",
                param=param,
                index=index,
            )


def check_request(request: GenerativeScoringRequest, vocab_size: int) -> None:
    """Check what the protocol reports as a bad request (HTTP 400)."""
    if not request.items:
        raise InvalidRequestError("items must contain at least one item.", param="items")
    check_label_token_ids(request.label_token_ids, vocab_size)
    first_is_text = isinstance(request.items[0], str)
    for index, item in enumerate(request.items):
        if isinstance(item, str) != first_is_text:
            kinds = ("text", "token ids") if first_is_text else ("token ids", "text")
            raise InvalidRequestError(
                f"items must be all text or all token-id lists: item 0 is {kinds[0]} "
                f"but item {index} is {kinds[1]}.",
                param="items",
                index=index,
            )
        if isinstance(item, str):
            check_text(item, "items", index)
        else:
            _check_token_ids(item, vocab_size, f"item {index}", "items", index)
    if isinstance(request.query, str):
        check_text(request.query, "query")
    else:
        _check_token_ids(request.query, vocab_size, "query", "query", None)
