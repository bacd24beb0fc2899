"""An offline demo reranker: a small Qwen3 that judges lexical relevance, with the real Qwen3 tokenizer.

Random weights (``make_tiny_model``) exercise the whole pipeline but rank nothing, so a reader of the
README never sees the reranker work. This module writes a model that does rank, with no download and
in seconds: a 3-layer ``Qwen3ForCausalLM`` over the full Qwen3 vocabulary, read through the
Qwen3-Reranker template with the "yes"/"no" labels, like the real model. Its score grows with the
share of the document's content words that also occur in the query, so "Paris is the capital of
France." beats "Berlin is the capital of Germany." for "What is the capital of France?". It knows no
meaning: synonyms, paraphrases and world knowledge are beyond it.

How it is made. Learning word matching from scratch takes a small transformer thousands of steps,
far more than a few minutes on two CPU cores allow. So the matching circuit is *wired* (each weight
set by construction, see ``_wire``) and only its free parameters are *trained*:

* Every token id gets a fixed pseudo-random code of norm 8 in 64 residual dimensions (nearly
  orthogonal codes, so equal tokens match and different ones do not); a few more dimensions carry
  flags: a constant, the attention sink (``<|im_start|>``), the ``Query`` and ``<Document`` markers of
  the template, and "stop" tokens (function words, punctuation, chat markup) that should not count.
* Layer 0 tells each position whether it comes after the ``Query`` marker and after the
  ``<Document`` marker (one head attends to each marker, falling back on the sink).
* Layer 1 marks each document token whose code also occurs in the query (a head whose queries and
  keys are the codes, with keys outside the query pushed down, and the sink as "no match").
* Layer 2, at the last position, averages those marks over the document's content tokens.
* The LM head rows of "yes" and "no" read that average with opposite signs; the rows share one
  code, so nothing else separates them.

Rotary embeddings would make a token's key depend on its position; ``rope_theta`` is set so high that
the dimensions the circuit uses turn by less than 1e-3 radian over the template's length, which makes
matching position-free. The MLPs are zero.

Training (``train_steps`` AdamW steps on synthetic queries and documents whose relevance is the share
of shared content words) then fits the attention sharpness of the three heads and the read-out scale
and offset, with the binary cross-entropy of the yes/no score against that share. The data, the
codes and the initial weights come from fixed seeds, training runs single-threaded with
``torch.use_deterministic_algorithms``, so the same seed writes the same weights on a given machine
and PyTorch version.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from genscore_core.testing.tiny_model import QWEN3_VOCAB_SIZE, qwen3_tokenizer_dir, write_model_folder

DEMO_MODEL_NOTICE = (
    "DEMO MODEL: written by `genscore make-demo-model`. It ranks documents by the share of their words "
    "that also occur in the query (lexical overlap), through the real Qwen3-Reranker template and "
    "tokenizer. It has no notion of meaning; use a real reranker (Qwen/Qwen3-Reranker-0.6B) for real work."
)

# Residual stream layout.
_CODE_DIMS = 64
_BIAS, _SINK, _QMARK, _DMARK, _STOP, _IN_QD, _IN_D, _MATCH, _SCORE = range(64, 73)
_HIDDEN = 80
_HEAD_DIM = 128
_NUM_HEADS = 2
# With this rotary base, the pairs (i, i + 64) for i >= 24 turn by at most 1e12 ** (-24 / 64) = 3e-5
# radian per position: the circuit lives in those "slow" dimensions only.
_ROPE_THETA = 1e12
_SLOW = [*range(24, 64), *range(88, 128)]

# Function words do not make a document relevant; in any case and with or without a leading space.
_STOP_WORDS = frozenset(
    """a an the and or but if of to in on at by for from with as into onto over under about after before
    between through during without within is are was were be been being am do does did done have has had
    having it its it's this that these those there here what which who whom whose when where why how
    i you he she we they me him her us them my your his our their not no yes can could will would shall
    should may might must so than then too very just also only all any each some such both either
    neither other more most much many few""".split()
)

_SEED = 0


def _stop_token_ids(tokenizer: Any) -> set[int]:
    """Token ids that never count as content: function words, punctuation, whitespace, chat markup."""
    stop: set[int] = set(tokenizer.all_special_ids)
    pieces = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    for token_id, piece in enumerate(pieces):
        word = piece.strip().lower()
        if not any(ch.isalnum() for ch in word) or word in _STOP_WORDS:
            stop.add(token_id)
    for markup in ("system", "user", "assistant", "<think>", "</think>", "Query", "<Document", "Document"):
        stop.update(tokenizer.encode(markup, add_special_tokens=False))
    # The template's own words ("<Instruct>", ">:") must not count either.
    from genscore_core.templates import QWEN3_RERANKER

    stop.update(tokenizer.encode(QWEN3_RERANKER.suffix, add_special_tokens=False))
    stop.update(tokenizer.encode("<Instruct>: x\n<Query>: x\n<Document>: x", add_special_tokens=False)[:-1])
    return stop


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


def _config(tokenizer: Any) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=QWEN3_VOCAB_SIZE,
        hidden_size=_HIDDEN,
        intermediate_size=8,
        num_hidden_layers=3,
        num_attention_heads=_NUM_HEADS,
        num_key_value_heads=_NUM_HEADS,
        head_dim=_HEAD_DIM,
        max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": _ROPE_THETA},
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _wire(model: Any, tokenizer: Any, seed: int) -> None:
    """Set every weight of the matching circuit (module docstring); free parameters get start values."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    (yes_id,) = tokenizer.encode("yes", add_special_tokens=False)
    (no_id,) = tokenizer.encode("no", add_special_tokens=False)
    sink_id = tokenizer.convert_tokens_to_ids("<|im_start|>")
    query_marks = tokenizer.encode("Query", add_special_tokens=False)
    document_marks = [
        *tokenizer.encode("Document", add_special_tokens=False),
        tokenizer.convert_tokens_to_ids("<Document"),
    ]
    stop = sorted(i for i in _stop_token_ids(tokenizer) if i < vocab)

    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        embedding = model.model.embed_tokens.weight
        codes = torch.randn(vocab, _CODE_DIMS, generator=generator)
        codes = codes / codes.norm(dim=1, keepdim=True) * math.sqrt(_CODE_DIMS)
        codes[no_id] = codes[yes_id]  # only the read-out dimension tells the two label rows apart
        embedding[:, :_CODE_DIMS] = codes
        embedding[:, _BIAS] = 1.0
        embedding[sink_id, :_CODE_DIMS] = 0.0
        embedding[sink_id, _BIAS] = 0.0
        embedding[sink_id, _SINK] = 1.0
        embedding[query_marks, _QMARK] = 1.0
        embedding[document_marks, _DMARK] = 1.0
        embedding[stop, _STOP] = 1.0
        embedding[sink_id, _STOP] = 1.0
        for norm in [model.model.norm, *(layer.input_layernorm for layer in model.model.layers)]:
            norm.weight.fill_(1.0)
        for layer in model.model.layers:
            layer.post_attention_layernorm.weight.fill_(1.0)
            layer.self_attn.k_norm.weight.fill_(1.0)

        rms = _token_rms(embedding)
        layers = model.model.layers
        # Layer 0: head 0 finds the Query marker, head 1 the Document marker; the sink is the fallback.
        for head, (mark, flag) in enumerate(((_QMARK, _IN_QD), (_DMARK, _IN_D))):
            attention = layers[0].self_attn
            base = head * _HEAD_DIM
            attention.q_proj.weight[base + 60, _BIAS] = 1.0
            attention.k_proj.weight[base + 60, mark] = 1.0
            attention.k_proj.weight[base + 60, _SINK] = 0.5
            attention.k_proj.weight[base + 61, _SINK] = math.sqrt(0.75)
            attention.q_norm.weight[base : base + _HEAD_DIM] = 2.0
            attention.v_proj.weight[base, mark] = 1.0
            mark_ids = query_marks if mark == _QMARK else document_marks
            attention.o_proj.weight[flag, base] = float(rms[mark_ids].mean())
        # Layer 1, head 0: a document token matches the same code inside the query.
        attention = layers[1].self_attn
        code_slots = _SLOW[:_CODE_DIMS]
        penalty, sink_slot = _SLOW[_CODE_DIMS], _SLOW[_CODE_DIMS + 1]
        for dim, slot in enumerate(code_slots):
            attention.q_proj.weight[slot, dim] = 1.0
            attention.k_proj.weight[slot, dim] = 1.0
        attention.q_proj.weight[penalty, _BIAS] = 8.0
        attention.q_proj.weight[sink_slot, _BIAS] = 4.0
        attention.k_proj.weight[penalty, _IN_QD] = 24.0
        attention.k_proj.weight[penalty, _IN_D] = -24.0
        attention.k_proj.weight[penalty, _BIAS] = -24.0
        attention.k_proj.weight[sink_slot, _SINK] = 1.0
        attention.q_norm.weight[:_HEAD_DIM] = 2.5
        attention.v_proj.weight[0, _BIAS] = 1.0
        attention.o_proj.weight[_MATCH, 0] = float(rms.median())
        # Layer 2, head 0: average the matches over the document's content tokens.
        attention = layers[2].self_attn
        attention.q_proj.weight[60, _BIAS] = 1.0
        attention.k_proj.weight[60, _IN_D] = 2.0
        attention.k_proj.weight[60, _IN_QD] = -1.0
        attention.k_proj.weight[60, _STOP] = -2.0
        attention.k_proj.weight[61, _BIAS] = 1.0
        attention.q_norm.weight[:_HEAD_DIM] = 1.0
        attention.v_proj.weight[0, _MATCH] = 1.0
        attention.o_proj.weight[_SCORE, 0] = float(rms.median())
        # Read-out: logit(yes) - logit(no) = 2 * scale * score - offset, on the normalised last state.
        embedding[yes_id, _SCORE] = 4.0
        embedding[no_id, _SCORE] = -4.0
        embedding[yes_id, _BIAS] = 1.0 - 0.6
        embedding[no_id, _BIAS] = 1.0 + 0.6


