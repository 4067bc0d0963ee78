"""Parity suites: JSON request lists shipped in this package (`laya_onnx/parity/suites/`).

They are package data (read with importlib.resources), so `laya-onnx parity --suite core` works
from a wheel as well as from a checkout.

Suites stay declarative and small on disk; three directives build the long inputs:
`{"$repeat": text, "times": n}` (a long text state),
`{"$conversation": [turns], "times": n, "tail": [turns]}` (a long conversation list, `{i}` in
turn contents is the repetition index) and `{"$list": text, "times": n}` (n strings, `{i}` the
index: many labels). `{MASK}` anywhere becomes the checkpoint's mask token.
"""

from __future__ import annotations

import copy
import hashlib
import json
from importlib import resources
from pathlib import Path
from typing import Any

from laya_onnx.core.errors import InvalidRequest, SourceNotFound


def suite_names() -> list[str]:
    """The suites this package ships."""
    root = resources.files(__package__) / "suites"
    return sorted(p.name[: -len(".json")] for p in root.iterdir() if p.name.endswith(".json"))


def suite_text(suite: str | Path) -> str:
    """A shipped suite by name ("core"), or a suite JSON file by path."""
    path = Path(suite)
    if path.suffix or path.is_file():
        if not path.is_file():
            raise SourceNotFound(f"parity suite file {str(path)!r} does not exist")
        return path.read_text(encoding="utf-8")
    shipped = resources.files(__package__) / "suites" / f"{suite}.json"
    if not shipped.is_file():
        raise InvalidRequest(
            f"unknown parity suite {str(suite)!r}; shipped suites: {suite_names()}, or give a JSON path"
        )
    return shipped.read_text(encoding="utf-8")


def suite_sha256(suite: str | Path) -> str:
    """sha256 of the suite's text: golden answers record it so a stale golden file is visible."""
    return hashlib.sha256(suite_text(suite).encode("utf-8")).hexdigest()


def _expand(value: Any, mask: str) -> Any:
    if isinstance(value, str):
        return value.replace("{MASK}", mask)
    if isinstance(value, list):
        return [_expand(v, mask) for v in value]
    if isinstance(value, dict):
        if "$repeat" in value:
            return _expand(value["$repeat"], mask) * int(value["times"])
        if "$list" in value:
            return [_expand(value["$list"], mask).replace("{i}", str(i)) for i in range(int(value["times"]))]
        if "$conversation" in value:
            turns = []
            for i in range(int(value["times"])):
                for turn in value["$conversation"]:
                    turns.append(
                        {k: (v.replace("{i}", str(i)) if isinstance(v, str) else v) for k, v in turn.items()}
                    )
            return _expand(turns + list(value.get("tail", [])), mask)
        return {k: _expand(v, mask) for k, v in value.items()}
    return value


def load_suite(suite: str | Path, mask_token: str) -> list[dict[str, Any]]:
    """The suite's requests with directives expanded; each has name, questions, and state or states."""
    data = json.loads(suite_text(suite))
    out = []
    for req in data["requests"]:
        req = _expand(copy.deepcopy(req), mask_token)
        if req.get("states") is not None:
            req.pop("state", None)
        out.append(req)
    return out
