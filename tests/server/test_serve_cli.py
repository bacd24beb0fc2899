"""``genscore serve`` as users start it (the console script, in a subprocess), answering the seed's curls."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from genscore_core import GenerativeScorer
from tests.helpers.server import (
    SEED_EMPTY_ITEMS_ERROR,
    SEED_EMPTY_ITEMS_REQUEST,
    SEED_TEXT_REQUEST,
    SEED_TOKEN_REQUEST,
    genscore_serve_process,
)

GENSCORE = shutil.which("genscore")
CURL = shutil.which("curl")


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[str]:
    assert GENSCORE is not None, "the genscore console script is not installed"
    with genscore_serve_process([GENSCORE], tiny_model_dir) as (url, _):
        yield url


def curl(url: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The seed's curl command line, verbatim apart from host and port."""
    assert CURL is not None
    result = subprocess.run(
        [CURL, "-s", "-w", "\n%{http_code}", "-X", "POST", f"{url}{path}",
         "-H", "Content-Type: application/json", "-d", json.dumps(body)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    text, _, status = result.stdout.rpartition("\n")
    return int(status), json.loads(text)


@pytest.mark.slow
@pytest.mark.skipif(CURL is None, reason="curl is not installed")
def test_seed_curl_examples_against_genscore_serve(served: str, scorer: GenerativeScorer) -> None:
    for request in (SEED_TEXT_REQUEST, SEED_TOKEN_REQUEST):
        status, body = curl(served, "/generative_score", request)
        assert status == 200, body
        assert body["object"] == "list" and body["id"].startswith("generative-score-")
        assert [d["index"] for d in body["data"]] == list(range(len(request["items"])))
        expected = [d.score for d in scorer.score(request).data]
        # Another process, same model and kernels: the same numbers.
        assert [d["score"] for d in body["data"]] == pytest.approx(expected, abs=1e-6)
    status, body = curl(served, "/generative_score", SEED_EMPTY_ITEMS_REQUEST)
    # The seed's error object, and its message again as "detail" (for Jina-style clients).
    assert (status, body) == (
        400,
        {**SEED_EMPTY_ITEMS_ERROR, "detail": "items must contain at least one item."},
    )
    missing = {k: v for k, v in SEED_TEXT_REQUEST.items() if k != "label_token_ids"}
    status, body = curl(served, "/generative_scoring", missing)
    assert status == 422 and "label_token_ids" in body["error"]["message"]


def test_serve_freezes_what_it_loaded_out_of_garbage_collection(served: str) -> None:
    # A full collection walks every tracked object; the loaded scorer's (torch, transformers, the
    # tokenizer: well over 100,000 of them) are frozen before serving, so collections skip them.
    stats = httpx.get(served + "/stats", timeout=30).json()
    assert stats["gc"]["frozen_objects"] > 100_000, stats["gc"]
    assert len(stats["gc"]["collections"]) == 3


def test_serve_on_a_port_in_use_fails_at_once_with_exit_code_2(tiny_model_dir: Path) -> None:
    # Before: the model was loaded first, then uvicorn failed to bind, logged the errno and exited
    # with its own code 3 (genscore's code for an unreachable scoring server).
    assert GENSCORE is not None
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [GENSCORE, "serve", "--model", str(tiny_model_dir), "--port", str(port), "--device", "cpu"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("genscore: error:")]
    assert errors == [
        f"genscore: error: cannot listen on 127.0.0.1 port {port}: address already in use (--host, --port)"
    ]
    assert "Started server process" not in result.stderr  # nothing was started


@pytest.mark.parametrize(("stop", "status"), [(signal.SIGTERM, -signal.SIGTERM), (signal.SIGINT, 0)])
def test_a_stop_signal_answers_the_request_in_flight_then_exits(
    tiny_model_dir: Path, stop: signal.Signals, status: int
) -> None:
    """docs/scaling.md: on SIGTERM or SIGINT the server stops listening, finishes what it has received,
    then exits: by SIGTERM itself (as supervisors expect of a service they stopped), 0 after Ctrl-C."""
    assert GENSCORE is not None
    documents = [f"document {i} about nothing much " * 8 for i in range(1000)]  # seconds on a CPU
    answer: dict[str, Any] = {}
    limits = ("--max-items", "4096", "--max-prompt-tokens", "1000000")
    with genscore_serve_process([GENSCORE], tiny_model_dir, *limits) as (url, process):

        def post() -> None:
            response = httpx.post(
                url + "/v1/rerank", json={"query": "q", "documents": documents}, timeout=300
            )
            answer.update(status=response.status_code, body=response.json())

        client = threading.Thread(target=post)
        client.start()
        deadline = time.monotonic() + 120
        while httpx.get(url + "/stats", timeout=30).json()["in_flight"] == 0:
            assert time.monotonic() < deadline, "the request never arrived"
            time.sleep(0.02)
        process.send_signal(stop)
        client.join(timeout=300)
        assert answer["status"] == 200, answer
        assert sorted(result["index"] for result in answer["body"]["results"]) == list(range(len(documents)))
        assert process.wait(timeout=60) == status


@pytest.mark.slow
def test_serve_rejects_bad_arguments() -> None:
    assert GENSCORE is not None
    result = subprocess.run(
        [GENSCORE, "serve", "--port", "8000"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and "--model" in result.stderr
    result = subprocess.run(
        [GENSCORE, "serve", "--model", "x", "--port", "70000"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and "port" in result.stderr


def test_serve_help_gives_no_default_for_the_required_model() -> None:
    # Before: "--model MODEL ... (default: Qwen/Qwen3-Reranker-0.6B)", while leaving it out fails with
    # "the following arguments are required: --model".
    assert GENSCORE is not None
    result = subprocess.run([GENSCORE, "serve", "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0
    model_help = result.stdout.split("\n  --model MODEL", 1)[1].split("\n  --", 1)[0]
    assert "Hugging Face hub id" in model_help and "(default:" not in model_help
    rerank = subprocess.run([GENSCORE, "rerank", "--help"], capture_output=True, text=True, timeout=120)
    assert "(default: Qwen/Qwen3-Reranker-0.6B)" in " ".join(rerank.stdout.split())


def test_each_limit_flag_sets_its_own_limit_and_defaults_to_it() -> None:
    from genscore_core.cli import build_parser
    from genscore_core.server.cli import server_limits
    from genscore_core.server.limits import ServerLimits

    parse = build_parser().parse_args
    assert server_limits(parse(["serve", "--model", "m"])) == ServerLimits()
    given = {
        "--max-items": ("max_items_per_request", 7),
        "--max-prompt-tokens": ("max_prompt_tokens_per_request", 701),
        "--max-body-bytes": ("max_body_bytes", 7003),
        "--batch-max-tokens": ("batch_max_tokens", 7004),
        "--batch-max-wait-ms": ("batch_max_wait_ms", 7.5),
        "--batch-wait": ("batch_wait", "always"),
        "--batch-max-waited": ("batch_max_waited", 9),
        "--forward-batch-tokens": ("forward_batch_tokens", 7008),
        "--max-queued-requests": ("max_queued_requests", 70),
        "--max-connections": ("max_connections", 71),
        "--header-timeout": ("header_timeout_s", 7.25),
        "--body-timeout": ("body_timeout_s", 7.75),
        "--keep-alive-timeout": ("keep_alive_timeout_s", 77),
    }
    argv = [part for flag, (_, value) in given.items() for part in (flag, str(value))]
    limits = server_limits(parse(["serve", "--model", "m", *argv]))
    assert limits.model_dump() == {**ServerLimits().model_dump(), **dict(given.values())}
    # Every limit has its flag: a field added to ServerLimits without one is caught here.
    assert {field for field, _ in given.values()} == set(ServerLimits.model_fields)


@pytest.mark.parametrize("host", ["", "  "])
def test_an_empty_host_is_a_usage_error_naming_the_flag(host: str) -> None:
    assert GENSCORE is not None
    result = subprocess.run(
        [GENSCORE, "serve", "--model", "m", "--host", host], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "genscore serve: error: argument --host: expected an address or host name, got an empty one"
    )
