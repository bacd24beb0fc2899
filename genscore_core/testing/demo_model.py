"""An offline demo reranker: a small Qwen3 trained to judge lexical relevance, with the real Qwen3 tokenizer.

Random weights (``make_tiny_model``) exercise the whole pipeline but rank nothing, so a reader of the
README never sees the reranker work. This module trains, in one to two minutes on a CPU, a model that
does rank: a 2-layer ``Qwen3ForCausalLM`` (hidden size 64, two heads of 64, MLP 128) over the full
Qwen3 vocabulary, read through the Qwen3-Reranker template with the "yes"/"no" labels, like the real
model. It learns to score a document by how many of the query's content words it contains, so "Paris
is the capital of France." beats "Berlin is the capital of Germany." for "What is the capital of
France?". It knows no meaning: synonyms, paraphrases and world knowledge are beyond it. And it counts
what its first layer sees, a word with an earlier copy in the prompt: a content word repeated within a
document, or one of the template's own words ("query", "relevant", "passages"), counts as a match too.

How it starts. Every parameter first gets transformers' own initialisation (normal, std 0.02; norms
at 1) from ``torch.manual_seed(seed)``; then, from a generator seeded with ``seed``:

* Embeddings (tied with the LM head): every token id gets a random Gaussian code of norm 8 in the 64
  dimensions, whose first coordinate is then set to 4 for every token (a shared "bias" coordinate).
* Layer 0, both heads, queries and keys: a duplicate-token detector. The 32 slowly rotating rotary
  dimensions of each head get ``W_Q = W_K`` = one random projection of the codes (equal tokens attend
  to each other wherever they are); the 12 fastest rotating ones get the bias coordinate, along one
  random direction in ``W_Q`` and its opposite in ``W_K``, so that rotary position embedding makes a
  token shun itself (at distance 0 the two cancel fully, further away they average out). The other
  rotary dimensions start at 0; ``q_norm``/``k_norm`` weights start at 1.4.
* Layer 0, head 0, values and output: ``W_V`` copies the code coordinates of the attended token and
  ``W_O`` writes them back negated, so a token that finds a copy of itself earlier in the prompt
  (a document word that is in the query) cancels its own code.
* Layer 1: ``q_norm`` weights start at 0.1 (attention close to uniform); ``W_V`` and ``W_O`` are
  drawn with std ``1/sqrt(fan_in)`` instead of 0.02, so that what layer 0 finds reaches the last
  position from the first step (in trial runs with 0.02, one seed in three stayed at chance).
* The final norm's weight starts at 0.1 (first scores close to 0.5).

Everything else keeps the default initialisation: both MLPs, layer 0's second value/output head,
layer 1's query and key projections, the other norms. At this start the model ranks no better than
chance (held-out nDCG@10 0.66; random order gives 0.67).

How it is trained. All parameters (embeddings, attention, MLPs, norms, and through the tied
embeddings the LM head) are trained together by AdamW (learning rate 1e-2 with 30 warm-up steps and a
cosine decay to 1e-3, gradients clipped at norm 1) for ``train_steps`` steps of 4 synthetic queries
with 8 documents each (see :func:`training_query`). The loss is a listwise cross-entropy (the
documents' margins ``logit(yes) - logit(no)`` against a softmax of twice their number of shared query
words) plus half the binary cross-entropy of the yes/no score against the share of the query's words
the document contains. Training documents of one query all hold the same number of content words, so
document length says nothing about relevance and only matching words pays; half of them carry a number
whose digits and commas repeat (Qwen3 writes one token per digit), so that such repeats do not count. What training has to find:
which positions to read (the document's content words, not the template, the query or function words
such as "the" that also occur in the query), how to turn the matches into a score, and its scale.

Only the embedding rows of tokens that occur in the training prompts receive gradients. Rows that
never do stay exactly at their start values (AdamW without weight decay leaves a parameter with zero
gradient unchanged), so training runs on a table of those rows and writes them back into the full
vocabulary afterwards; the result is what training the full table would give, in a fraction of the
time. Words of the held-out list (:func:`held_out_words`) never occur in training: their codes are the
random start, which is how the test measures that matching generalises to unseen words.

The data, the codes and the start come from fixed seeds, and training runs with a fixed number of
threads and ``torch.use_deterministic_algorithms``, so the same seed writes the same weights on a given
machine and PyTorch version.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from genscore_core.testing.tiny_model import (
    QWEN3_VOCAB_SIZE,
    qwen3_config,
    qwen3_tokenizer_dir,
    write_model_folder,
)

DEMO_MODEL_NOTICE = (
    "DEMO MODEL: written by `genscore make-demo-model`. It ranks documents by how many of the query's "
    "words they contain (lexical overlap), trained on synthetic queries, through the real "
    "Qwen3-Reranker template and tokenizer. It has no notion of meaning; use a real reranker "
    "(Qwen/Qwen3-Reranker-0.6B) for real work."
)

_HIDDEN = 64
_HEADS = 2
_HEAD_DIM = 64
_LAYERS = 2
_MLP = 128
# Qwen3's own base: rotary pair i turns by 1e6 ** (-i / 32) radian per position, so pairs 16-31 turn
# by at most 1e-3 (a copy 30 tokens away still matches) while pairs 0-5 turn by 0.1 to 1 (they tell a
# token from itself).
_ROPE_THETA = 1e6
_FAST_PAIRS = 6
_BIAS = 4.0
_QK_NORM = 1.4

_QUERIES_PER_STEP = 4
_DOCUMENTS_PER_QUERY = 8
_LEARNING_RATE = 1e-2
_WARMUP_STEPS = 30
TRAIN_STEPS = 400
_SEED = 0
RECIPE = 3
"""Bumped when the recipe changes, so that a folder written by an older one is not taken as current."""

# Function words do not make a document relevant; in any case and with or without a leading space.
_STOP_WORDS = frozenset(
    """a an the and or but if of to in on at by for from with as into onto over under about after before
    between through during without within is are was were be been being am do does did done have has had
    having it its it's this that these those there here what which who whom whose when where why how
    i you he she we they me him her us them my your his our their not no yes can could will would shall
    should may might must so than then too very just also only all any each some such both either
    neither other more most much many few""".split()
)


@contextlib.contextmanager
def _deterministic_torch(threads: int) -> Iterator[None]:
    import torch

    previous_threads = torch.get_num_threads()
    previous_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(previous_threads)
        torch.use_deterministic_algorithms(previous_deterministic)


_ROPE: dict[str, Any] = {"rope_theta": _ROPE_THETA}


def _config(tokenizer: Any) -> Any:
    return qwen3_config(
        tokenizer,
        hidden_size=_HIDDEN,
        intermediate_size=_MLP,
        num_hidden_layers=_LAYERS,
        num_attention_heads=_HEADS,
        num_key_value_heads=_HEADS,
        head_dim=_HEAD_DIM,
        max_position_embeddings=8192,
        # transformers 5 folds rope_theta into rope_parameters (its signature no longer names it);
        # 4.x reads it as it is and would ignore rope_parameters.
        **_ROPE,
        rms_norm_eps=1e-6,
    )


def _initialise(model: Any, seed: int) -> None:
    """The start described in the module docstring, over transformers' default initialisation."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    half = _HEAD_DIM // 2
    # Rotary pairs are (i, i + half); pair i turns by theta ** (-i / half) per position.
    slow = [*range(half // 2, half), *range(half + half // 2, _HEAD_DIM)]
    fast = [*range(_FAST_PAIRS), *range(half, half + _FAST_PAIRS)]
    with torch.no_grad():
        embedding = model.model.embed_tokens.weight
        codes = torch.randn(embedding.shape, generator=generator)
        codes = codes / codes.norm(dim=1, keepdim=True) * math.sqrt(_HIDDEN)
        codes[:, 0] = _BIAS
        embedding.copy_(codes)

        attention = model.model.layers[0].self_attn
        w_q = torch.zeros(attention.q_proj.weight.shape)
        w_k = torch.zeros(attention.k_proj.weight.shape)
        for head in range(_HEADS):
            projection = torch.randn(len(slow), _HIDDEN - 1, generator=generator) / math.sqrt(_HIDDEN)
            direction = torch.randn(len(fast), generator=generator)
            direction = direction / direction.norm() * 1.4
            slow_rows = [head * _HEAD_DIM + i for i in slow]
            fast_rows = [head * _HEAD_DIM + i for i in fast]
            w_q[slow_rows, 1:] = projection
            w_k[slow_rows, 1:] = projection
            w_q[fast_rows, 0] = direction
            w_k[fast_rows, 0] = -direction
        attention.q_proj.weight.copy_(w_q)
        attention.k_proj.weight.copy_(w_k)
        attention.q_norm.weight.fill_(_QK_NORM)
        attention.k_norm.weight.fill_(_QK_NORM)
        code_dims = torch.arange(_HIDDEN - 1)
        attention.v_proj.weight[:_HEAD_DIM].zero_()
        attention.o_proj.weight[:, :_HEAD_DIM].zero_()
        attention.v_proj.weight[code_dims, 1 + code_dims] = 1.0
        attention.o_proj.weight[1 + code_dims, code_dims] = -1.0

        attention = model.model.layers[1].self_attn
        attention.q_norm.weight.fill_(0.1)
        for projection in (attention.v_proj.weight, attention.o_proj.weight):
            projection.copy_(
                torch.randn(projection.shape, generator=generator) / math.sqrt(projection.shape[1])
            )
        model.model.norm.weight.fill_(0.1)


# -- synthetic data ---------------------------------------------------------------------------------

_QUESTION_WORDS = ("What", "Which", "How", "Who", "Where", "When", "Why")
_FILLERS = ("the", "is", "of", "a", "in", "to", "and", "for", "on", "with", "by", "was", "are", "from", "at")


def content_words(tokenizer: Any) -> list[str]:
    """Single-token words (lower case or capitalised, 4 to 10 letters) of the Qwen3 vocabulary, sorted."""
    words = set()
    for token in tokenizer.get_vocab():
        if (
            token.startswith("Ġ")
            and 4 <= len(token) - 1 <= 10
            and token[1:].isascii()
            and token[1:].isalpha()
        ):
            word = token[1:]
            if (
                word.islower() or (word[0].isupper() and word[1:].islower())
            ) and word.lower() not in _STOP_WORDS:
                words.add(word)
    return sorted(words)


def synthetic_query(
    rng: random.Random, words: Sequence[str], num_documents: int
) -> tuple[str, list[str], list[int], int]:
    """A query of 1 to 4 content words, and documents sharing 0 to all of them with it.

    Returns the query, the documents, for each document how many query words it contains, and the
    number of content words of the query.
    Documents mix shared words with 1 to 5 other content words and function words, in random order.
    """
    size = rng.randint(1, 4)
    query_words = rng.sample(list(words), size)
    query = [rng.choice(_QUESTION_WORDS)]
    for word in query_words:
        query += [*rng.sample(_FILLERS, rng.randint(0, 2)), word]
    documents, shared = [], []
    for _ in range(num_documents):
        count = rng.randint(0, size)
        picked = rng.sample(query_words, count) + rng.sample(list(words), rng.randint(1, 5))
        rng.shuffle(picked)
        text = ["The"]
        for word in picked:
            text += [*rng.sample(_FILLERS, rng.randint(0, 2)), word]
        documents.append(" ".join(text) + ".")
        shared.append(len(set(query_words) & set(picked)))
    return " ".join(query) + "?", documents, shared, size


def ndcg_at(scores: Sequence[float], gains: Sequence[float], k: int = 10) -> float:
    """nDCG@k with exponential gains ``2**gain - 1``; ties broken by input order."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:k]
    dcg = sum((2 ** gains[i] - 1) / math.log2(rank + 2) for rank, i in enumerate(order))
    ideal = sorted(gains, reverse=True)[:k]
    best = sum((2**g - 1) / math.log2(rank + 2) for rank, g in enumerate(ideal))
    return dcg / best if best > 0 else 1.0


# -- training ---------------------------------------------------------------------------------------


def training_query(
    rng: random.Random, words: Sequence[str], num_documents: int
) -> tuple[str, list[str], list[int], int]:
    """Like :func:`synthetic_query`, but every document of the query holds the same number of content
    words (the query's size plus 0 to 3), shared or not, so that length says nothing about relevance;
    and half the documents carry a number ("in 1924", "1900, 1924 and 2024"), whose digits and commas
    repeat within the document and occur in the template, so that the model learns they do not count."""
    size = rng.randint(1, 4)
    query_words = rng.sample(list(words), size)
    query = _sentence(rng, rng.choice(_QUESTION_WORDS), query_words, "?")
    length = rng.randint(size, size + 3)
    documents, shared = [], []
    for _ in range(num_documents):
        count = rng.randint(0, size)
        picked = rng.sample(query_words, count) + rng.sample(list(words), length - count)
        rng.shuffle(picked)
        if rng.random() < 0.5:
            picked.insert(rng.randint(0, len(picked)), _number(rng))
        documents.append(_sentence(rng, "The", picked, "."))
        shared.append(count)
    return query, documents, shared, size


def _sentence(rng: random.Random, first: str, words: Sequence[str], end: str) -> str:
    text = [first]
    for word in words:
        text += [*rng.sample(_FILLERS, rng.randint(0, 2)), word]
    return " ".join(text) + end


def _number(rng: random.Random) -> str:
    years = [str(rng.randint(1000, 2100)) for _ in range(rng.randint(1, 3))]
    listed = years[0] if len(years) == 1 else ", ".join(years[:-1]) + " and " + years[-1]
    return rng.choice((listed, str(rng.randint(0, 999)), f"{rng.randint(1, 99)},{rng.randint(100, 999)}"))


def _training_batches(
    tokenizer: Any, words: Sequence[str], steps: int, seed: int
) -> list[tuple[list[list[int]], list[list[int]], list[float]]]:
    """Per step: the prompts' token ids, each query's shared-word counts, and each prompt's target."""
    from genscore_core.prompts import TemplatePromptBuilder
    from genscore_core.templates import QWEN3_RERANKER

    builder = TemplatePromptBuilder(tokenizer, QWEN3_RERANKER, max_length=512)
    rng = random.Random(seed + 1)
    batches = []
    for _ in range(steps):
        prompts: list[list[int]] = []
        gains: list[list[int]] = []
        targets: list[float] = []
        for _ in range(_QUERIES_PER_STEP):
            query, documents, shared, size = training_query(rng, words, _DOCUMENTS_PER_QUERY)
            prompts += [prompt.token_ids for prompt in builder.build(query, documents)]
            gains.append(shared)
            targets += [count / size for count in shared]
        batches.append((prompts, gains, targets))
    return batches


def _train(model: Any, tokenizer: Any, words: Sequence[str], steps: int, seed: int) -> list[float]:
    """Train every parameter (module docstring); returns the loss of each step."""
    import numpy as np
    import torch

    (yes_id,) = tokenizer.encode("yes", add_special_tokens=False)
    (no_id,) = tokenizer.encode("no", add_special_tokens=False)
    batches = _training_batches(tokenizer, words, steps, seed)
    pad_id = tokenizer.pad_token_id
    occurring = sorted({t for prompts, _, _ in batches for p in prompts for t in p} | {yes_id, no_id, pad_id})
    row_of = np.zeros(QWEN3_VOCAB_SIZE, dtype=np.int64)
    row_of[occurring] = np.arange(len(occurring))
    full_table = model.model.embed_tokens.weight
    table = torch.nn.Parameter(full_table.detach()[occurring].clone())
    yes_row, no_row, pad_row = (int(row_of[i]) for i in (yes_id, no_id, pad_id))
    others = [p for name, p in model.named_parameters() if name != "model.embed_tokens.weight"]
    optimizer = torch.optim.AdamW([table, *others], lr=_LEARNING_RATE, betas=(0.9, 0.98), weight_decay=0.0)
    model.train()
    losses = []
    for step, (prompts, gains, targets) in enumerate(batches):
        scale = min(1.0, (step + 1) / _WARMUP_STEPS) * (0.1 + 0.45 * (1 + math.cos(math.pi * step / steps)))
        for group in optimizer.param_groups:
            group["lr"] = _LEARNING_RATE * scale
        width = max(len(p) for p in prompts)
        ids = np.full((len(prompts), width), pad_row, dtype=np.int64)
        mask = np.zeros((len(prompts), width), dtype=np.int64)
        for row, prompt in enumerate(prompts):
            ids[row, : len(prompt)] = row_of[prompt]
            mask[row, : len(prompt)] = 1
        lengths = torch.from_numpy(mask.sum(axis=1) - 1)
        # The pad row's embedding is masked out of attention, as nn.Embedding's padding_idx would leave it.
        hidden = model.model(
            inputs_embeds=table[torch.from_numpy(ids)], attention_mask=torch.from_numpy(mask)
        ).last_hidden_state
        margin = hidden[torch.arange(len(prompts)), lengths] @ (table[yes_row] - table[no_row])
        relevance = torch.tensor(gains, dtype=torch.float32)
        listwise = -(
            torch.softmax(2.0 * relevance, dim=1) * torch.log_softmax(margin.view(relevance.shape), dim=1)
        )
        loss = listwise.sum(dim=1).mean() + 0.5 * torch.nn.functional.binary_cross_entropy_with_logits(
            margin, torch.tensor(targets)
        )
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_([table, *others], 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
    with torch.no_grad():
        full_table[occurring] = table.detach()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return losses


def build_demo_model(
    *, train_steps: int = TRAIN_STEPS, seed: int = _SEED, threads: int = 1
) -> tuple[Any, Any]:
    """The trained model and its tokenizer, in memory (see :func:`make_demo_model`)."""
    import torch
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))
    with _deterministic_torch(threads):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(_config(tokenizer)).float()
        _initialise(model, seed)
        words = content_words(tokenizer)
        random.Random(seed).shuffle(words)
        # The first words are held out: tests measure ranking on words training never saw.
        _train(model, tokenizer, words[HELD_OUT_WORDS:], train_steps, seed)
    return model.eval(), tokenizer


HELD_OUT_WORDS = 2000


def held_out_words(tokenizer: Any, seed: int = _SEED) -> list[str]:
    """The content words :func:`make_demo_model` never trains on."""
    words = content_words(tokenizer)
    random.Random(seed).shuffle(words)
    return words[:HELD_OUT_WORDS]


def _settings(train_steps: int, seed: int, threads: int) -> dict[str, int]:
    return {"recipe": RECIPE, "train_steps": train_steps, "seed": seed, "threads": threads}


def make_demo_model(
    output_dir: str | Path, *, train_steps: int = TRAIN_STEPS, seed: int = _SEED, threads: int = 1
) -> Path:
    """Train the demo reranker (a ``Qwen3ForCausalLM``) and write it with the real Qwen3 tokenizer.

    It loads with ``GenerativeScorer(output_dir)`` (template ``qwen3-reranker``, labels "yes"/"no")
    and ranks documents by lexical overlap with the query; see the module docstring for how it is
    made.

    Args:
        output_dir: Folder to write; created if missing.
        train_steps: AdamW steps over all parameters (0 writes the untrained start).
        seed: Seed of the start (codes and projections) and of the synthetic training data.
        threads: Torch threads while training; results are bitwise reproducible for a given count.

    Returns:
        The output folder.
    """
    model, tokenizer = build_demo_model(train_steps=train_steps, seed=seed, threads=threads)
    out = Path(output_dir)
    settings = _settings(train_steps, seed, threads)
    write_model_folder(
        out,
        model,
        tokenizer,
        title="genscore demo reranker (lexical overlap)",
        notice=DEMO_MODEL_NOTICE,
        notice_file="GENSCORE_DEMO_MODEL.txt",
        settings=settings,
    )
    # After the model files: holds_demo_model reads it as "written with these settings".
    (out / DEMO_SETTINGS_FILE).write_text(json.dumps(settings, indent=2) + "\n")
    return out


DEMO_SETTINGS_FILE = "genscore_demo_model.json"


def holds_demo_model(
    folder: str | Path, *, train_steps: int = TRAIN_STEPS, seed: int = _SEED, threads: int = 1
) -> bool:
    """Whether ``folder`` already holds a complete demo model written with these settings (and recipe).

    Lets ``genscore make-demo-model DIR`` be run again (a README command re-run) without rebuilding.
    """
    out = Path(folder)
    try:
        written = json.loads((out / DEMO_SETTINGS_FILE).read_text())
    except (OSError, ValueError):
        return False
    complete = all((out / name).is_file() for name in ("config.json", "model.safetensors", "tokenizer.json"))
    return complete and written == _settings(train_steps, seed, threads)
