"""What both adapters do with their constructor arguments, so that they agree on them.

An adapter takes a ready scorer or the settings of a new one (``model``, ``config`` and the fields of
:class:`~genscore_core.ScorerConfig`). The same bad input raises the same error in both: ``TypeError``
for an unknown name, a scorer that is not one, or a scorer with settings that contradict it. Settings
that agree with the given scorer are accepted: that is how a saved adapter is reloaded onto a shared
scorer (``from_dict(data, scorer=scorer)``).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from pydantic import ValidationError

from genscore_core import GenerativeScorer, ScorerConfig, check_rank_options, scorer_setting_names
from genscore_core.templates import SCORE_MODES, TEMPLATES, PromptTemplate, ScoreMode

SCORER_SETTINGS = scorer_setting_names()
"""``model``, ``config`` and the ScorerConfig fields."""

# A secret is not written into a saved adapter (to_dict, model_dump): pass it again when reloading.
# A pickle keeps it (see pickled_settings).
_NOT_SAVED = frozenset({"server_api_key"})


def check_names(owner: str, given: Iterable[str], own: Iterable[str]) -> None:
    """Reject names that are neither the adapter's own options nor scorer settings, before any loading."""
    own = list(own)
    unknown = sorted(name for name in given if name not in own and name not in SCORER_SETTINGS)
    if unknown:
        raise TypeError(
            f"{owner} got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; it takes "
            f"{', '.join(own)} or the settings of a new scorer: {', '.join(sorted(SCORER_SETTINGS))}"
        )


def check_model(owner: str, model: object) -> None:
    """Refuse a ready scorer given as the model (``Adapter(scorer)``): it would reach the scorer's
    settings as a model name and fail there, saying only that the model must be a string."""
    if _looks_like_scorer(model):
        raise TypeError(
            f"{owner} got a {type(model).__name__} as its model; pass a ready scorer as scorer=, "
            "the model (a name or a folder) first or as model="
        )


def plain_rank_options(data: Any) -> Any:
    """``data`` with ``top_n`` and ``score_threshold`` checked and made Python's ``int`` and ``float``.

    The scorer takes NumPy's integers and floats for them (``top_n=np.int64(5)``, a threshold read off
    an array); the adapters' fields are strict, so that ``True`` or ``"3"`` is no count, and would
    refuse them.
    """
    if not isinstance(data, dict):
        return data
    check_rank_options(
        data.get("top_n"), data.get("score_threshold"), score_mode=threshold_mode(data.get("scorer"), data)
    )
    plain = dict(data)
    if plain.get("top_n") is not None:
        plain["top_n"] = int(plain["top_n"])
    if plain.get("score_threshold") is not None:
        plain["score_threshold"] = float(plain["score_threshold"])
    return plain


def threshold_mode(scorer: object, settings: Mapping[str, Any]) -> ScoreMode | Literal["auto"] | None:
    """The score mode ``score_threshold`` is a score of (``check_rank_options``), told before any
    loading: ``scorer``'s own when one is given, else the one ``settings`` set (``score_mode``, or a
    template's), ``"auto"`` when the recipe picks it, None when it cannot be told (checked then
    against the scorer once it is built)."""
    if scorer is not None:
        mode = getattr(scorer, "score_mode", None)
        return _known(mode)
    config = settings.get("config")
    config = config if isinstance(config, ScorerConfig) else None
    mode = settings.get("score_mode", config.score_mode if config is not None else "auto")
    if mode != "auto":
        return _known(mode)  # None for a bad mode: ScorerConfig names it
    template = settings.get("template", config.template if config is not None else "auto")
    if isinstance(template, PromptTemplate):
        return template.score_mode
    if isinstance(template, str) and template in TEMPLATES:
        return TEMPLATES[template].score_mode
    return "auto" if template == "auto" else None


def _known(mode: object) -> ScoreMode | None:
    return next((known for known in SCORE_MODES if known == mode), None)


def _looks_like_scorer(value: object) -> bool:
    return callable(getattr(value, "rerank", None)) and callable(getattr(value, "arerank", None))


def check_scorer(scorer: object) -> None:
    if not _looks_like_scorer(scorer):
        raise TypeError(
            f"scorer must be a genscore_core.GenerativeScorer (with rerank and arerank), "
            f"got {type(scorer).__name__}"
        )


def scorer_for(
    owner: str, scorer: Any, settings: Mapping[str, Any], build: Callable[..., Any] = GenerativeScorer
) -> Any:
    """``scorer`` checked against ``settings``, or a new scorer built from ``settings`` by ``build``.

    ``settings`` holds scorer settings only (``model``, ``config``, ScorerConfig fields).
    """
    if scorer is None:
        settings = dict(settings)
        return build(settings.pop("model", None), **settings)
    check_scorer(scorer)
    differing = _differing(scorer, settings)
    if differing:
        raise TypeError(
            f"{owner} takes either a ready scorer= or the settings of a new scorer, not both; "
            f"{', '.join(differing)} differ(s) from the given scorer's (put the settings on the scorer, "
            "or leave them out)"
        )
    return scorer


