"""Prompt templates of generative rerankers: data, checked once.

A template is ``prefix + body + suffix``. The prefix and suffix are fixed text (chat markup, the answer
cue); the body holds the placeholders ``{query}``, ``{document}`` and optionally ``{instruction}``.
Truncation only ever shortens what was substituted into the body, so the prefix and suffix survive.

A template also states how its reference code tokenizes (``tokenization``), because token ids differ
with it: Qwen3-Reranker's recipe tokenizes the filled body in one call, so "?\n" can become one token;
mixedbread's and FlagEmbedding's recipes tokenize each piece (query, separator, document, task) on its
own and concatenate the ids, so a piece boundary is always a token boundary.
"""

from __future__ import annotations

import re
import string
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from genscore_core.errors import InvalidRequestError

_PLACEHOLDERS = {"query", "document", "instruction"}

Tokenization = Literal["whole", "pieces"]
"""``"whole"``: the filled body is tokenized in one call; ``"pieces"``: each entry of ``body_pieces``
(and ``suffix_pieces``) is tokenized on its own and the ids are concatenated."""

ScoreMode = Literal["label-softmax", "vocab-softmax", "logit", "logit-sigmoid", "expected-grade"]
"""How a prompt's next-token logits become its score (docs/models.md):

* ``"label-softmax"``: softmax over the label tokens, read at the first label (two labels:
  sigmoid(logit_0 - logit_1)); in [0, 1]. The two-label probability, genscore's default.
* ``"vocab-softmax"``: the first label's probability under the full-vocabulary softmax; in [0, 1].
* ``"logit"``: the first label's raw logit (bge-reranker-v2-gemma's and single-token
  sentence-transformers models' score); any finite number.
* ``"logit-sigmoid"``: sigmoid of that logit; in [0, 1], for thresholds.
* ``"expected-grade"``: the expected grade over the label tokens, normalised to [0, 1]: with the
  labels listed from the best grade to the worst, label ``i`` of ``N`` has grade ``(N-1-i)/(N-1)``
  and the score is ``sum_i p_i * grade_i``, ``p`` the softmax over the label tokens (graded
  rerankers such as lightblue's lb-reranker, which answers 1 to 7).

A template's ``logit_temperature`` divides the label logits before ``label-softmax``,
``logit-sigmoid`` and ``expected-grade`` turn them into a score (zerank: ``sigmoid(logit / 5)``);
``logit`` stays the raw logit and ``vocab-softmax`` the model's own probability.
"""
SCORE_MODES: tuple[ScoreMode, ...] = (
    "label-softmax",
    "vocab-softmax",
    "logit",
    "logit-sigmoid",
    "expected-grade",
)


class Span(NamedTuple):
    """A half-open character range ``[start, end)``."""

    start: int
    end: int


class RenderedBody(NamedTuple):
    text: str
    query: Span
    document: Span
    piece_ends: tuple[int, ...] = ()
    """Character offset where each tokenization piece ends (``"pieces"`` templates); empty: one piece."""
    query_piece: int = 0
    """Index of the piece holding the query."""

    def pieces(self) -> list[tuple[int, str]]:
        """(start offset, text) of each piece, in order."""
        ends = self.piece_ends or (len(self.text),)
        starts = (0, *ends[:-1])
        return [(start, self.text[start:end]) for start, end in zip(starts, ends)]


