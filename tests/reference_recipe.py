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


def official_qwen3_scores(
    model: Any, tokenizer: Any, pairs: list[tuple[str, str]], max_length: int, batch_size: int = 8
) -> list[float]:
    prefix_ids = tokenizer.encode(QWEN3_PREFIX, add_special_tokens=False)
    suffix_ids = tokenizer.encode(QWEN3_SUFFIX, add_special_tokens=False)
    texts = [f"<Instruct>: {QWEN3_INSTRUCTION}\n<Query>: {q}\n<Document>: {d}" for q, d in pairs]
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
