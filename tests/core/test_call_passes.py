"""A call's planned forward passes are counted on the limits its caller put around it
(`CallLimits.passes`, the server's passes per request); a group's passes count for each member."""

from __future__ import annotations

from laya_onnx.core.work import CallLimits, GroupLimits, call_limits

QUESTIONS = {"refund": {"type": "noul", "instructions": "Should we refund?"}}


def test_each_call_adds_its_passes_and_a_group_gives_them_to_every_member(tiny_english_agent):
    limits = CallLimits()
    with call_limits(limits):
        tiny_english_agent.predict_batch(["one", "two", "three"], QUESTIONS, batch_size=1)
        assert limits.passes == 3
        tiny_english_agent.predict("four", QUESTIONS)
    assert limits.passes == 4
    members = [CallLimits(), CallLimits()]
    group = GroupLimits([members[0], None, members[1]])
    with call_limits(group):
        tiny_english_agent.predict_batch(["one", "two"], QUESTIONS, batch_size=1)
    assert group.passes == 2 and [m.passes for m in members] == [2, 2]
