"""`export_bundle`: checkpoint -> one validated ONNX graph + tokenizer + config + manifest.

Steps (each printed with its timing):

1. resolve the checkpoint (local directory, or Hub repo id via `laya_onnx.core.hub`);
2. build the torch DecisionModel and load the weights with strict key and shape checks;
3. encode the built-in requests with the runtime core (`laya_onnx.core.sequences`);
4. trace ONE graph with dynamic batch / sequence / marker axes (names and axes from
   `laya_onnx.core.bundle.GRAPH_INPUTS` / `GRAPH_OUTPUTS`);
5. run it on ONNX Runtime (CPU) next to torch on every built-in request and compare: the raw
   outputs within `tolerance`, and the decoded answers by the parity rule
   (`laya_onnx.core.judge`); otherwise nothing is written;
6. assemble the bundle in a temporary sibling directory and rename it into place.

What to do comes from one `ExportOptions` (checked before any work); each step returns a typed
record, and the manifest (`laya_onnx.core.manifest.Manifest`) is built from those records.
"""

from __future__ import annotations

import gc
import os
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from laya_onnx import __version__ as LAYA_ONNX_VERSION
from laya_onnx.core.bundle import (
    CONFIG_FILE,
    GRAPH_DATA_FILE,
    GRAPH_FILE,
    GRAPH_INPUTS,
    GRAPH_OUTPUTS,
    TOKENIZER_DIR,
    WEIGHTS_FILE,
    check_output_dir,
    sha256_file,
    staged_directory,
    write_manifest,
)
from laya_onnx.core.calibration_file import BUNDLE_CALIBRATION_FILE, load_calibration
from laya_onnx.core.manifest import (
    AnswersRecord,
    CalibrationRecord,
    ExportRecord,
    GraphRecord,
    Manifest,
    MemoryRecord,
    OptimizationRecord,
    PrecisionRecord,
    SourceRecord,
    ValidationRecord,
)
from laya_onnx.export.errors import ExportError, ValidationError
from laya_onnx.export.ladder import PrecisionStep
from laya_onnx.export.options import DYNAMO_MIN_OPSET, ExportOptions
from laya_onnx.export.progress import Steps, peak_rss_mb
from laya_onnx.export.validation import (
    answering_calibration,
    failure_reason,
    reference_outputs,
    to_torch,
    validate_graph,
)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@dataclass(frozen=True)
class TraceRecord:
    """What tracing wrote: the exporter used, the opset, the weights' size and where they live."""

    exporter: str
    opset: int
    external_data: list[str]
    weights_bytes: int
    seconds: float
    layers: str


@dataclass(frozen=True)
class LoadedCheckpoint:
    """The checkpoint as the export reads it: where, its config, and the model's layer shapes."""

    path: Path
    source: SourceRecord
    cfg: dict[str, Any]
    architecture: dict[str, Any]

    @property
    def budgets(self) -> tuple[int, int]:
        """(max_len, head_max_len): what the built-in requests are encoded with."""
        return int(self.cfg.get("max_len", 512)), int(self.cfg.get("head_max_len", 192))

    @property
    def tokenizer_dir(self) -> Path:
        return self.path / TOKENIZER_DIR


@dataclass
class Reference:
    """The built-in requests encoded by the runtime core, and torch's outputs on them."""

    cases: list[dict[str, Any]]
    trace: dict[str, np.ndarray]
    expected: list[tuple] = field(default_factory=list)
    seconds: float = 0.0


def tool_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"laya_onnx": LAYA_ONNX_VERSION}
    for name in ("torch", "transformers", "onnx", "onnxruntime"):
        try:
            versions[name] = __import__(name).__version__
        except Exception:  # pragma: no cover - a missing optional tool is recorded as None
            versions[name] = None
    return versions


