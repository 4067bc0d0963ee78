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
"""

from __future__ import annotations

import gc
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from laya_onnx import __version__ as LAYA_ONNX_VERSION
from laya_onnx.core.bundle import (
    CONFIG_FILE,
    DEFAULT_EXTERNAL_DATA_THRESHOLD,
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
from laya_onnx.export.errors import ExportError, ValidationError
from laya_onnx.export.ladder import PrecisionStep
from laya_onnx.export.precision import DEFAULT_PRECISION, check_int8_plan, check_precision
from laya_onnx.export.progress import Steps, peak_rss_mb
from laya_onnx.export.validation import (
    answering_calibration,
    failure_reason,
    reference_outputs,
    to_torch,
    validate_graph,
)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
#: Profiles shipped in the repository's top-level `export/profiles/` (documentation of defaults).
DEFAULT_OPSET = 17
DEFAULT_TOLERANCE = 1e-4
DYNAMO_MIN_OPSET = 18
#: The TorchScript exporter writes fused attention (one MultiHeadAttention node per layer, masks
#: built once); "unfused" keeps transformers' op-by-op SDPA graph, the only one dynamo writes.
DEFAULT_ATTENTION = "fused"


def tool_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"laya_onnx": LAYA_ONNX_VERSION}
    for name in ("torch", "transformers", "onnx", "onnxruntime"):
        try:
            versions[name] = __import__(name).__version__
        except Exception:  # pragma: no cover - a missing optional tool is recorded as None
            versions[name] = None
    return versions


def _export_graph(
    model, feeds: dict[str, np.ndarray], path: Path, *, opset: int, dynamo: bool, external_data_threshold: int
) -> dict[str, Any]:
    """Trace `model` to `path` (weights streamed, see `graph_file`); returns what was written,
    with `exporter`, a description of the exporter used."""
    import torch

    from laya_onnx.export.graph_file import save_graph, weights_bytes, write_torchscript_graph

    args = to_torch(feeds)
    if not dynamo:
        written = write_torchscript_graph(
            model, args, path, opset=opset, external_data_threshold=external_data_threshold
        )
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
    external = save_graph(program.model, path, external_data_threshold=external_data_threshold)
    return {
        "exporter": "torch.onnx.export (dynamo)",
        "external_data": external,
        "weights_bytes": weights_bytes(program.model),
    }


def _optimized(graph: Path, validation, cases, expected, cfg, steps: Steps, written) -> tuple[dict, dict]:
    """Fuse `graph`, validate the result on the same cases; adopt it only if it passes.
    Returns the manifest's optimization record and the validation of the graph that is kept."""
    from laya_onnx.export.cases import CALLS
    from laya_onnx.export.optimize import adopt, optimize_graph

    candidate_dir = graph.parent / "optimized"
    candidate, record = optimize_graph(graph, candidate_dir, external_data=bool(written["external_data"]))
    steps.say(f"    {record['nodes_before']} -> {record['nodes_after']} nodes; fusions {record['fusions']}")
    check = validate_graph(
        candidate,
        cases,
        expected,
        validation["tolerance"],
        steps,
        calibration=answering_calibration(cfg),
        calls=CALLS,
    )
    record["validation"] = {k: check[k] for k in ("max_abs_logit_diff", "max_abs_act_diff", "passed")}
    record["kept"] = bool(check["passed"])
    if not check["passed"]:
        record["reason"] = f"the optimized graph failed validation: {failure_reason(check)}"
        steps.say(f"    not kept: {record['reason']}")
        shutil.rmtree(candidate_dir)
        return record, validation
    adopt(candidate_dir, graph.parent)
    check["seconds"] = validation.get("seconds")
    steps.say("    kept: the optimized graph passed validation")
    return record, check


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


def pass_memory_record(graph: Path, steps: Steps | None = None) -> dict[str, Any]:
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
    return {"model": model.as_dict(), "samples": samples}


def _copy_tokenizer(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True)
    if not (src / "tokenizer.json").is_file():
        raise ExportError(f"checkpoint tokenizer {str(src)!r} has no tokenizer.json")
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)


