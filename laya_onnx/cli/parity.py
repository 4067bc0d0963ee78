"""`laya-onnx parity`: a bundle's answers against the reference laya.Agent, by the parity rule."""

from __future__ import annotations

import argparse
import json

from laya_onnx.cli.common import EXIT_FAILED, EXIT_OK, add_checkpoint_and_bundle

NAME = "parity"
HELP = "compare a bundle's answers with the reference laya.Agent (needs the dev extra)"


def add_parser(sub) -> argparse.ArgumentParser:
    from laya_onnx.core.judge import DEFAULT_ACT_TOLERANCE, DEFAULT_TOLERANCE  # the rule's own

    p = sub.add_parser(
        NAME,
        help=HELP,
        description="Run a request suite through the reference laya.Agent (torch) and the bundle, "
        "and judge every request by the parity rule (README 'Proof'); exits 1 when they differ.",
    )
    add_checkpoint_and_bundle(p)
    p.add_argument(
        "--suite", default="core", help="a suite shipped in laya_onnx/parity/suites, or a JSON path"
    )
    p.add_argument(
        "--tolerance",
        type=float,
        help="max |Δ| between unrounded probabilities (default %s)" % DEFAULT_TOLERANCE,
    )
    p.add_argument(
        "--act-tolerance",
        type=float,
        help="max |Δ| between unrounded act probabilities (default %s)" % DEFAULT_ACT_TOLERANCE,
    )
    p.add_argument("--report", default=None, help="write the JSON report here")
    from laya_onnx.cli.bench import add_plot_option

    add_plot_option(p, "the |Δp| histogram and the requests that agreed")
    return p


def run(args: argparse.Namespace) -> int:
    from laya_onnx.cli.bench import drew, plot_ready
    from laya_onnx.parity import run_parity

    plot_ready(args)

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
    if args.plot:
        from laya_onnx.bench.plot import plot_parity

        drew(plot_parity(report.as_dict(), args.plot))
    return EXIT_OK if report.passed else EXIT_FAILED
