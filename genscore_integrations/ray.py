"""genscore on Ray: offline scoring with Ray Data and an autoscaling service with Ray Serve.

Needs Ray (``pip install "genscore[ray]"``); without it, importing this module raises an ImportError
that names the extra.

Ray Data: :class:`ScoreBatches` is a callable class for ``Dataset.map_batches``. Each actor loads one
scorer in ``__init__`` and adds a score column to every batch of (query, document) rows, keeping the
rows, their ids and their order; :func:`score_dataset` applies it with one actor per GPU, and
:func:`score_file_on_ray` is ``genscore score`` on a cluster (read, score, write)::

    import ray.data
    from genscore_integrations.ray import ScoreBatches

    ds = ray.data.read_parquet("s3://bucket/pairs/")
    scored = ds.map_batches(
        ScoreBatches,
        fn_constructor_kwargs={"model": "Qwen/Qwen3-Reranker-0.6B", "dtype": "bfloat16"},
        batch_size=4096,
        num_gpus=1,
        compute=ray.data.ActorPoolStrategy(size=8),  # eight actors, one GPU each
    )
    scored.write_parquet("s3://bucket/scored/")

Ray Serve: :func:`serve_app` builds a deployment of ``genscore serve``'s own FastAPI app (the same
endpoints, bodies and errors), one replica per GPU, autoscaled::

    from ray import serve
    from genscore_integrations.ray import serve_app

    serve.run(serve_app("Qwen/Qwen3-Reranker-0.6B", dtype="bfloat16"), route_prefix="/")

Requests from different callers are batched inside each replica by the app's own request batcher
(the one ``genscore serve`` uses), which merges the jobs of concurrent requests into one engine
call up to a token budget; ``@serve.batch`` is not used because it would batch whole requests
without regard to their size and bypass the app's limits and error handling.
"""

from __future__ import annotations

import functools
import io
import math
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any, Union

import numpy as np

try:
    import ray  # imported here so that a missing Ray is reported with the extra to install
except ImportError as exc:
    raise ImportError(
        'genscore_integrations.ray needs Ray; install it with: pip install "genscore[ray]"'
    ) from exc

from genscore_core.config import DEFAULT_MODEL, LocalSettings, ScorerConfig
from genscore_core.engine import ScoringEngine
from genscore_core.errors import ConfigurationError, InvalidRequestError, ScoreRangeError
from genscore_core.jobs.files import (
    FORMATS,
    PART_SUFFIX,
    Columns,
    CsvReader,
    FileFormat,
    InputFileError,
    InputRow,
    JsonLinesReader,
    RowReader,
    detect_format,
    encode_part,
    format_of_suffix,
    import_pyarrow_parquet,
    merge_parts,
)
from genscore_core.jobs.score import JobStateError
from genscore_core.kernels.dispatch import prepare_triton
from genscore_core.loading import (
    check_model_source,
    check_tokenizer_files,
    load_tokenizer,
    resolve_device,
)
from genscore_core.protocol import check_text
from genscore_core.scorer import GenerativeScorer, load_configured_lm
from genscore_core.server.limits import ServerLimits
from genscore_core.truncation import max_chars_per_token

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    from ray.data import Dataset
    from ray.serve import Application

__all__ = [
    "DEFAULT_AUTOSCALING",
    "WORKER_PRELOAD_MODULES",
    "GenscoreServer",
    "ScoreBatches",
    "score_dataset",
    "score_file_on_ray",
    "serve_app",
    "warm_up_model",
]


WORKER_PRELOAD_MODULES: tuple[str, ...] = (
    "torch",
    "transformers.modeling_utils",
    "transformers.modeling_layers",
    "transformers.generation.utils",
    "ray.data",
    "genscore_integrations.ray_preload",
)
"""Modules a scoring actor imports before it can load a model: about 10 s of a fresh worker's start
(the last one also does the GPU-free half second of the first Triton kernel launch, see
:mod:`genscore_integrations.ray_preload`).

Ray can import them into its pooled worker processes when the cluster starts, so that an actor
started later by a job finds them imported (Ray's ``preload_python_modules`` system setting)::

    ray start --head --system-config='{"preload_python_modules": ["torch", "transformers.modeling_utils", ...]}'
    # or, for a local cluster: ray.init(_system_config={"preload_python_modules": list(WORKER_PRELOAD_MODULES)})

None of them initialises CUDA, so each actor still sees only the GPU Ray gives it.
"""


