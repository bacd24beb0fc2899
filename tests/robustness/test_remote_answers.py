"""Answers of scoring servers are checked: a real (faulty) server on loopback answers bad values."""

from __future__ import annotations

import asyncio
import gc
import json
import math
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from genscore_core import GenerativeScorer
from genscore_core.errors import RemoteScoringError
from genscore_core.server import create_app
from tests.helpers.server import TEST_LIMITS, LiveServer, serve_in_thread

KINDS = ("genscore", "vllm", "sglang", "rerank")
QUERY = "capital of France"
DOCUMENTS = ["Paris is the capital of France.", "Berlin is in Germany.", "Lyon has good food."]


class Faults:
    """What the faulty server puts in its next answers: JSON text for the score and index of the
    entries ``at(count, entry)`` picks (entry 1 of each answer), or a whole ``body`` instead."""

    score = "0.5"
    index: str | None = None
    body: str | None = None
    trickle: float = 0.0
    """Seconds between the bytes of an answer (0: sent at once)."""
    at: Callable[[int, int], bool] = staticmethod(lambda count, entry: entry == 1)


def faulty_app(faults: Faults) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    def entries(count: int, score_key: str) -> str:
        parts = []
        for i in range(count):
            faulty = faults.at(count, i)
            score = faults.score if faulty else str(0.1 + 0.2 * i)
            index = faults.index if faulty and faults.index is not None else str(i)
            parts.append(f'{{"index": {index}, "{score_key}": {score}}}')
        return "[" + ", ".join(parts) + "]"

    def answer(text: str) -> Response:
        # Raw text: JSON encoders refuse NaN and Infinity, which some servers still send.
        body = (faults.body if faults.body is not None else text).encode()
        if faults.trickle:
            return StreamingResponse(
                _trickled(body, faults.trickle),
                media_type="application/json",
                headers={"Content-Length": str(len(body))},
            )
        return Response(body, media_type="application/json")

    @app.post("/generative_scoring")
    async def generative(request: Request) -> Response:
        count = len((await request.json())["items"])
        return answer(f'{{"object": "list", "data": {entries(count, "score")}}}')

    @app.post("/v1/score")
    async def sglang(request: Request) -> Response:
        count = len((await request.json())["items"])
        rows = [_row(faults.score if faults.at(count, i) else str(0.1 + 0.2 * i)) for i in range(count)]
        return answer(f'{{"object": "scoring", "scores": [{", ".join(rows)}]}}')

    @app.post("/v1/rerank")
    async def rerank(request: Request) -> Response:
        count = len((await request.json())["documents"])
        return answer(f'{{"results": {entries(count, "relevance_score")}}}')

    return app


def _row(score: str) -> str:
    """An SGLang row of two label probabilities: ``score`` and what makes the row sum to 1 (as near as
    a probability can; 0.5 when ``score`` is not a number), so that only ``score`` is at fault."""
    try:
        value = float(score)
    except ValueError:
        value = math.nan
    other = min(max(1.0 - value, 0.0), 1.0) if math.isfinite(value) else 0.5
    return f"[{score}, {other}]"


async def _trickled(body: bytes, pause: float) -> AsyncIterator[bytes]:
    for i in range(len(body)):
        yield body[i : i + 1]
        await asyncio.sleep(pause)


@pytest.fixture(scope="module")
def faults() -> Faults:
    return Faults()


@pytest.fixture(scope="module")
def faulty_server(faults: Faults) -> Iterator[LiveServer]:
    with serve_in_thread(faulty_app(faults)) as live:
        yield live


@pytest.fixture(scope="module")
def remotes(tiny_model_dir: Path, faulty_server: LiveServer) -> Iterator[dict[str, GenerativeScorer]]:
    scorers = {
        kind: GenerativeScorer(
            str(tiny_model_dir),
            server_url=faulty_server.url,
            server_kind=kind,
            server_max_retries=0,
            max_length=512,
        )
        for kind in KINDS
    }
    yield scorers
    for scorer in scorers.values():
        scorer.close()


@pytest.fixture
def fault(faults: Faults) -> Iterator[Faults]:
    yield faults
    faults.score, faults.index, faults.body, faults.trickle = "0.5", None, None, 0.0
    faults.at = Faults.at


def _calls(scorer: GenerativeScorer, kind: str) -> list[Any]:
    calls: list[Any] = [
        lambda: scorer.rerank(QUERY, DOCUMENTS),
        lambda: asyncio.run(scorer.arerank(QUERY, DOCUMENTS)),
        lambda: scorer.score_pairs([(QUERY, d) for d in DOCUMENTS]),
    ]
    if kind != "rerank":  # raw protocol requests exist only as token ids
        request = {"query": [1, 2], "items": [[3], [4], [5]], "label_token_ids": [9693, 2152]}
        calls.append(lambda: scorer.score(request))
        calls.append(lambda: asyncio.run(scorer.ascore(request)))
    return calls


