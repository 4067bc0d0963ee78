"""`GET /v1/models`: Jev's model-list shape, our x_ keys, and /health's auth rule."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

pytest.importorskip("aiohttp")

from laya_onnx.core.manifest import Manifest
from laya_onnx.serve.served import UNKNOWN_RELEASE_DATE
from tests.serve_support import BODY, URL, FakeAgent, aio, post, served

pytestmark = [pytest.mark.serve, pytest.mark.usefixtures("no_laya_env")]

JEV_KEYS = ["name", "description", "release_date"]
X_KEYS = [
    "x_aliases",
    "x_revision",
    "x_repo",
    "x_graph_sha256",
    "x_manifest_sha256",
    "x_precision",
    "x_providers",
]


async def models(client, **headers):
    resp = await client.get("/v1/models", headers=headers)
    assert resp.status == 200 and resp.content_type == "application/json"
    return await resp.json()


@aio
async def test_models_without_a_key_lists_the_served_checkpoint_with_its_x_keys():
    async with served() as c:
        body = await models(c)
    assert list(body) == ["models"] and len(body["models"]) == 1
    card = body["models"][0]
    assert list(card) == JEV_KEYS + X_KEYS
    assert card["name"] == "english"
    assert "english" in card["description"] and card["release_date"] == UNKNOWN_RELEASE_DATE
    assert card["x_aliases"] == ["default", "en", "laya", "convaiinnovations/laya"]
    assert card["x_revision"] == FakeAgent.revision
    assert card["x_repo"] == "convaiinnovations/laya"
    # The fake bundle has no files in its manifest and no manifest.json on disk.
    assert card["x_graph_sha256"] is None and card["x_manifest_sha256"] is None
    assert card["x_precision"] == "fp32"
    assert card["x_providers"] == ["CPUExecutionProvider"] and "x_int8_kernel" not in card


@aio
async def test_models_follows_the_health_auth_rule():
    """Never 401; with a key, the x_ keys only for the exact bearer (like /health's payload)."""
    async with served(api_key="s3cret") as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "bearer s3cret"}):
            card = (await models(c, **headers))["models"][0]
            assert list(card) == JEV_KEYS, headers
        card = (await models(c, Authorization="Bearer s3cret"))["models"][0]
        assert list(card) == JEV_KEYS + X_KEYS
        health = await (await c.get("/health")).json()
        assert health == {"status": "ok"}


@pytest.mark.parametrize(
    "name, other, standalone",
    [
        ("english", "multilingual", None),
        ("multilingual", "english", "convaiinnovations/laya-multilingual"),
        ("typed-decisions", "multilingual", "convaiinnovations/laya-typed-decisions"),
    ],
)
def test_every_listed_name_and_alias_is_answered_as_model(name, other, standalone):
    """What /v1/models lists is what a client may send as `model` and get answered here."""
    agent = FakeAgent()
    agent.name = name

    @aio
    async def run():
        async with served(agent) as c:
            card = (await models(c))["models"][0]
            assert card["name"] == name
            for value in [card["name"], *card["x_aliases"]]:
                r, body = await post(c, URL, {**BODY, "model": value})
                assert r.status == 200, (value, body)
            r, body = await post(c, URL, {**BODY, "model": other})
            assert r.status == 422, other  # another checkpoint: not listed, not answered
            return card["x_aliases"]

    aliases = run()
    assert (
        (standalone in aliases) if standalone else all("/" not in a or a.endswith("/laya") for a in aliases)
    )


@pytest.mark.parametrize(
    "manifest, want",
    [
        ({"precision": {"precision": "fp16", "gate": {}}}, "fp16"),  # what export --precision writes
        ({"precision": {"precision": "int8"}}, "int8"),
        ({"export": {"opset": 17}}, "fp32"),  # a bundle from before the ladder
        ({"precision": "fp16"}, "fp32"),  # not the manifest's shape: not believed
    ],
)
def test_precision_comes_from_the_manifest(manifest, want):
    agent = FakeAgent()
    agent.bundle = dataclasses.replace(agent.bundle, manifest=Manifest.parse(manifest))

    @aio
    async def run():
        async with served(agent) as c:
            return (await models(c))["models"][0]["x_precision"]

    assert run() == want


def test_models_of_a_real_bundle_carry_its_digests_and_never_its_path(bundle_factory):
    from laya_onnx import ONNXAgent

    root = bundle_factory("tiny-english")
    agent = ONNXAgent(root)

    @aio
    async def run():
        async with served(agent) as c:
            resp = await c.get("/v1/models")
            return await resp.text()

    text = run()
    card = json.loads(text)["models"][0]
    assert card["name"] == "tiny-english"
    assert card["x_graph_sha256"] == hashlib.sha256((root / "laya.onnx").read_bytes()).hexdigest()
    assert card["x_manifest_sha256"] == hashlib.sha256((root / "manifest.json").read_bytes()).hexdigest()
    assert card["x_providers"] == agent.providers and card["x_precision"] == "fp32"
    manifest = json.loads((root / "manifest.json").read_text())
    for path in (str(root), str(manifest["source"]["path"])):
        assert path not in text


def test_a_bundle_of_random_weights_says_so_and_takes_no_hub_alias(bundle_factory):
    """A test checkpoint's bundle (`make-checkpoint`: random weights) never passes for a published
    checkpoint: /v1/models and /health name its preset, and it lists no Hub id as an alias."""
    from laya_onnx import ONNXAgent
    from laya_onnx.core.bundle import RandomWeightsWarning

    with pytest.warns(RandomWeightsWarning, match="holds random test weights \\(preset 'tiny-english'"):
        agent = ONNXAgent(bundle_factory("tiny-english"), name="english")
    assert agent.random_weights == "tiny-english"

    @aio
    async def run():
        async with served(agent) as c:
            card = (await models(c))["models"][0]
            health = await (await c.get("/health")).json()
            return card, health

    card, health = run()
    assert card["name"] == "english" and card["x_random_weights"] == "tiny-english"
    assert "random test weights (preset tiny-english)" in card["description"]
    assert not [alias for alias in card["x_aliases"] if "/" in alias], card["x_aliases"]  # no Hub id
    assert health["random_weights"] == {"english": "tiny-english"}


def test_a_real_checkpoint_keeps_its_hub_aliases():
    """The fake agent stands for a real checkpoint (no `random_weights`): its Hub ids stay listed
    and no random-weights key appears."""

    @aio
    async def run():
        async with served(FakeAgent()) as c:
            return (await models(c))["models"][0], await (await c.get("/health")).json()

    card, health = run()
    assert "convaiinnovations/laya" in card["x_aliases"] and "x_random_weights" not in card
    assert "random_weights" not in health
