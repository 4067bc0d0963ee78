"""laya-onnx: run the Laya decision model on ONNX Runtime, torch-free.

`ONNXAgent(BUNDLE).predict(state, questions)` answers like `laya.Agent` 0.4.15 does, and
`laya_onnx.load(BUNDLE_OR_NAME, hooks=...)` is laya's `laya.load(...)`. The common hook names
(`BaseHook`, `AsyncHook`, `PredictContext`, `Hook`, `PredictHook`, the `hooks` module) and the
typed decisions (`decide`, `decide_batch`, `DecisionResult`) and `Router` import from here, as from `laya`.
The export (torch), serve (aiohttp) and parity layers live in subpackages and are imported only
by the commands that need them.
"""

__version__ = "0.1.0"

# Lazy so `import laya_onnx` stays cheap and never pulls onnxruntime, numpy or asyncio for
# the CLI's help: name -> the module that defines it.
_LAZY = {
    "ONNXAgent": "laya_onnx.core.agent",
    **dict.fromkeys(
        ("AsyncHook", "BaseHook", "Hook", "PredictContext", "PredictHook"), "laya_onnx.core.hooks"
    ),
    "load": "laya_onnx.core.loader",
    **dict.fromkeys(("Router", "RouteDecision"), "laya_onnx.core.router"),
    "load_calibration": "laya_onnx.core.calibration_file",
    "push_bundle": "laya_onnx.core.publish",
    **dict.fromkeys(("DecisionResult", "SchemaError", "decide", "decide_batch"), "laya_onnx.core.structured"),
}


def __getattr__(name):
    import importlib

    if name == "hooks":
        return importlib.import_module("laya_onnx.core.hooks")
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'laya_onnx' has no attribute {name!r}")


__all__ = [
    "AsyncHook",
    "BaseHook",
    "DecisionResult",
    "Hook",
    "ONNXAgent",
    "PredictContext",
    "PredictHook",
    "RouteDecision",
    "Router",
    "SchemaError",
    "__version__",
    "decide",
    "decide_batch",
    "hooks",
    "load",
    "load_calibration",
    "push_bundle",
]
