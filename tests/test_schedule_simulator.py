"""The schedule simulator against the closed forms of GPipe, 1F1B,
interleaved 1F1B and ZB-H1, and the pass orders of epl.parallel.plan.pipeline_order.
Plain Python: no TensorFlow graph is built (the traced orders are checked in
test_pipeline.py)."""
import pytest

from epl.parallel.plan import pipeline_order
from epl.tools import schedule_simulator as sim

F, B, W = "forward", "backward", "weight"
SHAPES = [(2, 4), (3, 5), (4, 4), (4, 8), (8, 16)]  # (stages, micro-batches)


@pytest.mark.parametrize("schedule", ["PreferForward", "PreferBackward",
                                      "PreferBackwardOptimizer"])
@pytest.mark.parametrize("stages, micro_batches", SHAPES + [(4, 2)])
def test_gpipe_and_1f1b_bubble_is_the_closed_form(schedule, stages,
                                                  micro_batches):
  for costs in (sim.StageCosts.uniform(stages),
                sim.StageCosts.uniform(stages, 1.0, 2.0, 0.0)):
    run = sim.simulate(schedule, stages, micro_batches, costs=costs)
    assert run.bubble_fraction == pytest.approx(
        (stages - 1) / (micro_batches + stages - 1))
    # Each stage idles (p - 1) passes of F + B + W.
    per_pass = costs.forward[0] + costs.backward[0] + costs.weight[0]
    assert run.idle(0) == pytest.approx((stages - 1) * per_pass)


@pytest.mark.parametrize("stages, micro_batches", SHAPES)
def test_zb_h1_bubble_is_about_a_third_of_1f1b(stages, micro_batches):
  # With F = B = W, ZB-H1 idles (p - 1)(F + B - W) = p - 1 per stage,
  # 1F1B (p - 1)(F + B + W) = 3(p - 1): a third, for M >= p.
  zb = sim.simulate("ZeroBubble", stages, micro_batches)
  one_f_one_b = sim.simulate("PreferBackward", stages, micro_batches)
  assert zb.idle(0) == pytest.approx(one_f_one_b.idle(0) / 3)
  assert zb.bubble_fraction == pytest.approx(
      (stages - 1) / (3 * micro_batches + stages - 1))
  assert zb.makespan == 3 * micro_batches + stages - 1
  # The most activations any stage holds is 1F1B's most.
  assert max(zb.peak_in_flight(d) for d in range(stages)) == max(
      one_f_one_b.peak_in_flight(d) for d in range(stages))


def test_zb_h1_helps_less_when_weights_cost_little():
  # W = 0: nothing to fill the bubble with; ZB-H1 is 1F1B.
  costs = sim.StageCosts.uniform(4, 1.0, 2.0, 0.0)
  assert sim.simulate("ZeroBubble", 4, 8, costs=costs).makespan == \
      sim.simulate("PreferBackward", 4, 8, costs=costs).makespan


@pytest.mark.parametrize("devices, virtual_stages, micro_batches", [
    (2, 2, 4), (4, 2, 8), (4, 4, 8), (8, 2, 16), (2, 3, 6)])
def test_interleaved_divides_the_bubble_by_v(devices, virtual_stages,
                                             micro_batches):
  # The same model cut into devices x v chunks: each chunk costs 1/v of a
  # stage. 1F1B idles (d - 1)(F + B + W) per device; interleaved 1/v of it.
  stages = devices * virtual_stages
  share = 1.0 / virtual_stages
  interleaved = sim.simulate(
      "PreferBackward", stages, micro_batches, virtual_stages,
      costs=sim.StageCosts.uniform(stages, share, share, share))
  one_f_one_b = sim.simulate("PreferBackward", devices, micro_batches)
  for device in range(devices):
    assert interleaved.busy(device) == pytest.approx(
        one_f_one_b.busy(device))
    assert interleaved.idle(device) == pytest.approx(
        one_f_one_b.idle(device) / virtual_stages)
  assert interleaved.bubble_fraction == pytest.approx(
      (devices - 1) / (virtual_stages * micro_batches + devices - 1))


