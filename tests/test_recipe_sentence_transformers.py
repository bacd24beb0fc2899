"""Folders saved for sentence-transformers' CrossEncoder: same prompt ids, scores and order as
``CrossEncoder.predict`` itself."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from sentence_transformers import CrossEncoder
from sentence_transformers.base.modules import Transformer
from sentence_transformers.cross_encoder.modules import LogitScore

from genscore_core import GenerativeScorer
from genscore_core.testing.tiny_model import make_tiny_model

# A template whose texts sit right against other text ("Query:" + query + "?"), so that tokenizing the
# rendered prompt whole (as sentence-transformers does) and piece by piece give different ids.
CHAT_TEMPLATE = (
    "<|im_start|>system\nJudge whether the document answers the query. Answer yes or no.<|im_end|>\n"
    "<|im_start|>user\n"
    "{% for m in messages %}{% if m.role == 'query' %}Query:{{ m.content }}?{% endif %}{% endfor %}\n"
    "{% for m in messages %}{% if m.role == 'document' %}Document:{{ m.content }}{% endif %}{% endfor %}"
    "<|im_end|>\n<|im_start|>assistant\n"
)
# The same prompt for messages whose content is a list of typed parts (sentence-transformers' structured
# message format; Qwen3 folders are saved "flat", so that folder's config is switched after saving).
STRUCTURED_TEMPLATE = CHAT_TEMPLATE.replace("m.content }}", "m.content[0].text }}")
YES, NO = 9693, 2152

PAIRS = [
    ("capital of France", "Paris is the capital and largest city of France."),
    ("capital of France", "Berlin is the capital of Germany.\n"),
    ("who wrote {Hamlet}?", "Shakespeare wrote it around 1600 ... {json: true}"),
    ("quantum", " leading space and trailing newline\n"),
    ("rivers", "The Seine flows through Paris; the Thames through London!"),
    ("empty-ish", "."),
]


def _save(base: Path, out: Path, label_ids: tuple[int, ...], template: str = CHAT_TEMPLATE) -> Path:
    transformer = Transformer(str(base), transformer_task="text-generation")
    transformer.tokenizer.chat_template = template
    head = LogitScore(true_token_id=label_ids[0], false_token_id=label_ids[1] if len(label_ids) > 1 else None)
    CrossEncoder(modules=[transformer, head]).save(str(out))
    if template is STRUCTURED_TEMPLATE:
        settings = json.loads((out / "sentence_bert_config.json").read_text())
        settings["modality_config"]["message"]["format"] = "structured"
        (out / "sentence_bert_config.json").write_text(json.dumps(settings))
    return out


@pytest.fixture(scope="module")
def st_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("st")
    base = make_tiny_model(root / "base", seed=3)
    return {
        "two": _save(base, root / "two-token", (YES, NO)),
        "one": _save(base, root / "one-token", (YES,)),
        "structured": _save(base, root / "structured", (YES, NO), STRUCTURED_TEMPLATE),
    }


def _st_prompt_ids(model: CrossEncoder, pairs: list[tuple[str, str]]) -> list[list[int]]:
    features = model.preprocess(pairs)
    return [row[mask.bool()].tolist() for row, mask in zip(features["input_ids"], features["attention_mask"])]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["two", "structured"])
def test_two_token_folder(st_folders: dict[str, Path], kind: str) -> None:
    folder = str(st_folders[kind])
    message_format = json.loads((st_folders[kind] / "sentence_bert_config.json").read_text())
    assert message_format["modality_config"]["message"]["format"] == (
        "flat" if kind == "two" else "structured"
    )
    scorer = GenerativeScorer(folder, device="cpu", dtype="float32")
    assert scorer.recipe.source.startswith("sentence-transformers CrossEncoder configuration")
    assert scorer.label_token_ids == [YES, NO]
    assert scorer.score_mode == "label-softmax"
    st = CrossEncoder(folder, device="cpu")
    assert [p.token_ids for q, d in PAIRS for p in scorer.encode(q, [d])] == _st_prompt_ids(st, PAIRS)

    log_odds = st.predict(PAIRS, activation_fn=torch.nn.Identity()).tolist()
    scores = scorer.score_pairs(PAIRS)
    for score, difference in zip(scores, log_odds, strict=True):
        assert score == pytest.approx(1 / (1 + math.exp(-difference)), abs=1e-5)
    # sentence-transformers' default activation is that very sigmoid.
    assert scores == pytest.approx(st.predict(PAIRS).tolist(), abs=1e-5)

    query = "capital of France"
    documents = [d for _, d in PAIRS]
    st_order = [hit["corpus_id"] for hit in st.rank(query, documents)]
    assert [r.index for r in scorer.rerank(query, documents)] == st_order


def test_one_token_folder(st_folders: dict[str, Path]) -> None:
    folder = str(st_folders["one"])
    st = CrossEncoder(folder, device="cpu")
    raw = st.predict(PAIRS, activation_fn=torch.nn.Identity()).tolist()

    logit = GenerativeScorer(folder, device="cpu", dtype="float32", score_mode="logit")
    assert logit.label_token_ids == [YES]
    assert [p.token_ids for q, d in PAIRS for p in logit.encode(q, [d])] == _st_prompt_ids(st, PAIRS)
    assert logit.score_pairs(PAIRS) == pytest.approx(raw, abs=1e-5)

    default = GenerativeScorer.from_model(logit.model, logit.tokenizer, model=folder)
    assert default.score_mode == "logit-sigmoid"
    assert default.score_pairs(PAIRS) == pytest.approx([1 / (1 + math.exp(-x)) for x in raw], abs=1e-5)
    assert default.score_pairs(PAIRS) == pytest.approx(st.predict(PAIRS).tolist(), abs=1e-5)
    with pytest.raises(ValueError, match="needs two or more"):
        GenerativeScorer.from_model(logit.model, logit.tokenizer, model=folder, score_mode="label-softmax")


def test_template_without_both_roles_is_refused(st_folders: dict[str, Path], tmp_path: Path) -> None:
    base = make_tiny_model(tmp_path / "base")
    transformer = Transformer(str(base), transformer_task="text-generation")
    # Renders the document only: there is no place for the query.
    transformer.tokenizer.chat_template = (
        "{% for m in messages %}{% if m.role == 'document' %}{{ m.content }}{% endif %}{% endfor %}"
    )
    CrossEncoder(modules=[transformer, LogitScore(true_token_id=YES)]).save(str(tmp_path / "st"))
    with pytest.raises(ValueError, match="renders the 'query' message's text 0 times"):
        GenerativeScorer(str(tmp_path / "st"), device="cpu", dtype="float32")


def test_detection_order(
    st_folders: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from transformers import AutoTokenizer

    from genscore_core import MXBAI_RERANK_V2, QWEN3_RERANKER
    from genscore_core.recipes import resolve_recipe

    folder = st_folders["two"]
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    # A name genscore knows wins over the sentence-transformers configuration beside it.
    named = tmp_path / "mxbai-rerank-large-v2"
    named.symlink_to(folder, target_is_directory=True)
    assert resolve_recipe("auto", str(named), tokenizer).template is MXBAI_RERANK_V2
    # An explicit template wins over everything, and says so.
    explicit = resolve_recipe("qwen3-reranker", str(folder), tokenizer)
    assert explicit.template is QWEN3_RERANKER and "template= setting" in explicit.source
    # Nothing known: a Qwen3 model gets Qwen3-Reranker's recipe quietly, another model with a warning.
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with caplog.at_level("WARNING", logger="genscore_core.recipes"):
        fallback = resolve_recipe("auto", str(plain), tokenizer)
    assert fallback.template is QWEN3_RERANKER
    assert "nothing in the model named a recipe" in fallback.source
    assert "the path names no known reranker, the folder has no sentence-transformers" in caplog.text


# Llama 3's chat template writes every message as ``message['content'] | trim``: whitespace around a
# text never reaches the model, and retrieved chunks often end in a newline.
TRIMMING_TEMPLATE = (
    "<|im_start|>system\nJudge whether the document answers the query. Answer yes or no.<|im_end|>\n"
    "<|im_start|>user\n"
    "{% for m in messages %}{% if m.role == 'query' %}<Query>: {{ m.content | trim }}{% endif %}{% endfor %}\n"
    "{% for m in messages %}{% if m.role == 'document' %}<Document>: {{ m.content | trim }}{% endif %}{% endfor %}"
    "<|im_end|>\n<|im_start|>assistant\n"
)
PADDED_PAIRS = [
    ("capital of France", " "),
    ("  capital of France\n", "Paris is the capital of France.\n"),
    ("capital of France", "  Berlin  "),
    ("\tquantum ", "\n\nphotons and energy\n\n"),
    ("rivers", "The Seine flows through Paris."),
]


@pytest.mark.slow
def test_a_template_that_trims_the_texts_is_followed(tmp_path: Path) -> None:
    base = make_tiny_model(tmp_path / "base", seed=3)
    folder = str(_save(base, tmp_path / "trimming", (YES, NO), TRIMMING_TEMPLATE))
    scorer = GenerativeScorer(folder, device="cpu", dtype="float32")
    st = CrossEncoder(folder, device="cpu")
    expected = _st_prompt_ids(st, PADDED_PAIRS)
    # The texts' whitespace changes the prompt ids unless it is trimmed as the template trims it.
    assert len({tuple(ids) for ids in expected}) == len(expected)
    assert [p.token_ids for q, d in PADDED_PAIRS for p in scorer.encode(q, [d])] == expected
    log_odds = st.predict(PADDED_PAIRS, activation_fn=torch.nn.Identity()).tolist()
    assert scorer.score_pairs(PADDED_PAIRS) == pytest.approx(
        [1 / (1 + math.exp(-x)) for x in log_odds], abs=1e-5
    )


def test_a_template_that_escapes_the_texts_is_refused(tmp_path: Path) -> None:
    base = make_tiny_model(tmp_path / "base")
    escaping = TRIMMING_TEMPLATE.replace("m.content | trim", "m.content | e")
    folder = _save(base, tmp_path / "escaping", (YES, NO), escaping)
    with pytest.raises(
        ValueError, match="changes the query or document it inserts beyond trimming whitespace"
    ):
        GenerativeScorer(str(folder), device="cpu", dtype="float32")


def _long(tag: str, words: int) -> str:
    """A text of ``words`` distinct words over many lines (a few thousand characters)."""
    return " ".join(f"{tag}{i}" + ("\n" if i % 15 == 14 else "") for i in range(words)).strip()


# Long texts, past 2,000 characters: the short probes did not show a template that cuts or branches on
# length, and a 640-character document scored 0.62171 against CrossEncoder.predict's 0.34747.
LONG_PAIRS = [
    ("capital of France " + _long("q", 40), "Paris. " + _long("doc", 450)),
    (_long("query", 300), "short document"),
    ("rivers", _long("seine", 380) + " The end."),
]


@pytest.mark.slow
def test_long_texts_score_as_cross_encoder_predict(st_folders: dict[str, Path]) -> None:
    assert min(len(q) + len(d) for q, d in LONG_PAIRS) > 2_000
    folder = str(st_folders["two"])
    scorer = GenerativeScorer(folder, device="cpu", dtype="float32")
    st = CrossEncoder(folder, device="cpu")
    assert [p.token_ids for q, d in LONG_PAIRS for p in scorer.encode(q, [d])] == _st_prompt_ids(
        st, LONG_PAIRS
    )
    assert scorer.score_pairs(LONG_PAIRS) == pytest.approx(st.predict(LONG_PAIRS).tolist(), abs=1e-5)


def _with_template(source: Path, out: Path, template: str) -> Path:
    """A copy of the folder ``source`` (its large files linked) whose chat template is ``template``."""
    for path in source.rglob("*"):
        target = out / path.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            target.mkdir(exist_ok=True)
        elif path.name in ("model.safetensors", "tokenizer.json"):
            target.symlink_to(path.resolve())
        else:
            target.write_bytes(path.read_bytes())
    (out / "chat_template.jinja").write_text(template)
    return out


@pytest.mark.parametrize(
    "change",
    [
        "m.content[:200]",  # keeps the first 200 characters
        "(m.content if m.content | length < 1500 else m.content[:1500])",  # cuts texts past 1,500
        "(m.content if m.content | length < 5000 else m.content | upper)",  # changes texts past 5,000
    ],
)
def test_a_template_that_cuts_or_branches_on_length_is_refused(
    st_folders: dict[str, Path], tmp_path: Path, change: str
) -> None:
    from genscore_core import ModelFolderError

    cutting = CHAT_TEMPLATE.replace("Document:{{ m.content }}", "Document:{{ " + change + " }}")
    assert cutting != CHAT_TEMPLATE
    folder = _with_template(st_folders["two"], tmp_path / "cutting", cutting)
    with pytest.raises(ModelFolderError) as caught:
        GenerativeScorer(str(folder), device="cpu", dtype="float32")
    message = str(caught.value)
    assert message.startswith(
        f"model {str(folder)!r}: chat_template.jinja: the chat template does not carry a "
    )
    assert "cuts long texts, branches on their length or changes them" in message
    assert (caught.value.folder, caught.value.file) == (str(folder), "chat_template.jinja")


@pytest.mark.slow
def test_what_a_cutting_template_made_cross_encoder_score(
    st_folders: dict[str, Path], tmp_path: Path
) -> None:
    """Why it is refused: CrossEncoder.predict scores the prompt the template cut, not the document
    given, so no prompt genscore builds from the whole document reproduces its score."""
    cutting = CHAT_TEMPLATE.replace("Document:{{ m.content }}", "Document:{{ m.content[:200] }}")
    st = CrossEncoder(str(_with_template(st_folders["two"], tmp_path / "cutting", cutting)), device="cpu")
    pair = LONG_PAIRS[0]
    prompt = st.tokenizer.decode(_st_prompt_ids(st, [pair])[0])
    assert pair[1][:200] in prompt and pair[1][:201] not in prompt
