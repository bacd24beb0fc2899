"""What crosses the public API's edges: inputs that would be misread, and scores a backend hands back."""

from __future__ import annotations

import asyncio
import re
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, get_type_hints

import numpy as np
import pandas as pd
import pytest
import torch
from pydantic import ValidationError

from genscore_core import (
    ConfigurationError,
    GenerativeScorer,
    InvalidRequestError,
    RankedResult,
    RankedResults,
    ScoreRangeError,
    ScorerConfig,
    ScoringBackend,
    ScoringJob,
)
from genscore_core.backend import ProgressCallback
from genscore_core.config import SETTING_FIELDS
from tests.helpers.reference_recipe import official_qwen3_scores

QUERY = "capital of france"
DOCUMENTS = ["Paris is the capital of France.", "Berlin is the capital of Germany.", "A river."]


@pytest.mark.parametrize(
    ("call", "param"),
    [
        (lambda s, frame: s.rerank(QUERY, frame), "documents"),
        (lambda s, frame: asyncio.run(s.arerank(QUERY, frame)), "documents"),
        (lambda s, frame: s.score_documents(QUERY, frame), "documents"),
        (lambda s, frame: s.encode(QUERY, frame), "documents"),
        (lambda s, frame: s.score_pairs(frame), "pairs"),
        (lambda s, frame: asyncio.run(s.ascore_pairs(frame)), "pairs"),
    ],
)
def test_a_data_frame_is_refused_not_read_as_its_column_names(
    scorer: GenerativeScorer, call: Any, param: str
) -> None:
    # Iterating a DataFrame gives its column labels: "text" would have been ranked as the one document.
    frame = pd.DataFrame({"query": [QUERY] * len(DOCUMENTS), "text": DOCUMENTS})
    with pytest.raises(
        InvalidRequestError, match="got a DataFrame, which iterates its column names"
    ) as caught:
        call(scorer, frame)
    assert caught.value.param == param
    # One column is a Series, read as its rows.
    assert len(scorer.rerank(QUERY, frame["text"])) == len(DOCUMENTS)


class CorruptingBackend(ScoringBackend):
    """A backend of the user's own (``GenerativeScorer(front_end=, backend=)``): the real engine's
    scores, with the score of prompt ``prompt`` of job ``job`` replaced by ``value``."""

    def __init__(self, engine: ScoringBackend, value: object, job: int = 0, prompt: int = 0) -> None:
        self.engine, self.value, self.job, self.prompt = engine, value, job, prompt

    def score_jobs(
        self, jobs: Sequence[ScoringJob], on_progress: ProgressCallback | None = None
    ) -> list[list[float]]:
        scores = self.engine.score_jobs(jobs, on_progress)
        scores[self.job][self.prompt] = self.value  # type: ignore[call-overload]
        return scores

    def __repr__(self) -> str:
        return "CorruptingBackend()"


BAD_SCORES = [float("nan"), float("inf"), -0.25, 1.5, None, "0.5", True]


@pytest.mark.parametrize("value", BAD_SCORES, ids=repr)
def test_a_backend_score_that_is_not_a_probability_never_leaves(
    scorer: GenerativeScorer, value: object
) -> None:
    # Two queries: job 1 holds the pairs of the second query, the bad score is its second prompt.
    pairs = [(QUERY, DOCUMENTS[0]), ("rivers", DOCUMENTS[1]), (QUERY, DOCUMENTS[2]), ("rivers", DOCUMENTS[2])]
    custom = GenerativeScorer(
        front_end=scorer.front_end, backend=CorruptingBackend(scorer.backend, value, job=1, prompt=1)
    )
    for call in (lambda: custom.score_pairs(pairs), lambda: asyncio.run(custom.ascore_pairs(pairs))):
        with pytest.raises(ScoreRangeError) as caught:
            call()
        assert (caught.value.param, caught.value.index) == ("pairs", 3)
        assert f"pairs[3] was scored {value!r} by CorruptingBackend()" in caught.value.message
        assert "as score mode 'label-softmax' requires" in caught.value.message

    one_query = GenerativeScorer(
        front_end=scorer.front_end, backend=CorruptingBackend(scorer.backend, value, prompt=2)
    )
    for call in (
        lambda: one_query.rerank(QUERY, DOCUMENTS),
        lambda: asyncio.run(one_query.arerank(QUERY, DOCUMENTS)),
        lambda: one_query.score_documents(QUERY, DOCUMENTS),
    ):
        with pytest.raises(ScoreRangeError) as caught:
            call()
        assert (caught.value.param, caught.value.index) == ("documents", 2)
    request = {"query": QUERY, "items": DOCUMENTS, "label_token_ids": scorer.label_token_ids}
    for call in (lambda: one_query.score(request), lambda: asyncio.run(one_query.ascore(request))):
        with pytest.raises(ScoreRangeError, match=r"items\[2\] was scored") as caught:
            call()
        assert (caught.value.param, caught.value.index) == ("items", 2)


