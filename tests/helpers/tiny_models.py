"""The sizes of the tests' tiny random models, so that each test states only what it changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from genscore_core.loading import transformers_progress_bars
from genscore_core.testing.tiny_model import QWEN3_VOCAB_SIZE


def tiny_sizes(
    *,
    vocab_size: int = QWEN3_VOCAB_SIZE,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
) -> dict[str, Any]:
    """Config fields of a tiny decoder (the Qwen3 vocabulary by default): an MLP twice as wide as the
    hidden size, and grouped-query attention."""
    return {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
    }


def special_ids(tokenizer: Any, *names: str) -> dict[str, Any]:
    """``pad_token_id=...`` and the like, as the tokenizer has them: ``special_ids(t, "pad", "bos")``."""
    return {f"{name}_token_id": getattr(tokenizer, f"{name}_token_id") for name in names}


def linked_model(source: Path, out: Path) -> Path:
    """A folder at ``out`` holding links to the files of the model folder ``source`` (its README
    left out), so that a test can give the tests' shared tiny model the name of a family without
    writing its weights again."""
    out.mkdir(parents=True)
    for file in source.iterdir():
        if file.is_file() and file.name != "README.md":
            (out / file.name).symlink_to(file.resolve())
    return out


def convert_to_seq_cls(
    causal_dir: Path, out: Path, tokens: list[str], method: str, *, record_tokens: bool = False
) -> Path:
    """A ``*ForSequenceClassification`` folder made from the causal LM in ``causal_dir`` as vLLM's
    ``convert_model_to_seq_cls.py`` makes one: the class loaded over the causal weights with
    ``num_labels`` rows, then ``from_2_way_softmax`` (tokens ``[false, true]``: one row,
    ``w[true] - w[false]`` in float32) or ``no_post_processing`` (the tokens' rows, in the order
    given), the bias zeroed, ``use_pad_token=False`` and the tokenizer's pad id recorded.
    ``record_tokens`` also writes vLLM's ``classifier_from_token`` and ``method`` fields (its
    ``--hf-overrides`` for converting online), which the script itself does not save."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(causal_dir))
    causal = AutoModelForCausalLM.from_pretrained(str(causal_dir), dtype=torch.float32)
    num_labels = 1 if method == "from_2_way_softmax" else len(tokens)
    with transformers_progress_bars(False):
        seq_cls = AutoModelForSequenceClassification.from_pretrained(
            str(causal_dir), num_labels=num_labels, ignore_mismatched_sizes=True, dtype=torch.float32
        )
    head = causal.lm_head.weight
    ids = [tokenizer.convert_tokens_to_ids(t) for t in tokens]
    if method == "from_2_way_softmax":
        weight = (head[ids[1]].float() - head[ids[0]].float()).unsqueeze(0)
    else:
        weight = head[ids]
    with torch.no_grad():
        seq_cls.score.weight.copy_(weight)
        if seq_cls.score.bias is not None:
            seq_cls.score.bias.zero_()
    seq_cls.config.use_pad_token = False
    seq_cls.config.pad_token_id = tokenizer.pad_token_id
    if record_tokens:
        seq_cls.config.classifier_from_token = tokens
        seq_cls.config.method = method
    with transformers_progress_bars(False):
        seq_cls.save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))
    return out


def make_untied_model(out: Path, family: str) -> Path:
    """A tiny Qwen3 or Gemma causal LM with an untied head (``tie_word_embeddings: false``, as
    Qwen3-Reranker-8B ships) and the real Qwen3 tokenizer, saved to ``out``. The head is drawn apart
    from the embeddings (and scaled otherwise), so a path that scored with the embeddings would fail."""
    from transformers import AutoTokenizer, GemmaConfig, GemmaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from genscore_core.testing.tiny_model import qwen3_tokenizer_dir

    tokenizer = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))
    common = {
        **tiny_sizes(),
        "head_dim": 16,
        "max_position_embeddings": 2048,
        "initializer_range": 0.1,
        "tie_word_embeddings": False,
        **special_ids(tokenizer, "pad", "eos"),
    }
    torch.manual_seed(5)
    if family == "qwen3":
        model: Any = Qwen3ForCausalLM(Qwen3Config(**common))
    else:
        tokenizer.bos_token = "<|endoftext|>"  # bge-reranker-v2-gemma's recipe starts with BOS
        model = GemmaForCausalLM(GemmaConfig(**common, bos_token_id=tokenizer.bos_token_id))
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 0.25)
    with transformers_progress_bars(False):
        model.save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))
    return out
