"""long_documents="chunk" and max_tokens_per_doc, against a window-by-window reference built on the
official Qwen3-Reranker recipe."""

from __future__ import annotations

import random
import tracemalloc
import unicodedata
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from genscore_core import GenerativeScorer, PromptTooLongError
from genscore_core.server import create_app
from tests.helpers.reference_recipe import (
    QWEN3_INSTRUCTION,
    QWEN3_PREFIX,
    QWEN3_SUFFIX,
    official_qwen3_scores,
)
from tests.helpers.server import TEST_LIMITS, serve_in_thread

MAX_LENGTH = 160
OVERLAP = 16
WORDS = "paris france capital river seine museum louvre berlin wall history london thames bridge".split()


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> tuple[object, object]:
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture(scope="module")
def chunking(scorer: GenerativeScorer) -> GenerativeScorer:
    return _chunker(scorer, MAX_LENGTH, chunk_overlap=OVERLAP)


def _document(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)) + "."


def reference_windows(tokenizer: object, query: str, document: str) -> list[tuple[int, int]]:
    """The documented rule, written out: a document whose official prompt fits max_length is one
    window; otherwise the room is what the official prompt with an empty document leaves of
    max_length; windows of that many of the document's own tokens, each starting room - overlap
    tokens after the last and ending where the next token starts, the last one at the document's end."""
    body = f"<Instruct>: {QWEN3_INSTRUCTION}\n<Query>: {query}\n<Document>: "
    fixed = tokenizer.encode(QWEN3_PREFIX, add_special_tokens=False) + tokenizer.encode(  # type: ignore[attr-defined]
        QWEN3_SUFFIX, add_special_tokens=False
    )
    if len(fixed) + len(tokenizer.encode(body + document, add_special_tokens=False)) <= MAX_LENGTH:  # type: ignore[attr-defined]
        return [(0, len(document))]
    room = MAX_LENGTH - len(fixed) - len(tokenizer.encode(body, add_special_tokens=False))  # type: ignore[attr-defined]
    offsets = tokenizer(document, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]  # type: ignore[operator]
    windows, start = [], 0
    while True:
        end = min(start + room, len(offsets))
        windows.append(
            (offsets[start][0] if start else 0, offsets[end][0] if end < len(offsets) else len(document))
        )
        if end == len(offsets):
            return windows
        start += room - OVERLAP


def test_chunked_documents_get_their_best_window(
    chunking: GenerativeScorer, reference: tuple[object, object]
) -> None:
    model, tokenizer = reference
    rng = random.Random(2)
    query = "Which river flows through Paris?"
    documents = [_document(rng, n) for n in (5, 60, 150, 400)]
    ranked = chunking.rerank(query, documents)
    by_index = {r.index: r for r in ranked}
    for index, document in enumerate(documents):
        spans = reference_windows(tokenizer, query, document)
        window_scores = official_qwen3_scores(
            model, tokenizer, [(query, document[a:b]) for a, b in spans], max_length=MAX_LENGTH
        )
        best = max(range(len(spans)), key=lambda i: window_scores[i])
        result = by_index[index]
        assert result.windows == len(spans)
        assert result.score == pytest.approx(window_scores[best], abs=1e-5)
        if len(spans) == 1:
            assert result.window == (0, len(document)) and not result.truncated
        else:
            assert result.window == spans[best]
    assert max(r.windows for r in ranked) >= 4, "the long document must span several windows"


def test_other_aggregations(chunking: GenerativeScorer, reference: tuple[object, object]) -> None:
    model, tokenizer = reference
    query = "museum history"
    document = _document(random.Random(8), 300)
    spans = reference_windows(tokenizer, query, document)
    window_scores = official_qwen3_scores(
        model, tokenizer, [(query, document[a:b]) for a, b in spans], max_length=MAX_LENGTH
    )
    assert len(spans) >= 3
    for aggregation, expected in (
        ("mean", sum(window_scores) / len(window_scores)),
        ("first", window_scores[0]),
        ("last", window_scores[-1]),
    ):
        scorer = _chunker(chunking, MAX_LENGTH, chunk_overlap=OVERLAP, chunk_aggregation=aggregation)
        [result] = scorer.rerank(query, [document])
        assert result.score == pytest.approx(expected, abs=1e-5), aggregation


