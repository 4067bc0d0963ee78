"""Our Router equals laya.Router over the routing suite (laya_onnx/parity/suites/routing.json):
the same checkpoint, reason, whole `routing` block and answers, by the parity rule, on tiny bundles
of both tokenizer styles (ModernBERT's english and typed-decisions, Gemma's multilingual).
"""

from __future__ import annotations

import pytest

from laya_onnx.core.router import BUILTIN_NAMES
from laya_onnx.parity.routing import judge_routing, our_side, reference_side, routing_suite

pytestmark = [pytest.mark.torch, pytest.mark.reference]

PRESETS = dict(zip(BUILTIN_NAMES, ("tiny-english", "tiny-multilingual", "tiny-typed-decisions"), strict=True))


@pytest.fixture(scope="module")
def sides(checkpoint_factory, bundle_factory):
    routers, requests = routing_suite()
    ours = our_side({name: bundle_factory(p) for name, p in PRESETS.items()}, routers)
    repos = {name: next(iter(ours.routers.values())).repo(name) for name in PRESETS}
    ref = reference_side(
        {name: checkpoint_factory(p) for name, p in PRESETS.items()}, repos, routers, ours.calibrations
    )
    return ref, ours, requests


def test_router_choices_and_answers_equal_laya_router(sides):
    ref, ours, requests = sides
    cases = judge_routing(ref, ours, requests)
    failed = [f"{c.name}: {'; '.join(c.details)}" for c in cases if not c.passed]
    assert not failed, "\n".join(failed)
    assert len(cases) == len(requests) >= 60
    # every routing step of the suite is reached (decided again here, without inference)
    reasons = set()
    for r in (r for r in requests if "state" in r and "questions" in r and not r.get("expect_error")):
        controls = {k: r[k] for k in ("model", "task", "lang", "lang_guess") if k in r}
        router = ref.routers[r.get("router", "default")]
        reasons.add(router.route(r["state"], r["questions"], **controls)["reason"].split(" ")[0])
    assert {
        "explicit",
        "question",
        "lang_guess:",
        "Router(lang_guess=...):",
        "no",
        "non-Latin",
        "Latin",
        "English",
    } <= reasons


def test_the_comparison_sees_a_different_route(sides):
    """The same request on a Router whose default differs: routing and answers must fail."""
    ref, ours, requests = sides
    req = next(r for r in requests if r["name"] == "detect-undecided-short")
    (case,) = judge_routing(ref, Rerouted(ours, "english_default"), [req])
    assert not case.passed and "json" in case.failed


class Rerouted:
    """`ours`, observed through another of its Router configurations."""

    def __init__(self, side, config):
        self.side, self.config = side, config

    def observe(self, req):
        return self.side.observe({**req, "router": self.config})
