"""The remote clients against raw HTTP answers: a real socket server on loopback writes crafted bytes
(a stall in the middle of an answer, pages that are not the protocol's), as a faulty server or a proxy
in front of one would."""

from __future__ import annotations

import asyncio
import email.utils
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from genscore_core import GenerativeScorer
from genscore_core.errors import RemoteScoringError
from genscore_core.remote.transport import ANSWER_BYTES_FLOOR, HttpTransport, retry_after_seconds
from tests.helpers.server import read_http_message

KINDS = ("genscore", "vllm", "sglang", "rerank")
QUERY = "capital of France"
DOCUMENTS = ["Paris is the capital of France.", "Berlin is in Germany.", "Lyon has good food."]

Answer = Callable[[socket.socket, bytes], None]
"""Writes an answer on a connection, given the request's bytes."""


@contextmanager
def socket_server(answer: Answer) -> Iterator[str]:
    """A loopback HTTP/1.1 server whose every request is answered by ``answer``; yields its URL."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    stopped = threading.Event()

    def serve(connection: socket.socket) -> None:
        with connection:
            try:
                while not stopped.is_set():
                    request = read_http_message(connection)
                    if not request:
                        return
                    answer(connection, request)
            except OSError:
                return

    def accept() -> None:
        while not stopped.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(connection,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stopped.set()
        listener.close()


def _head(status: str, length: int, content_type: str = "application/json", extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {length}\r\n{extra}\r\n"
    ).encode()


@contextmanager
def _remote(model: Path, url: str, kind: str, **settings: Any) -> Iterator[GenerativeScorer]:
    options: dict[str, Any] = {"server_max_retries": 0, "max_length": 512, **settings}
    scorer = GenerativeScorer(str(model), server_url=url, server_kind=kind, **options)
    try:
        yield scorer
    finally:
        scorer.close()


def _both_paths(scorer: GenerativeScorer) -> list[Callable[[], Any]]:
    return [
        lambda: scorer.rerank(QUERY, DOCUMENTS),
        lambda: asyncio.run(scorer.arerank(QUERY, DOCUMENTS)),
    ]


# -- the timeout bounds an attempt, whatever the server does ----------------------------------------

TIMEOUT_S = 2.0
STALL_S = 10.0
BODY = b'{"data": [' + b" " * 200 + b"]}"


def _stalls_near_the_deadline_in_the_body(connection: socket.socket, request: bytes) -> None:
    # The head at once, then a byte every 0.4 s (each far within the read timeout) until 0.2 s before
    # the deadline, then silence: the last read starts with 0.2 s left.
    connection.sendall(_head("200 OK", len(BODY)))
    started = time.monotonic()
    sent = 0
    while time.monotonic() - started < TIMEOUT_S - 0.2:
        connection.sendall(BODY[sent : sent + 1])
        sent += 1
        time.sleep(0.4)
    time.sleep(STALL_S)


def _answers_its_head_near_the_deadline(connection: socket.socket, request: bytes) -> None:
    time.sleep(TIMEOUT_S - 0.2)
    connection.sendall(_head("200 OK", len(BODY)) + BODY[:5])
    time.sleep(STALL_S)


# The kinds share the transport; "rerank" sends its requests one after another, the others in a pool.
@pytest.mark.parametrize("kind", ["genscore", "rerank"])
@pytest.mark.parametrize(
    "answer", [_stalls_near_the_deadline_in_the_body, _answers_its_head_near_the_deadline]
)
def test_a_silence_near_the_deadline_ends_at_the_deadline(
    tiny_model_dir: Path, kind: str, answer: Answer
) -> None:
    # A read that starts just before the attempt's deadline may wait only the time left, not a whole
    # read timeout more (which made a 2 s timeout a 3.8 s wait).
    with socket_server(answer) as url, _remote(tiny_model_dir, url, kind, server_timeout=TIMEOUT_S) as scorer:
        for call in _both_paths(scorer):
            started = time.monotonic()
            with pytest.raises(RemoteScoringError) as caught:
                call()
            waited = time.monotonic() - started
            assert waited < TIMEOUT_S + 0.7, f"waited {waited:.2f} s on a {TIMEOUT_S} s timeout"
            assert url in str(caught.value)
            assert caught.value.timed_out
            assert "no complete answer within the 2 s timeout" in str(caught.value)


# -- answers that are not the protocol's ----------------------------------------------------------


def _answer(status: str, body: bytes, content_type: str = "application/json", extra: str = "") -> Answer:
    def answer(connection: socket.socket, request: bytes) -> None:
        connection.sendall(_head(status, len(body), content_type, extra) + body)

    return answer


def _refused(model: Path, answer: Answer, kind: str) -> list[RemoteScoringError]:
    """The errors of a sync and an async call to a server that always gives ``answer``."""
    errors = []
    with socket_server(answer) as url, _remote(model, url, kind) as scorer:
        for call in _both_paths(scorer):
            with pytest.raises(RemoteScoringError) as caught:
                call()
            assert url in str(caught.value)
            errors.append(caught.value)
    return errors


@pytest.mark.parametrize("kind", KINDS)
def test_a_body_that_cannot_be_decompressed_is_a_remote_scoring_error(
    tiny_model_dir: Path, kind: str
) -> None:
    # Was httpx's own DecodingError, naming no server.
    answer = _answer("200 OK", b"this is not gzip", extra="Content-Encoding: gzip\r\n")
    for error in _refused(tiny_model_dir, answer, kind):
        assert "cannot be decoded" in str(error)


@pytest.mark.parametrize(
    "status", ["301 Moved Permanently", "307 Temporary Redirect", "308 Permanent Redirect"]
)
def test_a_redirect_names_where_it_points(tiny_model_dir: Path, status: str) -> None:
    target = "https://scoring.example/generative_scoring"
    answer = _answer(status, b"", extra=f"Location: {target}\r\n")
    for error in _refused(tiny_model_dir, answer, "genscore"):
        assert f"answered HTTP {status.split()[0]}, a redirect to {target}" in str(error)
        assert "server_url" in str(error)
        assert error.status == int(status.split()[0])


def test_a_page_that_is_not_json_is_quoted(tiny_model_dir: Path) -> None:
    # A proxy's login page answered with 200: the error shows what the page is.
    page = b"<!DOCTYPE html><html><head><title>Sign in to the gateway</title></head>" + b"<p>x</p>" * 100
    answer = _answer("200 OK", page, "text/html; charset=utf-8")
    for error in _refused(tiny_model_dir, answer, "vllm"):
        assert "not JSON (text/html; charset=utf-8: '<!DOCTYPE html><html><head><title>Sign in to" in str(
            error
        )
        assert str(error).endswith("...)")


# -- answers larger than any request's ------------------------------------------------------------


def _gzip_of_zeros(size: int) -> bytes:
    """``size`` zero bytes gzip-compressed (about a thousandth of the size), built a MiB at a time."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    piece = bytes(1 << 20)
    parts = [packer.compress(piece) for _ in range(size // len(piece))]
    return b"".join(parts) + packer.flush()


def _streams_without_end(connection: socket.socket, request: bytes) -> None:
    connection.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    piece = b" " * (1 << 20)
    chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    while True:  # until the client hangs up (the server's handler then ends on the OSError)
        connection.sendall(chunk)


@pytest.mark.parametrize("kind", ["genscore", "rerank"])
def test_an_answer_larger_than_the_request_allows_is_refused(tiny_model_dir: Path, kind: str) -> None:
    # Read whole before: a compressed body inflating to gigabytes, or a server streaming without end
    # inside the timeout, held all of it in memory.
    bomb = _answer(
        "200 OK", _gzip_of_zeros(ANSWER_BYTES_FLOOR + (8 << 20)), extra="Content-Encoding: gzip\r\n"
    )
    for answer in (bomb, _streams_without_end):
        for error in _refused(tiny_model_dir, answer, kind):
            assert "answered with more than" in str(error) and "refused rather than held in memory" in str(
                error
            )
            assert error.status == 200


# -- Retry-After as an HTTP date ------------------------------------------------------------------


def _busy_then_answers(retry_after: Callable[[], str]) -> Answer:
    """Answers 503 with ``Retry-After: retry_after()`` to every other request, 200 to the rest."""
    requests = iter(range(1 << 30))
    ok = b'{"ok": true}'

    def answer(connection: socket.socket, request: bytes) -> None:
        if next(requests) % 2 == 0:
            body = b'{"error": {"message": "busy"}}'
            connection.sendall(
                _head("503 Service Unavailable", len(body), extra=f"Retry-After: {retry_after()}\r\n") + body
            )
        else:
            connection.sendall(_head("200 OK", len(ok)) + ok)

    return answer


def _http_date(seconds_from_now: float) -> str:
    return email.utils.formatdate(time.time() + seconds_from_now, usegmt=True)


def _waits_of(url: str, max_backoff: float) -> list[float]:
    """Seconds a sync and an async request took to a server that asks once to retry later."""
    http = HttpTransport(url, max_retries=1, backoff=0.001, max_backoff=max_backoff)
    waits = []
    try:
        for send in (
            lambda: http.post_json("/generative_scoring", {}),
            lambda: asyncio.run(http.apost_json("/generative_scoring", {})),
        ):
            started = time.monotonic()
            assert send() == {"ok": True}
            waits.append(time.monotonic() - started)
    finally:
        http.close()
    return waits


def test_a_retry_after_date_is_waited_for() -> None:
    # Was ignored (only seconds were read): the client came back after its own 1 ms backoff.
    # An HTTP date has whole seconds, so "3 s from now" is 2 to 3 s away when it is read.
    with socket_server(_busy_then_answers(lambda: _http_date(3))) as url:
        for waited in _waits_of(url, max_backoff=10.0):
            assert 1.5 <= waited < 4.0, f"waited {waited:.2f} s for a Retry-After 2 to 3 s ahead"


@pytest.mark.parametrize("ahead_s", [3600.0, -3600.0])
def test_a_retry_after_date_is_capped_like_seconds(ahead_s: float) -> None:
    # An hour ahead waits max_backoff, as "Retry-After: 3600" does; a date already past asks for no wait.
    with socket_server(_busy_then_answers(lambda: _http_date(ahead_s))) as url:
        for waited in _waits_of(url, max_backoff=1.0):
            if ahead_s > 0:
                assert 0.9 <= waited < 2.0, f"waited {waited:.2f} s with max_backoff 1 s"
            else:
                assert waited < 0.5, f"waited {waited:.2f} s for a date already past"


def test_retry_after_reads_both_forms() -> None:
    now = datetime(2026, 12, 2, 8, 0, 0, tzinfo=timezone.utc)
    assert retry_after_seconds("7") == 7.0
    assert retry_after_seconds("Wed, 02 Dec 2026 08:00:30 GMT", now) == 30.0
    assert retry_after_seconds("Wednesday, 02-Dec-26 08:00:30 GMT", now) == 30.0  # RFC 850 form
    assert retry_after_seconds("Wed Dec  2 08:00:30 2026", now) == 30.0  # asctime form, GMT
    assert retry_after_seconds("Fri, 31 Dec 1999 23:59:59 GMT", now) == 0.0
    assert retry_after_seconds("soon") is None
    assert retry_after_seconds("nan") is None


# -- closing --------------------------------------------------------------------------------------


def _answers_late(arrived: threading.Event) -> Answer:
    def answer(connection: socket.socket, request: bytes) -> None:
        arrived.set()
        time.sleep(STALL_S)
        body = b'{"data": []}'
        connection.sendall(_head("200 OK", len(body)) + body)

    return answer


def _in_thread(send: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Exception]]:
    """``send()`` started on a thread, and where the error it raises will be."""
    outcome: dict[str, Exception] = {}

    def call() -> None:
        try:
            send()
        except Exception as error:
            outcome["error"] = error

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    return caller, outcome


@pytest.mark.parametrize("kind", ["genscore", "rerank"])
@pytest.mark.parametrize("path", ["sync", "async"])
def test_close_ends_a_call_in_flight_on_another_thread(tiny_model_dir: Path, kind: str, path: str) -> None:
    # The sync call waited for the server's answer (up to the timeout) on a socket closed under it,
    # then retried on the closed client and raised httpx's bare RuntimeError; so did the async one.
    arrived = threading.Event()
    with (
        socket_server(_answers_late(arrived)) as url,
        _remote(tiny_model_dir, url, kind, server_max_retries=3, server_timeout=30.0) as scorer,
    ):
        caller, outcome = _in_thread(_both_paths(scorer)[path == "async"])
        assert arrived.wait(30), "the request never reached the server"
        closed_at = time.monotonic()
        scorer.close()
        caller.join(STALL_S / 2)
        assert not caller.is_alive(), "the call went on after close()"
        assert time.monotonic() - closed_at < 2.0
    error = outcome["error"]
    assert isinstance(error, RemoteScoringError), repr(error)
    assert f"{url}/" in str(error)
    assert "closed (scorer.close()) while the request was in flight" in str(error)


@pytest.mark.parametrize("kind", ["genscore", "rerank"])
def test_a_closed_scorer_says_so(tiny_model_dir: Path, kind: str) -> None:
    # Sync calls raised httpx's "Cannot send a request, as the client has been closed", naming no
    # server; async calls quietly opened new connections.
    with socket_server(_answers_late(threading.Event())) as url:
        with _remote(tiny_model_dir, url, kind) as scorer:
            pass
        for call in _both_paths(scorer):
            with pytest.raises(RemoteScoringError) as caught:
                call()
            assert f"{url}/" in str(caught.value)
            assert "closed (scorer.close()) before the request was sent" in str(caught.value)


def _always_busy(asked: threading.Event) -> Answer:
    """Answers every request 503 with ``Retry-After: 30``; sets ``asked`` at the first."""

    def answer(connection: socket.socket, request: bytes) -> None:
        asked.set()
        body = b'{"error": {"message": "busy"}}'
        connection.sendall(_head("503 Service Unavailable", len(body), extra="Retry-After: 30\r\n") + body)

    return answer


@pytest.mark.parametrize("path", ["sync", "async"])
def test_close_ends_a_call_waiting_to_retry(tiny_model_dir: Path, path: str) -> None:
    # The async call slept out its backoff (the server asks 30 s, capped at the default max_backoff
    # of 8 s) after close() and only then found the client closed; the sync one waits on the close.
    asked = threading.Event()
    with (
        socket_server(_always_busy(asked)) as url,
        _remote(tiny_model_dir, url, "genscore", server_max_retries=3, server_timeout=60.0) as scorer,
    ):
        caller, outcome = _in_thread(_both_paths(scorer)[path == "async"])
        assert asked.wait(30), "the request never reached the server"
        time.sleep(0.2)  # the 503 read, the call is in its wait before the retry
        scorer.close()
        caller.join(5.0)
        assert not caller.is_alive(), "the call slept out its backoff after close()"
    error = outcome["error"]
    assert isinstance(error, RemoteScoringError), repr(error)
    assert f"{url}/" in str(error)
    assert "closed (scorer.close())" in str(error)
