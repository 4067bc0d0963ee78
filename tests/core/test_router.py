"""laya_onnx.Router on its own: names, lifecycle (LRU, hooks, preload, unload), batch grouping and
order, predict_long/decide forwarding. Agents are fakes built by `agent_factory`, so these run in
milliseconds; the comparison with laya.Router on real bundles is tests/parity/test_router_parity.py.
"""

from __future__ import annotations

import threading

import pytest

from laya_onnx.core.errors import InvalidRequest, InvalidRequestType
from laya_onnx.core.hooks import BaseHook, clear_default_hooks, set_default_hooks
from laya_onnx.core.router import Router, bundles_in, match_typed_decisions_workflow

pytestmark = pytest.mark.runtime

Q = {"refund": {"type": "noul", "instructions": "Refund?"}}
Q2 = {"topic": {"type": "choice", "instructions": "Topic?", "criteria": ["a", "b"]}}
EN, DE, JA = (
    "I was charged twice and I want my money back",
    "Mein Konto wurde zweimal belastet",
    "二重請求です",
)


class FakeAgent:
    """Answers every noul with 0.5; records predict / predict_batch calls."""

    revision = None

    def __init__(self, source, name, **kwargs):
        self.source, self.name, self.kwargs = source, name, kwargs
        self.calls: list[tuple] = []

    def _result(self, state, questions):
        answers = {
            q: {"type": "noul", "noul": 0.5, "confidence": 0.5, "answer_confidence": 0.5} for q in questions
        }
        return {
            "model": "laya-rl-agent-onnx",
            "answers": answers,
            "usage": {"input_tokens": 1, "output_tokens": 0},
        }

    def predict(self, state, questions, **kw):
        self.calls.append(("predict", state, kw))
        return self._result(state, questions)

    def predict_batch(self, states, questions, **kw):
        self.calls.append(("predict_batch", list(states), kw))
        return [self._result(s, questions) for s in states]

    def predict_long(self, state, questions, **kw):
        self.calls.append(("predict_long", state, kw))
        return self._result(state, questions)


SOURCES = {"english": "b/en", "multilingual": "b/ml", "typed-decisions": "b/td"}


def router(**kw) -> Router:
    kw.setdefault("agent_factory", FakeAgent)
    return Router(kw.pop("models", SOURCES), **kw)


class Events(BaseHook):
    def __init__(self):
        self.seen: list[tuple[str, str | None]] = []

    def on_load(self, ctx):
        self.seen.append(("load", ctx.model))

    def on_evict(self, ctx):
        self.seen.append(("evict", ctx.model))

    def on_route(self, ctx):
        self.seen.append(("route", ctx.decision["model"]))


def test_names_aliases_and_unknown():
    r = router()
    assert [r.resolve(n) for n in (" EN ", "laya", "ml", "typed_decisions", "Decisions")] == [
        "english",
        "english",
        "multilingual",
        "typed-decisions",
        "typed-decisions",
    ]
    with pytest.raises(InvalidRequest) as err:
        r.resolve("foo")
    assert str(err.value) == (
        "unknown model 'foo'; choose one of ['english', 'multilingual', 'typed-decisions'] (or an alias: "
        "['decisions', 'default', 'en', 'laya', 'laya-multilingual', 'laya-typed-decisions', 'ml', 'multi', "
        "'typed', 'typed_decisions'])"
    )


def test_extra_names_rules():
    r = router(models={**SOURCES, "Papers": "b/papers"})
    assert r.resolve("papers") == "papers"
    assert "'papers'" in str(pytest.raises(InvalidRequest, r.resolve, "paper").value)
    with pytest.raises(InvalidRequest, match="invalid checkpoint name 'a/b'"):
        router(models={"a/b": "x"})
    with pytest.raises(InvalidRequest, match="'auto' means automatic routing"):
        router(models={"auto": "x"})
    with pytest.raises(InvalidRequestType, match="must be a bundle directory"):
        router(models={"x": 5})
    with pytest.warns(RuntimeWarning, match="one edit from the built-in 'english'"):
        router(models={"enlgish": "x"})


def test_a_builtin_without_a_bundle_routes_but_refuses_to_load():
    r = router(models={"english": "b/en"})
    decision = r.route(JA, Q)
    assert decision["model"] == "multilingual" and decision["repo"] == "convaiinnovations/laya/multilingual"
    with pytest.raises(InvalidRequest, match="checkpoint 'multilingual' has no bundle to load from"):
        r.predict(JA, Q)


