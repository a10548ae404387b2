"""Which gradients travel together, in which order, on which communicator.

Backward makes the last layer's gradients first. Gradients are ordered by
when they become ready, read from the graph: the number of ops on the
longest chain of data and control edges that ends at each gradient's
producer (a step's ops run no earlier than their longest chain allows).
Buckets are cut in that order, so the first bucket's all-reduce can start
while backward still computes the earlier layers' gradients, and go
round-robin to the communicators, each of which runs its buckets in order.
"""
import collections

import tensorflow as tf

from epl.ir import control_flow
from epl.ir import graph_editor
from epl.parallel.passes.training_subgraph import tensors_of


def chain_lengths(ops):
  """{op name: ops on the longest chain of data and control edges that ends
  at it} for `ops` and every op they depend on."""
  length = {}
  started = set()
  for root in ops:
    stack = [(root, False)]
    while stack:
      op, inputs_done = stack.pop()
      if op.name in length:
        continue
      inputs = ([] if op.type in control_flow.NEXT_ITERATION_TYPES else
                graph_editor.input_ops(op))
      if inputs_done:
        length[op.name] = 1 + max((length.get(i.name, 0) for i in inputs),
                                  default=0)
        continue
      if op.name in started:
        continue
      started.add(op.name)
      stack.append((op, True))
      stack.extend((i, False) for i in inputs if i.name not in length)
  return length


def ready_order(grads):
  """`grads` (tensors or IndexedSlices) in the order backward makes them,
  first ready first; gradients ready at the same depth keep their order."""
  length = chain_lengths([t.op for g in grads for t in tensors_of(g)])
  readiness = {id(g): max(length[t.op.name] for t in tensors_of(g))
               for g in grads}
  return sorted(grads, key=lambda g: readiness[id(g)]), readiness


def dense_buckets(grads, max_splits):
  """Splits same-dtype dense gradients (in ready order) into at most
  `max_splits` consecutive groups of about equal size; with `max_splits`
  None, one group per gradient. Gradients of unknown size travel alone,
  after the others."""
  if max_splits is None:
    return [[g] for g in grads]
  known = [g for g in grads if g.shape.num_elements() is not None]
  unknown = [[g] for g in grads if g.shape.num_elements() is None]
  if not known:
    return unknown
  total = sum(g.shape.num_elements() for g in known)
  target = max(1, -(-total // max(1, max_splits)))
  buckets, current, size = [], [], 0
  for grad in known:
    current.append(grad)
    size += grad.shape.num_elements()
    if size >= target:
      buckets.append(current)
      current, size = [], 0
  if current:
    buckets.append(current)
  return buckets + unknown


Transfer = collections.namedtuple("Transfer",
                                  "taskgraph group gradients sparse")


def plan_transfers(grads_by_taskgraph, max_splits, num_communicators):
  """The transfers of one tf.gradients call, in the order they start.

  `grads_by_taskgraph`: {TaskGraph index: gradients}. Dense gradients of one
  TaskGraph and dtype are fused into at most `max_splits` buckets (None:
  not fused); each IndexedSlices travels alone. All transfers are ordered
  by when their last gradient is ready and dealt round-robin, per
  TaskGraph, to `num_communicators` groups.
  """
  transfers = []
  for taskgraph, grads in grads_by_taskgraph.items():
    ordered, readiness = ready_order(grads)
    by_dtype = collections.OrderedDict()
    units = []
    for grad in ordered:
      if isinstance(grad, tf.IndexedSlices):
        units.append(([grad], True))
      else:
        by_dtype.setdefault(grad.dtype, []).append(grad)
    for dense in by_dtype.values():
      units.extend((bucket, False)
                   for bucket in dense_buckets(dense, max_splits))
    units.sort(key=lambda unit: max(readiness[id(g)] for g in unit[0]))
    transfers.extend(
        Transfer(taskgraph, index % num_communicators, bucket, sparse)
        for index, (bucket, sparse) in enumerate(units))
  return transfers
