"""Turning queries and items into token-id prompts: the protocol's raw mode and reranker templates."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from genscore_core.errors import PromptTooLongError
from genscore_core.protocol import GenerativeScoringRequest
from genscore_core.templates import PromptTemplate, RenderedBody
from genscore_core.truncation import drop_tail_of_range, query_token_cap, token_range, truncate_raw


@dataclass(frozen=True)
class EncodedPrompt:
    token_ids: list[int]
    truncated: bool
    """Whether the item (or query) was shortened to fit the maximum prompt length."""


class TemplatePromptBuilder:
    """Builds ``prefix + body + suffix`` prompts for one template, tokenizer and length budget.

    The body is tokenized as a whole, exactly as the official Qwen3-Reranker recipe does, so that
    tokens merging across placeholder boundaries come out the same; character offsets then tell which
    tokens belong to the document and the query.
    """

    def __init__(
        self,
        tokenizer: Any,
        template: PromptTemplate,
        *,
        max_length: int,
        instruction: str | None = None,
        query_share: float = 0.75,
        tokenizer_lock: threading.Lock | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.instruction = instruction
        self.query_share = query_share
        self._lock = tokenizer_lock or threading.Lock()
        with self._lock:
            self.prefix_ids: list[int] = tokenizer.encode(template.prefix, add_special_tokens=False)
            self.suffix_ids: list[int] = tokenizer.encode(template.suffix, add_special_tokens=False)
        self.max_length = max_length
        self.body_budget = max_length - len(self.prefix_ids) - len(self.suffix_ids)
        if self.body_budget <= 0:
            raise ValueError(
                f"max_length={max_length} leaves no room for a body: template {template.name!r} alone takes "
                f"{len(self.prefix_ids) + len(self.suffix_ids)} tokens"
            )
        # Fail early, not on the first request, if the template cannot take the instruction.
        template.render_body("", "", instruction)

    def _tokenize(self, texts: list[str]) -> tuple[list[list[int]], list[list[tuple[int, int]]]]:
        with self._lock:
            encoded = self.tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        return encoded["input_ids"], encoded["offset_mapping"]

    def build(self, query: str, documents: Sequence[str]) -> list[EncodedPrompt]:
        bodies = [self.template.render_body(query, doc, self.instruction) for doc in documents]
        all_ids, all_offsets = self._tokenize([body.text for body in bodies])
        prompts = []
        for index, (body, ids, offsets) in enumerate(zip(bodies, all_ids, all_offsets)):
            body_ids, truncated = self._fit(query, documents[index], body, ids, offsets, index)
            prompts.append(EncodedPrompt(self.prefix_ids + body_ids + self.suffix_ids, truncated))
        return prompts

    def _fit(
        self,
        query: str,
        document: str,
        body: RenderedBody,
        ids: list[int],
        offsets: list[tuple[int, int]],
        index: int,
    ) -> tuple[list[int], bool]:
        budget = self.body_budget
        if len(ids) <= budget:
            return ids, False
        query_tokens = token_range(offsets, body.query)
        cap = query_token_cap(budget, self.query_share)
        if query_tokens[1] - query_tokens[0] > cap:
            # Cut the query text at a token boundary and tokenize the body again, so that the text
            # after the query keeps its own tokens.
            cut_at = offsets[query_tokens[0] + cap - 1][1] - body.query.start
            body = self.template.render_body(query[: max(cut_at, 0)], document, self.instruction)
            [ids], [offsets] = self._tokenize([body.text])
        excess = len(ids) - budget
        if excess <= 0:
            return ids, True
        doc_tokens = token_range(offsets, body.document)
        if excess > doc_tokens[1] - doc_tokens[0]:
            raise PromptTooLongError(
                f"document {index} cannot fit: without it the prompt is still "
                f"{len(ids) - (doc_tokens[1] - doc_tokens[0]) + len(self.prefix_ids) + len(self.suffix_ids)} "
                f"tokens, over max_length={self.max_length}; shorten the instruction or raise max_length",
                param="documents",
                index=index,
            )
        return drop_tail_of_range(ids, doc_tokens, excess), True


def build_raw_prompts(
    tokenizer: Any,
    request: GenerativeScoringRequest,
    *,
    max_length: int,
    tokenizer_lock: threading.Lock | None = None,
) -> list[EncodedPrompt]:
    """The protocol's prompts: query and item concatenated at token level (item first if asked)."""
    lock = tokenizer_lock or threading.Lock()
    text_items = [item for item in request.items if isinstance(item, str)]
    with lock:
        if isinstance(request.query, str):
            query_ids: list[int] = tokenizer.encode(
                request.query, add_special_tokens=request.add_special_tokens
            )
        else:
            query_ids = list(request.query)
        encoded_text = tokenizer(text_items, add_special_tokens=False)["input_ids"] if text_items else []
    item_ids = iter(encoded_text)
    prompts = []
    for index, item in enumerate(request.items):
        ids = next(item_ids) if isinstance(item, str) else item
        prompt, truncated = truncate_raw(query_ids, ids, max_length, request.item_first, index)
        prompts.append(EncodedPrompt(prompt, truncated))
    return prompts


def shared_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the longest common prefix, leaving at least one token of every prompt unshared."""
    if not prompts:
        return 0
    first = list(prompts[0])
    length = max(min(len(p) for p in prompts) - 1, 0)
    for prompt in prompts:
        # Slices compare in C; only a mismatch is searched token by token, up to the shorter length.
        if list(prompt[:length]) != first[:length]:
            length = next(i for i in range(length) if prompt[i] != first[i])
    return length
