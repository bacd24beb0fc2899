"""Trial (issue 34, point 4): FP8 with the rows every prompt shares kept in bf16, speed and accuracy.

    python benchmarks/trial_fp8_exact_rows.py              # one GPU with FP8 tensor cores
    python benchmarks/trial_fp8_exact_rows.py --dry-run    # the CPU: the decoder's plumbing only

The CPU simulation (``fp8_centring.py --by-position both``, docs/benchmarks.md) found that the scale-1
shift of the FP8 scheme on the 0.6B shape comes mostly from the tokens every W1 prompt shares: the
prefix (template head, instruction, query) and the template's suffix. Their rounding errors are the same
in every prompt. Left unquantised, the error fell under 5x the official bf16 recipe's on both draws.
This trial measures that scheme inside genscore's decoder on the GPU:

* :class:`ExactRowsDecoder`, an EXPERIMENTAL subclass for this trial only (it overrides the decoder's
  private product steps; put in place through the public ``scorer.engine.forward.decoder``, the
  package is not patched). It runs every product in FP8 as genscore does, then the rows of each
  computed prefix and the last ``--tail`` rows of each prompt again in bf16 (gathered, one more GEMM
  each), written over the FP8 rows; the last layer, which reads only each prompt's last row, runs in
  bf16. Eager only (no CUDA graphs: the rows are found on the host for each batch), so it is timed
  beside genscore's bf16 and FP8 scorers without graphs as well as with their graph ladders.
* W1 (1 query x ``--docs`` fresh documents of 128-512 words, ``rerank``), the scorers in turn, two
  rounds; then the first call's scores of each against the official recipe in fp32 (and the official
  recipe in bf16, the yardstick), max / mean error, Kendall tau, top-10 overlap. ``--profile``: the
  GPU kernel time of one call of each eager scorer (torch profiler), what its graph would take.
  ``--output-bf16``: also genscore's FP8 with the attention's output projection left in bf16 (the one
  product whose input FP8 quantises in a kernel of its own), on its own graph ladder.

``--dry-run`` checks the plumbing on the CPU (``torch._scaled_mm`` runs there): with every row exact the
decoder must give the bf16 decoder's rows, with none the FP8 decoder's.
"""

from __future__ import annotations

import argparse
import typing
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from common import (
    OFFICIAL_SUFFIX,
    OfficialRecipe,
    Report,
    Texts,
    build_model,
    call_times,
    load_tokenizer,
    median,
    run_reported,
    scored_in_order,
    word_list,
)
from fp8_common import agreement, allow_fp8_on_the_cpu, describe

from genscore_core import GenerativeScorer
from genscore_core.kernels import fused_ops
from genscore_core.packed.decoder import PackedDecoder
from genscore_core.packed.fp8 import Fp8Rows


class MixedRows(NamedTuple):
    """A product's input: every row quantised, and the exact rows again in bf16."""

    quant: Fp8Rows  # [T, K]
    exact: torch.Tensor  # [P, K] bf16
    at: torch.Tensor  # [P] stream rows of the exact ones

    @property
    def shape(self) -> torch.Size:
        return self.quant.shape


def exact_rows(dev: Any, tail: int, every_row: bool = False) -> np.ndarray:
    """Stream rows kept exact: every row of a prefix segment, the last ``tail`` rows of each prompt's."""
    table = dev.batch.segments  # [S, 6]: q_start, q_len, ...
    prompts = set(dev.batch.prompt_segments.tolist())
    rows: list[np.ndarray] = []
    for s, (start, length) in enumerate(table[:, :2].tolist()):
        keep = length if every_row or s not in prompts else min(tail, length)
        rows.append(np.arange(start + length - keep, start + length))
    return np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)


