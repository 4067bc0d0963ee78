"""Parity suites: JSON request lists under `parity/suites/`, expanded for one checkpoint.

Suites stay declarative and small on disk; two directives build the long inputs:
`{"$repeat": text, "times": n}` (a long text state) and
`{"$conversation": [turns], "times": n, "tail": [turns]}` (a long conversation list, `{i}` in
turn contents is the repetition index). `{MASK}` anywhere becomes the checkpoint's mask token.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

SUITES_DIR = Path(__file__).resolve().parents[2] / "parity" / "suites"


def _expand(value: Any, mask: str) -> Any:
    if isinstance(value, str):
        return value.replace("{MASK}", mask)
    if isinstance(value, list):
        return [_expand(v, mask) for v in value]
    if isinstance(value, dict):
        if "$repeat" in value:
            return _expand(value["$repeat"], mask) * int(value["times"])
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


def load_suite(path: str | Path, mask_token: str) -> list[dict[str, Any]]:
    """The suite's requests with directives expanded; each has name, questions, and state or states."""
    path = Path(path)
    if not path.exists() and not path.suffix:
        path = SUITES_DIR / f"{path}.json"
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    out = []
    for req in data["requests"]:
        req = _expand(copy.deepcopy(req), mask_token)
        if req.get("states") is not None:
            req.pop("state", None)
        out.append(req)
    return out