def saved_settings(scorer: Any) -> dict[str, Any]:
    """Every setting a new scorer needs to score as ``scorer`` does, as JSON-ready values.

    ``dtype`` is the one the weights really have when the scorer left it to the device (so that a
    scorer built from a bfloat16 model reloads in bfloat16). A secret (``server_api_key``) is left out.
    """
    config: ScorerConfig = scorer.config
    data = config.model_dump(mode="json", exclude=set(_NOT_SAVED))
    if config.dtype is None:
        try:
            weights = scorer.engine.model
        except AttributeError:  # scored through a server: the server's dtype is not ours to record
            weights = None
        if weights is not None:
            data["dtype"] = str(weights.dtype).removeprefix("torch.")
    return data


def pickled_settings(scorer: Any) -> dict[str, Any]:
    """:func:`saved_settings` with the secrets (:func:`secret_settings`): what a pickle carries."""
    return {**saved_settings(scorer), **secret_settings(scorer)}


class PickledScorer:
    """What a pickle holds in place of a scorer: its :func:`pickled_settings`, taken when pickled.

    Adapters that share a scorer share one ``PickledScorer`` (:func:`pickled_scorer`), which pickle
    writes once and reads back as one object; its first :meth:`load` loads the scorer and the others
    get that same scorer. So a pickle of several adapters on one model (a retriever and a query engine,
    a compressor pipeline) loads the model once, as the originals held it once.
    """

    def __init__(self, scorer: Any) -> None:
        self._source: weakref.ref[Any] | None = weakref.ref(scorer)  # no stand-in keeps a scorer alive
        self._settings: dict[str, Any] | None = None
        self._loaded: Any = None

    def __getstate__(self) -> dict[str, Any]:
        scorer = self._source() if self._source is not None else None
        # Taken now, not when the stand-in was made: the model may have been cast since.
        settings = pickled_settings(scorer) if scorer is not None else self._settings
        return {"settings": settings}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._source = None
        self._settings = state["settings"]
        self._loaded = None

    def load(self, owner: str, build: Callable[..., Any]) -> Any:
        """The scorer the settings describe, loaded on the first call (by ``build``)."""
        if self._loaded is None:
            self._loaded = scorer_for(owner, None, self._settings or {}, build=build)
        return self._loaded


_stand_ins: weakref.WeakKeyDictionary[Any, PickledScorer] = weakref.WeakKeyDictionary()
_stand_ins_lock = threading.Lock()


def pickled_scorer(scorer: Any) -> PickledScorer:
    """The one :class:`PickledScorer` of ``scorer``, for every adapter that uses it."""
    with _stand_ins_lock:
        stand_in = _stand_ins.get(scorer)
        if stand_in is None:
            stand_in = _stand_ins[scorer] = PickledScorer(scorer)
        return stand_in


def secret_settings(scorer: Any) -> dict[str, Any]:
    """The secrets ``scorer`` was given (``server_api_key``), as ``SecretStr``: for a pickle only.

    A pickle moves an adapter to another process (Ray, multiprocessing), which must reach the same
    server with the same key: without it the copy gets HTTP 401. LangChain draws the same line: a
    pickled model keeps its ``SecretStr`` key, ``dumpd`` leaves it out. The secret stays a
    ``SecretStr`` (pickled with its value), so that it shows in no repr or log on the way.
    """
    config = getattr(scorer, "config", None)
    if not isinstance(config, ScorerConfig):
        return {}
    return {name: getattr(config, name) for name in sorted(_NOT_SAVED) if getattr(config, name) is not None}


def _differing(scorer: Any, settings: Mapping[str, Any]) -> list[str]:
    if not settings:
        return []
    config = getattr(scorer, "config", None)
    if not isinstance(config, ScorerConfig):
        return sorted(settings)  # nothing to compare with: any setting is a second source of truth
    effective = saved_settings(scorer)
    differing = []
    for name, value in settings.items():
        if name == "config":
            if value != config:
                differing.append(name)
            continue
        reference = effective.get(name, getattr(config, name, None))
        try:
            same = _normalised(name, value) == _normalised(name, reference)
        except ValidationError:
            same = False
        if not same:
            differing.append(name)
    return sorted(differing)


def _normalised(name: str, value: Any) -> Any:
    return getattr(ScorerConfig.model_validate({name: value}), name)
