"""The command line's edges, as a newcomer meets them: a request file given without '@', an
unknown option, an empty or models folder where a bundle is expected, a missing dependency,
`export --force` over a folder that holds other files, and `demo` run twice or failing."""

from __future__ import annotations

import json
import shutil

import pytest

from laya_onnx.cli import main
from laya_onnx.cli.common import EXIT_FAILED, EXIT_USAGE, UsageError, read_json_argument
from laya_onnx.cli.errors import exit_status

REQUEST = {"state": "x", "questions": {"r": {"type": "noul", "instructions": "R?"}}}


def _run(capsys, argv):
    status = main(argv)
    return status, capsys.readouterr()


def test_a_request_file_given_without_at_is_pointed_to_at_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "req.json").write_text(json.dumps(REQUEST))
    with pytest.raises(
        UsageError, match=r"not valid JSON \(.*\); to read the file 'req.json', write --request @req.json$"
    ):
        read_json_argument("req.json", "--request")
    with pytest.raises(
        UsageError, match=r"to read the file 'other.json' \(it does not exist here\), write --request @other"
    ):
        read_json_argument("other.json", "--request")
    with pytest.raises(
        UsageError, match=r"not valid JSON \(Expecting value: line 1 column 11 \(char 10\)\)$"
    ):
        read_json_argument('{"state": ', "--request")  # inline JSON gets no file hint
    assert read_json_argument("@req.json", "--request") == REQUEST


def test_an_unknown_option_is_reported_under_its_commands_usage(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["predict", "some-bundle", "--request", "{}", "--min-confidence", "0.5"])
    err = capsys.readouterr().err
    assert exit_.value.code == EXIT_USAGE
    assert err.startswith("usage: laya-onnx predict ") and "--request REQUEST" in err
    assert err.strip().endswith("laya-onnx predict: error: unrecognized arguments: --min-confidence 0.5")


def test_an_empty_folder_and_a_models_folder_are_not_called_bundles(tmp_path, capsys):
    empty = tmp_path / "models"
    empty.mkdir()
    status, out = _run(capsys, ["predict", str(empty), "--request", json.dumps(REQUEST)])
    assert status == EXIT_USAGE
    assert f"error: {str(empty)!r} is an empty folder, not a bundle: export one into it" in out.err
    assert "has no laya.onnx" not in out.err
    (empty / "tiny-english").mkdir()
    (empty / "tiny-english" / "manifest.json").write_text("{}")
    status, out = _run(capsys, ["predict", str(empty), "--request", json.dumps(REQUEST)])
    assert status == EXIT_USAGE
    assert "is a models folder holding 1 bundle(s) (tiny-english), not a bundle: name one of them" in out.err


@pytest.mark.parametrize(
    "module, says",
    [
        ("onnxruntime", "pip install 'laya-onnx[cpu]' or [gpu]"),
        ("numpy", "one of laya-onnx's own dependencies is not installed for this Python ("),
        ("yaml", "a module it needs is not installed for this Python ("),
    ],
)
def test_a_missing_dependency_says_what_to_install_not_a_bug(module, says):
    status, message = exit_status(ModuleNotFoundError(f"No module named {module!r}", name=module))
    assert status == EXIT_USAGE and says in message and "bug" not in message


def test_force_replaces_only_an_earlier_export(bundle_factory, tmp_path):
    from laya_onnx.core.bundle import check_output_dir
    from laya_onnx.core.errors import InvalidRequest

    earlier = tmp_path / "bundle"
    shutil.copytree(bundle_factory("tiny-english"), earlier)
    check_output_dir(earlier, force=True)  # an export's own files: replaceable
    (earlier / "notes.txt").write_text("mine")
    with pytest.raises(
        InvalidRequest, match=r"holds 1 entry laya-onnx did not write \('notes.txt'\); replacing it would"
    ):
        check_output_dir(earlier, force=True)
    other = tmp_path / "other"
    other.mkdir()
    (other / "a.txt").write_text("a")
    with pytest.raises(InvalidRequest, match="laya-onnx did not write"):
        check_output_dir(other, force=True)


@pytest.mark.torch
def test_export_force_keeps_files_no_export_wrote(checkpoint_factory, tmp_path, capsys):
    """`export --force` used to swap the whole folder away, deleting whatever else it held."""
    (tmp_path / "keep.txt").write_text("precious")
    status, out = _run(
        capsys, ["export", str(checkpoint_factory("tiny-english")), "-o", str(tmp_path), "--force"]
    )
    assert status == EXIT_USAGE and "laya-onnx did not write ('keep.txt')" in out.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


@pytest.mark.torch
def test_demo_says_it_reuses_an_earlier_run(checkpoint_factory, bundle_factory, tmp_path, capsys):
    workdir = tmp_path / "demo"
    shutil.copytree(checkpoint_factory("tiny-english"), workdir / "tiny-english" / "checkpoint")
    shutil.copytree(bundle_factory("tiny-english"), workdir / "tiny-english" / "bundle")
    status, out = _run(capsys, ["demo", "--workdir", str(workdir)])
    assert status == 0
    assert f"reusing the bundle an earlier run exported: {workdir / 'tiny-english' / 'bundle'}" in out.out
    assert "reusing the checkpoint an earlier run made" in out.out


@pytest.mark.torch
def test_a_failed_demo_leaves_no_folders_behind(monkeypatch, tmp_path, capsys):
    import laya_onnx.checkpoints

    def breaks(preset, out, **kwargs):
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(laya_onnx.checkpoints, "make_checkpoint", breaks)
    workdir = tmp_path / "work" / "demo"
    status, out = _run(capsys, ["demo", "--workdir", str(workdir)])
    assert status == EXIT_FAILED and "No space left on device" in out.err
    assert list(tmp_path.iterdir()) == [tmp_path / "work"] and not (tmp_path / "work" / "demo").exists()
