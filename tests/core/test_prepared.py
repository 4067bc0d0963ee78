"""`$LAYA_SESSION_CACHE`: a bundle's graph saved optimized and prepacked for this machine, made on
first load, used by later loads, answering bit for bit as the shipped graph does."""

from __future__ import annotations

import warnings

import pytest

from laya_onnx.core.prepared import (
    PREPARED_DATA,
    PREPARED_GRAPH,
    PreparedGraphWarning,
    cache_key,
    graph_identity,
)
from laya_onnx.core.verified import RECORDS_DIR

QUESTIONS = {
    "team": {"type": "choice", "instructions": "Which team?", "criteria": ["billing", "tech", "sales"]},
    "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["low", "soon", "now"]},
    "refund": {"type": "noul", "instructions": "Refund?"},
}
STATES = ["I was charged twice this month", "The app crashes at login, please help " * 12]


def _agent(bundle, **kwargs):
    from laya_onnx import ONNXAgent

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ONNXAgent(bundle, threads=1, **kwargs)


def test_the_prepared_graph_is_made_once_and_answers_as_the_shipped_one(tiny_english, tmp_path, monkeypatch):
    shipped = _agent(tiny_english)
    assert shipped.session._path == str(tiny_english / "laya.onnx")
    monkeypatch.setenv("LAYA_SESSION_CACHE", str(tmp_path / "cache"))
    first = _agent(tiny_english)
    key = cache_key(graph_identity(first.bundle.manifest, "laya.onnx"))
    made = tmp_path / "cache" / key
    assert first.session._path == str(made / PREPARED_GRAPH) and (made / PREPARED_DATA).is_file()
    stamp = (made / PREPARED_GRAPH).stat().st_mtime_ns
    again = _agent(tiny_english, providers=["CPUExecutionProvider"])
    assert again.session._path == str(made / PREPARED_GRAPH)
    assert (made / PREPARED_GRAPH).stat().st_mtime_ns == stamp  # used, not made again
    for state in STATES:
        assert (
            again.predict(state, QUESTIONS)
            == first.predict(state, QUESTIONS)
            == shipped.predict(state, QUESTIONS)
        )
    made = [p.name for p in (tmp_path / "cache").iterdir() if p.name != RECORDS_DIR]
    assert made == [key]  # no half-made folder left


def test_a_cache_that_cannot_be_written_falls_back_to_the_shipped_graph(tiny_english, tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("LAYA_SESSION_CACHE", str(blocked))
    from laya_onnx import ONNXAgent

    with pytest.warns(PreparedGraphWarning, match="running the bundle's graph as shipped"):
        agent = ONNXAgent(tiny_english, threads=1)
    assert agent.session._path == str(tiny_english / "laya.onnx")


def test_the_key_follows_the_graph_bytes(tiny_english):
    from laya_onnx.core.bundle import Bundle

    manifest = Bundle.open(tiny_english).manifest
    identity = graph_identity(manifest, "laya.onnx")
    assert identity == manifest.digest("laya.onnx")
    assert cache_key(identity) != cache_key("0" * 64) and len(cache_key(identity)) == 32
    assert graph_identity(manifest, "missing.onnx") is None
