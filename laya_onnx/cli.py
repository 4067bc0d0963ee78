"""`laya-onnx` command line: one entry point, each subcommand imports only the layer it runs.

The runtime core is torch-free, so `predict` and `serve` must work on a box without torch;
`make-checkpoint` and `export` import torch lazily inside their own modules, and even the
preset names `--help` lists come from a torch-free module.

Exit status, the same for every subcommand: 0 success; 1 the command ran and failed (a parity
or export-validation mismatch, an I/O or onnxruntime failure); 2 bad input, usage or
configuration (argparse's own code for a bad option); 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

from laya_onnx.core import settings

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

DESCRIPTION = """\
Run the Laya decision model (https://huggingface.co/convaiinnovations/laya) on ONNX Runtime,
without torch: export a checkpoint to a validated ONNX bundle once, then answer typed questions
about a text with it, from the command line or over HTTP. Answers equal laya 0.4.15's."""

EPILOG = """\
examples:
  laya-onnx demo                                   # the whole path on a tiny test checkpoint
  laya-onnx export convaiinnovations/laya -o work/laya-bundle
  laya-onnx export --all -o work/models              # english/ multilingual/ typed-decisions/
  laya-onnx predict work/laya-bundle --request '{"state": "I was charged twice",
      "questions": {"refund": {"type": "noul", "instructions": "Refund?"}}}'
  laya-onnx serve work/laya-bundle --port 8000

'laya-onnx COMMAND --help' describes each command's options.

exit status: 0 success; 1 the command ran and failed (a parity or export-validation mismatch,
an I/O or onnxruntime failure); 2 bad input, usage or configuration (a bad option or request,
a missing file, a missing extra); 130 interrupted."""

# A character the terminal's bytes could not be decoded to: on POSIX, Python turns bytes that are
# not valid UTF-8 in argv into lone surrogates (surrogateescape); a JSON "\ud800" escape is ASCII.
_UNDECODED = re.compile("[\ud800-\udfff]")


class UsageError(ValueError):
    """A command-line argument that cannot be used (exit 2)."""


class CommandFailed(Exception):
    """The command ran and its outcome is a failure (exit 1)."""


def _cmd_make_checkpoint(args: argparse.Namespace) -> int:
    from laya_onnx.checkpoints import make_checkpoint

    out = make_checkpoint(args.preset, Path(args.output), seed=args.seed, force=args.force)
    print(f"checkpoint written: {out}")
    return EXIT_OK


def _precision_gate(args: argparse.Namespace):
    """The --precision gate with --gate-max-dp / --gate-min-agreement applied (None: the default)."""
    if args.gate_max_dp is None and args.gate_min_agreement is None:
        return None
    from laya_onnx.export.precision import GATES, Gate

    if args.precision not in GATES:
        raise UsageError("--gate-max-dp and --gate-min-agreement apply to --precision fp16 or int8")
    default = GATES[args.precision]
    max_dp = default.max_abs_dp if args.gate_max_dp is None else args.gate_max_dp
    agreement = default.min_agreement if args.gate_min_agreement is None else args.gate_min_agreement
    if not (0.0 <= max_dp <= 1.0 and 0.0 <= agreement <= 1.0):
        raise UsageError("--gate-max-dp and --gate-min-agreement must be within [0, 1]")
    return Gate(max_abs_dp=max_dp, min_agreement=agreement)


def _int8_plan(args: argparse.Namespace):
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


def _cmd_export(args: argparse.Namespace) -> int:
    from laya_onnx.export import ValidationError, export_bundle

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
        precision_gate=_precision_gate(args),
        int8_plan=_int8_plan(args),
    )

    if args.external_data_threshold is not None:
        options["external_data_threshold"] = args.external_data_threshold * 2**20
    try:
        if args.all:
            from laya_onnx.export.models_dir import HUB, export_models_dir

            if args.name is not None:
                raise UsageError("--name does not apply to --all (each bundle answers to its own name)")
            if args.calibration is not None:
                raise UsageError(
                    "--calibration does not apply to --all (a file is fitted for one checkpoint)"
                )
            source = HUB if args.hub else args.checkpoint
            if args.hub and args.checkpoint is not None:
                raise UsageError("give either a CHECKPOINT repo or --hub with --all, not both")
            export_models_dir(Path(args.output), source, **options)
        elif args.checkpoint is None or args.hub:
            raise UsageError("export needs a CHECKPOINT (or --all to write the three of a models directory)")
        else:
            export_bundle(
                args.checkpoint, Path(args.output), name=args.name, calibration=args.calibration, **options
            )
    except ValidationError as exc:
        raise CommandFailed(str(exc)) from None
    return EXIT_OK


