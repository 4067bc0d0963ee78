"""A Hub-compatible server on this machine, for pulling bundles without the network.

olah (a Hugging Face Hub mirror, `pip install olah`) serves local git repositories through the
download API huggingface_hub uses (`/api/models/.../revision/...`, `/{repo}/resolve/{rev}/{file}`)
when it runs offline with `mirrors-path`; `HF_ENDPOINT` pointed at it makes `hf_hub_download`,
and so `ONNXAgent("org/name")`, pull from it. It accepts no uploads: publishing is checked up to
the commit huggingface_hub would send (tests/core/test_push.py).

A repository is a plain git repository under `<mirrors>/models/<org>/<name>`. Files at or above
`lfs_threshold` bytes are stored the way git-lfs stores them (a pointer blob in the tree, the
bytes under `.git/lfs/objects/<oid[:2]>/<oid[2:4]>/<oid>`), which olah serves with their sha256
as the ETag, as the Hub serves large files; smaller files are ordinary blobs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

#: Files this large or larger go to the repository as git-lfs objects.
LFS_THRESHOLD = 10 << 20
_GIT_IDENTITY = ["-c", "user.name=laya-onnx", "-c", "user.email=laya-onnx@localhost"]


def olah_available() -> str | None:
    """Why a local Hub cannot run here (olah or git missing), or None when it can."""
    import importlib.util

    if importlib.util.find_spec("olah") is None:
        return "olah is not installed (pip install 'laya-onnx[dev]' brings it)"
    if shutil.which("git") is None:
        return "git is not on PATH"
    return None


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *_GIT_IDENTITY, *args], cwd=repo, check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


def _lfs_pointer(repo: Path, source: Path) -> bytes:
    """Store `source` as a git-lfs object of `repo`; the pointer text that stands for it."""
    digest = hashlib.sha256()
    with open(source, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    oid = digest.hexdigest()
    target = repo / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        try:
            os.link(source, target)  # the same bytes, no second copy on disk
        except OSError:
            shutil.copyfile(source, target)
    size = source.stat().st_size
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n".encode()


@dataclass
class LocalHub:
    """Git repositories under `mirrors` and the olah server that serves them at `endpoint`."""

    mirrors: Path
    endpoint: str = ""
    lfs_threshold: int = LFS_THRESHOLD

    def repo_dir(self, repo_id: str) -> Path:
        return self.mirrors / "models" / repo_id

    def commit(
        self,
        repo_id: str,
        folder: Path,
        *,
        path_in_repo: str = "",
        message: str = "add bundle",
        branch: str = "main",
        tag: str | None = None,
    ) -> str:
        """Commit every file of `folder` into `repo_id` (under `path_in_repo`) on `branch`
        (created from the current one if new); a subfolder is replaced whole, files at the root
        stay unless overwritten. Returns the commit's sha."""
        repo = self.repo_dir(repo_id)
        if not (repo / ".git").is_dir():
            repo.mkdir(parents=True, exist_ok=True)
            _git(repo, "init", "-q", "-b", "main")
            _git(repo, "commit", "-q", "--allow-empty", "-m", "initial commit")
        if branch != _git(repo, "rev-parse", "--abbrev-ref", "HEAD"):
            known = _git(repo, "branch", "--list", branch)
            _git(repo, "checkout", "-q", *((branch,) if known else ("-b", branch)))
        dest = repo / path_in_repo if path_in_repo else repo
        if path_in_repo and dest.exists():
            shutil.rmtree(dest)
        for path in sorted(Path(folder).rglob("*")):
            if not path.is_file():
                continue
            target = dest / path.relative_to(folder)
            target.parent.mkdir(parents=True, exist_ok=True)
            if path.stat().st_size >= self.lfs_threshold:
                target.write_bytes(_lfs_pointer(repo, path))
            else:
                shutil.copyfile(path, target)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "--allow-empty", "-m", message)
        if tag:
            _git(repo, "tag", "-f", tag)
        return _git(repo, "rev-parse", "HEAD")

    @contextmanager
    def serving(self, log: Path | None = None, timeout: float = 60.0) -> Iterator[str]:
        """Run olah on a free port of 127.0.0.1, offline, serving `mirrors`; yields its endpoint."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        work = self.mirrors.parent / "olah"
        work.mkdir(parents=True, exist_ok=True)
        config = work / "olah.toml"
        config.write_text(
            "[basic]\n"
            f'host = "127.0.0.1"\nport = {port}\n'
            f'repos-path = "{work / "repos"}"\nmirrors-path = ["{self.mirrors}"]\n'
            "[accessibility]\noffline = true\n",
            encoding="utf-8",
        )
        out = open(log or work / "olah.log", "ab")
        cmd = [sys.executable, "-c", "from olah.server import cli; cli()", "-c", str(config)]
        cmd += ["--log-path", str(work / "logs")]
        proc = subprocess.Popen(cmd, cwd=work, stdout=out, stderr=subprocess.STDOUT)
        endpoint = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    urllib.request.urlopen(endpoint + "/", timeout=2).close()
                    break
                except OSError as exc:
                    # any HTTP answer (even 404) means it is up
                    if getattr(exc, "code", None):
                        break
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"olah did not start (see {out.name})") from exc
                    time.sleep(0.2)
            self.endpoint = endpoint
            yield endpoint
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            out.close()
