"""genscore on a real local Ray instance: the Ray Data job equals ``genscore score``, and the Ray Serve
deployment answers like a real ``genscore serve`` process and batches concurrent callers.

One Ray instance serves the whole module (starting Ray is most of the cost on a small machine).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from genscore_core import GenerativeScorer, InvalidRequestError
from genscore_core.jobs import ScoreFileOptions, score_file
from genscore_core.server import ServerLimits
from tests.helpers.reference_recipe import official_qwen3_scores
from tests.helpers.server import (
    SEED_EMPTY_ITEMS_ERROR,
    SEED_EMPTY_ITEMS_REQUEST,
    SEED_TEXT_REQUEST,
    SEED_TOKEN_REQUEST,
    free_port,
    genscore_serve_process,
)

SETTINGS: dict[str, Any] = {"device": "cpu", "dtype": "float32", "max_length": 512}
RERANK_REQUEST = {
    "query": "capital of France",
    "documents": [
        "Paris is the capital of France.",
        "Berlin is in Germany.",
        {"text": "Lyon has good food."},
    ],
    "top_n": 2,
    "return_documents": True,
}


@pytest.fixture(scope="module")
def ray_instance() -> Iterator[Any]:
    import ray

    # Logical CPUs, not cores: two scoring actors plus Ray Data's read and write tasks must fit at once.
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield ray
    finally:
        from ray import serve

        serve.shutdown()
        ray.shutdown()


# The warm-up's made-up batches follow the forward's token budget; a small one keeps them quick on a CPU.
WARM = {"warm_up": True, "max_batch_tokens": 2048}


@pytest.mark.parametrize("warm", [{}, WARM], ids=["plain", "warm-up"])
def test_score_batches_keeps_columns_ids_and_order(
    tiny_model_dir: Path, scorer: GenerativeScorer, warm: dict[str, Any]
) -> None:
    from genscore_integrations.ray import ScoreBatches

    score = ScoreBatches(str(tiny_model_dir), **SETTINGS, **warm)
    # With the warm-up, the tokenizer loads on a thread while the model runs made-up prompts.
    assert set(score.startup_s) == ({"tokenizer", "model", "warm-up", "ready"} if warm else {"ready"})
    queries = ["capital of France", "tallest mountain", "capital of France", "tallest mountain"]
    documents = ["Paris.", "Everest is the highest.", "Berlin is in Germany.", "The Alps."]
    batch = {
        "id": np.array([41, 7, 3, 19]),
        "query": np.array(queries, dtype=object),
        "document": np.array(documents, dtype=object),
        "source": np.array(["a", "b", "c", "d"], dtype=object),
    }
    out = score(batch)
    assert list(out) == ["id", "query", "document", "source", "score"]
    for column in batch:
        assert out[column].tolist() == batch[column].tolist()
    assert out["score"].dtype == np.float64
    expected = official_qwen3_scores(
        scorer.model, scorer.tokenizer, list(zip(queries, documents)), max_length=512
    )
    assert out["score"].tolist() == pytest.approx(expected, abs=2e-5)

    batch["document"] = np.array(["Paris.", None, "x", "y"], dtype=object)
    with pytest.raises(InvalidRequestError, match=r"row with id 7: 'document' must be a string, got null"):
        score(batch)


@pytest.fixture(scope="module")
def score_batches(tiny_model_dir: Path) -> Any:
    from genscore_integrations.ray import ScoreBatches

    return ScoreBatches(str(tiny_model_dir), **SETTINGS)


def _as_format(columns: dict[str, list[Any]], fmt: str) -> Any:
    import pandas as pd
    import pyarrow as pa

    if fmt == "pyarrow":
        return pa.table(columns)
    if fmt == "pandas":
        # A filtered or concatenated frame keeps its old labels: rows are found by position, not label.
        return pd.DataFrame(columns, index=[10, 3, 7, 0])
    return {name: np.array(values, dtype=object) for name, values in columns.items()}


@pytest.mark.parametrize("fmt", ["numpy", "pandas", "pyarrow"])
def test_score_batches_takes_each_batch_format_and_names_bad_rows_by_string_id(
    score_batches: Any, scorer: GenerativeScorer, fmt: str
) -> None:
    columns: dict[str, list[Any]] = {
        "id": ["doc-a", "doc-b", "doc-c", "doc-d"],
        "query": ["capital of France", "tallest mountain", "capital of France", "capital of France"],
        "document": ["Paris.", "Everest is the highest.", "Paris.", "Berlin is in Germany."],
    }
    out = score_batches(_as_format(columns, fmt))
    assert type(out) is type(_as_format(columns, fmt))
    if fmt == "pyarrow":
        out = out.to_pydict()
    assert list(out) == ["id", "query", "document", "score"]
    assert {name: list(out[name]) for name in columns} == columns
    expected = official_qwen3_scores(
        scorer.model, scorer.tokenizer, list(zip(columns["query"], columns["document"])), max_length=512
    )
    assert list(out["score"]) == pytest.approx(expected, abs=2e-5)

    columns["document"][2] = None
    with pytest.raises(
        InvalidRequestError, match="row with id 'doc-c': 'document' must be a string, got null"
    ):
        score_batches(_as_format(columns, fmt))
    del columns["query"]
    with pytest.raises(InvalidRequestError, match=r"no 'query' column \(columns: \['document', 'id'\]\)"):
        score_batches(_as_format(columns, fmt))


def test_score_batches_names_a_bad_row_by_the_id_column_it_is_given(tiny_model_dir: Path) -> None:
    from genscore_integrations.ray import ScoreBatches

    score = ScoreBatches(str(tiny_model_dir), id_column="passage_id", **SETTINGS)
    batch = {
        "passage_id": np.array(["p-17", "p-4"], dtype=object),
        "query": np.array(["q", "q"], dtype=object),
        "document": np.array(["fine", 3.5], dtype=object),
    }
    with pytest.raises(
        InvalidRequestError, match="row with passage_id 'p-4': 'document' must be a string, got float"
    ):
        score(batch)
    del batch["passage_id"]
    # Without the id, the row is named by its other text, which a user can search the dataset for.
    with pytest.raises(
        InvalidRequestError, match="batch row 1 \\(query 'q', no 'passage_id' column to name it by"
    ) as error:
        score(batch)
    assert (error.value.param, error.value.index) == ("document", 1)


def test_score_batches_names_text_the_tokenizer_cannot_take_by_row_and_column(
    score_batches: Any,
) -> None:
    """A lone surrogate (text decoded from bad UTF-8) was refused by the scorer as "documents[1] is not
    valid text", the row's place in its batch: in a dataset of millions that locates nothing, and the
    column was named by the scorer's word for it, not the dataset's."""
    batch = {
        "id": np.array(["r-0", "r-1"], dtype=object),
        "query": np.array(["capital of France", "capital of France"], dtype=object),
        "document": np.array(["Paris.", "Lyon \ud800 food"], dtype=object),
    }
    with pytest.raises(
        InvalidRequestError,
        match=r"^row with id 'r-1': 'document' is not valid text: it holds a lone surrogate",
    ) as error:
        score_batches(batch)
    assert (error.value.param, error.value.index) == ("document", 1)
    del batch["id"]
    batch["query"][0] = "what \udfff"
    long_document = "Paris is the capital and largest city of France, on the Seine river."
    batch["document"][0] = long_document
    with pytest.raises(
        InvalidRequestError,
        match=r"^batch row 0 \(document 'Paris is the capital and largest city of France, on the S\.\.\.', "
        r"no 'id' column to name it by: see id_column\): 'query' is not valid text",
    ) as error:
        score_batches(batch)
    assert (error.value.param, error.value.index) == ("query", 0)


def test_score_batches_names_the_row_whose_score_is_not_finite(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A model whose embedding of one token is infinite scores NaN for the rows holding it, and the
    scorer refuses the score as "pairs[1] scored nan", the pair's place in its batch."""
    import shutil

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from genscore_core import ScoreRangeError
    from genscore_integrations.ray import ScoreBatches

    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    zebra = AutoTokenizer.from_pretrained(tiny_model_dir).encode(" zebra", add_special_tokens=False)[-1]
    with torch.no_grad():
        model.get_input_embeddings().weight[zebra] = float("inf")
    model.save_pretrained(broken)
    score = ScoreBatches(str(broken), **SETTINGS)
    batch = {
        "id": np.array(["k-1", "k-2", "k-3"], dtype=object),
        "query": np.array(["animals", "animals", "animals"], dtype=object),
        "document": np.array(["a horse", "a zebra", "a cat"], dtype=object),
    }
    with pytest.raises(ScoreRangeError, match=r"^row with id 'k-2': pairs\[1\] scored nan") as error:
        score(batch)
    assert (error.value.param, error.value.index) == ("document", 1)