def _token_rms(embedding: Any) -> Any:
    return embedding.pow(2).mean(dim=1).sqrt()


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


def _free_parameters(model: Any) -> list[Any]:
    """What training adjusts: the sharpness of each head and the final norm (the read-out scale)."""
    return [
        *(layer.self_attn.q_norm.weight for layer in model.model.layers),
        model.model.norm.weight,
    ]


def _train(model: Any, tokenizer: Any, words: Sequence[str], steps: int, seed: int) -> list[float]:
    import torch

    from genscore_core.prompts import TemplatePromptBuilder
    from genscore_core.templates import QWEN3_RERANKER

    builder = TemplatePromptBuilder(tokenizer, QWEN3_RERANKER, max_length=512)
    (yes_id,) = tokenizer.encode("yes", add_special_tokens=False)
    (no_id,) = tokenizer.encode("no", add_special_tokens=False)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    free = _free_parameters(model)
    for parameter in free:
        parameter.requires_grad_(True)
    optimizer = torch.optim.AdamW(free, lr=0.02, weight_decay=0.0)
    rng = random.Random(seed)
    losses = []
    for _ in range(steps):
        prompts, targets = [], []
        for _ in range(4):
            query, documents, shared, size = synthetic_query(rng, words, 8)
            prompts += [p.token_ids for p in builder.build(query, documents)]
            targets += [count / size for count in shared]
        ids, mask = _pad(prompts, tokenizer.pad_token_id)
        margin = _label_margin(model, ids, mask, yes_id, no_id)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(margin, torch.tensor(targets))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return losses


