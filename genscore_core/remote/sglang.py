"""Client of SGLang's decoder-only scoring endpoint, ``/v1/score``.

SGLang's request: ``query`` and ``items`` (text or token ids, concatenated at token level),
``label_token_ids``, ``apply_softmax`` (default **false** there: this client always sends it),
``item_first`` and ``model``. Its answer: ``{"scores": [[p(label_0), p(label_1), ...], ...],
"model", "usage", "object": "scoring"}``, one probability per label in label order; the score of an
item is the first. A row is checked whole: one probability per label, summing to 1 when
``apply_softmax`` was asked (:data:`LABEL_SUM_TOLERANCE`).
"""

from __future__ import annotations

import math
from typing import Any

from genscore_core.backend import ScoringJob
from genscore_core.remote.answers import as_probability, item_name
from genscore_core.remote.client import TokenScoringClient


class SGLangScoreClient(TokenScoringClient):
    kind = "sglang"
    path = "/v1/score"

    def _payload(self, query: list[int], items: list[list[int]], job: ScoringJob) -> dict[str, Any]:
        return {**super()._payload(query, items, job), "item_first": False}

    def _parse(
        self, body: Any, count: int, offset: int = 0, request: dict[str, Any] | None = None
    ) -> list[float]:
        rows = self._listed(
            body.get("scores") if isinstance(body, dict) else None, count, f"score rows for {count} items"
        )
        labels = len(request["label_token_ids"]) if request is not None else None
        normalised = bool(request and request.get("apply_softmax"))
        scores = []
        for index, row in enumerate(rows):
            try:
                scores.append(_first_probability(row, labels, normalised))
            except ValueError as error:
                raise self._bad_answer(
                    f"a malformed score row ({item_name(index, count, offset)}: {error})"
                ) from None
        return scores


LABEL_SUM_TOLERANCE = 1e-2
"""How far from 1 the label probabilities of a row asked with ``apply_softmax`` may sum. A server
that ignored the switch (SGLang's default is false) returns whole-vocabulary probabilities, which
sum to less: its scores would be silently lower. Within this tolerance the score differs from the
normalised one by about as little."""


def _first_probability(row: Any, labels: int | None, normalised: bool) -> float:
    # Every label's probability is checked, though only the first is the score.
    if not isinstance(row, list) or not row:
        raise ValueError(f"score row {row!r} is not a list of probabilities")
    values = [as_probability(value) for value in row]
    if labels is not None and len(values) != labels:
        raise ValueError(f"score row {row!r} has {len(values)} probabilities for {labels} label tokens")
    total = math.fsum(values)
    if normalised and abs(total - 1.0) > LABEL_SUM_TOLERANCE:
        raise ValueError(
            f"score row {row!r} sums to {total:.4g}, not 1, though apply_softmax was asked "
            "(a server that ignores it returns whole-vocabulary probabilities)"
        )
    if total > 1.0 + LABEL_SUM_TOLERANCE:
        raise ValueError(
            f"score row {row!r} sums to {total:.4g}: probabilities of one position sum to 1 at most"
        )
    return values[0]
