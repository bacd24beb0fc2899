"""The scoring head: label-token probabilities from last-position hidden states.

Label-normalised scores need only the label rows of the LM head: with two labels the score is
sigmoid(h . (w0 - w1)), exactly softmax([l0, l1])[0], and K labels need K rows; so do the logit
modes. Only the full-vocabulary probability needs the whole head, and that goes through the label
log-prob kernel, which never holds a [batch, vocabulary] tensor.

Gemma 2 caps its logits (``final_logit_softcapping``: logit -> cap * tanh(logit / cap)). The label
logits are capped the same way; the full-vocabulary normaliser then needs every capped logit, which
the kernel does not compute, so that mode walks the vocabulary in chunks in torch instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from genscore_core.errors import InvalidRequestError, ScoreRangeError
from genscore_core.kernels import label_logprobs
from genscore_core.seq_cls import ClassifierRows, is_decoder_seq_cls
from genscore_core.templates import ScoreMode

_VOCAB_CHUNK = 16384


def expected_grade(label_logits: torch.Tensor) -> torch.Tensor:
    """The expected grade of each row, in [0, 1], from its label logits ``[N, K]`` (K >= 2), the
    labels listed from the best grade (1) to the worst (0), equally spaced: ``sum_i p_i * g_i``,
    ``p`` the softmax over the K labels. Clamped, since float rounding may step past the ends."""
    count = label_logits.shape[1]
    grades = torch.linspace(1.0, 0.0, count, device=label_logits.device, dtype=torch.float32)
    probabilities = torch.softmax(label_logits.float(), dim=-1)
    return (probabilities @ grades).clamp(0.0, 1.0)


def score_range(mode: ScoreMode) -> tuple[float, float]:
    """The closed range a score of ``mode`` lies in (``"logit"``: any finite number)."""
    return (float("-inf"), float("inf")) if mode == "logit" else (0.0, 1.0)


def score_range_words(mode: ScoreMode) -> str:
    """What a score of ``mode`` must be, for error messages: "a finite number" (logit) or "a finite
    number within [0.0, 1.0]"."""
    low, high = score_range(mode)
    return "a finite number" if mode == "logit" else f"a finite number within [{low}, {high}]"


def check_scores(
    scores: torch.Tensor, mode: ScoreMode, *, job: int | None = None, where: Sequence[int] | None = None
) -> None:
    """Raise :class:`ScoreRangeError` naming the first bad row unless every score is finite and in range.

    ``scores`` are those of job ``job``'s distinct prompts and ``where[p]`` the distinct prompt that
    prompt ``p`` of the job is: the error then names the job and the first of its prompts that got
    the bad score, so that the scorer can name the document it came from.
    """
    low, high = score_range(mode)
    bad = ~torch.isfinite(scores) | (scores < low) | (scores > high)
    if not bool(bad.any()):
        return
    row = int(bad.nonzero()[0, 0])
    prompt = where.index(row) if where is not None else row
    place = f"prompt {prompt}" if job is None else f"prompt {prompt} of job {job}"
    raise ScoreRangeError(
        f"{place} scored {float(scores[row])!r}, not {score_range_words(mode)} as score mode "
        f"{mode!r} requires (half-precision overflow? try dtype='float32')",
        job=job,
        prompt=prompt,
    )


def first_bad_score(values: Sequence[object], mode: ScoreMode) -> int | None:
    """Position of the first of ``values`` that is not a float (an int passes, a bool does not),
    not finite, or outside the range of ``mode``; None when every one is a score of ``mode``."""
    low, high = score_range(mode)
    if all(type(value) is float and low <= value <= high and math.isfinite(value) for value in values):
        return None  # every score of a healthy call: one pass, no conversion
    for position, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return position
        if not (math.isfinite(value) and low <= value <= high):
            return position
    return None


