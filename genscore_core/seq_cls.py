"""Decoder ``*ForSequenceClassification`` checkpoints: a generative reranker whose label rows were cut
out of its LM head, and what those rows stand for.

vLLM's ``convert_model_to_seq_cls.py`` (and Infinity's converter) turn a causal reranker into
``Qwen3ForSequenceClassification`` and the like: the decoder is kept and the LM head replaced by a
``score`` layer that transformers applies at the last token. Two conversion methods:

* ``from_2_way_softmax`` (Qwen3-Reranker, mxbai-rerank-v2): tokens ``[false, true]`` give **one row**,
  ``w[true] - w[false]``, so sigmoid(logit) = P(true) / (P(true) + P(false)), the reranker's score;
* ``no_post_processing`` (bge-reranker-v2-gemma's ``["Yes"]``): one row per token, the LM head's own
  rows in the order given.

The folder keeps no record of the tokens (the script saves ``num_labels`` and the pad-token settings
only), so the rows are read against the scoring call's labels, positive label first as genscore's
templates list them: a one-row head is the first label minus the second (two labels) or the first
label (one label); a two-row head is ``[negative, positive]``, the script's ``[false, true]`` order
(and the label order of a binary transformers classifier, whose label 1 is the positive one). A
folder whose ``config.json`` names its tokens (``classifier_from_token``, vLLM's field) is checked
against the template's labels (:func:`check_classifier_tokens`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from genscore_core.errors import ConfigurationError, InvalidRequestError

SEQ_CLS_SUFFIX = "ForSequenceClassification"


def seq_cls_architectures(config: Any) -> list[str]:
    """The ``*ForSequenceClassification`` entries of ``config.architectures``."""
    return [a for a in (getattr(config, "architectures", None) or []) if str(a).endswith(SEQ_CLS_SUFFIX)]


def last_token_classifier(config: Any) -> type | None:
    """transformers' sequence-classification class for ``config``'s model type when it is a decoder's,
    which scores the last token through a ``score`` layer (``GenericForSequenceClassification``);
    None for an encoder's (BERT pools its first token through a classifier of its own)."""
    import transformers
    from transformers.modeling_layers import GenericForSequenceClassification
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES

    name = MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES.get(str(getattr(config, "model_type", "")))
    found = getattr(transformers, name, None) if isinstance(name, str) else None
    if isinstance(found, type) and issubclass(found, GenericForSequenceClassification):
        return found
    return None


def is_decoder_seq_cls(model: Any) -> bool:
    """Whether ``model`` is a loaded decoder sequence classifier (a ``score`` layer, no LM head)."""
    from transformers.modeling_layers import GenericForSequenceClassification

    return isinstance(model, GenericForSequenceClassification)


