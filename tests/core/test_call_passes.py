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


class _Shapes:
    """A session that records the (rows, length) of every pass it runs."""

    def __init__(self, session):
        self.session, self.shapes = session, []

    def run(self, feeds, *args, **kwargs):
        self.shapes.append(feeds["input_ids"].shape)
        return self.session.run(feeds, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.session, name)


def test_warm_up_measures_the_speed_and_runs_each_length_up_to_max_len(tiny_english):
    from laya_onnx import ONNXAgent
    from laya_onnx.core.work import PROBE_LENGTH, WARM_LENGTHS

    agent = ONNXAgent(tiny_english, providers=["CPUExecutionProvider"])
    agent.session = _Shapes(agent.session)
    assert agent.pass_clock.speed is None
    agent.warm_up()
    assert agent.pass_clock.speed is not None  # the probe ran: the first estimate is a measured one
    lengths = [length for length in WARM_LENGTHS if length <= agent.max_len]
    assert lengths and (1, PROBE_LENGTH) in agent.session.shapes
    assert agent.session.shapes[-len(lengths) :] == [(1, length) for length in lengths]
    ran = len(agent.session.shapes)
    agent.warm_up()  # the probe runs once per agent; the lengths run again
    assert len(agent.session.shapes) == ran + len(lengths)
