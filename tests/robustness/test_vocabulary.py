"""No token id reaches the model beyond its vocabulary: a tokenizer larger than the model, or a model
resized after the scorer was built, is refused with an error that names the token and where it is.

Unchecked, such an id fails deep in the forward's embedding lookup (an ``IndexError`` on the CPU, a
device-side assert on CUDA that breaks every later call of the process). Scores of a grown model are
checked against full logits and a plain softmax in float64 on the model as it is after the resize.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from genscore_core import GenerativeScorer, InvalidRequestError, PromptTemplate
from genscore_core.frontend import STREAM_MIN_CHARS
from genscore_core.loading import NotARerankerError
from genscore_core.testing.tiny_model import qwen3_tokenizer_dir
from tests.helpers.reference_recipe import label_softmax_prob
from tests.helpers.tiny_models import tiny_sizes

LABELS = [9693, 2152]
RARE = "科幻"
"""Text with Qwen3 tokens beyond a 100,000-row model."""
PLAIN = PromptTemplate(
    name="plain", body="Query: {query}\nDocument: {document}\nRelevant:", label_words=("yes", "no")
)
"""A template of ordinary words only, so that its own tokens fit a small vocabulary."""


def _save_model(folder: Path, vocab_size: int) -> Path:
    config = Qwen3Config(
        **tiny_sizes(vocab_size=vocab_size, hidden_size=32), head_dim=8, tie_word_embeddings=True,
        initializer_range=0.1,
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).eval().save_pretrained(str(folder))
    AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir())).save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def small_vocab_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A causal LM of 100,000 token rows saved with the 151,669-token Qwen3 tokenizer."""
    return _save_model(tmp_path_factory.mktemp("vocab-100k"), 100_000)


def test_a_template_the_model_cannot_read_is_refused_at_build(small_vocab_dir: Path) -> None:
    with pytest.raises(NotARerankerError) as caught:
        GenerativeScorer(str(small_vocab_dir), device="cpu", template="qwen3-reranker")
    message = str(caught.value)
    assert "'<|im_start|>' (id 151644)" in message
    assert "vocabulary of 100000 ids" in message
    assert "151669 tokens" in message


@pytest.fixture(scope="module")
def plain_scorer(small_vocab_dir: Path) -> GenerativeScorer:
    return GenerativeScorer(str(small_vocab_dir), device="cpu", dtype="float32", template=PLAIN)


def _assert_names_rare_token(error: InvalidRequestError, index: int, query: str, document: str) -> None:
    """The error names the document and the first token of its prompt the model lacks, as the
    tokenizer alone reads the prompt's text."""
    tokenizer = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))
    text = f"Query: {query}\nDocument: {document}\nRelevant:"
    first = next(i for i in tokenizer(text, add_special_tokens=False)["input_ids"] if i >= 100_000)
    assert error.param == "documents"
    assert error.index == index
    assert f"documents[{index}]" in error.message
    assert f"{tokenizer.decode([first])!r} (id {first})" in error.message
    assert "vocabulary of 100000 ids" in error.message


def test_a_document_holding_a_token_the_model_lacks_is_named(plain_scorer: GenerativeScorer) -> None:
    documents = ["plain words", "more plain words", f"plain words {RARE} and more"]
    with pytest.raises(InvalidRequestError) as caught:
        plain_scorer.rerank("a query", documents)
    _assert_names_rare_token(caught.value, 2, "a query", documents[2])
    with pytest.raises(InvalidRequestError) as caught:
        plain_scorer.score_pairs([("q", "fine"), ("other q", "fine"), ("other q", RARE)])
    _assert_names_rare_token(caught.value, 2, "other q", RARE)
    with pytest.raises(InvalidRequestError) as caught:
        asyncio.run(plain_scorer.arerank("a query", documents))
    _assert_names_rare_token(caught.value, 2, "a query", documents[2])
    # Without the rare token the same scorer scores: the check refuses only what the model lacks.
    assert len(plain_scorer.rerank("a query", documents[:2])) == 2


def test_a_streamed_call_names_the_document_too(plain_scorer: GenerativeScorer) -> None:
    filler = "plain words about rivers and bridges " * 20
    count = STREAM_MIN_CHARS // len(filler) + 8
    documents = [filler] * count
    documents[count - 3] = filler + RARE
    assert plain_scorer._streams(None)
    with pytest.raises(InvalidRequestError) as caught:
        plain_scorer.rerank("a query", documents)
    _assert_names_rare_token(caught.value, count - 3, "a query", documents[count - 3])


@pytest.fixture
def tiny(tiny_model_dir: Path) -> tuple[Any, GenerativeScorer]:
    """A fresh tiny Qwen3 (the tokenizer's 151,669 rows) and a scorer built on it."""
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    return model, GenerativeScorer.from_model(model, tokenizer, max_length=256)


def test_a_model_grown_after_the_build_scores_its_new_ids(tiny: tuple[Any, GenerativeScorer]) -> None:
    model, scorer = tiny
    model.resize_token_embeddings(151_700)
    assert scorer.vocab_size == 151_700
    prompts = [[100, 200, 151_690], [300, 151_680, 400, 500]]
    answer = scorer.score({"query": [7, 8], "items": prompts, "label_token_ids": LABELS})
    expected = [label_softmax_prob(model, [7, 8, *prompt], LABELS) for prompt in prompts]
    assert [entry.score for entry in answer.data] == pytest.approx(expected, abs=1e-5)


def test_a_model_shrunk_after_the_build_is_refused_before_the_forward(
    tiny: tuple[Any, GenerativeScorer],
) -> None:
    model, scorer = tiny
    model.resize_token_embeddings(151_000)
    assert scorer.vocab_size == 151_000
    with pytest.raises(InvalidRequestError) as caught:
        scorer.score({"query": [7, 8], "items": [[100], [200, 151_200]], "label_token_ids": LABELS})
    assert (caught.value.param, caught.value.index) == ("items", 1)
    assert "151200" in caught.value.message
    with pytest.raises(InvalidRequestError) as caught:
        scorer.rerank("a query", ["a document"])
    assert (caught.value.param, caught.value.index) == ("documents", 0)
    assert "'<|im_start|>' (id 151644)" in caught.value.message
    # Ids the shrunk model still has are scored, on the model as it is now.
    answer = scorer.score({"query": [7, 8], "items": [[100, 150_999]], "label_token_ids": LABELS})
    expected = label_softmax_prob(model, [7, 8, 100, 150_999], LABELS)
    assert answer.data[0].score == pytest.approx(expected, abs=1e-5)
