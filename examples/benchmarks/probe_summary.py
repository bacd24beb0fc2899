"""Tables of a loaded server's diagnosis (``bench_serve.py --probe``): where each thread's time goes.

    python examples/benchmarks/probe_summary.py out/probe-main.tar.gz > summary.md

Reads what the diagnostic window wrote (serve_probe.py's report, /proc per thread, py-spy, the
torch.profiler trace) and prints:

* engine calls in the window: share of the time inside calls, the gaps between calls;
* per thread (/proc): share of the time on a CPU and waiting for a CPU (run queue);
* per thread (py-spy, every sample, idle included, native frames): what it was doing, by activity
  (waiting for the interpreter lock, launching GPU work, waiting for the GPU, Python, tokenizer...);
  for the engine's thread also by the innermost genscore frame;
* who holds the interpreter lock (py-spy ``--gil``), by thread and innermost function;
* inside the profiled engine calls (torch.profiler): host time before the first kernel, the GPU's
  busy share, idle gaps between kernels and whether the kernel after a gap was launched late,
  the tail after the last kernel, and the host's time outside torch ops on the launching thread;
* the event loop's lag and the Python stack sampler's top stacks.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import statistics
import tarfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

GIL = (
    "take_gil",
    "PyEval_RestoreThread",
    "PyEval_AcquireThread",
    "PyGILState_Ensure",
    "drop_gil",
    "gil_scoped_acquire",
)
SYNC = ("Synchronize", "cudaMemcpy (", "_local_scalar_dense", "cuMemcpyDtoH", "cudaMemcpy(")
LAUNCH = ("cudaLaunchKernel", "cuLaunchKernel", "libcuda", "cudaMemcpyAsync", "cuLaunch", "libcudart")
TOKENIZER = ("tokenizers",)
IDLE_PY = (
    "_worker (concurrent/futures/thread.py",
    "wait (threading.py",
    "get (queue.py",
    "select (selectors",
)
IDLE_NATIVE = ("epoll_wait", "epoll_pwait", "uv__io_poll", "select", "poll (")


def group_of(name: str) -> str:
    return re.sub(r"[_-]?\d+$", "_*", name) if name else "(no Python name)"


def classify(frames: list[str]) -> str:
    """What a sampled stack (root first) was doing, from its innermost frames."""
    inner = frames[-14:]
    text = ";".join(inner)
    if any(k in text for k in GIL):
        return "waiting for the interpreter lock"
    if any(k in text for k in SYNC):
        return "waiting for the GPU (sync)"
    if any(k in text for k in LAUNCH):
        return "CUDA runtime / driver (launch, copy)"
    if any(k in text for k in TOKENIZER):
        return "tokenizer (Rust)"
    py = [f for f in frames if f.endswith(")") and ".py:" in f]
    if py and any(k in py[-1] for k in IDLE_PY):
        return "idle (waiting for work)"
    if any(k in text for k in IDLE_NATIVE):
        return "idle (event loop poll)"
    if frames and ".py:" in frames[-1]:
        return "Python"
    return "native (other)"


def innermost(frames: list[str], marker: str) -> str:
    for frame in reversed(frames):
        if marker in frame:
            return re.sub(r":\d+\)$", ")", frame)
    return "(none)"


def read_raw(text: str) -> list[tuple[str, list[str], int]]:
    """py-spy raw lines: 'thread (tid): name;frame;...;frame count' -> (thread, frames, count)."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        stack, _, count = line.rpartition(" ")
        parts = stack.split(";")
        thread = parts[0].split(": ", 1)[-1] if parts[0].startswith("thread") else ""
        rows.append((thread, parts[1:], int(count)))
    return rows


def pct(x: float) -> str:
    return f"{x:.0%}" if x >= 0.005 else ("0%" if x == 0 else "<1%")


def spy_table(rows: list[tuple[str, list[str], int]], title: str) -> list[str]:
    by_thread: dict[str, Counter[str]] = defaultdict(Counter)
    for thread, frames, count in rows:
        by_thread[group_of(thread)][classify(frames)] += count
    categories = sorted({c for counts in by_thread.values() for c in counts})
    out = [f"### {title}", "", "| thread | samples | " + " | ".join(categories) + " |",
           "|---|---:|" + "---:|" * len(categories)]  # fmt: skip
    for thread, counts in sorted(by_thread.items(), key=lambda kv: -sum(kv[1].values())):
        total = sum(counts.values())
        out.append(f"| {thread} | {total} | " + " | ".join(pct(counts[c] / total) for c in categories) + " |")
    return [*out, ""]


