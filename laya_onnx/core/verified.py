"""Records of bundle files already verified, so a later load need not hash them again.

Hashing a full-size bundle's external data (1.6 GB) is most of a load once its graph is prepared
(docs/coldstart.md#verifying-once). With `$LAYA_SESSION_CACHE` set, each bundle file whose
sha256 matched its manifest is recorded in `<cache>/verified/`, under a key made of its real path,
device, inode, size, mtime and ctime. A later load that finds the same key for the sha256 the
manifest wants skips the hash. The kernel sets a file's ctime on every change to its bytes or
metadata, and no system call sets it back, so writing the file, replacing it, or restoring its
mtime after a change all give another key, and the file is hashed again.

A file whose ctime is younger than `SETTLE_SECONDS` is not recorded: on a filesystem with coarse
timestamps a change made in the same tick would keep the key (git's "racily clean" entries).
Without the setting nothing is recorded and every load hashes.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from pathlib import Path

from laya_onnx.core import settings

#: A file changed this recently is not recorded (see the module docstring).
SETTLE_SECONDS = 2.0
RECORDS_DIR = "verified"


class VerifiedFiles:
    """The records in one folder: `holds(path, sha256)` and `add(path, stat, sha256)`."""

    def __init__(self, folder: os.PathLike | str):
        self.folder = Path(folder)

    @classmethod
    def from_settings(cls) -> VerifiedFiles | None:
        """The records under `$LAYA_SESSION_CACHE`, or None when it is unset."""
        cache = settings.SESSION_CACHE.read()
        return cls(Path(cache) / RECORDS_DIR) if cache else None

    def _record(self, path: Path, stat: os.stat_result) -> Path:
        parts = (
            os.path.realpath(path),
            stat.st_dev,
            stat.st_ino,
            stat.st_size,
            stat.st_mtime_ns,
            stat.st_ctime_ns,
        )
        return self.folder / hashlib.sha256("\0".join(map(str, parts)).encode()).hexdigest()

    def holds(self, path: Path, sha256: str) -> bool:
        """Whether `path`, as it is now, was verified to have `sha256`."""
        try:
            return self._record(path, path.stat()).read_text(encoding="ascii") == sha256.lower()
        except (OSError, UnicodeDecodeError):
            return False

    def add(self, path: Path, stat: os.stat_result, sha256: str) -> None:
        """Record that `path`, as `stat` describes it (taken before hashing), has `sha256`.
        A folder that cannot be written only costs the next load a hash."""
        if time.time() - stat.st_ctime < SETTLE_SECONDS:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=self.folder, delete=False, encoding="ascii") as f:
                f.write(sha256.lower())
        except OSError:
            return
        try:
            os.replace(f.name, self._record(path, stat))
        except OSError:
            Path(f.name).unlink(missing_ok=True)
