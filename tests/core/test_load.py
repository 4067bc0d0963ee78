"""`laya_onnx.load`: what a bundle path, a checkpoint name and a Hub id resolve to (loader.py)."""

from __future__ import annotations

import pytest

import laya_onnx
from laya_onnx.core import settings
from laya_onnx.core.errors import InvalidRequest
from laya_onnx.core.loader import resolve_bundle

pytestmark = pytest.mark.runtime


@pytest.fixture
def models(tmp_path, monkeypatch):
    monkeypatch.delenv(settings.MODELS_DIR.env, raising=False)
    for name in ("english", "multilingual", "custom-extra"):
        (tmp_path / name).mkdir()
    return tmp_path


def test_an_existing_path_is_itself(models):
    assert resolve_bundle(models / "english") == str(models / "english")
    assert resolve_bundle(models, subfolder="multilingual") == "%s/multilingual" % models


@pytest.mark.parametrize(
    "arg, expected",
    [
        ("english", "english"),
        (" EN ", "english"),
        ("ml", "multilingual"),
        ("laya", "english"),
        ("custom-extra", "custom-extra"),  # any bare word the models directory holds
        ("convaiinnovations/laya", "english"),  # where english is published
        ("convaiinnovations/laya/multilingual", "multilingual"),
        ("convaiinnovations/laya-multilingual", "multilingual"),
    ],
)
def test_names_and_published_ids_resolve_in_the_models_directory(models, monkeypatch, arg, expected):
    assert resolve_bundle(arg, models_dir=models) == str(models / expected)
    monkeypatch.setenv(settings.MODELS_DIR.env, str(models))
    assert resolve_bundle(arg) == str(models / expected)


def test_a_published_id_without_a_local_bundle_goes_to_the_hub(models):
    # typed-decisions has no bundle in `models`, and nothing local is configured for the other
    assert resolve_bundle("convaiinnovations/laya/typed-decisions", models_dir=models) == (
        "convaiinnovations/laya/typed-decisions"
    )
    assert resolve_bundle("convaiinnovations/laya") == "convaiinnovations/laya"
    assert resolve_bundle("someone/their-bundle", models_dir=models) == "someone/their-bundle"


@pytest.mark.reference
def test_an_unknown_name_is_refused_with_the_routers_text(models):
    from laya.router import Router

    with pytest.raises(ValueError) as ref:
        Router().resolve("nonsense")
    with pytest.raises(InvalidRequest) as ours:
        resolve_bundle("nonsense", models_dir=models)
    assert str(ours.value) == str(ref.value)


def test_a_test_bundle_stands_in_for_its_checkpoint(tmp_path, monkeypatch):
    """A models directory of `export --all` test bundles: `english` loads tiny-english/."""
    monkeypatch.delenv(settings.MODELS_DIR.env, raising=False)
    for folder, encoder in (("tiny-english", "tiny-english"), ("tiny-multilingual", "other")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "rl_agent_config.json").write_text(
            '{"encoder": "laya-onnx/%s-encoder"}' % encoder
        )
    assert resolve_bundle("en", models_dir=tmp_path) == str(tmp_path / "tiny-english")
    with pytest.raises(FileNotFoundError, match="no bundle for 'multilingual'"):
        resolve_bundle("multilingual", models_dir=tmp_path)  # its preset is not tiny-multilingual


def test_a_name_needs_a_models_directory_and_its_bundle(models):
    with pytest.raises(InvalidRequest, match="pass models_dir= or set LAYA_MODELS_DIR"):
        resolve_bundle("english")
    with pytest.raises(FileNotFoundError, match="no bundle for 'typed-decisions' in the models directory"):
        resolve_bundle("typed", models_dir=models)
    with pytest.raises(InvalidRequest, match="needs a bundle path"):
        resolve_bundle("  ")


def test_a_missing_local_path_is_file_not_found():
    with pytest.raises(FileNotFoundError, match="'./nowhere': no such directory"):
        laya_onnx.load("./nowhere")


def test_load_builds_an_agent_with_the_hooks(bundle_factory, tmp_path):
    (tmp_path / "english").symlink_to(bundle_factory("tiny-english"), target_is_directory=True)
    seen = []
    agent = laya_onnx.load(
        "en", models_dir=tmp_path, on_predict_end=lambda ctx: seen.append(ctx.model), threads=1
    )
    assert isinstance(agent, laya_onnx.ONNXAgent)
    agent.predict("hello there", {"q": {"type": "noul", "instructions": "Greeting?"}})
    assert seen == [str(tmp_path / "english")]
