"""Measurements, behind `laya-onnx bench MEASUREMENT`: the agent against the reference (`agent`),
a running server under load (`http`, whose clients every server measurement runs), a bundle
served here and saturated (`saturate`), memory (`memory`); and two run as modules, Ray Serve
against one server (`ray_serve`) and the CUDA check (`device`). `sample` is the README request
they send."""