def test_max_tokens_per_doc_cuts_each_document(
    scorer: GenerativeScorer, reference: tuple[object, object]
) -> None:
    model, tokenizer = reference
    query = "capital of France"
    documents = [_document(random.Random(5), 40), "Paris."]
    cut = tokenizer(documents[0], add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"][9][
        1
    ]  # type: ignore[operator]
    expected = official_qwen3_scores(
        model, tokenizer, [(query, documents[0][:cut]), (query, documents[1])], max_length=scorer.max_length
    )
    ranked = scorer.rerank(query, documents, max_tokens_per_doc=10)
    by_index = {r.index: r for r in ranked}
    assert by_index[0].score == pytest.approx(expected[0], abs=1e-5) and by_index[0].truncated
    assert by_index[1].score == pytest.approx(expected[1], abs=1e-5) and not by_index[1].truncated
    with pytest.raises(ValueError, match="max_tokens_per_doc must be a positive integer"):
        scorer.rerank(query, documents, max_tokens_per_doc=0)


def test_rerank_endpoints_take_max_tokens_per_doc_and_name_windows(chunking: GenerativeScorer) -> None:
    query = "Which river flows through Paris?"
    documents = [_document(random.Random(3), n) for n in (4, 300)]
    with (
        serve_in_thread(create_app(chunking, TEST_LIMITS)) as live,
        httpx.Client(base_url=live.url, timeout=120.0) as client,
    ):
        for path in ("/v1/rerank", "/v2/rerank"):
            body = {"query": query, "documents": documents, "max_tokens_per_doc": 200}
            response = client.post(path, json=body)
            assert response.status_code == 200, response.text
            expected = chunking.rerank(query, documents, max_tokens_per_doc=200)
            got = response.json()["results"]
            assert [(r["index"], r["relevance_score"]) for r in got] == [(r.index, r.score) for r in expected]
            assert [r["window"] for r in got] == [list(r.window) for r in expected if r.window is not None]
            # Without the cap the long document has more windows: the cap applied before chunking.
            uncapped = chunking.rerank(query, documents)
            assert max(r.windows for r in uncapped) > max(r.windows for r in expected) >= 2
        bad = client.post(
            "/v1/rerank", json={"query": query, "documents": documents, "max_tokens_per_doc": 0}
        )
        assert bad.status_code == 422


def test_adapters_put_the_best_window_in_metadata(chunking: GenerativeScorer) -> None:
    from langchain_core.documents import Document
    from llama_index.core.schema import NodeWithScore, TextNode

    from genscore_integrations.langchain import WINDOW_KEY, GenerativeReranker
    from genscore_integrations.llama_index import GenerativeRerank

    query = "Which river flows through Paris?"
    texts = [_document(random.Random(6), n) for n in (6, 250)]
    expected = {r.index: r for r in chunking.rerank(query, texts)}
    assert expected[1].windows > 1

    compressed = GenerativeReranker(scorer=chunking, top_n=None).compress_documents(
        [Document(page_content=t, metadata={"source": i}) for i, t in enumerate(texts)], query
    )
    for document in compressed:
        result = expected[document.metadata["source"]]
        assert document.metadata[WINDOW_KEY] == list(result.window)  # type: ignore[arg-type]
        assert document.metadata["relevance_score"] == result.score

    nodes = [NodeWithScore(node=TextNode(text=t, id_=str(i)), score=0.5) for i, t in enumerate(texts)]
    reranked = GenerativeRerank(scorer=chunking, top_n=2).postprocess_nodes(nodes, query_str=query)
    for node in reranked:
        result = expected[int(node.node.node_id)]
        assert node.node.metadata[WINDOW_KEY] == list(result.window)  # type: ignore[arg-type]
        assert WINDOW_KEY in node.node.excluded_llm_metadata_keys
        assert node.score == result.score
    assert all(WINDOW_KEY not in n.node.metadata for n in nodes), "inputs stay untouched"


def _chunker(scorer: GenerativeScorer, max_length: int, **settings: object) -> GenerativeScorer:
    return GenerativeScorer.from_model(
        scorer.model, scorer.tokenizer, max_length=max_length, long_documents="chunk", **settings
    )


def _covered(spans: list[tuple[int, int]], length: int) -> bool:
    reach = 0
    for start, end in spans:
        if start > reach:
            return False
        reach = max(reach, end)
    return reach == length


