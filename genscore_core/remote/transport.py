"""HTTP plumbing of the remote backends (:class:`HttpTransport`): timeouts, bounded retries with backoff, errors mapped to genscore's.

* Connection errors, timeouts and 429/5xx answers are retried ``max_retries`` times, waiting
  ``backoff * 2**(attempt - 1)`` seconds (at most ``max_backoff``, with jitter, at least what a
  ``Retry-After`` header asks, in seconds or as an HTTP date). Scoring requests are idempotent, so retrying them is safe.
* A 401, 403 or 404 answer raises :class:`~genscore_core.RemoteConfigurationError` naming the URL:
  the client's settings (``server_url``, ``server_api_key``) are wrong, not the request.
* Any other 4xx answer raises :class:`~genscore_core.InvalidRequestError` with the server's message.
* A redirect (3xx) is not followed: it raises :class:`~genscore_core.RemoteScoringError` naming
  where it points (``server_url`` is the setting to correct).
* Anything else that goes wrong raises :class:`~genscore_core.RemoteScoringError`.
"""

from __future__ import annotations

import asyncio
import contextvars
import email.utils
import math
import random
import socket
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from genscore_core.errors import (
    AttemptTooLongError,
    InvalidRequestError,
    RemoteConfigurationError,
    RemoteScoringError,
)
from genscore_core.waiting import within

try:
    import httpcore
    import httpx
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        'genscore\'s remote backends need httpx; install it with: pip install "genscore[remote]"'
    ) from exc

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
ANSWER_BYTES_FLOOR = 64 << 20
"""An answer may take this many bytes (decoded) beyond twice its request's: an answer holds a few
numbers per item, or each document echoed back, so a larger one is a server gone wrong, and reading
it whole (a server streaming without end, a compressed body that inflates to gigabytes) would hold
memory the request never asked for."""
IDLE_CONNECTION_EXPIRY_S = 4.0
"""Seconds a pooled connection may stay idle before the client drops it: under the 5 s keep-alive
vLLM and SGLang servers have by default (uvicorn's; ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``,
``SGLANG_TIMEOUT_KEEP_ALIVE``). A client that kept it longer could send a request on
it just as the server closes it, and get a reset connection for an answer (then retried)."""
# Answers about the client's own settings (credentials, address), not about the request it sent.
CONFIGURATION_STATUSES = {
    401: "check server_api_key",
    403: "check server_api_key",
    404: "check server_url and server_kind",
}


def error_message(response: httpx.Response) -> str:
    """The message a server put in its error body (OpenAI, FastAPI or plain text shapes)."""
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip()
        return text[:500] or f"HTTP {response.status_code}"
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        for key in ("message", "detail", "error"):
            value = body.get(key)
            if isinstance(value, str):
                return value
            if isinstance(value, list) and value:
                return "; ".join(
                    str(item.get("msg", item)) if isinstance(item, dict) else str(item) for item in value
                )
    return str(body)[:500]


