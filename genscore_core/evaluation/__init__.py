"""Judged data and what a reranker does with it: ``genscore eval`` and ``genscore calibrate``.

* :mod:`~genscore_core.evaluation.data`: BEIR folders, TREC runs and qrels;
* :mod:`~genscore_core.evaluation.bm25`: the first stage used when no run is given;
* :mod:`~genscore_core.evaluation.metrics`: nDCG@k, MRR@k, MAP@k and Recall@k as trec_eval defines them;
* :mod:`~genscore_core.evaluation.run`: a first stage reranked by one scorer, timed and resumable;
* :mod:`~genscore_core.evaluation.calibration`: Platt scaling, ECE and Brier;
* :mod:`~genscore_core.evaluation.cli`: the two commands.

None of it imports torch: a remote scorer evaluates without it.
"""
