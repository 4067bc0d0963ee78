"""`laya-onnx` command line: one entry point, each subcommand imports only the layer it runs.

The runtime core is torch-free, so `predict` and `serve` must work on a box without torch;
`make-checkpoint` and `export` import torch lazily inside their own modules.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _cmd_make_checkpoint(args: argparse.Namespace) -> int:
    from laya_onnx.checkpoints import make_checkpoint

    out = make_checkpoint(args.preset, Path(args.output), seed=args.seed)
    print(f"checkpoint written: {out}")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from laya_onnx.export import export_bundle

    export_bundle(
        args.checkpoint,
        Path(args.output),
        revision=args.revision,
        opset=args.opset,
        tolerance=args.tolerance,
        dynamo=args.dynamo,
        force=args.force,
        name=args.name,
    )
    return 0


def _read_json_arg(value: str, what: str):
    """A JSON document given inline, as @file, or as - for stdin."""
    try:
        if value == "-":
            text = sys.stdin.read()
        elif value.startswith("@"):
            text = Path(value[1:]).read_text(encoding="utf-8")
        else:
            text = value
        return json.loads(text)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{what} is not valid JSON ({exc})") from None


def _cmd_predict(args: argparse.Namespace) -> int:
    from laya_onnx import ONNXAgent

    request = _read_json_arg(args.request, "--request")
    if not isinstance(request, dict) or "state" not in request or "questions" not in request:
        raise ValueError("--request must be an object with 'state' and 'questions'")
    agent = ONNXAgent(args.bundle, providers=args.providers)
    controls = {
        k: request[k]
        for k in ("max_len", "head_max_len", "min_confidence", "lang")
        if request.get(k) is not None
    }
    result = agent.predict(request["state"], request["questions"], **controls)
    print(json.dumps(result, ensure_ascii=False, indent=None if args.compact else 2))
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from laya_onnx.serve import run_server

    run_server(args.bundle, host=args.host, port=args.port, providers=args.providers)
    return 0


def _cmd_parity(args: argparse.Namespace) -> int:
    from laya_onnx.parity import run_parity

    def show(case):
        mark = "ok  " if case.passed(args.tolerance) else "FAIL"
        print(
            f"  {mark} {case.name:<28} rows={case.rows:<3} max|dp|={case.max_abs_dp:.2e}"
            + ("" if case.passed(args.tolerance) else "  " + "; ".join(case.details)[:300])
        )

    report = run_parity(
        args.checkpoint,
        args.bundle,
        suite=args.suite,
        tolerance=args.tolerance,
        report_path=args.report,
        progress=show,
    )
    print(json.dumps(report.summary(), indent=2))
    return 0 if report.passed else 1


def _cmd_bench(args: argparse.Namespace) -> int:
    from laya_onnx.parity.bench import run_bench

    print(
        json.dumps(
            run_bench(args.checkpoint, args.bundle, repeats=args.repeats, threads=args.threads), indent=2
        )
    )
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from laya_onnx.demo import run_demo

    return run_demo(Path(args.workdir), preset=args.preset)


def _providers(value: str | None):
    if value is None or value.strip().lower() == "auto":
        return None
    return [p.strip() for p in value.split(",") if p.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="laya-onnx", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    mk = sub.add_parser("make-checkpoint", help="write a deterministic checkpoint in the release layout")
    mk.add_argument(
        "--preset",
        required=True,
        choices=["tiny-english", "tiny-multilingual", "tiny-typed-decisions", "random-english-large"],
    )
    mk.add_argument("-o", "--output", required=True)
    mk.add_argument("--seed", type=int, default=0)
    mk.set_defaults(func=_cmd_make_checkpoint)

    ex = sub.add_parser("export", help="trace a checkpoint into a validated ONNX bundle (needs torch)")
    ex.add_argument("checkpoint", help="checkpoint directory or Hugging Face repo id[/subfolder]")
    ex.add_argument("-o", "--output", required=True)
    ex.add_argument("--revision", default=None, help="Hub revision (commit, tag, or 'reviewed')")
    ex.add_argument("--opset", type=int, default=17)
    ex.add_argument("--tolerance", type=float, default=1e-4, help="max |Δlogit| allowed vs torch")
    ex.add_argument("--dynamo", action="store_true", help="use the torch.export-based exporter")
    ex.add_argument("--force", action="store_true", help="overwrite a non-empty output directory")
    ex.add_argument(
        "--name",
        default=None,
        help="checkpoint name the bundle answers to (default: the published name, else the directory name)",
    )
    ex.set_defaults(func=_cmd_export)

    pr = sub.add_parser("predict", help="answer one request with a bundle")
    pr.add_argument("bundle")
    pr.add_argument(
        "--request", required=True, help='JSON {"state":..., "questions":...} inline, @file or - for stdin'
    )
    pr.add_argument(
        "--providers", type=_providers, default=None, help="comma list of execution providers, or 'auto'"
    )
    pr.add_argument("--compact", action="store_true")
    pr.set_defaults(func=_cmd_predict)

    sv = sub.add_parser("serve", help="serve a bundle over the /v1/systemone wire protocol")
    sv.add_argument("bundle")
    sv.add_argument("--host", default=None, help="bind address (default $LAYA_HOST or 0.0.0.0)")
    sv.add_argument("--port", type=int, default=None, help="port (default $LAYA_PORT or 8000)")
    sv.add_argument("--providers", type=_providers, default=None)
    sv.set_defaults(func=_cmd_serve)

    pa = sub.add_parser("parity", help="compare a bundle with the reference laya.Agent (needs the dev extra)")
    pa.add_argument("checkpoint", help="the checkpoint the bundle was exported from")
    pa.add_argument("bundle")
    pa.add_argument("--suite", default="core", help="suite name under parity/suites or a JSON path")
    pa.add_argument("--tolerance", type=float, default=1e-5, help="max |Δp| allowed")
    pa.add_argument("--report", default=None, help="write the JSON report here")
    pa.set_defaults(func=_cmd_parity)

    be = sub.add_parser("bench", help="speed vs the reference laya.Agent, interleaved (needs the dev extra)")
    be.add_argument("checkpoint")
    be.add_argument("bundle")
    be.add_argument("--repeats", type=int, default=10)
    be.add_argument("--threads", type=int, default=None)
    be.set_defaults(func=_cmd_bench)

    dm = sub.add_parser("demo", help="make the tiny checkpoint, export it and answer a request")
    dm.add_argument("--workdir", default="work/demo")
    dm.add_argument("--preset", default="tiny-english")
    dm.set_defaults(func=_cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("laya-onnx: interrupted", file=sys.stderr)
        return 130
    except (ValueError, TypeError, OSError, ImportError) as exc:
        # Bad input (a wrong checkpoint, a tampered bundle, a missing extra) is reported as one
        # line naming what is at fault, never as a traceback. ValueError covers BundleError,
        # TokenizerError, ProviderError and the exporter's refusals.
        hint = ""
        if isinstance(exc, ImportError) and exc.name:
            hint = f" (is the extra that provides {exc.name!r} installed? see README 'Install')"
        print(f"laya-onnx {args.command}: error: {exc}{hint}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
