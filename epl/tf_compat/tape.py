"""The forward op a `GradientTape` differentiates, in a traced graph.

`tf.gradients` builds each op's gradient under `Graph._original_op(op)`,
which capture reads to put the gradient on the forward op's TaskGraph
(`graph_edit.default_original_op`). A `GradientTape` inside a
`tf.function` calls the same registered gradient functions with a mock of
the forward op (`backprop._MockOp`: its type, inputs and, when the gradient
needs them, outputs) and sets no original op. The gradient registry's
`lookup` is how both reach a gradient function (`GRADIENT_LOOKUP`); its
wrapper finds the real op and opens `original_op_scope` around the call.
"""
# pylint: disable=protected-access
# First: checks the TensorFlow version before its internals are imported.
from epl.tf_compat import version_check  # noqa: F401  pylint: disable=unused-import
import tensorflow as tf
from tensorflow.python.framework import ops
from tensorflow.python.framework import registry

# The lookup of every registry (gradients, shapes); the wrapper keeps to
# the gradient registry's.
GRADIENT_LOOKUP = (registry.Registry, "lookup")


def is_gradient_registry(owner):
  """Whether registry `owner` is TensorFlow's registry of gradients."""
  return owner is ops._gradient_registry


def forward_op(op):
  """The graph op `op` stands for: itself when it is one (tf.gradients),
  else (the tape's mock of it) the op of its outputs, or the one consumer
  of its first input of its type that reads exactly its inputs; None when
  none is found."""
  if isinstance(op, tf.Operation):
    return op
  outputs = [t for t in (op.outputs or ()) if isinstance(t, tf.Tensor)]
  if outputs:
    return outputs[0].op
  inputs = [t for t in (op.inputs or ()) if isinstance(t, tf.Tensor)]
  if not inputs or len(inputs) != len(op.inputs):
    return None
  names = [t.name for t in inputs]
  found = [c for c in inputs[0].consumers()
           if c.type == op.type and [t.name for t in c.inputs] == names]
  return found[0] if len(found) == 1 else None


def original_op_scope(graph, op):
  """Ops built inside are the gradient of `op` (as tf.gradients builds
  them)."""
  return graph._original_op(op)