class ScoreBatches:
    """A callable class for ``Dataset.map_batches``: one scorer per actor, a score column per batch.

    Args:
        model: Hub id or local folder of the reranker (as for :class:`~genscore_core.GenerativeScorer`).
        query_column: Column holding the queries.
        document_column: Column holding the documents.
        score_column: Column added with the scores (float64); it must not exist yet.
        id_column: Column whose value names a bad row in the error (a row's position in its batch
            means little in a dataset of millions).
        row_label_column: Column whose text names each row in errors, before ``id_column``
            (:func:`score_file_on_ray` passes its rows' ``FILE, line N``).
        warm_up: Run made-up prompts through the model in ``__init__`` while the tokenizer loads
            on a thread beside them, so that the first real batch finds the GPU kernels loaded and
            the actor is ready sooner (:func:`warm_up_model`). ``None`` (the default) does so on
            a GPU and not on the CPU, where a forward has no start-up to hide and costs real time.
        **settings: :class:`~genscore_core.ScorerConfig` fields (``dtype``, ``max_length``,
            ``template``, ``instruction``, ...). ``device`` defaults to the GPU Ray gave the actor,
            or the CPU when it gave none.

    Each batch is scored through the scorer's pair path, which groups the batch's rows by query so
    each query's shared prefix is computed once; rows may come in any query order. Every other
    column (ids included) is returned unchanged, in the same row order, in the batch's own format
    (``batch_format`` numpy, the default, ``"pandas"`` or ``"pyarrow"``). A row whose query or
    document is missing, not a string or not valid text stops the batch with an
    :class:`InvalidRequestError` naming the column and the row: by its ``id_column`` value where the
    batch has that column, else by its batch position and the start of its other text. :attr:`startup_s` says how
    long each start-up step took, for the actor's logs.
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        query_column: str = "query",
        document_column: str = "document",
        score_column: str = "score",
        id_column: str = "id",
        warm_up: bool | None = None,
        row_label_column: str | None = None,
        **settings: Any,
    ) -> None:
        self.query_column = query_column
        self.document_column = document_column
        self.score_column = score_column
        self.id_column = id_column
        self.row_label_column = row_label_column
        config = ScorerConfig(model=model or DEFAULT_MODEL, **settings)
        local = config.local
        if warm_up is None:
            warm_up = local is not None and resolve_device(local.device).type == "cuda"
        elif warm_up and local is None:
            raise InvalidRequestError(
                "warm_up=True needs the model in this actor, not a server_url", param="warm_up"
            )
        self.startup_s: dict[str, float] = {}
        """When each start-up step ended, in seconds from the start of ``__init__``: ``model``, then
        ``warm-up`` and ``tokenizer`` (on a thread beside the warm-up), and ``ready``."""
        started = time.perf_counter()
        if warm_up:
            self.scorer = _load_warmed(config, self.startup_s)
        else:
            self.scorer = GenerativeScorer(config=config)
        self.startup_s["ready"] = time.perf_counter() - started

    def __call__(self, batch: Batch) -> Batch:
        names = _column_names(batch)
        if self.score_column in names:
            raise InvalidRequestError(
                f"the batch already has a {self.score_column!r} column; pick another score_column",
                param=self.score_column,
            )
        if isinstance(batch, dict):
            # Ray's batches are whole rows; a dict built by hand may not be, and zip would drop the
            # rows past the shortest column without a word.
            lengths = {name: len(values) for name, values in batch.items()}
            if len(set(lengths.values())) > 1:
                raise InvalidRequestError(
                    f"the batch's columns differ in length ({lengths}); each row needs a value in each",
                    param=min(lengths, key=lambda name: lengths[name]),
                )
        queries = self._texts(batch, names, self.query_column)
        documents = self._texts(batch, names, self.document_column)
        try:
            scores = self.scorer.score_pairs(list(zip(queries, documents)))
        except ScoreRangeError as error:
            if error.index is None:
                raise
            # The scorer names the pair by its place in this batch ("pairs[3]"), which locates nothing
            # in a dataset: say which row it is, as the checks above do.
            column = self.query_column if error.param == "query" else self.document_column
            where = self._row(batch, names, error.index, column)
            raise ScoreRangeError(f"{where}: {error.message}", param=column, index=error.index) from error
        return _with_column(batch, self.score_column, np.asarray(scores, dtype=np.float64))

    def _texts(self, batch: Batch, names: list[str], column: str) -> list[str]:
        if column not in names:
            raise InvalidRequestError(f"no {column!r} column (columns: {sorted(names)})", param=column)
        values = _column_values(batch, column)
        for position, value in enumerate(values):
            try:
                if _is_missing(value):
                    raise InvalidRequestError(f"{column!r} must be a string, got null")
                # Also refuses text the tokenizer cannot take (a lone surrogate) here, by row, rather
                # than in the scorer, which knows only the batch position.
                check_text(value, repr(column))
            except InvalidRequestError as error:
                where = self._row(batch, names, position, column)
                raise InvalidRequestError(f"{where}: {error.message}", param=column, index=position) from None
        return values

    def _row(self, batch: Batch, names: list[str], position: int, column: str) -> str:
        """The row at ``position`` of ``batch`` as a user can find it in the dataset: by its id, or
        else by its other text, since a batch position means nothing outside the batch."""
        if self.row_label_column is not None and self.row_label_column in names:
            return str(_column_values(batch, self.row_label_column)[position])
        if self.id_column in names:
            return f"row with {self.id_column} {_column_values(batch, self.id_column)[position]!r}"
        other = self.document_column if column == self.query_column else self.query_column
        value = _column_values(batch, other)[position] if other in names else None
        seen = ""
        if isinstance(value, str):
            shown = value if len(value) <= 60 else value[:57] + "..."
            seen = f"{other} {shown!r}, "
        return f"batch row {position} ({seen}no {self.id_column!r} column to name it by: see id_column)"


Batch = Union[dict[str, np.ndarray], "pd.DataFrame", "pa.Table"]
"""A batch as ``map_batches`` hands it over: numpy (its default), ``batch_format="pandas"`` or
``"pyarrow"``."""


def _column_names(batch: Batch) -> list[str]:
    table = _as_arrow(batch)
    if table is not None:
        return list(table.column_names)
    return [str(name) for name in batch.keys()]


def _column_values(batch: Batch, column: str) -> list[Any]:
    """The column as plain Python values, by position (a pandas index plays no part)."""
    table = _as_arrow(batch)
    if table is not None:
        return list(table.column(column).to_pylist())
    return list(batch[column].tolist())


def _with_column(batch: Batch, column: str, values: np.ndarray) -> Batch:
    """``batch`` with one more column, in the format it came in."""
    table = _as_arrow(batch)
    if table is not None:
        import pyarrow as pa

        return table.append_column(column, pa.array(values, type=pa.float64()))
    if isinstance(batch, dict):
        return {**batch, column: values}
    return batch.assign(**{column: values})


def _is_missing(value: Any) -> bool:
    # pandas (3 and later: even in a string column) holds a missing value as NaN or pd.NA, not None.
    return (
        value is None or (isinstance(value, float) and math.isnan(value)) or type(value).__name__ == "NAType"
    )


def _as_arrow(batch: Batch) -> Any | None:
    """``batch`` if it is a pyarrow table, else None (without importing pyarrow for other batches)."""
    return batch if type(batch).__module__.startswith("pyarrow") else None


def _load_warmed(config: ScorerConfig, timings: dict[str, float]) -> GenerativeScorer:
    """The scorer ``config`` asks for, its tokenizer loaded on a thread while the model warms up.

    Running the warm-up's batches mostly waits on the GPU, which leaves the GIL to the tokenizer's
    Python and Rust work. The tokenizer starts only once the model is loaded: transformers resolves
    its lazily imported names without a lock, and two threads importing from it at once can fail
    ("cannot import name 'AutoConfig'"). Before that the thread does :func:`prepare_triton`, which
    imports nothing of transformers and mostly hashes files without the GIL.
    """

    def timed(step: str, started: float, value: Any) -> Any:
        timings[step] = time.perf_counter() - started
        return value

    def tokenizer_ready() -> Any:
        tokenizer = load_tokenizer(config.model, trust_remote_code=config.trust_remote_code)
        # Computed once per tokenizer on the first call that cuts texts (a pass over the vocabulary,
        # about 0.2 s); here it is off the first batch's path.
        max_chars_per_token(tokenizer)
        return timed("tokenizer", started, tokenizer)

    local = config.local
    assert local is not None, "only a model loaded here is warmed up"
    device = resolve_device(local.device)
    started = time.perf_counter()
    with ThreadPoolExecutor(1, thread_name_prefix="genscore-startup") as pool:
        # A preloaded worker has done this already (then it returns at once).
        triton = pool.submit(prepare_triton) if device.type == "cuda" else None
        causal_lm = load_configured_lm(config, local, device)
        timed("model", started, None)
        tokenizer = pool.submit(tokenizer_ready)
        warm_up_model(causal_lm, config)
        timed("warm-up", started, None)
        if triton is not None:
            triton.result()
        loaded_tokenizer = tokenizer.result()
    return GenerativeScorer.from_model(causal_lm, loaded_tokenizer, config=config)


WARM_UP_PROMPT_TOKENS = 320
"""Length of the made-up prompts of :func:`warm_up_model`: a query and a few hundred words of document."""


def warm_up_model(causal_lm: Any, config: ScorerConfig) -> None:
    """Score made-up token ids with ``causal_lm`` the way a large call scores real ones, and drop them
    (:meth:`ScoringEngine.warm_up`).

    The first batch a fresh process runs on a GPU costs about a second more than later ones
    (docs/scaling.md, section 8): Triton finds and loads its compiled kernels, cuBLAS sets up, the
    allocator takes its first blocks. That is per process, not per engine, so a throwaway engine
    warms the scorer built afterwards. No tokenizer is needed, so this can run while it loads.
    """
    engine = ScoringEngine.for_model(causal_lm, config.local or LocalSettings(), pad_token_id=0)
    positions = getattr(causal_lm.config, "max_position_embeddings", None) or WARM_UP_PROMPT_TOKENS
    engine.warm_up(min(WARM_UP_PROMPT_TOKENS, config.prompt.max_length or positions, positions))


def score_dataset(
    dataset: Dataset,
    model: str | None = None,
    *,
    num_actors: int = 1,
    num_gpus: float = 0.0,
    batch_size: int = 4096,
    query_column: str = "query",
    document_column: str = "document",
    score_column: str = "score",
    id_column: str = "id",
    batch_class: type[ScoreBatches] | None = None,
    warm_up: bool | None = None,
    row_label_column: str | None = None,
    batch_format: str = "numpy",
    **settings: Any,
) -> Dataset:
    """``dataset`` with a score column, computed by ``num_actors`` :class:`ScoreBatches` actors.

    ``num_gpus=1`` gives each actor a GPU of its own (one model per GPU); 0 scores on CPUs.
    ``batch_size`` rows go to an actor at a time: larger batches share more query prefixes and fill
    the forward's token budget better. ``batch_class`` replaces :class:`ScoreBatches` by a subclass
    (one that adds columns of its own, say); ``id_column``, ``warm_up`` and ``row_label_column`` are
    :class:`ScoreBatches`' own. ``batch_format`` is the format the actors get each batch in
    (``map_batches``'): numpy by default; ``"pyarrow"`` keeps every column's type (numpy holds a
    nullable integer column as floats, its nulls as NaN).

    Every row comes back, with all its columns, but in the order Ray Data's execution gives: with
    several actors, a block that takes longer comes out after blocks read behind it. Set
    ``ray.data.DataContext.get_current().execution_options.preserve_order = True`` before running
    it to keep the input's order (:func:`score_file_on_ray` does so for its job). The setting is
    Ray Data's, shared with the dataset this one was made from, so it is the caller's to choose.
    """
    import ray.data

    ScorerConfig(model=model or DEFAULT_MODEL, **settings)  # reject bad settings before any actor starts
    # Passed only when given: a batch_class of the caller's may not take it.
    label = {} if row_label_column is None else {"row_label_column": row_label_column}
    return dataset.map_batches(
        batch_class or ScoreBatches,
        fn_constructor_kwargs={
            "model": model,
            "query_column": query_column,
            "document_column": document_column,
            "score_column": score_column,
            "id_column": id_column,
            "warm_up": warm_up,
            **label,
            **settings,
        },
        batch_size=batch_size,
        batch_format=batch_format,
        # Ray 2.51 deprecated concurrency= (it logs a warning on every call) for this.
        compute=ray.data.ActorPoolStrategy(size=num_actors),
        num_gpus=num_gpus or None,
    )


def score_file_on_ray(
    input: str | Path,
    output: str | Path,
    model: str | None = None,
    *,
    format: str | None = None,
    num_actors: int = 1,
    num_gpus: float = 0.0,
    batch_size: int = 4096,
    num_blocks: int | None = None,
    query_column: str = "query",
    document_column: str = "document",
    score_column: str = "score",
    id_column: str = "id",
    batch_class: type[ScoreBatches] | None = None,
    warm_up: bool | None = None,
    overwrite: bool = False,
    **settings: Any,
) -> None:
    """``genscore score`` on a Ray cluster: read ``input``, score every row, write ``output``.

    The input is a JSON lines, CSV or Parquet file (or folder of them, or a URL Ray can read); the
    output is a folder holding one file of the same format, ``scored.jsonl`` (``.csv``,
    ``.parquet``; none for an input without rows): the input's rows in input order with a score
    column added, written by ``genscore score``'s own writers, so that for one input file it holds
    the bytes ``genscore score`` writes (where the scores are equal: each batch scored as one of its
    chunks). JSON lines and CSV rows travel through Ray whole, as JSON text, not as columns whose
    types Arrow would infer, and batches reach the actors as pyarrow Tables (a ``batch_class`` gets
    them so), which keep each column's type; a ``batch_class``'s own columns are written after each
    row's.
    The actors score in parallel; the driver writes the rows as they come, in order.

    Args:
        num_blocks: Read the input as this many blocks, so that every actor gets work even from a
            single file (default: 4 per actor).
        overwrite: Replace what an existing ``output`` folder holds. Without it a folder that
            holds files is refused before anything runs: Ray would add the new files beside the
            old ones, and the folder would hold every row twice.
        Others: as for :func:`score_dataset`.

    JSON lines and CSV are read by ``genscore score``'s own row readers, in Ray's read tasks: a
    row it would list as bad (not JSON, a key given twice, a CSV quote never closed, a row of the
    wrong width, a query or document missing or not a string...) stops the job with an
    :class:`InputFileError` naming its file and line. Unlike ``genscore score`` this job is not
    resumable and stops at the first bad row; run ``genscore score`` (with ``--on-bad-row skip``)
    to find and list them all.
    """
    import ray.data

    fmt = _input_format(str(input), format)
    target = str(output)
    _check_output(target, overwrite)
    # Ray reorders blocks for speed unless told not to; the output's order is part of its contract.
    # The setting is the driver's, shared with whatever the caller runs next: put back afterwards.
    context = ray.data.DataContext.get_current()
    execution = context.execution_options
    kept_order, kept_raise = execution.preserve_order, context.raise_original_map_exception
    execution.preserve_order = True
    # A row ScoreBatches refuses (a null document in a Parquet file, a score that is not finite)
    # reaches the driver as Ray Data's "UDF failed to process a data block", the refusal left only
    # as text in a worker's traceback: kept as the error itself, it is raised as itself below.
    context.raise_original_map_exception = True
    try:
        source = str(input)
        # The read itself splits its output into blocks (streamed to the actors as they come) rather than
        # a repartition afterwards, which is an all-to-all barrier: no actor would get a row before the
        # whole input had been read and shuffled.
        blocks = num_blocks or 4 * num_actors
        columns = Columns(query_column, document_column, score_column)
        label = None
        if fmt == "parquet":
            # A Parquet file's columns have their types already: Arrow keeps them as they are.
            dataset = ray.data.read_parquet(source, override_num_blocks=blocks)
        else:
            if fmt == "csv":
                _check_csv_headers(source, (query_column, document_column))
            rows = _strict_rows(source, fmt, columns)
            dataset = ray.data.read_datasource(rows, override_num_blocks=blocks)
            label = _ROW_LABEL
        scored = score_dataset(
            dataset,
            model,
            num_actors=num_actors,
            num_gpus=num_gpus,
            batch_size=batch_size,
            query_column=query_column,
            document_column=document_column,
            score_column=score_column,
            id_column=id_column,
            batch_class=batch_class,
            warm_up=warm_up,
            row_label_column=label,
            # As Arrow, each column keeps its type (numpy made a Parquet int column with nulls floats).
            batch_format="pyarrow",
            **settings,
        )
        try:
            _write_output(scored, source, fmt, columns, target)
        except ray.exceptions.RayTaskError as error:
            # A read task's refusal (file, line, problem) or an actor's (row, column, problem) arrives
            # wrapped in Ray's error, whose message is a worker's traceback: raise it as itself.
            # Nothing else re-reads the input.
            refusal = _refusal(error)
            if refusal is None:
                raise
            # Ray Data appends its retry advice to the error's text; ``message`` is the refusal alone.
            if isinstance(refusal, InputFileError):
                raise InputFileError(refusal.message, param="input") from error
            raise type(refusal)(refusal.message, param=refusal.param, index=refusal.index) from error
    finally:
        execution.preserve_order = kept_order
        context.raise_original_map_exception = kept_raise


_ROW = "__genscore_row__"
"""The column carrying each JSON lines or CSV row whole, as JSON text, from the read to the write:
Arrow, given the rows' own columns, infers one type per column, and a key missing from some rows
came back as NaN, an ``id`` of ``1`` in a column that also holds ``"x0"`` as ``"1"``."""
_ROW_LABEL = "__genscore_line__"
"""The column naming each row by file and line, for the scoring actors' errors."""
OUTPUT_NAME = "scored"
"""The output folder's one file is ``scored.jsonl`` (``.csv``, ``.parquet``)."""


def _write_output(scored: Dataset, source: str, fmt: FileFormat, columns: Columns, target: str) -> None:
    """Write the scored rows, in order, as ``genscore score`` writes them: each batch encoded by its
    part writer, the parts joined by its merge, into the folder ``target`` (replacing what it held:
    :func:`_check_output` refused a folder holding files unless overwrite was asked for)."""
    import tempfile

    from pyarrow import fs

    filesystem, path = _filesystem(target)
    local = isinstance(filesystem, fs.LocalFileSystem)
    filesystem.create_dir(path, recursive=True)
    # Beside the output folder (one file system, so the result is moved, not copied), not in it.
    work_root = os.path.dirname(path) if local else None
    with tempfile.TemporaryDirectory(prefix=".genscore-ray-", dir=work_root) as work:
        parts: list[Path] = []
        header: Any = None
        for batch in scored.iter_batches(batch_size=None, batch_format="pyarrow"):
            rows = _output_rows(batch, columns)
            if not rows:
                continue
            if header is None:
                header = _output_header(fmt, source, rows[0], columns)
            if fmt == "csv" and list(rows[0]) != header:
                raise InputFileError(
                    f"{source}: the files' headers differ ({header[:-1]} and {list(rows[0])[:-1]}); "
                    "one output file needs one header",
                    param="input",
                )
            part = Path(work) / f"part-{len(parts):08d}{PART_SUFFIX[fmt]}"
            part.write_bytes(encode_part(fmt, rows, header))
            parts.append(part)
        filesystem.delete_dir_contents(path, missing_dir_ok=True)
        if not parts:
            return  # no rows: an empty folder, as Ray writes none
        merged = Path(work) / f"{OUTPUT_NAME}{PART_SUFFIX[fmt]}"
        merge_parts(fmt, parts, header, merged)
        destination = f"{path.rstrip('/')}/{merged.name}"
        if local:
            os.replace(merged, destination)
        else:
            fs.copy_files(str(merged), destination, destination_filesystem=filesystem)


def _output_rows(batch: pa.Table, columns: Columns) -> list[dict[str, Any]]:
    """The batch's rows as ``genscore score`` writes them: each row's own fields as it was read (a
    JSON lines or CSV row carried whole), then the columns the scoring added (the score; a
    ``batch_class``'s own)."""
    names = batch.column_names
    if _ROW not in names:  # Parquet: typed columns, read as they are
        return list(batch.to_pylist())
    import json

    added = [name for name in names if name not in {_ROW, _ROW_LABEL, columns.query, columns.document}]
    values = {name: batch.column(name).to_pylist() for name in added}
    rows = [json.loads(text) for text in batch.column(_ROW).to_pylist()]
    for position, row in enumerate(rows):
        for name in added:
            row[name] = values[name][position]
    return rows


def _output_header(fmt: FileFormat, source: str, first: dict[str, Any], columns: Columns) -> Any:
    """What ``genscore score``'s writers need besides the rows: the CSV header (the first row's
    columns, the score last), the Parquet schema (the first input file's, plus the score), or None."""
    if fmt == "csv":
        return list(first)
    if fmt == "jsonl":
        return None
    import pyarrow as pa
    from pyarrow import fs

    filesystem, path = _filesystem(source)
    if filesystem.get_file_info(path).type == fs.FileType.Directory:
        path = _folder_files(filesystem, path)[0]
    pq = import_pyarrow_parquet()
    with filesystem.open_input_file(path) as handle:
        schema = pq.ParquetFile(handle).schema_arrow
    return schema.append(pa.field(columns.score, pa.float64()))


def _input_format(source: str, given: str | None) -> FileFormat:
    """The format ``given``, or the one the extension of ``source`` (or of every file in the folder
    it names) says."""
    from pyarrow import fs

    filesystem, path = _filesystem(source)
    kind = filesystem.get_file_info(path).type
    if kind == fs.FileType.NotFound:
        # Before the format: "cannot tell the format" of a folder that is not there would mislead.
        raise InputFileError(f"{source}: no such file or folder", param="input")
    if given is not None or kind != fs.FileType.Directory:
        return detect_format(source, given, "format=")
    suffixes = {PurePath(file).suffix.lower() for file in _folder_files(filesystem, path)}
    formats = {format_of_suffix(suffix) for suffix in suffixes}
    if len(formats) != 1 or None in formats:
        raise InputFileError(
            f"{source}: cannot tell the format of a folder holding {sorted(suffixes) or 'no'} files; "
            f"pass format= (one of {', '.join(FORMATS)})",
            param="format",
        )
    return formats.pop()  # type: ignore[return-value]


def _check_output(target: str, overwrite: bool) -> None:
    from pyarrow import fs

    filesystem, path = _filesystem(target)
    kind = filesystem.get_file_info(path).type
    if kind == fs.FileType.File:
        raise JobStateError(f"{target} is a file; the output is a folder of files", param="output")
    if kind == fs.FileType.Directory and not overwrite:
        if filesystem.get_file_info(fs.FileSelector(path)):
            raise JobStateError(
                f"{target} already holds files; pass overwrite=True to replace them", param="output"
            )


def _check_csv_headers(source: str, needed: tuple[str, ...]) -> None:
    """Refuse, by file and name, a CSV file of ``source`` (a file, a folder of files or a URL) whose
    header lacks a ``needed`` column: here, from each header alone, rather than in a read task
    once the actors have loaded the model."""
    import pyarrow.csv as pacsv
    from pyarrow import fs

    filesystem, path = _filesystem(source)
    folder = filesystem.get_file_info(path).type == fs.FileType.Directory
    for file in _folder_files(filesystem, path) if folder else [path]:
        with filesystem.open_input_stream(file, compression="detect") as stream:
            header = pacsv.open_csv(stream).schema.names
        missing = [name for name in needed if name not in header]
        if missing:
            raise InputFileError(
                f"{_file_name(source, path, file)}: no {missing[0]!r} column in the header {header}",
                param=missing[0],
            )


def _refusal(error: BaseException) -> InvalidRequestError | ScoreRangeError | None:
    """The refusal a read task (:class:`InputFileError`) or a scoring actor raised, found in the chain
    of Ray's errors around it."""
    seen: BaseException | None = error
    while seen is not None:
        cause = getattr(seen, "cause", None)  # RayTaskError keeps the task's own error here
        for candidate in (seen, cause):
            if isinstance(candidate, (InvalidRequestError, ScoreRangeError)) and not isinstance(
                candidate, ray.exceptions.RayTaskError
            ):
                return candidate
        seen = cause if isinstance(cause, BaseException) else seen.__cause__
    return None


@functools.cache
def _strict_rows_datasource() -> type[Any]:
    """The class of :func:`_strict_rows` (defined on first use: Ray Data takes a second to import,
    which a Ray Serve replica has no need of)."""
    from ray.data.datasource import FileBasedDatasource

    class StrictRowsDatasource(FileBasedDatasource):  # type: ignore[misc]
        """JSON lines or CSV files read row by row by ``genscore score``'s own readers, in the read tasks.

        Ray's readers are lenient where the local job is strict: pandas keeps the last value of a key
        given twice in one JSON object, and Arrow reads everything after a CSV quote that is never
        closed into one value, so the rows there are merged into one and lost. These readers refuse
        both, and every other row ``genscore score`` would list as bad, naming the file and line, in
        the same single pass that reads the rows (no pass of its own over the input). CSV values stay
        strings. Ray reads each file in one task, so line numbers count from the file's start.
        """

        def __init__(self, source: str, fmt: FileFormat, columns: Columns) -> None:
            super().__init__(source, file_extensions=None)
            self._source = source
            self._root = _filesystem(source)[1]
            self._format = fmt
            self._columns = columns
            block_bytes = ray.data.DataContext.get_current().target_max_block_size
            self._block_bytes = block_bytes or 128 << 20

        def _read_stream(self, f: pa.NativeFile, path: str) -> Iterator[Any]:
            name = _file_name(self._source, self._root, path)
            counted = _CountedStream(f)
            buffered = io.BufferedReader(counted, buffer_size=1 << 20)
            reader: RowReader
            if self._format == "csv":
                reader = CsvReader(name, self._columns, stream=buffered)
            else:
                reader = JsonLinesReader(name, self._columns, stream=buffered)
            try:
                rows: list[InputRow] = []
                block_start = 0
                for row in reader:
                    if row.problem is not None:
                        raise InputFileError(f"{name}, line {row.number}: {row.problem}", param="input")
                    rows.append(row)
                    if counted.bytes_read - block_start >= self._block_bytes:
                        yield self._block(name, rows)
                        rows, block_start = [], counted.bytes_read
                if rows:
                    yield self._block(name, rows)
            finally:
                reader.close()

        def _block(self, name: str, rows: list[InputRow]) -> Any:
            """The rows as Ray carries them: the query and document (the actors' input), each row
            whole as JSON text (written back as it was read, whatever its keys and their types; CSV
            values stay text), and its file and line."""
            import json

            import pyarrow as pa

            return pa.table(
                {
                    self._columns.query: pa.array([row.query for row in rows], pa.string()),
                    self._columns.document: pa.array([row.document for row in rows], pa.string()),
                    _ROW: pa.array([json.dumps(row.fields) for row in rows], pa.string()),
                    _ROW_LABEL: pa.array([f"{name}, line {row.number}" for row in rows], pa.string()),
                }
            )

    return StrictRowsDatasource


class _CountedStream(io.RawIOBase):
    """A pyarrow input stream as Python's raw stream (for ``io.BufferedReader``, which gives the
    readers lines), counting the bytes read: Arrow's streams cannot say where they are."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._stream.read(len(buffer))
        buffer[: len(data)] = data
        self.bytes_read += len(data)
        return len(data)


def _strict_rows(source: str, fmt: FileFormat, columns: Columns) -> Any:
    """A Ray datasource reading the JSON lines or CSV ``source`` as ``genscore score`` reads it."""
    return _strict_rows_datasource()(source, fmt, columns)


def _file_name(source: str, path: str, file: str) -> str:
    """``file`` (a path on the file system of ``source``, at ``path``) as the caller would write it."""
    return source if file == path else f"{source.rstrip('/')}/{file[len(path) :].lstrip('/')}"


def _folder_files(filesystem: Any, path: str) -> list[str]:
    """The data files in a folder and its subfolders, as Ray reads them (no hidden or _-prefixed ones)."""
    from pyarrow import fs

    found = filesystem.get_file_info(fs.FileSelector(path, recursive=True))
    return sorted(
        info.path
        for info in found
        if info.type == fs.FileType.File and not info.base_name.startswith((".", "_"))
    )


def _filesystem(location: str) -> tuple[Any, str]:
    """The pyarrow file system holding ``location`` (a local path or a URL), and its path there."""
    from pyarrow import fs

    if "://" in location:
        return fs.FileSystem.from_uri(location)
    return fs.LocalFileSystem(), os.path.abspath(location)


# -- Ray Serve ------------------------------------------------------------------------------------------

DEFAULT_AUTOSCALING: dict[str, Any] = {
    "min_replicas": 1,
    "max_replicas": 4,
    # The app batches concurrent requests itself, so a replica is far from busy at two requests in flight.
    "target_ongoing_requests": 32,
    "upscale_delay_s": 10,
    "downscale_delay_s": 300,
}
"""Autoscaling used by :func:`serve_app` unless told otherwise (Ray Serve's ``autoscaling_config``)."""


class GenscoreServer:
    """A Ray Serve replica running ``genscore serve``'s FastAPI app around one scorer.

    The scorer loads in ``__init__``; the app is built afterwards by ``__serve_build_asgi_app__``
    (Ray Serve's late-bound ingress), so each replica serves its own model with the app's own
    endpoints, limits, errors and request batcher.

    What the replica has loaded is frozen out of garbage collection once it is initialised, as
    ``genscore serve`` does before serving, by Ray Serve itself (since 2.60, which the extra asks
    for: ``RAY_SERVE_FREEZE_GC_ON_STARTUP``, on unless set to 0); the replica does not freeze it a
    second time, so that setting keeps its effect. Its ``/stats`` ``gc`` says how many objects.
    """

    def __init__(self, config: ScorerConfig, limits: ServerLimits, served_model_name: str | None) -> None:
        self.scorer = GenerativeScorer(config=config)
        self.limits = limits
        self.served_model_name = served_model_name

    def __serve_build_asgi_app__(self) -> Any:
        from genscore_core.server.app import create_app

        return create_app(self.scorer, self.limits, served_model_name=self.served_model_name)


def serve_app(
    model: str | None = None,
    *,
    limits: ServerLimits | None = None,
    served_model_name: str | None = None,
    num_gpus: float = 1.0,
    num_cpus: float = 1.0,
    autoscaling_config: dict[str, Any] | None = None,
    num_replicas: int | None = None,
    max_ongoing_requests: int = 256,
    name: str = "genscore",
    check_model: bool = True,
    **settings: Any,
) -> Application:
    """A Ray Serve application serving ``model`` as ``genscore serve`` does; pass it to ``serve.run``.

    Args:
        model: Hub id or local folder of the reranker.
        limits: The app's request limits and batching (``genscore serve``'s ``--max-items``,
            ``--batch-max-tokens``...).
        served_model_name: Model name in responses; default ``model``.
        num_gpus: GPUs per replica: 1 puts one replica on each GPU (0 serves on CPUs).
        num_cpus: CPUs reserved per replica.
        autoscaling_config: Ray Serve autoscaling (:data:`DEFAULT_AUTOSCALING` unless given or
            ``num_replicas`` is set).
        num_replicas: A fixed replica count instead of autoscaling (not with ``autoscaling_config``).
        max_ongoing_requests: Requests a replica takes at once. Keep it well above one: the app's
            batcher can only merge requests that reach the replica together.
        name: The deployment's name.
        check_model: Check here, before anything is deployed, that a ``model`` naming a local folder
            exists and holds a model and its tokenizer. A replica that fails to load it fails the
            deployment, and Ray Serve then reports only "Deploying application ... failed", not
            the cause. Pass False where the folder exists only on the cluster's nodes.
        **settings: :class:`~genscore_core.ScorerConfig` fields (``dtype``, ``max_length``...).
    """
    from ray import serve

    config = ScorerConfig(model=model or DEFAULT_MODEL, **settings)
    if check_model:
        check_model_source(config.model)
        check_tokenizer_files(config.model)
    options: dict[str, Any] = {
        "name": name,
        "ray_actor_options": {"num_gpus": num_gpus, "num_cpus": num_cpus},
        "max_ongoing_requests": max_ongoing_requests,
    }
    if num_replicas is not None:
        if autoscaling_config is not None:
            # Serve would scale by one and ignore the other; which one the caller meant is theirs to say.
            raise ConfigurationError(
                "serve_app takes num_replicas (a fixed count) or autoscaling_config, not both",
                setting="num_replicas",
            )
        options["num_replicas"] = num_replicas
    else:
        options["autoscaling_config"] = autoscaling_config or DEFAULT_AUTOSCALING
    ingress = serve.ingress()(GenscoreServer)
    deployment = serve.deployment(**options)(ingress)
    return deployment.bind(config, limits or ServerLimits(), served_model_name)
