"""The public names, pinned: adding or removing one is a decision this test makes visible."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

PUBLIC = {
    "genscore_core": [
        "BGE_RERANKER_V2_GEMMA", "DEFAULT_MODEL", "MXBAI_RERANK_V2", "QWEN3_RERANKER", "TEMPLATES",
        "ConfigurationError", "GenScoreError", "GenerativeScorer", "GenerativeScoringRequest",
        "GenerativeScoringResponse", "InvalidRequestError", "JobTexts", "KernelUnavailableError",
        "ModelFolderError", "ModelNotFoundError", "NotARerankerError", "PromptTemplate", "PromptTooLongError", "RankedResult", "RankedResults",
        "RemoteConfigurationError", "RemoteScoringError", "ScoreData", "ScoreRangeError", "ScorerConfig",
        "ScoringBackend", "ScoringEngine", "ScoringFrontEnd", "ScoringJob", "ServerBusyError", "UsageInfo",
        "check_rank_options", "scorer_setting_names",
        "AttemptTooLongError", "BodyTimeoutError", "BodyTooLargeError", "InputError", "InputFileError",
        "JobStateError", "NotStandardJSONError", "RepeatedKeyError", "RequestAbandoned", "ServerHTTPError",
        "StrictJSONError", "UnknownModelError",
        "InputChangedError", "JobLockedError",
        "LocalSettings", "PromptSettings", "ServerSettings",
    ],
    "genscore_integrations": [],
    "genscore_integrations.langchain": [
        "RELEVANCE_SCORE_KEY", "TRUNCATED_KEY", "WINDOW_KEY", "GenerativeCrossEncoder", "GenerativeReranker",
    ],
    "genscore_integrations.llama_index": ["RETRIEVAL_SCORE_KEY", "WINDOW_KEY", "GenerativeRerank"],
}  # fmt: skip


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_all_is_pinned_and_every_name_imports(module: str) -> None:
    imported = importlib.import_module(module)
    assert sorted(imported.__all__) == sorted(PUBLIC[module])
    for name in imported.__all__:
        assert getattr(imported, name) is not None, name


# Run in a fresh interpreter: importing every module here would decorate the Triton kernels in this
# test process, before (or without) the settings the kernel tests give them.
_EXCEPTION_SCAN = """
import importlib, json, pkgutil, sys
import genscore_core, genscore_integrations

for package in (genscore_core, genscore_integrations):
    for found in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if not found.name.endswith(".__main__"):
            importlib.import_module(found.name)

def subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from subclasses(sub)

ours = sorted(
    {(c.__module__, c.__qualname__) for c in subclasses(BaseException)
     if c.__module__.split(".")[0] in ("genscore_core", "genscore_integrations")}
)
json.dump({"classes": ours, "modules": sorted(sys.modules)}, sys.stdout)
"""


def test_every_exception_class_is_defined_in_errors_and_exported() -> None:
    """Every exception class of every module of both packages (each imported, as a user could) is
    one of genscore_core.errors and exported from genscore_core: one place to find what can be caught."""
    import genscore_core

    found = subprocess.run(
        [sys.executable, "-c", _EXCEPTION_SCAN], capture_output=True, text=True, check=True
    ).stdout
    scan = json.loads(found)
    assert {"genscore_core.server.app", "genscore_integrations.ray", "genscore_core.kernels.dispatch"} <= set(
        scan["modules"]
    )
    elsewhere = [f"{module}.{name}" for module, name in scan["classes"] if module != "genscore_core.errors"]
    assert not elsewhere, f"exception classes defined outside genscore_core.errors: {elsewhere}"
    defined = {name for _, name in scan["classes"]}
    assert defined <= set(genscore_core.__all__), sorted(defined - set(genscore_core.__all__))
    for name in ("RemoteScoringError", "ServerBusyError", "RemoteConfigurationError", "ModelNotFoundError"):
        assert name in defined


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("genscore_core.cli", "InputError"),
        ("genscore_core.strict_json", "StrictJSONError"),
        ("genscore_core.strict_json", "RepeatedKeyError"),
        ("genscore_core.request_life", "RequestAbandoned"),
        ("genscore_core.jobs", "InputFileError"),
        ("genscore_core.jobs", "JobStateError"),
    ],
)
def test_moved_exception_classes_are_still_importable_where_they_were(module: str, name: str) -> None:
    from genscore_core import errors

    assert getattr(importlib.import_module(module), name) is getattr(errors, name)


TORCH_FREE = """
import sys
from genscore_core.backend import LaunchAhead, ScoringBackend, StreamedJob, StreamLayout
from genscore_core.config import ScorerConfig
from genscore_core.remote import make_backend
from genscore_core.remote.client import TokenScoringClient
from genscore_core.streaming import BatchPlanner, plan_stream

for kind in ("genscore", "vllm", "sglang", "rerank"):
    config = ScorerConfig(model="m", server_url="http://127.0.0.1:9", server_kind=kind)
    backend = make_backend(config.server)
    assert backend.local_model is None and not backend.streams, kind
    backend.close()
heavy = sorted(name for name in ("torch", "genscore_core.engine", "genscore_core.forward") if name in sys.modules)
print(",".join(heavy))
"""


def test_the_contract_and_the_http_clients_load_no_torch() -> None:
    """A client of a scoring server builds no model: the backend contract, the streamed-call
    types, the prefix grouping the clients send by, and every HTTP client load neither torch nor
    the engine (a fresh interpreter, so that nothing this test process imported counts)."""
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", TORCH_FREE], capture_output=True, text=True, env=os.environ, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"loaded: {done.stdout.strip()}"
