"""Which recipe a model folder asks for: a preset, or the configuration it ships for sentence-transformers.

``template="auto"`` resolves here, in this order, and the scorer keeps what was picked and why
(``scorer.recipe``), and logs it:

1. a preset the model's id or folder path points at (``mxbai-rerank``, ``bge-reranker...gemma``,
   ``qwen3-reranker``; the deepest folder naming one wins): each preset is checked against its authors' own code, so it wins over a
   sentence-transformers configuration the same repository may also ship;
2. a sentence-transformers ``CrossEncoder`` configuration in the folder (``modules.json`` naming a
   text-generation ``Transformer`` followed by a ``LogitScore``): the prompt is the tokenizer's chat
   template rendering a ``"query"`` and a ``"document"`` message, tokenized whole, and the labels are
   the ``LogitScore`` token ids;
3. a preset the ``_name_or_path`` of the folder's ``config.json`` points at. transformers 4 wrote
   that field; transformers 5 does not (``save_pretrained`` drops it), so a folder saved by
   transformers 5 has no name there;
4. a preset the ``base_model`` of the model card (``README.md``'s metadata) points at: the Trainer
   writes it when it pushes a fine-tune to the hub, and sentence-transformers when it saves a
   fine-tune of a hub model; ``save_pretrained`` writes no card;
5. Qwen3-Reranker's recipe: quietly for a Qwen3 model, with a warning otherwise that says which of
   the names above the model lacked.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from genscore_core.errors import ModelFolderError
from genscore_core.loading import optional_files_from_cache_only
from genscore_core.template_sandbox import chat_template_file, render_chat_templates
from genscore_core.templates import (
    QWEN3_RERANKER,
    PromptTemplate,
    get_template,
    resolve_label_ids,
    template_for_name,
)

logger = logging.getLogger(__name__)

_QUERY_MARK = "\ue000genscore-query\ue001"
_DOCUMENT_MARK = "\ue000genscore-document\ue001"
_PROBE_QUERY = "\ue002probe-q\ue003"
_PROBE_DOCUMENT = "\ue002probe-d\ue003"
_PADDING = " \n\t"
_ESCAPABLE = "<&\"'>"


@dataclass(frozen=True)
class Recipe:
    """The template a scorer uses, and why it was picked."""

    template: PromptTemplate
    source: str
    """How it was chosen, in words (``"preset 'mxbai-rerank-v2' from the model name"``...)."""
    max_length: int | None = None
    """A length limit the model's configuration sets (sentence-transformers' ``max_seq_length``)."""


def resolve_recipe(template: str | PromptTemplate | dict[str, Any], model: str, tokenizer: Any) -> Recipe:
    """The recipe for ``model`` (hub id or folder) given the ``template`` setting."""
    if template != "auto":
        resolved = get_template(template, model)
        how = "the template= setting" if isinstance(template, str) else "a template passed in"
        return _picked(Recipe(resolved, f"template {resolved.name!r} from {how}"))
    preset = template_for_name(model)
    if preset is not None:
        return _picked(Recipe(preset, f"preset {preset.name!r} from the model name"))
    st = sentence_transformers_recipe(model, tokenizer)
    config = _read_json(model, "config.json")
    config = config if isinstance(config, dict) else {}
    if st is not None:
        return _picked(_family_scale(st, model, config, tokenizer))
    preset = template_for_name(str(config.get("_name_or_path", "")))
    if preset is not None:
        return _picked(Recipe(preset, f"preset {preset.name!r} from the name in config.json"))
    base_models = model_card_base_models(model)
    preset = _one_preset(base_models)
    if preset is not None:
        return _picked(Recipe(preset, f"preset {preset.name!r} from the model card's base_model"))
    if config.get("model_type") == "qwen3":
        return _picked(Recipe(QWEN3_RERANKER, "preset 'qwen3-reranker' (the default, for a Qwen3 model)"))
    recipe = Recipe(
        QWEN3_RERANKER, "preset 'qwen3-reranker' (the default: nothing in the model named a recipe)"
    )
    logger.warning("%s", _default_warning(model, config, base_models))
    return _picked(recipe)


def _family_scale(recipe: Recipe, model: str, config: dict[str, Any], tokenizer: Any) -> Recipe:
    """A sentence-transformers recipe scored on the scale of the family its config or model card
    names, where that family divides its logits (zerank: sigmoid(logit / 5)) and reads the same label
    tokens: a zerank fine-tune saved for sentence-transformers keeps zerank's 0-1 score."""
    name = str(config.get("_name_or_path", ""))
    family = template_for_name(name) if name else None
    family = family or _one_preset(model_card_base_models(model))
    if family is None or family.logit_temperature == 1.0:
        return recipe
    try:
        same_labels = resolve_label_ids(tokenizer, family) == list(recipe.template.label_token_ids)
    except ValueError:  # the family's label words are not single tokens of this tokenizer
        return recipe
    if not same_labels:
        return recipe
    scaled = recipe.template.model_copy(update={"logit_temperature": family.logit_temperature})
    source = (
        f"{recipe.source}, its logits divided by {family.logit_temperature:g} as {family.name!r}'s "
        "are (the family its config or model card names)"
    )
    return Recipe(scaled, source, recipe.max_length)


