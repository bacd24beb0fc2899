"""Batching, forward and head behaviour of the engine, and the scorer's public API."""

from __future__ import annotations

import asyncio
import random
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from torch.utils._python_dispatch import TorchDispatchMode

from genscore_core import ConfigurationError, GenerativeScorer, InvalidRequestError, ScorerConfig
from genscore_core.batching import left_pad, length_sorted_batches
from genscore_core.config import SETTING_FIELDS
from genscore_core.loading import resolve_device, resolve_dtype
from genscore_core.prefixes import distinct_prompts
from tests.helpers.model_gate import ModelGate

DOCS = [
    "Paris is the capital and largest city of France.",
    "Berlin is the capital of Germany.",
    "x",
    "The Eiffel Tower was built for the 1889 World's Fair in Paris, on the Champ de Mars. " * 6,
    "Lyon is known for its cuisine.",
    "",
    "Quantum photons carry energy proportional to their frequency.",
]


def test_length_sorted_batches_respect_the_budget() -> None:
    lengths = [5, 50, 7, 49, 3, 100, 8]
    batches = length_sorted_batches(lengths, max_batch_tokens=100, max_batch_size=3)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) <= 3
        assert len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) <= 100
    widths = [max(lengths[i] for i in b) for b in batches]
    assert widths == sorted(widths, reverse=True)


def test_left_pad_positions_count_real_tokens() -> None:
    ids, mask, positions = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert positions[:, -1].tolist() == [2, 0]
    assert positions[0].tolist() == [0, 1, 2]


@pytest.mark.parametrize("forward", ["padded", "packed"])
def test_batch_composition_does_not_change_scores(
    tiny_model_dir: Path, scorer: GenerativeScorer, forward: str
) -> None:
    # The reference scores every prompt alone, through the model's own forward.
    one_at_a_time = GenerativeScorer.from_model(
        scorer.model,
        scorer.tokenizer,
        model=str(tiny_model_dir),
        max_length=512,
        max_batch_size=1,
        forward="padded",
    )
    reference = one_at_a_time.score_documents("capital of France", DOCS)
    for tokens, size in [(64, 64), (400, 2), (100000, 64)]:
        other = GenerativeScorer.from_model(
            scorer.model,
            scorer.tokenizer,
            max_length=512,
            max_batch_tokens=tokens,
            max_batch_size=size,
            forward=forward,
        )
        scores = other.score_documents("capital of France", DOCS)
        assert max(abs(a - b) for a, b in zip(scores, reference, strict=True)) <= 1e-5


class _ShapeRecorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(tensor, torch.Tensor):
                self.shapes.append((str(func), tuple(tensor.shape)))
        return out


@pytest.mark.parametrize("apply_softmax", [True, False])
def test_no_vocabulary_sized_activation_is_allocated(scorer: GenerativeScorer, apply_softmax: bool) -> None:
    vocab = scorer.vocab_size
    request = {
        "query": "capital",
        "items": DOCS,
        "label_token_ids": [9693, 2152],
        "apply_softmax": apply_softmax,
    }
    with _ShapeRecorder() as recorder:
        scorer.score(request)
        scorer.rerank("capital", DOCS)
    assert recorder.shapes, "the recorder saw no operations"
    offenders = [(op, shape) for op, shape in recorder.shapes if vocab in shape]
    assert not offenders, f"vocabulary-sized tensors were created: {offenders[:5]}"


def test_lm_head_module_is_never_called(scorer: GenerativeScorer) -> None:
    calls = []
    handle = scorer.model.get_output_embeddings().register_forward_hook(lambda *a: calls.append(1))
    try:
        scorer.rerank("capital", DOCS)
        scorer.score({"query": "q", "items": ["a"], "label_token_ids": [1, 2], "apply_softmax": False})
    finally:
        handle.remove()
    assert calls == []


