"""Framework adapters for genscore's engine.

Each adapter lives in its own module and imports its framework only when that module is imported:
``genscore_integrations.langchain`` (``pip install "genscore[langchain]"``),
``genscore_integrations.llama_index`` (``pip install "genscore[llama-index]"``) and
``genscore_integrations.ray`` (``pip install "genscore[ray]"``: Ray Serve and Ray Data).
"""

# Nothing at the package level: each adapter is imported from its own module, with its framework.
__all__: list[str] = []
