"""A model folder's chat template rendered where it can do no harm: in a child process, with a deadline
and a memory limit, in jinja's sandbox (transformers renders every chat template in it).

A chat template is code that came with the folder. jinja's sandbox stops it from reaching Python's
internals (``SecurityError``), but not from looping 1e10 times or building a 2 GB string: loading such
a folder hung for over a minute. Here the renders run in a forked child that the parent kills at the
deadline, whose data segment may grow by :data:`RENDER_MEMORY_BYTES` at most, and whose answer is read
only up to :data:`RENDER_OUTPUT_BYTES`. Every failure (not valid Jinja, forbidden by the sandbox, an
error the template raises, too slow, too large) is one :class:`~genscore_core.errors.ModelFolderError`
naming the folder and the template's file.

Where ``os.fork`` does not exist (Windows), the renders run in this process, still in the sandbox but
without the deadline.
"""

from __future__ import annotations

import json
import os
import select
import signal
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from genscore_core.errors import ModelFolderError

RENDER_TIMEOUT_S = 10.0
"""How long all the renders of one folder may take; a real template needs milliseconds."""

RENDER_MEMORY_BYTES = 512 * 1024 * 1024
"""How much the child's data segment may grow while rendering."""

RENDER_OUTPUT_BYTES = 64 * 1024 * 1024
"""Most bytes of rendered text read back from the child."""

Conversation = list[dict[str, Any]]


def chat_template_file(model: str) -> str:
    """The file of ``model``'s folder that holds its chat template (transformers 5 saves it as
    ``chat_template.jinja``; older folders keep it in ``tokenizer_config.json``)."""
    folder = Path(model)
    if not (folder / "chat_template.jinja").is_file() and (folder / "tokenizer_config.json").is_file():
        return "tokenizer_config.json"
    return "chat_template.jinja"


def render_chat_templates(
    tokenizer: Any,
    conversations: Sequence[Conversation],
    *,
    model: str,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[str]:
    """``tokenizer.apply_chat_template(conversation, tokenize=False)`` of each conversation, rendered
    in a child process bounded in time and memory.

    Raises:
        ModelFolderError: The template is not valid Jinja, does what the sandbox forbids, raises an
            error, or does not finish within :data:`RENDER_TIMEOUT_S` and :data:`RENDER_MEMORY_BYTES`.
    """
    kwargs = dict(chat_template_kwargs or {})
    _import_jinja()  # in the parent: the child then imports nothing
    if not hasattr(os, "fork"):
        outcome = _render_all(tokenizer, conversations, kwargs)
    else:
        outcome = _render_in_child(tokenizer, conversations, kwargs)
    if outcome.get("ok"):
        return [str(text) for text in outcome["texts"]]
    file = chat_template_file(model)
    raise ModelFolderError(
        f"model {model!r}: {file}: the chat template {outcome['problem']}; genscore renders a folder's template "
        "in jinja's sandbox, bounded in time and memory, and uses it only if it renders cleanly; pass "
        "template= with a PromptTemplate for this model instead",
        folder=model,
        file=file,
    )


def _import_jinja() -> None:
    import jinja2
    import jinja2.ext
    import jinja2.sandbox  # noqa: F401


def _one_line(text: str) -> str:
    return " ".join(text.split())[:500]


def _render_all(
    tokenizer: Any, conversations: Sequence[Conversation], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """Render every conversation; the texts, or the problem in words."""
    from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError

    try:
        texts = [str(tokenizer.apply_chat_template(c, tokenize=False, **kwargs)) for c in conversations]
    except TemplateSyntaxError as error:
        line = f" (line {error.lineno})" if error.lineno else ""
        return {"ok": False, "problem": f"is not valid Jinja{line}: {_one_line(str(error.message))}"}
    except SecurityError as error:
        return {"ok": False, "problem": f"does something jinja's sandbox forbids: {_one_line(str(error))}"}
    except TemplateError as error:
        return {"ok": False, "problem": f"raises an error as it renders: {_one_line(str(error))}"}
    except MemoryError:
        limit = RENDER_MEMORY_BYTES // 2**20
        return {
            "ok": False,
            "problem": f"needs more than {limit} MB of memory to render one query and document",
        }
    except RecursionError:
        return {"ok": False, "problem": "recurses without end as it renders"}
    except Exception as error:
        return {"ok": False, "problem": f"fails to render: {type(error).__name__}: {_one_line(str(error))}"}
    return {"ok": True, "texts": texts}


def _limit_memory() -> None:
    """Let the data segment (heap and anonymous maps, where Python's objects live) grow by
    :data:`RENDER_MEMORY_BYTES` at most."""
    try:
        import resource

        with open("/proc/self/statm") as statm:
            data_pages = int(statm.read().split()[5])
        limit = data_pages * os.sysconf("SC_PAGE_SIZE") + RENDER_MEMORY_BYTES
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    except (ImportError, OSError, ValueError, IndexError):
        pass  # no /proc (macOS): the deadline alone bounds the render


def _render_in_child(
    tokenizer: Any, conversations: Sequence[Conversation], kwargs: dict[str, Any]
) -> dict[str, Any]:
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12 warns about forking a process with threads: the child runs pure Python
        # (jinja) and exits at once, and a child stuck on a lock is killed at the deadline.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: render, answer, exit without running the parent's exit handlers
        code = 0
        try:
            os.close(read_end)
            _limit_memory()
            answer = json.dumps(_render_all(tokenizer, conversations, kwargs)).encode()
            view = memoryview(answer)
            while view:
                view = view[os.write(write_end, view) :]
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        return _read_answer(read_end, pid)
    finally:
        os.close(read_end)


def _read_answer(read_end: int, pid: int) -> dict[str, Any]:
    deadline = time.monotonic() + RENDER_TIMEOUT_S
    chunks: list[bytes] = []
    size = 0
    problem: str | None = None
    while True:
        left = deadline - time.monotonic()
        ready = select.select([read_end], [], [], max(left, 0))[0] if left > 0 else []
        if not ready:
            problem = f"does not finish rendering one query and document within {RENDER_TIMEOUT_S:g} s"
            break
        chunk = os.read(read_end, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if size > RENDER_OUTPUT_BYTES:
            problem = f"renders more than {RENDER_OUTPUT_BYTES // 2**20} MB for one query and document"
            break
    if problem is not None:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if problem is not None:
        return {"ok": False, "problem": problem}
    try:
        answer = json.loads(b"".join(chunks))
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        how = f"signal {-os.waitstatus_to_exitcode(status)}" if os.WIFSIGNALED(status) else "an error"
        limit = RENDER_MEMORY_BYTES // 2**20
        return {"ok": False, "problem": f"stopped rendering by {how} (more than {limit} MB of memory?)"}
    return answer
