"""``genscore serve --api-key`` / ``GENSCORE_API_KEY``: every path but /health and the API description
needs ``Authorization: Bearer <key>``; a request without it is a 401 that reaches nothing else."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from genscore_core import GenerativeScorer
from genscore_core.cli_args import SERVER_API_KEY_ENV
from genscore_core.errors import ConfigurationError, RemoteConfigurationError
from genscore_core.server import create_app
from genscore_core.server.cli import API_KEY_ENV, add_serve_command, api_key_setting, exposure_warning
from tests.helpers.recipe_ranking import SCORE_TOLERANCE, RecipeReference
from tests.helpers.server import (
    SEED_TEXT_REQUEST,
    TEST_LIMITS,
    free_port,
    serve_in_thread,
    stop_server_process,
    wait_healthy,
)

GENSCORE = shutil.which("genscore")
KEY = "sk-genscore-test-5f1c9a"
PAIRS = [
    ("What is the capital of France?", "Paris is the capital and largest city of France."),
    ("What is the capital of France?", "Berlin is the capital of Germany."),
    ("Which river flows through Paris?", "The Seine flows through Paris."),
]
SCORING_ROUTES = [
    ("POST", "/generative_scoring", SEED_TEXT_REQUEST),
    ("POST", "/generative_score", SEED_TEXT_REQUEST),
    ("POST", "/v1/rerank", {"query": "q", "documents": ["a", "b"]}),
    ("POST", "/v2/rerank", {"query": "q", "documents": ["a", "b"]}),
    ("POST", "/rerank", {"query": "q", "documents": ["a", "b"]}),
    ("GET", "/v1/models", None),
    ("GET", "/stats", None),
]


@pytest.fixture(scope="module")
def keyed_url(tiny_model_dir: Path) -> Iterator[str]:
    """A real ``genscore serve`` process on loopback, given its key by the environment (off ``ps``)."""
    assert GENSCORE is not None, "the genscore console script is not installed"
    port = free_port()
    command = [GENSCORE, "serve", "--model", str(tiny_model_dir), "--port", str(port), "--device", "cpu",
               "--dtype", "float32", "--max-length", "512", "--log-level", "warning"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.getcwd(), API_KEY_ENV: KEY}
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, timeout=120, alive=lambda: process.poll() is None)  # /health needs no key
        assert KEY not in " ".join(command)
        yield url
    finally:
        stop_server_process(process)


def _remote(model_dir: Path, url: str, kind: str, key: str | None) -> GenerativeScorer:
    return GenerativeScorer(
        str(model_dir),
        server_url=url,
        server_kind=kind,
        server_api_key=key,
        max_length=512,
        server_max_retries=0,
    )


@pytest.mark.parametrize("kind", ["genscore", "rerank"])
def test_a_remote_scorer_with_the_key_scores_as_the_recipe(
    tiny_model_dir: Path, keyed_url: str, kind: str
) -> None:
    expected = RecipeReference(tiny_model_dir).pair_scores(PAIRS)
    with _remote(tiny_model_dir, keyed_url, kind, KEY) as remote:
        assert remote.score_pairs(PAIRS) == pytest.approx(expected, abs=SCORE_TOLERANCE)


@pytest.mark.parametrize("kind", ["genscore", "rerank"])
@pytest.mark.parametrize("key", [None, "sk-not-the-key"], ids=["no-key", "wrong-key"])
def test_a_remote_scorer_without_the_key_is_told_to_check_server_api_key(
    tiny_model_dir: Path, keyed_url: str, kind: str, key: str | None
) -> None:
    with (
        _remote(tiny_model_dir, keyed_url, kind, key) as remote,
        pytest.raises(RemoteConfigurationError) as caught,
    ):
        remote.score_pairs(PAIRS)
    assert caught.value.status == 401 and caught.value.setting == "server_api_key"
    assert "server_api_key" in str(caught.value)


def _assert_401(response: httpx.Response, message: str) -> None:
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    body = response.json()
    assert body["error"] == {
        "message": body["detail"],
        "type": "AuthenticationError",
        "param": None,
        "code": 401,
    }
    assert message in body["detail"]
    assert KEY not in response.text


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({}, "this server requires an API key: send it as Authorization: Bearer <key>"),
        ({"Authorization": "Bearer sk-not-the-key"}, "is not this server's"),
        ({"Authorization": f"Bearer {KEY}x"}, "is not this server's"),  # the key as a prefix is not the key
        ({"Authorization": f"Bearer {KEY[:-1]}"}, "is not this server's"),
        ({"Authorization": f"Basic {KEY}"}, "must be one 'Bearer <key>'"),
        ({"Authorization": "Bearer"}, "must be one 'Bearer <key>'"),
        ({"Authorization": KEY}, "must be one 'Bearer <key>'"),
    ],
    ids=["none", "wrong", "longer", "shorter", "basic", "no-token", "no-scheme"],
)
@pytest.mark.parametrize(("method", "path", "body"), SCORING_ROUTES, ids=[p for _, p, _ in SCORING_ROUTES])
def test_every_route_but_health_answers_401_without_the_key(
    keyed_url: str, method: str, path: str, body: Any, headers: dict[str, str], message: str
) -> None:
    response = httpx.request(method, f"{keyed_url}{path}", json=body, headers=headers, timeout=30)
    _assert_401(response, message)


def test_health_and_the_api_description_need_no_key_and_the_rest_works_with_it(keyed_url: str) -> None:
    assert httpx.get(f"{keyed_url}/health", timeout=30).json() == {"status": "ok"}
    assert httpx.head(f"{keyed_url}/health", timeout=30).status_code == 200
    spec = httpx.get(f"{keyed_url}/openapi.json", timeout=30).json()
    for _, path, _ in SCORING_ROUTES:
        listed = next(iter(spec["paths"][path].values()))["responses"]
        assert "401" in listed, path  # the description lists the refusal
    authorized = {"Authorization": f"bearer {KEY}"}  # the scheme is case-insensitive (RFC 9110)
    for method, path, body in SCORING_ROUTES:
        response = httpx.request(method, f"{keyed_url}{path}", json=body, headers=authorized, timeout=60)
        assert response.status_code == 200, (path, response.text)
    # A path the server does not have is refused too: no key, no map of the server.
    _assert_401(httpx.get(f"{keyed_url}/no-such-path", timeout=30), "requires an API key")


def test_a_refused_request_reaches_neither_the_tokenizer_nor_the_engine(scorer: GenerativeScorer) -> None:
    app = create_app(scorer, TEST_LIMITS, api_key=KEY)
    with serve_in_thread(app) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        tokenizer = scorer.front_end._tokenizer_lock
        with tokenizer:  # a request that got past the key would wait here; a refused one does not
            for _, path, body in SCORING_ROUTES[:3]:
                _assert_401(http.post(path, json=body), "requires an API key")
        stats = http.get("/stats", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert (stats["requests"], stats["tokenized_requests"], stats["in_flight"]) == (0, 0, 0)


# -- where the key comes from --------------------------------------------------------------------------


def _serve_args(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_command(parser.add_subparsers())
    return parser.parse_args(["serve", "--model", "m", *flags])


def test_the_flag_wins_over_the_environment_and_no_key_serves_open() -> None:
    assert api_key_setting(_serve_args("--api-key", "from-flag"), {API_KEY_ENV: "from-env"}) == "from-flag"
    assert api_key_setting(_serve_args(), {API_KEY_ENV: "from-env"}) == "from-env"
    assert api_key_setting(_serve_args(), {}) is None


@pytest.mark.parametrize(
    ("flags", "environ", "message"),
    [
        (("--api-key", ""), {}, "--api-key is set but empty"),
        ((), {API_KEY_ENV: ""}, f"{API_KEY_ENV} is set but empty"),
        (("--api-key", "two words"), {}, "--api-key: the key must be printable ASCII without spaces"),
        ((), {API_KEY_ENV: "clé"}, f"{API_KEY_ENV}: the key must be printable ASCII without spaces"),
        ((), {API_KEY_ENV: "key\n"}, f"{API_KEY_ENV}: the key must be printable ASCII without spaces"),
    ],
)
def test_a_key_that_cannot_work_is_refused_before_serving(
    flags: tuple[str, ...], environ: dict[str, str], message: str
) -> None:
    # An empty key (a variable that expanded to nothing) would otherwise serve without one.
    with pytest.raises(ConfigurationError, match=message):
        api_key_setting(_serve_args(*flags), environ)


def test_create_app_refuses_a_key_that_cannot_be_sent(scorer: GenerativeScorer) -> None:
    with pytest.raises(ValueError, match="api_key: the key is empty"):
        create_app(scorer, TEST_LIMITS, api_key="")


def test_only_a_server_open_to_the_network_without_a_key_is_warned_about() -> None:
    warning = exposure_warning("0.0.0.0", 8000, None)
    assert warning is not None and "anyone who can reach port 8000" in warning
    assert f"--api-key or {API_KEY_ENV}" in warning
    assert exposure_warning("0.0.0.0", 8000, KEY) is None
    assert exposure_warning("127.0.0.1", 8000, None) is None
    assert exposure_warning("::1", 8000, None) is None


def test_genscore_rerank_takes_the_server_key_from_the_environment(
    tiny_model_dir: Path, keyed_url: str
) -> None:
    # Off the process list: GENSCORE_SERVER_API_KEY gives --server-url its key; without it, a 401.
    command = [GENSCORE, "rerank", "--model", str(tiny_model_dir), "--server-url", keyed_url, "--max-length", "512",
               "--server-max-retries", "0", "--query", PAIRS[0][0], "--format", "text"]  # fmt: skip
    stdin = "".join(f"{document}\n" for _, document in PAIRS[:2])
    env = {k: v for k, v in os.environ.items() if k not in (SERVER_API_KEY_ENV, API_KEY_ENV)}
    env["PYTHONPATH"] = os.getcwd()
    keyed = subprocess.run([str(c) for c in command], input=stdin, capture_output=True, text=True, timeout=300,
                           env={**env, SERVER_API_KEY_ENV: KEY})  # fmt: skip
    assert keyed.returncode == 0, keyed.stderr
    got = {row["index"]: row["score"] for row in map(json.loads, keyed.stdout.splitlines())}
    expected = RecipeReference(tiny_model_dir).pair_scores(PAIRS[:2])
    assert [got[0], got[1]] == pytest.approx(expected, abs=SCORE_TOLERANCE)
    refused = subprocess.run([str(c) for c in command], input=stdin, capture_output=True, text=True, timeout=300,
                             env=env)  # fmt: skip
    assert refused.returncode != 0 and "server_api_key" in refused.stderr
    # The flag wins over the environment.
    flagged = subprocess.run([str(c) for c in [*command, "--server-api-key", "sk-not-the-key"]], input=stdin,
                             capture_output=True, text=True, timeout=300, env={**env, SERVER_API_KEY_ENV: KEY})  # fmt: skip
    assert flagged.returncode != 0 and "server_api_key" in flagged.stderr
