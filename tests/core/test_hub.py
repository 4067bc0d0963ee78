"""laya_onnx.core.hub: local vs Hub sources, revision pinning, snapshot commits (all offline).

The Hub is replaced by a fake cache laid out the way huggingface_hub stores snapshots
(`models--org--name/{refs/<branch>, snapshots/<sha>/...}`) and read with HF_HUB_OFFLINE=1.
laya 0.4.15's `revisions` module is the oracle for the pinning rules.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from laya_onnx.core import hub
from laya_onnx.core.errors import SourceNotFound

SHA_A = "a" * 40
SHA_B = "b" * 40
PIN = hub.PINNED_REVISIONS["convaiinnovations/laya"]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.delenv("LAYA_REVISION", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)


def _snapshot(cache: Path, repo: str, sha: str, files: dict, ref: str | None = "main") -> Path:
    storage = cache / ("models--" + repo.replace("/", "--"))
    snap = storage / "snapshots" / sha
    for name, content in files.items():
        path = snap / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            shutil.copyfile(content, path)
        else:
            path.write_text(content)
    if ref:
        (storage / "refs").mkdir(parents=True, exist_ok=True)
        (storage / "refs" / ref).write_text(sha)
    return snap


def _checkpoint_files(ckpt: Path, prefix: str = "") -> dict:
    return {prefix + p.relative_to(ckpt).as_posix(): p for p in ckpt.rglob("*") if p.is_file()}


def test_hub_module_is_torch_free():
    code = (
        "import sys, laya_onnx.core.hub; "
        "bad = [m for m in ('torch', 'transformers', 'onnx') if m in sys.modules]; "
        "sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize(
    "repo, revision, env",
    [
        ("convaiinnovations/laya", None, None),
        ("convaiinnovations/laya", "reviewed", None),
        ("ConvaiInnovations/Laya", "reviewed", None),
        ("convaiinnovations/laya-multilingual", None, "reviewed"),
        ("convaiinnovations/laya-typed-decisions", " reviewed ", None),
        ("convaiinnovations/laya", "v1.2", "reviewed"),
        ("convaiinnovations/laya", None, SHA_A),
        ("convaiinnovations/laya", "   ", SHA_A),
        ("convaiinnovations/laya", "", SHA_A),
        ("someone/else", None, "main"),
    ],
)
@pytest.mark.reference
def test_resolve_revision_matches_laya(repo, revision, env, monkeypatch):
    from laya.revisions import resolve_revision as reference

    if env is not None:
        monkeypatch.setenv("LAYA_REVISION", env)
    assert hub.resolve_revision(repo, revision) == reference(repo, revision)


def test_reviewed_pins_and_refusals(monkeypatch):
    assert (
        hub.resolve_revision("CONVAIINNOVATIONS/LAYA-MULTILINGUAL", "reviewed")
        == "e4e9ddf21a7b1903b7acffd8814ad4307bf63a67"
    )
    assert hub.resolve_revision("convaiinnovations/laya", "Reviewed") == PIN  # the word, any case
    with pytest.raises(ValueError, match=r"revision='reviewed'.*'someone/else' has no reviewed SHA"):
        hub.resolve_revision("someone/else", "reviewed")
    monkeypatch.setenv("LAYA_REVISION", "reviewed")
    with pytest.raises(ValueError, match=r"LAYA_REVISION=reviewed, but 'someone/else'"):
        hub.resolve_revision("someone/else")
    assert hub.resolve_revision("someone/else", "main") == "main"  # the argument outranks the env
    assert hub.resolve_revision("someone/else", "  ") is None  # a blank argument suppresses it


@pytest.mark.reference
def test_snapshot_revision_matches_laya(tmp_path):
    from laya.revisions import snapshot_revision as reference

    snap = _snapshot(tmp_path, "org/name", SHA_A, {"x.txt": "x"})
    link = tmp_path / "link"
    link.symlink_to(snap)
    for path in (snap, link, tmp_path, snap / "x.txt"):
        assert hub.snapshot_revision(path) == reference(str(path))
    assert hub.snapshot_revision(link) == SHA_A


@pytest.mark.parametrize(
    "arg, expected",
    [
        ("org/name", ("org/name", None)),
        ("convaiinnovations/laya/multilingual", ("convaiinnovations/laya", "multilingual")),
        ("org/name/a/b", ("org/name", "a/b")),
        ("org/name/", ("org/name", None)),
    ],
)
def test_split_repo_id(arg, expected):
    assert hub.split_repo_id(arg) == expected


@pytest.mark.parametrize("arg", ["name-only", "org/", "/org/name", "org/name/../x", "org//name", "o rg/name"])
def test_split_repo_id_refuses(arg):
    with pytest.raises(ValueError, match="neither an existing directory nor a Hub repo id"):
        hub.split_repo_id(arg)


def test_local_paths(tmp_path):
    src = hub.fetch_checkpoint(tmp_path)
    assert src.path == tmp_path and src.repo is None and src.revision is None
    for missing in (str(tmp_path / "nope"), "./nope", "../nope", "~/nope-laya-onnx"):
        with pytest.raises(SourceNotFound, match="no such directory"):
            hub.fetch_checkpoint(missing)
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError):
        hub.fetch_checkpoint(tmp_path / "file")
    with pytest.raises(ValueError, match="Hub repo id"):
        hub.fetch_checkpoint("not-a-repo-id")


def test_fetch_from_the_cache_records_the_commit(tmp_path):
    cache = tmp_path / "cache"
    _snapshot(cache, "org/name", SHA_A, {"rl_agent_config.json": "{}", "tokenizer/tokenizer.json": "{}"})
    _snapshot(cache, "org/name", SHA_B, {"rl_agent_config.json": '{"b": 1}'}, ref="v2")
    src = hub.fetch_checkpoint("org/name", cache_dir=cache)
    assert src.repo == "org/name" and src.subfolder is None
    assert src.revision == SHA_A
    assert src.path.name == SHA_A and (src.path / "tokenizer" / "tokenizer.json").exists()
    tagged = hub.fetch_checkpoint("org/name", revision="v2", cache_dir=cache)
    assert tagged.revision == SHA_B
    pinned = hub.fetch_checkpoint("org/name", revision=SHA_B, cache_dir=cache)
    assert pinned.revision == SHA_B and (pinned.path / "rl_agent_config.json").read_text() == '{"b": 1}'
    from huggingface_hub.errors import LocalEntryNotFoundError

    for missing in ({"repo": "org/name", "revision": "c" * 40}, {"repo": "org/other"}):
        with pytest.raises(
            SourceNotFound, match="is not a local directory, and the Hugging Face Hub"
        ) as caught:
            hub.fetch_checkpoint(missing.pop("repo"), cache_dir=cache, **missing)
        assert isinstance(caught.value.__cause__, LocalEntryNotFoundError)


def test_subfolders_and_reviewed_pins(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    _snapshot(
        cache,
        "convaiinnovations/laya",
        PIN,
        {"rl_agent_config.json": "{}", "multilingual/rl_agent_config.json": '{"ml": 1}'},
        ref=None,
    )
    _snapshot(cache, "convaiinnovations/laya", SHA_A, {"rl_agent_config.json": '{"unreviewed": 1}'})
    assert hub.fetch_checkpoint("convaiinnovations/laya", cache_dir=cache).revision == SHA_A
    src = hub.fetch_checkpoint("convaiinnovations/laya/multilingual", revision="reviewed", cache_dir=cache)
    assert (src.repo, src.subfolder, src.revision) == ("convaiinnovations/laya", "multilingual", PIN)
    assert src.path == cache / "models--convaiinnovations--laya" / "snapshots" / PIN / "multilingual"
    monkeypatch.setenv("LAYA_REVISION", "reviewed")
    assert hub.fetch_checkpoint("convaiinnovations/laya", cache_dir=cache).revision == PIN
    with pytest.raises(FileNotFoundError, match="Subfolder 'typed-decisions' not found"):
        hub.fetch_checkpoint("convaiinnovations/laya/typed-decisions", cache_dir=cache)


def test_snapshot_download_is_asked_for_checkpoint_files_only(tmp_path, monkeypatch):
    import huggingface_hub

    calls = []

    def fake(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        snap = tmp_path / "snapshots" / SHA_A
        (snap / "sub").mkdir(parents=True, exist_ok=True)
        return str(snap)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    src = hub.fetch_checkpoint("org/name/sub", revision="reviewed-not", cache_dir=tmp_path)
    repo, kwargs = calls[0]
    assert repo == "org/name"
    assert kwargs["allow_patterns"] == [
        "sub/rl_agent_config.json",
        "sub/model.safetensors",
        "sub/tokenizer/*",
        "sub/encoder/*",
    ]
    assert kwargs["revision"] == "reviewed-not" and kwargs["token"] == "hf_secret"
    assert src.revision == SHA_A
    hub.fetch_checkpoint("org/name", files=hub.RUNTIME_FILES)
    assert "revision" not in calls[1][1]
    assert calls[1][1]["allow_patterns"] == ["rl_agent_config.json", "tokenizer/*", "encoder/*"]


@pytest.mark.torch
def test_export_from_a_hub_id_records_repo_and_commit(checkpoint_factory, tmp_path, monkeypatch):
    from huggingface_hub import constants

    from laya_onnx.core.bundle import Bundle
    from laya_onnx.export import export_bundle

    ckpt = checkpoint_factory("tiny-english")
    cache = tmp_path / "cache"
    _snapshot(cache, "acme/laya-tiny", SHA_B, _checkpoint_files(ckpt, "english/"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    manifest = export_bundle(
        "acme/laya-tiny/english", tmp_path / "bundle", verbose=False, measure_memory=False
    )
    source = manifest.source
    assert (source.repo, source.subfolder, source.revision) == ("acme/laya-tiny", "english", SHA_B)
    assert source.path.endswith(f"snapshots/{SHA_B}/english")
    assert Bundle.open(tmp_path / "bundle").manifest.source == source


def test_checkpoint_names_for_servers(tmp_path):
    from laya_onnx.core.hub import CheckpointSource

    assert CheckpointSource(path=tmp_path, repo="convaiinnovations/laya").name == "english"
    assert (
        CheckpointSource(path=tmp_path, repo="ConvaiInnovations/laya", subfolder="multilingual").name
        == "multilingual"
    )
    assert (
        CheckpointSource(path=tmp_path, repo="convaiinnovations/laya-typed-decisions").name
        == "typed-decisions"
    )
    assert CheckpointSource(path=tmp_path, repo="org/custom", subfolder="v2/fr").name == "fr"
    assert CheckpointSource(path=tmp_path / "my-ckpt").name == "my-ckpt"


def test_onnx_agent_loads_a_bundle_from_the_hub_cache(bundle_factory, tmp_path, monkeypatch):
    from huggingface_hub import constants

    from laya_onnx import ONNXAgent

    bundle = bundle_factory("tiny-english")
    cache = tmp_path / "cache"
    _snapshot(cache, "acme/laya-onnx-tiny", SHA_B, _checkpoint_files(bundle))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    agent = ONNXAgent("acme/laya-onnx-tiny")
    assert agent.revision == SHA_B
    assert str(agent.bundle.root).endswith(f"snapshots/{SHA_B}")
    local = ONNXAgent(bundle)
    q = {"n": {"type": "noul", "instructions": "Refund?"}}
    assert agent.predict("charged twice", q) == local.predict("charged twice", q)
    with pytest.raises(SourceNotFound, match="bundle './no/such/bundle': no such directory"):
        ONNXAgent("./no/such/bundle")


def test_a_mistyped_local_path_is_never_a_hub_lookup(tmp_path, monkeypatch):
    """`work/tiny-bundel` when `work/` exists: a local path with a typo, not the Hub repo
    `work/tiny-bundel`; the error says so and offers the near names."""
    import huggingface_hub

    def no_hub(*args, **kwargs):
        raise AssertionError("a local-looking path must not reach the Hub")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_hub)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "work" / "tiny-bundle").mkdir(parents=True)
    with pytest.raises(
        SourceNotFound, match=r"'work/tiny-bundel': no such directory \(did you mean 'work/tiny-bundle'\?\)"
    ):
        hub.fetch_checkpoint("work/tiny-bundel")
    with pytest.raises(SourceNotFound, match="no such directory$"):
        hub.fetch_checkpoint("work/zzz")
    assert hub.looks_like_path("work/tiny-bundel") and not hub.looks_like_path("org/name")