def test_score_batches_refuses_a_dict_batch_whose_columns_differ_in_length(score_batches: Any) -> None:
    """A batch built by hand with one document fewer than queries was scored for the shorter column
    alone: the last query's row was dropped without a word, and the score column came back shorter
    than the others."""
    batch = {
        "id": np.array([1, 2, 3]),
        "query": np.array(["q", "q", "q"], dtype=object),
        "document": np.array(["a", "b"], dtype=object),
    }
    with pytest.raises(
        InvalidRequestError, match=r"columns differ in length \(\{'id': 3, 'query': 3, 'document': 2\}\)"
    ) as error:
        score_batches(batch)
    assert error.value.param == "document"


def test_score_batches_warm_up_needs_a_local_model(tiny_model_dir: Path) -> None:
    from genscore_integrations.ray import ScoreBatches

    with pytest.raises(InvalidRequestError, match="warm_up=True needs the model in this actor") as error:
        ScoreBatches(str(tiny_model_dir), warm_up=True, server_url="http://127.0.0.1:9")
    assert error.value.param == "warm_up"


@pytest.mark.slow
def test_ray_data_job_equals_the_single_process_job(
    ray_instance: Any, tmp_path: Path, tiny_model_dir: Path, scorer: GenerativeScorer
) -> None:
    from genscore_integrations.ray import ScoreBatches, score_file_on_ray

    words = "Paris France capital river Seine Berlin mountain Everest high snow sun leaf".split()
    rows = [
        {
            "id": i,
            "query": ["capital of France", "tallest mountain", "how plants grow"][i % 3],
            "document": " ".join(words[(i + k) % len(words)] for k in range(2 + i % 7)),
            "lang": "en",
        }
        for i in range(30)
    ]
    source = tmp_path / "pairs.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    single = tmp_path / "single.jsonl"
    score_file(
        ScoreFileOptions(input=source, output=single, chunk_size=8, show_progress=False),
        scorer.config,
        scorer,
    )
    expected = [json.loads(line) for line in single.read_text().splitlines()]

    class BatchNamed(ScoreBatches):
        """Adds which call scored each row: a column of the caller's own, written too."""

        def __call__(self, batch: Any) -> Any:
            import uuid

            import pyarrow as pa

            scored = super().__call__(batch)  # the file job's batches are pyarrow Tables
            return scored.append_column("batch", pa.array([uuid.uuid4().hex] * scored.num_rows))

    folder = tmp_path / "ray-out"
    # Actors that warm up, in fresh Ray workers: the tokenizer loads on a thread beside the warm-up.
    score_file_on_ray(
        source,
        folder,
        str(tiny_model_dir),
        num_actors=2,
        batch_size=8,
        batch_class=BatchNamed,
        **SETTINGS,
        **WARM,
    )
    [file] = sorted(folder.iterdir())
    got = [json.loads(line) for line in file.read_text().splitlines()]
    assert len({row.pop("batch") for row in got}) >= 4  # the work really was split: 30 rows, 8 a batch
    assert [{k: v for k, v in row.items() if k != "score"} for row in got] == [
        {k: v for k, v in row.items() if k != "score"} for row in expected
    ]
    # Other batches, so other float32 summation orders in the forward: equal up to rounding.
    assert [row["score"] for row in got] == pytest.approx([row["score"] for row in expected], abs=1e-6)