def _pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[Any, Any]:
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = torch.tensor(prompt)
        mask[row, : len(prompt)] = 1
    return ids, mask


def _label_margin(model: Any, ids: Any, mask: Any, yes_id: int, no_id: int) -> Any:
    """``logit(yes) - logit(no)`` at each (right-padded) prompt's last position."""
    import torch

    hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
    last = hidden[torch.arange(len(ids)), mask.sum(dim=1) - 1]
    head = model.lm_head.weight
    return last @ (head[yes_id] - head[no_id])


def build_demo_model(*, train_steps: int = 100, seed: int = _SEED, threads: int = 1) -> tuple[Any, Any]:
    """The wired and trained model and its tokenizer, in memory (see :func:`make_demo_model`)."""
    import torch
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))
    with _deterministic_torch(threads):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(_config(tokenizer)).float()
        _wire(model, tokenizer, seed)
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


def make_demo_model(
    output_dir: str | Path, *, train_steps: int = 100, seed: int = _SEED, threads: int = 1
) -> Path:
    """Write the demo reranker (a ``Qwen3ForCausalLM``) and the real Qwen3 tokenizer to ``output_dir``.

    It loads with ``GenerativeScorer(output_dir)`` (template ``qwen3-reranker``, labels "yes"/"no")
    and ranks documents by lexical overlap with the query; see the module docstring for how.

    Args:
        output_dir: Folder to write; created if missing.
        train_steps: AdamW steps fitting the free parameters (0 keeps the wired start values).
        seed: Seed of the token codes and of the synthetic training data.
        threads: Torch threads while training; results are bitwise reproducible for a given count.

    Returns:
        The output folder.
    """
    model, tokenizer = build_demo_model(train_steps=train_steps, seed=seed, threads=threads)
    out = Path(output_dir)
    settings = {"train_steps": train_steps, "seed": seed, "threads": threads}
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
    folder: str | Path, *, train_steps: int = 100, seed: int = _SEED, threads: int = 1
) -> bool:
    """Whether ``folder`` already holds a complete demo model written with these settings.

    Lets ``genscore make-demo-model DIR`` be run again (a README command re-run) without rebuilding.
    """
    out = Path(folder)
    try:
        written = json.loads((out / DEMO_SETTINGS_FILE).read_text())
    except (OSError, ValueError):
        return False
    expected = {"train_steps": train_steps, "seed": seed, "threads": threads}
    complete = all((out / name).is_file() for name in ("config.json", "model.safetensors", "tokenizer.json"))
    return complete and written == expected