class LabelHead:
    """Reads label scores off the LM head of a causal LM without computing full logits, or off the
    ``score`` rows of a decoder sequence classifier (:mod:`genscore_core.seq_cls`)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.rebuild()

    def rebuild(self) -> None:
        """Read the LM head's weights off the model again (after it was moved, cast or given other
        parameters: :mod:`genscore_core.weights_seen`)."""
        model = self.model
        self.classifier: ClassifierRows | None = None
        """The score rows of a decoder sequence classifier (which has no LM head); None for a causal LM."""
        if is_decoder_seq_cls(model):
            self._read_classifier(model)
            return
        head = model.get_output_embeddings()
        if head is None or not hasattr(head, "weight"):
            raise TypeError(f"{type(model).__name__} has no LM head with a weight to score with")
        config = model.config
        cap = getattr(config, "final_logit_softcapping", None)
        self.softcap: float | None = float(cap) if cap else None
        """Gemma 2's cap on the logits; None when the head does not cap them."""
        # Detached views of the parameters: no autograd graph is recorded on the forward's
        # inference-mode outputs, so the head needs no inference mode of its own.
        self.weight: torch.Tensor = head.weight.detach()  # [V, H]
        bias = getattr(head, "bias", None)
        self.bias: torch.Tensor | None = bias.detach() if bias is not None else None
        # Some heads scale the logits by a constant: Cohere multiplies by ``logit_scale``, Granite
        # divides by ``logits_scaling``. Folding it into h keeps every path exact, which holds only
        # for a head without a bias (theirs have none): any other is refused, not scored wrong.
        scale = float(getattr(config, "logit_scale", None) or 1.0)
        scale /= float(getattr(config, "logits_scaling", None) or 1.0)
        if scale != 1.0 and self.bias is not None:
            raise TypeError(
                f"{type(model).__name__} scales its logits ({scale:g}) and its LM head has a bias, "
                "which genscore cannot score exactly"
            )
        self.logit_scale = scale
        self.vocab_size = int(self.weight.shape[0])

    def _read_classifier(self, model: Any) -> None:
        """The score rows of a sequence classifier, read as transformers' own forward reads them: it
        neither caps nor scales its logits, and neither does this head."""
        self.classifier = ClassifierRows.of(model)
        self.weight, self.bias = self.classifier.weight, self.classifier.bias
        self.softcap, self.logit_scale, self.vocab_size = None, 1.0, 0

    def _ids(self, label_ids: list[int]) -> torch.Tensor:
        """Label ids on the head's device without waiting for the device: a copy from pageable
        memory waits for the work queued before it (the whole forward); a pinned one is queued."""
        ids = torch.tensor(label_ids, dtype=torch.int64)
        if self.weight.device.type != "cuda":
            return ids.to(self.weight.device)
        return ids.pin_memory().to(self.weight.device, non_blocking=True)

    def _prepare(self, hidden: torch.Tensor) -> torch.Tensor:
        h = hidden.to(device=self.weight.device, dtype=torch.float32)
        return h * self.logit_scale if self.logit_scale != 1.0 else h

    def label_logits(self, hidden: torch.Tensor, label_ids: list[int]) -> torch.Tensor:
        """Logits of the label tokens only, in float32: [N, K]."""
        if self.classifier is not None:
            return self.classifier.label_logits(self._prepare(hidden), len(label_ids))
        ids = self._ids(label_ids)
        rows = self.weight.index_select(0, ids).float()  # [K, H]
        logits = self._prepare(hidden) @ rows.T
        if self.bias is not None:
            logits = logits + self.bias.index_select(0, ids).float()
        return self._cap(logits)

    def _cap(self, logits: torch.Tensor) -> torch.Tensor:
        if self.softcap is None:
            return logits
        return torch.tanh(logits / self.softcap) * self.softcap

    def scores(
        self,
        hidden: torch.Tensor,
        label_ids: list[int],
        mode: ScoreMode | bool = "label-softmax",
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """The score of each row under ``mode`` (:data:`~genscore_core.templates.ScoreMode`): [N] float32.

        ``mode`` may also be the protocol's ``apply_softmax``: True is ``"label-softmax"``, False
        ``"vocab-softmax"``. The logit modes read ``label_ids[0]`` alone. ``temperature`` divides
        the label logits of ``label-softmax``, ``logit-sigmoid`` and ``expected-grade`` (a template's
        ``logit_temperature``); ``logit`` and ``vocab-softmax`` ignore it.
        """
        if isinstance(mode, bool):
            mode = "label-softmax" if mode else "vocab-softmax"
        if mode == "vocab-softmax":
            return self._vocab_probability(hidden, label_ids[0])
        every_label = mode in ("label-softmax", "expected-grade")
        logits = self.label_logits(hidden, label_ids if every_label else label_ids[:1])
        if mode == "logit":
            return logits[:, 0]
        if temperature != 1.0:
            logits = logits / temperature
        if mode == "logit-sigmoid":
            return torch.sigmoid(logits[:, 0])
        if mode == "expected-grade":
            return expected_grade(logits)
        if logits.shape[1] == 1:
            return torch.ones(logits.shape[0], device=logits.device)
        if logits.shape[1] == 2:
            return torch.sigmoid(logits[:, 0] - logits[:, 1])
        return torch.softmax(logits, dim=-1)[:, 0]

    def _vocab_probability(self, hidden: torch.Tensor, label_id: int) -> torch.Tensor:
        if self.classifier is not None:
            raise InvalidRequestError(
                "this model is a sequence classifier: its score rows give the label logits but no "
                "next-token distribution over the vocabulary, so score mode 'vocab-softmax' "
                "(apply_softmax=false) has nothing to read; use 'label-softmax' or a logit mode"
            )
        if self.softcap is not None:
            return self._capped_vocab_probability(hidden, label_id)
        # The kernel accumulates in fp32 but reads h in the head's dtype.
        h = self._prepare(hidden).to(self.weight.dtype)
        ids = self._ids([label_id]).expand(h.shape[0], 1)
        result = label_logprobs(h, self.weight, ids, bias=self.bias)
        return result.logprobs[:, 0].exp()

    def _capped_vocab_probability(self, hidden: torch.Tensor, label_id: int) -> torch.Tensor:
        """P(label) under the softmax of the capped logits, in fp32, one vocabulary chunk at a time
        (at most [N, 16384] logits at once, never [N, V])."""
        h = self._prepare(hidden)
        log_normalizer = torch.full((h.shape[0],), float("-inf"), device=h.device)
        for start in range(0, self.vocab_size, _VOCAB_CHUNK):
            logits = h @ self.weight[start : start + _VOCAB_CHUNK].float().T
            if self.bias is not None:
                logits = logits + self.bias[start : start + _VOCAB_CHUNK].float()
            log_normalizer = torch.logaddexp(log_normalizer, torch.logsumexp(self._cap(logits), dim=-1))
        label = self.label_logits(hidden, [label_id])[:, 0]
        return (label - log_normalizer).exp()
