"""Argument types shared by the ``genscore`` subcommands, and the scorer flags generated from
:class:`~genscore_core.ScorerConfig`.

Every field of the config becomes a flag of ``genscore rerank`` and ``genscore serve``: its name
(``max_batch_tokens`` -> ``--max-batch-tokens``), its help (the field's docstring), its type, its
choices (a ``Literal``) and its default all come from the field, so a new setting reaches both
command lines without anyone copying it, and the two cannot drift from the config or each other.
"""

from __future__ import annotations

import argparse
import re
import types
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Literal, Union

import annotated_types
from pydantic import SecretStr
from pydantic.fields import FieldInfo

from genscore_core.config import ScorerConfig


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


# The recipe settings of issue 14. Flags already on the parser (generated from ScorerConfig) are kept.
_RECIPE_FLAGS: dict[str, str] = {
    "score_mode": "how logits become scores (docs/models.md); auto: the template's",
    "long_documents": "truncate: drop a long document's end; chunk: score it as overlapping windows",
    "chunk_overlap": "tokens consecutive windows share (long_documents=chunk)",
    "chunk_aggregation": "a chunked document's score from its windows' (long_documents=chunk)",
}


def add_recipe_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--score-mode``, ``--long-documents``, ``--chunk-overlap`` and ``--chunk-aggregation``
    unless the parser has them; a flag left out leaves the config's default."""
    import typing

    from genscore_core.config import ScorerConfig

    for name, help_text in _RECIPE_FLAGS.items():
        flag = "--" + name.replace("_", "-")
        if flag in parser._option_string_actions:
            continue
        field = ScorerConfig.model_fields[name]
        options: dict[str, object] = {"dest": name, "default": argparse.SUPPRESS, "help": help_text}
        if typing.get_origin(field.annotation) is typing.Literal:
            options["choices"] = list(typing.get_args(field.annotation))
        else:
            options["type"] = int
        parser.add_argument(flag, **options)  # type: ignore[arg-type]


def recipe_settings(args: argparse.Namespace) -> dict[str, object]:
    """The recipe settings given on the command line."""
    return {name: value for name, value in vars(args).items() if name in _RECIPE_FLAGS}


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


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
    """Add one flag per :class:`ScorerConfig` field (all but ``exclude``) in a "scorer settings" group.

    A flag left out is absent from the parsed namespace (not ``None``), so the config's own default
    applies and the field stays out of ``model_fields_set``; :func:`config_settings` collects the
    flags that were given.
    """
    group = parser.add_argument_group("scorer settings (the fields of ScorerConfig)")
    aliases = aliases or {}
    for name, field in ScorerConfig.model_fields.items():
        if name in exclude:
            continue
        options: dict[str, Any] = {
            "dest": name,
            "default": argparse.SUPPRESS,
            "help": _help(field),
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


def config_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`ScorerConfig` fields given on the command line, by field name."""
    given = vars(args)
    return {name: given[name] for name in ScorerConfig.model_fields if name in given}


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


def _help(field: FieldInfo) -> str:
    text = (field.description or "").replace("``None``", "unset")
    text = re.sub(r"``([^`]*)``", r"\1", text).replace(":class:", "")
    text = re.sub(r"`~?(?:[\w.]+\.)?(\w+)`", r"\1", text)
    text = " ".join(text.split()).replace("%", "%%")
    default = field.get_default()
    if default is not None and not isinstance(default, bool) and default != "":
        text += f" (default: {default})"
    return text
