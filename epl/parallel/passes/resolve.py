"""Completing the capture: TaskGraph and phase of ops capture left open.

Capture tags most ops as they are built. A few cannot be tagged then:
gradient aggregation ops (no forward op of their own), optimizer ops
(`apply_gradients` knows no strategy), slot variables, input ops built
outside every scope, and user code between `compute_gradients` and
`apply_gradients` (gradient clipping), which is built as forward (or, outside
every scope, as other) but works on gradients. This module settles them from
the ops around them.
"""
import collections

from tensorflow.core.framework import attr_value_pb2

from epl.ir import graph_editor
from epl.ir.phase import Phase


def mark_gradient_processing(state, ops):
  """Makes every op of `ops` that works on gradients BACKWARD.

  An op tagged FORWARD or OTHER that reads (directly or through such ops)
  the output of a BACKWARD op of `ops` is gradient post-processing, such as
  clipping, and becomes BACKWARD. Changes no other tag.
  """
  names = {op.name for op in ops}
  consumers = collections.defaultdict(list)
  for op in ops:
    for producer in graph_editor.input_ops(op):
      consumers[producer.name].append(op)
  stack = [op for op in ops if state.phase_of(op) is Phase.BACKWARD]
  while stack:
    op = stack.pop()
    for consumer in consumers[op.name]:
      if consumer.name in names and state.phase_of(consumer) in (
          Phase.FORWARD, Phase.OTHER):
        state.set_phase(consumer, Phase.BACKWARD)
        stack.append(consumer)


def _colocation_targets(op):
  own = ("loc:@" + op.name).encode()
  return [group.decode()[len("loc:@"):] for group in op.colocation_groups()
          if group != own]


def _keep_own_stage(state, op, target):
  """Whether BACKWARD `op`, which capture gave the TaskGraph of the
  forward op it differentiates, stays there although it is colocated
  with `target` of another TaskGraph; then the colocation is dropped.

  tf.gradients colocates the Identity that passes an op's input gradient
  on (`tf.tuple`'s) with the gradient it passes: for a forward op whose
  output the next stage reads (BERT's residual sum at a stage boundary),
  that is the sum of the next stage's gradients. On the next stage, the
  Identity would send the gradient to this stage a second time beside
  the sum, which this stage's other gradient ops read already; here the
  sum crosses once. Values do not change.
  """
  own = state.taskgraph_of(op)
  if (state.phase_of(op) is not Phase.BACKWARD or own is None or
      state.taskgraph_of(target) in (None, own)):
    return False
  graph_editor.set_attr(op, "_class", attr_value_pb2.AttrValue(
      list=attr_value_pb2.AttrValue.ListValue(
          s=[("loc:@" + op.name).encode()])))
  return True


def resolve_training_ops(ctx, subgraph):
  """Gives every op of the training subgraph a TaskGraph and phase.

  - Ops that work on gradients become BACKWARD (mark_gradient_processing).
  - An op colocated with an op that has a TaskGraph takes it, whatever
    capture said (slot variables and Adam's beta powers go with the
    variable the optimizer colocated them with, as TensorFlow's placer
    requires, also when a Keras optimizer built them under another
    strategy), except a backward op that capture gave its forward op's
    TaskGraph (`_keep_own_stage`).
  - Other ops without a TaskGraph take it from their neighbours: backward
    ops from their consumers first (gradients flow to the stage of the
    forward op), others from their inputs (the latest stage among them).
  - Whatever is still open goes to the first TaskGraph.
  Keeps every other tag capture set.
  """
  state, ops = ctx.state, subgraph.cloned
  names = {op.name for op in ops}
  mark_gradient_processing(state, ops)
  graph = ops[0].graph if ops else None
  for op in ops:
    for target in _colocation_targets(op):
      try:
        taskgraph = state.taskgraph_of(graph.get_operation_by_name(target))
      except KeyError:
        continue
      if taskgraph is not None:
        if not _keep_own_stage(state, op,
                               graph.get_operation_by_name(target)):
          state.set_taskgraph(op, taskgraph)
        break

  def from_inputs(op):
    found = [state.taskgraph_of(i) for i in graph_editor.input_ops(op)
             if i.name in names and state.taskgraph_of(i) is not None]
    return max(found, key=lambda t: t.index) if found else None

  def from_consumers(op):
    found = [state.taskgraph_of(c) for output in op.outputs
             for c in output.consumers()
             if c.name in names and state.taskgraph_of(c) is not None]
    found += [state.taskgraph_of(c) for c in graph_editor.control_outputs(op)
              if c.name in names and state.taskgraph_of(c) is not None]
    return min(found, key=lambda t: t.index) if found else None

  for op in ops:
    if state.taskgraph_of(op) is None and state.phase_of(op) is not Phase.BACKWARD:
      taskgraph = from_inputs(op)
      if taskgraph is not None:
        state.set_taskgraph(op, taskgraph)
  for op in reversed(ops):
    if state.taskgraph_of(op) is None:
      taskgraph = from_consumers(op) or from_inputs(op)
      if taskgraph is not None:
        state.set_taskgraph(op, taskgraph)
  for op in ops:
    if state.taskgraph_of(op) is None:
      state.set_taskgraph(op, state.taskgraphs[0])
