"""Child processes of the benches: run a module of this laya_onnx in a fresh interpreter.

`python -m laya_onnx...` puts the working directory first on the child's `sys.path`, ahead of
PYTHONPATH and the installed package, so a bench started from a folder that holds another copy of
`laya_onnx` (a checkout of another version, say) would time or measure that copy in its children
while the parent ran this one. The children here put this package's own root first instead.
"""

from __future__ import annotations

import sys
from pathlib import Path

#: The folder holding the `laya_onnx` package this process imported.
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def python_module(module: str, *args: str) -> list[str]:
    """The argv of a child running `module` as `__main__` (as `python -m` would, with `args` as its
    `sys.argv[1:]`), importing the laya_onnx this process runs whatever its working directory holds."""
    boot = (
        f"import runpy, sys; sys.path.insert(0, {PACKAGE_ROOT!r}); "
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
    )
    return [sys.executable, "-c", boot, *args]