def test_interleaved_order_is_megatrons():
  # 2 devices, 2 chunks each (stages 0, 2 on device 0; 1, 3 on device 1),
  # 4 micro-batches: chunk by chunk in groups of 2 micro-batches;
  # device 0 runs (2 - 0 - 1) * 2 + (2 - 1) * 2 = 4 forwards first.
  run = sim.simulate("PreferBackward", 4, 4, virtual_stages=2)
  assert run.order(0) == [
      (F, 0, 0), (F, 0, 1), (F, 2, 0), (F, 2, 1),
      (F, 0, 2), (B, 2, 0), (F, 0, 3), (B, 2, 1),
      (F, 2, 2), (B, 0, 0), (F, 2, 3), (B, 0, 1),
      (B, 2, 2), (B, 2, 3), (B, 0, 2), (B, 0, 3)]
  assert run.order(1)[:3] == [(F, 1, 0), (F, 1, 1), (F, 3, 0)]


@pytest.mark.parametrize("stages, micro_batches, virtual_stages, schedule, "
                         "message", [
                             (4, 3, 2, "PreferBackward",
                              "2 devices per pipeline\\) needs pipeline."
                              "num_micro_batch to be a multiple of 2"),
                             (8, 6, 2, "ZeroBubbleV", "4 devices per "
                              "pipeline needs pipeline.num_micro_batch >= "
                              "7 .*it is 6"),
                             (8, 8, 4, "ZB-V", "Unknown"),
                             (8, 8, 4, "ZeroBubbleV", "virtual_stages is 4: "
                              "set it to 2"),
                             (6, 4, 4, "PreferBackward", "6 stages do not "
                              "divide into 4 virtual stages"),
                             (4, 4, 2, "ZeroBubble", "interleave 1F1B only"),
                             (4, 4, 1, "Interleaved", "Unknown pipeline"
                              ".strategy 'Interleaved'")])
def test_errors(stages, micro_batches, virtual_stages, schedule, message):
  with pytest.raises(ValueError, match=message):
    sim.simulate(schedule, stages, micro_batches, virtual_stages)


@pytest.mark.parametrize("devices, micro_batches", [
    (2, 3), (2, 4), (3, 5), (4, 7), (4, 8), (4, 13), (6, 12)])
def test_zb_v_idles_only_the_ramp_at_1f1b_memory(devices, micro_batches):
  # 2p stages of half a 1F1B stage each (F = B = W = 1 per half stage):
  # a device is busy 6m and idles p - 1, the first forward's way down
  # the V (1F1B: 3(p - 1) full passes, 6(p - 1) half ones).
  stages = 2 * devices
  run = sim.simulate("ZeroBubbleV", stages, micro_batches)
  assert run.makespan == 6 * micro_batches + devices - 1
  assert run.bubble_fraction == pytest.approx(
      (devices - 1) / (6 * micro_batches + devices - 1))
  one_f_one_b = sim.simulate("PreferBackward", devices, micro_batches)
  assert run.bubble_fraction < one_f_one_b.bubble_fraction / 3
  # Each device holds at most 2p half-stage micro-batches at once: 1F1B's
  # p full ones on its first stage.
  assert max(run.peak_in_flight(d) for d in range(devices)) == 2 * max(
      one_f_one_b.peak_in_flight(d) for d in range(devices))


@pytest.mark.parametrize("devices", [2, 3, 4, 6, 8])
@pytest.mark.parametrize("schedule", ["ZeroBubbleVHalf", "ZeroBubbleVMin"])
def test_capped_v_holds_its_cap_with_less_bubble_than_1f1b(schedule,
                                                           devices):
  cap = pipeline_order.Schedule(schedule).activation_cap(devices)
  one_f_one_b_peak = 2 * devices  # p micro-batches of two stages
  assert cap <= one_f_one_b_peak
  for micro_batches in range(1, 3 * devices + 1):
    run = sim.simulate(schedule, 2 * devices, micro_batches)
    assert max(run.peak_in_flight(d) for d in range(devices)) <= cap
  micro_batches = 2 * devices
  run = sim.simulate(schedule, 2 * devices, micro_batches)
  one_f_one_b = sim.simulate("PreferBackward", devices, micro_batches)
  zb_v = sim.simulate("ZeroBubbleV", 2 * devices, micro_batches)
  assert zb_v.bubble_fraction <= run.bubble_fraction
  assert run.bubble_fraction <= one_f_one_b.bubble_fraction + 1e-9