def test_a_bad_window_score_names_its_document_and_window(tiny_model_dir: Path) -> None:
    """A NaN for one window of a chunked document: with "max", the other windows would have hidden it."""
    chunking = GenerativeScorer(str(tiny_model_dir), device="cpu", dtype="float32", max_length=96,
                                long_documents="chunk")  # fmt: skip
    long_document = " ".join(f"word{i}" for i in range(200))
    documents = ["short", long_document]
    windows = len(chunking.prepare_pairs([(QUERY, long_document)]).prompts)
    assert windows >= 3
    custom = GenerativeScorer(
        front_end=chunking.front_end,
        backend=CorruptingBackend(chunking.backend, float("nan"), prompt=2),  # the document's 2nd window
    )
    with pytest.raises(ScoreRangeError) as caught:
        custom.rerank(QUERY, documents)
    assert (caught.value.param, caught.value.index) == ("documents", 1)
    assert f"window 2 of {windows} of documents[1] was scored nan" in caught.value.message


def test_a_backend_answering_too_few_scores_is_an_error_not_a_shorter_answer(
    scorer: GenerativeScorer,
) -> None:
    class Short(ScoringBackend):
        def score_jobs(
            self, jobs: Sequence[ScoringJob], on_progress: ProgressCallback | None = None
        ) -> list[list[float]]:
            return [scores[:-1] for scores in scorer.backend.score_jobs(jobs, on_progress)]

    custom = GenerativeScorer(front_end=scorer.front_end, backend=Short())
    request = {"query": QUERY, "items": DOCUMENTS, "label_token_ids": scorer.label_token_ids}
    with pytest.raises(RuntimeError, match=r"returned \[2\] scores for jobs of \[3\] prompts"):
        custom.score(request)
    with pytest.raises(RuntimeError, match=r"returned \[2\] scores for jobs of \[3\] prompts"):
        asyncio.run(custom.ascore(request))


def test_top_k_refuses_a_negative_k_rather_than_counting_from_the_end(scorer: GenerativeScorer) -> None:
    ranked = scorer.rerank(QUERY, DOCUMENTS)
    assert ranked.top_k(0) == []
    assert ranked.top_k(2) == ranked.results[:2]
    assert ranked.top_k(10) == ranked.results
    for k in (-1, True, 1.0):
        with pytest.raises(InvalidRequestError, match=rf"k must be an integer of 0 or more, got {k!r}"):
            ranked.top_k(k)  # type: ignore[arg-type]


def test_results_slice_to_a_list_and_say_so_to_type_checkers(scorer: GenerativeScorer) -> None:
    ranked = scorer.rerank(QUERY, DOCUMENTS)
    assert ranked[:2] == ranked.results[:2] and ranked[-1] is ranked.results[-1]
    # mypy reads these overloads: ranked[:2] is a list[RankedResult], ranked[0] one RankedResult.
    answers = {
        get_type_hints(overload)["position"]: get_type_hints(overload)["return"]
        for overload in typing.get_overloads(RankedResults.__getitem__)
    }
    assert answers == {int: RankedResult, slice: list[RankedResult]}


def test_numpy_numbers_are_rank_options_like_python_ones(scorer: GenerativeScorer) -> None:
    # top_n computed with numpy (np.int64) and a threshold read off an array (np.float32) were refused
    # as "must be a positive integer, got np.int64(2)".
    scores = scorer.score_documents(QUERY, DOCUMENTS)
    threshold = sorted(scores)[1]
    expected = scorer.rerank(QUERY, DOCUMENTS, top_n=1, score_threshold=threshold)
    assert len(expected) == 1
    for top_n, score_threshold in [(np.int64(1), np.float64(threshold)), (np.int8(1), np.float32(threshold))]:
        got = scorer.rerank(QUERY, DOCUMENTS, top_n=top_n, score_threshold=score_threshold)  # type: ignore[arg-type]
        assert [r.index for r in got] == [r.index for r in expected]
        got = asyncio.run(scorer.arerank(QUERY, DOCUMENTS, top_n=top_n))  # type: ignore[arg-type]
        assert [r.index for r in got] == [r.index for r in expected]
    for top_n in (np.bool_(True), np.int64(0), np.float64(1.0)):
        with pytest.raises(InvalidRequestError) as caught:
            scorer.rerank(QUERY, DOCUMENTS, top_n=top_n)  # type: ignore[arg-type]
        assert caught.value.param == "top_n"
    with pytest.raises(InvalidRequestError) as caught:
        scorer.rerank(QUERY, DOCUMENTS, score_threshold=np.float32("nan"))  # type: ignore[arg-type]
    assert caught.value.param == "score_threshold"


