"""Typed, validated settings of a scorer."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from genscore_core.templates import PromptTemplate

DEFAULT_MODEL = "Qwen/Qwen3-Reranker-0.6B"


class ScorerConfig(BaseModel):
    """Everything that decides how a :class:`~genscore_core.GenerativeScorer` loads and scores."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = DEFAULT_MODEL
    """Hugging Face hub id or local folder of a causal LM."""
    template: str | PromptTemplate = "auto"
    """Preset name (``"qwen3-reranker"``, ``"mxbai-rerank-v2"``), ``"auto"`` (from the model name) or a template."""
    instruction: str | None = None
    """Task instruction written into templates that take one; ``None`` uses the template's default."""
    max_length: int | None = Field(default=None, gt=0)
    """Longest prompt in tokens; ``None`` uses what the model supports."""
    query_share: float = Field(default=0.75, gt=0.0, lt=1.0)
    """Share of the body budget the query may keep when a prompt has to be shortened."""
    device: str | None = None
    """``"cuda"``, ``"cuda:1"``, ``"cpu"``...; ``None`` picks CUDA when available."""
    dtype: str | None = None
    """``"bfloat16"``, ``"float16"``, ``"float32"``; ``None`` is bf16 on CUDA and fp32 on the CPU."""
    max_batch_tokens: int = Field(default=16384, gt=0)
    """Token budget of one forward batch (padded tokens count)."""
    max_batch_size: int = Field(default=64, gt=0)
    forward: Literal["auto", "padded", "packed"] = "auto"
    """``"packed"``: variable-length batches with shared-prefix reuse; ``"auto"`` picks it on CUDA when
    the architecture supports it."""
    trust_remote_code: bool = False
    show_progress: bool = False
    """Show a progress bar on stderr while scoring."""
