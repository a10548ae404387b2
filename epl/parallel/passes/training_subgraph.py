"""Which ops make up one model replica's training step.

The step is found from what capture recorded, whatever optimizer built it:
the gradients of variables that `tf.gradients` (or `GradientTape`) made,
and the ops downstream of them that write variables (the updates:
`tf.compat.v1.train` and Keras optimizers, subclasses that override
`apply_gradients`, hand-written `assign_sub`s). The training subgraph is
everything the updates, and the ops that wait for them, depend on (plus the
tensors merged over replicas and the collectives of split parts). Within it, each op is one of:

- cloned: per-replica compute, including the variables training writes;
- shared: read by every replica as it is: the input pipeline's datasets and
  iterators, placeholders, lookup tables, `global_step`, variables training
  only reads, and ops built outside every strategy scope; and the writes of
  shared variables (the `global_step` increment, however it was built),
  which run once per step;
- a join: a grouping op (NoOp) that waits for updates, such as the op
  `apply_gradients` returned or the user's `tf.group(train_op, ...)`. It is
  not cloned; instead it waits for every replica's copy of its inputs, so
  fetching it runs the whole step.
"""
import dataclasses
from typing import List, Tuple

import tensorflow as tf

from epl.ir import control_flow
from epl.ir import graph_editor
from epl.ir import collectives
from epl.ir.op_types import (BUFFER_FORWARDING_TYPES, INPUT_READ_TYPES,
                             PLACEHOLDER_TYPES,
                             REFERENCE_KEEPING_TYPES,
                             RESOURCE_VARIABLE_READERS, TABLE_TYPES,
                             VARIABLE_TYPES)
from epl.ir.phase import Phase
from epl.parallel.passes.resolve import mark_gradient_processing

# Collections of tensors merged over replicas (epl.GraphKeys).
MERGED_COLLECTIONS = ("global_mean_objects", "global_sum_objects",
                      "global_concat_objects")

# Graph collection of the ops that run once a step, as built, on the whole
# batch, outside the part the engine divides (a traced step's metric
# updates, and its model called again after applying the gradients, which
# waits for the updates: `epl.runtime.traced_whole_batch`): no replica's
# step, so the search for the updates and what follows them stops there.
WHOLE_BATCH_OPS = "epl_whole_batch_ops"


@dataclasses.dataclass(frozen=True)
class CapturedStep:
  """The training step as captured and selected; no pass changes it.

  `gradient_records`, `apply_records` and `loss_seeds` (op names) are what
  capture recorded, with the tensors it recorded. The rest are ops of the
  step: `updates` the variable writes downstream of the gradients (cloned
  or shared); `shared` what every replica reads as it is; `joins` the
  NoOps that wait for updates; `shared_writes` the writes of shared
  variables, run once per step (in `shared`); `global_steps` the names of
  the global_step variables; `input_reads` (cloned) in creation order.
  """
  gradient_records: tuple
  apply_records: tuple
  loss_seeds: frozenset
  updates: Tuple[tf.Operation, ...]
  shared: Tuple[tf.Operation, ...]
  joins: Tuple[tf.Operation, ...]
  shared_writes: Tuple[tf.Operation, ...]
  global_steps: frozenset
  input_reads: Tuple[tf.Operation, ...]


@dataclasses.dataclass(frozen=True)
class TrainingSubgraph:
  """The per-replica part of the step: `cloned`, topologically ordered
  (every replica gets a copy), and its replicated variable ops
  (`variables`, in `cloned`). Passes that change it hand on a new one."""
  cloned: List[tf.Operation]
  variables: List[tf.Operation]
  cloned_names: frozenset

  @classmethod
  def of(cls, cloned, variables):
    return cls(cloned, variables, frozenset(op.name for op in cloned))

  def adding(self, ops):
    """With ops built by a rewrite pass added to the cloned part, so that
    every replica gets them; `cloned` stays topologically ordered."""
    return TrainingSubgraph.of(
        graph_editor.topological_order(self.cloned + list(ops)),
        self.variables)

  def without(self, names):
    """Without the ops named in `names` (from `cloned` and `variables`)."""
    return TrainingSubgraph.of(
        [op for op in self.cloned if op.name not in names],
        [op for op in self.variables if op.name not in names])

  def without_variables(self, names):
    """With the variables named in `names` no longer replicated (they
    stay cloned)."""
    return dataclasses.replace(
        self, variables=[v for v in self.variables if v.name not in names])