def test_every_character_is_in_a_window_scored_whole(
    scorer: GenerativeScorer, reference: tuple[object, object]
) -> None:
    # CJK windows cut from the document's own tokens make more tokens in the prompt than alone.
    model, tokenizer = reference
    chunking = _chunker(scorer, 120, chunk_overlap=0)
    query = "what?"
    document = "東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다. " * 10
    prepared = chunking.front_end.prepare_pairs([(query, document)])
    spans = [(span.start, span.end) for span in prepared.spans]  # type: ignore[attr-defined]
    assert len(spans) > 2 and _covered(spans, len(document))
    assert not any(prompt.truncated for prompt in prepared.prompts)
    for (start, end), prompt in zip(spans, prepared.prompts):
        assert document[start:end] in tokenizer.decode(prompt.token_ids)  # type: ignore[attr-defined]
    expected = official_qwen3_scores(
        model, tokenizer, [(query, document[a:b]) for a, b in spans], max_length=120
    )
    [result] = chunking.rerank(query, [document])
    assert result.score == pytest.approx(max(expected), abs=1e-5) and not result.truncated


def test_windows_and_caps_keep_combining_marks(scorer: GenerativeScorer) -> None:
    chunking = _chunker(scorer, 90, chunk_overlap=3)
    for document in ("word " * 60 + "man\u0303", "e\u0301a\u0308o\u0302\u0323 n\u0303 " * 40):
        prepared = chunking.front_end.prepare_pairs([("q", document)])
        spans = [(span.start, span.end) for span in prepared.spans]  # type: ignore[attr-defined]
        assert len(spans) > 1 and _covered(spans, len(document))
        assert all(end == len(document) or not unicodedata.combining(document[end]) for _, end in spans)
    # The first two tokens of "cafe\u0301 au lait" are "caf" and the composed "é": the mark stays.
    [(_, capped)] = scorer.front_end.prepare_pairs(
        [("q", "cafe\u0301 au lait")], max_tokens_per_doc=2
    ).assemble([[0.5]])
    [whole] = scorer.encode("q", ["cafe\u0301"])
    assert capped.token_ids == whole.token_ids and capped.truncated


def test_a_query_that_fills_the_prompt_is_cut_as_truncation_cuts_it(
    scorer: GenerativeScorer, reference: tuple[object, object]
) -> None:
    model, tokenizer = reference
    truncating = GenerativeScorer.from_model(scorer.model, scorer.tokenizer, max_length=200)
    chunking = _chunker(scorer, 200, chunk_overlap=0)
    [empty] = truncating.encode("", [""])
    document = "alpha beta gamma " * 30  # 90 tokens
    for extra in (0, 1):
        query = "word " * (200 - len(empty.token_ids) - extra)
        [truncated] = truncating.encode(query, [document])
        prepared = chunking.front_end.prepare_pairs([(query, document)])
        # Every window holds the query truncation keeps, and a share of the prompt, not one token.
        kept = tokenizer.decode(truncated.token_ids).split("<Query>: ")[1].split("\n<Document>")[0]  # type: ignore[attr-defined]
        for prompt in prepared.prompts:
            assert tokenizer.decode(prompt.token_ids).split("<Query>: ")[1].startswith(kept + "\n<Document>")  # type: ignore[attr-defined]
        spans = [(span.start, span.end) for span in prepared.spans]  # type: ignore[attr-defined]
        assert 2 <= len(spans) <= 6 and _covered(spans, len(document))
        [result] = chunking.rerank(query, [document])
        expected = official_qwen3_scores(
            model, tokenizer, [(kept, document[a:b]) for a, b in spans], max_length=200
        )
        assert result.truncated and result.score == pytest.approx(max(expected), abs=1e-5)


