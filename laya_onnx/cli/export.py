"""`laya-onnx export`: a checkpoint to a validated ONNX bundle (or the three of a models directory)."""

from __future__ import annotations

import argparse
from pathlib import Path

from laya_onnx.cli.common import EXIT_OK, UsageError


def _mebibytes(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number of MiB >= 0, got {value!r}")
    return number


NAME = "export"
HELP = "turn a checkpoint into a validated ONNX bundle (needs the export extra)"


def add_parser(sub) -> argparse.ArgumentParser:
    from laya_onnx.core.bundle import DEFAULT_EXTERNAL_DATA_THRESHOLD, GRAPH_DATA_FILE  # torch-free

    # options.py needs no torch: the defaults shown are the exporter's own
    from laya_onnx.export.options import ATTENTION_KINDS, DEFAULT_OPSET, DEFAULT_TOLERANCE, DYNAMO_MIN_OPSET

    p = sub.add_parser(
        NAME,
        help=HELP,
        description="Trace a checkpoint into one ONNX graph, check ONNX Runtime against torch on "
        "built-in requests, and write the bundle (graph, tokenizer, config, manifest). Nothing is "
        "written when the check fails.",
    )
    p.add_argument(
        "checkpoint",
        nargs="?",
        help="checkpoint directory or Hugging Face repo id[/subfolder]; with --all, a repo or "
        "directory laid out as laya's bundle repo (english at its root, multilingual/ and "
        "typed-decisions/ beside it)",
    )
    p.add_argument(
        "-o",
        "--output",
        required=True,
        help="directory to write the bundle to (with --all: the models directory)",
    )
    p.add_argument(
        "--all",
        action="store_true",
        help="write english/, multilingual/ and typed-decisions/ bundles into the output (a models "
        "directory for 'laya-onnx serve MODELS_DIR'): CHECKPOINT's three, or with --hub laya's own "
        "from the Hub; with neither, the tiny test presets as tiny-english/, tiny-multilingual/ "
        "and tiny-typed-decisions/ (random weights, routed in those checkpoints' places)",
    )
    p.add_argument(
        "--hub",
        action="store_true",
        help="with --all: export the three registry checkpoints of convaiinnovations/laya from the Hub",
    )
    p.add_argument("--revision", default=None, help="Hub revision (commit, tag, or 'reviewed')")
    p.add_argument(
        "--opset",
        type=int,
        default=DEFAULT_OPSET,
        help=f"ONNX opset (default %(default)s; dynamo uses {DYNAMO_MIN_OPSET}+)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        help="max |Δlogit| allowed vs torch (default %(default)s)",
    )
    p.add_argument("--dynamo", action="store_true", help="use the torch.export-based exporter")
    p.add_argument(
        "--attention",
        choices=ATTENTION_KINDS,
        default=None,
        help="fused (default with TorchScript): one MultiHeadAttention node per layer, masks built "
        "once; unfused: transformers' op-by-op graph (the old default; the only one with --dynamo)",
    )
    p.add_argument(
        "--no-memory-probe",
        action="store_true",
        help="skip measuring per-pass memory (the runtime then estimates it from the architecture)",
    )
    p.add_argument(
        "--optimize",
        action="store_true",
        help="fuse the graph with onnxruntime.transformers' optimizer (SkipLayerNormalization, Gelu); "
        "kept only if the fused graph passes validation too (the manifest records the fusions)",
    )
    p.add_argument(
        "--external-data-threshold",
        type=_mebibytes,
        default=None,
        metavar="MIB",
        help="write the weights as ONNX external data (%s) when they exceed MIB (default %d; 0: always)"
        % (GRAPH_DATA_FILE, DEFAULT_EXTERNAL_DATA_THRESHOLD // 2**20),
    )
    _add_precision_options(p)
    p.add_argument("--force", action="store_true", help="replace a non-empty output directory")
    p.add_argument(
        "--name",
        default=None,
        help="checkpoint name the bundle answers to (default: the published name, else the directory name)",
    )
    p.add_argument(
        "--calibration",
        default=None,
        metavar="FILE",
        help="a calibration file (laya's save_calibration JSON) to carry in the bundle; the bundle "
        "then answers with its temperatures and binning map",
    )
    return p


def _add_precision_options(p: argparse.ArgumentParser) -> None:
    # precision.py imports numpy only: the defaults below are the exporter's own, read without torch
    from laya_onnx.export.precision import DEFAULT_INT8_PLAN, DEFAULT_PRECISION, PRECISION_BARS, PRECISIONS

    def per_precision(field: str) -> str:
        return ", ".join(f"{name} {getattr(bar, field)}" for name, bar in PRECISION_BARS.items())

    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=DEFAULT_PRECISION,
        help="the graph's precision (default %(default)s): fp32 as traced; fp16: the encoder's GEMMs "
        "in fp16 for CUDA; int8: batch-invariant per-row int8 for CPU; bf16: the fp32 graph run by "
        "OpenVINO in bf16 on CPUs with AVX512-BF16 or AMX (the openvino extra). Each is gated against "
        "fp32 torch on the export cases "
        "and the parity suite (max |dp|, decision agreement) and refused below the gate",
    )
    p.add_argument(
        "--gate-max-dp",
        type=float,
        default=None,
        help="the gate's max |dp| vs fp32 torch (default: %s)" % per_precision("max_abs_dp"),
    )
    p.add_argument(
        "--gate-min-agreement",
        type=float,
        default=None,
        help="the gate's least share of the decisions fp32 torch makes by at least the tie margin "
        "that agree with it (default: %s)" % per_precision("min_agreement"),
    )
    p.add_argument(
        "--gate-tie-margin",
        type=float,
        default=None,
        help="decisions fp32 torch makes by a smaller margin (half the gap between its two best "
        "options) are near ties, reported and not counted; default: %s (none: the measured max "
        "|dp|, which leaves max |dp| as the bar; 0 counts every decision)" % per_precision("tie_margin"),
    )
    p.add_argument(
        "--int8-keep-fp32",
        default=None,
        metavar="MODULES",
        help="int8: comma-separated modules whose MatMuls stay fp32: encoder ones by kind (attn.Wqkv, "
        "attn.Wo, mlp.Wi, mlp.Wo), layer (layers.0) or both (layers.0.mlp.Wo), the decision head's "
        "layers as 'head'; '' lowers all (default: %s)" % ",".join(DEFAULT_INT8_PLAN.keep_fp32),
    )
    p.add_argument(
        "--int8-weight-bits",
        type=int,
        choices=[7, 8],
        default=None,
        help="int8: 7-bit weight codes (u8 x s8 on every CPU) or 8-bit (half the rounding; u8 x s8 "
        "where the CPU has VNNI, u8 x u8 elsewhere; exact everywhere either way) (default: %s)"
        % DEFAULT_INT8_PLAN.weight_bits,
    )


def precision_bar(args: argparse.Namespace):
    """The --precision's precision bar with --gate-max-dp / --gate-min-agreement / --gate-tie-margin applied
    (None: the default)."""
    given = (args.gate_max_dp, args.gate_min_agreement, args.gate_tie_margin)
    if all(value is None for value in given):
        return None
    from dataclasses import replace

    from laya_onnx.export.precision import PRECISION_BARS

    options = "--gate-max-dp, --gate-min-agreement and --gate-tie-margin"
    if args.precision not in PRECISION_BARS:
        raise UsageError(f"{options} apply to --precision fp16, int8 or bf16")
    if not all(value is None or 0.0 <= value <= 1.0 for value in given):
        raise UsageError(f"{options} must be within [0, 1]")
    changed = zip(("max_abs_dp", "min_agreement", "tie_margin"), given, strict=True)
    return replace(
        PRECISION_BARS[args.precision], **{name: value for name, value in changed if value is not None}
    )


def int8_plan(args: argparse.Namespace):
    """The int8 plan from --int8-keep-fp32 / --int8-weight-bits (None: the default plan)."""
    if args.int8_keep_fp32 is None and args.int8_weight_bits is None:
        return None
    from laya_onnx.export.precision import DEFAULT_INT8_PLAN, Int8Plan

    if args.precision != "int8":
        raise UsageError("--int8-keep-fp32 and --int8-weight-bits apply to --precision int8")
    keep = DEFAULT_INT8_PLAN.keep_fp32
    if args.int8_keep_fp32 is not None:
        keep = tuple(p.strip() for p in args.int8_keep_fp32.split(",") if p.strip())
    bits = DEFAULT_INT8_PLAN.weight_bits if args.int8_weight_bits is None else args.int8_weight_bits
    return Int8Plan(keep_fp32=keep, weight_bits=bits)


def run(args: argparse.Namespace) -> int:
    from laya_onnx.export import export_bundle

    options = dict(
        revision=args.revision,
        opset=args.opset,
        tolerance=args.tolerance,
        dynamo=args.dynamo,
        force=args.force,
        attention=args.attention,
        measure_memory=not args.no_memory_probe,
        optimize=args.optimize,
        precision=args.precision,
        precision_bar=precision_bar(args),
        int8_plan=int8_plan(args),
    )

    if args.external_data_threshold is not None:
        options["external_data_threshold"] = args.external_data_threshold * 2**20
    if args.all:
        from laya_onnx.export.models_dir import HUB, export_models_dir

        if args.name is not None:
            raise UsageError("--name does not apply to --all (each bundle answers to its own name)")
        if args.calibration is not None:
            raise UsageError("--calibration does not apply to --all (a file is fitted for one checkpoint)")
        source = HUB if args.hub else args.checkpoint
        if args.hub and args.checkpoint is not None:
            raise UsageError("give either a CHECKPOINT repo or --hub with --all, not both")
        export_models_dir(Path(args.output), source, **options)
    elif args.checkpoint is None or args.hub:
        raise UsageError("export needs a CHECKPOINT (or --all to write the three of a models directory)")
    else:
        manifest = export_bundle(
            args.checkpoint, Path(args.output), name=args.name, calibration=args.calibration, **options
        )
        print("\n".join(summary(manifest.graph_precision)))
    return EXIT_OK


#: What each precision buys on a CPU, by whether it has the instructions that precision needs
#: (docs/speed.md#which-precision-on-which-cpu holds the measurements these ranges come from).
_EXPECTED = {
    ("fp32", True): "exact: answers equal laya's on every CPU",
    ("fp32", False): "exact: answers equal laya's on every CPU",
    ("int8", True): "VNNI present: the u8 x s8 kernel runs; about 3.3-5.9x laya torch f32 on the "
    "full-size checkpoint (AMD EPYC Zen 4)",
    ("int8", False): "no VNNI: the exact u8 x u8 kernel runs at about 1.3-1.4x the fp32 bundle; "
    "fp32 is as fast and exact, int8 still needs less memory",
    ("bf16", True): "bf16 in hardware: the GEMMs run in bf16 on OpenVINO; about 2.2-3.8x laya torch "
    "f32 on the full-size checkpoint (AMD EPYC Zen 4)",
    ("bf16", False): "no bf16 in hardware: the bundle runs fp32 here",
    ("fp16", True): "fp16 is for CUDA GPUs; on a CPU onnxruntime computes it at fp32 speed",
    ("fp16", False): "fp16 is for CUDA GPUs; on a CPU onnxruntime computes it at fp32 speed",
}


def summary(record, cpu=None) -> list[str]:
    """The export's closing lines: whether a lowered graph met its precision bar (with what it
    measured), and what the bundle's precision buys on this machine's CPU."""
    from laya_onnx.core.machine import read_cpu

    cpu = cpu or read_cpu()
    lines = []
    if record.precision != "fp32":
        bar = record.gate or {}  # the manifest's key for the precision bar
        verdict = "met" if record.passed else "not met"
        lines.append(
            "precision bar %s: %s within max |dp| %g of fp32 torch, %.0f%% of the decisive decisions agreeing"
            % (
                verdict,
                record.precision,
                bar.get("max_abs_dp", float("nan")),
                100 * bar.get("min_agreement", 1.0),
            )
        )
        for suite, m in (record.suites or {}).items():
            lines.append(
                "  %-14s %s/%s decisions agree (%s/%s decisive), max |dp| %.3f"
                % (
                    suite,
                    m.get("agreeing"),
                    m.get("decisions"),
                    m.get("decisive_agreeing", m.get("agreeing")),
                    m.get("decisive", m.get("decisions")),
                    float(m.get("max_abs_dp", float("nan"))),
                )
            )
    has = {"int8": cpu.vnni, "bf16": cpu.bf16}.get(record.precision, True)
    lines.append("on this CPU (%s): %s" % (cpu.label, _EXPECTED[(record.precision, has)]))
    return lines
