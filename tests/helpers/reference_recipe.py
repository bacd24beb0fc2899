"""An independent implementation of the official Qwen3-Reranker transformers recipe, for parity tests.

Written from the model card's recipe, not from genscore's code: full logits, left padding, the body
tokenized as one string and tail-truncated, softmax over the yes/no logits in float64.
"""

from __future__ import annotations

from typing import Any

import torch

QWEN3_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
QWEN3_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
QWEN3_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
YES_ID, NO_ID = 9693, 2152


def official_qwen3_ids(tokenizer: Any, query: str, document: str) -> list[int]:
    """The model card's prompt of one pair as token ids, untruncated (for pairs that fit)."""
    body = f"<Instruct>: {QWEN3_INSTRUCTION}\n<Query>: {query}\n<Document>: {document}"
    return (
        tokenizer.encode(QWEN3_PREFIX, add_special_tokens=False)
        + tokenizer.encode(body, add_special_tokens=False)
        + tokenizer.encode(QWEN3_SUFFIX, add_special_tokens=False)
    )


def official_qwen3_scores(
    model: Any,
    tokenizer: Any,
    pairs: list[tuple[str, str]],
    max_length: int,
    batch_size: int = 8,
    instruction: str = QWEN3_INSTRUCTION,
) -> list[float]:
    """``instruction`` is the recipe's ``format_instruction`` argument (the card's default if not given)."""
    prefix_ids = tokenizer.encode(QWEN3_PREFIX, add_special_tokens=False)
    suffix_ids = tokenizer.encode(QWEN3_SUFFIX, add_special_tokens=False)
    texts = [f"<Instruct>: {instruction}\n<Query>: {q}\n<Document>: {d}" for q, d in pairs]
    scores: list[float] = []
    for start in range(0, len(texts), batch_size):
        encoded = tokenizer(
            texts[start : start + batch_size],
            padding=False,
            truncation="longest_first",
            return_attention_mask=False,
            max_length=max_length - len(prefix_ids) - len(suffix_ids),
        )
        encoded["input_ids"] = [prefix_ids + ids + suffix_ids for ids in encoded["input_ids"]]
        tokenizer.padding_side = "left"
        batch = tokenizer.pad(encoded, padding=True, return_tensors="pt")
        with torch.no_grad():
            logits = model(**batch).logits[:, -1, :].double()  # full logits, as the recipe does
        pair_logits = torch.stack([logits[:, NO_ID], logits[:, YES_ID]], dim=1)
        scores.extend(torch.log_softmax(pair_logits, dim=1)[:, 1].exp().tolist())
    return scores


def full_vocab_label_prob(model: Any, prompt_ids: list[int], label_id: int) -> float:
    """P(label) at the last position under the plain full-vocabulary softmax, in float64."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt_ids])).logits[0, -1].double()
    return float(torch.log_softmax(logits, dim=-1)[label_id].exp())


def label_softmax_prob(model: Any, prompt_ids: list[int], label_ids: list[int]) -> float:
    """P(label 0) normalised over the label tokens, from full logits in float64."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt_ids])).logits[0, -1].double()
    return float(torch.softmax(logits[label_ids], dim=-1)[0])


# -- mixedbread's mxbai-rerank-v2 recipe (mxbai_rerank/mxbai_rerank_v2.py), reimplemented -------------
# Every piece is tokenized on its own and the ids concatenated; the query piece is cut to 3/4 of the
# budget, the document piece after the separator with prepare_for_model(truncation="only_second").

MXBAI_PREFIX = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\n"
)
MXBAI_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
MXBAI_TASK = (
    "You are a search relevance expert who evaluates how well documents match search queries. For each "
    "query-document pair, carefully analyze the semantic relationship between them, then provide your "
    "binary relevance judgment (0 for not relevant, 1 for relevant).\nRelevance:"
)


def _ids(tokenizer: Any, text: str, limit: int | None = None) -> list[int]:
    if limit is None:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer(text, add_special_tokens=False, max_length=limit, truncation=True)["input_ids"])


