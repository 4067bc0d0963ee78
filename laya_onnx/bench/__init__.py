"""Measurements, behind `laya-onnx bench`: the agent against the reference (`agent`), memory
(`memory`), an HTTP server under load and saturation (`http`), and Ray Serve (`ray_serve`)."""
