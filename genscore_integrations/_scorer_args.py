"""What both adapters do with their constructor arguments, so that they agree on them.

An adapter takes a ready scorer or the settings of a new one (``model``, ``config`` and the settings of
:class:`~genscore_core.ScorerConfig`, flat or as its ``prompt`` and ``run`` parts). Saving, comparing
and pickling a scorer's settings are the scorer's own (:meth:`~genscore_core.GenerativeScorer.settings`,
``differing_settings``, its pickle); what is left here is the adapters' wording of the same checks. The same bad input raises the same error in both: ``TypeError``
for an unknown name, a scorer that is not one, or a scorer with settings that contradict it. Settings
that agree with the given scorer are accepted: that is how a saved adapter is reloaded onto a shared
scorer (``from_dict(data, scorer=scorer)``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from genscore_core import GenerativeScorer, ScorerConfig, check_rank_options, scorer_setting_names
from genscore_core.config import PromptSettings
from genscore_core.templates import SCORE_MODES, TEMPLATES, PromptTemplate, ScoreMode

SCORER_SETTINGS = scorer_setting_names()
"""``model``, ``config``, ``prompt``, ``run`` and the flat ScorerConfig settings."""


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
    prompt = settings.get("prompt", config.prompt if isinstance(config, ScorerConfig) else None)
    prompt = prompt if isinstance(prompt, PromptSettings) else PromptSettings()
    mode = settings.get("score_mode", prompt.score_mode)
    if mode != "auto":
        return _known(mode)  # None for a bad mode: ScorerConfig names it
    template = settings.get("template", prompt.template)
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

    ``settings`` holds scorer settings only (``model``, ``config``, ScorerConfig settings); settings
    that agree with ``scorer``'s are accepted (a saved adapter reloaded onto a shared scorer).
    """
    if scorer is None:
        settings = dict(settings)
        return build(settings.pop("model", None), **settings)
    check_scorer(scorer)
    compare = getattr(scorer, "differing_settings", None)
    # A stand-in with no settings to compare: any setting would be a second source of truth.
    differing = compare(settings) if callable(compare) else sorted(settings)
    if differing:
        raise TypeError(
            f"{owner} takes either a ready scorer= or the settings of a new scorer, not both; "
            f"{', '.join(differing)} differ(s) from the given scorer's (put the settings on the scorer, "
            "or leave them out)"
        )
    return scorer