@pytest.mark.parametrize("long_documents", ["truncate", "chunk"])
def test_a_prompt_token_bound_that_is_not_a_count_is_refused(
    tiny_model_dir: Path, long_documents: str
) -> None:
    # It was read unchecked: -1 refused every chunked document as too long, "4096" raised a TypeError
    # from a comparison, and with truncation any value passed silently.
    scorer = GenerativeScorer(str(tiny_model_dir), device="cpu", dtype="float32", max_length=96,
                              long_documents=long_documents)  # fmt: skip
    long_document = " ".join(f"word{i}" for i in range(200))
    for bound in (-1, 0, "4096", 2.5, True):
        with pytest.raises(
            InvalidRequestError, match=f"max_prompt_tokens must be a positive integer, got {bound!r}"
        ) as caught:
            asyncio.run(scorer.arerank(QUERY, [long_document], max_prompt_tokens=bound))  # type: ignore[arg-type]
        assert caught.value.param == "max_prompt_tokens"
        with pytest.raises(
            InvalidRequestError, match=f"max_prompt_tokens must be a positive integer, got {bound!r}"
        ):
            scorer.rerank(QUERY, [long_document], max_prompt_tokens=bound)  # type: ignore[arg-type]
        with pytest.raises(InvalidRequestError, match="max_prompt_tokens must be a positive integer"):
            scorer.front_end.prepare_pairs([(QUERY, long_document)], max_prompt_tokens=bound)  # type: ignore[arg-type]
    # A usable bound still works: the document's prompts fit within it.
    assert len(asyncio.run(scorer.arerank(QUERY, [long_document], max_prompt_tokens=100_000))) == 1
    assert len(scorer.rerank(QUERY, [long_document], max_prompt_tokens=100_000)) == 1


def test_rerank_and_arerank_take_the_same_options(tiny_model_dir: Path) -> None:
    """The same public options on the blocking and the async rerank; a chunked document over
    ``max_prompt_tokens`` is refused by both, with the same words."""
    import inspect

    def options(method: Any) -> list[tuple[str, Any, Any]]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(method).parameters.values()]

    assert options(GenerativeScorer.rerank) == options(GenerativeScorer.arerank)
    chunking = GenerativeScorer(str(tiny_model_dir), device="cpu", dtype="float32", max_length=96,
                                long_documents="chunk")  # fmt: skip
    long_document = " ".join(f"word{i}" for i in range(400))
    with pytest.raises(InvalidRequestError) as blocking:
        chunking.rerank(QUERY, ["short", long_document], max_prompt_tokens=120)
    with pytest.raises(InvalidRequestError) as awaited:
        asyncio.run(chunking.arerank(QUERY, ["short", long_document], max_prompt_tokens=120))
    assert "120" in str(blocking.value)
    assert str(blocking.value) == str(awaited.value) and blocking.value.index == awaited.value.index == 1


def test_a_model_folder_may_be_a_path(tiny_model_dir: Path, scorer: GenerativeScorer) -> None:
    # make_tiny_model returns a Path and from_pretrained takes one; the scorer refused it (string_type).
    assert isinstance(tiny_model_dir, Path)
    from_path = GenerativeScorer(tiny_model_dir, device="cpu", dtype="float32", max_length=512)
    assert from_path.config.model == str(tiny_model_dir)
    assert ScorerConfig(model=tiny_model_dir).model == str(tiny_model_dir)  # type: ignore[arg-type]
    expected = official_qwen3_scores(
        from_path.model, from_path.tokenizer, [(QUERY, d) for d in DOCUMENTS], from_path.max_length
    )
    assert from_path.score_documents(QUERY, DOCUMENTS) == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize(
    ("pairs", "index", "said"),
    [
        (["query, document"], 0, "got the str 'query, document' (pass (query, document) tuples)"),
        ([(QUERY, DOCUMENTS[0]), (QUERY, DOCUMENTS[1], "extra")], 1, "got a tuple of 3 items"),
        ([(QUERY, DOCUMENTS[0]), [QUERY]], 1, "got a list of 1 item"),
        ([None], 0, "got a NoneType"),
        (np.array([[QUERY, DOCUMENTS[0]]]), 0, "got a ndarray"),
    ],
)
def test_a_bad_pair_is_named_with_what_it_is(
    scorer: GenerativeScorer, pairs: Any, index: int, said: str
) -> None:
    for call in (lambda: scorer.score_pairs(pairs), lambda: asyncio.run(scorer.ascore_pairs(pairs))):
        with pytest.raises(InvalidRequestError) as caught:
            call()
        assert (caught.value.param, caught.value.index) == ("pairs", index)
        assert caught.value.message == f"pairs[{index}] is not a (query, document) pair: {said}"


