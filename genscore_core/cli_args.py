"""Argument types shared by the ``genscore`` subcommands, and the scorer flags generated from
:class:`~genscore_core.ScorerConfig`'s settings.

Every setting of the config (:data:`~genscore_core.config.SETTING_FIELDS`: the model, the prompt
settings, the local and the server settings, by their flat names) becomes a flag of ``genscore rerank`` and ``genscore serve``: its name
(``max_batch_tokens`` -> ``--max-batch-tokens``), its help (the field's docstring), its type, its
choices (a ``Literal``) and its default all come from the field, so a new setting reaches both
command lines without anyone copying it, and the two cannot drift from the config or each other.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import types
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Literal, TypeVar, Union

import annotated_types
from pydantic import SecretStr
from pydantic.fields import FieldInfo

from genscore_core.config import SETTING_FIELDS

T = TypeVar("T")


def argument_type(parse: Callable[[str], T], expected: str, valid: Callable[[T], bool]) -> Callable[[str], T]:
    """An argparse ``type``: ``parse`` the text, and refuse what fails ``valid``, saying what was ``expected``."""

    def convert(text: str) -> T:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not valid(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text}")
        return value

    return convert


positive_int = argument_type(int, "a positive integer", lambda value: value >= 1)
non_negative_int = argument_type(int, "a non-negative integer", lambda value: value >= 0)
# float() takes "inf" and "nan". No flag means either: an infinite --server-timeout ended in an
# OverflowError traceback from the socket, an infinite --batch-max-wait-ms left a lone request
# waiting forever, and a NaN was refused by the config as "should be greater than 0".
number = argument_type(float, "a finite number", math.isfinite)
non_negative_float = argument_type(
    float, "a finite, non-negative number", lambda value: math.isfinite(value) and value >= 0
)
positive_float = argument_type(
    float, "a finite, positive number", lambda value: math.isfinite(value) and value > 0
)


def flag_of(field: str) -> str:
    """The command-line flag of a config field: ``max_batch_tokens`` -> ``--max-batch-tokens``."""
    return "--" + field.replace("_", "-")


def add_config_arguments(
    parser: argparse.ArgumentParser,
    *,
    exclude: Collection[str] = (),
    required: Collection[str] = (),
    aliases: Mapping[str, Sequence[str]] | None = None,
) -> argparse._ArgumentGroup:
    """Add one flag per :class:`ScorerConfig` setting (all but ``exclude``) in a "scorer settings" group.

    A flag left out is absent from the parsed namespace (not ``None``), so the config's own default
    applies and the setting stays out of ``ScorerConfig.given_settings()``; :func:`config_settings` collects the
    flags that were given.
    """
    group = parser.add_argument_group("scorer settings (the fields of ScorerConfig)")
    aliases = aliases or {}
    for name, field in SETTING_FIELDS.items():
        if name in exclude:
            continue
        options: dict[str, Any] = {
            "dest": name,
            "default": argparse.SUPPRESS,
            "help": _help(field, show_default=name not in required, note=_COMMAND_LINE_NOTES.get(name, "")),
            "required": name in required,
        }
        kind = _plain_type(field.annotation)
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(kind) is Literal:
            options["choices"] = list(typing.get_args(kind))
        else:
            options["type"] = _parser_of(kind, field)
            options["metavar"] = name.upper()
        group.add_argument(flag_of(name), *aliases.get(name, ()), **options)
    return group


# Where a flag takes less than its field: a field's help that promises a Python object would send
# a user typing it on the command line to an error.
_COMMAND_LINE_NOTES = {
    "template": " On the command line: a preset name or auto (a PromptTemplate object is given from Python).",
}


SERVER_API_KEY_ENV = "GENSCORE_SERVER_API_KEY"
"""The key for ``--server-url``, kept off the process list and the shell history (``--server-api-key``
wins over it). Not ``GENSCORE_API_KEY``: that is the key ``genscore serve`` itself requires."""


def config_settings(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The :class:`ScorerConfig` settings given on the command line, by flat name, and the server key
    from :data:`SERVER_API_KEY_ENV` when a server is given without ``--server-api-key``."""
    given = vars(args)
    settings = {name: given[name] for name in SETTING_FIELDS if name in given}
    key = (os.environ if environ is None else environ).get(SERVER_API_KEY_ENV)
    if key and settings.get("server_url") and "server_api_key" not in settings:
        settings["server_api_key"] = key
    return settings


def _plain_type(annotation: Any) -> Any:
    """The annotation without ``None`` (``int | None`` -> ``int``); other unions become ``str``."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        rest = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return rest[0] if len(rest) == 1 else str
    return annotation


def _parser_of(kind: Any, field: FieldInfo) -> Callable[[str], Any]:
    lower = next(
        (bound for bound in field.metadata if isinstance(bound, (annotated_types.Gt, annotated_types.Ge))),
        None,
    )
    if kind is int:
        if isinstance(lower, annotated_types.Gt) and lower.gt == 0:
            return positive_int
        if isinstance(lower, annotated_types.Ge) and lower.ge == 0:
            return non_negative_int
        return int
    if kind is float:
        return number  # bounds and the message that names them come from the config's validation
    if kind is SecretStr or kind is str:
        return str
    raise TypeError(f"ScorerConfig field {field!r} has a type the command line cannot parse: {kind!r}")


def _help(field: FieldInfo, *, show_default: bool = True, note: str = "") -> str:
    """The field's description as flag help, then ``note``; a required flag has no default to name."""
    text = (field.description or "").replace("``None``", "unset")
    text = re.sub(r"``([^`]*)``", r"\1", text).replace(":class:", "")
    text = re.sub(r"`~?(?:[\w.]+\.)?(\w+)`", r"\1", text)
    text = " ".join((text + note).split()).replace("%", "%%")
    default = None if field.is_required() else field.get_default()  # server_url: no server unless given
    if show_default and default is not None and not isinstance(default, bool) and default != "":
        text += f" (default: {default})"
    return text
