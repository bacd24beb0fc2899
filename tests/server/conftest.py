"""Real uvicorn servers on free loopback ports, with the session's tiny-model scorer behind them."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from genscore_core import GenerativeScorer
from genscore_core.server import create_app
from tests.helpers.server import TEST_LIMITS, LiveServer, serve_in_thread


@pytest.fixture(scope="session")
def live_server(scorer: GenerativeScorer) -> Iterator[LiveServer]:
    """``genscore serve``'s app for the session scorer (max_length 512), on a free loopback port."""
    with serve_in_thread(create_app(scorer, TEST_LIMITS)) as live:
        yield live


@pytest.fixture
def client(live_server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live_server.url, timeout=60.0) as http:
        yield http
