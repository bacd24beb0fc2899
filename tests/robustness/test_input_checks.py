"""Bad input is refused with an error naming the field and position, never a crash or a silent answer."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from transformers import AutoModelForCausalLM, BertConfig, BertModel, BertTokenizerFast

from genscore_core import GenerativeScorer, InvalidRequestError, PromptTemplate
from genscore_core.loading import NotARerankerError
from genscore_core.prompts import EncodedPrompt
from genscore_core.results import rank_results
from genscore_integrations.langchain import GenerativeCrossEncoder

LABELS = [9693, 2152]


def _request(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {"query": "q", "items": ["a", "b"], "label_token_ids": LABELS}
    fields.update(overrides)
    return fields


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"label_token_ids": [True, False]}, "label_token_ids"),
        ({"label_token_ids": ["9693", "2152"]}, "label_token_ids"),
        ({"label_token_ids": [9693.0, 2152]}, "label_token_ids"),
        ({"items": [[1, True]]}, "items"),
        ({"items": [[1.0, 2]]}, "items"),
        ({"items": [["5", 2]]}, "items"),
        ({"query": [1, False]}, "query"),
        ({"query": [7.0]}, "query"),
        ({"query": 5}, "query"),
    ],
)
def test_token_ids_are_strict_integers(
    scorer: GenerativeScorer, overrides: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        scorer.score(_request(**overrides))
    assert {error["loc"][0] for error in caught.value.errors()} == {field}


def test_strict_ids_still_accept_integers(scorer: GenerativeScorer) -> None:
    answer = scorer.score(_request(query=[100, 200], items=[[300], [400, 500]]))
    assert [entry.index for entry in answer.data] == [0, 1]


def test_nan_scores_rank_last_and_never_hide_the_best() -> None:
    prompts = [EncodedPrompt([1], False) for _ in range(4)]
    scored = list(zip([0.1, math.nan, 0.9, 0.5], prompts))
    ranked = rank_results("q", ["a", "b", "c", "d"], scored, top_n=2)
    assert [r.index for r in ranked] == [2, 3]
    everything = rank_results("q", ["a", "b", "c", "d"], scored)
    assert [r.index for r in everything] == [2, 3, 0, 1]


BAD = "fine text \ud800 more"


def _assert_names(error: InvalidRequestError, param: str, index: int | None) -> None:
    assert error.param == param
    assert error.index == index
    assert "U+D800" in error.message
    where = f"{param}[{index}]" if index is not None else param
    assert where in error.message


@pytest.mark.parametrize(
    ("call", "param", "index"),
    [
        (lambda s: s.rerank("query", ["ok", BAD]), "documents", 1),
        (lambda s: s.rerank(BAD, ["ok"]), "query", None),
        (lambda s: s.score_documents("query", ["ok", "ok", BAD]), "documents", 2),
        (lambda s: s.encode("q", [BAD]), "documents", 0),
        (lambda s: s.score(_request(items=["ok", "ok", BAD])), "items", 2),
        (lambda s: s.score(_request(query="\udfff")), "query", None),
    ],
)
def test_lone_surrogates_are_invalid_requests(
    scorer: GenerativeScorer, call: Any, param: str, index: int | None
) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        call(scorer)
    assert caught.value.param == param
    assert caught.value.index == index
    where = f"{param}[{index}]" if index is not None else param
    assert where in caught.value.message
    assert "lone surrogate" in caught.value.message


async def test_lone_surrogates_are_invalid_requests_async(scorer: GenerativeScorer) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        await scorer.arerank("query", ["ok", BAD])
    assert (caught.value.param, caught.value.index) == ("documents", 1)


# A caller of score_pairs has no "query" or "documents" variable: naming its bad text so ("documents[3]
# must be a string") sent them looking for one, while a bad score of the same call said "pairs[3]".
_PAIR_CALLS = [
    lambda s, pairs: s.score_pairs(pairs),
    lambda s, pairs: asyncio.run(s.ascore_pairs(pairs)),
    lambda s, pairs: s.prepare_pairs(pairs),
    lambda s, pairs: GenerativeCrossEncoder(scorer=s).score(pairs),
    lambda s, pairs: asyncio.run(GenerativeCrossEncoder(scorer=s).ascore(pairs)),
]


@pytest.mark.parametrize("call", _PAIR_CALLS)
@pytest.mark.parametrize(
    ("pairs", "index", "where", "problem"),
    [
        ([("q", "ok"), ("q", 3)], 1, "pairs[1][1] (the document)", "must be a string, got int"),
        ([("q", "ok"), (None, "ok")], 1, "pairs[1][0] (the query)", "must be a string, got NoneType"),
        ([("q", "ok"), ("q", "ok"), ("q", BAD)], 2, "pairs[2][1] (the document)", "is not valid text"),
        ([(BAD, "ok")], 0, "pairs[0][0] (the query)", "is not valid text"),
    ],
)
def test_bad_text_in_pairs_is_named_as_the_caller_passed_it(
    scorer: GenerativeScorer, call: Any, pairs: list[Any], index: int, where: str, problem: str
) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        call(scorer, pairs)
    assert caught.value.message.startswith(f"{where} {problem}"), caught.value.message
    assert (caught.value.param, caught.value.index) == ("pairs", index)


def test_encode_of_no_documents_is_empty(scorer: GenerativeScorer) -> None:
    assert scorer.encode("query", []) == []
    assert scorer.score_pairs([]) == []
    assert len(scorer.rerank("query", [])) == 0


# -- models and tokenizers that cannot rerank ---------------------------------------------------------

_BERT_WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "capital", "of", "france", "paris", "is"]


def _bert_config(tokenizer: BertTokenizerFast) -> BertConfig:
    return BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
    )


def _bert_tokenizer(extra: list[str]) -> BertTokenizerFast:
    return BertTokenizerFast(vocab={word: i for i, word in enumerate(_BERT_WORDS + extra)})


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An encoder (BertModel) saved with its tokenizer: what a user might point genscore at by mistake."""
    folder = tmp_path_factory.mktemp("bert")
    tokenizer = _bert_tokenizer(["yes", "no"])
    tokenizer.save_pretrained(str(folder))
    config = _bert_config(tokenizer)
    BertModel(config).save_pretrained(str(folder))
    return folder