def variable_behind(tensor):
  """The variable op whose handle or reference `tensor` is, also through
  the ops that pass it on unchanged (the Enter and Switch that bring it
  into a TF1 while-loop or cond branch, an Identity); None for any other
  tensor."""
  while (tensor.op.type in BUFFER_FORWARDING_TYPES and
         (tensor.dtype == tf.resource or
          graph_editor.is_ref_dtype(tensor.dtype))):
    tensor = tensor.op.inputs[0]
  return tensor.op if tensor.op.type in VARIABLE_TYPES else None


def _written_inputs(op):
  """The indices of the inputs through which `op` may change state: a
  resource handle it does not only read, or a reference its definition
  takes as a reference (ScatterUpdate, Assign, ApplyAdam; not SaveV2 or
  Identity, which take a reference variable's value) to change it. An op
  that passes a variable on (Switch, Enter, Identity) changes nothing."""
  if (op.type in RESOURCE_VARIABLE_READERS or
      op.type in BUFFER_FORWARDING_TYPES):
    return []
  declared = graph_editor.declared_input_types(op)
  return [index for index, dtype in enumerate(declared)
          if dtype == tf.resource or (
              graph_editor.is_ref_dtype(dtype) and
              op.type not in REFERENCE_KEEPING_TYPES)]


def written_variables(op):
  """The variable ops that `op` writes (none for a reader), also through
  a TF1 cond's Switch or a loop's Enter."""
  return [v for v in (variable_behind(op.inputs[index])
                      for index in _written_inputs(op)) if v is not None]


def is_variable_writer(op):
  """Whether `op` changes state through one of its inputs (a variable,
  possibly reached through a handle another op passes on)."""
  return bool(_written_inputs(op))


def value_readers(variable_op):
  """The ops that read the value of `variable_op` (its writers excepted):
  a resource variable's reads, each a snapshot; for a reference variable,
  the ops that read its buffer, reached through the ops that pass the
  buffer on without a copy (its `read` Identity, Switch, Enter), which
  see whatever the variable holds when they run."""
  readers, seen = [], set()
  stack = list(variable_op.outputs[0].consumers())
  while stack:
    op = stack.pop()
    if op.name in seen or is_variable_writer(op):
      continue
    seen.add(op.name)
    readers.append(op)
    if op.type in BUFFER_FORWARDING_TYPES:
      stack.extend(c for t in op.outputs for c in t.consumers())
  return readers


def tensors_of(grad):
  """The tensors of a gradient: [values, indices] of IndexedSlices."""
  if isinstance(grad, tf.IndexedSlices):
    return [grad.values, grad.indices]
  return [grad]


def raw_gradients(state):
  """Every recorded gradient of a variable, in the order they were made."""
  return [grad for record in state.gradient_records
          for grad, _ in record.pairs]


def find_updates(state):
  """(updates, ops after them): the variable writes downstream of the
  recorded gradients, and those writes with every op that depends on them
  (but the ops that run once on the whole batch, WHOLE_BATCH_OPS)."""
  once = {op.name for op in state.graph.get_collection(WHOLE_BATCH_OPS)}
  later = lambda op: [o for o in graph_editor.output_ops(op)
                      if o.name not in once]
  raw_ops = [t.op for grad in raw_gradients(state) for t in tensors_of(grad)]
  updates = [op for op in graph_editor.reachable(raw_ops, later)
             if written_variables(op)]
  return updates, graph_editor.reachable(updates, later)


