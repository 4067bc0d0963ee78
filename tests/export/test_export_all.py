"""`laya-onnx export --all`: the three checkpoints of laya's bundle repo, fetched through
huggingface_hub (offline, from a cache laid out as the Hub's, as tests/core/test_hub.py does), become one
models directory the Router serves: each bundle under its name, its Hub origin in `routing.repo`.
"""

from __future__ import annotations

import pytest

from laya_onnx.cli import main
from tests.core.test_hub import SHA_A, _checkpoint_files, _snapshot

pytestmark = [pytest.mark.torch]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.delenv("LAYA_REVISION", raising=False)


def test_checkpoint_sources_follow_the_bundle_repo_layout(tmp_path):
    # imported here: laya_onnx.export imports torch, and this module must collect without it
    from laya_onnx.export.models_dir import checkpoint_sources

    assert checkpoint_sources("hub") == {
        "english": "convaiinnovations/laya",
        "multilingual": "convaiinnovations/laya/multilingual",
        "typed-decisions": "convaiinnovations/laya/typed-decisions",
    }
    assert checkpoint_sources(str(tmp_path) + "/")["multilingual"] == f"{tmp_path}/multilingual"


def test_export_all_from_the_hub_makes_a_models_directory(tmp_path, monkeypatch, checkpoint_factory, capsys):
    from laya_onnx.export.models_dir import checkpoint_sources

    files = {}
    for prefix, preset in (("", "tiny-english"), ("multilingual/", "tiny-multilingual")):
        files.update(_checkpoint_files(checkpoint_factory(preset), prefix))
    files.update(_checkpoint_files(checkpoint_factory("tiny-typed-decisions"), "typed-decisions/"))
    cache = tmp_path / "hub-cache"
    _snapshot(cache, "convaiinnovations/laya", SHA_A, files)
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))  # read by snapshot_download per call
    out = tmp_path / "models"
    (out / "english").mkdir(parents=True)
    (out / "english" / "laya.onnx").write_text("an earlier export's graph")

    # an occupied bundle folder refuses the whole run before anything is exported
    assert main(["export", "--all", "--hub", "-o", str(out), "--no-memory-probe"]) == 2
    assert "not empty; pass --force" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["english"]
    assert main(["export", "--all", "--hub", "--name", "x", "-o", str(out)]) == 2
    assert "--name does not apply to --all" in capsys.readouterr().err

    # the huggingface_hub path: fetched from the (offline) cache, every bundle validated
    assert main(["export", "--all", "--hub", "--force", "-o", str(out), "--no-memory-probe"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["english", "multilingual", "typed-decisions"]

    from laya_onnx.core.router import Router

    router = Router(out)
    assert {name: router.repo(name) for name in router.models} == checkpoint_sources("hub")
    answer = router.predict(
        "Mein Konto wurde zweimal belastet", {"r": {"type": "noul", "instructions": "Refund?"}}
    )
    assert answer["routing"]["model"] == "multilingual"
    assert answer["routing"]["repo"] == "convaiinnovations/laya/multilingual"
    assert router.loaded_revisions == {"multilingual": SHA_A}


def test_export_all_without_a_source_never_names_a_test_bundle_after_a_real_checkpoint(tmp_path):
    """The tiny presets go to tiny-english/ ... under their own names; a Router over the directory
    still routes in the real checkpoints' places, and /v1/models calls them random, Hub id-free."""
    import json

    from laya_onnx.core.router import Router
    from laya_onnx.export.models_dir import export_models_dir
    from laya_onnx.serve.served import Served

    out = tmp_path / "models"
    export_models_dir(out, verbose=False, measure_memory=False)
    folders = sorted(p.name for p in out.iterdir())
    assert folders == ["tiny-english", "tiny-multilingual", "tiny-typed-decisions"]
    for folder in folders:
        assert json.loads((out / folder / "manifest.json").read_text())["source"]["name"] == folder
    router = Router(out)
    result = router.predict(
        "Mein Konto wurde zweimal belastet", {"r": {"type": "noul", "instructions": "Refund?"}}
    )
    assert (result["routing"]["model"], result["routing"]["repo"]) == ("multilingual", "tiny-multilingual")
    listing = Served.of(router).listing(full=True)["models"]
    assert [m["name"] for m in listing] == ["english", "multilingual", "typed-decisions"]
    for entry in listing:
        assert entry["x_random_weights"] == "tiny-" + entry["name"] and entry["x_repo"] is None
        assert not any("/" in alias for alias in entry["x_aliases"])  # no Hub id answers for it