def test_capped_v_is_at_most_what_it_may_hold():
  # V-Half on 4 devices: (4 + 2) / 2 = 3 micro-batches of a device's two
  # stages, 6 stage-micro-batches (1F1B: 8); V-Min (4 + 4) / 3, rounded
  # up: 6 too; on 8 devices 10 and 8 (1F1B: 16).
  half, least = (pipeline_order.Schedule.ZERO_BUBBLE_V_HALF,
                 pipeline_order.Schedule.ZERO_BUBBLE_V_MIN)
  assert [half.activation_cap(p) for p in (4, 8)] == [6, 10]
  assert [least.activation_cap(p) for p in (4, 8)] == [6, 8]
  with pytest.raises(ValueError, match="keeps each device within 1 "):
    pipeline_order.capped_v_orders(2, 4, 1)


def test_zb_v_order():
  # 2 devices: device 0 holds stages 0 and 3, device 1 stages 1 and 2.
  run = sim.simulate("ZeroBubbleV", 4, 3)
  assert run.order(0) == [
      (F, 0, 0), (F, 0, 1), (F, 0, 2), (F, 3, 0), (B, 3, 0), (W, 3, 0),
      (F, 3, 1), (B, 3, 1), (W, 3, 1), (B, 0, 0), (W, 0, 0), (F, 3, 2),
      (B, 3, 2), (W, 3, 2), (B, 0, 1), (W, 0, 1), (B, 0, 2), (W, 0, 2)]
  assert run.order(1) == [
      (F, 1, 0), (F, 2, 0), (F, 1, 1), (F, 2, 1), (B, 2, 0), (W, 2, 0),
      (F, 1, 2), (B, 1, 0), (W, 1, 0), (F, 2, 2), (B, 2, 1), (W, 2, 1),
      (B, 1, 1), (B, 2, 2), (B, 1, 2), (W, 1, 1), (W, 2, 2), (W, 1, 2)]
  assert [pipeline_order.device_of_stage("ZeroBubbleV", s, 2)
          for s in range(4)] == [0, 1, 1, 0]


def test_zb_h1_order():
  # Stage s runs 1F1B's order with the W of micro-batch m - s after B(m):
  # s weight passes deferred to the end.
  assert pipeline_order.stage_order("ZeroBubble", 3, 0, 4) == [
      (F, 0), (F, 1), (F, 2), (B, 0), (W, 0), (F, 3), (B, 1), (W, 1),
      (B, 2), (W, 2), (B, 3), (W, 3)]
  assert pipeline_order.stage_order("ZeroBubble", 3, 2, 4) == [
      (F, 0), (B, 0), (F, 1), (B, 1), (F, 2), (B, 2), (W, 0), (F, 3),
      (B, 3), (W, 1), (W, 2), (W, 3)]
  # Fewer micro-batches than deferred passes: every W at the end.
  assert pipeline_order.stage_order("ZeroBubble", 4, 3, 2) == [
      (F, 0), (B, 0), (F, 1), (B, 1), (W, 0), (W, 1)]


@pytest.mark.parametrize("schedule", [
    s for s in pipeline_order.Schedule if not s.v_shaped])
@pytest.mark.parametrize("stages, micro_batches", SHAPES + [(4, 2)])
def test_in_flight_is_what_the_simulated_order_holds(schedule, stages,
                                                     micro_batches):
  # The memory estimate's count of activations kept per stage.
  run = sim.simulate(schedule, stages, micro_batches)
  assert [run.peak_in_flight(s) for s in range(stages)] == [
      pipeline_order.in_flight(schedule, stages, s, micro_batches)
      for s in range(stages)]
  one_f_one_b = sim.simulate("PreferBackward", stages, micro_batches)
  if schedule is pipeline_order.Schedule.ZERO_BUBBLE:
    assert run.makespan <= one_f_one_b.makespan


def test_measured_costs_per_stage():
  # A slower last stage sets the pace of the steady state.
  costs = sim.StageCosts((1, 1, 2), (1, 1, 2), (1, 1, 2))
  run = sim.simulate("PreferBackward", 3, 6, costs=costs)
  assert run.makespan == pytest.approx(
      sum(costs.forward[:2]) + 6 * (2 + 4) + sum(
          b + w for b, w in zip(costs.backward[:2], costs.weight[:2])))