def decoder_class(tail: int, every_row: bool = False) -> Any:
    """EXPERIMENTAL, this trial only: genscore's FP8 decoder with the exact rows in bf16."""
    for step in ("_add_norm", "_project", "_output", "_mlp", "_last_layer"):
        if not hasattr(PackedDecoder, step):
            raise RuntimeError(
                f"PackedDecoder has no {step} step any more: the trial's decoder needs updating"
            )

    class ExactRowsDecoder(PackedDecoder):
        calls = 0
        rows: typing.ClassVar[list[int]] = [0, 0]  # exact rows, all rows

        def run(self, dev: Any, loaded: Any = None, into: Any = None) -> Any:
            assert self.fp8 is not None, "the trial's decoder is built with quantization='fp8'"
            index = exact_rows(dev, tail, every_row)
            self._index = torch.from_numpy(index).to(self.device)
            self._bf16 = False  # _last_layer sets it: from there on every product runs in bf16
            type(self).calls += 1
            type(self).rows[0] += len(index)
            type(self).rows[1] += dev.num_tokens
            return super().run(dev, loaded, into)

        def _add_norm(self, residual: Any, delta: Any, weight: Any, dtype: Any = None) -> Any:
            if dtype is not None or self._bf16:
                return fused_ops.add_rmsnorm(residual, delta, weight, self.eps, dtype or self.dtype,
                                             impl=self.ops_impl)  # fmt: skip
            quant = super()._add_norm(residual, delta, weight)  # residual += delta, in place
            exact = fused_ops.add_rmsnorm(residual.index_select(0, self._index), None, weight, self.eps,
                                          self.dtype, impl=self.ops_impl)  # fmt: skip
            return MixedRows(quant, exact, self._index)

        def _project(self, h: Any, index: int, name: Any, rows: int) -> torch.Tensor:
            if not isinstance(h, MixedRows):
                return super()._project(h, index, name, rows)
            out = super()._project(h.quant, index, name, rows)
            out[: h.shape[0]].index_copy_(0, h.at, F.linear(h.exact, *getattr(self.layers[index], name)))
            return out

        def _output(self, index: int, attn: torch.Tensor) -> torch.Tensor:
            flat = attn.view(attn.shape[0], -1)
            if self._bf16:
                return F.linear(flat, *self.layers[index].o)
            out = super()._output(index, attn)
            out.index_copy_(
                0, self._index, F.linear(flat.index_select(0, self._index), *self.layers[index].o)
            )
            return out

        def _mlp(self, index: int, h: Any) -> torch.Tensor:
            if not isinstance(h, MixedRows):
                if self._bf16:
                    layer = self.layers[index]
                    return F.linear(self._gated(layer, h), *layer.down)
                return super()._mlp(index, h)
            out = super()._mlp(index, h.quant)
            layer = self.layers[index]
            gate_up = F.linear(h.exact, *layer.gate_up)
            half = gate_up.shape[1] // 2
            act = fused_ops.silu_mul(gate_up[:, :half], gate_up[:, half:], impl=self.ops_impl)
            out.index_copy_(0, h.at, F.linear(act, *layer.down))
            return out

        def _last_layer(self, step: Any, h: Any, residual: torch.Tensor) -> torch.Tensor:
            # Keys and values of every row as above (mixed); the rows the last layer reads (each
            # segment's last, an exact row) from their bf16 norm, and the rest of the layer in bf16.
            index, layer, dev = len(self.layers) - 1, self.layers[-1], step.dev
            k, v = self._keys_values(step, index, self._project(h, index, "kv", dev.kv_len))
            last = dev.segment_last
            residual = residual.index_select(0, last)  # [S, H]
            self._bf16 = True
            h = self._add_norm(residual, None, layer.ln1)  # residual unchanged: delta None
            positions = dev.positions.index_select(0, last)
            q = F.linear(h, *layer.q).view(h.shape[0], self.num_heads, self.head_dim)
            attn = self._attend(step, layer, q, k, v, dev.last_segments, positions)
            attn = attn.index_select(0, dev.prompt_segments)
            residual = residual.index_select(0, dev.prompt_segments)
            h = self._add_norm(residual, self._output(index, attn), layer.ln2)
            return self._add_norm(residual, self._mlp(index, h), self.final_norm, torch.float32)

    return ExactRowsDecoder


