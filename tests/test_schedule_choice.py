"""pipeline.activation_memory: the plan chooses the schedule with the least
bubble whose activations fit the budget, among those that place the stage
scopes as configured; epl-plan prints the choice."""
import pytest
import tensorflow as tf

import epl
from epl.cluster import Cluster
from epl.ir.graph_state import state_of
from epl.ir.taskgraph import TaskGraph
from epl.parallel.plan import planner
from epl.parallel.plan import schedule_choice
from epl.parallel.plan import stage_activations
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


def _built_step(stages, devices, micro_batches, budget):
  """The graph of a staged MLP (8 -> 16 tanh -> ... -> 1, one layer per
  stage, batches of 16, Adam) with its step built, not run, under two
  stages per device and pipeline.activation_memory `budget`."""
  epl.init(epl.Config({"cluster.num_cpu_devices": devices,
                       "pipeline.num_micro_batch": micro_batches,
                       "pipeline.virtual_stages": 2,
                       "pipeline.activation_memory": budget}))
  return test_plan_dry_run.staged_step((16,) * (stages - 1) + (1,))


def _plan_of_built(graph):
  env = epl.Env.get()
  return planner.make_plan(env.cluster, state_of(graph).taskgraphs,
                           env.config, graph)


# 12 stage scopes on 6 devices, 12 micro-batches of 16, float32: a middle
# stage's backward reads its input and its tanh output, 2 x 16 x 16 x 4 =
# 2,048 B per micro-batch; stage 0 reads x (16 x 8) and its output (1,536
# B), stage 11 its input and prediction - y (1,088 B); stages 5 and 6 share
# device 5 and the tensor between them (counted once there). The fullest
# device holds middle stages only: 2,048 B x its stage-micro-batches, ZB-V
# 12 (24,576 B), V-Half 8 (16,384 B), V-Min 6 (12,288 B).
@pytest.mark.parametrize("budget, expected, held", [
    ("24KiB", Schedule.ZERO_BUBBLE_V, "bubble 6.5%, 12 stage-micro-batch(es), "
     "24,576 B per device"),
    ("20 KiB", Schedule.ZERO_BUBBLE_V_HALF, "bubble 17.2%, 8 "
     "stage-micro-batch(es), 16,384 B per device"),
    ("15kB", Schedule.ZERO_BUBBLE_V_MIN, "bubble 25.0%, 7 "
     "stage-micro-batch(es), 12,288 B per device")])
def test_a_budget_in_bytes_chooses_the_least_bubble_that_fits(
    budget, expected, held):
  graph = _built_step(12, 6, 12, budget)
  kept = {t.name: (t.bytes, sorted(t.stages))
          for t in stage_activations.measure(graph)}
  assert kept["IteratorGetNext:0"] == (16 * 8 * 4, [0])
  assert kept["layer_4/Tanh:0"] == (16 * 16 * 4, [4, 5])
  assert kept["sub:0"] == (16 * 4, [11])
  assert len(kept) == 13
  decision = _plan_of_built(graph).decisions.schedule
  assert decision.value is expected
  assert "%s: %s" % (expected.label, held) in decision.reason
  assert ("pipeline.activation_memory %s allows %s B per device" % (
      budget, "{:,}".format(epl.config.size_in_bytes(budget)))
          in decision.reason)
  # Every candidate's bytes, for people to compare.
  assert "interleaved 1F1B: bubble 17.2%, 17 stage-micro-batch(es), " \
      "30,720 B per device" in decision.reason


def test_a_budget_in_bytes_nothing_fits_names_the_least():
  graph = _built_step(12, 6, 12, "12000B")
  with pytest.raises(ValueError, match="activation_memory 12000B allows "
                     "12,000 B .*the least any schedule placing the stages "
                     "so holds is V-Min's 12,288 B"):
    _plan_of_built(graph)


def test_epl_plan_prints_the_choice_in_bytes_as_the_estimate_counts():
  # 4 stages on 2 devices, 4 micro-batches: stage bytes 1,536, 2,048,
  # 2,048 and 1,088 (device 1 holds stages 1 and 2 under the V, which
  # share one tensor of 1,024 B). ZB-V holds 7,168 B at most, V-Min and
  # V-Half 6,144 B, interleaved 1F1B 8,704 B (3 x 1,536 + 2 x 2,048).
  result = test_plan_dry_run._pipeline_rewrite(  # pylint: disable=protected-access
      widths=(16, 16, 16, 1), micro_batches=4,
      **{"pipeline.virtual_stages": 2,
         "pipeline.activation_memory": "7KiB"})
  assert result.plan.schedule is Schedule.ZERO_BUBBLE_V
  # What the choice counted before the rewrite is what the memory
  # estimate counts on the rewritten graph.
  assert max(d.activations for d in memory_estimate.estimate(result)) == (
      7168)
  text = dry_run.describe(result)
  assert ("schedule: ZeroBubbleV, because pipeline.activation_memory 7KiB "
          "allows 7,168 B per device; the least bubble that fits is ZB-V: "
          "bubble 4.0%, 4 stage-micro-batch(es), 7,168 B per device") in text
  assert "interleaved 1F1B: bubble 11.1%, 5 stage-micro-batch(es), " \
      "8,704 B per device" in text


def test_a_budget_in_bytes_needs_static_shapes():
  with pytest.raises(ValueError, match="keeps sub:0 \\(from 'Sub'\\), "
                     "whose bytes are not known \\(shape \\(None, 1\\).*"
                     "and 4 more.*drop_remainder=True.*fraction of 1F1B's"):
    test_plan_dry_run._pipeline_rewrite(  # pylint: disable=protected-access
        static_batch=False, widths=(16, 16, 16, 1), micro_batches=4,
        **{"pipeline.virtual_stages": 2,
           "pipeline.activation_memory": "7KiB"})


def test_a_budget_in_bytes_needs_the_built_step():
  # A plan made without the graph (or before its backward pass) cannot
  # count bytes: an error rather than a guess.
  with pytest.raises(ValueError, match="512MB: a budget in bytes .*fraction"):
    _plan(2, 4, **{"pipeline.virtual_stages": 2,
                   "pipeline.activation_memory": "512MB"})
  epl.init(epl.Config({"cluster.num_cpu_devices": 2}))
  graph = tf.Graph()
  with graph.as_default(), epl.replicate(1, name="stage_0"):
    tf.compat.v1.layers.dense(tf.ones([4, 8]), 4)
  with pytest.raises(ValueError, match="no backward pass yet"):
    stage_activations.measure(graph)


def test_the_budget_in_bytes_is_a_size_with_a_unit():
  config = epl.Config({"pipeline.activation_memory": " 2 GiB "})
  assert config.pipeline.activation_memory == "2 GiB"
  assert epl.config.size_in_bytes("2 GiB") == 2 * 2**30
  assert epl.config.size_in_bytes("512MB") == 512 * 10**6
  for wrong in ("512", "2 bananas", "0MB", "-1MB"):
    with pytest.raises(ValueError, match="with a unit: B, kB"):
      epl.Config({"pipeline.activation_memory": wrong})
