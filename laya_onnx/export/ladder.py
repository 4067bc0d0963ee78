"""The export's precision step: lower the validated fp32 graph (`precision.py`) and hold it to its
precision bar (bf16 keeps the graph and holds OpenVINO's bf16 computation of it to the bar).

A reduced-precision graph is judged against fp32 **torch** on two suites, each request encoded by
the runtime core and decoded by the core decoder, exactly as for the fp32 validation:

- `export-cases`: the exporter's built-in requests (`cases.py`);
- `parity-<suite>`: the parity suite's requests (`laya_onnx/parity/suites/`; the refusals and the
  question-less requests aside, they run no forward pass).

Per suite it measures the max |Δp| of the unrounded option probabilities (and the noul value) and
the share of decisions (choice label, most likely score level, noul side) that agree with fp32,
both by the parity rule's own code (`laya_onnx.core.judge.judge`), and splits the decisions by
fp32's own margin into near ties and decisive ones (`precision.PrecisionBar`). If any suite misses
its precision bar (`precision.PRECISION_BARS`), the export stops and nothing is written.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from laya_onnx.core.bundle import (
    DEFAULT_EXTERNAL_DATA_THRESHOLD,
    GRAPH_DATA_FILE,
    GRAPH_INPUTS,
    GRAPH_OUTPUTS,
)
from laya_onnx.core.int8_kernel import AUTO, U8S8, Int8KernelError, choose_kernel, cpu_info
from laya_onnx.core.manifest import PrecisionRecord
from laya_onnx.export import validation
from laya_onnx.export.cases import Call, encode_calls
from laya_onnx.export.errors import ExportError, ValidationError
from laya_onnx.export.int8_forms import write_u8s8_form
from laya_onnx.export.precision import (
    PRECISION_BARS,
    Int8Plan,
    PrecisionBar,
    check_int8_plan,
    check_precision,
    lower_precision,
)

DEFAULT_SUITE = "core"
#: What a bf16 bundle's manifest says it runs: an fp32 graph (transformers' layers), its GEMMs
#: computed in bf16 by OpenVINO (`laya_onnx.core.openvino_session.bf16_gemms`).
BF16_RECORD: dict[str, Any] = {
    "rewrite": None,
    "matmuls": 0,
    "runtime": "OpenVINO CPU plugin: the encoder's GEMMs but the first layer's in bf16, everything "
    "else f32 (the graph is the fp32 one; a CPU without bf16 or without the openvino package runs "
    "it fp32 on onnxruntime)",
    "measured_on": "the graph on OpenVINO at bf16 on this CPU",
}
#: The parity rule's value tolerances are meant for fp32; the gate reads its measurements only.
_MEASURE_ONLY = 1.0


def suite_calls(suite: str, mask_token: str) -> list[Call]:
    """The parity suite's answered requests as built-in-shaped calls (one forward pass each)."""
    from laya_onnx.parity.suite import load_suite

    calls = []
    for req in load_suite(suite, mask_token):
        if req.get("expect_error") or not req.get("questions"):
            continue
        states = req["states"] if "states" in req else [req["state"]]
        calls.append(Call(req["name"], states, list(req["questions"]), req["questions"]))
    return calls


@dataclass
class Suite:
    """One suite's encoded requests and fp32 torch's outputs on them."""

    name: str
    calls: list[Call]
    cases: list[dict[str, Any]]
    expected: list[tuple] = field(default_factory=list)


def measure_agreement(session, suite: Suite, calibration, tie_margin: float | None = None) -> dict[str, Any]:
    """Run `suite` on `session` and compare its decoded answers with fp32 torch's.

    Besides max |dp| and the agreement over every decision, the decisions are split at
    `tie_margin` (None: the measured max |dp|) by fp32 torch's own margin: the near ties below it
    and the decisive ones, whose agreement the gate reads (`PrecisionBar`)."""
    from laya_onnx.core.judge import decision, decision_margin, judge

    max_dp = max_dact = 0.0
    outcomes: list[tuple[float, bool, str]] = []  # per decision: fp32's margin, flipped, where
    for call, case, (t_logits, t_act) in zip(suite.calls, suite.cases, suite.expected, strict=True):
        feeds = case["feeds"]
        o_logits, o_act = session.run(list(GRAPH_OUTPUTS), {k: feeds[k] for k in GRAPH_INPUTS})
        reference = validation.decoded_answers(call, feeds, t_logits, t_act, calibration)
        ours = validation.decoded_answers(call, feeds, o_logits, o_act, calibration)
        verdict = judge(reference, ours, tolerance=_MEASURE_ONLY, act_tolerance=_MEASURE_ONLY)
        max_dp, max_dact = max(max_dp, verdict.max_abs_dp), max(max_dact, verdict.max_abs_dact)
        for s, (ref_state, our_state) in enumerate(zip(reference.unrounded, ours.unrounded, strict=True)):
            for qid, answer in ref_state["answers"].items():
                mine = our_state["answers"].get(qid)
                flipped = mine is None or decision(answer) != decision(mine)
                outcomes.append((decision_margin(answer), flipped, f"{call.name}: state {s}, {qid!r}"))
    return agreement_record(outcomes, max_dp, max_dact, tie_margin) | {"requests": len(suite.calls)}


