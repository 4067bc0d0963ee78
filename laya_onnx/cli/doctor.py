"""`laya-onnx doctor [BUNDLE]`: what this machine can run, and what to use on it.

One screen: the CPU features that decide which kernels are fast (AVX2, AVX-512, VNNI, AVX512-BF16,
AMX), the onnxruntime build and the providers that really attach (each tried on a one-node graph),
GPUs and their memory, free memory, the bundle's precision and weights when one is given, and the
recommended threads, precision and pass budget. `--json` prints the same as one JSON object.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from laya_onnx.cli.common import EXIT_OK

NAME = "doctor"
HELP = "what this machine can run: CPU features, providers that attach, GPU, memory, advice"


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        NAME,
        help=HELP,
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("bundle", nargs="?", help="a bundle folder to check against this machine (optional)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the summary")
    return p


def bundle_facts(path: str) -> dict[str, Any]:
    from laya_onnx.core.bundle import Bundle
    from laya_onnx.core.int8_kernel import Int8KernelError, choose_kernel, requested_kernel
    from laya_onnx.core.names import random_weights_preset

    bundle = Bundle.open(Path(path))
    size = sum(p.stat().st_size for p in bundle.root.rglob("*") if p.is_file())
    kernel: dict[str, str | None] | None
    try:
        choice = choose_kernel(bundle.precision, requested_kernel())
        kernel = {"kernel": choice.kernel, "reason": choice.reason} if choice.kernel else None
    except Int8KernelError as exc:  # a forced kernel this CPU cannot run: the agent would refuse it
        kernel = {"kernel": None, "reason": str(exc)}
    return {
        "path": str(bundle.root),
        "precision": bundle.precision.precision,
        "int8_kernel": kernel,
        "random_weights": random_weights_preset(bundle.config),
        "size_bytes": size,
    }


def advice(
    cpu: Any, providers: dict[str, str], memory: dict[str, Any], bundle: dict[str, Any] | None
) -> dict[str, str]:
    from laya_onnx.core import settings
    from laya_onnx.core.memory import DEFAULT_MAX_PASS_MEMORY, format_bytes
    from laya_onnx.core.session import CUDA

    out = {
        "threads": "%d (the cores this process may use; --threads or %s)" % (cpu.cores, settings.THREADS.env)
    }
    if providers.get(CUDA) == "attached":
        out["precision"] = "fp16 on CUDA for speed (gated at export); fp32 for answers equal to laya's"
    elif cpu.vnni:
        out["precision"] = (
            "fp32 for answers equal to laya's; int8 runs its integer GEMMs fast on this CPU (VNNI)"
        )
    else:
        out["precision"] = (
            "fp32: without VNNI an int8 bundle gains little here (exact, but about 1.3-1.4x fp32)"
        )
    budget = DEFAULT_MAX_PASS_MEMORY
    if memory.get("available"):
        budget = min(budget, memory["available"] // 4)
    out["pass_budget"] = "%s (%s: at most the default, a quarter of free memory)" % (
        format_bytes(budget),
        settings.MAX_PASS_MEMORY.env,
    )
    if bundle is not None:
        if bundle["random_weights"]:
            out["bundle"] = (
                "random test weights (preset %s): answers carry no meaning" % bundle["random_weights"]
            )
        elif bundle["precision"] == "int8" and not cpu.vnni:
            out["bundle"] = "int8 without VNNI here: exact but slow; an fp32 bundle is about as fast"
        elif bundle["precision"] == "bf16" and not cpu.bf16:
            out["bundle"] = "bf16 without bf16 in this CPU: it runs fp32 on onnxruntime"
        elif bundle["precision"] == "fp16" and providers.get(CUDA) != "attached":
            out["bundle"] = "fp16 is for CUDA; on this CPU it runs at fp32 speed"
        if memory.get("available") and bundle["size_bytes"] * 2 > memory["available"]:
            out["memory"] = "the bundle needs about %s loaded; only %s is free" % (
                format_bytes(bundle["size_bytes"]),
                format_bytes(memory["available"]),
            )
    return out


def examine(bundle_path: str | None) -> dict[str, Any]:
    from laya_onnx.core import machine

    cpu = machine.read_cpu()
    providers = machine.attached_providers()
    memory = machine.memory_bytes()
    bundle = bundle_facts(bundle_path) if bundle_path else None
    return {
        "cpu": cpu.as_dict(),
        "onnxruntime": {**machine.onnxruntime_build(), "providers": providers},
        "gpus": machine.gpus(),
        "memory": memory,
        "bundle": bundle,
        "advice": advice(cpu, providers, memory, bundle),
    }


def render(report: dict[str, Any]) -> str:
    from laya_onnx.core.memory import format_bytes

    cpu, ort, memory = report["cpu"], report["onnxruntime"], report["memory"]
    have = [f for f, on in cpu["features"].items() if on]
    missing = [f for f, on in cpu["features"].items() if not on]
    lines = [
        "cpu          %s, %d cores" % (cpu["model"] or "unknown", cpu["cores"]),
        "             has: %s" % (", ".join(have) or "none of the features below"),
        "             lacks: %s" % (", ".join(missing) or "nothing"),
        "onnxruntime  %s %s" % (ort["distribution"] or "not installed", ort["version"] or ""),
    ]
    lines += ["  %-24s %s" % (name, state) for name, state in ort["providers"].items()]
    gpus = report["gpus"] or [{"name": "none found (no nvidia-smi)"}]
    for gpu in gpus:
        mem = (
            " %d / %d MiB used" % (gpu["memory_used_mib"], gpu["memory_total_mib"])
            if "memory_total_mib" in gpu
            else ""
        )
        lines.append("gpu          %s%s" % (gpu["name"], mem))
    if memory["available"] is not None and memory["total"] is not None:
        lines.append(
            "memory       %s free of %s" % (format_bytes(memory["available"]), format_bytes(memory["total"]))
        )
    if report["bundle"]:
        b = report["bundle"]
        lines.append("bundle       %s: %s, %s" % (b["path"], b["precision"], format_bytes(b["size_bytes"])))
        if b.get("int8_kernel"):
            lines.append(
                "             int8 kernel %s: %s" % (b["int8_kernel"]["kernel"], b["int8_kernel"]["reason"])
            )
    lines.append("advice")
    lines += ["  %-12s %s" % (key, text) for key, text in report["advice"].items()]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    report = examine(args.bundle)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return EXIT_OK