def retry_after_seconds(value: str, now: datetime | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks to wait: its seconds, or the time until its HTTP date
    (RFC 9110 allows both; a date already past asks for none). ``None`` when it is neither."""
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return None if math.isnan(seconds) else seconds
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # "-0000" parses as naive; HTTP dates are always GMT
        when = when.replace(tzinfo=timezone.utc)
    return max((when - (now or datetime.now(timezone.utc))).total_seconds(), 0.0)


_CLOSE_CHECK_S = 0.05
"""How often an async retry's wait looks whether the transport was closed."""


class HttpTransport:
    """JSON POSTs to one server with retries; a sync client, and one async client per event loop.

    Args:
        base_url: ``http://host:port`` of the server (or of the load balancer in front of a fleet).
        timeout: Seconds allowed for one HTTP request, from connecting to the answer's last byte
            (an attempt that takes longer fails, and is retried like a timeout).
        max_retries: Retries after a connection error, a timeout or a 429/5xx answer.
        backoff: First wait between attempts, in seconds; doubles each retry.
        max_backoff: Longest wait between attempts.
        idle_expiry: Seconds an idle pooled connection is kept (:data:`IDLE_CONNECTION_EXPIRY_S`);
            keep it below the server's keep-alive timeout.
        api_key: Sent as ``Authorization: Bearer <api_key>``.
        transport, async_transport: httpx transports to use instead of the network (for tests).
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff: float = 0.25,
        max_backoff: float = 8.0,
        idle_expiry: float = IDLE_CONNECTION_EXPIRY_S,
        api_key: str | None = None,
        transport: httpx.BaseTransport | None = None,
        async_transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if max_retries < 0 or timeout <= 0 or backoff < 0 or idle_expiry < 0:
            raise ValueError("timeout must be positive, max_retries, backoff and idle_expiry non-negative")
        self.base_url = base_url.rstrip("/")
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.timeout = timeout
        self._options: dict[str, Any] = {
            "base_url": self.base_url,
            "timeout": httpx.Timeout(timeout),
            # httpx's default pool sizes, with the idle expiry changed.
            "limits": httpx.Limits(
                max_connections=100, max_keepalive_connections=20, keepalive_expiry=idle_expiry
            ),
            "headers": {"Authorization": f"Bearer {api_key}"} if api_key else {},
        }
        self._client = httpx.Client(
            transport=transport or _deadline_transport(self._options["limits"]), **self._options
        )
        self._async_transport = async_transport
        self._async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopClient] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        self._closed = threading.Event()
        """Set by :meth:`close`: no attempt starts after it, and a retry's wait ends at it."""

    # -- sync ---------------------------------------------------------------------------------------

    def post_json(self, path: str, payload: dict[str, Any]) -> Any:
        return self._with_retries(lambda: self._send("POST", path, payload), path, self._closed.wait)

    def get_json(self, path: str) -> Any:
        return self._with_retries(lambda: self._send("GET", path, None), path, self._closed.wait)

    def _send(self, method: str, path: str, payload: dict[str, Any] | None) -> httpx.Response:
        # httpx's timeouts bound each network operation, not the request: a server sending its
        # answer a byte at a time would never trip them. The body is read in chunks against a
        # deadline instead, and each network operation may wait only the time left before it
        # (_deadline_transport): a silence that starts just before the deadline ends at it.
        deadline = time.monotonic() + self.timeout
        token = _ATTEMPT_DEADLINE.set(deadline)
        try:
            return self._read_answer(method, path, payload, deadline)
        except httpx.TimeoutException:
            # A wait cut to the time left ran out: the attempt did, as it does on the async path.
            if time.monotonic() >= deadline - _CLOCK_SLACK_S:
                raise AttemptTooLongError(self.timeout) from None
            raise
        finally:
            _ATTEMPT_DEADLINE.reset(token)

    def _read_answer(
        self, method: str, path: str, payload: dict[str, Any] | None, deadline: float
    ) -> httpx.Response:
        with self._client.stream(method, path, json=payload) as response:
            answer = _Answer(response)
            for chunk in response.iter_bytes():
                if time.monotonic() > deadline:
                    raise AttemptTooLongError(self.timeout)
                self._check_size(path, answer.add(chunk))
            if time.monotonic() > deadline:
                raise AttemptTooLongError(self.timeout)
        return answer.whole()

    async def _aread_answer(
        self, client: httpx.AsyncClient, path: str, payload: dict[str, Any]
    ) -> httpx.Response:
        async with client.stream("POST", path, json=payload) as response:
            answer = _Answer(response)
            async for chunk in response.aiter_bytes():
                self._check_size(path, answer.add(chunk))
        return answer.whole()

    def _check_size(self, path: str, answer: _Answer) -> None:
        if answer.size > answer.limit:
            raise RemoteScoringError(
                f"{self.base_url}{path} answered with more than {answer.limit:,} bytes to a request of "
                f"{len(answer.response.request.content):,}: refused rather than held in memory",
                status=answer.response.status_code,
            )

    def _with_retries(
        self, send: Callable[[], httpx.Response], path: str, sleep: Callable[[float], object]
    ) -> Any:
        attempts = _Attempts(self, path)
        for wait in attempts.waits():
            sleep(wait)
            attempts.make(send)
        return attempts.result()

    # -- async --------------------------------------------------------------------------------------

    async def apost_json(self, path: str, payload: dict[str, Any]) -> Any:
        self._check_open(path)
        client = await self._async_client()
        attempts = _Attempts(self, path)
        for wait in attempts.waits():
            await self._abackoff(wait)
            # Bounds the whole attempt; httpx's own timeouts bound each network operation only.
            await attempts.amake(lambda: within(self._aread_answer(client, path, payload), self.timeout))
        return attempts.result()

    async def _async_client(self) -> httpx.AsyncClient:
        # An AsyncClient's connections belong to the loop that opened them: keep one per loop, and
        # close it when that loop shuts down. Otherwise every ``asyncio.run(scorer.arerank(...))``
        # leaves a socket open (the client holds its loop, so the weak key is never dropped either).
        loop = asyncio.get_running_loop()
        with self._lock:
            _abandoned = self._drop_clients_of_closed_loops()  # let go of once the lock is released
            entry = self._async_clients.get(loop)
            if entry is not None and not entry.client.is_closed:
                return entry.client
            client = httpx.AsyncClient(transport=self._async_transport, **self._options)
            closer = self._close_with_loop(loop, client)
            self._async_clients[loop] = _LoopClient(client, closer)
        # Started here, the generator belongs to this loop: ``loop.shutdown_asyncgens()`` (which
        # ``asyncio.run`` and ``asyncio.Runner`` call before closing the loop) finalizes it.
        await closer.__anext__()
        return client

    async def _abackoff(self, seconds: float) -> None:
        """Waits ``seconds`` before a retry, or until :meth:`close`. close() may come from another
        thread, which cannot set an asyncio event of this loop, so the wait looks at the close event in
        short steps: a wait of up to ``max_backoff`` then ends within a step of the close."""
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while not self._closed.is_set() and (left := end - loop.time()) > 0:
            await asyncio.sleep(min(left, _CLOSE_CHECK_S))

    def _drop_clients_of_closed_loops(self) -> list[_LoopClient]:
        """Forgets the clients of loops closed without ``shutdown_asyncgens()`` (a loop of
        ``new_event_loop()`` + ``run_until_complete()`` + ``close()``): their closers never ran, and
        each entry's closer holds its loop, so the weak key was never dropped and every such loop
        kept a client and its sockets for the transport's lifetime. Forgotten, they are collected and
        their sockets closed. Returned to be let go of outside the lock."""
        closed = [loop for loop in self._async_clients if loop.is_closed()]
        return [self._async_clients.pop(loop) for loop in closed]

    async def _close_with_loop(
        self, loop: asyncio.AbstractEventLoop, client: httpx.AsyncClient
    ) -> AsyncIterator[None]:
        try:
            yield
        finally:
            with self._lock:
                entry = self._async_clients.get(loop)
                if entry is not None and entry.client is client:
                    del self._async_clients[loop]
            await client.aclose()

    # -- shared -------------------------------------------------------------------------------------

    def _delay(self, attempt: int, response: httpx.Response | None) -> float:
        delay = min(self.max_backoff, self.backoff * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
        retry_after = response.headers.get("retry-after") if response is not None else None
        asked = retry_after_seconds(retry_after) if retry_after is not None else None
        if asked is not None:
            delay = max(delay, min(asked, self.max_backoff))
        return delay

    def _decode(self, response: httpx.Response, path: str) -> Any:
        hint = CONFIGURATION_STATUSES.get(response.status_code)
        if hint is not None:
            url = f"{self.base_url}{path}"
            raise RemoteConfigurationError(
                f"{url} answered HTTP {response.status_code}: {error_message(response)} ({hint})",
                url=url,
                status=response.status_code,
            )
        if 300 <= response.status_code < 400:
            raise self._redirected(response, path)
        if 400 <= response.status_code < 500:
            raise InvalidRequestError(
                f"{self.base_url}{path} answered HTTP {response.status_code}: {error_message(response)}"
            )
        if response.status_code != 200:
            raise RemoteScoringError(
                f"{self.base_url}{path} answered HTTP {response.status_code}: {error_message(response)}",
                status=response.status_code,
            )
        try:
            return response.json()
        except (ValueError, RecursionError):  # RecursionError: arrays nested deeper than the parser goes
            raise RemoteScoringError(
                f"{self.base_url}{path} answered with a body that is not JSON ({_body_sample(response)})",
                status=200,
            ) from None

    def _redirected(self, response: httpx.Response, path: str) -> RemoteScoringError:
        # Not followed: a POST redirected may arrive as a GET (301, 302), and a server_url that is
        # redirected (http to https, a moved host) is the setting to correct, once.
        location = response.headers.get("location")
        target = f"a redirect to {location}" if location else "a redirect with no Location"
        return RemoteScoringError(
            f"{self.base_url}{path} answered HTTP {response.status_code}, {target}; redirects are not "
            "followed: set server_url to the address the server answers at",
            status=response.status_code,
        )

    def _undecodable(self, path: str, error: httpx.DecodingError) -> RemoteScoringError:
        return RemoteScoringError(
            f"{self.base_url}{path} answered with a body that cannot be decoded as its headers say: {error}",
            status=200,
        )

    def _failure_of(self, path: str, error: BaseException) -> _Failure:
        """What a failed attempt (sync or async) leaves for the next one; raises where retrying
        cannot help: an answer that cannot be decoded, or a client closed (httpx's RuntimeError)."""
        if isinstance(error, httpx.DecodingError):
            raise self._undecodable(path, error) from None
        if isinstance(error, httpx.TransportError):
            self._check_open(path, in_flight=True)
            return self._transport_failure(error)
        if isinstance(error, (AttemptTooLongError, asyncio.TimeoutError)):
            return _Failure(str(AttemptTooLongError(self.timeout)), timed_out=True)
        self._check_open(path, in_flight=True)
        raise error

    def _transport_failure(self, error: httpx.TransportError) -> _Failure:
        if isinstance(error, httpx.TimeoutException):
            return _Failure(f"{type(error).__name__} after the {self.timeout:g} s timeout", timed_out=True)
        return _Failure(_describe_transport_error(error))

    def _gave_up(self, path: str, failure: _Failure) -> RemoteScoringError:
        attempts = self.max_retries + 1
        plural = "s" if attempts > 1 else ""
        return RemoteScoringError(
            f"{self.base_url}{path} failed after {attempts} attempt{plural}: {failure.message}",
            status=failure.response.status_code if failure.response is not None else None,
            timed_out=failure.timed_out,
        )

    def _check_open(self, path: str, in_flight: bool = False) -> None:
        """Raises once :meth:`close` was called: an attempt it cut short is not the server's failure,
        and retrying it on a closed client would be httpx's bare ``RuntimeError``."""
        if not self._closed.is_set():
            return
        when = "while the request was in flight" if in_flight else "before the request was sent"
        raise RemoteScoringError(
            f"{self.base_url}{path} was not scored: the client was closed (scorer.close()) {when}; "
            "a closed scorer does not score, make a new one"
        )

    def close(self) -> None:
        """Closes the connections; a call in flight on another thread ends at once, with an error."""
        self._closed.set()
        self._client.close()
        with self._lock:
            clients = [entry.client for entry in self._async_clients.values()]
            self._async_clients.clear()
        # Dropping an entry finalizes its closer, which asyncio schedules on the client's own loop
        # (thread-safely): that closes the client and ends a call in flight there. Its loop running
        # here, the client is closed now as well.
        for client in clients:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            if loop is not None and not loop.is_closed():
                loop.create_task(client.aclose())

    async def aclose(self) -> None:
        """Close the async client of the running loop (and the sync client)."""
        self._closed.set()
        self._client.close()
        with self._lock:
            entry = self._async_clients.pop(asyncio.get_running_loop(), None)
        if entry is not None:
            await entry.client.aclose()


_ATTEMPT_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "genscore_attempt_deadline", default=None
)
"""When the sync attempt running on this thread must end (``time.monotonic()``), if one is."""


class _Answer:
    """A response's body read chunk by chunk (decoded), against the most it may take."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.limit = ANSWER_BYTES_FLOOR + 2 * len(response.request.content)
        self.size = 0
        self._chunks: list[bytes] = []

    def add(self, chunk: bytes) -> _Answer:
        self.size += len(chunk)
        if self.size <= self.limit:
            self._chunks.append(chunk)
        return self

    def whole(self) -> httpx.Response:
        # The chunks are decoded already: the answer they make must not be decoded again.
        headers = self.response.headers.copy()
        for name in ("content-encoding", "content-length"):
            headers.pop(name, None)
        return httpx.Response(
            self.response.status_code,
            headers=headers,
            content=b"".join(self._chunks),
            request=self.response.request,
        )


_CLOCK_SLACK_S = 0.01
"""A socket timeout may end a little before the monotonic clock reaches the deadline it was cut to."""

_SHORTEST_WAIT_S = 0.001
"""A wait past the deadline still gets this long: a socket timeout of 0 would make it non-blocking."""


def _time_left(timeout: float | None) -> float | None:
    """``timeout`` of one network operation, cut to the time left in the attempt running here."""
    deadline = _ATTEMPT_DEADLINE.get()
    if deadline is None:
        return timeout
    left = max(deadline - time.monotonic(), _SHORTEST_WAIT_S)
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose reads and writes wait no longer than the attempt using it has left."""

    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _time_left(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _time_left(timeout))

    def close(self) -> None:
        # close() alone leaves a read blocked on this socket in another thread (the client closed
        # during a call) waiting for the server or the timeout; a shutdown wakes it at once.
        sock = self._stream.get_extra_info("socket")
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed, or never connected
                pass
        self._stream.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        return _DeadlineStream(self._stream.start_tls(ssl_context, server_hostname, _time_left(timeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """Opens :class:`_DeadlineStream` connections (connecting within the time left too)."""

    def __init__(self, backend: httpcore.NetworkBackend) -> None:
        self._backend = backend

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        stream = self._backend.connect_tcp(host, port, _time_left(timeout), local_address, socket_options)
        return _DeadlineStream(stream)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        return _DeadlineStream(self._backend.connect_unix_socket(path, _time_left(timeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


def _deadline_transport(limits: httpx.Limits) -> httpx.HTTPTransport:
    """httpx's own transport, its connections made by :class:`_DeadlineBackend`.

    httpx takes no network backend, so it is set on the httpcore pool the transport holds; should
    a later httpx hold it elsewhere, the transport is left as it is (each wait then bounded by the
    timeout, not by the time left).
    """
    transport = httpx.HTTPTransport(limits=limits)
    pool = getattr(transport, "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if isinstance(backend, httpcore.NetworkBackend):
        pool._network_backend = _DeadlineBackend(backend)  # type: ignore[union-attr]
    return transport


_ATTEMPT_ERRORS = (
    httpx.DecodingError,
    httpx.TransportError,
    RuntimeError,
    AttemptTooLongError,
    asyncio.TimeoutError,
)
"""What one attempt of a request may raise: :meth:`HttpTransport._failure_of` sorts it."""


class _Attempts:
    """The retry loop of one request, without its I/O, for the sync and the async path alike: the
    wait before each attempt, what each attempt's outcome leaves, and the answer or the error at the
    end. The caller waits each of :meth:`waits` (0 before the first attempt), then makes an attempt."""

    def __init__(self, transport: HttpTransport, path: str) -> None:
        self._transport = transport
        self._path = path
        self._failure = _Failure("no attempt made")
        self._answer: httpx.Response | None = None

    def waits(self) -> Iterator[float]:
        """The seconds to wait before each attempt; none once an attempt was answered."""
        for attempt in range(self._transport.max_retries + 1):
            if self._answer is not None:
                return
            yield self._transport._delay(attempt, self._failure.response) if attempt else 0.0

    def make(self, send: Callable[[], httpx.Response]) -> None:
        self._transport._check_open(self._path)
        try:
            response = send()
        except _ATTEMPT_ERRORS as error:
            self._failure = self._transport._failure_of(self._path, error)
        else:
            self._settle(response)

    async def amake(self, send: Callable[[], Awaitable[httpx.Response]]) -> None:
        self._transport._check_open(self._path)
        try:
            response = await send()
        except _ATTEMPT_ERRORS as error:
            self._failure = self._transport._failure_of(self._path, error)
        else:
            self._settle(response)

    def _settle(self, response: httpx.Response) -> None:
        if response.status_code in RETRY_STATUSES:
            self._failure = _Failure.of(response)
        else:
            self._answer = response

    def result(self) -> Any:
        """The decoded answer; raises when every attempt failed."""
        if self._answer is None:
            raise self._transport._gave_up(self._path, self._failure)
        return self._transport._decode(self._answer, self._path)


@dataclass(frozen=True)
class _LoopClient:
    client: httpx.AsyncClient
    closer: AsyncIterator[None]
    """The async generator that closes ``client`` when its loop shuts down (kept alive here)."""


@dataclass(frozen=True)
class _Failure:
    """Why the last attempt failed: a transport error (no response) or a retryable status."""

    message: str
    response: httpx.Response | None = None
    timed_out: bool = False

    @classmethod
    def of(cls, response: httpx.Response) -> _Failure:
        return cls(f"HTTP {response.status_code}: {error_message(response)}", response)


BODY_SAMPLE_CHARS = 80


def _body_sample(response: httpx.Response) -> str:
    """The content type and start of an answer's body: a proxy's HTML page says what it is there."""
    content_type = response.headers.get("content-type", "no content type")
    text = response.content[: BODY_SAMPLE_CHARS * 4].decode("utf-8", "replace").strip()
    if not text:
        return f"{content_type}, empty"
    sample = text[:BODY_SAMPLE_CHARS]
    more = "..." if len(text) > BODY_SAMPLE_CHARS or len(response.content) > BODY_SAMPLE_CHARS * 4 else ""
    return f"{content_type}: {sample!r}{more}"


def _describe_transport_error(error: httpx.TransportError) -> str:
    kind = type(error).__name__
    detail = str(error).strip()
    return f"{kind}: {detail}" if detail else kind
