"""Check that a lock file pins every distribution a requirement needs, transitively.

    python lock/check.py LOCK_FILE REQUIREMENT...    e.g. lock/dev.txt 'laya-onnx[cpu,serve,export,dev]'

Run with the python of a venv installed from that lock (tests/run does, for both locks): the
requirements are walked through the installed metadata, so a dependency added to pyproject.toml
without a `lock/refresh` fails here, naming it, instead of installing unpinned.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==\S+$")
PROJECT = "laya-onnx"  # installed editable from the checkout, so never pinned


def pinned_names(lock_file: str) -> set[str]:
    names = set()
    with open(lock_file, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            match = PIN.match(line)
            if match is None:
                raise SystemExit(f"{lock_file}: not a 'name==version' pin: {line!r}")
            names.add(canonicalize_name(match.group(1)))
    return names


def needed_names(roots: list[str]) -> tuple[set[str], list[str]]:
    """Every distribution the roots need in this environment, and any that is not installed."""
    seen: set[tuple[str, frozenset[str]]] = set()
    missing: list[str] = []
    todo = [Requirement(root) for root in roots]
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = metadata.distribution(req.name).requires or []
        except metadata.PackageNotFoundError:
            missing.append(req.name)
            continue
        extras = req.extras or {""}
        for raw in requires:
            dep = Requirement(raw)
            if dep.marker is None or any(dep.marker.evaluate({"extra": extra}) for extra in extras):
                todo.append(dep)
    return {name for name, _ in seen}, missing


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    lock_file, roots = argv[0], argv[1:]
    needed, missing = needed_names(roots)
    if missing:
        print(f"{lock_file}: not installed here: {', '.join(sorted(missing))}", file=sys.stderr)
        return 1
    needed.discard(PROJECT)
    unpinned = sorted(needed - pinned_names(lock_file))
    if unpinned:
        print(
            f"{lock_file} does not pin {', '.join(unpinned)}, which {' + '.join(roots)} needs; "
            "run 'bash lock/refresh' (see lock/README.md)",
            file=sys.stderr,
        )
        return 1
    print(f"{lock_file}: pins all {len(needed)} distributions {' + '.join(roots)} needs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