def _input_pipeline_ops(training_ops):
  """Datasets and iterators behind every input read: shared by replicas."""
  roots = [t.op for op in training_ops if op.type in INPUT_READ_TYPES
           for t in op.inputs]
  return {op.name for op in graph_editor.ancestors(roots)}


def _global_step_ops(graph, state):
  global_steps = [r.global_step for r in state.apply_records
                  if r.global_step is not None]
  global_step = tf.compat.v1.train.get_global_step(graph)
  if global_step is not None:
    global_steps.append(global_step)
  return {v.op.name for v in global_steps}


def _other_roots(graph, state):
  """The ops besides the updates that the training step runs from: merged
  outputs, forward state updates, split collectives."""
  merged = [t.op for key in MERGED_COLLECTIONS
            for t in graph.get_collection(key) if isinstance(t, tf.Tensor)]
  # Forward state updates (batch norm) that the user fetches alongside the
  # train op rather than making it wait for them.
  forward_updates = [
      u if isinstance(u, tf.Operation) else u.op
      for u in graph.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)]
  forward_updates = [op for op in forward_updates
                     if state.phase_of(op) is Phase.FORWARD]
  # Every split part's collective, on the training path or not (an
  # argmax for the accuracy): each replica needs its copy, or a run that
  # fetches replica 0's could never complete its group.
  split_collectives = [
      op for op in graph.get_operations()
      if collectives.is_split_collective(op, state.provenance)]
  return merged + forward_updates + split_collectives


def _shared_ops(state, training_ops, global_step_ops):
  """Names of the step's ops that run once for all replicas: the input
  pipeline, placeholders, tables, the global step, OTHER ops but input
  reads, variables nothing in the step writes."""
  shared = _input_pipeline_ops(training_ops)
  written = {v.name for op in training_ops for v in written_variables(op)}
  for op in training_ops:
    if (op.type in PLACEHOLDER_TYPES or op.type in TABLE_TYPES or
        op.name in global_step_ops):
      shared.add(op.name)
    elif (state.phase_of(op) is Phase.OTHER and
          op.type not in INPUT_READ_TYPES):
      shared.add(op.name)
    elif op.type in VARIABLE_TYPES and op.name not in written:
      shared.add(op.name)
  return shared


def select_training_subgraph(graph, state):
  """The training step (CapturedStep) and its per-replica part
  (TrainingSubgraph): the step's ops split into cloned, shared and
  joins."""
  updates, after_updates = find_updates(state)
  joins = [op for op in after_updates if op.type == "NoOp"]
  roots = after_updates + _other_roots(graph, state)
  training_ops = graph_editor.ancestors(roots)
  # The pivots of TF1 conds and loops, which a copy of them needs.
  training_ops = graph_editor.ancestors(
      roots + control_flow.structure_ops(training_ops))
  join_names = {op.name for op in joins}
  # Gradient clipping built outside every scope works per replica.
  mark_gradient_processing(state, training_ops)

  global_step_ops = _global_step_ops(graph, state)
  shared = _shared_ops(state, training_ops, global_step_ops)
  # Writes of a shared variable (the global_step increment) run once.
  shared_writes = [
      op for op in training_ops
      if op.name not in join_names and
      any(v.name in shared for v in written_variables(op))]
  shared.update(op.name for op in shared_writes)
  shared -= join_names

  cloned = [op for op in training_ops
            if op.name not in shared and op.name not in join_names]
  cloned = graph_editor.topological_order(cloned)
  step = CapturedStep(
      gradient_records=tuple(state.gradient_records),
      apply_records=tuple(state.apply_records),
      loss_seeds=frozenset(state.loss_seeds),
      updates=tuple(updates),
      shared=tuple(op for op in training_ops if op.name in shared),
      joins=tuple(joins),
      shared_writes=tuple(shared_writes),
      global_steps=frozenset(global_step_ops),
      input_reads=tuple(sorted(
          (op for op in cloned if op.type in INPUT_READ_TYPES),
          key=graph_editor.creation_index)))
  return step, TrainingSubgraph.of(
      cloned, [op for op in cloned if op.type in VARIABLE_TYPES])
