"""A long query beside a long instruction: the query keeps its share of what the instruction leaves,
and the prompt equals the official recipe's for the query cut there."""

from __future__ import annotations

import pytest

from genscore_core import GenerativeScorer
from tests.helpers.reference_recipe import NO_ID, QWEN3_PREFIX, QWEN3_SUFFIX, YES_ID, label_softmax_prob

MAX_LENGTH = 512
INSTRUCTION = "Judge relevance carefully. " * 50  # about 200 tokens


def test_a_long_query_beside_a_long_instruction_is_cut_to_its_share_of_the_room_left(
    scorer: GenerativeScorer,
) -> None:
    tokenizer = scorer.tokenizer
    judged = GenerativeScorer.from_model(
        scorer.model, tokenizer, max_length=MAX_LENGTH, instruction=INSTRUCTION
    )
    query = "long query words " * 330  # about 1000 tokens, more than the whole prompt
    documents = ["short doc", "another doc " * 50]
    ranked = judged.rerank(query, documents)
    assert all(r.truncated and r.prompt_tokens <= MAX_LENGTH for r in ranked)

    # The reference: the recipe's strings, the query cut after query_share (0.75) of the body
    # tokens the instruction and template text leave, the body then tail-truncated by the tokenizer.
    prefix = tokenizer.encode(QWEN3_PREFIX, add_special_tokens=False)
    suffix = tokenizer.encode(QWEN3_SUFFIX, add_special_tokens=False)
    budget = MAX_LENGTH - len(prefix) - len(suffix)
    fixed = len(
        tokenizer.encode(f"<Instruct>: {INSTRUCTION}\n<Query>: \n<Document>: ", add_special_tokens=False)
    )
    keep = int((budget - fixed) * 0.75)
    query_offsets = tokenizer(query, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    short_query = query[: query_offsets[keep - 1][1]]
    by_index = {r.index: r for r in ranked}
    for index, document in enumerate(documents):
        body = tokenizer(
            f"<Instruct>: {INSTRUCTION}\n<Query>: {short_query}\n<Document>: {document}",
            add_special_tokens=False,
            truncation=True,
            max_length=budget,
        )["input_ids"]
        [prompt] = judged.encode(query, [document])
        assert prompt.token_ids == prefix + body + suffix
        expected = label_softmax_prob(scorer.model, prefix + body + suffix, [YES_ID, NO_ID])
        assert by_index[index].score == pytest.approx(expected, abs=1e-5)
