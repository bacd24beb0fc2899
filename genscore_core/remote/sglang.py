"""Client of SGLang's decoder-only scoring endpoint, ``/v1/score``.

SGLang's request: ``query`` and ``items`` (text or token ids, concatenated at token level),
``label_token_ids``, ``apply_softmax`` (default **false** there: this client always sends it),
``item_first`` and ``model``. Its answer: ``{"scores": [[p(label_0), p(label_1), ...], ...],
"model", "usage", "object": "scoring"}``, one probability per label in label order; the score of an
item is the first.
"""

from __future__ import annotations

from typing import Any

from genscore_core.backend import ScoringJob
from genscore_core.remote.client import TokenScoringClient, as_probability, item_name


class SGLangScoreClient(TokenScoringClient):
    kind = "sglang"
    path = "/v1/score"

    def _payload(self, query: list[int], items: list[list[int]], job: ScoringJob) -> dict[str, Any]:
        return {**super()._payload(query, items, job), "item_first": False}

    def _parse(self, body: Any, count: int, offset: int = 0) -> list[float]:
        rows = body.get("scores") if isinstance(body, dict) else None
        if not isinstance(rows, list) or len(rows) != count:
            got = len(rows) if isinstance(rows, list) else "no"
            raise self._bad_answer(f"{got} score rows for {count} items")
        scores = []
        for index, row in enumerate(rows):
            try:
                scores.append(_first_probability(row))
            except ValueError as error:
                raise self._bad_answer(
                    f"a malformed score row ({item_name(index, count, offset)}: {error})"
                ) from None
        return scores


def _first_probability(row: Any) -> float:
    # Every label's probability is checked, though only the first is the score.
    if not isinstance(row, list) or not row:
        raise ValueError(f"score row {row!r} is not a list of probabilities")
    values = [as_probability(value) for value in row]
    return values[0]