def test_an_encoder_folder_is_refused(bert_dir: Path) -> None:
    with pytest.raises(NotARerankerError) as caught:
        GenerativeScorer(str(bert_dir), device="cpu")
    message = str(caught.value)
    assert "BertModel" in message  # what was found
    assert "causal language model" in message  # what is expected


def test_an_encoder_that_loads_as_a_causal_lm_is_refused_as_not_causal(tmp_path: Path) -> None:
    # A masked-LM folder whose config.json has no "architectures" loads as BertLMHeadModel, which
    # attends both ways unless is_decoder is set: every check passed and it was scored, the
    # "next-token" logits reading the whole prompt.
    import json

    from transformers import BertForMaskedLM

    tokenizer = _bert_tokenizer(["yes", "no"])
    folder = tmp_path / "bert-mlm"
    config = _bert_config(tokenizer)
    BertForMaskedLM(config).save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    settings = json.loads((folder / "config.json").read_text())
    del settings["architectures"]
    (folder / "config.json").write_text(json.dumps(settings))
    template = PromptTemplate(name="t", body="{query} [SEP] {document}", label_words=("yes", "no"))
    with pytest.raises(
        NotARerankerError, match=r"\(BertLMHeadModel\) is not causal: the output at a prompt's first"
    ):
        GenerativeScorer(str(folder), device="cpu", template=template)
    lm = AutoModelForCausalLM.from_pretrained(str(folder))
    lm.train()
    with pytest.raises(NotARerankerError, match="is not causal"):
        GenerativeScorer.from_model(lm, tokenizer, template=template)
    assert lm.training  # the check leaves the model's mode as it found it
    # The same folder saying it is a decoder is causal, and scores.
    settings["is_decoder"] = True
    (folder / "config.json").write_text(json.dumps(settings))
    scorer = GenerativeScorer(str(folder), device="cpu", template=template)
    assert 0.0 <= scorer.score_pairs([("yes", "no")])[0] <= 1.0


def test_a_checkpoint_missing_its_head_is_refused(bert_dir: Path, tmp_path: Path) -> None:
    # The config claims a causal LM, but the weights are an encoder's: the head would be random.
    import json

    folder = tmp_path / "relabelled"
    folder.mkdir()
    for path in bert_dir.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["BertLMHeadModel"]
    config["is_decoder"] = True
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        NotARerankerError, match=r"lacks \d+ weight\(s\) of BertLMHeadModel \(cls\.predictions"
    ):
        GenerativeScorer(str(folder), device="cpu")


@pytest.fixture(scope="module")
def tiny_lm(tiny_model_dir: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))


def test_a_tokenizer_without_the_label_words_is_refused(tiny_lm: Any) -> None:
    tokenizer = _bert_tokenizer([])
    with pytest.raises(NotARerankerError) as caught:
        GenerativeScorer.from_model(tiny_lm, tokenizer, template="qwen3-reranker")
    message = str(caught.value)
    assert "'yes' is the unknown token '[UNK]'" in message
    assert "Expected every label word ['yes', 'no']" in message


def test_label_words_on_one_token_are_refused(tiny_lm: Any) -> None:
    tokenizer = _bert_tokenizer(["yes", "no"])  # uncased: "YES" is "yes"
    template = PromptTemplate(name="shouting", body="{query} {document}", label_words=("yes", "YES"))
    with pytest.raises(NotARerankerError, match=r"same token id \('yes' -> 11, 'YES' -> 11\)"):
        GenerativeScorer.from_model(tiny_lm, tokenizer, template=template)


def test_the_tiny_reranker_still_loads(tiny_model_dir: Path) -> None:
    scorer = GenerativeScorer(str(tiny_model_dir), device="cpu", max_length=128)
    assert scorer.label_token_ids == LABELS
