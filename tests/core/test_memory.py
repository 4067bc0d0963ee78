"""Per-pass memory: the model, the budgeted split, the 413 refusal, and memory coming back.

Unit tests of `laya_onnx.core.memory` need nothing; the rest use the session's tiny-english bundle
(exported with the default fused attention and its measured memory model).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from laya_onnx.core.errors import InvalidRequest, PassTooLarge
from laya_onnx.core.manifest import Manifest
from laya_onnx.core.memory import (
    DEFAULT_MAX_PASS_MEMORY,
    GiB,
    MiB,
    PassMemoryModel,
    estimate_from_architecture,
    fit_pass_memory,
    parse_bytes,
    resolve_max_pass_memory,
    split_rows,
)

CHOICE = {"pick": {"type": "choice", "instructions": "Which colour?", "criteria": ["red", "green", "blue"]}}
TWO = {**CHOICE, "urgent": {"type": "noul", "instructions": "Is it urgent?"}}


def words(n: int, salt: str = "w") -> str:
    return " ".join(f"{salt}{i}" for i in range(n))


# -- parsing the budget ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,expect",
    [
        ("2G", 2 * GiB),
        ("512M", 512 * MiB),
        ("512m", 512 * MiB),
        ("1.5GiB", 3 * GiB // 2),
        ("64KB", 64 * 1024),
        (" 300000000 ", 300_000_000),
        (4096, 4096),
    ],
)
def test_parse_bytes(text, expect):
    assert parse_bytes(text) == expect


@pytest.mark.parametrize("bad", ["", "abc", "-1", "0", "2X", "G", True, None, 0, -5, "1e9"])
def test_parse_bytes_refuses_with_the_variable_name(bad):
    with pytest.raises(ValueError, match="LAYA_MAX_PASS_MEMORY"):
        parse_bytes(bad)


def test_budget_resolution_order(monkeypatch):
    monkeypatch.delenv("LAYA_MAX_PASS_MEMORY", raising=False)
    assert resolve_max_pass_memory() == DEFAULT_MAX_PASS_MEMORY == 2 * GiB
    monkeypatch.setenv("LAYA_MAX_PASS_MEMORY", "  ")
    assert resolve_max_pass_memory() == DEFAULT_MAX_PASS_MEMORY
    monkeypatch.setenv("LAYA_MAX_PASS_MEMORY", "256M")
    assert resolve_max_pass_memory() == 256 * MiB
    assert resolve_max_pass_memory("1G") == GiB  # the argument wins over the environment
    monkeypatch.setenv("LAYA_MAX_PASS_MEMORY", "lots")
    with pytest.raises(ValueError, match="invalid LAYA_MAX_PASS_MEMORY 'lots': must be a byte count"):
        resolve_max_pass_memory()


# -- the model -------------------------------------------------------------------------------

MODEL = PassMemoryModel(per_token=600.0, per_token_sq=20.0, fixed=3 * MiB, source="test")


@pytest.mark.parametrize("budget", [64 * MiB, 2 * GiB])
def test_max_length_is_the_boundary_of_estimate(budget):
    longest = MODEL.max_length(budget)
    assert MODEL.estimate(1, longest) <= budget < MODEL.estimate(1, longest + 1)


def test_estimate_is_quadratic_in_length_and_linear_in_rows():
    assert MODEL.estimate(2, 4096) - MODEL.fixed == pytest.approx(
        2 * (MODEL.estimate(1, 4096) - MODEL.fixed), abs=2
    )
    grow = (MODEL.estimate(1, 8192) - MODEL.fixed) / (MODEL.estimate(1, 4096) - MODEL.fixed)
    assert 3.9 < grow < 4.0
    assert MODEL.estimate(0, 512) == 0


def test_model_refuses_nonsense_coefficients():
    with pytest.raises(ValueError, match="per_token_sq"):
        PassMemoryModel(per_token=1.0, per_token_sq=-1.0, fixed=0.0, source="x")
    with pytest.raises(ValueError, match="not a pass memory model"):
        PassMemoryModel.from_dict({"per_token": 1.0})


def test_fit_recovers_the_coefficients_and_covers_every_sample():
    rng = np.random.default_rng(0)
    truth = PassMemoryModel(per_token=900.0, per_token_sq=17.0, fixed=2 * MiB, source="truth")
    shapes = [(1, 128), (8, 128), (1, 512), (4, 512), (1, 1024), (1, 2048)]
    samples = [(r, n, truth.estimate(r, n) * rng.uniform(0.95, 1.05)) for r, n in shapes]
    fitted = fit_pass_memory(samples)
    assert all(fitted.estimate(r, n) >= m for r, n, m in samples)
    # extrapolating 4x past the longest sample stays conservative but within 25%
    ratio = fitted.estimate(1, 8192) / truth.estimate(1, 8192)
    assert 1.0 <= ratio <= 1.25
    with pytest.raises(ValueError, match="at least 3"):
        fit_pass_memory(samples[:2])


def test_for_bundle_prefers_the_measurement_then_the_architecture():
    measured = Manifest.parse({"memory": {"model": MODEL.as_dict()}})
    assert PassMemoryModel.for_bundle(measured) == MODEL
    arch = {"layers": 4, "hidden": 64, "heads": 2, "intermediate": 96, "head_heads": 1, "attention": "fused"}
    from_arch = PassMemoryModel.for_bundle(Manifest.parse({"export": {"architecture": arch}}))
    assert from_arch == estimate_from_architecture(arch)
    largest = PassMemoryModel.for_bundle(None)
    assert largest.per_token_sq > from_arch.per_token_sq and "largest" in largest.source
    unfused = estimate_from_architecture({**arch, "attention": "unfused"})
    assert unfused.per_token_sq > from_arch.per_token_sq


# -- the split -------------------------------------------------------------------------------


def test_split_rows_keeps_order_fits_the_budget_and_is_one_piece_when_it_fits():
    lengths = [100, 900, 50, 2000, 300, 300, 1200, 80]
    assert split_rows(lengths, MODEL, 10 * GiB) == [range(0, len(lengths))]
    budget = MODEL.estimate(2, 2000)
    pieces = split_rows(lengths, MODEL, budget)
    assert len(pieces) > 1
    assert [i for p in pieces for i in p] == list(range(len(lengths)))
    for p in pieces:
        assert MODEL.estimate(len(p), max(lengths[i] for i in p)) <= budget
    # greedy: adding the next row would have broken the budget
    for p, q in zip(pieces, pieces[1:], strict=False):
        assert MODEL.estimate(len(p) + 1, max(lengths[i] for i in [*p, q.start])) > budget


def test_a_row_that_cannot_fit_alone_is_refused_with_its_numbers():
    budget = MODEL.estimate(1, 1000)
    with pytest.raises(PassTooLarge) as info:
        split_rows([10, 1001], MODEL, budget)
    text = str(info.value)
    assert "1001 tokens" in text and "LAYA_MAX_PASS_MEMORY" in text
    assert "MiB" in text and f"about {MODEL.max_length(budget)} tokens" in text
    assert isinstance(info.value, InvalidRequest) and isinstance(info.value, ValueError)


# -- the agent on the tiny bundle ------------------------------------------------------------


@pytest.fixture(scope="module")
def bundle(bundle_factory):
    return bundle_factory("tiny-english")


def _recording(agent):
    """Wrap the agent's session: every pass's (rows, width, logits, marker mask) is recorded."""
    passes = []
    run = agent.session.run

    def recorded(feeds, **options):
        logits, act = run(feeds, **options)
        passes.append((feeds["input_ids"].shape, logits, feeds["marker_mask"], options))
        return logits, act

    agent.session.run = recorded
    return passes


def _row_probabilities(passes):
    """Softmax over each row's real marker columns, rows in pass order."""
    out = []
    for _shape, logits, mask, _ in passes:
        for row, keep in zip(logits, mask, strict=True):
            z = row[keep].astype(np.float64)
            p = np.exp(z - z.max())
            out.append(p / p.sum())
    return out