RAGGED_ROWS = (
    # Keys that vary from row to row (missing ones came back as "nan"), ids mixing 1 and "x0" (the ints
    # came back as strings), nulls, nested values, numbers JSON keeps exact, a lone surrogate's escape.
    '{"id": 1, "query": "capital of France", "document": "Paris is the capital.", "lang": "en"}\n'
    '{"id": "x0", "query": "tallest mountain", "document": "Everest.", "meta": {"n": [1, 2.5, null]}}\n'
    '{"document": "Berlin is in Germany.", "query": "capital of France", "id": null, "lang": null}\n'
    "\n"
    '{"query": "tallest mountain", "document": "The Alps are high.", "big": 1180591620717411303424}\n'
    '{"id": 2, "query": "capital of France", "document": "Lyon \u00e9t\u00e9", "w": -0.0, "v": 1e-7}\n'
    '{"id": 3.5, "query": "tallest mountain", "document": "K2", "flag": true, "note": "\\ud800"}\n'
    '{"id": [4], "query": "capital of France", "document": "Nice", "lang": "fr", "tags": []}\n'
)


def _parquet_input(path: Path) -> None:
    import datetime

    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "id": pa.array([1, None, 3, 4, 5, None, 7], pa.int64()),
            "query": pa.array(
                ["capital of France", "tallest mountain"] * 3 + ["capital of France"]
            ).dictionary_encode(),
            "document": ["Paris.", "Everest.", "Berlin.", "The Alps.", "Lyon.", "K2.", "Nice."],
            "weight": pa.array([0.5, None, 1e-300, -0.0, 2.0, None, 3.25], pa.float64()),
            "when": pa.array([datetime.datetime(2026, 12, 4, 0, 0, k) for k in range(7)], pa.timestamp("us")),
            "tags": pa.array([["a"], [], None, ["b", "c"], ["d"], [], ["e"]], pa.list_(pa.string())),
        }
    )
    pq.write_table(table, path)


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_ray_file_job_writes_the_bytes_of_genscore_score(
    ray_instance: Any, tmp_path: Path, tiny_model_dir: Path, scorer: GenerativeScorer, suffix: str
) -> None:
    """The same input, the same bytes out, whatever the rows' keys and value types. (One actor and
    one block, so that each batch holds the rows of one of genscore score's chunks: a float32 forward
    over other batches rounds scores differently in their last bits.)"""
    from genscore_integrations.ray import score_file_on_ray

    source = tmp_path / f"pairs{suffix}"
    if suffix == ".jsonl":
        source.write_text(RAGGED_ROWS)
    else:
        _parquet_input(source)
    single = tmp_path / f"single{suffix}"
    options = ScoreFileOptions(input=source, output=single, chunk_size=3, show_progress=False)
    score_file(options, scorer.config, scorer)

    folder = tmp_path / "ray-out"
    score_file_on_ray(source, folder, str(tiny_model_dir), batch_size=3, num_blocks=1, **SETTINGS)
    [file] = sorted(folder.iterdir())
    assert file.name == f"scored{suffix}"
    assert file.read_bytes() == single.read_bytes()
    if suffix == ".jsonl":
        rows = [json.loads(line) for line in file.read_text().splitlines()]
        assert [row.get("id", "absent") for row in rows] == [1, "x0", None, "absent", 2, 3.5, [4]]
        assert "lang" not in rows[1] and rows[3]["big"] == 2**70 and rows[5]["note"] == "\ud800"