def output_bf16_scorer(model: Any, tokenizer: Any) -> Any:
    """EXPERIMENTAL, this trial only: genscore's FP8 decoder with the attention's output projection in
    bf16 (its input is the attention's output, not a norm's or SiLU's, so FP8 quantises it in a kernel
    of its own), on a graph ladder captured with the public ``DecoderGraphs``."""
    from genscore_core.packed.graphs import DecoderGraphs, GraphLadder

    class OutputBf16Decoder(PackedDecoder):
        def _output(self, index: int, attn: torch.Tensor) -> torch.Tensor:
            return F.linear(attn.view(attn.shape[0], -1), *self.layers[index].o)

    scorer = GenerativeScorer.from_model(model, tokenizer, quantization="fp8", cuda_graphs=False)
    forward = scorer.engine.forward
    forward.decoder = OutputBf16Decoder(model, forward.decoder.options)
    graphs = DecoderGraphs(forward.decoder, GraphLadder.up_to(forward.max_batch_tokens))
    graphs.capture_all()
    if graphs.disabled is not None or not graphs.graphs:
        raise RuntimeError(f"the trial decoder's ladder was not captured: {graphs.disabled}")
    forward.graphs = graphs
    return scorer


def exact_scorer(model: Any, tokenizer: Any, tail: int, every_row: bool = False) -> tuple[Any, Any]:
    scorer = GenerativeScorer.from_model(model, tokenizer, quantization="fp8", cuda_graphs=False)
    forward = scorer.engine.forward
    cls = decoder_class(tail, every_row)
    forward.decoder = cls(model, forward.decoder.options)
    return scorer, cls


def dry_checks(report: Report, tokenizer: Any, texts: Texts, tail: int) -> None:
    """The plumbing on the CPU: with every row exact the decoder gives the plain decoder's scores."""
    model = build_model("tiny", "cpu", torch.float32)
    query, docs = texts.query(), texts.documents(6)
    plain = scored_in_order(GenerativeScorer.from_model(model, tokenizer).rerank(query, docs), 6)
    fp8 = scored_in_order(
        GenerativeScorer.from_model(model, tokenizer, quantization="fp8").rerank(query, docs), 6
    )
    scorer, cls = exact_scorer(model, tokenizer, tail, every_row=True)
    got = scored_in_order(scorer.rerank(query, docs), 6)
    diff = max(abs(a - b) for a, b in zip(got, plain, strict=True))
    if not cls.calls or diff > 1e-5:
        raise RuntimeError(f"every row exact differs from the plain decoder by {diff}")
    report.add("dry run", "every row exact against the plain decoder", diff, "max diff")
    scorer, cls = exact_scorer(model, tokenizer, tail)
    got = scored_in_order(scorer.rerank(query, docs), 6)
    report.add("dry run", f"tail {tail}: against bf16 / FP8", max(abs(a - b) for a, b in zip(got, plain)),
               "max diff", note=f"FP8 against bf16 {max(abs(a - b) for a, b in zip(fp8, plain)):.2e}; "
               f"{cls.rows[0]} of {cls.rows[1]} rows exact")  # fmt: skip


