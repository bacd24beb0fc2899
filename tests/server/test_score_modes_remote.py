"""Scoring servers return probabilities: the logit score modes are refused before any request."""

from __future__ import annotations

from pathlib import Path

import pytest

from genscore_core import GenerativeScorer, InvalidRequestError

from ._support import LiveServer


def test_servers_are_not_asked_for_logits(tiny_model_dir: Path, live_server: LiveServer) -> None:
    remote = GenerativeScorer(
        str(tiny_model_dir), server_url=live_server.url, max_length=512, score_mode="logit"
    )
    with pytest.raises(InvalidRequestError, match="returns probabilities only") as caught:
        remote.rerank("q", ["d"])
    assert caught.value.param == "score_mode"
    remote.close()
