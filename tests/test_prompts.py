"""Templates, label resolution and truncation that keeps the template intact."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from genscore_core import (
    MXBAI_RERANK_V2,
    QWEN3_RERANKER,
    GenerativeScorer,
    InvalidRequestError,
    PromptTemplate,
    PromptTooLongError,
)
from genscore_core.prefixes import shared_prefix_length
from genscore_core.prompts import TemplatePromptBuilder, build_raw_prompts
from genscore_core.protocol import GenerativeScoringRequest
from genscore_core.templates import get_template, resolve_label_ids
from tests.helpers.reference_recipe import label_softmax_prob


def test_qwen3_preset_labels_are_the_real_ids(scorer: GenerativeScorer) -> None:
    assert scorer.template is QWEN3_RERANKER
    assert scorer.label_token_ids == [9693, 2152]


def test_mxbai_preset(scorer: GenerativeScorer) -> None:
    assert resolve_label_ids(scorer.tokenizer, MXBAI_RERANK_V2.label_words) == [16, 15]
    assert get_template("auto", "mixedbread-ai/mxbai-rerank-base-v2") is MXBAI_RERANK_V2
    body = MXBAI_RERANK_V2.render_body("q?", "doc", "be strict")
    assert body.text == "instruction: be strict\nquery: q?\ndocument: doc"
    assert [text for _, text in body.pieces()] == ["instruction: be strict\nquery: q?", "\n", "document: doc"]
    assert MXBAI_RERANK_V2.suffix.endswith("Relevance:<|im_end|>\n<|im_start|>assistant\n")
    assert MXBAI_RERANK_V2.render_body("q", "d").text.startswith("query: q\n")


def test_label_word_that_is_not_one_token(scorer: GenerativeScorer) -> None:
    with pytest.raises(ValueError, match="label word 'relevant document' is 2 tokens"):
        resolve_label_ids(scorer.tokenizer, ["relevant document"])


def test_unknown_template_and_bad_bodies() -> None:
    with pytest.raises(ValueError, match="unknown template 'nope'"):
        get_template("nope")
    with pytest.raises(ValueError, match="unknown placeholders"):
        PromptTemplate(name="x", body="{query} {document} {passage}", label_words=("yes",))
    with pytest.raises(ValueError, match=r"\{document\} exactly once"):
        PromptTemplate(name="x", body="{query}", label_words=("yes",))


def test_a_piece_holding_the_query_and_the_document_is_refused(scorer: GenerativeScorer) -> None:
    one_piece = {
        "name": "one-piece",
        "prefix": "<|im_start|>",
        "tokenization": "pieces",
        "label_words": ("yes", "no"),
    }
    # The query's piece is capped at its share of the budget: with the document in it, a prompt that
    # fits lost the document's end and the answer cue ("...word word", no "Relevant?").
    with pytest.raises(ValueError, match=r"\{query\} and \{document\} in different body_pieces"):
        PromptTemplate(**one_piece, body_pieces=("Query: {query}\nDocument: {document}\nRelevant?",))
    split = PromptTemplate(**one_piece, body_pieces=("Query: {query}\n", "Document: {document}\nRelevant?"))
    [prompt] = TemplatePromptBuilder(scorer.tokenizer, split, max_length=128).build(
        "capital?", ["word " * 100]
    )
    assert not prompt.truncated
    assert scorer.tokenizer.decode(prompt.token_ids).endswith("word \nRelevant?")


def test_instruction_without_placeholder_is_rejected(scorer: GenerativeScorer) -> None:
    template = PromptTemplate(
        name="plain", body="Q: {query}\nD: {document}\nRelevant:", label_words=(" yes", " no")
    )
    with pytest.raises(ValueError, match="no \\{instruction\\} placeholder"):
        TemplatePromptBuilder(scorer.tokenizer, template, max_length=64, instruction="do it")


def test_user_template_builds_exact_prompt(scorer: GenerativeScorer) -> None:
    template = PromptTemplate(
        name="plain",
        prefix="<|im_start|>",
        body="Q: {query}\nD: {document}\nRelevant:",
        label_words=(" yes", " no"),
    )
    tokenizer = scorer.tokenizer
    builder = TemplatePromptBuilder(tokenizer, template, max_length=64)
    [prompt] = builder.build("capital?", ["Paris"])
    expected = tokenizer.encode("<|im_start|>", add_special_tokens=False) + tokenizer.encode(
        "Q: capital?\nD: Paris\nRelevant:", add_special_tokens=False
    )
    assert prompt.token_ids == expected
    assert not prompt.truncated


def test_truncation_keeps_prefix_and_suffix(scorer: GenerativeScorer) -> None:
    tokenizer = scorer.tokenizer
    builder = TemplatePromptBuilder(tokenizer, QWEN3_RERANKER, max_length=120)
    long_doc = "Paris is a city on the Seine. " * 80
    [short, long] = builder.build("capital of France", ["Paris.", long_doc])
    assert not short.truncated and long.truncated
    assert len(long.token_ids) == 120
    assert long.token_ids[: len(builder.prefix_ids)] == builder.prefix_ids
    assert long.token_ids[-len(builder.suffix_ids) :] == builder.suffix_ids
    text = tokenizer.decode(long.token_ids)
    assert "<Query>: capital of France\n<Document>: Paris is a city" in text
    assert text.endswith("<think>\n\n</think>\n\n")


def test_long_query_is_capped_at_its_share(scorer: GenerativeScorer) -> None:
    builder = TemplatePromptBuilder(scorer.tokenizer, QWEN3_RERANKER, max_length=150, query_share=0.5)
    [prompt] = builder.build("why " * 400, ["the document survives " * 50])
    assert prompt.truncated and len(prompt.token_ids) == 150
    text = scorer.tokenizer.decode(prompt.token_ids)
    assert "<Document>: the document survives" in text
    assert text.count("why") <= int(builder.body_budget * 0.5)


def test_settings_that_fit_no_document_are_refused_when_the_scorer_is_built(
    scorer: GenerativeScorer, tiny_model_dir: Path
) -> None:
    # An instruction that overflows the budget was accepted, and then every document was refused
    # ("document 0 cannot fit"), each call, or each row of a job.
    with pytest.raises(ValueError, match=r"max_length=80 leaves no room for a document: .* takes 100 tokens"):
        TemplatePromptBuilder(scorer.tokenizer, QWEN3_RERANKER, max_length=80, instruction="be strict " * 20)
    [empty] = TemplatePromptBuilder(scorer.tokenizer, QWEN3_RERANKER, max_length=512).build("", [""])
    fixed = len(empty.token_ids)  # the template and default instruction, nothing else
    with pytest.raises(ValueError, match=rf"max_length={fixed - 1} leaves no room for a document"):
        GenerativeScorer(str(tiny_model_dir), device="cpu", max_length=fixed - 1)
    exact = GenerativeScorer.from_model(scorer.model, scorer.tokenizer, max_length=fixed)
    assert exact.score_pairs([("", "")])[0] == pytest.approx(scorer.score_pairs([("", "")])[0], abs=1e-6)


def test_a_pair_that_cannot_fit_is_named_by_its_position_among_all_pairs(tiny_model_dir: Path) -> None:
    # Pairs are grouped by query; the error still names the pair's place in the caller's list.
    probe = TemplatePromptBuilder(
        AutoTokenizer.from_pretrained(str(tiny_model_dir)), QWEN3_RERANKER, max_length=512
    )
    [exact] = probe.build("", ["ok"])
    # An empty query and "ok" fill the prompt exactly: any query token leaves "ok" no room.
    max_length = len(exact.token_ids)
    scorer = GenerativeScorer(str(tiny_model_dir), device="cpu", max_length=max_length, query_share=0.9)
    pairs = [("", "ok"), ("why " * 100, "ok"), ("", "ok"), ("why " * 100, "ok")]
    with pytest.raises(PromptTooLongError, match="the query cannot fit beside document 1") as caught:
        scorer.score_pairs(pairs)
    assert caught.value.index == 1 and caught.value.param == "query"
    chunking = GenerativeScorer.from_model(
        scorer.model, scorer.tokenizer, max_length=max_length, query_share=0.9, long_documents="chunk"
    )
    with pytest.raises(PromptTooLongError, match="the query cannot fit beside document 1") as caught:
        chunking.score_pairs(pairs)
    assert caught.value.index == 1


def test_max_length_smaller_than_template(scorer: GenerativeScorer) -> None:
    with pytest.raises(ValueError, match="leaves no room for a body"):
        TemplatePromptBuilder(scorer.tokenizer, QWEN3_RERANKER, max_length=20)


def test_raw_mode_shortens_the_item_not_the_tail(scorer: GenerativeScorer) -> None:
    request = GenerativeScoringRequest(
        query=[1, 2, 3], items=[[10, 11, 12, 13, 14, 15], [20]], label_token_ids=[5]
    )
    [long, short] = build_raw_prompts(scorer.tokenizer, request, max_length=6)
    assert long.token_ids == [1, 2, 3, 10, 11, 12] and long.truncated
    assert short.token_ids == [1, 2, 3, 20] and not short.truncated
    flipped = request.model_copy(update={"item_first": True})
    [long, _] = build_raw_prompts(scorer.tokenizer, flipped, max_length=6)
    assert long.token_ids == [10, 11, 12, 1, 2, 3]
    with pytest.raises(PromptTooLongError, match="leaves no room for item 0"):
        build_raw_prompts(scorer.tokenizer, request, max_length=3)


def test_a_raw_query_too_long_is_refused_with_a_true_length(scorer: GenerativeScorer) -> None:
    # Its text is cut before tokenization: the error said "the query is 9182 tokens" of a query of
    # 300,000, the count of what was tokenized.
    query = "1234567890" * 30_000
    length = len(scorer.tokenizer.encode(query, add_special_tokens=False))
    request = GenerativeScoringRequest(query=query, items=["an item"], label_token_ids=[5])
    with pytest.raises(PromptTooLongError, match=r"the query is at least (\d+) tokens") as caught:
        build_raw_prompts(scorer.tokenizer, request, max_length=100)
    stated = re.search(r"at least (\d+)", str(caught.value))
    assert stated is not None and 100 < int(stated.group(1)) <= length
    short = request.model_copy(update={"query": "why " * 120})
    tokens = len(scorer.tokenizer.encode("why " * 120))
    with pytest.raises(PromptTooLongError, match=rf"the query is {tokens} tokens, which leaves no room"):
        build_raw_prompts(scorer.tokenizer, short, max_length=100)


def test_raw_mode_special_tokens_apply_to_the_query_only(scorer: GenerativeScorer) -> None:
    request = GenerativeScoringRequest(
        query="hi", items=["there"], label_token_ids=[5], add_special_tokens=False
    )
    [prompt] = build_raw_prompts(scorer.tokenizer, request, max_length=64)
    tokenizer = scorer.tokenizer
    assert prompt.token_ids == tokenizer.encode("hi", add_special_tokens=False) + tokenizer.encode(
        "there", add_special_tokens=False
    )


def test_scores_report_truncation(scorer: GenerativeScorer) -> None:
    ranked = scorer.rerank("capital", ["short", "long " * 2000])
    by_index = {r.index: r for r in ranked}
    assert not by_index[0].truncated and by_index[1].truncated
    assert by_index[1].prompt_tokens == scorer.max_length


def test_shared_prefix_length() -> None:
    assert shared_prefix_length([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == 2
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2  # one token always stays unshared
    assert shared_prefix_length([[7]]) == 0
    assert shared_prefix_length([]) == 0


def test_shared_prefix_length_matches_a_token_by_token_scan() -> None:
    rng = random.Random(3)
    for _ in range(300):
        base = [rng.randrange(4) for _ in range(rng.randint(1, 12))]
        prompts = [base[: rng.randint(1, len(base))] + [rng.randrange(4) for _ in range(rng.randint(0, 3))]]
        prompts += [list(p) for p in prompts] * rng.randint(0, 2)
        prompts += [base[: rng.randint(1, len(base))] for _ in range(rng.randint(0, 3))]
        limit = min(map(len, prompts)) - 1
        expected = 0
        while expected < limit and len({p[expected] for p in prompts}) == 1:
            expected += 1
        assert shared_prefix_length(prompts) == expected, prompts


def test_token_ids_without_offsets_match_the_tokenizer_call(scorer: GenerativeScorer) -> None:
    import threading

    from genscore_core.prompts import token_ids

    tokenizer = scorer.tokenizer
    texts = ["plain words here", "<|im_end|> inside a document", "émigré naïve 東京 🙂", "", "  spaces  "]
    expected = tokenizer(texts, add_special_tokens=False)["input_ids"]
    assert token_ids(tokenizer, texts, threading.Lock()) == expected
    # A backend left truncating by an earlier call is not used directly: the wrapper's call is.
    tokenizer.backend_tokenizer.enable_truncation(2)
    try:
        assert token_ids(tokenizer, texts, threading.Lock()) == expected
    finally:
        tokenizer.backend_tokenizer.no_truncation()


def test_only_bodies_over_budget_are_tokenized_with_offsets(scorer: GenerativeScorer) -> None:
    builder = TemplatePromptBuilder(scorer.tokenizer, get_template("qwen3-reranker"), max_length=160)
    documents = ["short one", "word " * 400, "another short one", "x"]
    calls: list[int] = []
    original = builder.tokenization._tokenize

    def counting(texts: list[str]) -> tuple[list[list[int]], list[list[tuple[int, int]]]]:
        calls.append(len(texts))
        return original(texts)

    builder.tokenization._tokenize = counting  # type: ignore[method-assign]
    prompts = builder.build("a query", documents)
    assert calls == [1]  # the one long body, again with offsets
    assert [p.truncated for p in prompts] == [False, True, False, False]
    assert all(len(p.token_ids) <= 160 for p in prompts)
    # The same prompts as tokenizing every body with offsets.
    reference = TemplatePromptBuilder(scorer.tokenizer, get_template("qwen3-reranker"), max_length=160)
    bodies = [reference.template.render_body("a query", d, None) for d in documents]
    encoded = reference.tokenization.encode(bodies)
    by_offsets = [
        reference._fit("a query", d, b, ids, offs, i)
        for i, (d, b, (ids, offs)) in enumerate(zip(documents, bodies, encoded))
    ]
    assert [p.token_ids for p in prompts] == [
        reference.prefix_ids + ids + reference.suffix_ids for ids, _ in by_offsets
    ]


@pytest.mark.parametrize("forward", ["padded", "packed"])
def test_a_prompt_of_no_tokens_is_refused_by_name(scorer: GenerativeScorer, forward: str) -> None:
    # A template of placeholders alone: an empty query and document leave nothing to score (the padded
    # forward returned 0.5 for it, the packed one an IndexError).
    bare = PromptTemplate(name="bare", body="{query}{document}", label_words=("yes", "no"))
    bare_scorer = GenerativeScorer.from_model(
        scorer.model, scorer.tokenizer, template=bare, max_length=64, forward=forward
    )
    with pytest.raises(InvalidRequestError, match=r"documents\[1\]: its prompt holds no token") as caught:
        bare_scorer.rerank("", ["a document", ""])
    assert (caught.value.param, caught.value.index) == ("documents", 1)
    with pytest.raises(InvalidRequestError, match=r"documents\[2\]"):
        bare_scorer.score_pairs([("q", ""), ("", "d"), ("", "")])
    # Either text alone is a prompt, scored as the model scores it.
    [only_document] = bare_scorer.encode("", ["a document"])
    assert only_document.token_ids == scorer.tokenizer.encode("a document", add_special_tokens=False)
    [score] = bare_scorer.score_pairs([("", "a document")])
    assert score == pytest.approx(
        label_softmax_prob(scorer.model, only_document.token_ids, [9693, 2152]), abs=1e-5
    )


@pytest.mark.parametrize(
    "pieces",
    [
        ("Document: {document}\nQuery: {query}\nRelevant?",),
        ("Document: {document}\n", "Query: {query}\nRelevant?"),
    ],
    ids=["whole", "pieces"],
)
def test_truncation_keeps_the_template_text_after_the_document(
    scorer: GenerativeScorer, pieces: tuple[str, ...]
) -> None:
    # "word " + "\n" is one token: the document's last token runs into the template's "\n", and
    # dropping it lost that text ("...word wordQuery: ...").
    template = PromptTemplate(
        name="document-first",
        prefix="<|im_start|>",
        tokenization="pieces" if len(pieces) > 1 else "whole",
        body="".join(pieces),
        body_pieces=pieces if len(pieces) > 1 else (),
        label_words=("yes", "no"),
    )
    tokenizer = scorer.tokenizer
    builder = TemplatePromptBuilder(tokenizer, template, max_length=96)
    document = "word " * 300
    [prompt] = builder.build("capital?", [document])
    assert prompt.truncated and 94 <= len(prompt.token_ids) <= 96
    assert prompt.token_ids[: len(builder.prefix_ids)] == builder.prefix_ids
    body_ids = prompt.token_ids[len(builder.prefix_ids) :]
    body = tokenizer.decode(body_ids)
    assert body.startswith("Document: ") and body.endswith("\nQuery: capital?\nRelevant?")
    kept = body[len("Document: ") : -len("\nQuery: capital?\nRelevant?")]
    assert kept and document.startswith(kept)
    # The ids are the tokenizer's own for each piece, holding what was kept of the document.
    filled = template.render_body("capital?", kept)
    expected = [t for _, text in filled.pieces() for t in tokenizer.encode(text, add_special_tokens=False)]
    assert body_ids == expected
    bare = GenerativeScorer.from_model(scorer.model, tokenizer, template=template, max_length=96)
    [score] = bare.score_pairs([("capital?", document)])
    assert score == pytest.approx(label_softmax_prob(scorer.model, prompt.token_ids, [9693, 2152]), abs=1e-5)


@pytest.mark.timeout(120)  # the old code never returned on these
def test_a_document_cut_into_the_template_text_after_it_ends_and_keeps_that_text(
    scorer: GenerativeScorer,
) -> None:
    # The document "\r\n" before the template's "\n\n" was cut to "\r" ("\r\n\n" one token), which
    # fit; the next round read that token as the document's and put the template's "\n\n" back into
    # the document, and so on forever.
    tokenizer = scorer.tokenizer
    rng = random.Random(11)
    atoms = ["\r\n", "\n", " ", "  ", "\t", "word", "?", ".", "!!", "中文", "😀", "é", "123", "-", "—"]
    bodies = ["{query}\n{document}\n\n", "Q: {query}\nD: {document}\nRelevant?", "{document}. Q:{query}?"]
    cases = [("{query}\n{document}\n\n", "", "\r\n", 2)]
    for _ in range(400):
        document = "".join(rng.choice(atoms) for _ in range(rng.randint(1, 40)))
        cases.append((rng.choice(bodies), rng.choice(["", "q"]), document, rng.randint(2, 30)))
    cut = 0
    for body, query, document, max_length in cases:
        template = PromptTemplate(name="custom", body=body, label_words=("yes",))
        try:
            builder = TemplatePromptBuilder(tokenizer, template, max_length=max_length)
        except ValueError:  # the template's own text is over max_length: refused when built
            continue
        try:
            [prompt] = builder.build(query, [document])
        except PromptTooLongError:
            continue
        assert len(prompt.token_ids) <= max_length
        # The prompt reads as the template, whole, around a non-empty start of the document (cut
        # tokens can end inside a character's bytes: U+FFFD).
        before, after = template.render_body(query, "\x00").text.split("\x00")
        text = tokenizer.decode(prompt.token_ids)
        assert text.startswith(before) and text.endswith(after), (body, query, document, max_length)
        kept = text[len(before) : len(text) - len(after)].rstrip("\ufffd")
        assert kept and document.startswith(kept), (body, query, document, max_length)
        cut += prompt.truncated
    assert cut > 50


def test_label_token_ids_are_strict_and_named_as_ids(scorer: GenerativeScorer) -> None:
    from pydantic import ValidationError

    from genscore_core.loading import NotARerankerError

    fields = {"name": "by-id", "body": "{query} {document}"}
    # Lax parsing read True as token 1 and "9693" as 9693, as the protocol's strict ids do not.
    for labels in [(True, 2152), ("9693", 2152), (9693.0, 2152)]:
        with pytest.raises(ValidationError, match="label_token_ids"):
            PromptTemplate(**fields, label_token_ids=labels)
    template = PromptTemplate(**fields, label_token_ids=(9693, 151669))
    with pytest.raises(NotARerankerError) as caught:
        GenerativeScorer.from_model(scorer.model, scorer.tokenizer, template=template)
    # Not "label word '151669'... the tokenizer does not belong to this model": no word was given.
    assert "label token id 151669 (entry 1 of the template's label_token_ids)" in str(caught.value)
    assert "vocabulary of 151669 ids" in str(caught.value)


def test_instruction_format_is_checked_when_the_template_is_made() -> None:
    fields = {"name": "x", "body": "{instruction}{query} {document}", "label_words": ("yes", "no")}
    # These failed only once an instruction was written into them (KeyError: 'lang').
    with pytest.raises(ValueError, match=r"no other placeholder, got \['instruction', 'lang'\]"):
        PromptTemplate(**fields, instruction_format="Task: {instruction} ({lang})\n")
    with pytest.raises(ValueError, match="instruction_format is not a format string"):
        PromptTemplate(**fields, instruction_format="Task: {instruction} {")
    with pytest.raises(ValueError, match=r"must contain \{instruction\} once"):
        PromptTemplate(**fields, instruction_format="Task: none")
    braces = PromptTemplate(**fields, instruction_format="{{task}}: {instruction}\n")
    assert braces.render_body("q", "d", "find").text == "{task}: find\nq d"
