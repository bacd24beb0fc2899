"""Client of the generative scoring protocol: ``genscore serve`` and vLLM's ``/generative_scoring``."""

from __future__ import annotations

from typing import Any

from genscore_core.config import ServerKind
from genscore_core.remote.answers import scores_by_index
from genscore_core.remote.client import TokenScoringClient
from genscore_core.remote.transport import HttpTransport


class GenerativeScoringClient(TokenScoringClient):
    """Sends ``{"query": ids, "items": [ids...], "label_token_ids", "apply_softmax"}`` and reads
    ``data[i].score``. Both ``genscore serve`` and vLLM serve the protocol at ``/generative_scoring``.

    vLLM checks ``model`` against its served model names: leave ``model`` as ``None`` (the server's
    default model) unless the names are known to match.

    vLLM cuts a prompt over ``--max-model-len`` - 1 without a word. The answer's ``usage.prompt_tokens``
    is one total per request, and the protocol does not say whether it counts prompts as sent or as
    scored, so it is not read: a cut cannot be told from the answer, only kept from happening by a
    ``max_length`` at or below the server's limit (docs/scaling.md, section 3).
    """

    path = "/generative_scoring"

    def __init__(self, http: HttpTransport, *, kind: ServerKind = "genscore", **options: Any) -> None:
        super().__init__(http, **options)
        self.kind = kind

    def _parse(
        self, body: Any, count: int, offset: int = 0, request: dict[str, Any] | None = None
    ) -> list[float]:
        data = self._listed(
            body.get("data") if isinstance(body, dict) else None, count, f"scores for {count} items"
        )
        try:
            return scores_by_index(data, count, lambda entry: entry["score"], offset)
        except ValueError as error:
            raise self._bad_answer(f"a malformed score entry ({error})") from None
