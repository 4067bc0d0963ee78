"""`laya-onnx score`: one question set over every state of a JSONL or Parquet file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from laya_onnx.cli.common import EXIT_OK, UsageError, add_bundle_and_providers, read_json_argument

NAME = "score"
HELP = "answer one question set over every state of a JSONL or Parquet file (offline, resumable)"


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        NAME,
        help=HELP,
        description="Score INPUT (JSON Lines with a 'state' per line, or Parquet with a 'state' column) "
        "into OUTPUT (JSON Lines, one row per input row, in order, each {row, [id], result|error}). "
        "A rerun appends what is missing; a bad row is reported in its output row and the run goes on. "
        "--ray runs the batches on a pool of agents through Ray Data (the ray extra).",
    )
    p.add_argument("input", help="a .jsonl/.ndjson or .parquet file of states")
    p.add_argument("-o", "--output", required=True, help="the JSON Lines file to write (or resume)")
    p.add_argument("--questions", required=True, help="the questions object: JSON, or @FILE")
    add_bundle_and_providers(p, flag=True)
    p.add_argument("--batch-size", type=int, default=32, help="states per agent call (default 32)")
    p.add_argument("--lang", default=None, help="language of the states (default: the bundle's)")
    p.add_argument("--max-len", type=int, default=None, help="token budget per row")
    p.add_argument("--head-max-len", type=int, default=None, help="token budget of the decision head")
    p.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads per agent")
    p.add_argument("--ray", action="store_true", help="run the batches through Ray Data")
    p.add_argument("--actors", type=int, default=2, help="with --ray: agents in the actor pool (default 2)")
    p.add_argument("--cpus-per-actor", type=float, default=1.0, help="with --ray: CPUs per agent actor")
    p.add_argument("--gpus-per-actor", type=float, default=0.0, help="with --ray: GPUs per agent actor")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def run(args: argparse.Namespace) -> int:
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