@dataclass(frozen=True)
class ClassifierRows:
    """The ``score`` layer of a decoder sequence classifier, read as label logits."""

    weight: torch.Tensor
    """[R, H]: one row (a difference, or a single label) or one row per label."""
    bias: torch.Tensor | None

    @classmethod
    def of(cls, model: Any) -> ClassifierRows:
        score = getattr(model, "score", None)
        weight = getattr(score, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            raise TypeError(f"{type(model).__name__} has no score layer with a weight to score with")
        if weight.shape[0] > 2:
            raise ConfigurationError(
                f"{type(model).__name__}'s score layer has {weight.shape[0]} rows; genscore reads one-row "
                "heads (w[yes] - w[no], or one label) and two-row heads ([no, yes])",
                setting="model",
            )
        bias = getattr(score, "bias", None)
        return cls(weight.detach(), bias.detach() if bias is not None else None)

    @property
    def rows(self) -> int:
        return int(self.weight.shape[0])

    def label_logits(self, h: torch.Tensor, labels: int) -> torch.Tensor:
        """Logits [N, labels] in float32 of the call's ``labels`` labels, positive first, from float32
        hidden states ``h`` [N, H]; exact for every score mode that reads them (the softmax over
        the labels, the first label's logit and its sigmoid).

        A one-row head of two labels gives [h . w, 0]: the softmax over them is sigmoid(h . w),
        and the first label's "logit" is the classifier's own logit, as transformers reports it.
        """
        logits = h @ self.weight.float().T  # [N, R]
        if self.bias is not None:
            logits = logits + self.bias.float()
        if self.rows == 1 and labels == 2:
            return torch.cat([logits, torch.zeros_like(logits)], dim=1)
        if self.rows == labels == 1:
            return logits
        if self.rows == 2 and labels == 1:
            return logits[:, 1:]  # the positive row: the first label's raw logit
        if self.rows == labels == 2:
            return logits.flip(1)  # rows [negative, positive] -> labels positive first
        raise InvalidRequestError(
            f"this model's classifier head has {self.rows} row(s) and scores "
            f"{'one label' if self.rows == 1 else 'two labels'} ({_ROW_MEANING[self.rows]}); the call "
            f"names {labels} label token(s)"
        )


_ROW_MEANING = {1: "w[yes] - w[no], or one label's row", 2: "[no, yes]"}


def classifier_label_ids(rows: int, label_ids: Sequence[int]) -> list[int] | None:
    """The token ids the rows stand for in row order, given the template's labels (positive first),
    as a converter would have listed them: ``[false, true]`` for a one-row difference head, the
    token for a one-label head, ``[negative, positive]`` for two rows; None when they do not match."""
    if rows == 1 and len(label_ids) == 2:
        return [label_ids[1], label_ids[0]]
    if rows == len(label_ids) == 1:
        return [label_ids[0]]
    if rows == len(label_ids) == 2:
        return [label_ids[1], label_ids[0]]
    return None


def check_classifier_tokens(
    model: Any, tokenizer: Any, label_ids: Sequence[int], model_name: str, score_mode: str = "label-softmax"
) -> None:
    """Refuse a sequence classifier whose rows cannot be the template's labels: a head of another
    size than the labels need, or a ``config.json`` whose ``classifier_from_token`` names other tokens;
    and score mode ``vocab-softmax``, which needs the next-token distribution a classifier lacks.

    Raises:
        ConfigurationError: Naming the rows, the tokens recorded and the template's labels.
    """
    if not is_decoder_seq_cls(model):
        return
    if score_mode == "vocab-softmax":
        raise ConfigurationError(
            f"model {model_name!r} is a sequence classifier: its score rows give the label logits but no "
            "next-token distribution over the vocabulary, so score_mode='vocab-softmax' has nothing to "
            "read; use 'label-softmax' or a logit mode",
            setting="score_mode",
        )
    rows = ClassifierRows.of(model).rows
    expected = classifier_label_ids(rows, label_ids)
    labels = ", ".join(f"{tokenizer.convert_ids_to_tokens(i)!r} (id {i})" for i in label_ids)
    if expected is None:
        raise ConfigurationError(
            f"model {model_name!r} is a sequence classifier with {rows} score row(s) "
            f"({_ROW_MEANING[rows]}), which cannot stand for the template's {len(label_ids)} label(s) "
            f"[{labels}]; pass a template= with {'one or two labels' if rows == 1 else 'two labels'}",
            setting="template",
        )
    recorded = getattr(model.config, "classifier_from_token", None)
    if recorded is None:
        return
    tokens = list(recorded) if isinstance(recorded, (list, tuple)) else [recorded]
    ids = [tokenizer.convert_tokens_to_ids(str(t)) for t in tokens]
    if ids != expected:
        order = "[false, true]" if rows == 1 and len(label_ids) == 2 else "[negative, positive]"
        raise ConfigurationError(
            f"model {model_name!r}: config.json's classifier_from_token {tokens} (ids {ids}) are not the "
            f"template's labels [{labels}] in the converter's {order} order (ids {expected}); the "
            "score rows were cut from other tokens than this template scores. Pass the template the "
            "model was converted for",
            setting="template",
        )
