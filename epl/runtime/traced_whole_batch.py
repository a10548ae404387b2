"""The ops of a traced step that run outside the part EPL's engine divides
over replicas and micro-batches, and read the batch (Keras metric updates
in a model's own `train_step`): they see the step on the whole batch.

Such an op reads a batch argument whole (the rewrite divides it for the
divided part only), and every batch-dependent tensor it takes from the
divided part as that tensor merged over replicas and micro-batches
(`merge_outputs.read_merged_values`), as a TF1 graph's Keras metrics do
in graph mode:

- a tensor whose first axis is the batch's (unknown in the trace, as the
  batch arguments' is) is concatenated, in the batch's order;
- a float scalar is averaged when it is a sum of terms of the loss the
  gradients are taken of (scaled by batch-independent factors): EPL
  averages the gradients of the parts, which equals the whole batch's
  only when the loss and so its terms (Keras' loss of each output, its
  reduction a mean over the batch) are means over the batch; the mean
  over equal parts is then the whole batch's;
- anything else has no merge EPL can decide, and raises.
"""
from epl import collections as epl_collections
from epl.ir import control_flow
from epl.ir import graph_editor
from epl.parallel.passes import merge_outputs
from epl.parallel.passes import training_subgraph


class UndecidedMerge(NotImplementedError):
  """An op outside the divided step reads a tensor of the divided step
  whose value over the whole batch EPL cannot make from the parts."""


MERGED_KEYS = (epl_collections.GraphKeys.GLOBAL_MEAN_OBJECTS,
              epl_collections.GraphKeys.GLOBAL_SUM_OBJECTS,
              epl_collections.GraphKeys.GLOBAL_CONCAT_OBJECTS)

# Ops through which a scalar stays a sum of terms scaled by factors.
_SUMS = frozenset(["AddN", "AddV2", "Add", "Identity", "Cast"])
_SCALINGS = frozenset(["Mul", "RealDiv"])


def _terms(tensor, batch_dependent):
  """Names of the batch-dependent terms `tensor` sums, through sums and
  scalings by batch-independent factors (itself when it is no such
  sum)."""
  op = tensor.op
  if op.type in _SUMS:
    parts = [t for t in op.inputs if t.op.name in batch_dependent]
  elif op.type in _SCALINGS:
    parts = [t for t in op.inputs if t.op.name in batch_dependent]
    if len(parts) != 1 or (op.type == "RealDiv" and
                           parts[0] is not op.inputs[0]):
      return {tensor.name}
  else:
    return {tensor.name}
  found = set()
  for part in parts:
    found |= _terms(part, batch_dependent)
  return found


def _loss_terms(graph, losses, batch_dependent):
  """The batch-dependent terms of the losses the gradients are taken of."""
  found = set()
  for name in losses:
    found |= _terms(graph.get_tensor_by_name(name), batch_dependent)
  return found


def _merge_key(tensor, loss_terms, batch_dependent, reader, function_name):
  """The merged collection `tensor`, read by `reader`, goes to."""
  if tensor.shape.rank and tensor.shape[0] is None:
    return epl_collections.GraphKeys.GLOBAL_CONCAT_OBJECTS
  if (tensor.shape.rank == 0 and tensor.dtype.is_floating and
      _terms(tensor, batch_dependent) <= loss_terms):
    return epl_collections.GraphKeys.GLOBAL_MEAN_OBJECTS
  raise UndecidedMerge(
      "tf.function %s: %r (%s), outside the part EPL divides over replicas "
      "and micro-batches, reads %r (shape %s), which that part computes "
      "from its share of the batch; EPL makes the whole batch's value of "
      "a tensor of the batch's rows (concatenated) or of a scalar that "
      "sums terms of the loss (means over the batch, averaged) only. "
      "Read per-row values there (the model's outputs) and reduce them "
      "outside, or add the value to the loss as a term (docs/tf2.md)." % (
          function_name, reader.name, reader.type, tensor.name,
          tensor.shape))


def _data_reachable(roots, neighbours):
  return {op.name for op in graph_editor.reachable(roots, neighbours)}


def _reads_whole_batch(tensor, whole, divided, batch_dependent):
  """Whether an op outside the training computation that reads `tensor`
  reads the batch: a batch argument, a loss term, or a tensor of the
  divided part that is per row (the model's outputs) or a scalar (whose
  merge `_merge_key` decides or refuses). A batch norm's statistics (one
  value a channel) are neither: its moving averages stay divided."""
  if tensor.name in whole:
    return True
  return (tensor.op.name in divided and tensor.op.name in batch_dependent
          and (tensor.shape.rank == 0 or
               (tensor.shape.rank and tensor.shape[0] is None)))


