"""The packed forward's reference: random prefix groups, and each prompt alone through the model's
own forward."""

from __future__ import annotations

import random
from typing import Any

import torch

from genscore_core.forward import PrefixGroup

ATOL = 1e-5


def random_groups(rng: random.Random, vocab: int, spec: list[tuple[int, list[int]]]) -> list[PrefixGroup]:
    def ids(n: int) -> list[int]:
        return [rng.randrange(vocab) for _ in range(n)]

    return [PrefixGroup(ids(p), [ids(n) for n in suffixes]) for p, suffixes in spec]


SPEC = [(12, [5, 1, 17, 9]), (0, [3, 8]), (7, [1]), (20, [30, 2, 11, 4, 6])]


def reference_rows(model: Any, groups: list[PrefixGroup]) -> torch.Tensor:
    """Each prompt alone through the model's own forward: the final-norm hidden state at its last token."""
    rows = []
    with torch.inference_mode():
        for group in groups:
            for prompt in group.prompts():
                output = model.model(input_ids=torch.tensor([prompt]))
                rows.append(output.last_hidden_state[0, -1])
    return torch.stack(rows)


def padded_shape(batch: Any, token_step: int, segment_step: int = 16) -> Any:
    """A static shape ``batch`` fits: tokens rounded up to ``token_step``, segments to
    ``segment_step`` with two spare (the spare tokens' and an empty one), loaded and saved prefix rows
    to 128. For layout tests of shapes other than a ladder's rungs."""
    import math

    from genscore_core.packed.decoder import StaticShape, save_rows

    tokens = max(token_step, math.ceil(batch.num_tokens / token_step) * token_step)
    segments = math.ceil((len(batch.segments) + 2) / segment_step) * segment_step
    load = math.ceil((batch.kv_len - batch.num_tokens) / 128) * 128
    save = math.ceil(save_rows(batch) / 128) * 128
    return StaticShape(tokens=tokens, segments=segments, load=load, save=save)
