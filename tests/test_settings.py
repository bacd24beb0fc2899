"""The typed settings: a ScorerConfig is the model, its PromptSettings and exactly one of LocalSettings
or ServerSettings; the flat keywords of before land in their part; a scorer saves, compares and
pickles its own settings."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from genscore_core import (
    ConfigurationError,
    GenerativeScorer,
    LocalSettings,
    PromptSettings,
    ScorerConfig,
    ServerSettings,
    scorer_setting_names,
)
from genscore_core.config import SETTING_FIELDS
from tests.helpers.recipe_ranking import RecipeReference

SERVER = "http://127.0.0.1:9"  # nothing listens: a server scorer loads only its tokenizer until it scores


def test_flat_keywords_land_in_their_part() -> None:
    config = ScorerConfig(model="m", max_length=512, query_share=0.5, device="cpu", forward="padded")
    assert config.prompt == PromptSettings(max_length=512, query_share=0.5)
    assert config.run == LocalSettings(device="cpu", forward="padded")
    assert config.local is config.run and config.server is None
    assert config == ScorerConfig(
        model="m",
        prompt=PromptSettings(max_length=512, query_share=0.5),
        run=LocalSettings(device="cpu", forward="padded"),
    )
    remote = ScorerConfig(server_url=SERVER + "/", server_timeout=5, server_kind="vllm", max_length=64)
    assert remote.run == ServerSettings(url=SERVER, timeout=5, kind="vllm")
    assert remote.server is remote.run and remote.local is None and remote.prompt.max_length == 64
    # The given ones, by their flat names (what the command lines pass on).
    assert remote.given_settings() == {"server_url", "server_timeout", "server_kind", "max_length"}


def test_the_flat_names_are_the_settings_of_every_part() -> None:
    flat = set(SETTING_FIELDS)
    parts = {
        *PromptSettings.model_fields,
        *LocalSettings.model_fields,
        *(f"server_{name}" for name in ServerSettings.model_fields),
        "model",
        "trust_remote_code",
        "show_progress",
        "result_cache_bytes",
    }
    assert flat == parts and len(flat) == 29
    assert scorer_setting_names() == {*flat, "config", "prompt", "run"}


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"device": "cpu"}, "device"),
        ({"dtype": "float16", "max_batch_size": 8}, "dtype"),
        ({"forward": "packed"}, "forward"),
    ],
)
def test_a_local_setting_with_a_server_is_refused_naming_it(given: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigurationError, match=f"{named}=.* with server_url") as caught:
        ScorerConfig(server_url=SERVER, **given)
    assert caught.value.setting == named
    # The typed form cannot say it at all: a server has no such field.
    with pytest.raises(ValidationError, match=named):
        ServerSettings(url=SERVER, **given)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match=named):
        ScorerConfig(run={"url": SERVER, **given})


def test_a_server_setting_without_a_server_is_refused_naming_it() -> None:
    with pytest.raises(ConfigurationError, match="server_api_key is set without server_url") as caught:
        ScorerConfig(server_api_key="secret")
    assert caught.value.setting == "server_api_key"
    with pytest.raises(ValidationError, match="timeout"):
        LocalSettings(timeout=5)  # type: ignore[call-arg]


def test_a_setting_given_both_flat_and_typed_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="max_length given with prompt=") as caught:
        ScorerConfig(prompt=PromptSettings(), max_length=5)
    assert caught.value.setting == "max_length"
    with pytest.raises(ConfigurationError, match="server_url given with run="):
        ScorerConfig(run=LocalSettings(), server_url=SERVER, server_timeout=5)


def test_defaults_of_the_part_not_in_use_are_dropped() -> None:
    # A dump of every setting of before (a manifest, an older adapter's model_dump) loads again.
    local = ScorerConfig(max_length=90, device="cpu")
    every = local.to_settings(every=True)
    assert set(every) == set(SETTING_FIELDS) and every["server_url"] is None
    assert ScorerConfig(**every) == local
    remote = ScorerConfig(server_url=SERVER, server_api_key="k", max_length=90)
    every = remote.to_settings(every=True)
    assert every["device"] is None and ScorerConfig(**every) == remote


def test_a_validation_error_names_the_flat_setting() -> None:
    with pytest.raises(ValidationError) as caught:
        ScorerConfig(max_batch_tokens=0, query_share=2.0)
    assert [error["loc"] for error in caught.value.errors()] == [("query_share",), ("max_batch_tokens",)]
    with pytest.raises(ValidationError) as caught:
        ScorerConfig(server_url=SERVER, server_timeout=0)
    assert [error["loc"] for error in caught.value.errors()] == [("server_timeout",)]


def test_the_typed_config_round_trips_as_data() -> None:
    config = ScorerConfig(model="m", server_url=SERVER, server_api_key="k", template="qwen3-reranker")
    assert ScorerConfig.model_validate(config.model_dump()) == config
    assert pickle.loads(pickle.dumps(config)) == config
    assert ScorerConfig(**config.to_settings()) == config
    # JSON: the secret masked, so a saved form leaves it out.
    assert config.to_settings(mode="json")["server_api_key"] == "**********"


def test_a_scorer_pickles_as_its_settings(tiny_model_dir: Path) -> None:
    scorer = GenerativeScorer(str(tiny_model_dir), device="cpu", dtype="float32", max_length=90)
    copied = pickle.loads(pickle.dumps(scorer))
    assert copied is not scorer and copied.model is not scorer.model
    assert copied.config == scorer.config and copied.settings() == scorer.settings()
    texts = ["Paris is the capital of France.", "Berlin is in Germany.", "A cat sat on the mat."]
    want = RecipeReference(tiny_model_dir).scores("capital of France", texts, max_length=90)
    assert copied.score_documents("capital of France", texts) == pytest.approx(want, abs=1e-5)
    # A copy of what holds a scorer shares it: a loaded model is not copied.
    assert copy.deepcopy(scorer) is scorer
    assert copy.deepcopy({"scorer": scorer})["scorer"] is scorer


def test_a_server_scorer_pickles_with_its_key_and_saves_without_it(tiny_model_dir: Path) -> None:
    scorer = GenerativeScorer.from_server(SERVER, model=tiny_model_dir, server_api_key="k", server_timeout=5)
    saved = scorer.settings()
    assert "server_api_key" not in saved and saved["server_timeout"] == 5 and "device" not in saved
    assert scorer.settings(secrets=True)["server_api_key"] == SecretStr("k")
    copied = pickle.loads(pickle.dumps(scorer))
    assert copied.config == scorer.config
    assert copied.config.server is not None and copied.config.server.api_key == SecretStr("k")


def test_the_scorer_names_the_settings_that_differ(scorer: GenerativeScorer) -> None:
    same = {"max_length": 512, "device": "cpu", "dtype": "float32", "server_timeout": 60, "server_url": None}
    assert scorer.differing_settings(same) == []
    assert scorer.differing_settings({**same, "max_length": 90, "device": "cuda"}) == ["device", "max_length"]
    assert scorer.differing_settings({"prompt": PromptSettings(max_length=512)}) == []
    assert scorer.differing_settings({"run": {"url": SERVER}, "query_share": 2}) == ["query_share", "run"]
    assert scorer.differing_settings({"config": scorer.config}) == []
