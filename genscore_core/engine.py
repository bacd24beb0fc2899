"""The scoring engine: token-id prompts in, label probabilities out.

The engine knows nothing of templates or protocols. It takes *jobs* (the prompts of one request with
their label ids), finds the prefix each job's prompts share, runs one prefill-only forward over all
of them and applies the label head per job. Several jobs can be scored in one call, so a server can
batch concurrent requests together.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from genscore_core.backend import ProgressCallback, ScoringBackend, ScoringJob
from genscore_core.config import ScorerConfig
from genscore_core.forward import ForwardStrategy, PaddedForward, PrefixGroup
from genscore_core.scoring import LabelHead, check_scores

logger = logging.getLogger(__name__)

__all__ = ["ScoringEngine", "ScoringJob", "group_prompts", "select_forward", "shared_prefix_length"]


def shared_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the longest common prefix, leaving at least one token of every prompt unshared."""
    if not prompts:
        return 0
    first = list(prompts[0])
    length = max(min(len(p) for p in prompts) - 1, 0)
    for prompt in prompts:
        # Slices compare in C; only a mismatch is searched token by token, up to the shorter length.
        if list(prompt[:length]) != first[:length]:
            length = next(i for i in range(length) if prompt[i] != first[i])
    return length


def group_prompts(prompts: Sequence[list[int]]) -> PrefixGroup:
    shared = shared_prefix_length(prompts)
    return PrefixGroup(list(prompts[0][:shared]) if prompts else [], [p[shared:] for p in prompts])


def select_forward(model: Any, config: ScorerConfig, pad_token_id: int) -> ForwardStrategy:
    """Pick the forward that runs prompts through the model (the one place that decides it).

    ``"auto"`` and ``"packed"`` use the packed forward where the architecture supports it (on the
    CPU too: it measured 2.2x the padded forward there, docs/benchmarks.md); ``"padded"``, or an
    unsupported model, gets the padded forward of the model's own code. Packed batches hold no
    padding, so unless ``max_batch_tokens`` was set they take the packed forward's own, larger default
    (measured on W1, docs/benchmarks.md). The budget means the same in both: token positions one batch
    runs through the model (:class:`~genscore_core.forward.ForwardStrategy`).
    """
    if config.forward != "padded":
        from genscore_core.packed import DEFAULT_MAX_BATCH_TOKENS, PackedForward, unsupported_reason

        reason = unsupported_reason(model)
        if reason is None:
            budget = config.max_batch_tokens
            if "max_batch_tokens" not in config.model_fields_set:
                budget = DEFAULT_MAX_BATCH_TOKENS
            return PackedForward(model, max_batch_tokens=budget)
        if config.forward == "packed":
            logger.warning("forward='packed' unavailable (%s); using the padded forward", reason)
    return PaddedForward(
        model,
        pad_token_id=pad_token_id,
        max_batch_tokens=config.max_batch_tokens,
        max_batch_size=config.max_batch_size,
    )


class ScoringEngine(ScoringBackend):
    """Scores token-id prompts with one loaded model; safe to call from several threads.

    The local implementation of the backend contract: :meth:`ascore_jobs` runs :meth:`score_jobs`
    on a worker thread.
    """

    def __init__(self, model: Any, forward: ForwardStrategy, head: LabelHead) -> None:
        self.model = model
        """The causal LM whose forward and head these are."""
        self.forward = forward
        self.head = head
        # One forward at a time: concurrent forwards on one device only compete for it, and
        # serialising keeps memory use bounded.
        self._lock = threading.Lock()

    def score_jobs(
        self, jobs: Sequence[ScoringJob], on_progress: ProgressCallback | None = None
    ) -> list[list[float]]:
        """Scores of every prompt of every job, in job order then prompt order.

        A prompt repeated within a job (the same chunk found by two retrievers) is computed once, so
        duplicates get the very same score and stay tied whatever batch layout the forward picks.
        """
        active = [job for job in jobs if job.prompts]
        distinct = [distinct_prompts(job.prompts) for job in active]
        groups = [group_prompts(prompts) for prompts, _ in distinct]
        scores: dict[int, list[float]] = {}
        if groups:
            # Inference mode is the forward's (ForwardStrategy); the head reads detached weights.
            with self._lock:
                hidden = self.forward.last_hidden_states(groups, on_progress)  # [N distinct, H]
                offset = 0
                for job, (prompts, where) in zip(active, distinct):
                    rows = hidden[offset : offset + len(prompts)]
                    offset += len(prompts)
                    job_scores = self.head.scores(rows, job.label_ids, job.mode)
                    check_scores(job_scores, job.mode)
                    values = job_scores.double().cpu().tolist()
                    scores[id(job)] = [values[i] for i in where]
                    if on_progress is not None and len(prompts) < len(job.prompts):
                        on_progress(len(job.prompts) - len(prompts))
        return [scores.get(id(job), []) for job in jobs]

    @classmethod
    def for_model(cls, model: Any, config: ScorerConfig, *, pad_token_id: int) -> ScoringEngine:
        """The engine of a loaded causal LM, with the forward ``config`` selects."""
        return cls(model, select_forward(model, config, pad_token_id), LabelHead(model))

    def __repr__(self) -> str:
        return (
            f"ScoringEngine(forward={type(self.forward).__name__}, device={self.model.device}, "
            f"dtype={self.model.dtype})"
        )


def distinct_prompts(prompts: Sequence[list[int]]) -> tuple[list[list[int]], list[int]]:
    """The distinct prompts in first-seen order, and for each input prompt the index of its copy."""
    distinct: list[list[int]] = []
    where: list[int] = []
    # A cheap key (length and three sampled tokens) tells most prompts apart; a whole prompt is
    # hashed only when its cheap key was seen before (a 256-document request is then ~10x faster).
    by_sample: dict[tuple[int, ...], int | None] = {}
    by_tokens: dict[tuple[int, ...], int] = {}
    for prompt in prompts:
        n = len(prompt)
        sample = (n, prompt[n // 3], prompt[n // 2], prompt[2 * n // 3]) if n else (0,)
        if sample not in by_sample:
            by_sample[sample] = len(distinct)
            where.append(len(distinct))
            distinct.append(prompt)
            continue
        earlier = by_sample[sample]
        if earlier is not None:  # the first collision on this sample: index the earlier prompt fully
            by_tokens[tuple(distinct[earlier])] = earlier
            by_sample[sample] = None
        key = tuple(prompt)
        if key not in by_tokens:
            by_tokens[key] = len(distinct)
            distinct.append(prompt)
        where.append(by_tokens[key])
    return distinct, where