def test_the_bundle_carries_a_measured_model(bundle):
    from laya_onnx import ONNXAgent

    agent = ONNXAgent(bundle)
    assert agent.memory_model.source == "measured"
    manifest = json.loads((bundle / "manifest.json").read_text())
    samples = manifest["memory"]["samples"]
    assert len(samples) >= 4
    for s in samples:
        assert agent.memory_model.estimate(s["rows"], s["length"]) >= s["bytes"]
    # the estimate from the architecture (bundles without a measurement) is conservative where
    # it matters: the length**2 term, and every long sample
    arch = estimate_from_architecture(manifest["export"]["architecture"])
    assert arch.per_token_sq >= agent.memory_model.per_token_sq
    assert all(arch.estimate(s["rows"], s["length"]) >= s["bytes"] for s in samples)


def test_a_batch_over_the_budget_is_split_and_answers_like_one_pass(bundle):
    from laya_onnx import ONNXAgent

    states = [words(40 + 37 * i, salt="s%d_" % i) for i in range(6)]
    whole = ONNXAgent(bundle, max_pass_memory="8G")
    whole_passes = _recording(whole)
    expect = whole.predict_batch(states, TWO)
    assert len(whole_passes) == 1
    rows, width = whole_passes[0][0]
    assert rows == 12

    model = whole.memory_model
    budget = model.estimate(4, width)
    split = ONNXAgent(bundle, max_pass_memory=budget)
    split_passes = _recording(split)
    got = split.predict_batch(states, TWO)
    assert len(split_passes) >= 3
    for (n, w), *_ in split_passes:
        assert model.estimate(n, w) <= budget
    assert sum(shape[0] for shape, *_ in split_passes) == 12

    p_whole, p_split = _row_probabilities(whole_passes), _row_probabilities(split_passes)
    assert len(p_whole) == len(p_split) == 12
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(p_whole, p_split, strict=True)) <= 1e-5
    for a, b in zip(expect, got, strict=True):
        assert a["usage"] == b["usage"]
        assert a["answers"]["pick"]["choice"] == b["answers"]["pick"]["choice"]
        for key, value in a["answers"]["pick"]["probabilities"].items():
            assert abs(value - b["answers"]["pick"]["probabilities"][key]) <= 1e-4 + 1e-9


