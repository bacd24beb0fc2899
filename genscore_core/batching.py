"""Length-sorted, token-budgeted batches of left-padded prompts."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def length_sorted_batches(
    lengths: Sequence[int], max_batch_tokens: int, max_batch_size: int
) -> list[list[int]]:
    """Group prompt indices, longest first, so that ``batch size x longest prompt <= max_batch_tokens``.

    A prompt longer than the budget gets a batch of its own rather than an error: the budget bounds
    padding waste and memory, it is not a length limit.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        # Sorted longest first, so the first prompt of a batch sets its padded width.
        width = lengths[current[0]] if current else lengths[index]
        if current and (len(current) + 1 > max_batch_size or (len(current) + 1) * width > max_batch_tokens):
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


def left_pad(
    sequences: Sequence[Sequence[int]], pad_id: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad token lists so that every last real token sits in the last column.

    Returns ``input_ids`` [B, S], ``attention_mask`` [B, S] and ``position_ids`` [B, S]; positions
    count real tokens only, so a prompt gets the same positions whatever batch it lands in.
    """
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            input_ids[row, width - len(seq) :] = torch.as_tensor(seq, dtype=torch.long)
            attention_mask[row, width - len(seq) :] = 1
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return input_ids.to(device), attention_mask.to(device), position_ids.to(device)


def is_out_of_memory(error: BaseException) -> bool:
    """A device (or host) allocation failure, which a smaller batch may avoid."""
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()
