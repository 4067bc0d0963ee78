"""`laya-onnx export` closes with whether the precision bar was met and what the precision buys on
this CPU."""

from __future__ import annotations

import json

import pytest

import laya_onnx.export
from laya_onnx.cli import main
from laya_onnx.cli.export import summary
from laya_onnx.core.machine import Cpu
from laya_onnx.core.manifest import Manifest, PrecisionRecord

#: An int8 precision record as an export writes it (the int8 bar's tie margin is null).
INT8 = {
    "precision": "int8",
    "gate": {"max_abs_dp": 0.15, "min_agreement": 1.0, "tie_margin": None},
    "suites": {
        "export-cases": {
            "decisions": 23,
            "agreeing": 22,
            "max_abs_dp": 0.0568,
            "decisive": 20,
            "decisive_agreeing": 20,
        },
        "parity-core": {
            "decisions": 78,
            "agreeing": 73,
            "max_abs_dp": 0.1436,
            "decisive": 45,
            "decisive_agreeing": 45,
        },
    },
    "passed": True,
}
AVX2 = Cpu(model="AMD EPYC", flags=frozenset({"avx2"}), cores=2)
ZEN4 = Cpu(model="AMD EPYC", flags=frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}), cores=2)


def test_int8_summary_names_the_bar_its_measurements_and_the_cpu():
    lines = summary(PrecisionRecord.parse(INT8), AVX2)
    assert lines[0] == (
        "precision bar met: int8 within max |dp| 0.15 of fp32 torch, 100% of the decisive decisions agreeing"
    )
    assert "export-cases   22/23 decisions agree (20/20 decisive), max |dp| 0.057" in lines[1]
    assert "parity-core    73/78 decisions agree (45/45 decisive), max |dp| 0.144" in lines[2]
    assert lines[3].startswith("on this CPU (AMD EPYC (avx2)): no VNNI: the exact u8 x u8 kernel")


@pytest.mark.parametrize(
    "record, cpu, says",
    [
        ({"precision": "int8"}, ZEN4, "VNNI present"),
        ({"precision": "bf16"}, ZEN4, "bf16 in hardware"),
        ({"precision": "bf16"}, AVX2, "runs fp32 here"),
        ({"precision": "fp16"}, AVX2, "fp16 is for CUDA GPUs"),
        ({}, AVX2, "exact: answers equal laya's"),
    ],
)
def test_the_cpu_line_follows_the_cpu(record, cpu, says):
    assert says in summary(PrecisionRecord.parse(record), cpu)[-1]


def test_fp32_has_no_bar_line():
    assert len(summary(PrecisionRecord(), AVX2)) == 1


def test_the_command_prints_the_summary(monkeypatch, tmp_path, capsys):
    manifest = Manifest.parse({"precision": INT8})
    monkeypatch.setattr(laya_onnx.export, "export_bundle", lambda *a, **k: manifest)
    assert main(["export", str(tmp_path / "ckpt"), "-o", str(tmp_path / "out"), "--precision", "int8"]) == 0
    out = capsys.readouterr().out
    assert "precision bar met: int8 within max |dp| 0.15" in out
    assert "on this CPU (" in out


def test_a_written_int8_bar_reads_back():
    """The manifest keeps an int8 bar (its `gate` key) whose tie margin is null (it was dropped to
    `extra`)."""
    record = Manifest.parse(json.loads(json.dumps({"precision": INT8}))).graph_precision
    assert record.gate == {"max_abs_dp": 0.15, "min_agreement": 1.0, "tie_margin": None}