def _export_graph(model, feeds: dict[str, np.ndarray], path: Path, options: ExportOptions) -> dict[str, Any]:
    """Trace `model` to `path` (weights streamed, see `graph_file`); returns what was written,
    with `exporter`, a description of the exporter used."""
    import torch

    from laya_onnx.export.graph_file import save_graph, weights_bytes, write_torchscript_graph

    args, opset, threshold = to_torch(feeds), options.graph_opset, options.external_data_threshold
    if not options.dynamo:
        written = write_torchscript_graph(model, args, path, opset=opset, external_data_threshold=threshold)
        return {"exporter": "torch.onnx.export (TorchScript)", **written}
    from torch.export import Dim

    batch, seq = Dim("batch", min=1), Dim("sequence", min=2)
    markers = Dim("markers", min=2)
    shapes = {
        "input_ids": {0: batch, 1: seq},
        "attention_mask": {0: batch, 1: seq},
        "marker_pos": {0: batch, 1: markers},
        "marker_mask": {0: batch, 1: markers},
        "qtype": {0: batch},
    }
    with torch.no_grad():
        program = torch.onnx.export(
            model,
            args,
            dynamo=True,
            opset_version=opset,
            input_names=list(GRAPH_INPUTS),
            output_names=list(GRAPH_OUTPUTS),
            dynamic_shapes=shapes,
            optimize=True,
        )
    if program is None:  # only the TorchScript path returns None
        raise ExportError("torch.onnx.export(dynamo=True) returned no ONNX program")
    # The program's initializers are the torch tensors themselves; save_graph streams them.
    external = save_graph(program.model, path, external_data_threshold=threshold)
    return {
        "exporter": "torch.onnx.export (dynamo)",
        "external_data": external,
        "weights_bytes": weights_bytes(program.model),
    }


def model_architecture(model, attention: str) -> dict[str, Any]:
    """The layer shapes the pass memory estimate needs when a bundle has no measurement."""
    from laya_onnx.export.model import head_heads

    ecfg: Any = model.encoder.config
    return {
        "layers": int(ecfg.num_hidden_layers),
        "hidden": int(ecfg.hidden_size),
        "heads": int(ecfg.num_attention_heads),
        "intermediate": int(ecfg.intermediate_size),
        "local_attention": int(ecfg.local_attention),
        "head_layers": len(model.head.layers) if model.head is not None else 0,
        "head_heads": head_heads(int(ecfg.hidden_size)) if model.head is not None else 0,
        "attention": attention,
    }


def pass_memory_record(graph: Path, steps: Steps | None = None) -> MemoryRecord:
    """Measure the graph's per-pass memory and fit the model the runtime budgets with."""
    from laya_onnx.core.memory import fit_pass_memory, format_bytes, measure_pass_memory

    samples = measure_pass_memory(graph)
    model = fit_pass_memory([(s["rows"], s["length"], s["bytes"]) for s in samples])
    if steps is not None:
        for s in samples:
            steps.say(
                f"    {s['rows']:>3} x {s['length']:<5} peak +{format_bytes(s['bytes']):>11}"
                f"  model {format_bytes(model.estimate(s['rows'], s['length'])):>11}  {s['seconds']:.2f}s"
            )
        steps.say(
            f"    model: {model.per_token:.1f} B x rows x len + {model.per_token_sq:.2f} B x rows x len^2 "
            f"+ {format_bytes(model.fixed)}"
        )
    return MemoryRecord(model=model.as_dict(), samples=samples)


def _copy_tokenizer(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True)
    if not (src / "tokenizer.json").is_file():
        raise ExportError(f"checkpoint tokenizer {str(src)!r} has no tokenizer.json")
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)