def _outside_ops(graph, whole, divided, batch_dependent, training, roots):
  """The variable writes (Keras' metric updates) computed from what reads
  the batch (`_reads_whole_batch`; `whole` are the batch arguments and the
  loss's terms), and what reads the batch after the updates (the model
  called again once the gradients are applied: the divided part runs
  before the updates, so it cannot hold that call), with the computation
  they need there, what reads them (a metric's result) and the variable
  reads only they make after the updates. What else reads the forward
  pass stays in the divided part: a batch norm's moving averages, an
  output the step returns (merged as a fetch is), a split layer's
  collectives (every replica runs its own)."""
  needed = {op.name for op in graph_editor.ancestors(roots)}
  readers = [graph.get_operation_by_name(name)
             for name in (batch_dependent & needed) - training]
  readers = [op for op in readers if any(
      _reads_whole_batch(t, whole, divided, batch_dependent)
      for t in op.inputs)]
  candidates = {op.name for op in graph_editor.descendants(readers)
                if op.name not in training and op.type != "NoOp" and
                not op.type.startswith("Collective")}
  after_updates = {op.name for op in graph_editor.descendants(
      [graph.get_operation_by_name(name) for name in training
       if training_subgraph.written_variables(
           graph.get_operation_by_name(name))])} - training
  seeds = [graph.get_operation_by_name(name) for name in candidates
           if name in after_updates or training_subgraph.written_variables(
               graph.get_operation_by_name(name))]
  outside = {op.name: op for op in graph_editor.ancestors(seeds) +
             graph_editor.descendants(seeds) if op.name in candidates}
  outside = list(outside.values())
  return outside + _reads_only_for(outside, after_updates)


def _reads_only_for(ops, after_updates):
  """The ops after the updates whose values only `ops` read (the variable
  reads of the model's call after them), which run with them."""
  names = {op.name for op in ops}
  inputs = lambda op: [t.op for t in op.inputs]
  return [op for op in graph_editor.reachable(ops, inputs)
          if op.name in after_updates and op.name not in names and
          op.outputs and all(c.name in names for t in op.outputs
                             for c in t.consumers())]


def _release(graph, names):
  """What waits for every side effect of the step (a function's control
  outputs) no longer waits for the ops `names`, which keeps them out of
  the divided part; the rewritten function runs them as it runs every
  stateful op."""
  for op in graph.get_operations():
    if op.name not in names:
      for control in [c for c in op.control_inputs if c.name in names]:
        graph_editor.remove_control_input(op, control)


def _merge_inputs(graph, outside, names, divided, batch_dependent,
                  loss_terms, function_name):
  """Makes the ops `outside` read each batch-dependent tensor of the
  divided part merged; the step's outputs computed outside (a metric's
  result) are no longer merged: they run once."""
  merged = {}
  for op in outside:
    for tensor in op.inputs:
      if tensor.op.name in divided and tensor.op.name in batch_dependent and (
          tensor.op.type != "Placeholder"):
        merged[tensor.name] = (tensor, _merge_key(
            tensor, loss_terms, batch_dependent, op, function_name))
  for key in MERGED_KEYS:
    kept = [t for t in graph.get_collection(key)
            if getattr(t, "op", None) is None or t.op.name not in names]
    graph.get_collection_ref(key)[:] = kept
  for tensor, key in merged.values():
    graph.add_to_collection(key, tensor)
  merge_outputs.read_merged_values(
      [op for op in outside if any(t.name in merged for t in op.inputs)])


def read_whole_batch(graph, state, losses, arguments, roots, function_name):
  """Leaves the ops of the step outside its divided part (the ops that
  `roots`, the fetches and stateful ops, need, which neither the
  gradients nor the losses need nor are computed from them, and which
  read the batch (`_reads_whole_batch`): metric updates, the model called
  again after the updates, and what reads their results) out of the part
  the engine divides (in `training_subgraph.WHOLE_BATCH_OPS`), and makes
  them read, once it rewrites `graph`, the batch whole and each
  batch-dependent tensor of the divided part as its value merged over
  replicas and micro-batches. `losses` are the names of the losses the
  gradients are taken of, `arguments` the batch arguments'. Returns the
  names of those ops that read the batch."""
  consumers = lambda op: [c for t in op.outputs for c in t.consumers()]
  producers = lambda op: [t.op for t in op.inputs]
  batch_dependent = _data_reachable(
      [graph.get_tensor_by_name(name).op for name in arguments], consumers)
  gradients = [grad.op for record in state.gradient_records
               for grad, _ in record.pairs]
  divided = _data_reachable(
      gradients + [graph.get_tensor_by_name(name).op for name in losses],
      producers)
  training = divided | _data_reachable(gradients, consumers)
  loss_terms = _loss_terms(graph, losses, batch_dependent)
  outside = _outside_ops(graph, set(arguments) | loss_terms, divided,
                         batch_dependent, training, roots)
  names = {op.name for op in outside}
  for op in outside:
    graph.add_to_collection(training_subgraph.WHOLE_BATCH_OPS, op)
  _release(graph, names)
  _merge_inputs(graph, outside, names, divided, batch_dependent, loss_terms,
                function_name)
  return sorted(op.name for op in outside if op.name in batch_dependent)


def read_after_every_write(graph):
  """Once the engine rewrote `graph`: each variable read among the ops
  that run once on the whole batch (`read_whole_batch`; the model called
  again after the updates) waits for every write of its variable in the
  rewritten step, not only for the update it waited for in the trace
  (under ZeRO the owner of a variable updates its own copy, and then
  writes the new value into the other replicas', the user's variable
  included)."""
  once = graph.get_collection(training_subgraph.WHOLE_BATCH_OPS)
  names = {op.name for op in once}
  for op in once:
    if op.type != "ReadVariableOp":
      continue
    variable = training_subgraph.variable_behind(op.inputs[0])
    writes = [c for c in variable.outputs[0].consumers()
              if c.name not in names and control_flow.context_of(c) is None
              and variable in training_subgraph.written_variables(c)]
    graph_editor.add_control_inputs(op, writes)
