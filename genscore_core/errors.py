"""Every exception genscore raises on purpose, in one place.

* :class:`InvalidRequestError`: the caller's input cannot be scored as given (HTTP 400, exit code 2).
* :class:`ConfigurationError`: a setting points at something that does not work (a model folder
  that does not exist, a server URL that answers 401/403/404). Retrying will not help; fixing the
  setting will.
* :class:`NotARerankerError`: the model or tokenizer cannot give meaningful scores (an encoder, a
  checkpoint missing weights, label words the tokenizer does not have).
* :class:`ModelFolderError`: a file of the model folder is broken or hostile (a chat template that
  does not compile or render in time, a weight of the wrong shape, a pickle, a bad token id).
* :class:`RemoteScoringError`: a scoring server could not be reached or kept failing (exit code 3).
* :class:`ServerBusyError`: ``genscore serve`` has no room for the request now (HTTP 503).

The rest are narrower: errors of one input format (:class:`StrictJSONError`, :class:`InputError`,
:class:`InputFileError`, :class:`JobStateError`), the HTTP answers of ``genscore serve``
(:class:`ServerHTTPError`), and signals that stay inside genscore (:class:`RequestAbandoned`,
:class:`AttemptTooLongError`). A test checks that no module defines an exception class anywhere else.
"""

from __future__ import annotations


class GenScoreError(Exception):
    """Base class of every error genscore raises on purpose."""


