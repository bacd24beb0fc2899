"""The scoring engine: token-id prompts in, label probabilities out.

The engine knows nothing of templates or protocols. It takes *jobs* (the prompts of one request with
their label ids), finds the prefix each job's prompts share, runs one prefill-only forward over all
of them and applies the label head per job. Several jobs can be scored in one call, so a server can
batch concurrent requests together.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from genscore_core.backend import (
    JobPart,
    LaunchAhead,
    ProgressCallback,
    ScoringBackend,
    ScoringJob,
    StreamedJob,
    StreamLayout,
    check_all_taken,
    check_part,
    gathered,
    streamed,
)
from genscore_core.batching import is_out_of_memory
from genscore_core.config import LocalSettings
from genscore_core.errors import ConfigurationError
from genscore_core.forward import ForwardStrategy, PaddedForward, StreamingForward
from genscore_core.prefixes import PrefixGroup, distinct_prompts, group_prompts, share_template
from genscore_core.scoring import LabelHead, check_scores, score_range
from genscore_core.streaming import (
    FIRST_BATCH_TOKENS,
    BatchPlanner,
    Prefetcher,
    RowKey,
    RowReduction,
    StreamState,
    TakenParts,
    plan_stream,
)
from genscore_core.templates import ScoreMode
from genscore_core.weights_seen import WeightsSeen

logger = logging.getLogger(__name__)

__all__ = ["LaunchedCall", "PreparedJobs", "ScoringEngine", "select_forward"]


def select_forward(model: Any, config: LocalSettings, pad_token_id: int) -> ForwardStrategy:
    """Pick the forward that runs prompts through the model (the one place that decides it).

    ``"auto"`` and ``"packed"`` use the packed forward where the architecture supports it (on the
    CPU too: 2.2x the padded forward there, docs/benchmarks.md, "Packed forward"); ``"padded"``, or an
    unsupported model, gets the padded forward of the model's own code. Packed batches hold no
    padding, so unless ``max_batch_tokens`` was set they take the packed forward's own, larger default
    (measured on W1, docs/benchmarks.md, "Packed forward"). The budget means the same in both: token positions one batch
    runs through the model (:class:`~genscore_core.forward.ForwardStrategy`).
    """
    if config.forward != "padded":
        from genscore_core.packed import DEFAULT_MAX_BATCH_TOKENS, PackedForward, unsupported_reason

        reason = unsupported_reason(model)
        if reason is None:
            budget = config.max_batch_tokens
            if "max_batch_tokens" not in config.model_fields_set:
                budget = DEFAULT_MAX_BATCH_TOKENS
            if config.quantization is not None:
                return _quantized_forward(model, config, budget)
            return PackedForward(model, max_batch_tokens=budget, cuda_graphs=config.cuda_graphs)
        if config.quantization is not None:
            raise ConfigurationError(
                f"quantization={config.quantization!r} needs the packed forward, which cannot run this "
                f"model ({reason}); leave quantization unset",
                setting="quantization",
            )
        if config.forward == "packed":
            logger.warning("forward='packed' unavailable (%s); using the padded forward", reason)
    if config.quantization is not None:
        raise ConfigurationError(
            f"quantization={config.quantization!r} runs in the packed forward; leave forward='padded' "
            "out, or quantization unset",
            setting="quantization",
        )
    return PaddedForward(
        model,
        pad_token_id=pad_token_id,
        max_batch_tokens=config.max_batch_tokens,
        max_batch_size=config.max_batch_size,
    )


def _quantized_forward(model: Any, config: LocalSettings, budget: int) -> ForwardStrategy:
    """The packed forward with FP8 products (:mod:`genscore_core.packed.fp8`), where they can run."""
    from genscore_core.packed import PackedForward, PackedOptions, fp8

    model_config = model.config
    heads = int(model_config.num_attention_heads)
    head_dim = int(getattr(model_config, "head_dim", None) or model_config.hidden_size // heads)
    kv_heads = int(getattr(model_config, "num_key_value_heads", None) or heads)
    sizes = {
        "hidden_size": int(model_config.hidden_size),
        "intermediate_size": int(model_config.intermediate_size),
        "query width": heads * head_dim,
        "key/value width": kv_heads * head_dim,
    }
    weight = model.get_input_embeddings().weight
    fp8.check_supported(weight.device, weight.dtype, sizes)
    return PackedForward(
        model,
        max_batch_tokens=budget,
        options=PackedOptions(quantization="fp8"),
        cuda_graphs=config.cuda_graphs,
    )


class ScoringEngine(ScoringBackend, LaunchAhead):
    """Scores token-id prompts with one loaded model; safe to call from several threads.

    The local implementation of the backend contract, every door of it: :meth:`score_jobs` (and
    :meth:`ascore_jobs` on a worker thread), :meth:`score_stream` (streamed where the forward
    streams: :attr:`streams`), :attr:`local_model`, and the :class:`~genscore_core.backend.LaunchAhead`
    capability (:meth:`prepare_jobs`, :meth:`launch_prepared`, :meth:`collect_launched`). Besides
    them: :meth:`warm_up`; :meth:`follow_model` (which every call runs first) and :meth:`vocab_rows`
    (the front end's bound on token ids).
    """

    def __init__(self, model: Any, forward: ForwardStrategy, head: LabelHead) -> None:
        self.model = model
        """The causal LM whose forward and head these are."""
        self.forward = forward
        self.head = head
        self._seen = WeightsSeen(model)
        # One forward at a time: concurrent forwards on one device only compete for it, and
        # serialising keeps memory use bounded.
        self._lock = threading.Lock()

    def follow_model(self) -> bool:
        """Build the forward and the head again if the model was moved, cast or given other
        parameters since they were built (``model.to("cuda")``, ``.half()``,
        ``load_state_dict(..., assign=True)``; :mod:`genscore_core.weights_seen`). True when they were.

        Every call does this first (a check of a few parameters, microseconds), so the engine scores
        with the model as it is at the call. Moving the model while a call runs is not supported.
        """
        with self._lock:
            return self._follow_model()

    def vocab_rows(self) -> int:
        """Token ids the model reads and scores as it is now: the rows of its input embeddings and of
        its LM head, whichever are fewer. Read off the model at each call (microseconds), since
        ``resize_token_embeddings`` after the build changes them; the front end checks every
        prompt and label id against it, so that no id reaches an embedding lookup out of range."""
        model = self.model
        head = model.get_output_embeddings()  # None for a sequence classifier: its inputs bound the ids
        rows = [int(head.weight.shape[0])] if head is not None else []
        try:
            rows.append(int(model.get_input_embeddings().weight.shape[0]))
        except (AttributeError, NotImplementedError):
            pass  # no accessor: the head's rows stand for both, as they do in every decoder we run
        return min(rows)

    def _follow_model(self) -> bool:
        """:meth:`follow_model`, the caller holding the lock."""
        if self._seen.current():
            return False
        logger.info(
            "the model's parameters changed since its %s and head were built (moved, cast or "
            "reloaded): building them again",
            type(self.forward).__name__,
        )
        self.forward.rebuild()
        self.head.rebuild()
        self._seen = WeightsSeen(self.model)
        return True

    @property
    def local_model(self) -> Any:
        """:attr:`model`: the engine runs it in this process."""
        return self.model

    @property
    def streams(self) -> bool:
        """Whether the forward runs batches as a producer lays them out (:meth:`score_stream`)."""
        return isinstance(self.forward, StreamingForward)

    def score_jobs(
        self, jobs: Sequence[ScoringJob], on_progress: ProgressCallback | None = None
    ) -> list[list[float]]:
        """Scores of every prompt of every job, in job order then prompt order.

        A prompt repeated within a job (the same chunk found by two retrievers) is computed once, so
        duplicates get the very same score and stay tied whatever batch layout the forward picks.
        Token ids need only their batch layout, which the forward does between batches: streaming
        them (:meth:`score_stream`) measured 4% slower on W1, so they are not (docs/benchmarks.md, "Streaming text calls").
        """
        return self._score_whole(jobs, on_progress)

    def warm_up(self, prompt_tokens: int) -> None:
        """Score made-up prompts of ``prompt_tokens`` tokens the way a large text call scores real
        ones, and drop the scores: each batch size such a call runs is run once.

        The prompts share a prefix, as a query's documents do, and are as many as a streamed call of
        the forward's budget lays out in batches (the first small, each later one twice as large).
        What this warms is the process's (compiled kernels found and loaded, cuBLAS set up, the
        allocator's first blocks), so a throwaway engine warms any engine built afterwards.
        """
        length = max(2, prompt_tokens)
        budget = self.forward.max_batch_tokens
        target, total = min(FIRST_BATCH_TOKENS, budget), 0
        while target < budget:
            total += target
            target *= 2
        total += budget
        count = max(2, total // length)
        generator = np.random.default_rng(0)
        vocab = self.vocab_rows()
        shared = generator.integers(0, vocab, length // 4).tolist()
        prompts = [shared + generator.integers(0, vocab, length - len(shared)).tolist() for _ in range(count)]
        self.score_stream(*streamed([ScoringJob(prompts, [0, 1])]))

    def score_stream(
        self,
        jobs: Sequence[StreamedJob],
        parts: Iterable[JobPart],
        on_progress: ProgressCallback | None = None,
        *,
        layout: StreamLayout | None = None,
    ) -> list[list[float]]:
        """:meth:`score_jobs` with the prompts handed over in parts as they are made (tokenized).

        Where the forward streams, ``parts`` is consumed on a producer thread that lays out batch
        k+1 while the GPU runs batch k; the parts of each job come in prompt order and hold its
        ``size`` prompts, no more, no fewer (else ``ValueError`` naming the job). An exception raised
        by ``parts`` reaches the caller, after the batches before it ran, even one that reads like
        running out of memory: only the forward's out-of-memory error scores the call again in
        smaller batches. Scores equal :meth:`score_jobs` on the whole jobs.

        By default the first batch holds up to :data:`~genscore_core.streaming.FIRST_BATCH_TOKENS`
        tokens and leaves at the end of the first part even short of them (the GPU starts while
        later parts are tokenized), each later one twice its predecessor's target, within the
        forward's budget. ``layout.batch_tokens`` fills every batch to that many tokens instead, so
        that their shapes repeat from call to call and replay CUDA graphs (not faster so far:
        docs/benchmarks.md, "Server batching"). A forward that does not stream gathers the parts and scores the whole jobs.
        """
        layout = layout or StreamLayout()
        if layout.batch_tokens is not None and layout.batch_tokens <= 0:
            raise ValueError(f"batch_tokens must be positive, got {layout.batch_tokens}")
        items = TakenParts(parts)
        sizes = [job.size for job in jobs]
        forward = self.forward
        if not isinstance(forward, StreamingForward):
            return self._score_whole(gathered(jobs, items), on_progress)
        if layout.batch_tokens is None:
            planner = BatchPlanner(forward.max_batch_tokens)
        else:
            planner = BatchPlanner(forward.max_batch_tokens, layout.batch_tokens, 1.0)
        first_batch_early = layout.batch_tokens is None
        state = StreamState()
        reported = _ReportedProgress(on_progress) if on_progress is not None else None
        with self._lock:
            self._follow_model()  # before the producer lays batches out for the forward's device
            try:
                planned = plan_stream(sizes, items, planner, state, first_batch_early=first_batch_early)
                with Prefetcher(planned, forward.prepare_stream_batch) as batches:
                    row_scores, keys = forward.run_stream(batches, reported, self._batch_scorer(jobs))
                rows: list[list[int]] = [[0] * len(p.distinct) for p in state.jobs]
                for row, key in enumerate(keys):
                    rows[key.job][key.prompt] = row
            except (torch.OutOfMemoryError, RuntimeError) as error:
                # An error of the parts is the caller's, whatever it says: never scored again.
                if error is items.error or not is_out_of_memory(error):
                    raise
                if items.error is not None:
                    # The parts failed while the producer was being stopped after the forward ran
                    # out of memory: scoring again would go on without the prompts they lacked.
                    raise items.error  # noqa: B904 - the out-of-memory error stays its context, not its cause
                del error
                hidden, rows = self._score_again(state, sizes, items, reported)
                # Rows come job after job, each job's distinct prompts in order.
                again = [RowKey(j, p) for j, job_rows in enumerate(rows) for p in range(len(job_rows))]
                row_scores = self._batch_scorer(jobs)(hidden, again)
            job_scores = self._stream_scores(
                row_scores, jobs, rows, [recorded.where for recorded in state.jobs]
            )
            scores: list[list[float]] = []
            for job, recorded, values in zip(jobs, state.jobs, job_scores):
                scores.append([values[i] for i in recorded.where])
                if on_progress is not None and len(recorded.distinct) < job.size:
                    on_progress(job.size - len(recorded.distinct))
        return scores

    def _batch_scorer(self, jobs: Sequence[StreamedJob]) -> RowReduction:
        """Scores of a streamed batch's rows from its hidden states, so that the call keeps one
        number a row on the device instead of a hidden state (4 KB a row at hidden size 1,024)."""
        head = self.head

        def scores(hidden: torch.Tensor, keys: list[RowKey]) -> torch.Tensor:
            kinds: dict[tuple[tuple[int, ...], ScoreMode, float], list[int]] = {}
            for row, key in enumerate(keys):
                kinds.setdefault(_head_kind(jobs[key.job]), []).append(row)
            if len(kinds) == 1:
                [(label_ids, mode, temperature)] = kinds
                return head.scores(hidden, list(label_ids), mode, temperature)
            out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
            for (label_ids, mode, temperature), kind_rows in kinds.items():
                index = torch.tensor(kind_rows, device=hidden.device)
                rows = hidden.index_select(0, index)
                out[index] = head.scores(rows, list(label_ids), mode, temperature).float()
            return out

        return scores

    def _stream_scores(
        self,
        row_scores: torch.Tensor,
        jobs: Sequence[StreamedJob],
        rows: list[list[int]],
        where: Sequence[Sequence[int]],
    ) -> list[list[float]]:
        """The scores of each job's distinct prompts, whose scores are rows ``rows[j]`` of
        ``row_scores``; ``where[j][p]`` is the distinct prompt that prompt ``p`` of job ``j`` is (for errors).

        The host waits for the device once: the row indices go over in one copy that is queued
        behind the forward (a copy from pageable memory would first wait for the last batch), and
        all the scores come back in one copy, checked on the host.
        """
        active = [j for j, job_rows in enumerate(rows) if job_rows]
        if not active:
            return [[] for _ in jobs]
        flat = torch.tensor([row for j in active for row in rows[j]], dtype=torch.int64)
        if row_scores.device.type == "cuda":
            flat = flat.pin_memory()
        host = row_scores.index_select(0, flat.to(row_scores.device, non_blocking=True)).cpu()
        _check_rows(host, [(jobs[j].mode, len(rows[j]), j, where[j]) for j in active])
        every = host.double().tolist()
        scores: list[list[float]] = [[] for _ in jobs]
        offset = 0
        for j in active:
            scores[j] = every[offset : offset + len(rows[j])]
            offset += len(rows[j])
        return scores

    def _score_again(
        self,
        state: StreamState,
        sizes: Sequence[int],
        items: Iterable[JobPart],
        reported: _ReportedProgress | None,
    ) -> tuple[torch.Tensor, list[list[int]]]:
        """After an out-of-memory error mid-stream: every distinct prompt through the forward's own
        policy (it splits batches and lowers the budget). The producer has stopped; the parts it
        did not take are taken here. Progress goes on from what the stream reported, so each prompt
        is counted once and a cancelled call still stops at its next batch."""
        logger.warning("out of memory while streaming batches; scoring the call again in smaller batches")
        taken = [len(job.where) for job in state.jobs]
        for part in items:
            check_part(sizes, taken, part)
            taken[part.job] += len(part.prompts)
            recorded = state.jobs[part.job]
            for prompt in part.prompts:
                recorded.add(np.asarray(prompt, dtype=np.int32))
        check_all_taken(sizes, taken)
        groups = [group_prompts([p.tolist() for p in job.distinct]) for job in state.jobs if job.distinct]
        hidden = self.forward.last_hidden_states(groups, reported.again() if reported else None)
        rows: list[list[int]] = []
        offset = 0
        for job in state.jobs:
            rows.append(list(range(offset, offset + len(job.distinct))))
            offset += len(job.distinct)
        return hidden, rows

    def _score_whole(
        self, jobs: Sequence[ScoringJob], on_progress: ProgressCallback | None = None
    ) -> list[list[float]]:
        """Every prompt at once through ``forward.last_hidden_states`` (forwards that do not stream)."""
        with self._lock:
            return self._collect(self._launch(jobs, on_progress), on_progress)

    def prepare_jobs(self, jobs: Sequence[ScoringJob], *, lay_out: bool = True) -> PreparedJobs:
        """The host work of scoring ``jobs`` (:class:`~genscore_core.backend.LaunchAhead`), done now: distinct prompts,
        prefix groups and, with ``lay_out``, the forward's batches planned and laid out
        (:meth:`~genscore_core.forward.ForwardStrategy.prepare`). Without it the forward lays each
        batch out when it runs, while the device runs the batch before (the way :meth:`score_jobs` goes).

        Touches no device state and takes no lock, so a server lays out its next call on another
        thread while this one's GPU work runs.
        """
        prepared = self._group(jobs)
        if lay_out and prepared.groups:
            prepared.batches = self.forward.prepare(prepared.groups)
        return prepared

    def launch_prepared(
        self, prepared: PreparedJobs, on_progress: ProgressCallback | None = None
    ) -> LaunchedCall:
        """Queue the work of a call :meth:`prepare_jobs` laid out on the device, and return.

        Under the engine's lock: every kernel of the forward and the head, then one device-to-host
        copy of all the call's scores into page-locked memory (``non_blocking``) and a CUDA event
        behind it. Nothing waits for the device, so the caller's thread can launch the next call
        right away, behind this one on the same stream, while another thread waits for this one's
        scores (:meth:`collect_launched`): the device goes from one call to the next without idling.

        Memory: the call's activations (hidden states, the batches' device buffers) are released to
        the caching allocator when this returns, before the device has run them. That is safe on one
        stream: the allocator hands a released block only to work queued later on the same stream,
        which the device runs after the kernels that still read it. What the call keeps is the
        page-locked scores (the copy's destination, alive in the returned call until collected).
        On the CPU the forward has run by the time this returns and the "event" is None.
        """
        with self._lock:
            launched = self._launch_grouped(prepared, on_progress)
            return LaunchedCall.queue(launched)

    def collect_launched(
        self, call: LaunchedCall, on_progress: ProgressCallback | None = None
    ) -> list[list[float]]:
        """The scores of a call :meth:`launch_prepared` queued: wait for them, check them on the
        host and map them to the jobs (duplicates included); equal to :meth:`score_jobs`'s. Takes no lock: it touches only the
        call's page-locked copy, so it may run on another thread while the next call launches.
        Raises :class:`~genscore_core.errors.ScoreRangeError` for a bad score, as scoring does."""
        if call.event is not None:
            call.event.synchronize()  # releases the interpreter lock while it waits
        scores: dict[int, list[float]] = {}
        numbers: dict[int, int] = {}
        for number, listed in enumerate(call.jobs):
            numbers.setdefault(id(listed), number)
        if call.host is not None:  # rows exist only where scores were copied
            _check_rows(
                call.host, [(job.mode, count, numbers[id(job)], where) for job, count, where, _ in call.rows]
            )
            every = call.host.double().tolist()
        offset = 0
        for job, count, where, distinct in call.rows:
            values = every[offset : offset + count]
            offset += count
            scores[id(job)] = [values[i] for i in where]
            if on_progress is not None and distinct < len(job.prompts):
                on_progress(len(job.prompts) - distinct)
        return [scores.get(id(job), []) for job in call.jobs]

    def _launch(self, jobs: Sequence[ScoringJob], on_progress: ProgressCallback | None) -> _Launched:
        """Queue the forward and head of ``jobs`` on the device (caller holds the lock); nothing here
        waits for the device."""
        return self._launch_grouped(self._group(jobs), on_progress)

    @staticmethod
    def _group(jobs: Sequence[ScoringJob]) -> PreparedJobs:
        active = [job for job in jobs if job.prompts]
        distinct = [distinct_prompts(job.prompts) for job in active]
        groups, rows = share_template([group_prompts(prompts) for prompts, _ in distinct])
        return PreparedJobs(jobs, active, distinct, groups, rows=rows)

    def _launch_grouped(self, prepared: PreparedJobs, on_progress: ProgressCallback | None) -> _Launched:
        launched = _Launched(prepared.jobs)
        groups = prepared.groups
        if not groups:
            return launched
        self._follow_model()
        # Inference mode is the forward's (ForwardStrategy); the head reads detached weights.
        if prepared.batches is None:
            hidden = self.forward.last_hidden_states(groups, on_progress)  # [N distinct, H]
        else:
            hidden = self.forward.last_hidden_states(groups, on_progress, prepared=prepared.batches)
        if prepared.rows is not None:  # groups that share the template's head ran together: job order again
            hidden = hidden.index_select(0, torch.tensor(prepared.rows, device=hidden.device))
        # One head call for each run of jobs read the same way (all of a call's, as a rule): a call
        # a job cost ~0.3 ms of launches and copies each, 1,024 jobs of distinct queries ~0.3 s.
        offset = 0
        for run in _runs_of_one_kind(prepared.active):
            counts = [len(prepared.distinct[j][0]) for j in run]
            first = prepared.active[run[0]]
            rows = hidden[offset : offset + sum(counts)]
            offset += sum(counts)
            run_scores = self.head.scores(rows, first.label_ids, first.mode, first.logit_temperature)
            for j, count, job_scores in zip(run, counts, run_scores.split(counts)):
                launched.scores.append((prepared.active[j], job_scores, prepared.distinct[j][1], count))
        return launched

    def _collect(self, launched: _Launched, on_progress: ProgressCallback | None) -> list[list[float]]:
        """The scores of launched jobs (waits for the device once: every job's scores come back in
        one copy and are checked on the host; two waits a job cost a loaded server ~5 ms a call)."""
        return self.collect_launched(LaunchedCall.queue(launched), on_progress)

    @classmethod
    def for_model(cls, model: Any, config: LocalSettings, *, pad_token_id: int) -> ScoringEngine:
        """The engine of a loaded causal LM, with the forward ``config`` selects (and, for a model on
        the CPU, torch's threads as ``config.cpu_threads`` says: :mod:`genscore_core.cpu_threads`)."""
        if model.device.type == "cpu":
            from genscore_core.cpu_threads import apply_cpu_threads

            apply_cpu_threads(config.cpu_threads)
        return cls(model, select_forward(model, config, pad_token_id), LabelHead(model))

    def __repr__(self) -> str:
        return (
            f"ScoringEngine(forward={type(self.forward).__name__}, device={self.model.device}, "
            f"dtype={self.model.dtype})"
        )


@dataclass
class PreparedJobs:
    """Jobs with their host work done (:meth:`ScoringEngine.prepare_jobs`), ready to launch."""

    jobs: Sequence[ScoringJob]
    active: list[ScoringJob]
    """The jobs with prompts."""
    distinct: list[tuple[list[list[int]], list[int]]]
    """Per active job: its distinct prompts, and for each prompt the index of its copy."""
    groups: list[PrefixGroup]
    """The distinct prompts as shared prefixes and suffixes: a group per active job, or, where jobs
    of one or two prompts share the template's head, those jobs' prompts in one group at the end
    (:func:`~genscore_core.prefixes.share_template`)."""
    batches: object | None = None
    """The forward's batches laid out ahead (:meth:`ForwardStrategy.prepare`), or None."""
    rows: list[int] | None = None
    """Where the forward's row of each distinct prompt is (job by job), when :attr:`groups` is not
    one group a job; None when it is."""


@dataclass
class _Launched:
    """Jobs whose scores are queued on the device: (job, scores tensor, where, distinct prompts)."""

    jobs: Sequence[ScoringJob]
    scores: list[tuple[ScoringJob, torch.Tensor, list[int], int]] = field(default_factory=list)


def _check_rows(host: torch.Tensor, jobs: Sequence[tuple[ScoreMode, int, int, Sequence[int]]]) -> None:
    """:func:`~genscore_core.scoring.check_scores` of each job's rows of ``host`` (its scores, job
    after job: (mode, rows, job number, where)), at once where every mode allows the same range:
    thousands of one-prompt jobs then cost one check, not one each. A bad score is named by its job."""
    if len({score_range(mode) for mode, _, _, _ in jobs}) == 1:
        low, high = score_range(jobs[0][0])
        if bool((torch.isfinite(host) & (host >= low) & (host <= high)).all()):
            return
    offset = 0
    for mode, count, number, where in jobs:
        check_scores(host[offset : offset + count], mode, job=number, where=where)
        offset += count


def _head_kind(job: ScoringJob | StreamedJob) -> tuple[tuple[int, ...], ScoreMode, float]:
    """What the head reads a job's scores by: jobs of one kind are scored in one head call."""
    return tuple(job.label_ids), job.mode, job.logit_temperature


def _runs_of_one_kind(jobs: Sequence[ScoringJob]) -> list[list[int]]:
    """Indices of ``jobs`` in runs of consecutive jobs whose scores the head reads the same way
    (label ids, score mode, temperature)."""
    runs: list[list[int]] = []
    last: tuple[tuple[int, ...], ScoreMode, float] | None = None
    for index, job in enumerate(jobs):
        kind = _head_kind(job)
        if kind != last:
            runs.append([])
            last = kind
        runs[-1].append(index)
    return runs


_JobRows = tuple[ScoringJob, int, list[int], int]
"""A launched job's place in its call's scores: (job, its rows, where each prompt's copy is, distinct
prompts)."""


@dataclass
class LaunchedCall:
    """A call whose work is queued on the device (:meth:`ScoringEngine.launch_prepared`); its
    scores are on their way to ``host``, complete once ``event`` has passed."""

    jobs: Sequence[ScoringJob]
    rows: list[_JobRows]
    """The jobs with prompts, in the order of their scores in ``host``."""
    host: torch.Tensor | None
    """Every job's scores, concatenated; page-locked on a GPU. None when no job had prompts."""
    event: Any = None
    """The CUDA event recorded behind the copy; None on the CPU (the copy is done)."""

    @classmethod
    def queue(cls, launched: _Launched) -> LaunchedCall:
        """Queue the copy of ``launched``'s scores to the host and the event behind it; the device
        tensors are dropped (only the copy reads them, queued before anything that reuses them)."""
        rows = [
            (job, int(scores.shape[0]), where, distinct) for job, scores, where, distinct in launched.scores
        ]
        if not launched.scores:
            return cls(launched.jobs, rows, None)
        device = torch.cat([job_scores for _, job_scores, _, _ in launched.scores])
        if device.device.type != "cuda":
            return cls(launched.jobs, rows, device.cpu())
        host = torch.empty(device.shape, dtype=device.dtype, pin_memory=True)
        host.copy_(device, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device.device))
        return cls(launched.jobs, rows, host, event)


class _ReportedProgress:
    """A streamed call's progress callback that counts the prompts it passed on: after an
    out-of-memory error the call's prompts are scored again (:meth:`again`), and those already
    reported are not reported twice."""

    def __init__(self, on_progress: ProgressCallback) -> None:
        self._on_progress = on_progress
        self.count = 0

    def __call__(self, done: int) -> None:
        self.count += done
        self._on_progress(done)

    def again(self) -> ProgressCallback:
        """The callback of the call scored again: its first ``count`` prompts were reported already."""
        skip = self.count

        def progress(done: int) -> None:
            nonlocal skip
            fresh = max(done - skip, 0)
            skip = max(skip - done, 0)
            # Called with 0 too: a cancelled call (backend.in_worker_thread) stops at its next batch.
            self._on_progress(fresh)

        return progress