def test_a_dict_of_pairs_is_told_to_pass_its_items(scorer: GenerativeScorer) -> None:
    # {query: document} iterates its queries; the fix for pairs is items(), not values().
    by_query = {QUERY: DOCUMENTS[0], "rivers": DOCUMENTS[2]}
    with pytest.raises(InvalidRequestError, match=r"got dict; pass list\(mapping.items\(\)\)"):
        scorer.score_pairs(by_query)  # type: ignore[arg-type]
    assert scorer.score_pairs(list(by_query.items())) == scorer.score_pairs(
        [(QUERY, DOCUMENTS[0]), ("rivers", DOCUMENTS[2])]
    )


NUMBER_SETTINGS = [
    "max_length", "chunk_overlap", "query_share", "max_batch_tokens", "max_batch_size",
    "server_timeout", "server_max_retries", "server_batch_size", "result_cache_bytes", "chunk_max_tokens",
]  # fmt: skip


@pytest.mark.parametrize("name", NUMBER_SETTINGS)
def test_a_bool_is_not_a_number_setting(name: str) -> None:
    # pydantic took True as 1: max_batch_tokens=True ran one token a batch, max_length=True refused
    # every prompt as too long, with nothing pointing back at the setting.
    # A server_* setting is taken only with a server to use it.
    server = {"server_url": "http://127.0.0.1:9"} if name.startswith("server_") else {}
    for flag in (True, False):
        with pytest.raises(ValidationError, match=f"must be a number, not the bool {flag}") as caught:
            ScorerConfig(**{name: flag}, **server)
        assert [error["loc"] for error in caught.value.errors()] == [(name,)]
    usable = {"query_share": 0.5, "server_timeout": 2.5, "result_cache_bytes": 4096}.get(name, 3)
    assert ScorerConfig(**{name: usable}, **server).to_settings()[name] == usable


def test_every_number_setting_is_guarded_against_bools() -> None:
    # A numeric setting added later is covered too: the guard reads the fields' types.
    numeric = {
        name
        for name, field in SETTING_FIELDS.items()
        if (isinstance(field.default, (int, float)) and not isinstance(field.default, bool))
        or name == "max_length"
    }
    assert numeric == set(NUMBER_SETTINGS)


def test_from_model_refuses_a_device_or_dtype_the_model_is_not_on(scorer: GenerativeScorer) -> None:
    # from_model scores where the model is: device="cuda" for a model on the CPU scored on the CPU
    # while scorer.config.device said "cuda"; dtype="float16" kept float32 weights.
    model, tokenizer = scorer.model, scorer.tokenizer
    assert model.device.type == "cpu" and model.dtype == torch.float32
    for settings, setting, said in [
        ({"device": "cuda"}, "device", "device='cuda', but the model is on cpu"),
        ({"device": "cuda:1"}, "device", "device='cuda:1', but the model is on cpu"),
        ({"dtype": "float16"}, "dtype", "dtype='float16', but the model's weights are float32"),
        ({"dtype": torch.bfloat16}, "dtype", "dtype='bfloat16', but the model's weights are float32"),
        ({"server_url": "http://127.0.0.1:9"}, "server_url", "GenerativeScorer.from_server"),
    ]:
        with pytest.raises(ConfigurationError, match=re.escape(said)) as caught:
            GenerativeScorer.from_model(model, tokenizer, **settings)
        assert caught.value.setting == setting
    # Settings that say what the model is are fine, and score as the recipe does.
    for settings in ({"device": "cpu", "dtype": "float32"}, {"device": "auto", "dtype": "fp32"}, {}):
        same = GenerativeScorer.from_model(model, tokenizer, max_length=512, **settings)
        expected = official_qwen3_scores(model, tokenizer, [(QUERY, d) for d in DOCUMENTS], 512)
        assert same.score_documents(QUERY, DOCUMENTS) == pytest.approx(expected, abs=1e-5)