@pytest.mark.slow
def test_ray_csv_job_reads_a_folder_and_keeps_every_value_as_text(
    ray_instance: Any, tmp_path: Path, tiny_model_dir: Path, scorer: GenerativeScorer
) -> None:
    """A folder of CSV files (its format told by their extensions), one written by a spreadsheet with a
    byte-order mark: ids like 007 stay 007 in every file (the header's first name must not carry the mark)."""
    import csv

    from genscore_integrations.ray import score_file_on_ray

    folder = tmp_path / "pairs"
    folder.mkdir()
    rows = [
        ["007", "capital of France", "Paris is the capital.", "0.50"],
        ["010", "capital of France", "Berlin is in Germany.", "1e3"],
        ["0042", "tallest mountain", "Everest.", ""],
    ]
    header = "id,query,document,weight\n"
    (folder / "a.csv").write_text(header + "".join(",".join(r) + "\n" for r in rows[:2]), encoding="utf-8")
    (folder / "b.csv").write_text(header + ",".join(rows[2]) + "\n", encoding="utf-8-sig")
    out = tmp_path / "scored"
    out.mkdir()
    (out / "from-an-earlier-run.csv").write_text("id,query,document,weight,score\n1,q,d,,0.5\n")
    import ray.data

    execution = ray.data.DataContext.get_current().execution_options
    assert execution.preserve_order is False
    score_file_on_ray(folder, out, str(tiny_model_dir), batch_size=2, overwrite=True, **SETTINGS)
    # The job orders its own output; the caller's later pipelines keep Ray's faster default.
    assert execution.preserve_order is False
    got = [
        row
        for path in sorted(out.iterdir())
        for row in csv.DictReader(path.read_text(encoding="utf-8").splitlines())
    ]
    assert [[row[name] for name in ("id", "query", "document", "weight")] for row in got] == rows
    expected = official_qwen3_scores(
        scorer.model, scorer.tokenizer, [(r[1], r[2]) for r in rows], max_length=512
    )
    assert [float(row["score"]) for row in got] == pytest.approx(expected, abs=2e-5)


@pytest.mark.slow  # starts the module's Ray instance
def test_score_dataset_uses_no_deprecated_ray_data_argument(ray_instance: Any, tiny_model_dir: Path) -> None:
    """Ray 2.51 deprecated map_batches(concurrency=...): every job logged a warning telling the user to
    change an argument they never wrote."""
    import logging

    import ray.data

    from genscore_integrations.ray import score_dataset

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    ray_data_logger = logging.getLogger("ray.data")
    ray_data_logger.addHandler(handler)
    try:
        score_dataset(
            ray.data.from_items([{"query": "q", "document": "d"}]), str(tiny_model_dir), num_actors=2
        )
    finally:
        ray_data_logger.removeHandler(handler)
    assert [r.getMessage() for r in records if "deprecated" in r.getMessage()] == []


def test_ray_file_job_asks_for_format_where_a_folder_does_not_tell_it(tmp_path: Path) -> None:
    from genscore_core.jobs import InputFileError
    from genscore_integrations.ray import score_file_on_ray

    folder = tmp_path / "pairs"
    folder.mkdir()
    (folder / "a.jsonl").write_text('{"query": "q", "document": "d"}\n')
    (folder / "b.csv").write_text("query,document\nq,d\n")
    with pytest.raises(InputFileError, match=r"holding \['.csv', '.jsonl'\] files; pass format=") as error:
        score_file_on_ray(folder, tmp_path / "out", "unused")
    assert error.value.param == "format"
    (tmp_path / "pairs-without-extension").write_text('{"query": "q", "document": "d"}\n')
    with pytest.raises(InputFileError, match=r"extension ''; use .jsonl, .csv or .parquet, or pass format="):
        score_file_on_ray(tmp_path / "pairs-without-extension", tmp_path / "out", "unused")
    # A URL is named as given (through Path, "file:///x" would print as "file:/x").
    url = f"file://{tmp_path}/pairs-without-extension"
    with pytest.raises(InputFileError, match=f"^{url}: cannot tell the format .* or pass format=$"):
        score_file_on_ray(url, tmp_path / "out", "unused")


