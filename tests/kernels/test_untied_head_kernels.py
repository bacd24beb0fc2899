"""An untied head (``tie_word_embeddings: false``) through the kernels: the packed decoder on every
Triton kernel (under the interpreter, as the rest of this folder), then the label head, and the
full-vocabulary label log-probability in torch and in Triton, against the official Qwen3-Reranker
recipe and a float64 log-softmax of the model's own logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from genscore_core.forward import PrefixGroup
from genscore_core.kernels.dispatch import KernelImpl
from genscore_core.kernels.label_logprobs import label_logprobs
from genscore_core.packed import PackedForward, PackedOptions
from genscore_core.scoring import LabelHead
from tests.helpers.reference_recipe import (
    QWEN3_INSTRUCTION,
    QWEN3_PREFIX,
    QWEN3_SUFFIX,
    official_qwen3_scores,
)
from tests.helpers.tiny_models import make_untied_model

pytest.importorskip("triton")

PAIRS = [("capital of France?", "Paris."), ("capital of France?", "London bridge")]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_untied_model(tmp_path_factory.mktemp("untied") / "qwen3-untied", "qwen3")


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_untied_head_through_the_kernels(folder: Path, impl: KernelImpl) -> None:
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    head, embed = model.lm_head.weight, model.model.embed_tokens.weight
    assert head.data_ptr() != embed.data_ptr() and float((head - embed).detach().abs().mean()) > 0.1
    expected = official_qwen3_scores(model, tokenizer, PAIRS, max_length=512)

    prefix = tokenizer.encode(QWEN3_PREFIX, add_special_tokens=False)
    suffix = tokenizer.encode(QWEN3_SUFFIX, add_special_tokens=False)
    prompts = [
        prefix
        + tokenizer.encode(
            f"<Instruct>: {QWEN3_INSTRUCTION}\n<Query>: {q}\n<Document>: {d}", add_special_tokens=False
        )
        + suffix
        for q, d in PAIRS
    ]
    with torch.no_grad():
        logits = torch.stack([model(input_ids=torch.tensor([p])).logits[0, -1] for p in prompts]).double()
    forward = PackedForward(model, max_batch_tokens=10_000, options=PackedOptions.all_kernels(impl))
    hidden = forward.last_hidden_states([PrefixGroup([], prompts)])

    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    assert LabelHead(model).scores(hidden, [yes, no]).tolist() == pytest.approx(expected, abs=1e-5)
    ids = torch.tensor([[yes]] * len(prompts))
    got = label_logprobs(hidden, head.detach(), ids, impl=impl).logprobs[:, 0]
    full = torch.log_softmax(logits, dim=-1)[:, yes]
    assert got.double().exp().tolist() == pytest.approx(full.exp().tolist(), rel=1e-5, abs=1e-12)