def _refusals(scorer: GenerativeScorer, kind: str) -> list[str]:
    """The message of the RemoteScoringError that each of ``_calls`` raises."""
    messages = []
    for call in _calls(scorer, kind):
        with pytest.raises(RemoteScoringError) as caught:
            call()
        messages.append(str(caught.value))
    return messages


def _refused_naming(scorer: GenerativeScorer, kind: str, url: str, text: str) -> list[str]:
    """The messages of :func:`_refusals`, each checked to name the server and hold ``text``."""
    messages = _refusals(scorer, kind)
    for message in messages:
        assert url in message
        assert text in message
    return messages


BAD_SCORES = {
    "1.5": "1.5",
    "-0.2": "-0.2",
    "NaN": "nan",
    "Infinity": "inf",
    "-Infinity": "-inf",
    '"0.5"': "'0.5'",
    "true": "True",
    "null": "None",
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bad", sorted(BAD_SCORES))
def test_bad_scores_are_refused_naming_server_and_value(
    remotes: dict[str, GenerativeScorer], fault: Faults, faulty_server: LiveServer, kind: str, bad: str
) -> None:
    fault.score = bad
    _refused_naming(remotes[kind], kind, faulty_server.url, f"score {BAD_SCORES[bad]} ")


@pytest.mark.parametrize("kind", ["genscore", "vllm", "rerank"])
# "0": entry 1 repeats entry 0's index.
@pytest.mark.parametrize(
    ("bad", "shown"), [("true", "True"), ("-1", "-1"), ("1.0", "1.0"), ("7", "7"), ("0", "0")]
)
def test_bad_indices_are_refused(
    remotes: dict[str, GenerativeScorer],
    fault: Faults,
    faulty_server: LiveServer,
    kind: str,
    bad: str,
    shown: str,
) -> None:
    fault.index = bad
    _refused_naming(remotes[kind], kind, faulty_server.url, f"index {shown} ")


@pytest.mark.parametrize("kind", KINDS)
def test_integers_beyond_float_range_are_refused_as_scores(
    remotes: dict[str, GenerativeScorer], fault: Faults, faulty_server: LiveServer, kind: str
) -> None:
    # JSON numbers have no size limit; float() of a 401-digit integer overflows.
    fault.score = "1" + "0" * 400
    shown = "score 10000000000000000000...(401 characters) is not a probability"
    _refused_naming(remotes[kind], kind, faulty_server.url, shown)


@pytest.mark.parametrize("kind", ["genscore", "vllm", "rerank"])
def test_an_index_of_hundreds_of_digits_is_shortened_in_the_error(
    remotes: dict[str, GenerativeScorer], fault: Faults, faulty_server: LiveServer, kind: str
) -> None:
    fault.index = "1" + "0" * 400
    shown = "index 10000000000000000000...(401 characters) is outside [0, 3)"
    for message in _refused_naming(remotes[kind], kind, faulty_server.url, shown):
        assert len(message) < 300


@pytest.mark.parametrize("kind", KINDS)
def test_deeply_nested_bodies_are_refused_as_not_json(
    remotes: dict[str, GenerativeScorer], fault: Faults, faulty_server: LiveServer, kind: str
) -> None:
    # Deeper than Python's JSON parser recurses.
    fault.body = "[" * 100_000 + "]" * 100_000
    _refused_naming(remotes[kind], kind, faulty_server.url, "not JSON")


@contextmanager
def _scorers(
    model: Path, url: str, kinds: tuple[str, ...], **settings: Any
) -> Iterator[dict[str, GenerativeScorer]]:
    scorers = {
        kind: GenerativeScorer(
            str(model), server_url=url, server_kind=kind, server_max_retries=0, max_length=512, **settings
        )
        for kind in kinds
    }
    yield scorers
    for scorer in scorers.values():
        scorer.close()


@pytest.fixture(scope="module")
def split_remotes(tiny_model_dir: Path, faulty_server: LiveServer) -> Iterator[dict[str, GenerativeScorer]]:
    """Scorers sending at most two items per request."""
    with _scorers(tiny_model_dir, faulty_server.url, KINDS, server_batch_size=2) as scorers:
        yield scorers


@pytest.mark.parametrize("kind", KINDS)
def test_bad_scores_name_their_item(
    remotes: dict[str, GenerativeScorer],
    split_remotes: dict[str, GenerativeScorer],
    fault: Faults,
    kind: str,
) -> None:
    fault.score = "NaN"
    with pytest.raises(RemoteScoringError, match=r"item 1\b.*score nan "):
        remotes[kind].rerank(QUERY, DOCUMENTS)
    # Five documents, two a request: the third request's only entry is document 4.
    fault.at = lambda count, entry: count == 1
    documents = [f"document {i}" for i in range(5)]
    expected = r"item 4 \(index 0 of the request for items 4 to 4\).*score nan "
    for call in (
        lambda: split_remotes[kind].rerank(QUERY, documents),
        lambda: asyncio.run(split_remotes[kind].arerank(QUERY, documents)),
    ):
        with pytest.raises(RemoteScoringError, match=expected):
            call()


@pytest.mark.parametrize("kind", KINDS)
def test_server_timeout_bounds_an_answer_sent_a_byte_at_a_time(
    tiny_model_dir: Path, faulty_server: LiveServer, fault: Faults, kind: str
) -> None:
    # Every byte comes well within any read timeout; the whole answer takes over 5 s.
    fault.trickle = 0.05
    with _scorers(tiny_model_dir, faulty_server.url, (kind,), server_timeout=1.0) as scorers:
        for call in (
            lambda: scorers[kind].rerank(QUERY, DOCUMENTS),
            lambda: asyncio.run(scorers[kind].arerank(QUERY, DOCUMENTS)),
        ):
            started = time.monotonic()
            with pytest.raises(RemoteScoringError) as caught:
                call()
            assert time.monotonic() - started < 3.0
            assert faulty_server.url in str(caught.value)
            assert "no complete answer within the 1 s timeout" in str(caught.value)


@pytest.mark.parametrize("kind", KINDS)
def test_probabilities_a_rounding_step_outside_are_clamped(
    remotes: dict[str, GenerativeScorer], fault: Faults, kind: str
) -> None:
    fault.score = "1.0000004"
    ranked = remotes[kind].rerank(QUERY, DOCUMENTS)
    assert [r.index for r in ranked] == [1, 2, 0]
    assert ranked[0].score == 1.0


def _open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts /proc/self/fd")
def test_async_clients_close_with_their_event_loop(tiny_model_dir: Path, scorer: GenerativeScorer) -> None:
    with serve_in_thread(create_app(scorer, TEST_LIMITS)) as live:
        remote = GenerativeScorer(str(tiny_model_dir), server_url=live.url, max_length=512)
        expected = scorer.rerank(QUERY, DOCUMENTS)
        asyncio.run(remote.arerank(QUERY, DOCUMENTS))
        before = _open_files()
        for _ in range(100):
            ranked = asyncio.run(remote.arerank(QUERY, DOCUMENTS))
        after = _open_files()
        remote.close()
    assert [r.index for r in ranked] == [r.index for r in expected]
    assert after - before < 5, f"{before} open files before 100 event loops, {after} after"


def test_faulty_server_answers_good_values_when_told(remotes: dict[str, GenerativeScorer]) -> None:
    # The stand-in itself: 0.1, 0.5, 0.5 (entry 1 is the one faults replace).
    assert json.loads("[0.1, 0.5, 0.5]") == pytest.approx(
        remotes["genscore"].score_pairs([(QUERY, d) for d in DOCUMENTS])
    )


@pytest.mark.parametrize(
    ("rows", "problem"),
    [
        ("[0.7], [0.2], [0.4]", "has 1 probabilities for 2 label tokens"),
        ("[0.7, 0.3, 0.1], [0.2, 0.8, 0.0], [0.4, 0.6, 0.0]", "has 3 probabilities for 2 label tokens"),
        ("[0.7, 0.3], [0.9, 0.8], [0.4, 0.6]", "sums to 1.7"),
    ],
)
def test_sglang_rows_must_hold_one_probability_per_label(
    remotes: dict[str, GenerativeScorer], fault: Faults, faulty_server: LiveServer, rows: str, problem: str
) -> None:
    fault.body = f'{{"object": "scoring", "scores": [{rows}]}}'
    malformed = f"{faulty_server.url}/v1/score answered a malformed score row"
    _refused_naming(remotes["sglang"], "sglang", malformed, problem)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts /proc/self/fd")
def test_async_clients_of_loops_closed_without_shutdown_are_let_go(
    tiny_model_dir: Path, scorer: GenerativeScorer
) -> None:
    # new_event_loop() + run_until_complete() + close() never finalizes the async generator that closes
    # a loop's client, and the entry held its loop, so each such loop kept a client and a socket.
    with serve_in_thread(create_app(scorer, TEST_LIMITS)) as live:
        remote = GenerativeScorer(str(tiny_model_dir), server_url=live.url, max_length=512)
        expected = [result.index for result in scorer.rerank(QUERY, DOCUMENTS)]

        def in_a_new_loop() -> list[int]:
            loop = asyncio.new_event_loop()
            try:
                return [result.index for result in loop.run_until_complete(remote.arerank(QUERY, DOCUMENTS))]
            finally:
                loop.close()

        assert in_a_new_loop() == expected
        gc.collect()
        before = _open_files()
        for _ in range(30):
            assert in_a_new_loop() == expected
        gc.collect()
        # The server closes its end of each connection once it reads the client's close: in its own time.
        deadline = time.monotonic() + 3.0
        while (after := _open_files()) - before >= 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        remote.close()
    assert after - before < 5, (
        f"{before} open files before 30 event loops closed without shutdown, {after} after"
    )