@pytest.mark.slow  # starts the module's Ray instance
def test_ray_file_job_names_the_file_and_line_its_reader_cannot_read(
    ray_instance: Any, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Ray's JSON lines reader (pandas) said only "Expected object or value at position 56", of some
    block."""
    from genscore_core.jobs import InputFileError
    from genscore_integrations.ray import score_file_on_ray

    folder = tmp_path / "pairs"
    folder.mkdir()
    (folder / "a.jsonl").write_text('{"id": 1, "query": "q", "document": "d"}\n')
    (folder / "b.jsonl").write_text('{"id": 2, "query": "q", "document": "d"}\n\n{"id": 3, "query": "q",,}\n')
    with pytest.raises(InputFileError, match=r"pairs/b\.jsonl, line 3: invalid JSON \(Expecting property"):
        score_file_on_ray(folder, tmp_path / "scored", str(tiny_model_dir), **SETTINGS)
    # Arrow's CSV reader names the file alone: "Failed to read CSV file: .../b.csv".
    sheets = tmp_path / "sheets"
    sheets.mkdir()
    (sheets / "a.csv").write_bytes(b"id,query,document\n1,q,d\n")
    (sheets / "b.csv").write_bytes(b"id,query,document\n2,q,d\n3,q,caf\xe9\n")
    with pytest.raises(InputFileError, match=r"sheets/b\.csv, line 3: not UTF-8 text"):
        score_file_on_ray(sheets, tmp_path / "scored", str(tiny_model_dir), **SETTINGS)


@pytest.mark.slow  # starts the module's Ray instance
def test_ray_file_job_refuses_a_repeated_json_key_and_an_unclosed_csv_quote(
    ray_instance: Any, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """As genscore score does. Ray's pandas reader kept the second "query" of a row, and its Arrow CSV
    reader read every line after a quote that is never closed into that row's document: both jobs
    succeeded, scoring a row the input does not hold and dropping the rest without a word."""
    from genscore_core.jobs import InputFileError
    from genscore_integrations.ray import score_file_on_ray

    (tmp_path / "pairs.jsonl").write_text(
        '{"id": 1, "query": "q", "document": "d"}\n{"id": 2, "query": "a", "document": "d", "query": "b"}\n'
    )
    with pytest.raises(InputFileError, match=r"pairs\.jsonl, line 2: the key 'query' appears twice"):
        score_file_on_ray(tmp_path / "pairs.jsonl", tmp_path / "scored", str(tiny_model_dir), **SETTINGS)
    # The quote opens in the last column, so the merged row still has the header's width.
    (tmp_path / "pairs.csv").write_text('id,query,document\n1,q,"Paris\n2,q,Berlin\n3,q,Lyon\n')
    with pytest.raises(InputFileError, match=r"pairs\.csv, line 2: a quoted value .* is never closed"):
        score_file_on_ray(tmp_path / "pairs.csv", tmp_path / "scored", str(tiny_model_dir), **SETTINGS)


@pytest.mark.slow  # starts the module's Ray instance
def test_a_refused_row_reaches_a_pipeline_as_the_docs_say(ray_instance: Any, tiny_model_dir: Path) -> None:
    """docs/scaling.md, section 8: in one's own pipeline the refusal comes as Ray's UserCodeException,
    its text in the message; with raise_original_map_exception it is an InvalidRequestError."""
    import ray.data
    from ray.exceptions import RayTaskError

    from genscore_integrations.ray import score_dataset

    rows = [{"id": f"p{i}", "query": "q", "document": None if i == 3 else "d"} for i in range(5)]
    context = ray.data.DataContext.get_current()
    with pytest.raises(RayTaskError, match="UDF failed to process a data block") as error:
        score_dataset(ray.data.from_items(rows), str(tiny_model_dir), **SETTINGS).take_all()
    assert not isinstance(error.value, InvalidRequestError)
    assert "row with id 'p3': 'document' must be a string, got null" in str(error.value)
    context.raise_original_map_exception = True
    try:
        with pytest.raises(InvalidRequestError) as refused:
            score_dataset(ray.data.from_items(rows), str(tiny_model_dir), **SETTINGS).take_all()
    finally:
        context.raise_original_map_exception = False
    assert (refused.value.message, refused.value.param) == (
        "row with id 'p3': 'document' must be a string, got null",
        "document",
    )


@pytest.mark.slow  # starts the module's Ray instance
def test_ray_parquet_job_raises_a_refused_row_as_itself(
    ray_instance: Any, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A null document in a Parquet file is refused by the scoring actor, and the job raised Ray's
    RayTaskError(UserCodeException) "UDF failed to process a data block": the refusal (row, column)
    was left only as text in a worker's traceback, no InvalidRequestError to catch, no param."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray.data

    from genscore_integrations.ray import score_file_on_ray

    pq.write_table(
        pa.table({"id": [1, 2, 3], "query": ["q", "q", "q"], "document": ["Paris.", None, "Lyon."]}),
        tmp_path / "pairs.parquet",
    )
    context = ray.data.DataContext.get_current()
    with pytest.raises(
        InvalidRequestError, match=r"^row with id 2: 'document' must be a string, got null$"
    ) as error:
        score_file_on_ray(tmp_path / "pairs.parquet", tmp_path / "scored", str(tiny_model_dir), **SETTINGS)
    assert (type(error.value), error.value.param, error.value.index) == (InvalidRequestError, "document", 1)
    # The setting that keeps the refusal is the job's; the caller's own pipelines keep Ray's default.
    assert context.raise_original_map_exception is False


@pytest.mark.slow  # starts the module's Ray instance
def test_ray_file_job_reraises_a_write_failure_without_reading_the_input_again(
    ray_instance: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure of the write used to be followed by a scan of the whole input for a bad line (a full
    read of a large S3 input) before it was raised; here, where the input has a line the scan flags,
    the write's failure was even reported as that line."""
    import ray.data
    from ray.exceptions import RayTaskError

    from genscore_integrations.ray import score_file_on_ray

    def failing_write(*args: Any, **kwargs: Any) -> Any:
        raise RayTaskError("Write", "Traceback: ...", OSError("No space left on device"))

    monkeypatch.setattr(ray.data.Dataset, "iter_batches", failing_write)
    (tmp_path / "pairs.jsonl").write_text('{"query": "q", "document": "d"}\n[1, 2]\n')
    with pytest.raises(RayTaskError) as error:
        score_file_on_ray(tmp_path / "pairs.jsonl", tmp_path / "scored", "unused", **SETTINGS)
    assert isinstance(error.value.cause, OSError)


def test_ray_csv_job_names_the_file_whose_header_lacks_a_column(tmp_path: Path) -> None:
    """Refused before Ray starts (no Ray instance here), where it used to fail in the first actor, after
    the model had loaded, as "no 'document' column (columns: [...])" without naming the file."""
    from genscore_core.jobs import InputFileError
    from genscore_integrations.ray import score_file_on_ray

    folder = tmp_path / "pairs"
    folder.mkdir()
    (folder / "a.csv").write_text("id,query,document\n1,q,d\n")
    (folder / "b.csv").write_text("id,query,passage\n2,q,d\n")
    with pytest.raises(
        InputFileError, match=r"pairs/b\.csv: no 'document' column in the header \['id', 'query', 'passage'\]"
    ) as error:
        score_file_on_ray(folder, tmp_path / "scored", "unused", **SETTINGS)
    assert error.value.param == "document"
    with pytest.raises(InputFileError, match=r"a\.csv: no 'text' column in the header"):
        score_file_on_ray(folder / "a.csv", tmp_path / "scored", "unused", document_column="text")


@pytest.mark.slow  # starts the module's Ray instance
def test_ray_file_job_with_no_rows_writes_an_empty_output_folder(
    ray_instance: Any, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Ray writes nothing for no rows: the job returned without a word and left no output at all."""
    from genscore_integrations.ray import score_file_on_ray

    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "header.csv").write_text("id,query,document\n")
    for source in ("empty.jsonl", "header.csv"):
        out = tmp_path / f"scored-{source}"
        score_file_on_ray(tmp_path / source, out, str(tiny_model_dir), **SETTINGS)
        assert out.is_dir() and list(out.iterdir()) == []


def test_ray_file_job_says_an_input_that_is_not_there_is_not_there(tmp_path: Path) -> None:
    """A folder that did not exist was reported as one whose format could not be told."""
    from genscore_core.jobs import InputFileError
    from genscore_integrations.ray import score_file_on_ray

    for source in (f"{tmp_path}/no-such-folder/", f"{tmp_path}/no-such.jsonl", f"file://{tmp_path}/gone.csv"):
        for fmt in (None, "csv"):
            with pytest.raises(InputFileError, match=f"^{source}: no such file or folder$") as error:
                score_file_on_ray(source, tmp_path / "out", "unused", format=fmt)
            assert error.value.param == "input"


def test_ray_file_job_refuses_an_output_that_holds_files(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Ray adds its files beside those already there: a second run into the same folder would hold
    every row twice. Refused before Ray reads anything."""
    from genscore_core.jobs import JobStateError
    from genscore_integrations.ray import score_file_on_ray

    source = tmp_path / "pairs.jsonl"
    source.write_text('{"query": "q", "document": "d"}\n')
    out = tmp_path / "scored"
    out.mkdir()
    (out / "part-0.jsonl").write_text('{"query": "q", "document": "d", "score": 0.5}\n')
    with pytest.raises(JobStateError, match="scored already holds files; pass overwrite=True") as error:
        score_file_on_ray(source, out, str(tiny_model_dir), **SETTINGS)
    assert error.value.param == "output"
    with pytest.raises(JobStateError, match="is a file; the output is a folder"):
        score_file_on_ray(source, source, str(tiny_model_dir), **SETTINGS)


@pytest.fixture(scope="module")
def genscore_serve(tiny_model_dir: Path) -> Iterator[str]:
    """A real ``genscore serve`` process on loopback, the reference the Ray Serve deployment must match."""
    serve = genscore_serve_process([sys.executable, "-m", "genscore_core.cli"], tiny_model_dir, timeout=180)
    with serve as (url, _):
        yield url


@pytest.fixture(scope="module")
def ray_serve(ray_instance: Any, tiny_model_dir: Path) -> str:
    from ray import serve

    from genscore_integrations.ray import serve_app

    # The port is free when chosen, but Ray starts processes of its own (each taking ports) before its
    # proxy binds it: once in CI one of them took it first. Another port is tried then.
    for attempt in range(3):
        port = free_port()
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            break
        except Exception as error:  # ray.exceptions.RayTaskError of the proxy: "Failed to bind"
            serve.shutdown()
            if "bind" not in str(error) or attempt == 2:
                raise
    app = serve_app(
        str(tiny_model_dir),
        num_gpus=0,
        autoscaling_config={"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 32},
        **SETTINGS,
    )
    serve.run(app, name="genscore", route_prefix="/")
    return f"http://127.0.0.1:{port}"


def test_serve_app_refuses_a_replica_count_and_autoscaling_together(tiny_model_dir: Path) -> None:
    """The fixed count used to win and the autoscaling asked for was dropped without a word."""
    from genscore_core import ConfigurationError
    from genscore_integrations.ray import serve_app

    with pytest.raises(
        ConfigurationError, match=r"num_replicas \(a fixed count\) or autoscaling_config, not both"
    ) as error:
        serve_app(str(tiny_model_dir), num_replicas=2, autoscaling_config={"max_replicas": 8}, **SETTINGS)
    assert error.value.setting == "num_replicas"


@pytest.mark.slow  # starts the module's Ray instance
def test_serve_app_names_a_model_folder_that_is_not_there(ray_instance: Any, tmp_path: Path) -> None:
    """Every replica failed to load the model, and serve.run said only "Deploying application ...
    failed": the path and what is wrong with it are named before anything is deployed."""
    from ray import serve

    from genscore_core.errors import ModelNotFoundError
    from genscore_integrations.ray import serve_app

    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelNotFoundError, match=f"no such folder \\({missing}\\)") as error:
        serve.run(
            serve_app(str(missing), num_gpus=0, num_replicas=1, **SETTINGS), name="bad", route_prefix="/bad"
        )
    assert error.value.setting == "model"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelNotFoundError, match=f"{empty} holds neither config.json nor tokenizer files"):
        serve.run(
            serve_app(str(empty), num_gpus=0, num_replicas=1, **SETTINGS), name="bad", route_prefix="/bad"
        )


def _without_ids(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in ("id", "created")}


@pytest.mark.slow
def test_ray_serve_replica_freezes_what_it_loaded_out_of_garbage_collection(ray_serve: str) -> None:
    """As genscore serve does, so that full collections skip the loaded scorer's objects (well over
    100,000). Ray Serve 2.60 does it when a replica's initialisation ends (RAY_SERVE_FREEZE_GC_ON_STARTUP);
    this holds the replica to it, as the docs say, should a Ray release drop it."""
    stats = httpx.get(ray_serve + "/stats", timeout=60).json()
    assert stats["gc"]["frozen_objects"] > 100_000, stats["gc"]


def test_ray_serve_answers_like_genscore_serve(genscore_serve: str, ray_serve: str) -> None:
    with httpx.Client(timeout=120) as http:
        for path, request in [
            ("/generative_scoring", SEED_TEXT_REQUEST),
            ("/generative_score", SEED_TOKEN_REQUEST),
            ("/v1/rerank", RERANK_REQUEST),
        ]:
            reference = http.post(genscore_serve + path, json=request)
            served = http.post(ray_serve + path, json=request)
            assert reference.status_code == served.status_code == 200, served.text
            want, got = reference.json(), served.json()
            scores = "data" if "data" in want else "results"
            key = "score" if scores == "data" else "relevance_score"
            assert [r[key] for r in got[scores]] == pytest.approx([r[key] for r in want[scores]], abs=1e-6)
            for entry in want[scores] + got[scores]:
                entry.pop(key)
            assert _without_ids(got) == _without_ids(want)

        empty = http.post(ray_serve + "/generative_scoring", json=SEED_EMPTY_ITEMS_REQUEST)
        seed_error = {**SEED_EMPTY_ITEMS_ERROR, "detail": SEED_EMPTY_ITEMS_ERROR["error"]["message"]}
        assert (empty.status_code, empty.json()) == (400, seed_error)
        for body in ({"query": "q", "items": ["a"]}, {"query": "q", "documents": "not a list"}):
            path = "/generative_scoring" if "items" in body else "/v1/rerank"
            reference = http.post(genscore_serve + path, json=body)
            served = http.post(ray_serve + path, json=body)
            assert (served.status_code, served.json()) == (reference.status_code, reference.json())
            assert served.status_code == 422
        assert http.get(ray_serve + "/health").json() == {"status": "ok"}
        models = [http.get(url + "/v1/models").json()["data"][0] for url in (genscore_serve, ray_serve)]
        assert (
            models[0]["id"] == models[1]["id"]
            and models[0]["max_model_len"] == models[1]["max_model_len"] == 512
        )


@pytest.mark.slow
def test_ray_serve_batches_concurrent_callers(
    ray_serve: str, tiny_model_dir: Path, scorer: GenerativeScorer
) -> None:
    from ray import serve

    from genscore_integrations.ray import serve_app

    callers = 4
    tokens = sum(len(prompt.token_ids) for prompt in scorer.prepare_score(SEED_TEXT_REQUEST).prompts)
    # The batch is sent once it holds `callers` requests' tokens; the long wait only bounds a failure,
    # so the test does not depend on how fast the requests arrive.
    limits = ServerLimits(batch_max_tokens=callers * tokens, batch_max_wait_ms=600_000, batch_wait="always")
    app = serve_app(
        str(tiny_model_dir), num_gpus=0, num_replicas=1, limits=limits, name="batching", **SETTINGS
    )
    serve.run(app, name="batching", route_prefix="/batching")
    url = f"{ray_serve}/batching"  # the same proxy serves both applications
    with ThreadPoolExecutor(callers) as pool:
        answers = list(
            pool.map(
                lambda _: httpx.post(f"{url}/generative_scoring", json=SEED_TEXT_REQUEST, timeout=900),
                range(callers),
            )
        )
    expected = [d.score for d in scorer.score(SEED_TEXT_REQUEST).data]
    for answer in answers:
        assert answer.status_code == 200, answer.text
        assert [d["score"] for d in answer.json()["data"]] == pytest.approx(expected, abs=1e-6)
    stats = httpx.get(f"{url}/stats").json()
    assert (stats["requests"], stats["batches"], stats["largest_batch"]) == (callers, 1, callers)
    serve.delete("batching")


def test_importing_without_ray_names_the_extra() -> None:
    blocker = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'ray' or name.startswith('ray.'):\n"
        "            raise ImportError(f'No module named {name!r}')\n"
        "sys.meta_path.insert(0, Block())\n"
        "try:\n"
        "    import genscore_integrations.ray\n"
        "except ImportError as error:\n"
        "    print(error)\n"
        "else:\n"
        "    print('imported')\n"
    )
    result = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert (
        result.stdout.strip()
        == 'genscore_integrations.ray needs Ray; install it with: pip install "genscore[ray]"'
    )


