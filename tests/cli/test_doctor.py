"""`laya-onnx doctor` and the machine facts behind it: CPU features read from /proc/cpuinfo's
text, providers tried (not listed), advice that follows the CPU and the bundle."""

from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("onnxruntime")

from laya_onnx.cli import main
from laya_onnx.cli.doctor import advice
from laya_onnx.core import machine
from laya_onnx.core.session import CPU, CUDA

pytestmark = pytest.mark.runtime

ZEN4 = (
    "processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu sse avx2 avx512f avx512_vnni avx512_bf16\n"
)
AVX2 = "processor\t: 0\nmodel name\t: AMD EPYC 7B12\nflags\t\t: fpu sse avx2 fma\n"


def test_cpu_features_from_cpuinfo():
    zen4, avx2 = machine.read_cpu(ZEN4), machine.read_cpu(AVX2)
    assert zen4.model == "AMD EPYC 9R14" and zen4.vnni and zen4.bf16
    assert "avx512_vnni" in zen4.label and "avx512_bf16" in zen4.label
    assert not avx2.vnni and not avx2.bf16 and avx2.label == "AMD EPYC 7B12 (avx2)"
    assert machine.read_cpu("").flags == frozenset()


def test_providers_are_tried_not_listed(monkeypatch):
    import onnxruntime as ort

    assert machine.attached_providers()[CPU] == "attached"
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, CPU])
    tried = machine.attached_providers()
    assert tried[CPU] == "attached" and tried[CUDA] != "attached"  # this build has no CUDA


def test_advice_follows_the_cpu_and_the_bundle():
    memory = {"total": 8 << 30, "available": 4 << 30}
    plain = {CPU: "attached"}
    vnni = advice(machine.read_cpu(ZEN4), plain, memory, None)
    no_vnni = advice(machine.read_cpu(AVX2), plain, memory, None)
    assert "VNNI" in vnni["precision"] and "without VNNI" in no_vnni["precision"]
    assert vnni["pass_budget"].startswith("1.00 GiB")  # a quarter of the free 4 GiB
    gpu = advice(machine.read_cpu(AVX2), {CUDA: "attached", CPU: "attached"}, memory, None)
    assert gpu["precision"].startswith("fp16 on CUDA")
    int8 = {"precision": "int8", "random_weights": None, "size_bytes": 1 << 20, "path": "b"}
    assert "without VNNI" in advice(machine.read_cpu(AVX2), plain, memory, int8)["bundle"]
    assert "bundle" not in advice(machine.read_cpu(ZEN4), plain, memory, int8)


def test_doctor_json_and_a_random_weights_bundle(bundle_factory, capsys):
    assert main(["doctor", "--json", str(bundle_factory("tiny-english"))]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["onnxruntime"]["providers"][CPU] == "attached"
    assert set(report["cpu"]["features"]) == set(machine.FEATURES)
    assert report["bundle"]["random_weights"] == "tiny-english"
    assert "answers carry no meaning" in report["advice"]["bundle"]
    assert main(["doctor"]) == 0
    assert "advice" in capsys.readouterr().out


def test_predict_refuses_a_request_with_no_questions(bundle_factory, capsys):
    request = json.dumps({"state": "I was charged twice", "questions": {}})
    assert main(["predict", str(bundle_factory("tiny-english")), "--request", request]) == 2
    assert "--request has no questions: add at least one" in capsys.readouterr().err


def test_refusals_point_to_what_answers_them():
    """The text stays the reference's; the note (shown by the CLI) names the feature that answers."""
    from laya_onnx.cli.errors import exit_status, install_hint
    from laya_onnx.core.errors import InvalidRequest
    from laya_onnx.core.sequences import add_note

    refusal = InvalidRequest("question 'q': only 40 of its 150 option markers fit in max_len=512 ...")
    add_note(
        refusal, "A choice with many options can be answered by elimination: predict(..., tournament=True)."
    )
    status, message = exit_status(refusal)
    assert (
        status == 2
        and message.endswith("predict(..., tournament=True).")
        and str(refusal).startswith("question")
    )
    unstopped = InvalidRequest("question 'q': ... lower head_max_len, raise max_len, or use fewer options")
    add_note(unstopped, "A choice with many options can be answered by elimination.")
    assert exit_status(unstopped)[1].endswith(
        "use fewer options. A choice with many options can be answered by elimination."
    )
    missing = ModuleNotFoundError("No module named 'ray'", name="ray")
    assert "pip install 'laya-onnx[ray]'" in exit_status(missing)[1]
    # a dependency of laya-onnx itself: this Python is not the one it was installed into
    own = install_hint("numpy")
    assert "laya-onnx's own dependencies" in own and sys.executable in own
    # a module of laya-onnx itself missing is a bug: no install hint
    assert install_hint("laya_onnx.core.nowhere") == ""


def test_the_demo_hint_is_the_command_as_typed(monkeypatch):
    from laya_onnx.cli.common import invocation

    monkeypatch.setattr("sys.argv", [".venv/bin/laya-onnx", "demo"])
    assert invocation() == ".venv/bin/laya-onnx"
    monkeypatch.setattr("sys.argv", ["/x/laya_onnx/__main__.py", "demo"])
    assert invocation().endswith(" -m laya_onnx")
