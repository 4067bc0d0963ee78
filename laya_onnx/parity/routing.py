"""Router parity: `laya_onnx.Router` over bundles against `laya.Router` over the checkpoints they
were exported from, request by request of a routing suite (`suites/routing.json`).

The suite names Router configurations (`routers`: `default`, `auto_task_detection`,
`lang_guess`, each built on both sides) and requests: a single one (`state`, `questions` and the
routing controls `model`, `task`, `lang`, `lang_guess`, plus `max_len`, `head_max_len`,
`min_confidence`) or a heterogeneous `batch` (items with their own controls; `questions` at the
top is every item's default). Each is judged by the parity rule (`rule.py`): the routed
checkpoint, the whole `routing` block (reason, detection, workflow) and the answers, whose rows
and unrounded values come from whichever checkpoint each state was routed to.

The reference Router's checkpoints are `laya.Agent`s attached under each name, registered with
the `repo` label our Router reports for that name (the bundle's Hub origin or folder name), so
`routing.repo` is compared too.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from laya_onnx.core.judge import DEFAULT_ACT_TOLERANCE, DEFAULT_TOLERANCE, Observation, judge
from laya_onnx.parity.observe import (
    CONTROLS,
    LONG_CONTROLS,
    REFUSALS,
    RowCapture,
    ScoredCalls,
    agent_rows,
    instrument_agent,
    observe_long,
    observe_state,
    refusal,
)
from laya_onnx.parity.runner import (
    CaseResult,
    ParityReport,
    instrument_reference,
    load_reference,
    reference_rows,
    write_json,
)
from laya_onnx.parity.suite import load_suite, suite_text

ROUTING_CONTROLS = ("model", "task", "lang", "lang_guess")
ITEM_CONTROLS = (*ROUTING_CONTROLS, "max_len", "head_max_len")
#: Router options a suite may set (JSON values, the same on both sides).
ROUTER_OPTIONS = ("default", "auto_task_detection", "lang_guess", "max_loaded")


def routing_suite(suite: str | Path = "routing") -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """(router configurations, requests) of a routing suite; batch items get the default questions."""
    routers = json.loads(suite_text(suite)).get("routers") or {"default": {}}
    for name, options in routers.items():
        unknown = sorted(set(options) - set(ROUTER_OPTIONS))
        if unknown:
            raise ValueError(
                f"routing suite router {name!r}: unknown options {unknown}; use {ROUTER_OPTIONS}"
            )
    requests = load_suite(suite, mask_token="[MASK]")
    for req in requests:
        for item in req.get("batch") or ():
            item.setdefault("questions", req.get("questions"))
        if req.get("router", "default") not in routers:
            raise ValueError(
                f"routing suite request {req['name']!r} names an unknown router {req.get('router')!r}"
            )
    return routers, requests


class RouterSide:
    """One runtime's Routers (one per configuration) and, per checkpoint, what observes its passes."""

    def __init__(self, routers: dict[str, Any], captures: dict[str, RowCapture], rows_for, calibrations):
        self.routers = routers
        self.captures = captures
        self.rows_for: dict[str, Callable] = rows_for
        self.calibrations = calibrations

    def call(self, router: Any, req: dict[str, Any]) -> Any:
        if "batch" in req:
            items = [
                {k: item[k] for k in ("state", "questions", *ITEM_CONTROLS) if k in item}
                for item in req["batch"]
            ]
            call = {k: req[k] for k in ("batch_size", "min_confidence", "sort_by_length") if k in req}
            return router.predict_batch(items, **call)
        kw = {k: req[k] for k in (*ROUTING_CONTROLS, *CONTROLS) if k in req}
        return router.predict(req["state"], req["questions"], **kw)

    def observe(self, req: dict[str, Any]) -> Observation:
        router = self.routers[req.get("router", "default")]
        for capture in self.captures.values():
            capture.clear()
        if req.get("call") in ("predict_long", "decide"):
            return self._observe_call(router, req)
        try:
            printed = self.call(router, req)
        except REFUSALS as exc:
            return Observation(refusal=refusal(exc))
        items = req["batch"] if "batch" in req else [req]
        results = printed if "batch" in req else [printed]
        rows: list[list[dict[str, Any]]] = []
        unrounded: list[dict[str, Any]] = []
        for item, result in zip(items, results, strict=True):
            routing = result.get("routing") or {}
            name = str(routing.get("model"))
            lang = item.get("lang")
            if lang is None:
                lang = (routing.get("detection") or {}).get("language") or None
            if not item["questions"]:
                rows.append([])
                unrounded.append({"answers": {}})
                continue
            state_rows, answers = observe_state(
                item["state"],
                item["questions"],
                {**item, "lang": lang},
                self.rows_for[name](item["questions"]),
                self.captures[name],
                self.calibrations[name],
            )
            rows.append(state_rows)
            unrounded.append({"answers": answers})
        return Observation(printed=printed, rows=rows, unrounded=unrounded)

    def _observe_call(self, router: Any, req: dict[str, Any]) -> Observation:
        """`"call": "predict_long"` (observed per scored window on the checkpoint it routes to, as
        `observe_long` does for one agent) or `"call": "decide"` (typed values, compared exactly)."""
        routing = {k: req[k] for k in ROUTING_CONTROLS if k in req}
        try:
            if req["call"] == "decide":
                printed = router.decide(req["state"], req["schema"], **routing)
                return Observation(printed=printed, rows=[[]], unrounded=[{"answers": {}}])
            name = str(router.route(req["state"], req["questions"], **routing)["model"])
            agent, scored = router.load(name), ScoredCalls()
            with agent.hooks_installed(scored):
                scan = {k: req[k] for k in LONG_CONTROLS if k in req and k != "lang"}
                printed = router.predict_long(req["state"], req["questions"], **routing, **scan)
        except REFUSALS as exc:
            return Observation(refusal=refusal(exc))
        lang = req.get("lang") or (printed.get("routing", {}).get("detection") or {}).get("language")
        return observe_long(
            printed, scored, self.captures[name], self.rows_for[name], self.calibrations[name], lang
        )


