"""Shared weights: replicas that share one process's memory read one copy of
each trained variable, and its update runs once per step.

Logical CPU devices of one process share the host's memory and cores. A
copy of every variable per replica, each updated by its replica with the
same averaged gradient, repeats the optimizer's whole update N times on
the same cores (with Adam, the largest cost data parallelism added to
plain TensorFlow there). Under the plan's `Weights.SHARED`, the trained
variables, their plain reads, every op of the update (all APPLY ops, and whatever follows the
gradients the replicas reduce) and every variable it writes (the
optimizer's slots) are taken out of the cloned part before the replicas are cloned:
they exist once, as the user built them. The other replicas' forward and
backward read replica 0's variables (a same-process read of host memory,
no copy), and their gradients go into the local sum that the one update
reads. Checkpoints hold each variable and slot once under its own name,
as without EPL.

Why the update still sees what it saw per replica: it reads the mean of
every replica's gradient, which exists only once every replica's backward
has read the weights (TensorFlow's GATE_OP gating of each op's input
gradients, and the resource variables' snapshot reads), as on one device.
"""
import logging

from epl.ir import graph_editor
from epl.ir.op_types import INPUT_READ_TYPES, VARIABLE_READ_TYPES
from epl.ir.phase import Phase
from epl.parallel.passes.training_subgraph import (tensors_of,
                                                   written_variables)

logger = logging.getLogger("epl")


def _plain_reads(variables, cloned_names):
  """The ops of the cloned part that only read a variable of `variables`
  whole (ReadVariableOp, a reference variable's Identity)."""
  return [consumer for variable in variables
          for consumer in variable.outputs[0].consumers()
          if consumer.type in VARIABLE_READ_TYPES and
          consumer.name in cloned_names and len(consumer.inputs) == 1]


def _shared_ops(ctx, subgraph, gradient_points):
  """The ops of the cloned part that exist once under shared weights:
  names, and the points' gradient tensors."""
  points = [point for pairs in gradient_points for point in pairs]
  variables = [variable for _, variable in points]
  gradients = [t for grad, _ in points for t in tensors_of(grad)]
  cloned = subgraph.cloned_names
  after_gradients = {
      op.name for op in graph_editor.descendants(
          [c for t in gradients for c in t.consumers()])}
  shared = {op.name for op in subgraph.cloned
            if ctx.state.phase_of(op) is Phase.APPLY or
            op.name in after_gradients}
  # Whatever the one update writes exists once too: the optimizer's slots
  # however they were built (an AdamW's get_variable in apply_gradients).
  variables += [v for op in subgraph.cloned if op.name in shared
                for v in written_variables(op)]
  shared.update(v.name for v in variables if v.name in cloned)
  shared.update(op.name for op in _plain_reads(variables, cloned))
  return shared, {t.name for t in gradients}


def _replica_inputs(subgraph, shared, gradient_names):
  """{shared op name: an input of it computed from a replica's own data}
  besides the reduced gradients: such an update would see replica 0's
  value only."""
  per_replica = {op.name for op in graph_editor.descendants(
      [op for op in subgraph.cloned if op.type in INPUT_READ_TYPES])}
  found = {}
  for op in subgraph.cloned:
    if op.name not in shared:
      continue
    for tensor in op.inputs:
      if (tensor.op.name in subgraph.cloned_names and
          tensor.op.name not in shared and
          tensor.name not in gradient_names and
          tensor.op.name in per_replica):
        found[op.name] = tensor.name
  return found


def share_weights(ctx, subgraph, gradient_points):
  """Takes the trained variables, their plain reads and their update out
  of the cloned part (before the replicas are cloned); hands on the
  subgraph without them. Changes nothing in the graph.

  An update that reads a value of one replica besides the reduced
  gradient (a replica's loss) keeps per-replica weights: the pass warns,
  naming the op, and changes nothing.
  """
  shared, gradient_names = _shared_ops(ctx, subgraph, gradient_points)
  replica_inputs = _replica_inputs(subgraph, shared, gradient_names)
  if replica_inputs:
    op, tensor = sorted(replica_inputs.items())[0]
    logger.warning(
        "EPL keeps a copy of the weights per replica (plan: shared "
        "weights): the update op %r reads %r, a value of each replica's own "
        "batch besides the reduced gradients. Set "
        "communication.shared_weights to False to say so.", op, tensor)
    return {"subgraph": subgraph}
  variables = [v for v in subgraph.variables if v.name in shared]
  logger.info(
      "EPL shared weights: %d trained variables and optimizer slots, their "
      "reads and %d update ops exist once; the %d replicas read them",
      len(variables), len(shared) - len(variables), len(ctx.replicas))
  return {"subgraph": subgraph.without(shared)}