@pytest.mark.slow
def test_worker_preload_modules_import_and_cover_what_scoring_needs(tiny_model_dir: Path) -> None:
    """Each name imports (Ray would only log a typo and carry on), and once they are imported, building a
    scorer and scoring imports no more of transformers' model-building code: that is what they spare.
    They also leave Triton's compiler key computed (the first launch's GPU-free work) and CUDA untouched,
    so that an actor later started in the worker still gets only the GPU Ray assigns it."""
    from genscore_integrations.ray import WORKER_PRELOAD_MODULES

    script = (
        "import importlib, sys\n"
        f"for name in {list(WORKER_PRELOAD_MODULES)!r}:\n"
        "    importlib.import_module(name)\n"
        "import torch, triton.runtime.cache\n"
        "print(triton.runtime.cache.triton_key.cache_info().currsize, torch.cuda.is_initialized())\n"
        "before = set(sys.modules)\n"
        "from genscore_integrations.ray import ScoreBatches\n"
        "import numpy as np\n"
        f"score = ScoreBatches({str(tiny_model_dir)!r}, device='cpu', dtype='float32', max_length=512)\n"
        "score({'query': np.array(['q'], dtype=object), 'document': np.array(['d'], dtype=object)})\n"
        "print(sorted(m for m in set(sys.modules) - before if m.startswith(('torch.', 'transformers.'))))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[-2] == "1 False"
    added = eval(lines[-1])
    # Only the model's own files and its tokenizer's may load late; torch and shared model code may not.
    late = [
        m
        for m in added
        if not m.startswith(
            (
                "transformers.models.",
                "transformers.tokenization",
                "transformers.convert_slow",
                "transformers.integrations.",
            )
        )
    ]
    assert late == [], late