def engine_table(rows: list[tuple[str, list[str], int]], thread: str) -> list[str]:
    table: dict[str, Counter[str]] = defaultdict(Counter)
    total = 0
    for name, frames, count in rows:
        if group_of(name) != thread:
            continue
        total += count
        table[innermost(frames, "genscore_core/")][classify(frames)] += count
    if not total:
        return []
    out = [f"### The engine's thread ({thread}) by innermost genscore frame, share of its samples", "",
           "| innermost genscore frame | share | what it was doing |", "|---|---:|---|"]  # fmt: skip
    for frame, counts in sorted(table.items(), key=lambda kv: -sum(kv[1].values()))[:20]:
        n = sum(counts.values())
        doing = ", ".join(f"{c} {pct(k / n)}" for c, k in counts.most_common(3))
        out.append(f"| {frame} | {pct(n / total)} | {doing} |")
    leaves: Counter[str] = Counter()
    for name, frames, count in rows:
        if (
            group_of(name) == thread
            and frames
            and classify(frames) in ("native (other)", "CUDA runtime / driver (launch, copy)")
        ):
            leaves[" <- ".join(reversed(frames[-3:]))] += count
    out += ["", "Innermost native frames of its 'native (other)' and 'CUDA runtime' samples: "
            + "; ".join(f"{pct(n / total)} {leaf}" for leaf, n in leaves.most_common(8))]  # fmt: skip
    return [*out, ""]


def gil_table(rows: list[tuple[str, list[str], int]]) -> list[str]:
    holders: Counter[str] = Counter()
    functions: dict[str, Counter[str]] = defaultdict(Counter)
    for thread, frames, count in rows:
        group = group_of(thread)
        holders[group] += count
        py = [f for f in frames if ".py:" in f]
        where = innermost(py, "genscore_core/") if any("genscore_core/" in f for f in py) else ""
        leaf = re.sub(r":\d+\)$", ")", py[-1]) if py else "(native)"
        functions[group][f"{leaf}" + (f" [in {where}]" if where and where != leaf else "")] += count
    total = sum(holders.values())
    out = ["### Who holds the interpreter lock (py-spy --gil), share of samples", "",
           "| thread | share | top innermost functions |", "|---|---:|---|"]  # fmt: skip
    for group, n in holders.most_common():
        top = "; ".join(f"{f} {pct(k / n)}" for f, k in functions[group].most_common(4))
        out.append(f"| {group} | {pct(n / total)} | {top} |")
    return [*out, ""]


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def trace_tables(trace: dict[str, Any]) -> list[str]:
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    calls = sorted(
        (e for e in events if str(e.get("name", "")).startswith("probe.call")), key=lambda e: e["ts"]
    )
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    runtime = {
        e["args"].get("correlation"): e for e in events if e.get("cat") == "cuda_runtime" and "args" in e
    }
    out = ["### Inside the profiled engine calls (torch.profiler; ms)", "",
           "| call | jobs? | wall | before first kernel | GPU busy | busy share | GPU gaps (>50 us): count, total, largest; launched late | tail after last kernel | host outside torch ops | syncs (count, ms) | kernels |",
           "|---|---|---:|---:|---:|---:|---|---:|---:|---|---:|"]  # fmt: skip
    for call in calls:
        start, end = call["ts"], call["ts"] + call["dur"]
        tid = call.get("tid")
        kernels = [e for e in gpu if start <= e["ts"] <= end + 5e4]
        if kernels:
            intervals = union([(e["ts"], e["ts"] + e["dur"]) for e in kernels])
            busy = sum(b - a for a, b in intervals)
            first, last = intervals[0][0], intervals[-1][1]
            gaps = [(b0, a1) for (_, b0), (a1, _) in itertools.pairwise(intervals) if a1 - b0 > 50]
            late = 0.0
            for b0, a1 in gaps:
                nxt = next((e for e in kernels if e["ts"] >= a1), None)
                launch = runtime.get((nxt or {}).get("args", {}).get("correlation"))
                if launch is not None and launch["ts"] + launch.get("dur", 0) > b0:
                    late += a1 - b0  # the GPU waited for this launch
            gap_total = sum(a1 - b0 for b0, a1 in gaps)
            gap_text = (f"{len(gaps)}, {gap_total / 1e3:.1f}, {max((a1 - b0 for b0, a1 in gaps), default=0) / 1e3:.1f}; "
                        f"{late / 1e3:.1f} launched late")  # fmt: skip
        else:
            busy, first, last, gap_text = 0.0, start, start, "(no kernels)"
        ops = sorted(
            (
                e
                for e in events
                if e.get("cat") == "cpu_op" and e.get("tid") == tid and start <= e["ts"] <= end
            ),
            key=lambda e: e["ts"],
        )
        covered = sum(b - a for a, b in union([(e["ts"], e["ts"] + e["dur"]) for e in ops]))
        syncs = [e for e in events if e.get("cat") == "cuda_runtime" and start <= e["ts"] <= end
                 and "Synchronize" in e.get("name", "")]  # fmt: skip
        sync_ms = sum(e["dur"] for e in syncs) / 1e3
        out.append(
            f"| {call['name']} | | {call['dur'] / 1e3:.1f} | {(first - start) / 1e3:.1f} | {busy / 1e3:.1f} | "
            f"{pct(busy / call['dur'])} | {gap_text} | {(end - last) / 1e3:.1f} | "
            f"{(call['dur'] - covered) / 1e3:.1f} | {len(syncs)}, {sync_ms:.1f} | {len(kernels)} |"
        )
    # The host's largest spans outside torch ops on the launching thread, with the ops around them.
    out.append("")
    if calls:
        tid = calls[0].get("tid")
        ops = sorted(
            (e for e in events if e.get("cat") == "cpu_op" and e.get("tid") == tid), key=lambda e: e["ts"]
        )
        top = []
        reach = 0.0
        previous = None
        for e in ops:
            if previous is not None and e["ts"] > reach:
                top.append((e["ts"] - reach, previous["name"], e["name"]))
            if e["ts"] + e["dur"] > reach:
                reach, previous = e["ts"] + e["dur"], e
        top.sort(reverse=True)
        out += ["Largest host spans outside torch ops on the launching thread (ms, op before -> op after): "
                + "; ".join(f"{d / 1e3:.1f} ({a} -> {b})" for d, a, b in top[:10]), ""]  # fmt: skip
        hist = Counter()
        for d, _, _ in top:
            hist[
                "<0.05 ms" if d < 50 else "0.05-0.5 ms" if d < 500 else "0.5-2 ms" if d < 2000 else ">2 ms"
            ] += d
        total = sum(hist.values())
        out += ["Host time outside torch ops by span length: "
                + ", ".join(f"{k} {v / 1e3:.1f} ms ({pct(v / total)})" for k, v in sorted(hist.items())), ""]  # fmt: skip
    return out


