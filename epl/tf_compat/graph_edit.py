"""Editing ops in place: TensorFlow's private `Operation` and `Graph` calls.

TensorFlow has no public way to re-wire, re-place or re-attribute an op
once it is built, nor to delete one; the rewrite only adds ops and re-wires
them through these calls. Each is one line here, so that a TensorFlow that
renames or changes one fails in tests/test_tf_compat.py first.
"""
# pylint: disable=protected-access
from tensorflow.python.framework import ops


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
