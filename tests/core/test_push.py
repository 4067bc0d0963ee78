"""Publishing a bundle (`laya_onnx.core.publish`, `laya-onnx push`) up to the network boundary.

No Hub-compatible server installable here accepts uploads (olah, which the pull tests run, is
read-only), so the push, from `laya-onnx push` and from `ONNXAgent.push_to_hub`, is checked up
to what huggingface_hub would send: the model card, the commit's operations (huggingface_hub's own
`CommitOperationAdd`, which hash the bytes they will upload), and the first request on the wire,
recorded through huggingface_hub's client factory by a transport that answers none (every
request fails to connect, as it would with the Hub unreachable).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from laya_onnx.core.bundle import Bundle, BundleError
from laya_onnx.core.errors import InvalidRequest
from laya_onnx.core.publish import CARD_FILE, PushError, plan_push, push_bundle


def _metadata(card: str) -> dict:
    from huggingface_hub import ModelCard

    return ModelCard(card).data.to_dict()


def test_the_card_of_an_fp32_bundle(tiny_english):
    plan = plan_push(tiny_english, "acme/laya-tiny", allow_random_weights=True, license="apache-2.0")
    manifest = Bundle.open(tiny_english).manifest
    meta = _metadata(plan.card)
    assert meta["library_name"] == "onnx" and meta["license"] == "apache-2.0"
    assert {"onnx", "laya-onnx", "fp32", "random-weights"} <= set(meta["tags"])
    assert "base_model" not in meta  # exported from a local folder: no Hub model to name
    body = plan.card.split("\n---\n", 1)[1]
    for name, entry in manifest.files.items():
        assert f"| `{name}` | {entry.bytes} | `{entry.sha256}` |" in body
    v = manifest.validation
    assert f"on {v.cases} requests ({v.rows} rows)" in body and "passed: True" in body
    assert manifest.export.cpu and f"CPU: {manifest.export.cpu}." in body
    assert "**Random test weights** (preset `tiny-english`" in body
    assert 'ONNXAgent("acme/laya-tiny")' in body and "laya-onnx serve acme/laya-tiny" in body


@pytest.mark.torch
def test_the_card_of_an_int8_bundle_from_a_hub_checkpoint(lowered, tmp_path):
    bundle = tmp_path / "int8"
    shutil.copytree(lowered("tiny-english", "int8"), bundle)
    # the manifest is not among the hashed files: name a Hub source as an export from one would
    data = json.loads((bundle / "manifest.json").read_text())
    data["source"].update(repo="acme/laya", subfolder="english", revision="a" * 40)
    (bundle / "manifest.json").write_text(json.dumps(data))
    plan = plan_push(bundle, "acme/laya-int8", allow_random_weights=True)
    meta = _metadata(plan.card)
    assert meta["base_model"] == "acme/laya" and "int8" in meta["tags"] and "license" not in meta
    record = Bundle.open(bundle).precision
    body = plan.card
    assert "exported from `acme/laya` (`english/`) at revision `" + "a" * 40 in body
    assert "Gate at export: max_abs_dp 0.15" in body
    for suite, m in record.suites.items():
        assert f"| {suite} | {m['decisions']} | {m['agreeing']} |" in body
    assert "`laya.u8s8.onnx`" in body


def test_the_commit_holds_exactly_the_verified_files(tiny_english):
    plan = plan_push(tiny_english, "acme/laya-tiny/english", revision="v2", allow_random_weights=True)
    manifest = Bundle.open(tiny_english).manifest
    assert (plan.repo_id, plan.revision) == ("acme/laya-tiny", "v2")
    assert plan.commit_message == "laya-onnx bundle (fp32, %d files)" % (len(manifest.files) + 1)
    ops = {op.path_in_repo: op for op in plan.operations}
    names = [*manifest.files, "manifest.json", CARD_FILE]
    assert sorted(ops) == sorted("english/" + n for n in names)
    for name, entry in manifest.files.items():  # what huggingface_hub hashed is what was verified
        assert ops["english/" + name].upload_info.sha256.hex() == entry.sha256
        assert ops["english/" + name].upload_info.size == entry.bytes
    assert ops["english/README.md"].path_or_fileobj == plan.card.encode()


def test_refusals_before_anything_is_sent(tiny_english, tmp_path):
    with pytest.raises(InvalidRequest, match="random test weights .*--allow-random-weights"):
        plan_push(tiny_english, "acme/laya-tiny")
    altered = tmp_path / "altered"
    shutil.copytree(tiny_english, altered)
    config = altered / "rl_agent_config.json"
    config.write_text(config.read_text() + " ")
    with pytest.raises(BundleError, match="sha256 mismatch for 'rl_agent_config.json'"):
        plan_push(altered, "acme/laya-tiny", allow_random_weights=True)
    with pytest.raises(ValueError, match="Hub repo id"):
        plan_push(tiny_english, "not a repo", allow_random_weights=True)


@pytest.fixture
def wire():
    """The requests huggingface_hub sends, recorded; each fails to connect."""
    import httpx2
    from huggingface_hub.utils import _http

    sent = []

    def refuse(request):
        sent.append(request)
        raise httpx2.ConnectError("nothing listens here", request=request)

    _http.set_client_factory(lambda: httpx2.Client(transport=httpx2.MockTransport(refuse)))
    yield sent
    _http.set_client_factory(_http.default_client_factory)


def test_push_sends_the_repo_creation_first_and_reports_the_failure(tiny_english, wire, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(PushError, match=r"could not publish .* as 'acme/laya-tiny' at https://") as caught:
        push_bundle(tiny_english, "acme/laya-tiny", private=True, allow_random_weights=True, token="hf_test")
    assert caught.value.__cause__ is not None
    # huggingface_hub may ask the Hub about its client first; the repo's creation comes before any file
    creates = [r for r in wire if r.url.path == "/api/repos/create"]
    assert len(creates) == 1 and creates[0].method == "POST"
    first = creates[0]
    assert json.loads(first.content) == {"name": "laya-tiny", "organization": "acme", "visibility": "private"}
    assert not [r for r in wire if "commit" in r.url.path or "preupload" in r.url.path]
    assert first.headers["authorization"] == "Bearer hf_test"


def test_the_cli_refuses_random_weights(tiny_english, capsys):
    from laya_onnx.cli import main

    assert main(["push", str(tiny_english), "acme/laya-tiny"]) == 2
    assert "--allow-random-weights" in capsys.readouterr().err


def test_push_is_a_command(tiny_english):
    from laya_onnx.cli import build_parser

    args = build_parser("push").parse_args(
        ["push", str(tiny_english), "acme/x", "--private", "--revision", "dev", "--commit-message", "m"]
    )
    assert (args.private, args.revision, args.commit_message, args.allow_random_weights) == (
        True,
        "dev",
        "m",
        False,
    )
    assert Path(args.bundle) == tiny_english


def test_an_agent_pushes_its_bundle_with_every_option(tiny_english_agent, monkeypatch):
    from laya_onnx.core import agent as agent_module

    sent = []
    monkeypatch.setattr(agent_module, "push_bundle", lambda *a, **kw: sent.append((a, kw)) or "url")
    options = dict(
        private=True,
        revision="dev",
        commit_message="m",
        allow_random_weights=True,
        license="mit",
        token="hf_test",
    )
    assert tiny_english_agent.push_to_hub("acme/laya-tiny/english", **options) == "url"
    assert sent == [((tiny_english_agent.bundle.root, "acme/laya-tiny/english"), options)]


def test_an_agent_push_goes_to_the_wire_after_the_same_checks(tiny_english, wire, monkeypatch, tmp_path):
    from huggingface_hub import constants

    from laya_onnx import ONNXAgent

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    copy = tmp_path / "bundle"
    shutil.copytree(tiny_english, copy)
    agent = ONNXAgent(copy, providers=["CPUExecutionProvider"])
    with pytest.raises(InvalidRequest, match="random test weights .*allow_random_weights=True"):
        agent.push_to_hub("acme/laya-tiny", token="hf_test")
    with pytest.raises(PushError, match=r"could not publish .* as 'acme/laya-tiny' at https://"):
        agent.push_to_hub("acme/laya-tiny", private=True, allow_random_weights=True, token="hf_test")
    creates = [r for r in wire if r.url.path == "/api/repos/create"]
    assert [json.loads(r.content)["visibility"] for r in creates] == ["private"]
    # a file changed after the agent opened the bundle is refused before anything is sent
    config = copy / "rl_agent_config.json"
    config.write_text(config.read_text() + " ")
    sent = len(wire)
    with pytest.raises(BundleError, match="sha256 mismatch for 'rl_agent_config.json'"):
        agent.push_to_hub("acme/laya-tiny", allow_random_weights=True, token="hf_test")
    assert len(wire) == sent