class InvalidRequestError(GenScoreError, ValueError):
    """A request or input that cannot be scored as given.

    ``param`` names the offending field (``"items"``, ``"label_token_ids"``, ``"top_n"``, ...) and
    ``index`` the offending position within it, when there is one, so servers and adapters can
    report it.
    """

    def __init__(self, message: str, *, param: str | None = None, index: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.index = index


class PromptTooLongError(InvalidRequestError):
    """The fixed part of a prompt (template, query) does not fit in the maximum prompt length."""


class ConfigurationError(GenScoreError):
    """A setting names something that cannot be used: fix the setting, retrying will not help.

    ``setting`` names the setting (``"model"``, ``"server_url"``, ...).
    """

    def __init__(self, message: str, *, setting: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.setting = setting


class NotARerankerError(GenScoreError, ValueError):
    """The model or tokenizer cannot give meaningful scores (an encoder, a random head, unknown labels).

    Raised when the scorer is built, before anything is scored: unlike a setting pointing nowhere, the
    model itself is the problem, so another model (or its own tokenizer) is the fix.
    """


class ModelFolderError(ConfigurationError, ValueError):
    """A file of a model folder cannot be used as it is: a chat template that is not valid Jinja, does
    something the sandbox forbids or does not finish rendering within the time and memory allowed; a
    weight whose shape the configuration does not give; weights stored as a pickle that the safe loader
    refuses; a token id that is not one of the vocabulary's.

    ``folder`` is the model (folder or hub id) and ``file`` the offending file within it; the message,
    one line, names both. Nothing the folder ships is run to find this out: templates render in
    jinja's sandbox in a child process, pickles are never loaded unsafely.
    """

    def __init__(self, message: str, *, folder: str, file: str) -> None:
        super().__init__(message, setting="model")
        self.folder = folder
        self.file = file


class ModelNotFoundError(ConfigurationError):
    """``model`` names neither an existing local folder nor a model the hub serves."""


class RemoteConfigurationError(ConfigurationError):
    """A scoring server refused the client itself: 401/403 (credentials) or 404 (wrong URL or path).

    ``url`` is the address that answered and ``status`` its HTTP status.
    """

    def __init__(self, message: str, *, url: str, status: int) -> None:
        super().__init__(message, setting="server_url" if status == 404 else "server_api_key")
        self.url = url
        self.status = status


class RemoteScoringError(GenScoreError):
    """A scoring server could not be reached, or kept failing, or answered something unreadable.

    ``status`` is the last HTTP status received, ``None`` when no answer came at all; ``timed_out``
    says that the last attempt ran out of ``server_timeout``.
    """

    def __init__(self, message: str, *, status: int | None = None, timed_out: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.timed_out = timed_out


class ServerBusyError(GenScoreError):
    """The server's queue is full or it is stopping: try again later (HTTP 503)."""


class ScoreRangeError(GenScoreError):
    """The model produced a score that is not finite, or outside the range of its score mode
    (overflow in half precision, broken weights): such a score is never returned.

    ``param`` and ``index`` name the input the score belongs to (``"documents"``, ``"pairs"``,
    ``"items"`` and its position there) when the scorer knows it: a score that a backend handed to
    :class:`~genscore_core.GenerativeScorer`, or that its own engine computed, is always named so.
    ``job`` and ``prompt`` are the engine's names for it (the :class:`~genscore_core.backend.ScoringJob`
    of the call and the prompt's position in it), set when the engine raised the error.
    """

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        index: int | None = None,
        job: int | None = None,
        prompt: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.index = index
        self.job = job
        self.prompt = prompt

    def naming(
        self,
        place: str,
        *,
        param: str | None = None,
        index: int | None = None,
        job: int | None = None,
        prompt: int | None = None,
    ) -> ScoreRangeError:
        """This error with its score named ``place`` (``"documents[3]"``) where it said which
        prompt: the engine words it "<place> scored <value>, ..."."""
        detail = self.message.partition(" scored ")[2] or self.message
        return ScoreRangeError(f"{place} scored {detail}", param=param, index=index, job=job, prompt=prompt)


class KernelUnavailableError(ConfigurationError):
    """A kernel implementation was asked for explicitly (``impl="triton"``) and cannot run here.

    The message says what to install or set (``setting`` is ``"impl"``). ``impl="auto"`` never raises
    it: it falls back to torch.
    """


class InputFileError(InvalidRequestError):
    """The input file as a whole cannot be read (missing column, not UTF-8, malformed CSV...)."""


class JobStateError(InvalidRequestError):
    """The output or its work folder is in a state the job must not overwrite without being told."""


class InputError(Exception):
    """Bad command-line input: reported on one line, exit code 2."""


class StrictJSONError(ValueError):
    """Text that is valid for Python's reader but not as standard JSON."""


class NotStandardJSONError(StrictJSONError):
    """``NaN``, ``Infinity`` or a number beyond a float."""


class RepeatedKeyError(StrictJSONError):
    """One object holds ``key`` twice."""

    def __init__(self, key: str) -> None:
        super().__init__(f"the key {key!r} appears twice in one object")
        self.key = key


class RequestAbandoned(GenScoreError):
    """The caller of a request went away; its work was dropped."""


class AttemptTooLongError(Exception):
    """One attempt of a request to a scoring server ran past ``server_timeout``.

    The client retries it; a caller only sees :class:`RemoteScoringError` (``timed_out``) once
    every attempt has failed.
    """

    def __init__(self, timeout: float) -> None:
        super().__init__(f"no complete answer within the {timeout:g} s timeout")


class ServerHTTPError(GenScoreError):
    """An HTTP error answer of ``genscore serve``: ``status_code``, ``detail``, and the ``headers``
    and ``param`` (the field named in the error body) to send with it.

    Not a Starlette ``HTTPException``, so that this module needs no server package: the server
    answers these itself, also when FastAPI wraps one raised while it read the body.
    """

    param: str | None = None

    def __init__(self, status_code: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status_code = status_code
        self.detail = detail
        self.headers = headers


class BodyTooLargeError(ServerHTTPError):
    """A request body beyond ``--max-body-bytes`` (HTTP 413)."""

    def __init__(self, max_bytes: int, size: int | None = None) -> None:
        got = f"{size} bytes" if size is not None else "more"
        super().__init__(
            413, f"request body is {got}; this server accepts at most {max_bytes} bytes (--max-body-bytes)"
        )


class BodyTimeoutError(ServerHTTPError):
    """A request body that did not arrive within ``--body-timeout`` of its headers (HTTP 408)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(
            408,
            f"the request body did not arrive within {seconds:g} s of its headers (--body-timeout)",
            # The rest of the body may still come: the connection cannot carry another request.
            headers={"Connection": "close"},
        )


class UnknownModelError(ServerHTTPError):
    """A request naming a model the server does not serve (HTTP 404)."""

    param = "model"

    def __init__(self, requested: str, served: str) -> None:
        super().__init__(
            404, f"The model `{requested}` does not exist; this server serves `{served}` (GET /v1/models)"
        )


class InputChangedError(JobStateError):
    """A resumed job's input no longer holds the rows its finished chunks were scored from
    (``genscore score`` exit code 4): resuming would mix stale scores into the output."""


class JobLockedError(JobStateError):
    """Another run of the same job holds its lock (``genscore score`` exit code 5)."""
