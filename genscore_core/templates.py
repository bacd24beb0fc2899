"""Prompt templates of generative rerankers: data, checked once.

A template is ``prefix + body + suffix``. The prefix and suffix are fixed text (chat markup, the answer
cue); the body holds the placeholders ``{query}``, ``{document}`` and optionally ``{instruction}``.
Truncation only ever shortens what was substituted into the body, so the prefix and suffix survive.
"""

from __future__ import annotations

import string
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from genscore_core.errors import InvalidRequestError

_PLACEHOLDERS = {"query", "document", "instruction"}


class Span(NamedTuple):
    """A half-open character range ``[start, end)``."""

    start: int
    end: int


class RenderedBody(NamedTuple):
    text: str
    query: Span
    document: Span


class PromptTemplate(BaseModel):
    """How one reranker family turns (instruction, query, document) into a prompt."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    prefix: str = ""
    """Fixed text before the body, tokenized on its own (as the official recipes do)."""
    body: str
    """Text with ``{query}``, ``{document}`` and optionally ``{instruction}``, tokenized as a whole."""
    suffix: str = ""
    """Fixed text after the body (the answer cue), tokenized on its own."""
    label_words: tuple[str, ...]
    """Words whose next-token probabilities make the score; the first is the positive label."""
    default_instruction: str | None = None
    instruction_format: str = "{instruction}"
    """How a non-empty instruction is written into ``{instruction}``."""

    @field_validator("body")
    @classmethod
    def _body_placeholders(cls, body: str) -> str:
        names = [field for _, field, _, _ in string.Formatter().parse(body) if field is not None]
        unknown = sorted(set(names) - _PLACEHOLDERS)
        if unknown:
            raise ValueError(
                f"template body has unknown placeholders {unknown}; allowed: {sorted(_PLACEHOLDERS)}"
            )
        for required in ("query", "document"):
            if names.count(required) != 1:
                raise ValueError(f"template body must contain {{{required}}} exactly once")
        if names.count("instruction") > 1:
            raise ValueError("template body may contain {instruction} at most once")
        return body

    @field_validator("label_words")
    @classmethod
    def _labels(cls, words: tuple[str, ...]) -> tuple[str, ...]:
        if not words:
            raise ValueError("a template needs at least one label word")
        if len(set(words)) != len(words):
            raise ValueError(f"label words must be distinct, got {list(words)}")
        return words

    @model_validator(mode="after")
    def _instruction(self) -> PromptTemplate:
        if "{instruction}" not in self.instruction_format:
            raise ValueError("instruction_format must contain {instruction}")
        return self

    @property
    def takes_instruction(self) -> bool:
        return "{instruction}" in self.body

    def render_body(self, query: str, document: str, instruction: str | None = None) -> RenderedBody:
        """Fill the body, recording where the query and the document landed."""
        if instruction is None:
            instruction = self.default_instruction
        if instruction and not self.takes_instruction:
            raise InvalidRequestError(
                f"template {self.name!r} has no {{instruction}} placeholder; drop the instruction "
                "or use a template that takes one",
                param="instruction",
            )
        values: dict[str, str] = {
            "query": query,
            "document": document,
            "instruction": self.instruction_format.format(instruction=instruction) if instruction else "",
        }
        parts: list[str] = []
        spans: dict[str, Span] = {}
        length = 0
        for literal, field, _, _ in string.Formatter().parse(self.body):
            parts.append(literal)
            length += len(literal)
            if field is not None:
                value = values[field]
                spans[field] = Span(length, length + len(value))
                parts.append(value)
                length += len(value)
        return RenderedBody("".join(parts), spans["query"], spans["document"])


QWEN3_RERANKER = PromptTemplate(
    name="qwen3-reranker",
    prefix=(
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and "
        'the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
        "<|im_start|>user\n"
    ),
    body="<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}",
    suffix="<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    label_words=("yes", "no"),
    default_instruction="Given a web search query, retrieve relevant passages that answer the query",
)

MXBAI_RERANK_V2 = PromptTemplate(
    name="mxbai-rerank-v2",
    prefix=(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
        "<|im_end|>\n<|im_start|>user\n"
    ),
    body=(
        "{instruction}query: {query}\ndocument: {document}\nYou are a search relevance expert who "
        "evaluates how well documents match search queries. For each query-document pair, carefully "
        "analyze the semantic relationship between them, then provide your binary relevance judgment "
        "(0 for not relevant, 1 for relevant).\nRelevance:"
    ),
    suffix="<|im_end|>\n<|im_start|>assistant\n",
    label_words=("1", "0"),
    instruction_format="instruction: {instruction}\n",
)

TEMPLATES: dict[str, PromptTemplate] = {t.name: t for t in (QWEN3_RERANKER, MXBAI_RERANK_V2)}


def get_template(template: str | PromptTemplate | dict[str, Any], model_name: str = "") -> PromptTemplate:
    """Resolve a preset name, ``"auto"`` (picked from the model name) or a user-defined template."""
    if isinstance(template, PromptTemplate):
        return template
    if isinstance(template, dict):
        return PromptTemplate(**template)
    if template == "auto":
        return MXBAI_RERANK_V2 if "mxbai-rerank" in model_name.lower() else QWEN3_RERANKER
    try:
        return TEMPLATES[template]
    except KeyError:
        raise ValueError(
            f"unknown template {template!r}; choose one of {sorted(TEMPLATES)} or 'auto', "
            "or pass a PromptTemplate"
        ) from None


def resolve_label_ids(tokenizer: Any, words: tuple[str, ...] | list[str]) -> list[int]:
    """Map label words to token ids, each of which must be exactly one token."""
    ids: list[int] = []
    for word in words:
        encoded = tokenizer.encode(word, add_special_tokens=False)
        if len(encoded) != 1:
            pieces = tokenizer.convert_ids_to_tokens(encoded)
            raise ValueError(
                f"label word {word!r} is {len(encoded)} tokens {pieces} for this tokenizer, not one; "
                "choose label words that are single tokens, or pass label_token_ids directly"
            )
        ids.append(encoded[0])
    return ids
