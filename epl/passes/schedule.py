"""The pipeline schedule: in which order each stage runs the forward and
backward passes of the micro-batches, enforced with control edges."""
import collections
import dataclasses
from typing import Optional

import tensorflow as tf

from epl.capture import capture
from epl.ir import control_flow
from epl.ir import graph_editor
from epl.ir import names as epl_names
from epl.ir.phase import Phase
from epl.tf_compat import graph_edit

PREFER_FORWARD = "PreferForward"    # GPipe
PREFER_BACKWARD = "PreferBackward"  # 1F1B
# 1F1B with one more forward in flight on every stage but the last (the
# original EPL's third schedule).
PREFER_BACKWARD_OPTIMIZER = "PreferBackwardOptimizer"
SCHEDULE_SCOPE = "EPL_SCHEDULE"


@dataclasses.dataclass(frozen=True)
class Block:
  """The ops one stage of one replica runs for one micro-batch and phase
  (FORWARD or BACKWARD; APPLY with micro_batch None for the update)."""
  replica: int
  stage: int
  phase: Phase
  micro_batch: Optional[int]


def warm_up(schedule, num_stages, stage, num_micro_batch):
  """The forwards stage `stage` runs before its first backward: the most
  micro-batches whose activations it holds at once.

  PreferForward (GPipe): all of them. PreferBackward (1F1B):
  num_stages - stage. PreferBackwardOptimizer: one more than 1F1B on every
  stage but the last, so that a stage has the next forward done when the
  backward it waits for arrives (the original EPL's ordering).
  """
  if schedule == PREFER_FORWARD:
    return num_micro_batch
  if schedule == PREFER_BACKWARD:
    ahead = num_stages - stage
  elif schedule == PREFER_BACKWARD_OPTIMIZER:
    ahead = num_stages - stage + (1 if stage < num_stages - 1 else 0)
  else:
    raise ValueError("Unknown pipeline.strategy %r; use %r, %r or %r." % (
        schedule, PREFER_BACKWARD, PREFER_FORWARD, PREFER_BACKWARD_OPTIMIZER))
  return min(ahead, num_micro_batch)


def stage_order(schedule, num_stages, stage, num_micro_batch):
  """The (phase, micro-batch) pairs stage `stage` runs, in order: the
  `warm_up` forwards, then one backward and one forward in turn, then the
  backwards left (for GPipe: every forward, then every backward)."""
  ahead = warm_up(schedule, num_stages, stage, num_micro_batch)
  order = [(Phase.FORWARD, m) for m in range(ahead)]
  for m in range(num_micro_batch):
    order.append((Phase.BACKWARD, m))
    if ahead + m < num_micro_batch:
      order.append((Phase.FORWARD, ahead + m))
  return order


def blocks(ctx, subgraph, copies, first_replica_only=False):
  """{Block: [ops]} over every local replica (or the first), in the cloned
  subgraph's order.

  Forward and backward ops of a micro-batch (tagged by the micro-batch
  pass) make its FORWARD and BACKWARD blocks; the optimizer's ops that
  work on gradients (the update, not the reads of its constants) make an
  APPLY block per replica and stage.
  """
  result = collections.defaultdict(list)
  updates = set()
  replicas = ctx.replicas[:1] if first_replica_only else ctx.replicas
  for op in subgraph.cloned:
    phase = ctx.state.phase_of(op)
    micro_batch = ctx.state.micro_batch_of(op)
    if phase is Phase.APPLY:
      if not any(i.name in updates or
                 ctx.state.phase_of(i) is Phase.BACKWARD
                 for i in graph_editor.input_ops(op)):
        continue
      updates.add(op.name)
      micro_batch = None
    elif micro_batch is None or phase not in (Phase.FORWARD, Phase.BACKWARD):
      continue
    stage = ctx.taskgraph_index(op)
    for local, replica in enumerate(replicas):
      result[Block(replica, stage, phase, micro_batch)].append(
          copies.op(local, op))
  return result


def _ends(ops):
  """(first ops, last ops) of `ops`: those with no input, and those with no
  consumer, among `ops`, leaving out ops that TF1 control flow may skip or
  repeat (control_flow.conditional_op_names): their loop or cond runs
  between the ends found around it."""
  conditional = control_flow.conditional_op_names(ops)
  ops = [op for op in ops if op.name not in conditional]
  names = {op.name for op in ops}
  first = [op for op in ops
           if not any(i.name in names for i in graph_editor.input_ops(op))]
  last = [op for op in ops
          if not any(c.name in names for t in op.outputs
                     for c in t.consumers()) and
          not any(c.name in names for c in graph_edit.control_outputs(op))]
  return first, last


def schedule_pipeline(ctx, subgraph, copies):
  """Makes every stage of every replica run its blocks in schedule order.

  For each stage of each local replica, the blocks (forward or backward
  pass of one micro-batch) follow `stage_order` for pipeline.strategy: a
  NoOp `EPL_SCHEDULE/...` on the stage's device waits for the last ops of
  a block, and the first ops of the next block wait for the NoOp, so that
  no op of a block starts before the previous block has finished. Only
  control edges are added; with one micro-batch nothing changes (a stage's
  backward already follows its forward), nor with split TaskGraphs (they
  share the data-parallel part's devices: no stages).
  """
  plan = ctx.plan
  if plan.num_micro_batch == 1 or plan.has_split:
    return
  # Replicas are copies with the same edges inside each block: the blocks
  # and their ends are found in the first replica and mapped to the others.
  by_block = blocks(ctx, subgraph, copies, first_replica_only=True)
  stages = sorted({block.stage for block in by_block})
  first_replica_ends = {}

  def ends(local, stage, phase, micro_batch):
    key = (stage, phase, micro_batch)
    if key not in first_replica_ends:
      first_replica_ends[key] = _ends(
          by_block[Block(ctx.replicas[0], stage, phase, micro_batch)])
    return tuple([copies.op(local, op) for op in ops]
                 for ops in first_replica_ends[key])

  with capture.suspended(), ctx.graph.as_default(), ctx.graph.name_scope(
      None), ctx.graph.control_dependencies(None):
    for local, replica in enumerate(ctx.replicas):
      for stage in stages:
        order = stage_order(plan.schedule, len(stages), stages.index(stage),
                            plan.num_micro_batch)
        previous = None
        for phase, micro_batch in order:
          ops = by_block.get(Block(ctx.replicas[0], stage, phase,
                                   micro_batch))
          if not ops:
            continue
          first, last = ends(local, stage, phase, micro_batch)
          if previous is not None:
            for op in first:
              graph_editor.add_control_inputs(op, [previous])
          with tf.device(ctx.device(local, stage)), \
              tf.control_dependencies(last):
            previous = tf.no_op(name=epl_names.in_replica(
                SCHEDULE_SCOPE, replica, "stage_%d" % stage,
                "after_%s_%d" % (phase.value, micro_batch)))
