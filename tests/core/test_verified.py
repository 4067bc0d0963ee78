"""Verified once: a data file that matched its manifest is not hashed again while it is unchanged,
and any change to it (its bytes, even with its mtime put back) brings the hash back."""

from __future__ import annotations

import hashlib
import os

import pytest

from laya_onnx.core import bundle as bundle_module
from laya_onnx.core import verified
from laya_onnx.core.bundle import BundleError, verify_files
from laya_onnx.core.manifest import FileEntry
from laya_onnx.core.verified import VerifiedFiles

pytestmark = pytest.mark.runtime


@pytest.fixture
def hashed(monkeypatch):
    """The files sha256_file reads, in order."""
    calls: list[str] = []
    real = bundle_module.sha256_file

    def counting(path, *args, **kwargs):
        calls.append(os.path.basename(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(bundle_module, "sha256_file", counting)
    return calls


def _data(tmp_path, content=b"weights " * 1000):
    root = tmp_path / "bundle"
    root.mkdir()
    (root / "laya.onnx.data").write_bytes(content)
    return root, {"laya.onnx.data": FileEntry(sha256=hashlib.sha256(content).hexdigest(), bytes=len(content))}


def test_a_verified_file_is_not_hashed_again_until_it_changes(tmp_path, hashed, monkeypatch):
    monkeypatch.setattr(verified, "SETTLE_SECONDS", 0.0)
    root, files = _data(tmp_path)
    records = VerifiedFiles(tmp_path / "cache" / "verified")
    verify_files(root, files, records)
    verify_files(root, files, records)
    assert hashed == ["laya.onnx.data"]

    # The same size, one byte changed, the old mtime put back: the ctime moved, so it is hashed
    # again and refused.
    path = root / "laya.onnx.data"
    before = path.stat()
    with open(path, "r+b") as f:
        f.write(b"W")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size and path.stat().st_mtime_ns == before.st_mtime_ns
    with pytest.raises(BundleError, match="sha256 mismatch for 'laya.onnx.data'"):
        verify_files(root, files, records)
    assert hashed == ["laya.onnx.data"] * 2


def test_a_record_is_for_one_sha256_and_one_file(tmp_path, hashed, monkeypatch):
    monkeypatch.setattr(verified, "SETTLE_SECONDS", 0.0)
    root, files = _data(tmp_path)
    records = VerifiedFiles(tmp_path / "verified")
    verify_files(root, files, records)
    # A manifest that wants other bytes is not answered by the record.
    other = {"laya.onnx.data": FileEntry(sha256="0" * 64, bytes=files["laya.onnx.data"].bytes)}
    with pytest.raises(BundleError, match="sha256 mismatch"):
        verify_files(root, other, records)
    # A copy of the file elsewhere is hashed on its own.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    copy_root, _ = _data(elsewhere)
    verify_files(copy_root, files, records)
    assert hashed == ["laya.onnx.data"] * 3


def test_nothing_is_recorded_for_a_file_changed_just_now_or_without_the_setting(
    tmp_path, hashed, monkeypatch
):
    root, files = _data(tmp_path)
    records = VerifiedFiles(tmp_path / "verified")
    verify_files(root, files, records)  # written a moment ago: younger than SETTLE_SECONDS
    verify_files(root, files, records)
    assert hashed == ["laya.onnx.data"] * 2
    assert not (tmp_path / "verified").exists()

    monkeypatch.delenv("LAYA_SESSION_CACHE", raising=False)
    assert VerifiedFiles.from_settings() is None
    monkeypatch.setenv("LAYA_SESSION_CACHE", str(tmp_path / "cache"))
    assert VerifiedFiles.from_settings().folder == tmp_path / "cache" / "verified"


def test_an_unwritable_records_folder_only_costs_a_hash(tmp_path, hashed, monkeypatch):
    monkeypatch.setattr(verified, "SETTLE_SECONDS", 0.0)
    root, files = _data(tmp_path)
    (tmp_path / "file").write_text("not a folder")
    records = VerifiedFiles(tmp_path / "file" / "verified")
    verify_files(root, files, records)
    verify_files(root, files, records)
    assert hashed == ["laya.onnx.data"] * 2
