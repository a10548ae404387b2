"""Editing ops in place: TensorFlow's private `Operation` and `Graph` calls.

TensorFlow has no public way to re-wire, re-place or re-attribute an op
once it is built, nor to delete one; the rewrite only adds ops and re-wires
them through these calls. Each is one line here, so that a TensorFlow that
renames or changes one fails in tests/test_tf_compat.py first.
"""
# pylint: disable=protected-access
import contextlib

# First: checks the TensorFlow version before its internals are imported.
from epl.tf_compat import version_check  # noqa: F401  pylint: disable=unused-import
from tensorflow.core.protobuf import control_flow_pb2
from tensorflow.python.framework import ops
from tensorflow.python.ops import control_flow_ops
from tensorflow.python.ops import control_flow_util


def update_input(op, index, tensor):
  """`op` reads `tensor` as its input `index` (the data edge is moved)."""
  op._update_input(index, tensor)


def set_attr(op, name, attr_value):
  """Sets attribute `name` of `op` to `attr_value` (an AttrValue proto)."""
  op._set_attr(name, attr_value)


def add_control_inputs(op, controls):
  """`op` waits for every op of `controls` too (duplicates are kept)."""
  op._add_control_inputs(controls)


def remove_all_control_inputs(op):
  """`op` waits for no op any more."""
  op._remove_all_control_inputs()


def set_device(op, device):
  """Places `op` on `device`, without the graph's device functions."""
  op._set_device(device)


def control_outputs(op):
  """The ops that have `op` as a control input."""
  return op._control_outputs


def creation_index(op):
  """The order in which `op` was added to its graph (a unique int that
  grows with each op; producers come before their consumers)."""
  return op._id


def is_ref_dtype(dtype):
  """Whether `dtype` is a reference type (the VariableV2 of TF1 graphs)."""
  return dtype._is_ref_dtype


def declared_input_types(op):
  """The input types of `op`'s definition, one per input: a reference
  type where the op takes a variable by reference (it may change it), the
  value type where it only reads a reference variable's value (SaveV2,
  Identity), whatever dtype the tensor it reads has."""
  return op._input_types


def create_op(graph, op_type, inputs, dtypes, name, attrs, op_def):
  """A new op of `graph` with exactly `attrs` (AttrValue protos) and
  output `dtypes`, placed by no device function (set its device after).

  Unlike `tf.raw_ops`, it takes the attributes of an existing NodeDef as
  they are. Like any op it goes through the create-op hook, and the open
  name scope and control dependencies apply (`name` is made unique).
  """
  return graph._create_op_internal(
      op_type, inputs, dtypes=dtypes, name=name, attrs=attrs, op_def=op_def,
      compute_device=False)


def default_original_op(graph):
  """The forward op whose gradient `tf.gradients` is building in `graph`
  (set around each gradient function), or None."""
  return graph._default_original_op


def graph_function(graph, name):
  """The function `name` defined in `graph` (a tf.function or Defun the
  graph calls), or None."""
  return graph._get_function(name)


def in_graph_context():
  """True inside a `with graph.as_default():` block of this thread, where
  `tf.compat.v1.reset_default_graph` must not be called."""
  return not ops._default_graph_stack.is_cleared()


def control_flow_context(op):
  """The v1 control-flow context (a CondContext or WhileContext of
  `tf.cond`/`tf.while_loop` under control flow v1) that `op` was built in,
  or None for an op outside every one."""
  return op._control_flow_context


def containing_while_context(op):
  """The innermost v1 WhileContext around `op` (through cond contexts), or
  None when `op` is in no v1 while-loop."""
  return containing_while_context_of(op._control_flow_context)


def containing_while_context_of(context):
  """The innermost v1 WhileContext that is or contains the v1 control-flow
  `context` (None for None or a cond outside every loop)."""
  return control_flow_util.GetContainingWhileContext(context)


def control_flow_context_def(context):
  """`context` (a top-level v1 CondContext or WhileContext) with the
  contexts nested in it, as a ControlFlowContextDef proto (what a meta
  graph stores)."""
  context_def = control_flow_pb2.ControlFlowContextDef()
  context.to_control_flow_context_def(context_def)
  return context_def


def context_def_kind(context_def):
  """The kind of context a ControlFlowContextDef holds and its proto:
  ("cond", CondContextDef) or ("while", WhileContextDef)."""
  if context_def.HasField("cond_ctxt"):
    return "cond", context_def.cond_ctxt
  return "while", context_def.while_ctxt


def context_from_def(graph, context_def, import_scope):
  """The v1 control-flow context (and those nested in it) that
  `context_def` describes, for the ops named `<import_scope>/<name>` of
  `graph`, which must exist: each op named in its values is set in it, as
  when a meta graph with v1 control flow is imported under `import_scope`.
  It starts outside every context."""
  with graph.as_default(), building_in_context(graph, None):
    return control_flow_ops.from_control_flow_context_def(
        context_def, import_scope=import_scope)


@contextlib.contextmanager
def building_in_context(graph, context):
  """Ops built in this block belong to the v1 control-flow `context` (None:
  to none), as if `tf.cond`/`tf.while_loop` were building them: an input
  from outside a while-loop then enters it through an Enter op."""
  outer = graph._get_control_flow_context()
  graph._set_control_flow_context(context)
  try:
    yield
  finally:
    graph._set_control_flow_context(outer)


def nested_contexts(context):
  """The v1 control-flow contexts built directly inside `context`, in the
  order they were built (the order of its proto's nested contexts)."""
  return list(context._nested_contexts)


def set_control_flow_context(op, context):
  """`op` belongs to the v1 control-flow `context` (what tf.gradients and
  op creation read), as if it had been built in it."""
  op._set_control_flow_context(context)


@contextlib.contextmanager
def building_v1_control_flow():
  """`tf.compat.v1.while_loop` and `tf.TensorArray` built in this block
  are v1 (Enter/Merge/Switch/Exit frames, TensorArrayV3), whatever
  control flow v2 says: ops that already exist can join a v1 loop's
  frame, never a v2 loop's function."""
  enabled = control_flow_util.ENABLE_CONTROL_FLOW_V2
  control_flow_util.ENABLE_CONTROL_FLOW_V2 = False
  try:
    yield
  finally:
    control_flow_util.ENABLE_CONTROL_FLOW_V2 = enabled


def join_while_context(op, context):
  """Makes the existing `op` part of the v1 WhileContext `context`, as if
  its body had built it: its outputs are values of the loop (a reader
  built in the body takes them without an Enter) and cannot be fetched.
  Its inputs are left as they are (see `enter_while_context`)."""
  op._set_control_flow_context(context)
  context._values.update(t.name for t in op.outputs)
  op.graph.prevent_fetching(op)


def enter_while_context(context, tensor):
  """`tensor`, built outside the v1 WhileContext `context`, as its
  iterations read it (through an Enter op, one per tensor)."""
  return context.AddValue(tensor)


def while_control_pivot(context):
  """The op of the v1 WhileContext `context` that an op of its body
  without inputs waits for, so that it runs in every iteration."""
  return context.GetControlPivot().op