def agreement_record(
    outcomes: list[tuple[float, bool, str]], max_dp: float, max_dact: float, tie_margin: float | None
) -> dict[str, Any]:
    """A suite's measurements from its decisions (fp32's margin, flipped, where) and max |dp|."""
    tie = max_dp if tie_margin is None else tie_margin
    flips = [(margin, where) for margin, flipped, where in outcomes if flipped]
    decisive = [flipped for margin, flipped, _ in outcomes if margin >= tie]
    return {
        "decisions": len(outcomes),
        "agreeing": len(outcomes) - len(flips),
        "agreement": round(1 - len(flips) / len(outcomes), 6) if outcomes else 1.0,
        "max_abs_dp": max_dp,
        "max_abs_dact": max_dact,
        # decisions fp32 torch itself makes within the measured max |dp| of flipping: the only
        # ones that can flip (every flip is one of them); on random weights, most of the suite
        "near_ties": sum(margin < max_dp for margin, _, _ in outcomes),
        "tie_margin": tie,
        "decisive": len(decisive),
        "decisive_agreeing": decisive.count(False),
        "decisive_agreement": round(decisive.count(False) / len(decisive), 6) if decisive else 1.0,
        "flipped": [f"{where} (fp32 margin {margin:.3g})" for margin, where in flips][:20],
    }


class _OpenVINOOutputs:
    """An `OpenVINOSession` behind onnxruntime's `run(output_names, feeds)`, for `measure_agreement`."""

    def __init__(self, graph: Path):
        from laya_onnx.core.openvino_session import OpenVINOSession

        self._session = OpenVINOSession(str(graph))

    def run(self, names: list[str], feeds: dict[str, Any]) -> tuple:
        return self._session.run(feeds)


class _Replay:
    """Outputs computed beforehand, handed back one case at a time in `measure_agreement`'s order."""

    def __init__(self, outputs: list[tuple]):
        self._outputs = iter(outputs)

    def run(self, names: list[str], feeds: dict[str, Any]) -> tuple:
        return next(self._outputs)


def torch_bf16_outputs(model, cases: list[dict[str, Any]]) -> list[tuple]:
    """fp32 torch's `reference_outputs` under CPU autocast to bf16, as laya's LAYA_CPU_AMP=bf16
    runs it (GEMMs in bf16; softmax, LayerNorm and the residual stream in f32)."""
    import torch

    def forward(*inputs):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return tuple(t.float() for t in model(*inputs))

    return validation.reference_outputs(forward, cases)


def meets_bar(measured: dict[str, Any], bar: PrecisionBar) -> bool:
    """Whether one suite's agreement with fp32 torch reaches `bar`."""
    return measured["max_abs_dp"] <= bar.max_abs_dp and measured["decisive_agreement"] >= bar.min_agreement


