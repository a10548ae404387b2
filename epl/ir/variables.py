"""Variables, their initializers and their optimizer slots, found by
TensorFlow's own structure, never by their names.

- A variable is its op (`VariableV2`, `VarHandleOp`): `op_of` maps what the
  user holds (a `tf.Variable`, its handle or its ref tensor) to it.
- Its initializer is the op `tf.Variable.initializer` names: the write of
  its initial value, found through the `tf.Variable` objects the graph's
  collections hold.
- Its optimizer slots are those `Optimizer.get_slot` returned for it when
  `apply_gradients` ran (recorded by capture in `GraphState.slot_owners`).
- Its gradients are the captured gradient records (`GraphState`).
- Its update is the ops `apply_gradients` built for it alone: the apply
  ops whose data flow touches that variable and no other, and of the
  variables among them its slots only (`updates_of`).
"""
import tensorflow as tf

from epl.ir import graph_editor
from epl.ir import pass_through
from epl.ir.graph_state import state_of
from epl.ir.op_types import VARIABLE_READ_TYPES, VARIABLE_TYPES
from epl.tf_compat.ops import EagerTensor, resource_variable_ops


def op_of(source):
  """The variable op behind `source` (a variable, its handle or its ref
  tensor); None when `source` is not a variable, or is one made eagerly
  (no graph holds it: a traced step reaches it through a capture)."""
  if resource_variable_ops.is_resource_variable(source):
    handle = getattr(source, "handle", None)
    if isinstance(handle, EagerTensor):
      return None
    return handle.op if isinstance(handle, tf.Tensor) else None
  if isinstance(source, tf.Variable):
    return source.op
  if isinstance(source, tf.Tensor) and source.op.type in VARIABLE_TYPES:
    return source.op
  return None


def _variable_objects(graph):
  """The `tf.Variable` objects of `graph`'s collections (every collection:
  a variable may be kept only in the local or a user's one)."""
  for key in graph.get_all_collection_keys():
    for value in graph.get_collection(key):
      if isinstance(value, tf.Variable):
        yield value


def initializer(variable):
  """The op that writes the initial value of variable op `variable` (its
  `tf.Variable`'s `initializer`); None when no collection of its graph
  holds its `tf.Variable`."""
  for value in _variable_objects(variable.graph):
    if op_of(value) is variable:
      return value.initializer
  return None


def slot_owner(variable):
  """The variable op whose optimizer slot variable op `variable` is; None
  when it is no recorded slot."""
  state = state_of(variable.graph)
  return None if state is None else state.slot_owners.get(variable.name)


def _touched(apply_ops, gradient_owner, trained):
  """For each apply op, the trained variables its data flow touches.

  An op touches variable v if it reads v (its handle, a read of it) or v's
  gradient, or if an op it feeds or is fed by (within the apply ops) does:
  first through its inputs; an op whose inputs touch nothing (a slot, a
  constant) takes the variables of the ops it feeds or runs before
  (control edges: Adam's sparse update decays a slot in a write that only
  the slot's scatter waits for). An IdentityN's output touches what its
  input of the same index touches (`pass_through`), not what all do.
  """
  names = {op.name for op in apply_ops}

  def direct(op):
    found = set()
    for tensor in map(pass_through.behind_identity_n, op.inputs):
      producer = tensor.op
      if producer.name in trained:
        found.add(producer.name)
      elif tensor.name in gradient_owner:
        found.add(gradient_owner[tensor.name])
      elif producer.type in VARIABLE_READ_TYPES and producer.inputs and (
          producer.inputs[0].op.name in trained):
        found.add(producer.inputs[0].op.name)
    return found

  upstream = {}
  for op in apply_ops:
    upstream[op.name] = direct(op).union(
        *[upstream[t.op.name]
          for t in map(pass_through.behind_identity_n, op.inputs)
          if t.op.name in names])
  downstream = {}
  for op in reversed(apply_ops):
    downstream[op.name] = direct(op).union(
        *[downstream[c.name] for c in graph_editor.output_ops(op)
          if c.name in names])
  return {op.name: upstream[op.name] or downstream[op.name]
          for op in apply_ops}


def updates_of(apply_ops, gradient_pairs, trained):
  """{name of each variable of `trained`: the ops of `apply_ops` (apply
  ops, topologically ordered) that update it alone}, given the
  (gradient, variable op) `gradient_pairs` its updates read; an empty
  list for a variable updated in an op shared with others."""
  gradient_owner = {}
  for grad, variable in gradient_pairs:
    tensors = ([grad.values, grad.indices]
               if isinstance(grad, tf.IndexedSlices) else [grad])
    for tensor in tensors:
      gradient_owner[tensor.name] = variable.name
  labels = _touched(apply_ops, gradient_owner, trained)
  return {name: [op for op in apply_ops if labels[op.name] == {name} and
                 _part_of_update(op, name)]
          for name in trained}


def _part_of_update(op, name):
  """Whether `op`, an apply op touching trained variable `name` alone,
  belongs to its update: any op but a variable that is not one of its
  slots. A variable the optimizer keeps for everything it applies (Adam's
  beta1_power, beta2_power) is read by one update only when one variable
  is trained, but the optimizer's finish (beta1_power *= beta1) writes it
  outside every update: the variable stays with that finish, one per
  replica, as when several updates read it."""
  if op.type not in VARIABLE_TYPES:
    return True
  owner = slot_owner(op)
  return owner is not None and owner.name == name
