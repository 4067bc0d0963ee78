"""`laya-onnx predict`: answer one request with a bundle and print the result."""

from __future__ import annotations

import argparse
import json

from laya_onnx.cli.common import (
    EXIT_OK,
    UsageError,
    add_bundle_and_providers,
    add_strict_providers,
    read_json_argument,
)
from laya_onnx.core import settings
from laya_onnx.core.questions import unknown_fields, warn_unknown_fields
from laya_onnx.core.setting import add_arguments

NAME = "predict"
#: The request fields `predict` reads; the questions' own fields are checked by the core.
FIELDS = ("state", "questions", "max_len", "head_max_len", "min_confidence", "lang")
HELP = "answer one request with a bundle and print the JSON result"


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        NAME,
        help=HELP,
        description="Answer one request with a bundle and print the result as laya.Agent.predict returns it.",
    )
    add_bundle_and_providers(p)
    add_strict_providers(p)
    p.add_argument(
        "--request",
        required=True,
        help='JSON {"state": ..., "questions": {...}} (optional: max_len, head_max_len, '
        "min_confidence, lang), inline, as @FILE, or - for stdin",
    )
    p.add_argument("--compact", action="store_true", help="print the JSON on one line")
    add_arguments(p, settings.THREADS)
    return p


def run(args: argparse.Namespace) -> int:
    from laya_onnx import ONNXAgent

    request = read_json_argument(args.request, "--request")
    if not isinstance(request, dict) or "state" not in request or "questions" not in request:
        raise UsageError("--request must be a JSON object with 'state' and 'questions'")
    if request["questions"] == {}:
        # The library answers no questions with no answers (as laya does); a command asked
        # nothing has been given a request that cannot be what its user meant.
        raise UsageError(
            "--request has no questions: add at least one, e.g. "
            '"questions": {"refund": {"type": "noul", "instructions": "Does the user ask for a refund?"}}'
        )
    # Accepted, as the library and the HTTP route accept them, but named: a misspelt optional
    # field (min_confidnce) would otherwise change nothing and say nothing.
    warn_unknown_fields([f for f in unknown_fields(request, FIELDS) if f.question is None])
    agent = ONNXAgent(
        args.bundle,
        providers=args.providers,
        strict_providers=args.strict_providers,
        threads=args.threads,
    )
    controls = {k: request[k] for k in FIELDS[2:] if request.get(k) is not None}
    result = agent.predict(request["state"], request["questions"], **controls)
    print(json.dumps(result, ensure_ascii=False, indent=None if args.compact else 2))
    return EXIT_OK
