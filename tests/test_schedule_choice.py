"""pipeline.activation_memory: the plan chooses the schedule with the least
bubble whose activations fit the budget, among those that place the stage
scopes as configured; epl-plan prints the choice."""
import pytest

import epl
from epl.cluster import Cluster
from epl.ir.taskgraph import TaskGraph
from epl.parallel.plan import planner
from epl.parallel.plan import schedule_choice
from epl.parallel.plan.pipeline_order import Schedule
from epl.tools import dry_run
from epl.tools import memory_estimate
from epl.tools import schedule_simulator
from tests import test_plan_dry_run


def _plan(devices, stages, **config):
  return planner.make_plan(
      Cluster.of([], 0, "CPU", devices),
      [TaskGraph(s, epl.replicate(1, name="stage_%d" % s))
       for s in range(stages)], epl.Config(config))


# 12 stage scopes on 6 devices (two per device), 12 micro-batches: 1F1B
# holds 2 x 6 = 12 stage-micro-batches on its first device; ZB-V as much
# with a 6.5% bubble, V-Half 8 (17.2%), V-Min 7 (25.0%), interleaved 1F1B
# more than 12.
@pytest.mark.parametrize("budget, expected, bubble", [
    (1.0, Schedule.ZERO_BUBBLE_V, "6.5%"),
    (0.7, Schedule.ZERO_BUBBLE_V_HALF, "17.2%"),
    (0.6, Schedule.ZERO_BUBBLE_V_MIN, "25.0%")])
def test_the_budget_chooses_the_least_bubble_that_fits(budget, expected,
                                                       bubble):
  plan = _plan(6, 12, **{"pipeline.num_micro_batch": 12,
                         "pipeline.virtual_stages": 2,
                         "pipeline.activation_memory": budget})
  decision = plan.decisions.schedule
  assert decision.value is expected
  assert "%s: bubble %s" % (expected.label, bubble) in decision.reason
  assert "pipeline.activation_memory %g of 1F1B's 12" % budget in (
      decision.reason)
  assert "interleaved 1F1B: bubble" in decision.reason
  # Stage s and 11 - s share device s.
  assert [plan.device(0, s)[-1] for s in range(12)] == list("012345543210")
  assert plan.virtual_stages == 2


def test_a_budget_nothing_fits_names_the_least():
  with pytest.raises(ValueError, match="activation_memory 0.5 allows 6.0 "
                     "stage-micro-batches.*V-Min's 7 \\(0.58 x 1F1B\\)"):
    _plan(6, 12, **{"pipeline.num_micro_batch": 12,
                    "pipeline.strategy": "ZeroBubbleV",
                    "pipeline.activation_memory": 0.5})


def test_one_stage_per_device_keeps_its_layout():
  # 4 scopes on 4 devices: ZB-H1 has 1F1B's memory and a third of its
  # bubble; GPipe (8 in flight) does not fit 1x.
  plan = _plan(4, 4, **{"pipeline.num_micro_batch": 8,
                        "pipeline.activation_memory": 1})
  assert plan.decisions.schedule.value is Schedule.ZERO_BUBBLE
  assert plan.virtual_stages == 1
  found = {c.schedule: c for c in schedule_choice.candidates(4, 8, 1)}
  assert found[Schedule.PREFER_FORWARD].activations == 8
  assert found[Schedule.ZERO_BUBBLE].activations == 4
  # Without a budget, pipeline.strategy.
  assert _plan(4, 4).decisions.schedule.reason == (
      "pipeline.strategy is 'PreferBackward'")


def test_epl_plan_prints_the_choice():
  result = test_plan_dry_run._pipeline_rewrite(  # pylint: disable=protected-access
      widths=(16, 16, 16, 1), micro_batches=4,
      **{"pipeline.virtual_stages": 2, "pipeline.activation_memory": 1})
  # The memory estimate walks each device's ZB-V order: device 0 holds
  # stages 0 and 3, device 1 stages 1 and 2, at most 2p = 4
  # stage-micro-batches each (the V's cap, 1F1B's peak).
  device_0, device_1 = memory_estimate.estimate(result)
  assert (device_0.stages, device_1.stages) == ([0, 3], [1, 2])
  run = schedule_simulator.simulate("ZeroBubbleV", 4, 4)
  assert [device_0.in_flight, device_1.in_flight] == [
      run.peak_in_flight(0), run.peak_in_flight(1)] == [4, 4]
  text = dry_run.describe(result)
  assert "schedule ZeroBubbleV (ZB-V), in a V" in text
  assert ("schedule: ZeroBubbleV, because pipeline.activation_memory 1 of "
          "1F1B's 4 stage-micro-batches per device allows 4.0; the least "
          "bubble that fits is ZB-V: bubble 4.0%") in text
  assert "pipeline bubble: 4.0% of a step" in text


def test_the_budget_is_a_multiple_of_1f1b_or_off():
  assert epl.Config().pipeline.activation_memory == 0
  assert epl.Config({"pipeline.activation_memory": 1}).pipeline \
      .activation_memory == 1.0
  with pytest.raises(ValueError, match="0: off"):
    epl.Config({"pipeline.activation_memory": -0.5})