# A family's preset for a model of its architecture; named in the warning only (a Qwen2 or Gemma model is
# not necessarily a reranker of that family, so it is never picked from the architecture alone).
_PRESET_OF_MODEL_TYPE = {
    "qwen2": "mxbai-rerank-v2",
    "gemma": "bge-reranker-v2-gemma",
    "gemma2": "bge-reranker-v2-gemma",
    "gemma3_text": "bge-reranker-v2-gemma",
}


def _default_warning(model: str, config: dict[str, Any], base_models: list[str]) -> str:
    """What the fallback to Qwen3-Reranker's template looked at, and what the user can pass instead."""
    recorded = config.get("_name_or_path")
    if recorded:
        name_note = f"config.json's _name_or_path {recorded!r} names no known reranker"
    else:
        # The common case since transformers 5, whose save_pretrained no longer writes the field.
        name_note = (
            "config.json records no _name_or_path (transformers 5 does not save it), so a folder saved by "
            "transformers 5 names its family only through its own path or its model card"
        )
    card_note = (
        f"the model card's base_model {base_models} names no known reranker"
        if base_models
        else "no model card names a base_model"
    )
    model_type = config.get("model_type")
    likely = _PRESET_OF_MODEL_TYPE.get(str(model_type))
    hint = (
        f" For a fine-tune of {likely} (a {model_type} model), pass template={likely!r}."
        if likely is not None
        else ""
    )
    return (
        f"{model}: the path names no known reranker, the folder has no sentence-transformers "
        f"configuration, {name_note}, and {card_note}; scoring with Qwen3-Reranker's template "
        f"(model type {model_type!r}). Pass template= if this model was trained with another prompt.{hint}"
    )


def model_card_base_models(model: str) -> list[str]:
    """The ``base_model`` entries of the model card's metadata (``README.md``), or [] without any."""
    path = _model_file(model, "README.md")
    if path is None:
        return []
    import yaml
    from huggingface_hub.repocard import metadata_load

    try:
        metadata = metadata_load(path) or {}
    except (OSError, ValueError, yaml.YAMLError) as error:
        # A card with broken metadata names nothing; the warning of the default says so.
        logger.info("%s: the model card's metadata cannot be read (%s)", model, error)
        return []
    base = metadata.get("base_model") if isinstance(metadata, dict) else None
    entries = base if isinstance(base, list) else [base]
    return [entry for entry in entries if isinstance(entry, str) and entry]


def _one_preset(names: list[str]) -> PromptTemplate | None:
    """The preset the names point at, when they point at exactly one (a merge of two families: none)."""
    presets = {template_for_name(name) for name in names} - {None}
    return presets.pop() if len(presets) == 1 else None


def _picked(recipe: Recipe) -> Recipe:
    logger.info("genscore recipe: %s", recipe.source)
    return recipe


