"""`laya-onnx bench agent` on tiny-english: what every report must carry beside its times."""

from __future__ import annotations

import pytest


@pytest.mark.torch
@pytest.mark.reference
def test_every_result_names_the_cpu_and_times_the_reference_bf16_where_it_runs(
    checkpoint_factory, bundle_factory, lowered
):
    from laya_onnx.bench.agent import REFERENCE, REFERENCE_BF16, run_bench
    from laya_onnx.core.int8_kernel import cpu_info

    cpu = cpu_info()
    bundle, int8 = str(bundle_factory("tiny-english")), str(lowered("tiny-english", "int8"))
    printed: list[str] = []
    report = run_bench(
        checkpoint_factory("tiny-english"),
        [bundle, int8],
        repeats=2,
        threads=1,
        workloads=["short-1x1"],
        progress=printed.append,
        int8_kernels=("auto", "u8u8"),
        rss_calls=1,
    )
    figures = report["workloads"]["short-1x1"]
    assert report["cpu"]["label"] == figures["cpu"] == cpu.label
    assert report["cpu"]["features"]["avx512_bf16"] == ("avx512_bf16" in cpu.flags)
    # the printed workload line and the peak-RSS line name the CPU class too
    assert len(printed) == 2 and all(f"{cpu.label}" in line for line in printed)
    assert figures["rss_calls"] == 1
    peaks = figures["peak_rss_alone_mib"]
    # the reference's bf16 mode is a column of its own where the CPU runs bf16 (never elsewhere:
    # torch's autocast may die of SIGILL there), with its ratio, agreement and peak RSS
    ours_columns = [bundle, int8, f"{int8} [u8u8]"]
    expected = [REFERENCE, *([REFERENCE_BF16] if cpu.bf16 else []), *ours_columns]
    assert list(figures["ms"]) == expected and list(peaks) == expected
    assert all(p["peak_rss_mib"] >= p["idle_rss_mib"] > 0 for p in peaks.values()), peaks
    ours = figures["bundles"][bundle]
    assert ours["agreement"]["decisions_identical"] and ours["agreement"]["max_printed_gap"] == 0.0
    # the forced u8u8 kernel answers exactly as the kernel the CPU takes (the same integers)
    forced = figures["bundles"][f"{int8} [u8u8]"]
    assert forced["same_answers_as"] == int8 and forced["same_answers"] is True
    assert "same_answers" not in figures["bundles"][int8]
    assert f"answers identical to {int8}'s" in printed[0]
    if cpu.bf16:
        assert report["reference_bf16"] == {
            "env": "LAYA_CPU_AMP=bf16",
            "amp_enabled": True,
            "dtype": "torch.bfloat16",
        }
        assert figures["reference_bf16"]["agreement"]["same_keys"]
        assert ours["speedup_vs_reference_bf16"]["speedup"] > 0
        assert any(line.lstrip().startswith(REFERENCE_BF16 + ":") for line in printed[0].splitlines())
    else:
        assert "reference_bf16" not in report and "reference_bf16" not in figures
        assert "speedup_vs_reference_bf16" not in ours