def test_threads_share_one_scorer(scorer: GenerativeScorer) -> None:
    queries = [f"query number {i} about France" for i in range(8)]
    sequential = [scorer.score_documents(q, DOCS) for q in queries]
    results: dict[int, list[float]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def work(i: int) -> None:
        try:
            barrier.wait()
            results[i] = scorer.score_documents(queries[i], DOCS)
        except BaseException as error:  # collected and re-raised below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert [results[i] for i in range(8)] == sequential


def test_rerank_orders_and_filters(scorer: GenerativeScorer) -> None:
    scores = scorer.score_documents("capital of France", DOCS)
    ranked = scorer.rerank("capital of France", DOCS)
    assert [r.index for r in ranked] == sorted(range(len(DOCS)), key=lambda i: -scores[i])
    assert [r.score for r in ranked] == sorted(scores, reverse=True)
    assert all(0.0 <= r.score <= 1.0 for r in ranked)
    assert [r.index for r in scorer.rerank("capital of France", DOCS, top_n=2)] == [r.index for r in ranked][
        :2
    ]
    threshold = sorted(scores)[3]
    kept = scorer.rerank("capital of France", DOCS, score_threshold=threshold)
    assert {r.index for r in kept} == {i for i, s in enumerate(scores) if s >= threshold}


def test_ties_keep_input_order(scorer: GenerativeScorer) -> None:
    ranked = scorer.rerank("q", ["same", "other", "same", "same"])
    same = [r.index for r in ranked if r.document == "same"]
    assert same == [0, 2, 3]


def test_empty_documents_give_no_results(scorer: GenerativeScorer) -> None:
    assert len(scorer.rerank("q", [])) == 0
    assert scorer.score_pairs([]) == []


def test_pairs_with_different_queries(scorer: GenerativeScorer) -> None:
    pairs = [("q one", "a"), ("q two", "b"), ("q one", "c")]
    got = scorer.score_pairs(pairs)
    assert got[0] == pytest.approx(scorer.score_documents("q one", ["a"])[0], abs=1e-6)
    assert got[1] == pytest.approx(scorer.score_documents("q two", ["b"])[0], abs=1e-6)
    assert got[2] == pytest.approx(scorer.score_documents("q one", ["c"])[0], abs=1e-6)


def test_bad_arguments_name_the_item(scorer: GenerativeScorer) -> None:
    with pytest.raises(InvalidRequestError, match=r"documents\[1\] must be a string, got int"):
        scorer.rerank("q", ["a", 3])  # type: ignore[list-item]
    with pytest.raises(InvalidRequestError, match="query must be a string"):
        scorer.rerank(None, ["a"])  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="top_n must be a positive integer") as top_n:
        scorer.rerank("q", ["a"], top_n=0)
    assert top_n.value.param == "top_n"
    with pytest.raises(InvalidRequestError, match="score_threshold must be a number within") as threshold:
        scorer.rerank("q", ["a"], score_threshold=2.0)
    assert threshold.value.param == "score_threshold"
    with pytest.raises(InvalidRequestError, match=r"pairs\[1\] is not a \(query, document\) pair") as pair:
        scorer.score_pairs([("q", "a"), ("q",)])  # type: ignore[list-item]
    assert (pair.value.param, pair.value.index) == ("pairs", 1)


def test_unknown_settings_are_rejected(tiny_model_dir: Path) -> None:
    with pytest.raises(ValidationError, match="max_lenght"):
        GenerativeScorer(str(tiny_model_dir), max_lenght=5)
    with pytest.raises(ValidationError, match="max_batch_tokens"):
        ScorerConfig(max_batch_tokens=0)
    assert ScorerConfig().trust_remote_code is False


