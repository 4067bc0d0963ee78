"""laya-onnx: run the Laya decision model on ONNX Runtime, torch-free.

`ONNXAgent(BUNDLE).predict(state, questions)` answers like `laya.Agent` 0.4.15 does. The
export (torch), serve (aiohttp) and parity layers live in subpackages and are imported only
by the commands that need them.
"""

__version__ = "0.1.0"


def __getattr__(name):
    # Lazy so `import laya_onnx` stays cheap and never pulls onnxruntime for the CLI's help.
    if name == "ONNXAgent":
        from laya_onnx.agent import ONNXAgent

        return ONNXAgent
    raise AttributeError(f"module 'laya_onnx' has no attribute {name!r}")


__all__ = ["ONNXAgent", "__version__"]
