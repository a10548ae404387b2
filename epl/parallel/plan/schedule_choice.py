"""The pipeline schedule EPL chooses under pipeline.activation_memory: the
least bubble whose activations fit the budget.

Activations are counted in stage-micro-batches (one stage scope's
activations of one micro-batch; the stages are taken as equal, as the
balanced cut makes them), the most any device holds at once in the
schedule's order (`pipeline_order.held_at_peak`); the budget is a multiple
of what 1F1B holds on the same devices. The bubble is simulated with
F = B = W (`pipeline_timing`). Only schedules that place the stage scopes
as the configuration does are candidates: changing the devices per
pipeline would change the data-parallel degree, and the global batch with
it.

A budget in bytes per device is compared with each candidate's fullest
device instead: its passes in the schedule's order, each forward of a
stage adding what that stage keeps per micro-batch, counted from the
captured step ([stage_activations.KeptTensor]; the stages need not be
equal).
Plain Python.
"""
import dataclasses
from typing import Optional

from epl import config as epl_config
from epl.parallel.plan import pipeline_order
from epl.parallel.plan import pipeline_timing
from epl.parallel.plan.pipeline_order import Schedule

# The schedules that place 1 or 2 stage scopes per device, least memory
# first where bubbles tie.
_CANDIDATES = {
    1: (Schedule.PREFER_BACKWARD, Schedule.ZERO_BUBBLE,
        Schedule.PREFER_FORWARD, Schedule.PREFER_BACKWARD_OPTIMIZER),
    2: (Schedule.ZERO_BUBBLE_V_MIN, Schedule.ZERO_BUBBLE_V_HALF,
        Schedule.ZERO_BUBBLE_V, Schedule.PREFER_BACKWARD),
}


@dataclasses.dataclass(frozen=True)
class Candidate:
  """A schedule with its simulated bubble (a fraction of the step) and
  the most stage-micro-batches of activations a device holds."""
  schedule: Schedule
  bubble: float
  activations: int
  # The name people know it by ("interleaved 1F1B" for PreferBackward
  # with several stages per device).
  name: str
  # The most activation bytes a device holds, when counted.
  bytes: Optional[int] = None

  def describe(self):
    text = "%s: bubble %.1f%%, %d stage-micro-batch(es)" % (
        self.name, 100.0 * self.bubble, self.activations)
    if self.bytes is not None:
      text += ", %s" % bytes_text(self.bytes)
    return text + " per device"


def bytes_text(count):
  """`count` bytes for people: exact below a MiB, else in MiB."""
  if count < 2**20:
    return "{:,} B".format(count)
  return "%.1f MiB" % (count / 2.0**20)


def _stage_bytes_on_device(kept, stages):
  """{stage: bytes per micro-batch} for a device that runs the passes of
  `stages`: each tensor of `kept` counted once, with the first of its
  reader stages there (as the memory estimate counts a device's)."""
  result = dict.fromkeys(stages, 0)
  for tensor in kept:
    here = tensor.stages & frozenset(stages)
    if here:
      result[min(here)] += tensor.bytes
  return result


def _peak_bytes(schedule, orders, kept):
  """The most activation bytes any device running `orders` holds, each
  stage's bytes per micro-batch counted from `kept` ([KeptTensor])."""
  peak = 0
  for order in orders:
    held = _stage_bytes_on_device(kept, {step.stage for step in order})
    peak = max(peak, pipeline_order.held_at_peak(schedule, order,
                                                 held.__getitem__))
  return peak


def one_f_one_b_activations(num_stages, num_micro_batch, per_device):
  """What 1F1B holds on the most loaded device, in stage-micro-batches,
  with `per_device` of the `num_stages` stages on each device: its first
  device holds min(devices, M) micro-batches of all its stages."""
  return per_device * min(num_stages // per_device, num_micro_batch)


def candidates(num_stages, num_micro_batch, per_device, kept=None):
  """[Candidate] of the schedules that place `per_device` of the
  `num_stages` stages on each device and apply to `num_micro_batch`
  (an order that needs more micro-batches is left out); with `kept`
  ([KeptTensor]), their bytes too."""
  result = []
  for schedule in _CANDIDATES.get(per_device, (Schedule.PREFER_BACKWARD,)):
    try:
      orders = pipeline_order.device_orders(schedule, num_stages,
                                            num_micro_batch, per_device)
    except ValueError:
      continue
    result.append(Candidate(
        schedule, pipeline_timing.simulate(
            schedule, num_stages, num_micro_batch,
            per_device).bubble_fraction,
        max(pipeline_order.held_at_peak(schedule, order)
            for order in orders),
        ("interleaved " if per_device > 1 and not schedule.v_shaped else "")
        + schedule.label,
        None if kept is None else _peak_bytes(schedule, orders, kept)))
  return result


def _best(found, need, allowed, no_fit):
  """(the Candidate of `found` with the least bubble whose `need(c)` is
  at most `allowed`, the others' descriptions as text); when none fits,
  ValueError(no_fit(the candidate that needs least))."""
  fitting = [c for c in found if need(c) <= allowed + 1e-9]
  if not fitting:
    raise ValueError(no_fit(min(found, key=need)))
  best = min(fitting, key=lambda c: (round(c.bubble, 9), c.activations))
  others = [c.describe() for c in found if c is not best]
  return best, "; ".join(others) or "none"


def choose(num_stages, num_micro_batch, per_device, budget):
  """(the Candidate with the least bubble among those that hold at most
  `budget` times 1F1B's activations, the reason as text); ValueError
  naming the least any candidate needs when none fits."""
  reference = one_f_one_b_activations(num_stages, num_micro_batch,
                                      per_device)
  allowed = budget * reference
  best, others = _best(
      candidates(num_stages, num_micro_batch, per_device),
      lambda c: c.activations, allowed, lambda least: (
          "pipeline.activation_memory %g allows %.1f stage-micro-batches "
          "of activations per device (1F1B holds %d with %d stage(s) per "
          "device, %d micro-batches); the least any schedule placing the "
          "stages so holds is %s's %d (%.2f x 1F1B). Raise the budget, or "
          "cut more stages." % (
              budget, allowed, reference, per_device, num_micro_batch,
              least.name, least.activations,
              least.activations / float(reference))))
  return best, (
      "pipeline.activation_memory %g of 1F1B's %d stage-micro-batches per "
      "device allows %.1f; the least bubble that fits is %s (simulated "
      "with F = B = W; the others: %s)" % (
          budget, reference, allowed, best.describe(), others))


def choose_bytes(num_stages, num_micro_batch, per_device, budget, kept):
  """(the Candidate with the least bubble among those whose fullest
  device holds at most `budget` bytes (the configured text, e.g.
  "512MB") of the activations `kept` ([KeptTensor]), the reason as
  text); ValueError naming the least any candidate needs when none
  fits."""
  allowed = epl_config.size_in_bytes(budget)
  best, others = _best(
      candidates(num_stages, num_micro_batch, per_device, kept),
      lambda c: c.bytes, allowed, lambda least: (
          "pipeline.activation_memory %s allows %s of activations per "
          "device (%d stage(s) per device, %d micro-batches, counted from "
          "the built step); the least any schedule placing the stages so "
          "holds is %s's %s. Raise the budget, or cut more stages." % (
              budget, bytes_text(allowed), per_device, num_micro_batch,
              least.name, bytes_text(least.bytes))))
  return best, (
      "pipeline.activation_memory %s allows %s per device; the least "
      "bubble that fits is %s (activations counted from the built step, "
      "bubble simulated with F = B = W; the others: %s)" % (
          budget, bytes_text(allowed), best.describe(), others))
