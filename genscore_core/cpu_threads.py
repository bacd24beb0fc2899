"""How many threads torch uses for a model on the CPU (``LocalSettings.cpu_threads``).

torch starts with one intra-op thread per core of the machine, counted from the hardware, not from
what the process may use (a container's CPU set), and a scorer runs more than torch: the tokenizer's
own thread pool and the producer thread that tokenizes and lays out the next batch while the current
one runs (``genscore_core.streaming``). On a small machine they then fight over the cores, and an
OpenMP thread that waits for a core it lost stalls the whole product: on a shared 2-core machine
2,000 documents took 31-94 s with torch's default and 14-18 s with ``OMP_NUM_THREADS=1``
(docs/benchmarks.md, "CPU threads").

So without a setting genscore gives torch one thread per usable core, one fewer on a machine of 2 to
4 cores (the tokenizer and the producer keep one), and never raises torch's count. It leaves the
count alone when the user chose it: ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` set, or
``torch.set_num_threads`` called after genscore was imported (to a count below the usable cores, also
before). ``cpu_threads`` sets it outright.

Only torch's count is set. The other pools of the process cost a call nothing measurable on a
2-core machine (per-thread CPU time, docs/benchmarks.md, "CPU threads"): the tokenizer's own (Rust)
threads work only while the producer tokenizes, 3-4% of a call's CPU time there, and are bounded by
the user with ``TOKENIZERS_PARALLELISM=false`` or ``RAYON_NUM_THREADS``; the pools started before the
scorer at the machine's count (torch's OpenMP worker, numpy's and scipy's OpenBLAS servers, which
``OMP_NUM_THREADS=1`` keeps from starting) sleep once torch runs on one thread. That default is as
fast as ``OMP_NUM_THREADS=1``: the same CPU time a call, and the same wall time in processes run side
by side; the main thread never waits for the producer, only, on a busy machine, for a core.
"""

from __future__ import annotations

import os

import torch

USER_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""Environment variables through which a user sets torch's threads (genscore then leaves them)."""

_AT_IMPORT = torch.get_num_threads()
"""torch's thread count when this module was imported: a different one later was set by someone."""


def usable_cores() -> int:
    """The cores this process may run on: its CPU set, bounded by a cgroup CPU quota where one is set."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(cores, quota)) if quota else max(1, cores)


def _cgroup_quota() -> int | None:
    """Whole cores of the cgroup v2 CPU quota (``cpu.max``), rounded up, or None when there is none."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as handle:
            limit, period = handle.read().split()[:2]
    except (OSError, ValueError):
        return None
    if limit == "max":
        return None
    return max(1, -(-int(limit) // int(period)))


def default_threads(cores: int) -> int:
    """torch's threads on ``cores`` usable cores when nothing is set."""
    return cores - 1 if 2 <= cores <= 4 else max(1, cores)


def chosen_by_user() -> bool:
    """Whether torch's thread count was chosen by the user (genscore then leaves it)."""
    if any(os.environ.get(name) for name in USER_VARIABLES):
        return True
    current = torch.get_num_threads()
    return current != _AT_IMPORT or current < usable_cores()


def apply_cpu_threads(setting: int | None) -> int:
    """Set torch's intra-op threads for a model on the CPU: ``setting`` when given, else
    :func:`default_threads` unless :func:`chosen_by_user`. Returns the count torch uses after."""
    global _AT_IMPORT
    if setting is not None:
        torch.set_num_threads(setting)
    elif not chosen_by_user():
        wanted = default_threads(usable_cores())
        if wanted < torch.get_num_threads():
            torch.set_num_threads(wanted)
    # A later scorer sees genscore's own choice as untouched, not as the user's.
    _AT_IMPORT = torch.get_num_threads()
    return _AT_IMPORT