class _Export:
    """One export's steps, in order; each returns its record, and the manifest is made of them."""

    def __init__(self, options: ExportOptions):
        self.options = options
        self.steps = Steps(options.verbose)
        self.started = time.perf_counter()
        self.ladder = (
            PrecisionStep(options.precision, options.precision_bar, plan=options.int8_plan)
            if options.lowered
            else None
        )
        #: torch's DecisionModel, from `load` until the graph is written (then freed, before ONNX
        #: Runtime loads its own copy of the weights: at most one copy is alive).
        self.model: Any = None

    def run(self, checkpoint, out_dir: Path) -> Manifest:
        loaded = self.load(checkpoint)
        reference = self.reference(loaded)
        with staged_directory(out_dir) as tmp:
            graph = tmp / GRAPH_FILE
            trace = self.trace(reference, graph)
            validation = self.validate(graph, reference, loaded)
            if not validation.passed:
                raise ValidationError(
                    f"{failure_reason(validation)}; no bundle was written to {str(out_dir)!r}"
                )
            optimization = None
            if self.options.optimize:
                optimization, validation = self.optimize(graph, validation, reference, loaded, trace)
            precision = PrecisionRecord()
            external_data = trace.external_data
            if self.ladder is not None:
                with self.steps.run(f"lowering to {self.options.precision} and gating it against fp32 torch"):
                    precision = self.ladder.apply(
                        graph,
                        answering_calibration(loaded.cfg),
                        self.steps,
                        self.options.external_data_threshold,
                    )
                    external_data = [GRAPH_DATA_FILE] if (tmp / GRAPH_DATA_FILE).exists() else []
            memory = None
            if self.options.measure_memory and Path("/proc/self/status").exists():
                with self.steps.run("measuring per-pass memory (fresh process per shape)"):
                    memory = pass_memory_record(graph, self.steps)
            with self.steps.run(f"writing the bundle to {str(out_dir)!r}"):
                manifest = self.write(
                    tmp,
                    loaded,
                    Manifest(
                        export=self.export_record(trace, loaded),
                        graph=GraphRecord(file=GRAPH_FILE, external_data=external_data),
                        validation=validation,
                        optimization=optimization,
                        precision=precision,
                        memory=memory,
                    ),
                )
        size = sum(entry.bytes or 0 for entry in manifest.files.values())
        self.steps.say(
            f"bundle ready: {out_dir} ({size / 2**20:.1f} MiB, {time.perf_counter() - self.started:.1f}s total, "
            f"peak RSS {peak_rss_mb()} MiB)"
        )
        return manifest

    def load(self, checkpoint) -> LoadedCheckpoint:
        """Resolve the checkpoint (directory or Hub id) and build its torch model (`self.model`)."""
        from laya_onnx.core.hub import fetch_checkpoint
        from laya_onnx.export.model import load_decision_model

        options, steps = self.options, self.steps
        with steps.run(f"resolving checkpoint {os.fspath(checkpoint)!r}"):
            source = fetch_checkpoint(checkpoint, revision=options.revision, cache_dir=options.cache_dir)
            where = f" (repo {source.repo}, revision {source.revision})" if source.repo else ""
            steps.say(f"    {source.path}{where}")
        with steps.run("loading the decision model (strict key and shape checks)"):
            model, cfg = load_decision_model(source.path)
            model.use_attention(options.attention_kind)
            ecfg = model.encoder.config
            n_params = sum(p.numel() for p in model.parameters())
            steps.say(
                f"    {n_params / 1e6:.1f}M parameters; encoder {ecfg.num_hidden_layers} x {ecfg.hidden_size}, "
                f"window {ecfg.local_attention}, head layers {cfg.get('head_layers', 2)}, "
                f"{options.attention_kind} attention"
            )
            self.model = model
        named = {**source.as_dict(), **({"name": options.name} if options.name else {})}
        return LoadedCheckpoint(
            path=source.path,
            source=SourceRecord.parse(named),
            cfg=cfg,
            architecture=model_architecture(model, options.attention_kind),
        )

    def reference(self, loaded: LoadedCheckpoint) -> Reference:
        """Encode the built-in requests and run torch on them (and on the parity suite, for the
        precision gate), while its model is loaded anyway."""
        from laya_onnx.export.cases import CALLS, encode_calls, trace_feeds

        max_len, head_max_len = loaded.budgets
        window = int(self.model.encoder.config.local_attention)
        with self.steps.run(f"encoding built-in requests (max_len {max_len}, head_max_len {head_max_len})"):
            reference = Reference(
                cases=encode_calls(loaded.tokenizer_dir, max_len, head_max_len),
                trace=trace_feeds(loaded.tokenizer_dir, max_len, head_max_len, window),
            )
            self.steps.say(
                f"    {len(reference.cases)} requests, {sum(c['rows'] for c in reference.cases)} rows; trace batch "
                f"{'x'.join(map(str, reference.trace['input_ids'].shape))}"
            )
        rows = sum(c["rows"] for c in reference.cases)
        with self.steps.run(f"running torch on the built-in requests ({rows} rows)"):
            started = time.perf_counter()
            reference.expected = reference_outputs(self.model, reference.cases, self.steps)
            if self.ladder is not None:
                suite_rows = self.ladder.reference(
                    self.model,
                    CALLS,
                    reference.cases,
                    reference.expected,
                    loaded.tokenizer_dir,
                    loaded.budgets,
                )
                self.steps.say(
                    f"    and on the parity suite {self.ladder.parity_suite!r} ({suite_rows} rows)"
                )
            reference.seconds = time.perf_counter() - started
        return reference

    def trace(self, reference: Reference, graph: Path) -> TraceRecord:
        """Write the graph, free the torch model, and check the graph is well formed."""
        import onnx

        options = self.options
        if options.graph_opset != options.opset:
            self.steps.say(
                f"note: the dynamo exporter needs opset >= {DYNAMO_MIN_OPSET}; "
                f"using {options.graph_opset} instead of {options.opset}"
            )
        exporter = "dynamo" if options.dynamo else "TorchScript"
        started = time.perf_counter()
        with self.steps.run(f"exporting the graph (opset {options.graph_opset}, {exporter} exporter)"):
            from laya_onnx.export.constant_shapes import (
                CONSTANT_SHAPE_LAYERS,
                ROTARY_OP_LAYERS,
                TRANSFORMERS_LAYERS,
                constant_shape_layers,
            )
            from laya_onnx.export.model import ordered_rotary_tables

            rewrite = constant_shape_layers(
                self.model, enabled=options.constant_shape_layers, rotary_op=options.rotary_op
            )
            with ordered_rotary_tables(), rewrite as rewritten:
                written = _export_graph(self.model, reference.trace, graph, options)
            self.model = None
            gc.collect()
            onnx.checker.check_model(str(graph))
            where = written["external_data"]
            self.steps.say(
                f"    {written['weights_bytes'] / 2**20:.1f} MiB of weights, "
                + (f"external data in {', '.join(where)}" if where else "inline")
            )
        return TraceRecord(
            exporter=written["exporter"],
            opset=options.graph_opset,
            external_data=list(written["external_data"]),
            weights_bytes=int(written["weights_bytes"]),
            seconds=time.perf_counter() - started,
            layers=(ROTARY_OP_LAYERS if options.rotary_op else CONSTANT_SHAPE_LAYERS)
            if rewritten
            else TRANSFORMERS_LAYERS,
        )

    def validate(self, graph: Path, reference: Reference, loaded: LoadedCheckpoint) -> ValidationRecord:
        """ONNX Runtime against torch on the built-in requests (outputs, and answers by the rule)."""
        from laya_onnx.export.cases import CALLS

        tolerance = float(self.options.tolerance)
        with self.steps.run(f"validating ONNX Runtime against torch (tolerance {tolerance:g})"):
            started = time.perf_counter()
            validation = validate_graph(
                graph,
                reference.cases,
                reference.expected,
                tolerance,
                self.steps,
                calibration=answering_calibration(loaded.cfg),
                calls=CALLS,
            )
            seconds = {
                "torch": round(reference.seconds, 2),
                "onnxruntime": round(time.perf_counter() - started, 2),
            }
            validation = replace(validation, seconds=seconds)
            answers = validation.answers or AnswersRecord()
            self.steps.say(
                f"    max |dlogit| {validation.max_abs_logit_diff:.3e}, "
                f"max |dact_logit| {validation.max_abs_act_diff:.3e}; answers by the parity rule: "
                f"max |dp| {answers.max_abs_dp:.2e}, {answers.rounding_flips} rounding flips, "
                f"{'passed' if answers.passed else 'FAILED'}"
            )
        return validation

    def optimize(
        self,
        graph: Path,
        validation: ValidationRecord,
        reference: Reference,
        loaded: LoadedCheckpoint,
        trace: TraceRecord,
    ) -> tuple[OptimizationRecord, ValidationRecord]:
        """Fuse `graph`, validate the result on the same cases; adopt it only if it passes.
        Returns the optimization record and the validation of the graph that is kept."""
        from laya_onnx.export.cases import CALLS
        from laya_onnx.export.optimize import adopt, optimize_graph

        steps = self.steps
        with steps.run("optimizing the graph (onnxruntime.transformers fusions), then validating it"):
            candidate_dir = graph.parent / "optimized"
            candidate, fused = optimize_graph(graph, candidate_dir, external_data=bool(trace.external_data))
            steps.say(
                f"    {fused['nodes_before']} -> {fused['nodes_after']} nodes; fusions {fused['fusions']}"
            )
            check = validate_graph(
                candidate,
                reference.cases,
                reference.expected,
                float(self.options.tolerance),
                steps,
                calibration=answering_calibration(loaded.cfg),
                calls=CALLS,
            )
            record = OptimizationRecord.parse(fused)
            record = replace(
                record,
                validation={
                    "max_abs_logit_diff": check.max_abs_logit_diff,
                    "max_abs_act_diff": check.max_abs_act_diff,
                    "passed": check.passed,
                },
                kept=bool(check.passed),
            )
            if not check.passed:
                record = replace(
                    record, reason=f"the optimized graph failed validation: {failure_reason(check)}"
                )
                steps.say(f"    not kept: {record.reason}")
                shutil.rmtree(candidate_dir)
                return record, validation
            adopt(candidate_dir, graph.parent)
            steps.say("    kept: the optimized graph passed validation")
            return record, replace(check, seconds=validation.seconds)

    def export_record(self, trace: TraceRecord, loaded: LoadedCheckpoint) -> ExportRecord:
        return ExportRecord(
            opset=trace.opset,
            exporter=trace.exporter,
            seconds=round(trace.seconds, 2),
            total_seconds=round(time.perf_counter() - self.started, 2),
            peak_rss_mb=peak_rss_mb(),
            attention=self.options.attention_kind,
            layers=trace.layers,
            architecture=loaded.architecture,
            cpu=_cpu_class(),
        )

    def write(self, tmp: Path, loaded: LoadedCheckpoint, records: Manifest) -> Manifest:
        """Copy the tokenizer, config and calibration beside the graph; write the manifest."""
        calibration = self.options.calibration
        _copy_tokenizer(loaded.tokenizer_dir, tmp / TOKENIZER_DIR)
        shutil.copyfile(loaded.path / CONFIG_FILE, tmp / CONFIG_FILE)
        if calibration is not None:
            shutil.copyfile(calibration, tmp / BUNDLE_CALIBRATION_FILE)
        manifest = replace(
            records,
            source=replace(loaded.source, weights_sha256=sha256_file(loaded.path / WEIGHTS_FILE)),
            tools=tool_versions(),
            calibration=(
                CalibrationRecord(file=BUNDLE_CALIBRATION_FILE, source=os.fspath(calibration))
                if calibration is not None
                else None
            ),
        )
        return write_manifest(tmp, manifest)