def only_second(first: list[int], second: list[int], max_length: int) -> list[int]:
    """``prepare_for_model(first, second, truncation="only_second", max_length=...)`` of transformers 4
    (transformers 5 dropped it from fast tokenizers): the second sequence loses its last tokens."""
    excess = len(first) + len(second) - max_length
    if excess > len(second):
        raise ValueError("the first sequence alone is over max_length")
    return first + (second[: len(second) - excess] if excess > 0 else second)


def mxbai_fixed_tokens(tokenizer: Any) -> int:
    """What mixedbread calls the predefined length: prefix, separator, task and suffix."""
    return sum(len(_ids(tokenizer, t)) for t in (MXBAI_PREFIX, "\n", MXBAI_TASK, MXBAI_SUFFIX))


def mxbai_reference_ids(
    tokenizer: Any,
    pairs: list[tuple[str, str]],
    *,
    max_length: int,
    model_max_length: int,
    instruction: str | None = None,
) -> list[list[int]]:
    """Prompt ids exactly as mixedbread's ``prepare_inputs`` builds them (before padding)."""
    sep = _ids(tokenizer, "\n")
    fixed = mxbai_fixed_tokens(tokenizer)
    budget = min(max_length, model_max_length - fixed)
    prompts = []
    for query, document in pairs:
        query_text = f"query: {query}"
        if instruction:
            query_text = f"instruction: {instruction}\n" + query_text
        query_ids = _ids(tokenizer, query_text, budget * 3 // 4)
        doc_ids = _ids(
            tokenizer, f"document: {document}", min(model_max_length - len(query_ids) - fixed, budget)
        )
        prompts.append(
            _ids(tokenizer, MXBAI_PREFIX)
            + only_second(query_ids, sep + doc_ids, budget)
            + sep
            + _ids(tokenizer, MXBAI_TASK)
            + _ids(tokenizer, MXBAI_SUFFIX)
        )
    return prompts


# -- FlagEmbedding's bge-reranker-v2-gemma recipe (the model card's get_inputs), reimplemented ---------

BGE_PROMPT = (
    "Given a query A and a passage B, determine whether the passage contains an answer to the query by "
    "providing a prediction of either 'Yes' or 'No'."
)


def bge_reference_ids(tokenizer: Any, pairs: list[tuple[str, str]], *, max_length: int) -> list[list[int]]:
    """Prompt ids as the model card's ``get_inputs`` builds them (before padding)."""
    sep = _ids(tokenizer, "\n")
    prompt = _ids(tokenizer, BGE_PROMPT)
    prompts = []
    for query, passage in pairs:
        query_ids = _ids(tokenizer, f"A: {query}", max_length * 3 // 4)
        passage_ids = _ids(tokenizer, f"B: {passage}", max_length)
        prompts.append(
            only_second([tokenizer.bos_token_id, *query_ids], sep + passage_ids, max_length) + sep + prompt
        )
    return prompts


def last_logits_left_padded(model: Any, prompts: list[list[int]], pad_id: int) -> torch.Tensor:
    """Full next-token logits at the last position of each prompt, left-padded as the recipes do,
    in float64: [N, V]."""
    width = max(map(len, prompts))
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -1]
    return logits.double()


def reference_yes_logits(model: object, tokenizer: object, query: str, documents: list[str]) -> list[float]:
    """The "yes" logit of each document's prompt, built by the official recipe, from full logits."""
    prefix = tokenizer.encode(QWEN3_PREFIX, add_special_tokens=False)  # type: ignore[attr-defined]
    suffix = tokenizer.encode(QWEN3_SUFFIX, add_special_tokens=False)  # type: ignore[attr-defined]
    logits = []
    for document in documents:
        body = tokenizer.encode(  # type: ignore[attr-defined]
            f"<Instruct>: {QWEN3_INSTRUCTION}\n<Query>: {query}\n<Document>: {document}",
            add_special_tokens=False,
        )
        with torch.no_grad():
            out = model(input_ids=torch.tensor([prefix + body + suffix])).logits[0, -1].double()  # type: ignore[operator]
        logits.append(float(out[YES_ID]))
    return logits