def test_device_and_dtype_resolution() -> None:
    assert resolve_device(None) == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_dtype(None, torch.device("cpu")) == torch.float32
    assert resolve_dtype(None, torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        resolve_dtype("float8", torch.device("cpu"))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")


def test_an_unknown_dtype_is_refused_with_the_settings_before_any_loading() -> None:
    """float64 or int8 fail when the settings are made, naming the names that work; torch's own
    dtypes go by name, and every name the settings take is one the loader maps."""
    from genscore_core.config import DTYPE_NAMES
    from genscore_core.loading import _DTYPES

    for bad in ("float64", "int8", torch.float64):
        with pytest.raises(ValidationError, match=r"unknown dtype '(float64|int8)'; choose one of"):
            ScorerConfig(dtype=bad)
    with pytest.raises(ValidationError, match="unknown dtype"):
        GenerativeScorer(
            "/nonexistent/model/folder", dtype="float64"
        )  # refused before the folder is looked at
    assert ScorerConfig(dtype=torch.bfloat16).run.dtype == "bfloat16"
    assert ScorerConfig(dtype="BF16").run.dtype == "BF16" and ScorerConfig(dtype="auto").run.dtype == "auto"
    assert set(DTYPE_NAMES) == set(_DTYPES)


@pytest.mark.parametrize("seconds", [float("inf"), float("nan"), 1e10, 86_400.5])
def test_a_server_timeout_beyond_a_day_is_refused_with_the_settings(seconds: float) -> None:
    # inf and 1e10 were taken and reached the socket, which cannot wait that long: an OverflowError
    # traceback at the first request, naming no setting.
    with pytest.raises(ValidationError, match="server_timeout"):
        ScorerConfig(server_timeout=seconds)
    assert ScorerConfig(server_url=URL, server_timeout=86_400).run.timeout == 86_400


URL = "http://127.0.0.1:9"

# A setting of each kind, not its default: what the model here runs with, what the server client does.
LOCAL_ONLY = {
    "device": "cpu",
    "dtype": "float16",
    "forward": "padded",
    "max_batch_tokens": 4096,
    "max_batch_size": 8,
}
SERVER_ONLY = {
    "server_kind": "vllm", "server_model": "m", "server_api_key": "key", "server_timeout": 5.0,
    "server_max_retries": 0, "server_batch_size": 16,
}  # fmt: skip


@pytest.mark.parametrize(("name", "value"), LOCAL_ONLY.items())
def test_a_setting_of_the_model_here_is_refused_with_a_server_url(name: str, value: Any) -> None:
    # The server runs the model: --server-url with --device cuda or --dtype float16 scored on the
    # server as it was started, while the settings (and scorer.config) said otherwise.
    with pytest.raises(ConfigurationError) as caught:
        ScorerConfig(server_url=URL, **{name: value})
    assert caught.value.setting == name
    assert f"{name}={value!r}" in caught.value.message and "server_url" in caught.value.message


@pytest.mark.parametrize(("name", "value"), SERVER_ONLY.items())
def test_a_server_setting_is_refused_without_a_server_url(name: str, value: Any) -> None:
    # Without server_url the model is loaded here and no request is sent: the setting would do nothing.
    with pytest.raises(ConfigurationError) as caught:
        ScorerConfig(**{name: value})
    assert caught.value.setting == name
    assert name in caught.value.message and "server_url" in caught.value.message
    assert "key" not in caught.value.message.replace("server_api_key", "")  # a secret is not shown
    assert ScorerConfig(server_url=URL, **{name: value}).to_settings()[name] is not None


def test_every_setting_that_names_the_server_is_a_server_setting() -> None:
    # A server_* field added later is covered: the check reads the names, not a list kept here.
    servers = {name for name in SETTING_FIELDS if name.startswith("server_")} - {"server_url"}
    assert servers == set(SERVER_ONLY)


def test_settings_at_their_defaults_pass_either_way() -> None:
    # A dump of a scorer's settings (the adapters' model_dump, a pickle) names every field at its
    # value: the other kind's defaults must rebuild it. "auto" asks for nothing either.
    remote = ScorerConfig(server_url=URL, server_kind="sglang", server_timeout=5.0)
    assert ScorerConfig(**remote.model_dump()) == remote
    assert ScorerConfig(**remote.model_dump(mode="json")) == remote
    assert ScorerConfig(**remote.to_settings(every=True)) == remote  # every setting, flat
    local = ScorerConfig(device="cpu", forward="padded")
    assert ScorerConfig(**local.model_dump()) == local
    assert ScorerConfig(**local.to_settings(every=True)) == local
    assert ScorerConfig(server_url=URL, device="auto", dtype="auto").run.url == URL
    # Settings of the prompts, the progress bar and the tokenizer apply to both.
    both = {"max_length": 64, "trust_remote_code": True, "show_progress": True, "long_documents": "chunk"}
    assert (
        ScorerConfig(server_url=URL, **both).prompt.max_length == ScorerConfig(**both).prompt.max_length == 64
    )
    with pytest.raises(ConfigurationError, match=r"device='cpu', dtype='float16'") as caught:
        ScorerConfig(server_url=URL, device="cpu", dtype="float16")
    assert caught.value.setting == "device"


def test_dtype_override_loads_in_that_dtype(tiny_model_dir: Path) -> None:
    bf16 = GenerativeScorer(str(tiny_model_dir), device="cpu", dtype="bfloat16", max_length=256)
    assert bf16.model.dtype == torch.bfloat16
    fp32 = GenerativeScorer(str(tiny_model_dir), device="cpu", max_length=256)
    assert fp32.model.dtype == torch.float32
    a = bf16.score_documents("capital", DOCS[:3])
    b = fp32.score_documents("capital", DOCS[:3])
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 0.05


async def test_arerank_does_not_block_the_event_loop(scorer: GenerativeScorer) -> None:
    with ModelGate(scorer) as gate:
        ranked, _ = await asyncio.wait_for(
            asyncio.gather(scorer.arerank("capital of France", DOCS * 8), gate.open_once_entered()),
            timeout=120,
        )
    assert gate.thread_ids and threading.get_ident() not in gate.thread_ids
    assert len(ranked) == len(DOCS) * 8


def test_auto_forward_picks_packed_for_qwen3(scorer: GenerativeScorer) -> None:
    assert scorer.config.run.forward == "auto"
    assert type(scorer.engine.forward).__name__ == "PackedForward"


def test_duplicate_documents_are_scored_once_and_tie(scorer: GenerativeScorer) -> None:
    docs = ["alpha beta", "gamma", "alpha beta", "delta " * 30, "gamma", "alpha beta"]
    calls: list[int] = []
    forward = scorer.engine.forward
    original = forward.last_hidden_states

    def counting(groups: Any, on_progress: Any = None) -> torch.Tensor:
        calls.append(sum(len(g.suffix_ids) for g in groups))
        return original(groups, on_progress)

    forward.last_hidden_states = counting  # type: ignore[method-assign]
    try:
        scores = scorer.score_documents("q", docs)
    finally:
        del forward.last_hidden_states
    assert calls == [3]
    assert scores[0] == scores[2] == scores[5] and scores[1] == scores[4]
    alone = scorer.score_documents("q", ["alpha beta", "gamma", "delta " * 30])
    assert [scores[0], scores[1], scores[3]] == pytest.approx(alone, abs=1e-5)
    ranked = scorer.rerank("q", docs)
    ties = [r.index for r in ranked if r.document == "alpha beta"]
    assert ties == [0, 2, 5]


def test_every_job_is_checked_after_the_one_copy_of_all_scores(scorer: GenerativeScorer) -> None:
    """The scores of a call come back in one copy; each job's rows are still checked as its own
    (the bad row is named by its index within its job)."""
    from genscore_core.backend import ScoringJob
    from genscore_core.engine import ScoringEngine
    from genscore_core.scoring import ScoreRangeError

    class PlantedHead:
        """Scores 0.25 everywhere, and NaN for the prompt of token 7 (the second job's second)."""

        def scores(
            self, rows: torch.Tensor, label_ids: list[int], mode: Any = None, temperature: float = 1.0
        ) -> torch.Tensor:
            return torch.full((rows.shape[0],), 0.25)

    engine = ScoringEngine(scorer.model, scorer.backend.forward, PlantedHead())  # type: ignore[arg-type]
    good = ScoringJob([[5, 6, 1], [5, 6, 2]], [1, 2])
    assert engine.score_jobs([good, good]) == [[0.25, 0.25], [0.25, 0.25]]

    class NanHead(PlantedHead):
        def scores(
            self, rows: torch.Tensor, label_ids: list[int], mode: Any = None, temperature: float = 1.0
        ) -> torch.Tensor:
            out = super().scores(rows, label_ids, mode, temperature)
            if label_ids == [3, 4]:
                out[1] = float("nan")
            return out

    engine = ScoringEngine(scorer.model, scorer.backend.forward, NanHead())  # type: ignore[arg-type]
    with pytest.raises(ScoreRangeError, match="prompt 1 of job 1 scored nan"):
        engine.score_jobs([good, ScoringJob([[5, 6, 1], [5, 6, 3]], [3, 4])])


def test_a_call_laid_out_ahead_scores_as_score_jobs(tiny_model_dir: Path, scorer: GenerativeScorer) -> None:
    """prepare_jobs on another thread, then launch_prepared and collect_launched (the LaunchAhead
    capability): the scores of score_jobs, duplicates and empty jobs included."""
    from genscore_core.backend import LaunchAhead, ScoringJob

    # A small budget: several batches, with a query's prefix carried from one batch to the next.
    engine = GenerativeScorer.from_model(
        scorer.model, scorer.tokenizer, model=str(tiny_model_dir), max_length=512, max_batch_tokens=200
    ).backend
    assert isinstance(engine, LaunchAhead)
    prepared_jobs = [
        scorer.prepare_pairs([(q, d) for d in DOCS + DOCS[:2]]).jobs[0] for q in ("capital", "food")
    ]
    jobs = [prepared_jobs[0], ScoringJob([], prepared_jobs[0].label_ids), prepared_jobs[1]]
    expected = engine.score_jobs(jobs)
    prepared = {}
    thread = threading.Thread(target=lambda: prepared.update(call=engine.prepare_jobs(jobs)))
    thread.start()
    thread.join()
    assert prepared["call"].batches is not None
    got = engine.collect_launched(engine.launch_prepared(prepared["call"]))
    assert got == expected and got[1] == []
    inline = engine.collect_launched(engine.launch_prepared(engine.prepare_jobs(jobs, lay_out=False)))
    assert inline == expected


def test_calls_launched_back_to_back_collect_the_scores_of_score_jobs(
    tiny_model_dir: Path, scorer: GenerativeScorer
) -> None:
    """launch_prepared twice before any collect_launched (the server's pipeline): each call gets
    the scores score_jobs gives it; a call whose collect fails (a bad score) does not touch the next."""
    from genscore_core.backend import ScoringJob
    from genscore_core.engine import ScoringEngine
    from genscore_core.scoring import ScoreRangeError

    engine = GenerativeScorer.from_model(
        scorer.model, scorer.tokenizer, model=str(tiny_model_dir), max_length=512, max_batch_tokens=200
    ).backend
    first = [scorer.prepare_pairs([(q, d) for d in DOCS + DOCS[:2]]).jobs[0] for q in ("capital", "food")]
    second = [scorer.prepare_pairs([("tower", d) for d in DOCS[2:]]).jobs[0]]
    second.append(ScoringJob([], second[0].label_ids))
    expected = [engine.score_jobs(first), engine.score_jobs(second)]
    calls = [engine.launch_prepared(engine.prepare_jobs(jobs)) for jobs in (first, second)]
    assert [engine.collect_launched(call) for call in calls] == expected
    assert all(call.event is None for call in calls)  # on the CPU the copy is done at launch

    class NanHead:
        """The model's head, with NaN for every prompt of label ids [3, 4]."""

        def scores(
            self, rows: torch.Tensor, label_ids: list[int], mode: Any = None, temperature: float = 1.0
        ) -> torch.Tensor:
            out = engine.head.scores(rows, label_ids, mode, temperature)
            return torch.full_like(out, float("nan")) if label_ids == [3, 4] else out

    nan_engine = ScoringEngine(scorer.model, engine.forward, NanHead())  # type: ignore[arg-type]
    bad = [first[0], ScoringJob([[5, 6, 1], [5, 6, 3]], [3, 4])]
    calls = [nan_engine.launch_prepared(nan_engine.prepare_jobs(jobs)) for jobs in (bad, second)]
    with pytest.raises(ScoreRangeError, match="prompt 0 of job 1 scored nan"):
        nan_engine.collect_launched(calls[0])
    assert nan_engine.collect_launched(calls[1]) == expected[1]


def test_distinct_prompts_matches_a_plain_dictionary() -> None:
    rng = random.Random(5)
    for _ in range(200):
        # Few token values and lengths: many prompts share the sampled tokens without being equal.
        pool = [[rng.randrange(3) for _ in range(rng.randint(0, 6))] for _ in range(rng.randint(1, 8))]
        prompts = [list(rng.choice(pool)) for _ in range(rng.randint(1, 20))]
        first: dict[tuple[int, ...], int] = {}
        for prompt in prompts:
            first.setdefault(tuple(prompt), len(first))
        distinct, where = distinct_prompts(prompts)
        assert [tuple(p) for p in distinct] == list(first)
        assert where == [first[tuple(p)] for p in prompts]