def test_lru_eviction_and_lifecycle_hooks():
    events = Events()
    r = router(max_loaded=2, hooks=[events])
    r.load("english")
    r.load("ml")
    r.load("english")  # touch: multilingual is now the least recently used
    r.load("typed")
    assert r.loaded == ["english", "typed-decisions"]
    assert events.seen == [
        ("load", "english"),
        ("load", "multilingual"),
        ("evict", "multilingual"),
        ("load", "typed-decisions"),
    ]
    assert set(r.load_seconds) == {"english", "multilingual", "typed-decisions"}
    r.unload("english")
    assert r.loaded == ["typed-decisions"] and events.seen[-1] == ("evict", "english")
    r.unload()
    assert r.loaded == [] and events.seen[-1] == ("evict", "typed-decisions")


def test_preload_raises_the_cap_and_passes_the_router_options():
    r = router(max_loaded=1, providers=["CPUExecutionProvider"], revision="abc", agent_kwargs={"threads": 1})
    r.preload()
    assert r.loaded == ["english", "multilingual", "typed-decisions"] and r.max_loaded == 3
    agent = r.resident()["english"]
    assert (agent.source, agent.name) == ("b/en", "english")
    assert agent.kwargs == {"threads": 1, "providers": ["CPUExecutionProvider"], "revision": "abc"}


