"""JSON read as the standard writes it, for what genscore reads from users (files, stdin, bodies).

Python's reader is laxer than JSON in two ways that lose data without a word. It takes ``NaN`` and
``Infinity`` and reads ``1e400`` as infinity, which go back out as ``NaN`` and ``Infinity``: invalid
JSON for jq, ``JSON.parse`` or pandas. And it keeps the last of two values of one key, where other
parsers keep the first: a body holding ``documents`` twice is scored as one of them. Both are errors here.
"""

from __future__ import annotations

import json
import math
from typing import Any

from genscore_core.errors import NotStandardJSONError as NotStandardJSONError
from genscore_core.errors import RepeatedKeyError as RepeatedKeyError
from genscore_core.errors import StrictJSONError as StrictJSONError


def _refuse_constant(name: str) -> Any:
    raise NotStandardJSONError(f"{name} is not a JSON value (write null or a string)")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise NotStandardJSONError(f"the number {text} is too large for a float (write it as a string)")
    return value


def _object_of_distinct_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    record = dict(pairs)
    if len(record) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise RepeatedKeyError(key)
            seen.add(key)
    return record


def loads(text: str | bytes, *, standard_numbers: bool = True) -> Any:
    """``json.loads`` that refuses a key given twice and, with ``standard_numbers``, ``NaN``,
    ``Infinity`` and numbers beyond a float.

    Raises:
        json.JSONDecodeError: Not JSON at all.
        StrictJSONError: JSON only to Python's reader (:class:`RepeatedKeyError`,
            :class:`NotStandardJSONError`).
    """
    if not standard_numbers:
        return json.loads(text, object_pairs_hook=_object_of_distinct_keys)
    return json.loads(
        text,
        object_pairs_hook=_object_of_distinct_keys,
        parse_constant=_refuse_constant,
        parse_float=_finite_float,
    )
