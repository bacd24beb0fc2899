"""Argument types shared by the ``genscore`` subcommands."""

from __future__ import annotations

import argparse


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