def export_bundle(
    checkpoint,
    out_dir,
    *,
    revision: str | None = None,
    opset: int = DEFAULT_OPSET,
    tolerance: float = DEFAULT_TOLERANCE,
    dynamo: bool = False,
    force: bool = False,
    verbose: bool = True,
    cache_dir: os.PathLike | None = None,
    name: str | None = None,
    attention: str | None = None,
    measure_memory: bool = True,
    external_data_threshold: int = DEFAULT_EXTERNAL_DATA_THRESHOLD,
    optimize: bool = False,
    calibration: os.PathLike | str | None = None,
    precision: str = DEFAULT_PRECISION,
    precision_gate=None,
    int8_plan=None,
) -> dict[str, Any]:
    """Export `checkpoint` (directory or Hub id) to the bundle directory `out_dir`; returns the manifest.

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
    against fp32 torch (`laya_onnx.export.ladder`; `precision_gate` overrides its `Gate`);
    `int8_plan` (`precision.Int8Plan`) overrides which MatMuls int8 lowers and how.
    """
    from laya_onnx.core.hub import fetch_checkpoint
    from laya_onnx.export.cases import CALLS, encode_calls, trace_feeds
    from laya_onnx.export.model import ATTENTION_KINDS, load_decision_model

    check_int8_plan(precision, int8_plan)
    ladder = (
        None
        if check_precision(precision) == DEFAULT_PRECISION
        else PrecisionStep(precision, precision_gate, plan=int8_plan)
    )

    if attention is None:
        attention = "unfused" if dynamo else DEFAULT_ATTENTION
    if attention not in ATTENTION_KINDS:
        raise ValueError(f"attention must be one of {ATTENTION_KINDS}, got {attention!r}")
    if dynamo and attention == "fused":
        raise ExportError(
            "fused attention is written by the TorchScript exporter; use attention='unfused' with dynamo"
        )

    if isinstance(opset, bool) or not isinstance(opset, int) or opset < 14:
        raise ValueError(f"opset must be an integer >= 14 (scaled_dot_product_attention), got {opset!r}")
    if (
        isinstance(external_data_threshold, bool)
        or not isinstance(external_data_threshold, int)
        or external_data_threshold < 0
    ):
        raise ValueError(
            f"external_data_threshold must be a non-negative number of bytes, got {external_data_threshold!r}"
        )
    if not (isinstance(tolerance, (int, float)) and np.isfinite(tolerance) and tolerance > 0):
        raise ValueError(f"tolerance must be a positive number, got {tolerance!r}")
    out_dir = Path(out_dir)
    check_output_dir(out_dir, force)
    if calibration is not None:
        load_calibration(calibration)  # refuse a bad file before the export's work
    steps = Steps(verbose)
    started = time.perf_counter()

    with steps.run(f"resolving checkpoint {os.fspath(checkpoint)!r}"):
        source = fetch_checkpoint(checkpoint, revision=revision, cache_dir=cache_dir)
        ckpt = source.path
        steps.say(
            f"    {ckpt}" + (f" (repo {source.repo}, revision {source.revision})" if source.repo else "")
        )
    with steps.run("loading the decision model (strict key and shape checks)"):
        model, cfg = load_decision_model(ckpt)
        model.use_attention(attention)
        ecfg = model.encoder.config
        n_params = sum(p.numel() for p in model.parameters())
        steps.say(
            f"    {n_params / 1e6:.1f}M parameters; encoder {ecfg.num_hidden_layers} x {ecfg.hidden_size}, "
            f"window {ecfg.local_attention}, head layers {cfg.get('head_layers', 2)}, {attention} attention"
        )
        architecture = model_architecture(model, attention)
    max_len, head_max_len = int(cfg.get("max_len", 512)), int(cfg.get("head_max_len", 192))
    with steps.run(f"encoding built-in requests (max_len {max_len}, head_max_len {head_max_len})"):
        cases = encode_calls(ckpt / TOKENIZER_DIR, max_len, head_max_len)
        trace = trace_feeds(ckpt / TOKENIZER_DIR, max_len, head_max_len, int(ecfg.local_attention))
        steps.say(
            f"    {len(cases)} requests, {sum(c['rows'] for c in cases)} rows; trace batch "
            f"{'x'.join(map(str, trace['input_ids'].shape))}"
        )

    # Torch answers first, while its model is needed anyway; the model is freed once the graph is
    # written, before ONNX Runtime loads its own copy of the weights (so at most one copy is alive).
    with steps.run(f"running torch on the built-in requests ({sum(c['rows'] for c in cases)} rows)"):
        torch_started = time.perf_counter()
        expected = reference_outputs(model, cases, steps)
        if ladder is not None:  # and on the parity suite, for the precision gate
            rows = ladder.reference(
                model, CALLS, cases, expected, ckpt / TOKENIZER_DIR, (max_len, head_max_len)
            )
            steps.say(f"    and on the parity suite {ladder.parity_suite!r} ({rows} rows)")
        torch_seconds = time.perf_counter() - torch_started

    with staged_directory(out_dir) as tmp:
        graph = tmp / GRAPH_FILE
        export_started = time.perf_counter()
        if dynamo and opset < DYNAMO_MIN_OPSET:
            # The dynamo exporter translates at opset 18+; converting its graph down to 17 leaves
            # opset-18 attributes behind (e.g. Split's num_outputs) and produces an invalid model.
            steps.say(
                f"note: the dynamo exporter needs opset >= {DYNAMO_MIN_OPSET}; using {DYNAMO_MIN_OPSET} instead of {opset}"
            )
            opset = DYNAMO_MIN_OPSET
        with steps.run(
            f"exporting the graph (opset {opset}, {'dynamo' if dynamo else 'TorchScript'} exporter)"
        ):
            written = _export_graph(
                model,
                trace,
                graph,
                opset=opset,
                dynamo=dynamo,
                external_data_threshold=external_data_threshold,
            )
            del model
            gc.collect()
            import onnx

            onnx.checker.check_model(str(graph))
            steps.say(
                f"    {written['weights_bytes'] / 2**20:.1f} MiB of weights, "
                + (
                    f"external data in {', '.join(written['external_data'])}"
                    if written["external_data"]
                    else "inline"
                )
            )
        export_seconds = time.perf_counter() - export_started
        with steps.run(f"validating ONNX Runtime against torch (tolerance {tolerance:g})"):
            ort_started = time.perf_counter()
            validation = validate_graph(
                graph,
                cases,
                expected,
                float(tolerance),
                steps,
                calibration=answering_calibration(cfg),
                calls=CALLS,
            )
            validation["seconds"] = {
                "torch": round(torch_seconds, 2),
                "onnxruntime": round(time.perf_counter() - ort_started, 2),
            }
            answers = validation["answers"]
            steps.say(
                f"    max |dlogit| {validation['max_abs_logit_diff']:.3e}, "
                f"max |dact_logit| {validation['max_abs_act_diff']:.3e}; answers by the parity rule: "
                f"max |dp| {answers['max_abs_dp']:.2e}, {answers['rounding_flips']} rounding flips, "
                f"{'passed' if answers['passed'] else 'FAILED'}"
            )
        if not validation["passed"]:
            raise ValidationError(f"{failure_reason(validation)}; no bundle was written to {str(out_dir)!r}")
        optimization = None
        if optimize:
            with steps.run("optimizing the graph (onnxruntime.transformers fusions), then validating it"):
                optimization, validation = _optimized(graph, validation, cases, expected, cfg, steps, written)
        precision_record = None
        if ladder is not None:
            with steps.run(f"lowering to {precision} and gating it against fp32 torch"):
                precision_record = ladder.apply(
                    graph, answering_calibration(cfg), steps, external_data_threshold
                )
                written["external_data"] = [GRAPH_DATA_FILE] if (tmp / GRAPH_DATA_FILE).exists() else []
        memory = None
        if measure_memory and Path("/proc/self/status").exists():
            with steps.run("measuring per-pass memory (fresh process per shape)"):
                memory = pass_memory_record(graph, steps)
        with steps.run(f"writing the bundle to {str(out_dir)!r}"):
            _copy_tokenizer(ckpt / TOKENIZER_DIR, tmp / TOKENIZER_DIR)
            shutil.copyfile(ckpt / CONFIG_FILE, tmp / CONFIG_FILE)
            if calibration is not None:
                shutil.copyfile(calibration, tmp / BUNDLE_CALIBRATION_FILE)
            manifest = write_manifest(
                tmp,
                source={
                    **source.as_dict(),
                    **({"name": name} if name else {}),
                    "weights_sha256": sha256_file(ckpt / WEIGHTS_FILE),
                },
                tools=tool_versions(),
                export={
                    "opset": opset,
                    "exporter": written["exporter"],
                    "seconds": round(export_seconds, 2),
                    "total_seconds": round(time.perf_counter() - started, 2),
                    "peak_rss_mb": peak_rss_mb(),
                    "attention": attention,
                    "architecture": architecture,
                },
                graph={"file": GRAPH_FILE, "external_data": written["external_data"]},
                validation=validation,
                **({"optimization": optimization} if optimization is not None else {}),
                precision=precision_record or {"precision": DEFAULT_PRECISION},
                **({"memory": memory} if memory is not None else {}),
                **(
                    {"calibration": {"file": BUNDLE_CALIBRATION_FILE, "source": os.fspath(calibration)}}
                    if calibration is not None
                    else {}
                ),
            )
    steps.say(
        f"bundle ready: {out_dir} ({sum(f['bytes'] for f in manifest['files'].values()) / 2**20:.1f} MiB, "
        f"{time.perf_counter() - started:.1f}s total, peak RSS {manifest['export']['peak_rss_mb']} MiB)"
    )
    return manifest