def sentence_transformers_recipe(model: str, tokenizer: Any) -> Recipe | None:
    """The recipe of a folder saved for sentence-transformers' ``CrossEncoder`` with a ``LogitScore``
    head, or None when the folder has no such configuration.

    Raises:
        ValueError: The folder has a ``LogitScore`` configuration genscore cannot reproduce exactly.
    """
    modules = _read_json(model, "modules.json")
    if not isinstance(modules, list):
        return None
    by_kind = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules if isinstance(m, dict)}
    if "LogitScore" not in by_kind:
        return None
    unknown = sorted(set(by_kind) - {"Transformer", "LogitScore"})
    if unknown or len(modules) != 2:
        raise ValueError(
            f"{model}: modules.json holds {sorted(by_kind)}; genscore reproduces a Transformer followed by "
            f"a LogitScore only (unsupported: {unknown or 'the module count'})"
        )
    transformer = _read_json(
        model, _join(by_kind["Transformer"].get("path", ""), "sentence_bert_config.json")
    )
    transformer = transformer if isinstance(transformer, dict) else {}
    task = transformer.get("transformer_task")
    if task != "text-generation":
        raise ValueError(f"{model}: the Transformer module's task is {task!r}, not 'text-generation'")
    head_file = _join(by_kind["LogitScore"].get("path", ""), "config.json")
    head = _read_json(model, head_file)
    if not isinstance(head, dict) or "true_token_id" not in head:
        raise ModelFolderError(
            f"model {model!r}: {head_file}: the LogitScore module's configuration names no true_token_id",
            folder=model,
            file=head_file,
        )
    label_ids = tuple(
        _token_id(model, head_file, key, head[key])
        for key in ("true_token_id", "false_token_id")
        if key == "true_token_id" or head.get(key) is not None
    )
    settings = _read_json(model, "config_sentence_transformers.json")
    if isinstance(settings, dict) and settings.get("default_prompt_name"):
        raise ValueError(
            f"{model}: a default prompt ({settings['default_prompt_name']!r}) is configured; genscore does "
            "not reproduce sentence-transformers prompts yet"
        )
    message = (transformer.get("modality_config") or {}).get("message") or {}
    kwargs = dict((transformer.get("processing_kwargs") or {}).get("chat_template") or {})
    kwargs.pop("restore_suffix", None)
    template = template_from_chat_template(
        tokenizer,
        name=f"sentence-transformers:{Path(model).name or model}",
        label_token_ids=label_ids,
        structured=message.get("format") == "structured",
        chat_template_kwargs=kwargs,
        model=model,
    )
    labels = "true/false token ids" if len(label_ids) == 2 else "one true token id"
    max_seq_length = transformer.get("max_seq_length")
    return Recipe(
        template,
        f"sentence-transformers CrossEncoder configuration (chat template, LogitScore {labels} {list(label_ids)})",
        max_length=max_seq_length if isinstance(max_seq_length, int) else None,
    )


def _long_text(tag: str, length: int) -> str:
    """About ``length`` characters of distinct words and lines, with markers at the start, middle and
    end: a template that keeps a prefix, drops the middle or rewrites long texts shows in them."""
    marks = [f"\ue002{tag}-{length}-{part}\ue003" for part in ("start", "middle", "end")]
    words: list[str] = []
    size = 0
    while size < max(length - 60, 0) // 2:
        word = f"{tag}{len(words)}" + ("\n" if len(words) % 12 == 11 else " ")
        words.append(word)
        size += len(word)
    half = "".join(words)
    return f"{marks[0]} {half}{marks[1]} {half}{marks[2]}"


# (query, document) lengths of the long probes: past 2,000 characters, and at several lengths, so that
# a template that cuts texts (keeps the first 200 characters) or branches on a length is caught. A
# template that kept 200 characters passed the short probes, and a 640-character document scored
# 0.62171 against CrossEncoder.predict's 0.34747.
_LONG_PROBES = ((700, 700), (2_600, 2_600), (300, 9_000), (9_000, 300))