def kernel_ms(scorer: Any, query: str, documents: list[str]) -> float:
    """GPU kernel time of one call (torch profiler): the device time of every entry, less the aten
    operators' own entries, which count their kernels a second time."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        scorer.rerank(query, documents)
        torch.cuda.synchronize()
    events = prof.key_averages()
    return sum(e.self_device_time_total for e in events if not e.key.startswith("aten::")) / 1e3


def run(args: argparse.Namespace, report: Report) -> None:
    tokenizer = load_tokenizer()
    texts = Texts(word_list(tokenizer))
    tail = args.tail if args.tail is not None else len(tokenizer(OFFICIAL_SUFFIX)["input_ids"])
    if args.dry_run:
        allow_fp8_on_the_cpu()
        dry_checks(report, tokenizer, texts, tail)
        return
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU with FP8 tensor cores; --dry-run checks the plumbing on the CPU")
    for shape in args.shapes:
        docs = args.docs or (256 if shape == "0.6b" else 128)
        model = build_model(shape, "cuda", torch.bfloat16)
        work = [(texts.query(), texts.documents(docs)) for _ in range(args.calls)]
        warm = [(texts.query(), texts.documents(docs)) for _ in range(2)]
        ref = None
        if shape == "0.6b":
            pairs = [(work[0][0], d) for d in work[0][1]]
            ref_model = build_model(shape, "cuda", torch.float32)
            ref_model.load_state_dict(model.state_dict())
            ref = OfficialRecipe(ref_model, tokenizer)(pairs)
            del ref_model
            torch.cuda.empty_cache()
            official = agreement(OfficialRecipe(model, tokenizer)(pairs), ref)
        exact, cls = exact_scorer(model, tokenizer, tail)
        scorers = {
            "bf16 (graph ladder)": GenerativeScorer.from_model(model, tokenizer),
            "FP8 (graph ladder)": GenerativeScorer.from_model(model, tokenizer, quantization="fp8"),
            "bf16, no graphs": GenerativeScorer.from_model(model, tokenizer, cuda_graphs=False),
            "FP8, no graphs": GenerativeScorer.from_model(
                model, tokenizer, quantization="fp8", cuda_graphs=False
            ),
            f"FP8, prefix and last {tail} rows bf16, no graphs": exact,
        }
        if args.output_bf16:
            scorers["FP8, o_proj in bf16 (graph ladder)"] = output_bf16_scorer(model, tokenizer)
        for scorer in scorers.values():
            for query, documents in warm:
                scorer.rerank(query, documents)
        times: dict[str, list[float]] = {name: [] for name in scorers}
        first: dict[str, list[float]] = {}
        for _ in range(2):  # two rounds, the scorers in turn, so that drift hits all of them
            for name, scorer in scorers.items():
                if name not in first:
                    first[name] = scored_in_order(scorer.rerank(*work[0]), docs)
                times[name] += call_times([lambda q=q, d=d, s=scorer: s.rerank(q, d) for q, d in work])
        if args.profile:  # the eager scorers' GPU time alone: what a graph of each would cost
            query, documents = texts.query(), texts.documents(docs)
            for name, scorer in scorers.items():
                if "no graphs" in name:
                    report.add(f"{shape} W1 1 x {docs} fresh, one call", f"{name}: GPU kernel time",
                               kernel_ms(scorer, query, documents), "ms")  # fmt: skip
        bf16_eager = median(times["bf16, no graphs"])
        for name in scorers:
            s = median(times[name])
            note = f"p50 {s * 1e3:.1f} ms a call"
            if ref is not None:
                note += "; " + describe("vs fp32 recipe", agreement(first[name], ref), official)
            report.add(f"{shape} W1 1 x {docs} fresh", name, docs / s, "pairs/s", docs / bf16_eager, note)
        if ref is not None:
            report.add(f"{shape} W1 accuracy", "official bf16 recipe vs fp32 recipe: max error", official["max"], "",
                       note=describe("official bf16", official))  # fmt: skip
        report.add(f"{shape} W1", "exact rows of all rows", 100 * cls.rows[0] / max(cls.rows[1], 1), "%")
        del scorers, exact, model
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["0.6b", "8b"], choices=["0.6b", "4b", "8b"])
    parser.add_argument("--docs", type=int, default=0, help="W1 documents (default 256 for 0.6b, 128 else)")
    parser.add_argument("--calls", type=int, default=4, help="W1 calls per scorer and round (default 4)")
    parser.add_argument(
        "--output-bf16", action="store_true", help="also FP8 with the attention's output projection in bf16"
    )
    parser.add_argument("--profile", action="store_true", help="also each eager scorer's GPU kernel time")
    parser.add_argument("--tail", type=int, default=None,
                        help="each prompt's last rows kept exact (default: the official suffix's tokens)")  # fmt: skip
    run_reported(parser, "trial_fp8_exact_rows.py", run, dry_run="the CPU: plumbing checks only",
                 name="pairs/s or figure", baseline_name="bf16, no graphs")  # fmt: skip


if __name__ == "__main__":
    main()