def test_a_document_that_fits_exactly_is_one_window(scorer: GenerativeScorer) -> None:
    truncating = GenerativeScorer.from_model(scorer.model, scorer.tokenizer, max_length=120)
    chunking = _chunker(scorer, 120, chunk_aggregation="mean")
    query, base = "what?", "word " * 200
    [empty] = truncating.encode(query, [""])
    offsets = scorer.tokenizer(base, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    # The empty document's trailing space merges into the first word: one token more fits.
    document = base[: offsets[120 - len(empty.token_ids)][1]]
    [prompt] = truncating.encode(query, [document])
    assert len(prompt.token_ids) == 120 and not prompt.truncated
    [whole] = truncating.rerank(query, [document])
    [chunked] = chunking.rerank(query, [document])
    assert chunked.windows == 1 and chunked.window == (0, len(document)) and not chunked.truncated
    assert chunked.score == whole.score


def test_a_prompt_token_budget_refuses_a_huge_document_before_tokenizing_it_all(
    scorer: GenerativeScorer,
) -> None:
    front_end = _chunker(scorer, 96).front_end
    # Within the budget, the same windows as without one (and the tokenizer's bounds are computed).
    fitting = [("q", "lorem ipsum " * 500)]
    assert front_end.prepare_pairs(fitting, max_prompt_tokens=20_000).prompts == (
        front_end.prepare_pairs(fitting).prompts
    )
    pairs = [("q", "short"), ("q", "lorem ipsum " * 100_000)]  # 1.2M characters, about 200k tokens
    tracemalloc.start()
    try:
        with pytest.raises(PromptTooLongError, match=r"documents\[1\]") as caught:
            front_end.prepare_pairs(pairs, max_prompt_tokens=20_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert caught.value.param == "documents" and caught.value.index == 1
    # The offsets of every token would take over 20 MB; the budget's take a tenth of that.
    assert peak < 8_000_000, peak
    # Text without spaces cannot be tokenized in exact pieces: prefixes of growing length show it.
    cjk = [("q", "short"), ("q", "東京は日本の首都です。" * 60_000)]  # 660k characters
    tracemalloc.start()
    try:
        with pytest.raises(PromptTooLongError, match=r"documents\[1\]"):
            front_end.prepare_pairs(cjk, max_prompt_tokens=20_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16_000_000, peak
    # Its characters alone can prove it: refused without tokenizing.
    with pytest.raises(PromptTooLongError, match=r"documents\[1\] is 1200000 characters"):
        front_end.prepare_pairs(pairs, max_prompt_tokens=1_000)


def test_chunk_mode_caps_one_documents_tokens_by_default(
    scorer: GenerativeScorer, chunking: GenerativeScorer
) -> None:
    """Unbounded, one 8 MB document took +1,208 MB and 51 s for 446 windows (the server refused it
    with a 400): a document past chunk_max_tokens is refused, naming it and the cap."""
    from genscore_core.config import PromptSettings

    assert PromptSettings().chunk_max_tokens == 262_144  # genscore serve's default --max-prompt-tokens
    capped = _chunker(scorer, MAX_LENGTH, chunk_overlap=OVERLAP, chunk_max_tokens=400)
    rng = random.Random(11)
    within = _document(rng, 300)
    assert 300 < len(scorer.tokenizer(within)["input_ids"]) <= 400
    assert [r.model_dump() for r in capped.rerank("q", [within])] == [
        r.model_dump() for r in chunking.rerank("q", [within])
    ]
    past = _document(rng, 2_000)
    cap_message = r"more than chunk_max_tokens=400, the most one document may have .* raise chunk_max_tokens"
    with pytest.raises(PromptTooLongError, match=rf"^documents\[1\] has more than 400 tokens: {cap_message}"):
        capped.rerank("q", ["short", past])
    with pytest.raises(PromptTooLongError, match=r"documents\[0\] has more than 400") as caught:
        capped.rerank("q", [past], max_tokens_per_doc=1_000)  # a cut that leaves more than the cap
    assert (caught.value.param, caught.value.index) == ("documents", 0)
    # Its length alone proves it: refused without tokenizing.
    with pytest.raises(
        PromptTooLongError, match=r"documents\[0\] has at least \d+ tokens \(from its length\)"
    ):
        capped.rerank("q", ["lorem ipsum " * 100_000])
    # Below the cap nothing changes: the default cap leaves the window tests above as they were.
    assert len(capped.rerank("q", ["short", within])) == 2


@pytest.mark.slow  # a fresh process: peak RSS only grows, so this one cannot measure it
def test_an_8_mb_document_in_chunk_mode_stays_far_under_a_gigabyte(tiny_model_dir: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.helpers.chunk_memory",
            "--model",
            str(tiny_model_dir),
            "--megabytes",
            "8",
        ],
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.splitlines()[-1])
    assert figures["outcome"].startswith("refused: documents[0] has more than 262144 tokens"), figures
    assert figures["rss_growth_mb"] < 1_100, figures  # the bound; measured: about +32 MB