def our_side(bundles: Mapping[str, Any], routers: dict[str, dict[str, Any]], **router_kwargs) -> RouterSide:
    """Our Routers over `bundles` ({name: bundle}); every checkpoint preloaded and instrumented."""
    from laya_onnx.core.router import Router

    built: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the tiny presets' clamped temperatures
        for config, options in routers.items():
            router = built[config] = Router(dict(bundles), **options, **router_kwargs)
            if len(built) == 1:
                router.preload()
                agents = router.resident()
            else:  # one instrumented agent per checkpoint, shared by every configuration
                for name, agent in agents.items():
                    router.attach(name, agent)
    captures = {name: instrument_agent(agent) for name, agent in agents.items()}
    rows_for = {name: (lambda q, agent=agent: agent_rows(agent, q)) for name, agent in agents.items()}
    calibrations = {name: agent.calibration for name, agent in agents.items()}
    return RouterSide(built, captures, rows_for, calibrations)


def reference_side(
    checkpoints: Mapping[str, Any], repos: Mapping[str, str], routers, calibrations, threads: int | None = 1
) -> RouterSide:
    """`laya.Router`s with a `laya.Agent` per checkpoint attached under its name, registered with
    `repos[name]` as its source label; decoded with our bundles' `calibrations` (the same config).

    `threads`: torch's intra-op threads for the process (None leaves them). One by default: this
    compares answers, not speed, and torch's default on a busy 2-core box was measured ~40x slower
    per tiny request than one thread (3.1 s vs 0.08 s)."""
    import torch
    from laya.router import Router

    if threads is not None:
        torch.set_num_threads(threads)

    agents = {name: load_reference(path) for name, path in checkpoints.items()}
    captures = {name: instrument_reference(agent) for name, agent in agents.items()}
    built = {}
    for config, options in routers.items():
        router = Router(models=dict(repos), **options)
        for name, agent in agents.items():
            router.attach(name, agent)
        built[config] = router
    rows_for = {name: (lambda q, agent=agent: reference_rows(agent, q)) for name, agent in agents.items()}
    return RouterSide(built, captures, rows_for, calibrations)


def judge_routing(
    ref: RouterSide,
    ours: RouterSide,
    requests: list[dict[str, Any]],
    tolerance: float = DEFAULT_TOLERANCE,
    act_tolerance: float = DEFAULT_ACT_TOLERANCE,
    progress=None,
) -> list[CaseResult]:
    """Every request on both sides, judged by the parity rule."""
    cases = []
    for req in requests:
        expect = bool(req.get("expect_error"))
        verdict = judge(ref.observe(req), ours.observe(req), tolerance, act_tolerance, expect_refusal=expect)
        cases.append(CaseResult.from_verdict(req["name"], verdict))
        if progress:
            progress(cases[-1])
    return cases


def run_routing_parity(
    checkpoints: Mapping[str, Any],
    bundles: Mapping[str, Any],
    suite: str | Path = "routing",
    tolerance: float = DEFAULT_TOLERANCE,
    act_tolerance: float = DEFAULT_ACT_TOLERANCE,
    report_path: str | Path | None = None,
    progress=None,
) -> ParityReport:
    """Judge every request of the routing suite on both Routers ({name: checkpoint} / {name: bundle})."""
    started = time.perf_counter()
    routers, requests = routing_suite(suite)
    ours = our_side(bundles, routers)
    any_router = next(iter(ours.routers.values()))
    repos = {name: any_router.repo(name) for name in checkpoints}
    ref = reference_side(checkpoints, repos, routers, ours.calibrations)
    report = ParityReport(
        checkpoint=json.dumps({k: str(v) for k, v in checkpoints.items()}),
        bundle=json.dumps({k: str(v) for k, v in bundles.items()}),
        suite=str(suite),
        tolerance=tolerance,
        act_tolerance=act_tolerance,
    )
    report.cases = judge_routing(ref, ours, requests, tolerance, act_tolerance, progress)
    report.seconds = time.perf_counter() - started
    if report_path:
        write_json(report_path, report.as_dict())
    return report


__all__ = [
    "ROUTER_OPTIONS",
    "judge_routing",
    "our_side",
    "reference_side",
    "routing_suite",
    "run_routing_parity",
]


def main(argv: list[str] | None = None) -> int:
    """`python -m laya_onnx.parity.routing CHECKPOINTS_DIR MODELS_DIR [--report PATH]`: both
    directories hold one folder per checkpoint name (english/, multilingual/, typed-decisions/)."""
    import argparse

    from laya_onnx.core.router import bundles_in

    parser = argparse.ArgumentParser(prog="python -m laya_onnx.parity.routing", description=main.__doc__)
    parser.add_argument("checkpoints", help="folder of checkpoint folders, one per name")
    parser.add_argument("models", help="models directory (laya-onnx export --all)")
    parser.add_argument("--suite", default="routing")
    parser.add_argument("--report", default=None, help="write the JSON report here")
    args = parser.parse_args(argv)
    bundles = bundles_in(args.models)
    checkpoints = {name: Path(args.checkpoints) / folder.name for name, folder in bundles.items()}
    report = run_routing_parity(checkpoints, bundles, args.suite, report_path=args.report)
    for case in report.cases:
        if not case.passed:
            print("FAIL", case.name, "; ".join(case.details))
    print(json.dumps(report.summary(), indent=2))
    return 0 if report.passed else 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
