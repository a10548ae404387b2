"""Times pipeline schedules: each device's pass order, the step's makespan
and its bubble, from per-stage costs of F, B and W (the plan's choice of a
schedule under a memory budget reads it; `epl.tools.schedule_simulator`
is its public face, with measured costs).

    from epl.tools import schedule_simulator as sim
    run = sim.simulate("ZeroBubble", num_stages=4, num_micro_batch=8)
    sim.simulate("ZeroBubbleV", 8, 8)  # 8 stages on 4 devices
    run.makespan, run.bubble_fraction, run.order(device=0)
    costs = sim.costs_from_trace(trace)   # measured, from epl.timeline
    sim.simulate("PreferBackward", 4, 8, costs=costs)

A device runs its passes in the schedule's order (`epl.parallel.plan.pipeline_order`,
the order EPL's rewrite enforces), each as soon as the device is free and
the passes it needs have ended: a stage's forward needs the previous
stage's forward of the same micro-batch; its backward (B) needs its own
forward and the next stage's backward; its weight pass (W) needs its B.
Schedules that do not split the backward run B and W as one pass of cost
B + W. Sending activations and gradients costs nothing here. Plain Python.
"""
import dataclasses
from typing import List, Sequence

from epl.parallel.plan import pipeline_order
from epl.parallel.plan.pipeline_order import FORWARD, WEIGHT, Pass, Schedule


@dataclasses.dataclass(frozen=True)
class StageCosts:
  """Time of one pass of each stage: forward, backward (input gradients,
  B) and weight (weight gradients, W) per stage, in any unit."""
  forward: Sequence[float]
  backward: Sequence[float]
  weight: Sequence[float]

  @classmethod
  def uniform(cls, num_stages, forward=1.0, backward=1.0, weight=1.0):
    """The same costs on every stage (unit costs by default)."""
    return cls((forward,) * num_stages, (backward,) * num_stages,
               (weight,) * num_stages)

  def of(self, kind, stage, split_backward):
    """The time of pass `kind` of `stage`; without `split_backward`, a
    backward also computes the weight gradients."""
    if kind == FORWARD:
      return self.forward[stage]
    if kind == WEIGHT:
      return self.weight[stage]
    if split_backward:
      return self.backward[stage]
    return self.backward[stage] + self.weight[stage]


@dataclasses.dataclass(frozen=True)
class TimedPass:
  """A pass with its start and end."""
  step: Pass
  start: float
  end: float


@dataclasses.dataclass
class Simulation:
  """One simulated step: `devices[d]` is device d's passes in order."""
  schedule: Schedule
  num_stages: int
  num_micro_batch: int
  virtual_stages: int
  devices: List[List[TimedPass]]

  @property
  def makespan(self):
    """From the first pass's start to the last pass's end."""
    return max(p.end for passes in self.devices for p in passes)

  def busy(self, device):
    return sum(p.end - p.start for p in self.devices[device])

  def idle(self, device):
    """Time device `device` waits within the makespan."""
    return self.makespan - self.busy(device)

  @property
  def bubble_fraction(self):
    """The fraction of device time spent waiting within the makespan."""
    total = self.makespan * len(self.devices)
    return 1.0 - sum(self.busy(d) for d in range(len(self.devices))) / total

  def order(self, device):
    """[(kind, micro-batch)] of device `device`, in the order it runs
    them (with virtual stages: [(kind, stage, micro-batch)])."""
    if self.virtual_stages == 1:
      return [(p.step.kind, p.step.micro_batch) for p in self.devices[device]]
    return [tuple(p.step) for p in self.devices[device]]

  def peak_in_flight(self, device):
    """The most micro-batches (over the device's stages) whose
    activations device `device` holds at once: from a forward to the
    pass that ends its backward (W when the schedule splits it)."""
    return pipeline_order.held_at_peak(
        self.schedule, [timed.step for timed in self.devices[device]])


def simulate(schedule, num_stages, num_micro_batch, virtual_stages=1,
             costs=None):
  """Simulates one step of `schedule` (a Schedule or its pipeline.strategy
  name) on a pipeline of `num_stages` stages (on num_stages /
  virtual_stages devices; ZB-V implies virtual_stages 2) with
  `num_micro_batch` micro-batches; `costs` a StageCosts over the stages
  (unit costs F = B = W = 1 by default). Returns a Simulation; raises
  RuntimeError if the orders wait on each other forever."""
  if costs is None:
    costs = StageCosts.uniform(num_stages)
  schedule = Schedule.of(schedule)
  virtual_stages = pipeline_order.stages_per_device(schedule,
                                                    virtual_stages)
  split = schedule.splits_backward
  orders = pipeline_order.device_orders(schedule, num_stages,
                                        num_micro_batch, virtual_stages)
  ends = {}
  timed = [[] for _ in orders]
  free = [0.0] * len(orders)
  position = [0] * len(orders)
  remaining = sum(len(order) for order in orders)
  while remaining:
    progressed = False
    for device, order in enumerate(orders):
      while position[device] < len(order):
        step = order[position[device]]
        needs = pipeline_order.needs(step, num_stages)
        if any(need not in ends for need in needs):
          break
        start = max([free[device]] + [ends[need] for need in needs])
        end = start + costs.of(step.kind, step.stage, split)
        ends[step] = free[device] = end
        timed[device].append(TimedPass(step, start, end))
        position[device] += 1
        remaining -= 1
        progressed = True
    if not progressed:
      waiting = {device: order[position[device]]
                 for device, order in enumerate(orders)
                 if position[device] < len(order)}
      raise RuntimeError("Schedule %r deadlocks: the devices wait on each "
                         "other for %s." % (schedule.value, waiting))
  return Simulation(schedule, num_stages, num_micro_batch, virtual_stages,
                    timed)