def read_json_argument(value: str, option: str) -> Any:
    """The JSON document an option gives inline, as @FILE, or as - (stdin).

    Raises UsageError naming the option (and the file) for a file that cannot be read, bytes that
    are not UTF-8, or text that is not JSON.
    """
    if value == "-":
        source, data = f"{option} - (stdin)", sys.stdin.buffer.read()
    elif value.startswith("@"):
        path = Path(value[1:])
        source = f"{option} file {str(path)!r}"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise UsageError(f"{source} does not exist") from None
        except IsADirectoryError:
            raise UsageError(f"{source} is a directory, not a JSON file") from None
        except OSError as exc:
            raise UsageError(f"{source} cannot be read ({exc.strerror or exc})") from None
    else:
        source, data = option, None
        bad = _UNDECODED.search(value)
        if bad:
            raise UsageError(
                f"{option} is not valid UTF-8 (undecodable bytes after {value[: bad.start()]!r})"
            )
        text = value
    if data is not None:
        try:
            text = data.decode("utf-8-sig")  # a leading byte-order mark is fine
        except UnicodeDecodeError as exc:
            raise UsageError(
                f"{source} is not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})"
            ) from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{source} is not valid JSON ({exc})") from None


def _cmd_predict(args: argparse.Namespace) -> int:
    from laya_onnx import ONNXAgent

    request = read_json_argument(args.request, "--request")
    if not isinstance(request, dict) or "state" not in request or "questions" not in request:
        raise UsageError("--request must be a JSON object with 'state' and 'questions'")
    agent = ONNXAgent(
        args.bundle,
        providers=args.providers,
        strict_providers=args.strict_providers,
        threads=args.threads,
    )
    controls = {
        k: request[k]
        for k in ("max_len", "head_max_len", "min_confidence", "lang")
        if request.get(k) is not None
    }
    result = agent.predict(request["state"], request["questions"], **controls)
    print(json.dumps(result, ensure_ascii=False, indent=None if args.compact else 2))
    return EXIT_OK


def _cmd_serve(args: argparse.Namespace) -> int:
    if args.ray is not None:
        if args.bundle is not None or args.model or args.host is not None or args.port is not None:
            raise UsageError("--ray CONFIG takes the bundle, host and port from the config file")
        from laya_onnx.serve.ray_app import run_config

        run_config(args.ray)
        return EXIT_OK
    if args.bundle is None and not args.model:
        raise UsageError(
            "give a bundle to serve (or a models directory, or --model NAME=BUNDLE), or --ray CONFIG"
        )
    from laya_onnx.serve import run_server
    from laya_onnx.serve.routed import parse_model_option

    for option in args.model:
        parse_model_option(option)  # refused before anything binds or loads
    run_server(
        args.bundle,
        host=args.host,
        port=args.port,
        providers=args.providers,
        models=args.model,
        strict_providers=args.strict_providers,
        threads=args.threads,
    )
    return EXIT_OK


