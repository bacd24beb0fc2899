"""Small calls: the server starting a lone request without waiting for company; the text check."""

from __future__ import annotations

import argparse

import httpx
import pytest

from genscore_core import GenerativeScorer, InvalidRequestError
from genscore_core.protocol import check_text
from genscore_core.server import ServerLimits
from genscore_core.server.app import create_app
from genscore_core.server.cli import add_serve_command, server_limits
from tests.helpers.server import serve_in_thread


def test_a_lone_request_starts_without_waiting_for_company(scorer: GenerativeScorer) -> None:
    # A queue that waited for company up to batch_max_wait_ms would hold this request for 10 minutes.
    limits = ServerLimits(batch_max_wait_ms=600_000)
    assert limits.batch_wait == "tokenizing"
    with serve_in_thread(create_app(scorer, limits)) as live:
        answer = httpx.post(
            f"{live.url}/v1/rerank", json={"query": "capital", "documents": ["paris", "rome"]}, timeout=120
        )
    assert answer.status_code == 200, answer.text
    expected = scorer.score_documents("capital", ["paris", "rome"])
    got = {r["index"]: r["relevance_score"] for r in answer.json()["results"]}
    assert [got[0], got[1]] == pytest.approx(expected, abs=1e-6)


def test_serve_takes_the_batch_wait_flag() -> None:
    parser = argparse.ArgumentParser()
    add_serve_command(parser.add_subparsers())
    assert server_limits(parser.parse_args(["serve", "--model", "m"])).batch_wait == "tokenizing"
    args = parser.parse_args(["serve", "--model", "m", "--batch-wait", "always"])
    assert server_limits(args).batch_wait == "always"
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--model", "m", "--batch-wait", "never"])


def test_text_check_passes_ascii_and_unicode_and_names_a_lone_surrogate() -> None:
    check_text("plain ascii", "documents", 0)
    check_text("café, Straße, 東京", "documents", 1)
    with pytest.raises(InvalidRequestError, match=r"documents\[2\].*U\+D800") as raised:
        check_text("ascii then \ud800", "documents", 2)
    assert raised.value.index == 2


def test_one_text_passed_as_the_documents_is_refused(scorer: GenerativeScorer) -> None:
    import asyncio

    # A str is a sequence of one-character documents: scoring "abc" as three documents is never meant.
    for call in (
        lambda: scorer.rerank("q", "abc"),  # type: ignore[arg-type]
        lambda: scorer.score_documents("q", "abc"),  # type: ignore[arg-type]
        lambda: asyncio.run(scorer.arerank("q", "abc")),  # type: ignore[arg-type]
        lambda: scorer.encode("q", "abc"),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidRequestError, match="documents must be a list of texts") as caught:
            call()
        assert caught.value.param == "documents"
    for pairs_call in (lambda: scorer.score_pairs("ab"), lambda: asyncio.run(scorer.ascore_pairs("ab"))):  # type: ignore[arg-type]
        with pytest.raises(InvalidRequestError, match="pairs must be a list") as caught:
            pairs_call()
        assert caught.value.param == "pairs"