class PromptTemplate(BaseModel):
    """How one reranker family turns (instruction, query, document) into a prompt."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    prefix: str = ""
    """Fixed text before the body, tokenized on its own (as the official recipes do)."""
    body: str = ""
    """Text with ``{query}``, ``{document}`` and optionally ``{instruction}``. With ``"pieces"``
    tokenization it may be left empty: it is then the concatenation of ``body_pieces``."""
    suffix: str = ""
    """Fixed text after the body (the answer cue), tokenized on its own (or piece by piece)."""
    label_words: tuple[str, ...] = ()
    """Words whose next-token logits make the score; the first is the positive label."""
    label_token_ids: tuple[StrictInt, ...] = ()
    """The label tokens as ids, when the model's configuration names ids rather than words
    (sentence-transformers' ``LogitScore``); they take precedence over ``label_words``. Strict, as the
    protocol's ids are: ``True`` or ``"9693"`` would otherwise read as token 1 or 9693."""
    default_instruction: str | None = None
    instruction_format: str = "{instruction}"
    """How a non-empty instruction is written into ``{instruction}``."""
    tokenization: Tokenization = "whole"
    """How the reference code tokenizes: ``"whole"`` (the filled body in one call, Qwen3-Reranker)
    or ``"pieces"`` (each of ``body_pieces`` and ``suffix_pieces`` on its own, ids concatenated:
    mxbai-rerank-v2, bge-reranker-v2-gemma)."""
    body_pieces: tuple[str, ...] = ()
    """``"pieces"`` only: the body split where the reference splits it; each piece tokenized alone,
    the piece holding ``{query}`` capped at the query share of the budget by dropping its last tokens,
    as the reference's tokenizer truncation does."""
    suffix_pieces: tuple[str, ...] = ()
    """``"pieces"`` only: the suffix split the same way (empty: the suffix is one piece)."""
    bos: bool = False
    """Start the body with the tokenizer's BOS token id (FlagEmbedding adds it by id, and counts it
    inside the length its query share is taken of, as genscore then does)."""
    score_mode: ScoreMode = "label-softmax"
    """The score the reference reports (``ScorerConfig.score_mode="auto"`` uses it)."""
    strip_texts: tuple[Literal["query", "document"], ...] = ()
    """Texts whose leading and trailing whitespace the reference removes before inserting them (a
    chat template's Jinja ``trim``, as Llama 3's applies to every message): they are stripped the same
    way (``str.strip``) before the prompt is built."""
    logit_temperature: float = Field(default=1.0, gt=0.0, allow_inf_nan=False)
    """What the label logits are divided by before ``label-softmax``, ``logit-sigmoid`` and
    ``expected-grade`` make a score of them, so that the 0-1 score is the family's own: zerank's
    reference score is ``sigmoid(logit / 5)``. ``logit`` mode stays the raw logit."""
    query_max_chars: int | None = Field(default=None, gt=0)
    """Characters of the query the reference keeps (it cuts the text before tokenizing, and before
    ``strip_texts``); ``None``: no cut."""
    document_max_chars: int | None = Field(default=None, gt=0)
    """Characters of each document the reference keeps, as ``query_max_chars`` (applied to what is
    tokenized: with ``long_documents="chunk"``, to each window)."""

    @model_validator(mode="before")
    @classmethod
    def _join_pieces(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("body_pieces") and not data.get("body"):
            data = {**data, "body": "".join(data["body_pieces"])}
        if isinstance(data, dict) and data.get("suffix_pieces") and not data.get("suffix"):
            data = {**data, "suffix": "".join(data["suffix_pieces"])}
        return data

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

    @field_validator("label_words", "label_token_ids", "strip_texts")
    @classmethod
    def _labels(cls, labels: tuple[Any, ...]) -> tuple[Any, ...]:
        if len(set(labels)) != len(labels):
            raise ValueError(f"labels must be distinct, got {list(labels)}")
        return labels

    @field_validator("instruction_format")
    @classmethod
    def _instruction_placeholder(cls, instruction_format: str) -> str:
        # Checked here, not when an instruction is first written into it (a KeyError naming the
        # stray field, or a ValueError about a single brace, from the first scorer given one).
        try:
            names = [
                field for _, field, _, _ in string.Formatter().parse(instruction_format) if field is not None
            ]
        except ValueError as error:
            raise ValueError(
                f"instruction_format is not a format string ({error}); write a literal brace as {{{{ or }}}}"
            ) from None
        if names != ["instruction"]:
            raise ValueError(
                f"instruction_format must contain {{instruction}} once and no other placeholder, got {names}; "
                "write a literal brace as {{ or }}"
            )
        return instruction_format

    @model_validator(mode="after")
    def _consistent(self) -> PromptTemplate:
        if not self.label_words and not self.label_token_ids:
            raise ValueError("a template needs at least one label (label_words or label_token_ids)")
        if self.tokenization == "whole":
            if self.body_pieces or self.suffix_pieces:
                raise ValueError('body_pieces and suffix_pieces need tokenization="pieces"')
            return self
        if not self.body_pieces:
            raise ValueError('tokenization="pieces" needs body_pieces')
        if "".join(self.body_pieces) != self.body:
            raise ValueError("body_pieces must join to the body")
        if self.suffix_pieces and "".join(self.suffix_pieces) != self.suffix:
            raise ValueError("suffix_pieces must join to the suffix")
        for placeholder in ("{query}", "{document}"):
            if not any(placeholder in piece for piece in self.body_pieces):
                raise ValueError(f"a placeholder may not straddle pieces: no piece holds {placeholder}")
        if any("{query}" in piece and "{document}" in piece for piece in self.body_pieces):
            # The piece holding the query is cut to the query's share of the budget, as the
            # references cut their query piece: with the document in it too, the document and any
            # template text after it (the answer cue) would be cut even from a prompt that fits.
            raise ValueError(
                'tokenization="pieces" needs {query} and {document} in different body_pieces: the '
                "piece holding the query is capped at its share of the budget. Split the piece where "
                'the reference tokenizes separately, or use tokenization="whole"'
            )
        return self

    @property
    def labels(self) -> tuple[str | int, ...]:
        """The labels as configured: token ids where given, else words."""
        return self.label_token_ids or self.label_words

    @property
    def takes_instruction(self) -> bool:
        return "{instruction}" in self.body

    def inserted(self, query: str, documents: list[str]) -> tuple[str, list[str]]:
        """The query and documents as the reference inserts them: cut to ``query_max_chars`` and
        ``document_max_chars``, then stripped (``strip_texts``)."""
        if self.query_max_chars is not None:
            query = query[: self.query_max_chars]
        if self.document_max_chars is not None:
            cap = self.document_max_chars
            documents = [document[:cap] for document in documents]
        if "query" in self.strip_texts:
            query = query.strip()
        if "document" in self.strip_texts:
            documents = [document.strip() for document in documents]
        return query, documents

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
        piece_ends: list[int] = []
        length = 0
        query_piece = 0
        for number, piece in enumerate(self.body_pieces or (self.body,)):
            for literal, field, _, _ in string.Formatter().parse(piece):
                parts.append(literal)
                length += len(literal)
                if field is not None:
                    if field == "query":
                        query_piece = number
                    value = values[field]
                    spans[field] = Span(length, length + len(value))
                    parts.append(value)
                    length += len(value)
            piece_ends.append(length)
        ends = tuple(piece_ends) if self.tokenization == "pieces" else ()
        return RenderedBody("".join(parts), spans["query"], spans["document"], ends, query_piece)


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

_MXBAI_TASK = (
    "You are a search relevance expert who evaluates how well documents match search queries. For each "
    "query-document pair, carefully analyze the semantic relationship between them, then provide your "
    "binary relevance judgment (0 for not relevant, 1 for relevant).\nRelevance:"
)

MXBAI_RERANK_V2 = PromptTemplate(
    name="mxbai-rerank-v2",
    prefix=(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
        "<|im_end|>\n<|im_start|>user\n"
    ),
    # mixedbread's reference: the instruction and query as one string, then "\n", the document, "\n",
    # the task and the chat suffix, each tokenized alone. The separator and task after the document
    # count as fixed tokens (suffix); the separator before it counts in the body's budget, as there.
    tokenization="pieces",
    body_pieces=("{instruction}query: {query}", "\n", "document: {document}"),
    suffix_pieces=("\n", _MXBAI_TASK, "<|im_end|>\n<|im_start|>assistant\n"),
    label_words=("1", "0"),
    instruction_format="instruction: {instruction}\n",
)

BGE_RERANKER_V2_GEMMA = PromptTemplate(
    name="bge-reranker-v2-gemma",
    # FlagEmbedding's model-card recipe: [BOS] + "A: {query}", then "\n" + "B: {passage}", then "\n" and
    # the task prompt, each tokenized alone; the score is the raw logit of "Yes".
    tokenization="pieces",
    bos=True,
    body_pieces=("A: {query}", "\n", "B: {document}"),
    suffix_pieces=(
        "\n",
        "Given a query A and a passage B, determine whether the passage contains an answer to the query "
        "by providing a prediction of either 'Yes' or 'No'.",
    ),
    label_words=("Yes",),
    score_mode="logit-sigmoid",
)

ZERANK = PromptTemplate(
    name="zerank",
    # ZeroEntropy's modeling_zeranker.py: the query (its first 2,000 characters, stripped) as the system
    # message and the document (its first 10,000, stripped) as the user message of the Qwen3 chat
    # template, then the generation prompt, the rendered text tokenized in one call. The score is the
    # "Yes" logit at the last position; the reference's 0-1 score is sigmoid(logit / 5).
    prefix="<|im_start|>system\n",
    body="{query}<|im_end|>\n<|im_start|>user\n{document}",
    suffix="<|im_end|>\n<|im_start|>assistant\n",
    label_words=("Yes",),
    score_mode="logit-sigmoid",
    logit_temperature=5.0,
    strip_texts=("query", "document"),
    query_max_chars=2000,
    document_max_chars=10000,
)

CTXL_RERANK_V2 = PromptTemplate(
    name="ctxl-rerank-v2",
    # ContextualAI's model card: one string, document before query, an optional instruction after the
    # query behind a space, tokenized in one call; the score is the raw logit of vocabulary id 0 at
    # the last position (no sigmoid in the reference).
    body=(
        "Check whether a given document contains information helpful to answer the query.\n"
        "<Document> {document}\n<Query> {query}{instruction} ??"
    ),
    instruction_format=" {instruction}",
    label_token_ids=(0,),
    score_mode="logit",
)

_LB_SYSTEM = (
    "Given a query and a piece of text, output a score of 1-7 based on how related the query is to the "
    "text. 1 means least related and 7 is most related."
)

LB_RERANKER = PromptTemplate(
    name="lb-reranker",
    # lightblue's model card: a system message asking for a grade of 1 to 7, the user message
    # "<<<Query>>>\n{query}\n\n<<<Context>>>\n{text}" in the (Qwen2.5) chat template, then the
    # generation prompt; the score is the expected grade over the tokens "1" to "7".
    prefix=f"<|im_start|>system\n{_LB_SYSTEM}<|im_end|>\n<|im_start|>user\n",
    body="<<<Query>>>\n{query}\n\n<<<Context>>>\n{document}",
    suffix="<|im_end|>\n<|im_start|>assistant\n",
    # Best grade first, as every template lists its positive label first.
    label_words=("7", "6", "5", "4", "3", "2", "1"),
    score_mode="expected-grade",
)

TEMPLATES: dict[str, PromptTemplate] = {
    t.name: t
    for t in (QWEN3_RERANKER, MXBAI_RERANK_V2, BGE_RERANKER_V2_GEMMA, ZERANK, CTXL_RERANK_V2, LB_RERANKER)
}


def get_template(template: str | PromptTemplate | dict[str, Any], model_name: str = "") -> PromptTemplate:
    """Resolve a preset name, ``"auto"`` (picked from the model name) or a user-defined template.

    ``"auto"`` here looks at the name only; :func:`genscore_core.recipes.resolve_recipe` also reads the
    model folder (sentence-transformers modules, the architecture) and says what it picked.
    """
    if isinstance(template, PromptTemplate):
        return template
    if isinstance(template, dict):
        return PromptTemplate(**template)
    if template == "auto":
        return template_for_name(model_name) or QWEN3_RERANKER
    try:
        return TEMPLATES[template]
    except KeyError:
        raise ValueError(
            f"unknown template {template!r}; choose one of {sorted(TEMPLATES)} or 'auto', "
            "or pass a PromptTemplate"
        ) from None


def template_for_name(model_name: str) -> PromptTemplate | None:
    """The preset a model's name (a hub id or a path) points at, if any.

    The deepest folder that names a family wins: ``runs/mxbai-rerank-ft/checkpoint-500`` is an mxbai
    fine-tune, ``mxbai-experiments/qwen3-reranker-ft`` a Qwen3-Reranker one. Only when no single folder
    names one is the whole name read (``bge-reranker`` and ``gemma`` in two folders).
    """
    components = [part for part in re.split(r"[/\\]", model_name) if part]
    for component in reversed(components):
        preset = _preset_named_in(component)
        if preset is not None:
            return preset
    return _preset_named_in(model_name)


def _preset_named_in(text: str) -> PromptTemplate | None:
    name = text.lower()
    if "mxbai-rerank" in name:
        return MXBAI_RERANK_V2
    if "bge-reranker" in name and "gemma" in name:
        return BGE_RERANKER_V2_GEMMA
    if "qwen3-reranker" in name:
        return QWEN3_RERANKER
    if "zerank" in name:
        return ZERANK
    if "ctxl-rerank" in name:
        return CTXL_RERANK_V2
    if "lb-reranker" in name:
        return LB_RERANKER
    return None


def resolve_label_ids(tokenizer: Any, labels: PromptTemplate | tuple[str, ...] | list[str]) -> list[int]:
    """Map a template's labels (or label words) to token ids; each word must be exactly one token."""
    if isinstance(labels, PromptTemplate):
        if labels.label_token_ids:
            return list(labels.label_token_ids)
        labels = labels.label_words
    ids: list[int] = []
    for word in labels:
        encoded = tokenizer.encode(word, add_special_tokens=False)
        if len(encoded) != 1:
            pieces = tokenizer.convert_ids_to_tokens(encoded)
            raise ValueError(
                f"label word {word!r} is {len(encoded)} tokens {pieces} for this tokenizer, not one; "
                "choose label words that are single tokens, or pass label_token_ids directly"
            )
        ids.append(encoded[0])
    return ids