def _token_id(model: str, file: str, key: str, value: Any) -> int:
    """``value`` as a token id: a JSON integer, not ``"no"`` (which int() refused with "invalid
    literal") nor ``2152.9`` (which int() cut to 2152, scoring another token without a word)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ModelFolderError(
        f"model {model!r}: {file}: the LogitScore module's {key} is {json.dumps(value)}, not a token id "
        "(a whole number of at least 0); write the id the tokenizer gives the label word",
        folder=model,
        file=file,
    )


def template_from_chat_template(
    tokenizer: Any,
    *,
    name: str,
    label_token_ids: tuple[int, ...],
    structured: bool = False,
    chat_template_kwargs: dict[str, Any] | None = None,
    model: str | None = None,
) -> PromptTemplate:
    """A whole-body template equal to the chat template rendering one ``"query"`` and one
    ``"document"`` message, as sentence-transformers renders a pair.

    The template is rendered with marker strings in place of the texts and cut at the markers; renders
    with other texts (short ones, ones padded with whitespace and characters a template may escape, and
    long ones with markers at the start, middle and end) check that the texts land verbatim, whatever
    their length, and that nothing else depends on them. The renders run in jinja's sandbox in a child
    process bounded in time and memory (:mod:`genscore_core.template_sandbox`).

    Raises:
        ModelFolderError: The template does not render, or renders the texts other than verbatim.
    """
    where = model if model is not None else name
    file = chat_template_file(where)

    def refuse(problem: str) -> ModelFolderError:
        return ModelFolderError(
            f"model {where!r}: {file}: the chat template {problem}", folder=where, file=file
        )

    def conversation(query: str, document: str) -> list[dict[str, Any]]:
        def content(text: str) -> Any:
            return [{"type": "text", "text": text}] if structured else text

        return [
            {"role": "query", "content": content(query)},
            {"role": "document", "content": content(document)},
        ]

    if getattr(tokenizer, "chat_template", None) is None:
        raise refuse("is missing: the tokenizer has no chat template to render the query and document with")
    # Whitespace around the texts and characters a template may escape: Llama 3's template trims every
    # message, which plain markers cannot show, and untrimmed texts then scored up to 0.36 off
    # CrossEncoder.predict on a tiny model.
    padded_query, padded_document = (
        f"{_PADDING}{probe}{_ESCAPABLE}{_PADDING}" for probe in (_PROBE_QUERY, _PROBE_DOCUMENT)
    )
    long_pairs = [
        (f"{_PADDING}{_long_text('q', q)}{_PADDING}", f"{_PADDING}{_long_text('d', d)}{_PADDING}")
        for q, d in _LONG_PROBES
    ]
    pairs = [(_QUERY_MARK, _DOCUMENT_MARK), (_PROBE_QUERY, _PROBE_DOCUMENT), (padded_query, padded_document)]
    rendered, probed, actual, *long_renders = render_chat_templates(
        tokenizer,
        [conversation(q, d) for q, d in [*pairs, *long_pairs]],
        model=where,
        chat_template_kwargs=chat_template_kwargs,
    )
    for mark, role in ((_QUERY_MARK, "query"), (_DOCUMENT_MARK, "document")):
        if rendered.count(mark) != 1:
            raise refuse(
                f"renders the {role!r} message's text {rendered.count(mark)} times, "
                "not once, so it has no single place for it"
            )

    def filled(query: str, document: str) -> str:
        return rendered.replace(_QUERY_MARK, query).replace(_DOCUMENT_MARK, document)

    if probed != filled(_PROBE_QUERY, _PROBE_DOCUMENT):
        raise refuse("output depends on the texts beyond inserting them")
    choices: tuple[tuple[Literal["query", "document"], ...], ...] = (
        (),
        ("query",),
        ("document",),
        ("query", "document"),
    )

    def expected(strips: tuple[str, ...], query: str, document: str) -> str:
        return filled(
            query.strip() if "query" in strips else query,
            document.strip() if "document" in strips else document,
        )

    strip_texts = next(
        (strips for strips in choices if actual == expected(strips, padded_query, padded_document)), None
    )
    if strip_texts is None:
        raise refuse(
            "changes the query or document it inserts beyond trimming whitespace "
            f"(given {padded_query!r}, it does not render it verbatim or trimmed), so genscore cannot "
            "reproduce its prompts; pass template= with a PromptTemplate written for this model"
        )
    for (query, document), got in zip(long_pairs, long_renders, strict=True):
        want = expected(strip_texts, query, document)
        if got != want:
            at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            raise refuse(
                f"does not carry a {len(query)}-character query and a {len(document)}-character document "
                f"whole: its output differs from them inserted verbatim from character {at} of {len(want)} "
                "on (a template that cuts long texts, branches on their length or changes them), so one "
                "template cannot reproduce its prompts; pass template= with a PromptTemplate written for "
                "this model"
            )
    body = rendered.replace("{", "{{").replace("}", "}}")
    body = body.replace(_QUERY_MARK, "{query}").replace(_DOCUMENT_MARK, "{document}")
    return PromptTemplate(
        name=name,
        body=body,
        tokenization="whole",
        label_token_ids=label_token_ids,
        score_mode="label-softmax" if len(label_token_ids) == 2 else "logit-sigmoid",
        strip_texts=strip_texts,
    )


def _join(folder: str, file: str) -> str:
    return f"{folder.strip('/')}/{file}" if folder.strip("/") else file


def _model_file(model: str, file: str) -> Path | None:
    """A file of a local folder, or of a hub repository (through the local cache when offline)."""
    path = Path(model) / file
    if Path(model).is_dir():
        return path if path.is_file() else None
    try:
        from transformers.utils import cached_file

        found = cached_file(
            model,
            file,
            _raise_exceptions_for_missing_entries=False,
            # When the hub does not answer its first request, each file asked of it would be
            # retried with backoff (23 s each), so the cache alone tells.
            local_files_only=optional_files_from_cache_only(model),
        )
    except (OSError, ValueError):
        return None
    return None if found is None else Path(found)


def _read_json(model: str, file: str) -> Any:
    """A JSON file of a local folder, or of a hub repository (through the local cache when offline)."""
    path = _model_file(model, file)
    if path is None:
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{model}: cannot read {file}: {error}") from error