def _cmd_score(args: argparse.Namespace) -> int:
    from laya_onnx.score import scorer as score

    # --questions Q.json names a file as well as @Q.json does
    given = "@" + args.questions if Path(args.questions).is_file() else args.questions
    questions = read_json_argument(given, "--questions")
    if not isinstance(questions, dict) or not questions:
        raise UsageError("--questions must be a JSON object of questions, as a request's 'questions'")
    controls = {
        k: getattr(args, k) for k in ("lang", "max_len", "head_max_len") if getattr(args, k) is not None
    }
    if args.batch_size < 1:
        raise UsageError("--batch-size must be at least 1")
    if args.ray:
        if args.actors < 1:
            raise UsageError("--actors must be at least 1")
        from laya_onnx.score.ray_data import ray_scorer

        scorer = ray_scorer(
            args.bundle,
            questions,
            controls,
            args.batch_size,
            args.actors,
            cpus_per_actor=args.cpus_per_actor,
            gpus_per_actor=args.gpus_per_actor,
            providers=args.providers,
            threads=args.threads,
        )
    else:
        from laya_onnx import ONNXAgent

        agent = ONNXAgent(args.bundle, providers=args.providers, threads=args.threads)
        scorer = score.local_scorer(agent, questions, controls, args.batch_size)
    summary = score.score_file(
        args.input, args.output, questions, controls, scorer, progress=not args.no_progress
    )
    print(json.dumps(summary.as_json()))
    return EXIT_OK


def _cmd_parity(args: argparse.Namespace) -> int:
    from laya_onnx.parity import run_parity

    def show(case):
        print(
            f"  {'ok  ' if case.passed else 'FAIL'} {case.name:<28} rows={case.rows:<3} "
            f"max|dp|={case.max_abs_dp:.2e} flips={case.rounding_flips}"
            + ("" if case.passed else "  " + "; ".join(case.details)[:300])
        )

    # tolerances left unset take the rule's own defaults (laya_onnx/core/judge.py)
    given = {k: getattr(args, k) for k in ("tolerance", "act_tolerance") if getattr(args, k) is not None}
    report = run_parity(
        args.checkpoint, args.bundle, suite=args.suite, report_path=args.report, progress=show, **given
    )
    print(json.dumps(report.summary(), indent=2))
    return EXIT_OK if report.passed else EXIT_FAILED


def _cmd_bench(args: argparse.Namespace) -> int:
    if args.serve:
        return _cmd_bench_serve(args)
    if len(args.models) < 2:
        raise UsageError("bench needs CHECKPOINT BUNDLE [BUNDLE ...] (or --serve URL)")
    from laya_onnx.bench.agent import run_bench

    report = run_bench(
        args.models[0],
        args.models[1:],
        repeats=args.repeats,
        threads=args.threads,
        workloads=args.workloads.split(",") if args.workloads else None,
        rss=not args.no_rss,
        progress=print,
    )
    return _emit_report(report, args.json)