class PrecisionStep:
    """Prepared while torch is loaded (`reference`), applied once the fp32 graph has validated."""

    def __init__(
        self,
        precision: str,
        bar: PrecisionBar | None = None,
        suite: str = DEFAULT_SUITE,
        plan: Int8Plan | None = None,
    ):
        self.precision = check_precision(precision)
        if self.precision == "fp32":
            raise ValueError("fp32 is the exported graph itself; there is nothing to lower")
        if self.precision == "bf16":
            from laya_onnx.core.openvino_session import bf16_unavailable

            # its gate measures OpenVINO's bf16 here: a machine that would compute fp32 cannot
            reason = bf16_unavailable()
            if reason is not None:
                raise ExportError(f"a bf16 bundle is exported and gated on a CPU that runs bf16: {reason}")
        check_int8_plan(self.precision, plan)
        self.plan = plan
        self.bar = bar or PRECISION_BARS[self.precision]
        self.parity_suite = suite
        self.suites: list[Suite] = []
        #: bf16: laya's own bf16 mode on CPU (torch autocast) on the same suites, set beside the gate
        self.torch_bf16: list[list[tuple]] = []

    def reference(
        self,
        model,
        export_calls,
        export_cases,
        export_expected,
        tokenizer_dir: Path,
        budgets: tuple[int, int],
    ) -> int:
        """fp32 torch's outputs on both suites (the export cases' are computed by the exporter)."""
        from laya_onnx.core.tokenizer import LayaTokenizer

        mask = LayaTokenizer.from_dir(tokenizer_dir).mask_token
        calls = suite_calls(self.parity_suite, mask)
        cases = encode_calls(tokenizer_dir, budgets[0], budgets[1], calls)
        self.suites = [
            Suite("export-cases", list(export_calls), export_cases, export_expected),
            Suite(f"parity-{self.parity_suite}", calls, cases, validation.reference_outputs(model, cases)),
        ]
        if self.precision == "bf16":
            self.torch_bf16 = [torch_bf16_outputs(model, suite.cases) for suite in self.suites]
        return sum(c["rows"] for c in cases)

    def _lower(self, fp32_graph: Path, out: Path, threshold: int, emulate: bool = False) -> dict[str, Any]:
        """Write `fp32_graph` lowered to `out` (inline, or with external data above `threshold`).

        The fp32 graph is read without its external data: each weight the rewrite lowers is read
        from disk on its own, the ones it keeps are streamed from the fp32 data file to the new
        one, so the fp32 weights are never all in memory at once. The result is written to a
        staging folder and moved into place, because `out` may be the graph being read.
        """
        import gc
        import os

        import onnx
        import onnx_ir as ir

        from laya_onnx.export.graph_file import save_graph

        model = onnx.load(str(fp32_graph), load_external_data=False)
        rewrite = lower_precision(
            model, self.precision, emulate=emulate, plan=self.plan, base_dir=str(fp32_graph.parent)
        )
        lowered = ir.from_proto(model)
        del model
        ir.external_data.set_base_dir(lowered.graph, fp32_graph.parent)
        out.parent.mkdir(exist_ok=True)
        staging = out.parent / "lowering"
        staging.mkdir()
        save_graph(lowered, staging / out.name, external_data_threshold=threshold)
        del lowered
        gc.collect()
        os.replace(staging / out.name, out)
        if (staging / GRAPH_DATA_FILE).exists():
            os.replace(staging / GRAPH_DATA_FILE, out.with_name(GRAPH_DATA_FILE))
        else:
            out.with_name(GRAPH_DATA_FILE).unlink(missing_ok=True)
        staging.rmdir()
        onnx.checker.check_model(str(out))
        return rewrite

    def _measure(self, graph: Path, calibration, suites: list[Suite]) -> dict[str, Any]:
        session = _OpenVINOOutputs(graph) if self.precision == "bf16" else validation.open_session(graph)
        return {s.name: measure_agreement(session, s, calibration, self.bar.tie_margin) for s in suites}

    def _kernels_identical(self, graph: Path, record: dict[str, Any], steps=None) -> bool | str:
        """Whether both int8 forms give bit-identical logits on the export cases, where this CPU can
        run both (VNNI); a ValidationError when they differ."""
        try:
            choose_kernel(PrecisionRecord.parse(record), U8S8)
        except Int8KernelError:
            return f"not checked: this CPU ({cpu_info().model}) has no VNNI to run the u8s8 form exactly"
        outputs = {}
        for kernel, file in record["kernels"].items():
            session = validation.open_session(graph.with_name(file))
            outputs[kernel] = [
                session.run(list(GRAPH_OUTPUTS), {k: case["feeds"][k] for k in GRAPH_INPUTS})
                for case in self.suites[0].cases
            ]
            del session
        first, *others = outputs.values()
        same = all(
            np.array_equal(a, b)
            for other in others
            for run_a, run_b in zip(first, other, strict=True)
            for a, b in zip(run_a, run_b, strict=True)
        )
        if not same:
            raise ValidationError(
                f"the int8 kernels {', '.join(outputs)} answer differently on the export cases; no bundle was written"
            )
        if steps is not None:
            steps.say(f"    {' and '.join(outputs)} forms: bit-identical logits on the export cases")
        return True

    def apply(
        self,
        graph: Path,
        calibration,
        steps=None,
        external_data_threshold: int = DEFAULT_EXTERNAL_DATA_THRESHOLD,
    ) -> PrecisionRecord:
        """Rewrite `graph` in place to this precision and gate it; the manifest's `precision` record.

        int8 is gated on the written graph itself, in the form this CPU runs (`core.int8_kernel`);
        where it can run both, both must give bit-identical logits (`kernels_identical`). fp16 is
        gated on its emulation (the same rewrite with each fp16 rounding explicit,
        `precision._to_fp16`), because onnxruntime's CPU EP computes the written fp16 graph in
        fp32; the written graph is run on the export cases too (`cpu_ep`), which proves it loads
        and runs. Raises `ValidationError` (nothing written) when any suite misses the gate.
        """
        record: dict[str, Any] = {"precision": self.precision}
        if self.precision == "bf16":
            record.update(BF16_RECORD)
            measured = self._measure(graph, calibration, self.suites)
            record["torch_bf16"] = {
                s.name: measure_agreement(_Replay(outputs), s, calibration, self.bar.tie_margin)
                for s, outputs in zip(self.suites, self.torch_bf16, strict=True)
            }
        elif self.precision == "fp16":
            emulation = graph.parent / "fp16-emulation" / graph.name  # its own external data
            self._lower(graph, emulation, external_data_threshold, emulate=True)
            measured = self._measure(emulation, calibration, self.suites)
            shutil.rmtree(emulation.parent)
            record.update(self._lower(graph, graph, external_data_threshold))
            record["measured_on"] = "the fp16 arithmetic emulated in fp32 on the CPU EP (see cpu_ep)"
            record["cpu_ep"] = self._measure(graph, calibration, self.suites[:1])
        else:
            record.update(self._lower(graph, graph, external_data_threshold))
            record["kernels"] = write_u8s8_form(graph)
            choice = choose_kernel(PrecisionRecord.parse(record), AUTO)
            record["measured_on"] = (
                f"the written graph on the CPU EP, {choice.kernel} kernel ({choice.graph})"
            )
            measured = self._measure(graph.with_name(choice.graph), calibration, self.suites)
            record["kernels_identical"] = self._kernels_identical(graph, record, steps)
        record.update(
            {
                "reference": "fp32 torch (the checkpoint's DecisionModel)",
                # the manifest's key stays "gate", so bundles written before still load
                "gate": self.bar.as_dict(),
                "suites": measured,
                "passed": all(meets_bar(m, self.bar) for m in measured.values()),
            }
        )
        if steps is not None:
            for name, m in measured.items():
                steps.say(
                    f"    {name:<14} {m['agreeing']}/{m['decisions']} decisions agree "
                    f"({100 * m['agreement']:.2f}%), max |dp| {m['max_abs_dp']:.2e}, "
                    f"max |dact| {m['max_abs_dact']:.2e}; {m['near_ties']} decisions within that |dp| "
                    f"of flipping in fp32 itself; {m['decisive_agreeing']}/{m['decisive']} of those fp32 "
                    f"makes by >= {m['tie_margin']:.3g} agree"
                )
            for name, m in (record.get("torch_bf16") or {}).items():
                steps.say(
                    f"    {name:<14} laya's bf16 (torch autocast) beside it: {m['agreeing']}/{m['decisions']} "
                    f"decisions agree, max |dp| {m['max_abs_dp']:.2e}"
                )
            for name, m in (record.get("cpu_ep") or {}).items():
                steps.say(f"    {name:<14} written graph on the CPU EP: max |dp| {m['max_abs_dp']:.2e}")
        if not record["passed"]:
            worst = "; ".join(
                f"{name}: max |dp| {m['max_abs_dp']:.3g}, {100 * m['decisive_agreement']:.2f}% of the "
                f"{m['decisive']} decisions fp32 makes by >= {m['tie_margin']:.3g} agree"
                + (f" (flipped: {', '.join(m['flipped'][:3])})" if m["flipped"] else "")
                for name, m in measured.items()
                if not meets_bar(m, self.bar)
            )
            tie = "the measured max |dp|" if self.bar.tie_margin is None else f"{self.bar.tie_margin:g}"
            raise ValidationError(
                f"{self.precision} misses its precision bar (max |dp| <= {self.bar.max_abs_dp:g}, >= "
                f"{100 * self.bar.min_agreement:g}% of the decisions fp32 torch makes by a margin of at "
                f"least {tie} agreeing): {worst}; no bundle was written"
            )
        return PrecisionRecord.parse(record)
