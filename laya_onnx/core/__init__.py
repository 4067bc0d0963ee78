"""The torch-free core: bundle and manifest, tokenizer, questions, sequences, session and
providers, memory, calibration and decoding, the gate, hooks, the parity judge, `ONNXAgent` and
`Router`. Needs numpy, tokenizers, onnxruntime and huggingface_hub only; imports nothing from the
layers above it (export, serve, score, bench, parity, cli)."""

import os

# onnxruntime writes a device id and an event database under ~/.cache/Microsoft/DeveloperTools/
# as soon as it is imported, unless this variable is set first; the core imports it lazily, so
# setting it here keeps a process that uses laya-onnx (a server, a command) writing nothing but its
# logs. An explicit value in the environment wins.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