def calls_table(report: dict[str, Any], window: tuple[float, float] | None = None) -> list[str]:
    calls = [c for c in report.get("calls", []) if not c.get("profiled")]
    if len(calls) < 3:
        return []
    calls = calls[-60:]
    span = calls[-1]["end"] - calls[0]["start"]
    inside = sum(c["end"] - c["start"] for c in calls)
    gaps = [(b["start"] - a["end"]) * 1e3 for a, b in itertools.pairwise(calls)]
    walls = [(c["end"] - c["start"]) * 1e3 for c in calls]
    return ["### Engine calls (the last 60 unprofiled)", "",
            f"{len(calls)} calls over {span:.2f} s: inside calls {pct(inside / span)}; call wall p50 "
            f"{statistics.median(walls):.1f} ms; gap between calls p50 {statistics.median(gaps):.1f} ms, "
            f"mean {statistics.fmean(gaps):.1f} ms, max {max(gaps):.1f} ms; jobs a call "
            f"{statistics.fmean(c['jobs'] for c in calls):.1f}, tokens a call {statistics.fmean(c['tokens'] for c in calls):,.0f}",
            ""]  # fmt: skip


def timeline_tables(timeline: list[dict[str, Any]], title: str, detail: int = 24) -> list[str]:
    """Where the GPU had nothing queued between a loaded server's calls, and why (serve_probe.py's
    timeline: host times of each call's take, layout, launch, collect and answer; GPU times of the
    first and last work it queued)."""
    calls = sorted((c for c in timeline if "gpu_start" in c and "gpu_end" in c), key=lambda c: c["gpu_start"])
    if len(calls) < 3:
        return []
    first, last = calls[0]["gpu_start"], calls[-1]["gpu_end"]
    span = last - first
    queued = sum(c["gpu_end"] - c["gpu_start"] for c in calls)
    rows = []
    for before, call in itertools.pairwise(calls):
        rows.append(
            {
                "call": call,
                "idle": call["gpu_start"] - before["gpu_end"],
                # > 0: taken / launch begun that long before the GPU ran out of queued work.
                "take_slack": before["gpu_end"] - call.get("take", call["gpu_start"]),
                "launch_slack": before["gpu_end"] - call.get("launch_start", call["gpu_start"]),
                "prev_answered": before.get("answered", before["gpu_end"]),
            }
        )
    idle = [r["idle"] * 1e3 for r in rows]
    ahead = [r for r in rows if r["call"].get("laid_out")]
    inline = [r for r in rows if not r["call"].get("laid_out")]

    def mean(values: list[float]) -> str:
        return f"{statistics.fmean(values):.1f}" if values else "-"

    def kind(group: list[dict[str, Any]], name: str) -> str:
        if not group:
            return f"| {name} | 0 | | | | | | | |"
        c = [r["call"] for r in group]
        gpu = [(x["gpu_end"] - x["gpu_start"]) * 1e3 for x in c]
        pairs = [x.get("prompts", 0) for x in c]
        return (
            f"| {name} | {len(group)} | {mean([x.get('jobs', 0) for x in c])} | {mean(pairs)} | "
            f"{mean([r['idle'] * 1e3 for r in group])} | {sum(r['idle'] > 0.0005 for r in group)} | "
            f"{mean([r['take_slack'] * 1e3 for r in group])} | {mean(gpu)} | "
            f"{sum(gpu) / max(sum(pairs), 1):.3f} |"
        )

    out = [f"### {title}: engine calls on the GPU ({len(calls)} calls over {span:.2f} s)", "",
           f"GPU with work queued {pct(queued / span)} of the span; nothing queued between calls "
           f"{(span - queued) * 1e3:.0f} ms ({pct((span - queued) / span)}): per call p50 "
           f"{statistics.median(idle):.1f} ms, mean {statistics.fmean(idle):.1f} ms, max {max(idle):.1f} ms; "
           f"calls with a gap over 0.5 ms: {sum(x > 0.5 for x in idle)} of {len(idle)}.", "",
           "| calls | count | jobs | prompts | idle before (ms) | with idle > 0.5 ms | taken before the GPU ran dry (ms) | GPU span (ms) | GPU span ms a prompt |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
           kind(ahead, "laid out ahead"), kind(inline, "taken after the call before was answered"), ""]  # fmt: skip
    sizes = Counter(r["call"].get("jobs", 0) for r in rows)
    out += ["Jobs a call (count of calls): " + ", ".join(f"{k}: {v}" for k, v in sorted(sizes.items())), ""]
    waits = [
        (r["call"]["take"] - a) * 1e3
        for r in rows
        for a in r["call"].get("arrived", [])
        if a is not None and "take" in r["call"]
    ]
    if waits:
        waits.sort()
        out += [f"A request's time in the queue before its call was taken: p10 {waits[len(waits) // 10]:.1f}, "
                f"p50 {waits[len(waits) // 2]:.1f}, p90 {waits[int(len(waits) * 0.9)]:.1f} ms", ""]  # fmt: skip
    out += ["| # | jobs | prompts | ahead | running at take | take: ms after previous answer | take: ms before GPU ran dry | "
            "laid out (ms) | launch: ms before GPU ran dry | launch (ms) | idle before (ms) | GPU span (ms) | "
            "launch end - GPU end (ms) | collect wait (ms) | GPU end -> answered (ms) |",
            "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for i, r in enumerate(rows[:detail]):
        c = r["call"]

        def ms(a: str, b: str, c: dict[str, Any] = c) -> str:
            return f"{(c[b] - c[a]) * 1e3:.1f}" if a in c and b in c else ""

        take_after = f"{(c['take'] - r['prev_answered']) * 1e3:.1f}" if "take" in c else ""
        out.append(
            f"| {i} | {c.get('jobs', '')} | {c.get('prompts', '')} | {'yes' if c.get('laid_out') else 'no'} | "
            f"{c.get('running', '')} | {take_after} | {r['take_slack'] * 1e3:.1f} | {ms('prepare_start', 'prepare_end')} | "
            f"{r['launch_slack'] * 1e3:.1f} | {ms('launch_start', 'launch_end')} | {r['idle'] * 1e3:.1f} | "
            f"{ms('gpu_start', 'gpu_end')} | {ms('gpu_end', 'launch_end')} | {ms('collect_start', 'collect_end')} | "
            f"{ms('gpu_end', 'answered')} |"
        )
    return [*out, ""]


def threads_table(threads: dict[str, Any]) -> list[str]:
    rows = threads.get("threads", [])
    groups: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in rows:
        key = group_of(r["python"]) if r["python"] else f"{r['comm']} (native)"
        g = groups[key]
        g["n"] += 1
        for k in (
            "run_share",
            "wait_share",
            "voluntary_ctxt_switches_per_s",
            "nonvoluntary_ctxt_switches_per_s",
        ):
            g[k] += r[k]
    out = [f"### Threads of the server process (/proc, {threads.get('clients')} clients; GPU busy "
           f"{pct(threads.get('gpu_busy') or 0)}, {threads.get('calls_in_window')} engine calls)", "",
           "| thread(s) | count | on a CPU (cores) | waiting for a CPU (cores) | voluntary switches/s | involuntary/s |",
           "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for key, g in sorted(groups.items(), key=lambda kv: -kv[1]["run_share"]):
        if g["run_share"] < 0.005 and g["wait_share"] < 0.005:
            continue
        out.append(f"| {key} | {g['n']:.0f} | {g['run_share']:.2f} | {g['wait_share']:.2f} | "
                   f"{g['voluntary_ctxt_switches_per_s']:,.0f} | {g['nonvoluntary_ctxt_switches_per_s']:,.0f} |")  # fmt: skip
    return [*out, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("archive", help="probe-NAME.tar.gz from bench_serve.py --probe, or its folder")
    args = parser.parse_args()
    files: dict[str, bytes] = {}
    path = Path(args.archive)
    if path.suffix == ".json":  # bench_serve.json: the timeline of each window of a probed server
        lines: list[str] = []
        for result in json.loads(path.read_text())["results"]:
            for w in result.get("windows", []):
                if w.get("timeline"):
                    lines += timeline_tables(w["timeline"], f"{result['name']}, {w['clients']} clients")
        print("\n".join(lines))
        return
    if path.is_dir():
        files = {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()}
    else:
        with tarfile.open(path) as tar:
            for member in tar.getmembers():
                handle = tar.extractfile(member) if member.isfile() else None
                if handle is not None:
                    files[Path(member.name).name] = handle.read()
    out: list[str] = [f"## Diagnosis of {path.name}", ""]
    report = json.loads(files["report.json"]) if "report.json" in files else {}
    if report:
        out.append(
            f"switch interval {report['switch_interval_s'] * 1e3:.1f} ms; Python threads: {report['threads']}"
        )
        out.append("")
        out += calls_table(report)
        out += timeline_tables(report.get("timeline", [])[-80:], "The diagnostic window's last 80 calls")
    if "threads.json" in files:
        out += threads_table(json.loads(files["threads.json"]))
    if "pyspy_native.txt" in files:
        rows = read_raw(files["pyspy_native.txt"].decode())
        out += spy_table(rows, "What each thread does (py-spy --native --idle, share of its samples)")
        out += engine_table(rows, "genscore-forward_*")
    if "pyspy_gil.txt" in files:
        out += gil_table(read_raw(files["pyspy_gil.txt"].decode()))
    if "trace.json" in files:
        out += trace_tables(json.loads(files["trace.json"]))
    lags = report.get("loop_lag_ms") or []
    if lags:
        lags = sorted(lags)
        out += [f"Event loop lag of a 5 ms sleep: p50 {lags[len(lags) // 2]:.2f} ms, p90 "
                f"{lags[int(len(lags) * 0.9)]:.2f} ms, max {lags[-1]:.1f} ms ({len(lags)} wakes)", ""]  # fmt: skip
    sampler = report.get("sampler") or {}
    if sampler.get("rounds"):
        out += [f"### Python stack sampler ({sampler['rounds']} rounds)", ""]
        for group, entries in sampler["top"].items():
            out.append(f"- **{group}** ({sampler['samples'][group]} samples): "
                       + "; ".join(f"{n} x {stack.split(' <- ')[0]}" for n, stack in entries[:6]))  # fmt: skip
        out.append("")
    print("\n".join(out))


if __name__ == "__main__":
    main()