def _cpu_class() -> str:
    """This CPU's class and the cores this process may use, as timings name it."""
    from laya_onnx.core.machine import read_cpu

    cpu = read_cpu()
    return f"{cpu.label}, {cpu.cores} cores"


def export_bundle(checkpoint, out_dir, options: ExportOptions | None = None, **fields: Any) -> Manifest:
    """Export `checkpoint` (directory or Hub id) to the bundle directory `out_dir`; returns the manifest.

    How: `options` (`ExportOptions`), or its fields as keyword arguments (which replace those of
    `options` when both are given). A bad option raises `ExportOptionError` before any work.

    `calibration`: a calibration file (laya's `save_calibration` JSON) copied into the bundle as
    `calibration.json`, named in the manifest and hashed like every file; an `ONNXAgent` on the
    bundle applies it. A bad file is refused, naming the fault, before anything is exported.

    `name` is the checkpoint name the bundle answers to (a server's `model`/`routing` name);
    by default a published checkpoint's registry name, else its directory or repo name.
    `attention`: "fused" (default with TorchScript) or "unfused" (the op-by-op graph; the only
    one with `dynamo=True`). `measure_memory` probes the graph's per-pass memory in a few small
    passes and stores the fitted model in the manifest (Linux; skipped where /proc is missing).
    Weights above `external_data_threshold` bytes are written as ONNX external data
    (`laya.onnx.data`); 0 always writes it. `optimize` applies the fusions of
    `laya_onnx.export.optimize` and keeps them only if the fused graph passes validation too.
    `precision`: "fp32" (default), "fp16" or "int8": the validated fp32 graph is lowered and gated
    against fp32 torch (`laya_onnx.export.ladder`; `precision_bar` overrides its `PrecisionBar`);
    `int8_plan` (`precision.Int8Plan`) overrides which MatMuls int8 lowers and how.
    """
    if options is None:
        options = ExportOptions(**fields)
    elif fields:
        options = replace(options, **fields)
    out = Path(out_dir)
    check_output_dir(out, options.force)
    if options.calibration is not None:
        load_calibration(options.calibration)  # refuse a bad file before the export's work
    return _Export(options).run(checkpoint, out)
