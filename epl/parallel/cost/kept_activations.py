"""The forward tensors a training step keeps for its backward pass, and
their bytes from static shapes: what the memory estimate counts on the
rewritten graph and the schedule choice under a budget in bytes counts on
the captured one.
"""
import tensorflow as tf

from epl.ir.op_types import SHAPE_READER_TYPES, VARIABLE_TYPES
from epl.ir.phase import Phase

# Ops whose output is a view of an input's buffer (no new memory).
_VIEWS = frozenset(["Identity", "Reshape", "ExpandDims", "Squeeze",
                    "StopGradient", "Snapshot", "ReadVariableOp",
                    "IdentityN", "Bitcast"])


def tensor_bytes(tensor):
  """Bytes of `tensor` from its static shape and dtype; None when the
  shape is not fully known (or the dtype has no fixed size)."""
  shape = tensor.shape
  if shape.rank is None or not shape.is_fully_defined():
    return None
  dtype = tensor.dtype.base_dtype
  if dtype in (tf.resource, tf.variant, tf.string):
    return None
  return dtype.size * shape.num_elements()


def buffer_root(tensor):
  """The tensor whose buffer `tensor` shares (through views)."""
  while tensor.op.type in _VIEWS and tensor.op.inputs:
    tensor = tensor.op.inputs[0]
  return tensor


def kept_activations_read(state, op, micro_batch):
  """The buffers (tensors through views) of forward activations of
  micro-batch `micro_batch` (None: the step as captured, before the
  rewrite copies it) that `op` reads when it is a backward op: what the
  forward pass keeps for it. Variables and constants are not
  activations; shape readers keep no buffer."""
  if (state.phase_of(op) is not Phase.BACKWARD or
      op.type in SHAPE_READER_TYPES):
    return []
  roots = []
  for tensor in op.inputs:
    root = buffer_root(tensor)
    producer = root.op
    if (state.phase_of(producer) is Phase.FORWARD and
        state.micro_batch_of(producer) == micro_batch and
        producer.type not in VARIABLE_TYPES and producer.type != "Const"):
      roots.append(root)
  return roots
