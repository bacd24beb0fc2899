"""Exceptions raised at genscore's API boundary."""

from __future__ import annotations


class GenScoreError(Exception):
    """Base class of every error genscore raises on purpose."""


class InvalidRequestError(GenScoreError, ValueError):
    """A request or input that cannot be scored as given.

    ``param`` names the offending field (``"items"``, ``"label_token_ids"``, ...) and ``index`` the
    offending position within it, when there is one, so servers and adapters can report it.
    """

    def __init__(self, message: str, *, param: str | None = None, index: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.index = index


class PromptTooLongError(InvalidRequestError):
    """The fixed part of a prompt (template, query) does not fit in the maximum prompt length."""