def _emit_report(report: Any, path: str | None) -> int:
    """A bench's report: written to `path` as JSON, or printed."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        print(f"report written: {path}")
    else:
        print(json.dumps(report, indent=2))
    return EXIT_OK


def _cmd_bench_serve(args: argparse.Namespace) -> int:
    from laya_onnx.bench.http import drive_server

    clients = [int(c) for c in args.clients.split(",") if c.strip()]
    if not clients or min(clients) < 1:
        raise UsageError("--clients must be a comma list of positive integers, got %r" % (args.clients,))
    if not args.deadline > 0:
        raise UsageError("--deadline must be a positive number of seconds, got %r" % (args.deadline,))
    report = drive_server(
        args.serve, clients=clients, seconds=args.seconds, deadline_s=args.deadline, progress=print
    )
    return _emit_report(report, args.json)


def _cmd_serve_bench(args: argparse.Namespace) -> int:
    from laya_onnx.bench.http import run_serve_bench

    figures = run_serve_bench(
        args.bundle,
        clients=args.clients,
        seconds=args.seconds,
        max_concurrent=args.max_concurrent,
        providers=args.providers,
        threads=args.threads,
    )
    print(json.dumps(figures, indent=2))
    return EXIT_OK


def _cmd_bench_memory(args: argparse.Namespace) -> int:
    from laya_onnx.bench.memory import (
        format_arena_table,
        format_table,
        run_arena_bench,
        run_graph_speed,
        run_memory_bench,
    )

    if args.unfused:
        speed = run_graph_speed(args.bundle, args.unfused)
        print("CPU ms per call (1 thread, median, interleaved): " + json.dumps(speed))

    if args.arena:
        arena = run_arena_bench(Path(args.bundle) / "laya.onnx")
        print(format_arena_table(arena))
        if args.json:
            print(json.dumps(arena, indent=2))
    report = run_memory_bench(
        args.bundle,
        unfused=args.unfused,
        checkpoint=args.checkpoint,
        states=args.states,
        words=args.words,
        tokens=args.tokens,
        repeats=args.repeats,
        only=args.only.split(",") if args.only else None,
    )
    print(format_table(report))
    if args.json:
        print(json.dumps(report, indent=2))
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    from laya_onnx.demo import run_demo

    return run_demo(Path(args.workdir), preset=args.preset)


def _mebibytes(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number of MiB >= 0, got {value!r}")
    return number


def _providers(value: str | None):
    """`auto`, or a comma list of NAME or NAME:KEY=VALUE;KEY=VALUE (onnxruntime provider options)."""
    if value is None or value.strip().lower() == "auto":
        return None
    out: list[Any] = []
    for item in (p.strip() for p in value.split(",")):
        if not item:
            continue
        name, _, options = item.partition(":")
        if not options:
            out.append(name.strip())
            continue
        pairs = {}
        for option in (o.strip() for o in options.split(";")):
            key, eq, val = option.partition("=")
            if not eq or not key.strip():
                raise argparse.ArgumentTypeError(
                    f"provider option {option!r} of {name.strip()!r} is not KEY=VALUE"
                )
            pairs[key.strip()] = val.strip()
        out.append((name.strip(), pairs))
    return out


def _add_bundle_and_providers(
    parser: argparse.ArgumentParser, optional: bool = False, flag: bool = False, what: str | None = None
) -> None:
    """The bundle and execution providers of the commands that run one (predict, serve, score)."""
    what = what or "bundle directory, or a Hub repo id[/subfolder] holding one"
    if flag:
        parser.add_argument("--bundle", required=True, help=what)
    else:
        parser.add_argument("bundle", nargs="?" if optional else None, help=what)
    parser.add_argument(
        "--providers",
        type=_providers,
        default=None,
        help="comma list of onnxruntime execution providers in order of preference, full names "
        "(CUDAExecutionProvider) or cpu/cuda/gpu/coreml/tensorrt, each optionally with onnxruntime "
        "provider options as NAME:KEY=VALUE;KEY=VALUE (e.g. cuda:device_id=1;gpu_mem_limit=2147483648); "
        "CPU is always added last. Default 'auto': CUDA, then CoreML, then CPU, whichever this build offers",
    )


def _add_strict_providers(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--strict-providers",
        action="store_true",
        help="refuse to run when a requested accelerator does not attach, instead of falling back to CPU",
    )


def _add_checkpoint_and_bundle(parser: argparse.ArgumentParser) -> None:
    """The two positionals of the commands that hold a bundle against the reference."""
    parser.add_argument("checkpoint", help="the checkpoint the bundle was exported from")
    parser.add_argument("bundle", help="the bundle directory")


def build_parser() -> argparse.ArgumentParser:
    from laya_onnx import __version__
    from laya_onnx.checkpoints.presets import PRESETS

    p = argparse.ArgumentParser(
        prog="laya-onnx",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"laya-onnx {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    mk = sub.add_parser(
        "make-checkpoint",
        help="write a small deterministic test checkpoint in the release layout (needs the export extra)",
        description=textwrap.fill(
            "Write a deterministic checkpoint with random weights in the layout laya's training "
            "writes; for tests, demos and benchmarks (its answers mean nothing).",
            88,
        ),
        epilog="presets:\n"
        + "\n".join(
            textwrap.fill(preset.description, 88, initial_indent=f"  {name}: ", subsequent_indent="      ")
            for name, preset in sorted(PRESETS.items())
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mk.add_argument(
        "--preset", required=True, choices=sorted(PRESETS), metavar="PRESET", help="; ".join(sorted(PRESETS))
    )
    mk.add_argument("-o", "--output", required=True, help="directory to write the checkpoint to")
    mk.add_argument(
        "--seed", type=int, default=0, help="random seed of the weights; the same seed writes the same bytes"
    )
    mk.add_argument("--force", action="store_true", help="replace a non-empty output directory")
    mk.set_defaults(func=_cmd_make_checkpoint)

    ex = sub.add_parser(
        "export",
        help="turn a checkpoint into a validated ONNX bundle (needs the export extra)",
        description="Trace a checkpoint into one ONNX graph, check ONNX Runtime against torch on "
        "built-in requests, and write the bundle (graph, tokenizer, config, manifest). Nothing is "
        "written when the check fails.",
    )
    ex.add_argument(
        "checkpoint",
        nargs="?",
        help="checkpoint directory or Hugging Face repo id[/subfolder]; with --all, a repo or "
        "directory laid out as laya's bundle repo (english at its root, multilingual/ and "
        "typed-decisions/ beside it)",
    )
    ex.add_argument(
        "-o",
        "--output",
        required=True,
        help="directory to write the bundle to (with --all: the models directory)",
    )
    ex.add_argument(
        "--all",
        action="store_true",
        help="write english/, multilingual/ and typed-decisions/ bundles into the output (a models "
        "directory for 'laya-onnx serve MODELS_DIR'): the tiny test presets, or CHECKPOINT's "
        "three, or with --hub laya's own from the Hub",
    )
    ex.add_argument(
        "--hub",
        action="store_true",
        help="with --all: export the three registry checkpoints of convaiinnovations/laya from the Hub",
    )
    ex.add_argument("--revision", default=None, help="Hub revision (commit, tag, or 'reviewed')")
    ex.add_argument("--opset", type=int, default=17, help="ONNX opset (default 17; dynamo uses 18+)")
    ex.add_argument(
        "--tolerance", type=float, default=1e-4, help="max |Δlogit| allowed vs torch (default 1e-4)"
    )
    ex.add_argument("--dynamo", action="store_true", help="use the torch.export-based exporter")
    ex.add_argument(
        "--attention",
        choices=["fused", "unfused"],
        default=None,
        help="fused (default with TorchScript): one MultiHeadAttention node per layer, masks built "
        "once; unfused: transformers' op-by-op graph (the old default; the only one with --dynamo)",
    )
    ex.add_argument(
        "--no-memory-probe",
        action="store_true",
        help="skip measuring per-pass memory (the runtime then estimates it from the architecture)",
    )
    ex.add_argument(
        "--optimize",
        action="store_true",
        help="fuse the graph with onnxruntime.transformers' optimizer (SkipLayerNormalization, Gelu); "
        "kept only if the fused graph passes validation too (the manifest records the fusions)",
    )
    ex.add_argument(
        "--external-data-threshold",
        type=_mebibytes,
        default=None,
        metavar="MIB",
        help="write the weights as ONNX external data (laya.onnx.data) when they exceed MIB "
        "(default 1024; 0: always)",
    )
    ex.add_argument(
        "--precision",
        choices=["fp32", "fp16", "int8"],
        default="fp32",
        help="fp32 (default); fp16: the encoder's GEMMs in fp16 for CUDA; int8: batch-invariant "
        "per-row int8 for CPU. Both are gated against fp32 torch on the export cases and the parity "
        "suite (max |dp|, decision agreement) and refused below the gate",
    )
    ex.add_argument(
        "--gate-max-dp",
        type=float,
        default=None,
        help="the gate's max |dp| vs fp32 torch (default: fp16 0.01, int8 0.15)",
    )
    ex.add_argument(
        "--gate-min-agreement",
        type=float,
        default=None,
        help="the gate's least share of decisions agreeing with fp32 torch (default: fp16 0.995, int8 0.9)",
    )
    ex.add_argument(
        "--int8-keep-fp32",
        default=None,
        metavar="MODULES",
        help="int8: comma-separated encoder modules whose MatMuls stay fp32, by kind (attn.Wqkv, "
        "attn.Wo, mlp.Wi, mlp.Wo), layer (layers.0) or both (layers.0.mlp.Wo); '' lowers all "
        "(default: attn.Wqkv)",
    )
    ex.add_argument(
        "--int8-weight-bits",
        type=int,
        choices=[7, 8],
        default=None,
        help="int8: 7-bit weights (u8 x s8, the fastest on CPUs without VNNI) or 8-bit (u8 x u8, "
        "exact everywhere, half the weight rounding) (default: 8)",
    )
    ex.add_argument("--force", action="store_true", help="replace a non-empty output directory")
    ex.add_argument(
        "--name",
        default=None,
        help="checkpoint name the bundle answers to (default: the published name, else the directory name)",
    )
    ex.add_argument(
        "--calibration",
        default=None,
        metavar="FILE",
        help="a calibration file (laya's save_calibration JSON) to carry in the bundle; the bundle "
        "then answers with its temperatures and binning map",
    )
    ex.set_defaults(func=_cmd_export)

    pr = sub.add_parser(
        "predict",
        help="answer one request with a bundle and print the JSON result",
        description="Answer one request with a bundle and print the result as laya.Agent.predict returns it.",
    )
    _add_bundle_and_providers(pr)
    _add_strict_providers(pr)
    pr.add_argument(
        "--request",
        required=True,
        help='JSON {"state": ..., "questions": {...}} (optional: max_len, head_max_len, '
        "min_confidence, lang), inline, as @FILE, or - for stdin",
    )
    pr.add_argument("--compact", action="store_true", help="print the JSON on one line")
    settings.add_arguments(pr, settings.THREADS)
    pr.set_defaults(func=_cmd_predict)

    sv = sub.add_parser(
        "serve",
        help="serve a bundle over HTTP (POST /v1/systemone, /v1/systemone/batch; GET /health, /v1/models, /metrics)",
        description="Serve a bundle over TypeSafe Jev's /v1/systemone wire protocol until SIGINT/SIGTERM, "
        "then drain (%s; see serve/README.md)." % settings.SHUTDOWN_GRACE_SECONDS.env,
    )
    _add_bundle_and_providers(
        sv,
        optional=True,
        what="bundle directory or Hub repo id[/subfolder] holding one; or a models directory (one "
        "bundle folder per checkpoint name, as 'export --all' writes) served through the Router",
    )
    sv.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME=BUNDLE",
        help="serve BUNDLE under NAME through the Router (repeatable; beside a models directory's)",
    )
    _add_strict_providers(sv)
    sv.add_argument(
        "--ray",
        metavar="CONFIG",
        default=None,
        help="serve on Ray Serve instead, from a Ray Serve config file (serve/ray/serve-config.yaml): "
        "replicas, autoscaling, CPU/GPU per replica, micro-batching; needs the ray extra",
    )
    settings.add_arguments(sv, settings.HOST, settings.PORT, settings.THREADS)
    sv.set_defaults(func=_cmd_serve)

    sc = sub.add_parser(
        "score",
        help="answer one question set over every state of a JSONL or Parquet file (offline, resumable)",
        description="Score INPUT (JSON Lines with a 'state' per line, or Parquet with a 'state' column) "
        "into OUTPUT (JSON Lines, one row per input row, in order, each {row, [id], result|error}). "
        "A rerun appends what is missing; a bad row is reported in its output row and the run goes on. "
        "--ray runs the batches on a pool of agents through Ray Data (the ray extra).",
    )
    sc.add_argument("input", help="a .jsonl/.ndjson or .parquet file of states")
    sc.add_argument("-o", "--output", required=True, help="the JSON Lines file to write (or resume)")
    sc.add_argument("--questions", required=True, help="the questions object: JSON, or @FILE")
    _add_bundle_and_providers(sc, flag=True)
    sc.add_argument("--batch-size", type=int, default=32, help="states per agent call (default 32)")
    sc.add_argument("--lang", default=None, help="language of the states (default: the bundle's)")
    sc.add_argument("--max-len", type=int, default=None, help="token budget per row")
    sc.add_argument("--head-max-len", type=int, default=None, help="token budget of the decision head")
    sc.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads per agent")
    sc.add_argument("--ray", action="store_true", help="run the batches through Ray Data")
    sc.add_argument("--actors", type=int, default=2, help="with --ray: agents in the actor pool (default 2)")
    sc.add_argument("--cpus-per-actor", type=float, default=1.0, help="with --ray: CPUs per agent actor")
    sc.add_argument("--gpus-per-actor", type=float, default=0.0, help="with --ray: GPUs per agent actor")
    sc.add_argument("--no-progress", action="store_true", help="no progress bar")
    sc.set_defaults(func=_cmd_score)

    pa = sub.add_parser(
        "parity",
        help="compare a bundle's answers with the reference laya.Agent (needs the dev extra)",
        description="Run a request suite through the reference laya.Agent (torch) and the bundle, "
        "and judge every request by the parity rule (README 'Proof'); exits 1 when they differ.",
    )
    _add_checkpoint_and_bundle(pa)
    pa.add_argument(
        "--suite", default="core", help="a suite shipped in laya_onnx/parity/suites, or a JSON path"
    )
    pa.add_argument("--tolerance", type=float, help="max |Δ| between unrounded probabilities (default 1e-5)")
    pa.add_argument(
        "--act-tolerance", type=float, help="max |Δ| between unrounded act probabilities (default 5e-5)"
    )
    pa.add_argument("--report", default=None, help="write the JSON report here")
    pa.set_defaults(func=_cmd_parity)

    be = sub.add_parser(
        "bench",
        help="time bundles against the reference laya.Agent, or load a running server (needs the dev extra)",
        description="Time the reference laya.Agent (torch, CPU) and each bundle call by call, "
        "interleaved, through the public API, on fixed workloads: medians, ratios and their range, "
        "our Python part beside the session run, peak RSS (the bench process, and each runtime "
        "alone in a child process). With --serve URL: drive a running server with 1, 8 and 32 "
        "concurrent clients instead (throughput, p50/p99).",
    )
    be.add_argument(
        "models",
        nargs="*",
        metavar="CHECKPOINT BUNDLE [BUNDLE ...]",
        help="the checkpoint, then one or more bundles exported from it",
    )
    be.add_argument("--repeats", type=int, default=10, help="timed calls per runtime and workload")
    be.add_argument(
        "--threads", type=int, default=None, help="threads for both runtimes (default: torch's count)"
    )
    be.add_argument(
        "--workloads",
        default=None,
        help="comma list of workloads (default readme-1x3,state80-1x3,short-1x1,batch-32x3; "
        "also batch-8x3, long-1x3)",
    )
    be.add_argument("--json", default=None, metavar="PATH", help="write the report here as JSON")
    be.add_argument(
        "--no-rss", action="store_true", help="skip each runtime's peak RSS alone (child processes)"
    )
    be.add_argument("--serve", default=None, metavar="URL", help="drive the server at URL instead")
    be.add_argument(
        "--clients", default="1,8,32", help="with --serve: comma list of concurrent client counts"
    )
    be.add_argument("--seconds", type=float, default=10.0, help="with --serve: seconds per client count")
    be.add_argument(
        "--deadline",
        type=float,
        default=10.0,
        help="with --serve: seconds a request may take before it counts as hung (a large bundle "
        "with many clients and no batch window queues for longer)",
    )
    be.set_defaults(func=_cmd_bench)

    sb = sub.add_parser(
        "serve-bench",
        help="saturate a served bundle on 127.0.0.1: throughput, 503s, /health latency, gateway overhead",
        description="Serve the bundle in-process on 127.0.0.1 and load it from child processes: one "
        "client, then --clients posting the README request while /health is polled; print JSON figures.",
    )
    _add_bundle_and_providers(sb)
    sb.add_argument("--clients", type=int, default=16, help="concurrent clients in the saturated phase")
    sb.add_argument("--seconds", type=float, default=5.0, help="length of the saturated phase")
    settings.add_arguments(sb, settings.MAX_CONCURRENT, settings.THREADS)
    sb.set_defaults(func=_cmd_serve_bench)

    bm = sub.add_parser(
        "bench-memory",
        help="peak RSS and time of a long-state batch, one fresh process per runtime configuration",
        description="Run a batch of long states (the memory report's scenario, scaled by --tokens) "
        "through the bundle, and optionally through an --attention unfused bundle (as the runtime "
        "ran before: no pass budget, arena kept) and the reference laya.Agent, each in its own "
        "process, and print idle, peak and after RSS and the median call time.",
    )
    bm.add_argument("bundle", help="the bundle as exported now (fused attention)")
    bm.add_argument("--unfused", default=None, help="an --attention unfused bundle of the same checkpoint")
    bm.add_argument("--checkpoint", default=None, help="also run the reference laya.Agent (dev extra)")
    bm.add_argument("--states", type=int, default=2, help="states in the batch (default 2)")
    bm.add_argument("--words", type=int, default=7000, help='each state is "w0 w1 ... w{words-1}"')
    bm.add_argument("--tokens", type=int, default=4096, help="max_len of the request")
    bm.add_argument("--repeats", type=int, default=3, help="timed calls per configuration")
    bm.add_argument("--only", default=None, help="comma-separated: after,before,unfused+release,reference")
    bm.add_argument("--json", action="store_true", help="also print the report as JSON")
    bm.add_argument(
        "--arena", action="store_true", help="first compare CPU-arena configurations (speed and RSS)"
    )
    bm.set_defaults(func=_cmd_bench_memory)

    dm = sub.add_parser(
        "demo",
        help="make a tiny checkpoint, export it and answer a request, in one go (needs the export extra)",
        description="Make a test checkpoint, export it and answer the README's request; a second "
        "run reuses what the first left in the work directory.",
    )
    dm.add_argument("--workdir", default="work/demo", help="where the checkpoint and bundle go")
    dm.add_argument(
        "--preset",
        default="tiny-english",
        choices=sorted(PRESETS),
        metavar="PRESET",
        help="checkpoint preset (default tiny-english; see make-checkpoint --help): "
        + "; ".join(sorted(PRESETS)),
    )
    dm.set_defaults(func=_cmd_demo)
    return p


# Paths a user names on the command line; their absence is the user's to fix, not a failure.
_BAD_PATH = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)


def _exit_status(exc: BaseException) -> tuple[int, str] | None:
    """(status, message) for an exception the CLI reports in one line; None: let it propagate."""
    from laya_onnx.core.bundle import OutputExistsError

    if isinstance(exc, CommandFailed):
        return EXIT_FAILED, f"failed: {exc}"
    if isinstance(exc, OutputExistsError):
        return EXIT_USAGE, f"error: {exc.advice('--force')}"  # the CLI's word for force=True
    if isinstance(exc, SystemExit):
        # The serve layer exits with its own message for a bundle it cannot load.
        return EXIT_USAGE, "error: " + str(exc.code).removeprefix("laya-onnx: ")
    if isinstance(exc, ImportError):
        hint = (
            f" (is the extra that provides {exc.name!r} installed? see README 'Install')" if exc.name else ""
        )
        return EXIT_USAGE, f"error: {exc}{hint}"
    hub_errors = sys.modules.get("huggingface_hub.errors")
    bad_hub_reference = hub_errors is not None and isinstance(
        exc, (hub_errors.RepositoryNotFoundError, hub_errors.RevisionNotFoundError)
    )
    # ValueError and TypeError cover the caller-mistake types (InvalidRequest, BundleError,
    # TokenizerError, ProviderError, UsageError, the exporter's refusals).
    if isinstance(exc, (ValueError, TypeError, *_BAD_PATH)) or bad_hub_reference:
        return EXIT_USAGE, f"error: {exc}"
    if isinstance(exc, (OSError, RuntimeError)) or type(exc).__module__.startswith("onnxruntime"):
        return EXIT_FAILED, f"failed: {type(exc).__name__}: {exc}"
    return None  # anything else is a bug: Python's traceback (and exit 1) says where


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("laya-onnx: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (Exception, SystemExit) as exc:
        if isinstance(exc, SystemExit) and not isinstance(exc.code, str):
            raise
        reported = _exit_status(exc)
        if reported is None:
            raise
        status, message = reported
        print(f"laya-onnx {args.command}: {message}", file=sys.stderr)
        return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
