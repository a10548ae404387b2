"""Times pipeline schedules: each device's pass order, the step's makespan
and its bubble, from per-stage costs of F, B and W, unit or measured.

    from epl.tools import schedule_simulator as sim
    run = sim.simulate("ZeroBubble", num_stages=4, num_micro_batch=8)
    sim.simulate("ZeroBubbleV", 8, 8)  # 8 stages on 4 devices
    run.makespan, run.bubble_fraction, run.order(device=0)
    costs = sim.costs_from_trace(trace)   # measured, from epl.timeline
    sim.simulate("PreferBackward", 4, 8, costs=costs)

The timing itself is the plan's (`epl.parallel.plan.pipeline_timing`, which
the choice of a schedule under pipeline.activation_memory also reads);
this module adds the costs measured from a traced step. Plain Python.
"""
import collections

from epl.parallel.plan.pipeline_order import BACKWARD, FORWARD, WEIGHT
# The public names of the simulator.
from epl.parallel.plan.pipeline_timing import (  # noqa: F401
    Simulation, StageCosts, TimedPass, simulate)


def costs_from_trace(trace):
  """StageCosts measured from a traced step (`epl.timeline.PipelineTrace`):
  each stage's mean forward, backward and weight slice, over micro-batches
  and replicas, in microseconds. A trace whose backward is not split (any
  schedule but ZeroBubble) gives the whole backward as B and W = 0."""
  durations = collections.defaultdict(list)
  for piece in trace.slices:
    if piece.micro_batch is not None:
      stage = trace.rows[piece.row].stage
      durations[(piece.phase, stage)].append(piece.end - piece.start)
  num_stages = 1 + max(row.stage for row in trace.rows)

  def mean(kind):
    return tuple(
        sum(durations[(kind, s)]) / len(durations[(kind, s)])
        if durations[(kind, s)] else 0.0 for s in range(num_stages))
  return StageCosts(mean(FORWARD), mean(BACKWARD), mean(WEIGHT))