def test_unbinding_budget_keeps_lays_chunking(bundle):
    from laya_onnx import ONNXAgent

    agent = ONNXAgent(bundle)
    passes = _recording(agent)
    states = [words(5 + 20 * i) for i in range(5)]
    agent.predict_batch(states, TWO, batch_size=2, sort_by_length=True)
    assert [shape[0] for shape, *_ in passes] == [4, 4, 2]
    # small passes keep the arena: no release requested
    assert all(not options.get("release_memory") for *_, options in passes)


def test_a_row_too_large_for_the_budget_is_refused_before_any_pass(bundle):
    from laya_onnx import ONNXAgent

    probe = ONNXAgent(bundle)
    budget = probe.memory_model.estimate(1, 1024)
    agent = ONNXAgent(bundle, max_pass_memory=budget)
    passes = _recording(agent)
    with pytest.raises(PassTooLarge, match=r"a row of \d+ tokens needs an estimated"):
        agent.predict_batch(["short state", words(3000)], CHOICE, max_len=3000)
    assert passes == []
    assert agent.predict("short state", CHOICE)["answers"]["pick"]["choice"] in ("red", "green", "blue")


def test_the_server_answers_413_with_the_reason_and_splits_batches(bundle, monkeypatch):
    pytest.importorskip("aiohttp")
    from aiohttp.test_utils import TestClient, TestServer

    from laya_onnx import ONNXAgent
    from laya_onnx.serve import create_app

    for key in ("LAYA_MAX_BATCH_TOKENS", "LAYA_MAX_TOKEN_BUDGET", "LAYA_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    budget = ONNXAgent(bundle).memory_model.estimate(1, 1024)
    agent = ONNXAgent(bundle, max_pass_memory=budget)
    passes = _recording(agent)

    async def scenario():
        async with TestClient(TestServer(create_app(agent))) as client:
            # the server warms up in the background; only the requests' passes count from ready on
            while (await client.get("/health/ready")).status != 200:
                await asyncio.sleep(0.05)
            assert passes, "ready comes after the warm-up's passes"
            passes.clear()
            body = {"states": [words(3000), "short"], "questions": CHOICE, "max_len": 4096}
            resp = await client.post("/v1/systemone/batch", json=body)
            detail = (await resp.json())["detail"]
            assert resp.status == 413, detail
            assert "tokens needs an estimated" in detail and "LAYA_MAX_PASS_MEMORY" in detail
            resp = await client.post(
                "/v1/systemone", json={"state": words(3000), "questions": CHOICE, "max_len": 4096}
            )
            assert resp.status == 413
            assert passes == []
            # rows that fit, more of them than one pass may hold: split, answered
            states = [words(300, salt="x%d_" % i) for i in range(8)]
            resp = await client.post(
                "/v1/systemone/batch", json={"states": states, "questions": CHOICE, "max_len": 1024}
            )
            assert resp.status == 200
            assert len((await resp.json())["results"]) == 8
            assert len(passes) >= 2
            for (n, w), *_ in passes:
                assert agent.memory_model.estimate(n, w) <= budget

    asyncio.run(asyncio.wait_for(scenario(), 120))


# -- memory comes back -----------------------------------------------------------------------

BURST = textwrap.dedent("""
    import json, sys
    import laya_onnx.core.agent as agent_mod
    from laya_onnx import ONNXAgent
    from laya_onnx.core.memory import process_memory
    if sys.argv[2] == "keep":
        agent_mod.ARENA_RELEASE_BYTES = 1 << 60  # never release: the control
    agent = ONNXAgent(sys.argv[1])
    q = {"pick": {"type": "choice", "instructions": "Which colour?", "criteria": ["red", "green", "blue"]}}
    agent.predict("I was charged twice", q)
    idle = process_memory()["VmRSS"]
    long = " ".join("w%d" % i for i in range(3000))
    for n in range(4):  # a bounded burst: 4 calls of 2 rows x ~2048 tokens
        agent.predict_batch([long, long[: 8000 + n]], q, max_len=2048)
    m = process_memory()
    print(json.dumps({"idle": idle, "after": m["VmRSS"], "peak": m["VmHWM"]}))
""")


def _burst(bundle, mode):
    proc = subprocess.run(
        [sys.executable, "-c", BURST, str(bundle), mode], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_rss_comes_back_after_a_burst(bundle):
    got = _burst(bundle, "release")
    print("release", {k: round(v / MiB, 1) for k, v in got.items()})
    assert got["peak"] - got["idle"] >= 100 * MiB, (
        "the burst must have taken memory for this to test anything"
    )
    assert got["after"] <= 1.5 * got["idle"]
    # the control: the same burst without the release keeps its memory
    kept = _burst(bundle, "keep")
    print("keep", {k: round(v / MiB, 1) for k, v in kept.items()})
    assert kept["after"] > 1.5 * kept["idle"]
