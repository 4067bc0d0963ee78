"""Bundles pulled from a real Hub-compatible server: olah serving local git repositories.

`HF_ENDPOINT` points a child process at olah (`tests/hub_server_support.py`), which answers
huggingface_hub's download API from git repositories written here; the child pulls with
`ONNXAgent(repo_id, revision=...)` as a user would. The repository holds, over its history:
an fp32 bundle whose weights are external data (`laya.onnx.data`, tag v1), then an ordinary fp32
bundle at the root (leaving v1's data file in the tree, unlisted by the new manifest) with an
int8 bundle under `int8/`, a file no manifest lists, and a branch whose data file was altered.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hub_server_support import LocalHub, olah_available

_MISSING = olah_available()
pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(_MISSING is not None, reason=f"no local Hub server: {_MISSING}"),
]

CASES = [
    ("I was charged twice for my order", {"n": {"type": "noul", "instructions": "Refund?"}}),
    (
        "The package arrived damaged and late",
        {
            "c": {"type": "choice", "instructions": "Which team?", "criteria": ["billing", "shipping"]},
            "s": {"type": "score", "instructions": "How upset?", "criteria": ["calm", "annoyed", "angry"]},
        },
    ),
]

# One child for every pull: it imports laya_onnx once, pulls each request into its own cache
# and prints what it got (or the error's type and text), one JSON line per request.
PULL = r"""
import json, sys, warnings
from pathlib import Path
warnings.simplefilter("ignore")
from laya_onnx import ONNXAgent
requests, cases = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for req in requests:
    try:
        agent = ONNXAgent(req["repo"], revision=req.get("revision"), providers=["CPUExecutionProvider"])
    except Exception as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        continue
    root = Path(agent.bundle.root)
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    answers = [agent.predict(state, questions) for state, questions in cases]
    print(json.dumps({"revision": agent.revision, "files": files, "answers": answers}))
"""


def _files(bundle: Path) -> list[str]:
    return sorted(p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file())


def _answers(bundle: Path) -> list:
    from laya_onnx import ONNXAgent

    agent = ONNXAgent(bundle, providers=["CPUExecutionProvider"])
    return json.loads(json.dumps([agent.predict(state, questions) for state, questions in CASES]))


@pytest.fixture(scope="module")
def external_data_bundle(checkpoint_factory, tmp_path_factory) -> Path:
    """tiny-english exported with every weight as external data (laya.onnx.data)."""
    from laya_onnx.export import export_bundle

    out = tmp_path_factory.mktemp("external") / "bundle"
    export_bundle(
        checkpoint_factory("tiny-english"),
        out,
        verbose=False,
        measure_memory=False,
        external_data_threshold=0,
        name="tiny-english",
    )
    return out


@pytest.fixture(scope="module")
def hub(external_data_bundle, bundle_factory, lowered, tmp_path_factory):
    """The repository `acme/laya-tiny` (see the module's docstring), served by olah."""
    root = tmp_path_factory.mktemp("hub")
    # a low LFS threshold, so the data file travels the way large files do on the Hub
    local = LocalHub(root / "mirrors", lfs_threshold=1 << 20)
    plain, int8 = bundle_factory("tiny-english"), lowered("tiny-english", "int8")
    shas = {"v1": local.commit("acme/laya-tiny", external_data_bundle, message="external data", tag="v1")}
    local.commit("acme/laya-tiny", plain, message="fp32 inline")
    (root / "extra").mkdir()
    (root / "extra" / "notes.bin").write_bytes(b"\0" * 4096)
    local.commit("acme/laya-tiny", root / "extra", path_in_repo="notes", message="notes")
    shas["main"] = local.commit("acme/laya-tiny", int8, path_in_repo="int8", message="int8")
    tampered = root / "tampered"
    shutil.copytree(external_data_bundle, tampered)
    data = bytearray((tampered / "laya.onnx.data").read_bytes())
    data[len(data) // 2] ^= 0x01
    (tampered / "laya.onnx.data").write_bytes(bytes(data))
    shas["tampered"] = local.commit("acme/laya-tiny", tampered, message="altered", branch="tampered")
    local.commit("acme/not-a-bundle", root / "extra", message="no manifest")
    with local.serving() as endpoint:
        yield {"endpoint": endpoint, "shas": shas, "plain": plain, "int8": int8, "cache": root / "cache"}


def _pull(hub, requests: list[dict]) -> list[dict]:
    env = dict(os.environ, HF_ENDPOINT=hub["endpoint"], HF_HUB_CACHE=str(hub["cache"]), HF_HUB_OFFLINE="0")
    env.pop("HF_TOKEN", None)
    env["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", PULL, json.dumps(requests), json.dumps(CASES)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_pull_by_manifest_from_a_local_hub(hub, external_data_bundle):
    shas = hub["shas"]
    v1, v1_sha, main, sub, tampered, none = _pull(
        hub,
        [
            {"repo": "acme/laya-tiny", "revision": "v1"},
            {"repo": "acme/laya-tiny", "revision": shas["v1"]},
            {"repo": "acme/laya-tiny"},
            {"repo": "acme/laya-tiny/int8"},
            {"repo": "acme/laya-tiny", "revision": "tampered"},
            {"repo": "acme/not-a-bundle"},
        ],
    )
    # external data arrives: exactly the manifest's files, answering as the local bundle does
    ext = _files(external_data_bundle)
    assert "laya.onnx.data" in ext
    assert v1.get("files") == ext, v1
    assert v1["revision"] == shas["v1"] and v1_sha["revision"] == shas["v1"]
    local = _answers(external_data_bundle)
    assert v1["answers"] == local and v1_sha["answers"] == local
    # the default branch: the inline bundle, without v1's data file still in the tree
    assert main["revision"] == shas["main"]
    assert main["files"] == _files(hub["plain"]) and "laya.onnx.data" not in main["files"]
    assert main["answers"] == _answers(hub["plain"])
    # a subfolder: an int8 bundle's two graphs
    assert sub["files"] == _files(hub["int8"]) and "laya.u8s8.onnx" in sub["files"]
    assert sub["answers"] == _answers(hub["int8"])
    # a file altered on the server is refused by its sha256, naming it
    assert tampered.get("error") == "BundleError", tampered
    assert "sha256 mismatch for 'laya.onnx.data'" in tampered["message"]
    # a repo without a manifest is not a bundle (olah answers a missing file as a missing repo,
    # where the Hub names the file; either way it is refused, naming the id)
    assert none.get("error") == "SourceNotFound" and "'acme/not-a-bundle'" in none["message"]
