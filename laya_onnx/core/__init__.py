"""The torch-free core: bundle and manifest, tokenizer, questions, sequences, session and
providers, memory, calibration and decoding, the gate, hooks, the parity judge, `ONNXAgent` and
`Router`. Needs numpy, tokenizers, onnxruntime and huggingface_hub only; imports nothing from the
layers above it (export, serve, score, bench, parity, cli)."""
