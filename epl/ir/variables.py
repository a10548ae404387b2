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
"""
import tensorflow as tf

from epl.ir.graph_state import state_of
from epl.ir.op_types import VARIABLE_TYPES
from epl.tf_compat.ops import resource_variable_ops


def op_of(source):
  """The variable op behind `source` (a variable, its handle or its ref
  tensor); None when `source` is not a variable."""
  if resource_variable_ops.is_resource_variable(source):
    handle = getattr(source, "handle", None)
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