def test_concurrent_loads_of_one_name_build_once():
    built = []
    gate = threading.Event()

    def slow(source, name, **kw):
        built.append(name)
        gate.wait(5)
        return FakeAgent(source, name, **kw)

    r = router(agent_factory=slow)
    threads = [threading.Thread(target=r.load, args=("english",)) for _ in range(4)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join(5)
    assert built == ["english"]


def test_a_failed_load_reaches_every_waiter_and_the_next_call_retries():
    calls = []

    def failing(source, name, **kw):
        calls.append(name)
        raise OSError("disk gone")

    r = router(agent_factory=failing)
    for _ in range(2):
        with pytest.raises(OSError, match="disk gone"):
            r.load("english")
    assert calls == ["english", "english"] and r.loaded == []


def test_on_route_may_replace_the_decision():
    class Pin(BaseHook):
        def on_route(self, ctx):
            ctx.decision = {**ctx.decision, "model": "typed-decisions", "reason": "pinned"}

    r = router(hooks=[Pin()])
    result = r.predict(EN, Q)
    assert result["routing"]["model"] == "typed-decisions" and result["routing"]["reason"] == "pinned"
    assert r.loaded == ["typed-decisions"]


def test_predict_forwards_language_and_budgets_and_appends_routing_last():
    r = router()
    result = r.predict(DE, Q, max_len=64)
    assert list(result)[-1] == "routing" and result["routing"]["model"] == "multilingual"
    assert r.resident()["multilingual"].calls[-1] == ("predict", DE, {"lang": "de", "max_len": 64})
    r.predict(EN, Q, lang="C")  # names no language: detection routes, the agent still gets "C"
    assert r.resident()["english"].calls[-1][2] == {"lang": "C"}


def test_default_hooks_run_once_per_router_call():
    seen = []

    class Count(BaseHook):
        def on_predict_start(self, ctx):
            seen.append(ctx.router is not None)

    set_default_hooks(Count())
    try:
        router().predict(EN, Q)
    finally:
        clear_default_hooks()
    assert seen == [True]


def test_a_start_hook_that_answers_still_gets_routing():
    class Cached(BaseHook):
        def on_predict_start(self, ctx):
            ctx.skip([{"model": "cache", "answers": {}, "usage": {}}])

    r = router(hooks=[Cached()])
    out = r.predict(JA, Q)
    assert out["model"] == "cache" and out["routing"]["model"] == "multilingual"
    assert r.resident()["multilingual"].calls == []


def test_predict_batch_groups_by_checkpoint_and_question_set_and_keeps_order():
    r = router()
    requests = [
        {"state": EN, "questions": Q},
        {"state": DE, "questions": Q},
        {"state": EN, "questions": Q2},
        {"state": EN, "questions": Q},
        {"state": JA, "questions": Q, "max_len": 32},
        {"state": DE, "questions": Q, "model": "english"},
    ]
    out = r.predict_batch(requests, batch_size=4, sort_by_length=True)
    assert [o["routing"]["model"] for o in out] == [
        "english",
        "multilingual",
        "english",
        "english",
        "multilingual",
        "english",
    ]
    assert list(out[2]["answers"]) == ["topic"]
    english = r.resident()["english"].calls
    assert english == [
        ("predict_batch", [EN, EN, DE], {"batch_size": 4, "sort_by_length": True}),
        ("predict_batch", [EN], {"batch_size": 4, "sort_by_length": True}),
    ]
    multilingual = r.resident()["multilingual"].calls
    assert [c[1] for c in multilingual] == [[DE], [JA]] and multilingual[1][2]["max_len"] == 32


def test_predict_batch_refuses_a_bad_request_by_index_before_running():
    r = router()
    with pytest.raises(InvalidRequestType, match="request 1 'state' must not be None"):
        r.predict_batch([{"state": EN, "questions": Q}, {"state": None, "questions": Q}])
    with pytest.raises(InvalidRequest, match="request 0 is missing required key 'questions'"):
        r.predict_batch([{"state": EN}])
    assert r.loaded == []


def test_predict_long_routes_then_scans_with_the_routed_agent():
    r = router()
    out = r.predict_long(DE, Q, window=64, stride=32)
    assert out["routing"]["model"] == "multilingual"
    assert r.resident()["multilingual"].calls == [
        (
            "predict_long",
            DE,
            {"window": 64, "stride": 32, "aggregate": "auto", "batch_size": None, "lang": "de"},
        )
    ]


def test_predict_long_refuses_an_agent_without_it():
    class Short(FakeAgent):
        predict_long = None  # type: ignore[assignment]

    with pytest.raises(TypeError, match="Short has no predict_long"):
        router(agent_factory=Short).predict_long(EN, Q)


def test_routing_rules_helpers():
    wf = {"action": 1, "category": 1, "churn_risk": 1, "needs_human": 1, "urgency": 1}
    assert match_typed_decisions_workflow(wf) == "customer_service"
    assert match_typed_decisions_workflow({"urgency": 1}) is None


def test_bundles_in_reads_a_models_directory(tmp_path):
    for name in ("english", "ML", "notes"):
        (tmp_path / name).mkdir()
    (tmp_path / "english" / "laya.onnx").write_bytes(b"")
    (tmp_path / "ML" / "laya.onnx").write_bytes(b"")
    assert bundles_in(tmp_path) == {"english": tmp_path / "english", "multilingual": tmp_path / "ML"}
    (tmp_path / "multilingual").mkdir()
    (tmp_path / "multilingual" / "laya.onnx").write_bytes(b"")
    with pytest.raises(InvalidRequest, match="two bundles for 'multilingual'"):
        bundles_in(tmp_path)
    with pytest.raises(FileNotFoundError, match="holds no bundle"):
        bundles_in(tmp_path / "notes")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        bundles_in(tmp_path / "missing")
    r = Router({"english": tmp_path / "english"}, agent_factory=FakeAgent)
    assert r.repo("english") == "english"  # the folder's name, never its absolute path


def _test_bundle(folder, preset=None):
    folder.mkdir()
    (folder / "laya.onnx").write_bytes(b"")
    encoder = "laya-onnx/%s-encoder" % preset if preset else "answerdotai/ModernBERT-base"
    (folder / "rl_agent_config.json").write_text('{"encoder": "%s"}' % encoder)


def test_a_test_bundle_named_for_its_preset_stands_in_for_its_checkpoint(tmp_path):
    """`export --all` without --hub writes tiny-english/ ...: random weights under their own
    name, routed in english's place; a real english/ beside it keeps that place."""
    for preset in ("tiny-english", "tiny-multilingual"):
        _test_bundle(tmp_path / preset, preset)
    _test_bundle(tmp_path / "tiny-typed-decisions")  # real weights under a test-like name
    _test_bundle(tmp_path / "tiny-papers", "tiny-papers")  # no published checkpoint of that name
    assert bundles_in(tmp_path) == {
        "english": tmp_path / "tiny-english",
        "multilingual": tmp_path / "tiny-multilingual",
        "tiny-papers": tmp_path / "tiny-papers",
        "tiny-typed-decisions": tmp_path / "tiny-typed-decisions",
    }
    r = Router(tmp_path, agent_factory=FakeAgent)
    assert r.repo("english") == "tiny-english"  # the folder's name says what answers
    _test_bundle(tmp_path / "english")
    found = bundles_in(tmp_path)
    assert found["english"] == tmp_path / "english" and found["tiny-english"] == tmp_path / "tiny-english"
