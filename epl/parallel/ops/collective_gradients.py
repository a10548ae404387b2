"""Gradients of TensorFlow's V2 collectives (TF registers none).

Each rule is the adjoint of its collective over the whole group: backward
passes on the members together compute the gradient of the sum of every
member's objective.

- all-reduce (sum or mean) -> the same all-reduce of the incoming gradients;
- all-gather -> reduce-scatter: each member gets the sum, over members, of
  the gradient rows of its own block. TF's CollectiveReduceScatterV2 has no
  CPU kernel, so it is built from an all-to-all (block j goes to member j)
  and a local sum, which needs no rank;
- all-to-all -> all-to-all of the incoming gradients.

`all_to_all` builds the exchange the way TF's CPU kernel accepts it: dim 0
equal to the group size, and another kind of collective in the same step
(a scalar all-reduce it waits for; without one the step fails with "Failed
to get CollectiveExecutor").

The backward collectives read the forward op's group size and group key
tensors. Their instance key is derived from the forward op's, so that the
members of a group, each differentiated on its own, agree on it; the split
rewrite later gives every copy (per replica, per micro-batch) a key of its
own. They take the forward op's provenance role (a split lowering's
collective), which is how the rewrite finds them.
"""
import functools
import itertools

import tensorflow as tf

from epl.tf_compat.ops import collective_ops
from epl.tf_compat.ops import gradient_registered
from epl.tf_compat.ops import tensor_util
from epl.tf_compat import tape as tf_tape

from epl.capture import capture
from epl.ir import graph_state

# Capture-time instance keys: far above those the rewrite allocates from 1.
FIRST_KEY = 1 << 24
_instance_keys = itertools.count(FIRST_KEY)


def next_instance_key():
  """A fresh instance key for a collective built while the model is built."""
  return next(_instance_keys)


# Set in the instance key of a backward collective (forward keys stay
# below it), and of the all-reduce that lets an all-to-all run.
_BACKWARD_BIT = 1 << 30
_COMPANION_BIT = 1 << 29


def _backward_instance_key(op):
  forward_key = tensor_util.constant_value(op.inputs[3])
  if forward_key is None:
    return next_instance_key()
  return int(forward_key) ^ _BACKWARD_BIT


def _settings(op):
  return dict(communication_hint=op.get_attr("communication_hint").decode(),
              timeout=op.get_attr("timeout_seconds"))


def all_to_all(tensor, group_size, group_key, instance_key,
               communication_hint="auto", timeout=0):
  """Block j of dim 0 of `tensor` goes to member j; the result stacks the
  blocks received, in member order (dim 0 must divide by the group size).
  """
  settings = dict(communication_hint=communication_hint, timeout=timeout)
  companion = collective_ops.all_reduce_v2(
      tf.zeros([], tf.float32), group_size, group_key,
      _companion_key(instance_key), **settings)
  rows = tf.reshape(tf.convert_to_tensor(group_size, tf.int32), [1])
  with tf.control_dependencies([companion]):
    exchanged = collective_ops.all_to_all_v2(
        tf.reshape(tensor, tf.concat([rows, [-1]], 0)), group_size,
        group_key, instance_key, **settings)
  result = tf.reshape(exchanged, tf.shape(tensor))
  result.set_shape(tensor.shape)
  return result


def _companion_key(instance_key):
  value = tensor_util.constant_value(tf.convert_to_tensor(instance_key))
  if value is None:
    return next_instance_key()
  return int(value) ^ _COMPANION_BIT


def _reduce_grad(op, grad):
  merge_op = op.get_attr("merge_op").decode()
  if merge_op != "Add":
    raise ValueError(
        "%s: EPL differentiates only sum/mean all-reduces, not merge_op %r; "
        "wrap its output in tf.stop_gradient." % (op.name, merge_op))
  return [collective_ops.all_reduce_v2(
      grad, op.inputs[1], op.inputs[2], _backward_instance_key(op),
      merge_op="Add", final_op=op.get_attr("final_op").decode(),
      **_settings(op)),
          None, None, None] + [None] * (len(op.inputs) - 4)


def _gather_grad(op, grad):
  exchanged = all_to_all(grad, op.inputs[1], op.inputs[2],
                         _backward_instance_key(op), **_settings(op))
  blocks = tf.reshape(exchanged, tf.concat(
      [tf.reshape(op.inputs[1], [1]), tf.shape(op.inputs[0])], 0))
  local = tf.reduce_sum(blocks, axis=0)
  local.set_shape(op.inputs[0].shape)
  return [local, None, None, None] + [None] * (len(op.inputs) - 4)


def _all_to_all_grad(op, grad):
  # `grad` already has one row per member (see all_to_all).
  return [collective_ops.all_to_all_v2(
      grad, op.inputs[1], op.inputs[2], _backward_instance_key(op),
      **_settings(op)), None, None, None] + [None] * (len(op.inputs) - 4)


def _with_role_of_forward(gradient):
  """`gradient`, building its ops with the provenance role of the op it
  differentiates (a graph op, or the GradientTape's stand-in for one in a
  traced TF2 step)."""
  @functools.wraps(gradient)
  def build(op, grad):
    forward = tf_tape.forward_op(op)
    state = graph_state.state_of(forward.graph) if forward else None
    role = state.provenance.role_of(forward) if state is not None else None
    if role is None:
      return gradient(op, grad)
    with capture.role_scope(role):
      return gradient(op, grad)
  return build


_GRADIENTS = {
    "CollectiveReduceV2": _with_role_of_forward(_reduce_grad),
    "CollectiveGatherV2": _with_role_of_forward(_gather_grad),
    "CollectiveAllToAllV2": _with_role_of_forward(_all_to_all_grad),
}


def register():
  """Registers the rules above for the op types TF leaves without one."""
  for op_type, function in _GRADIENTS.items():
    if not gradient_registered(op_type):
      tf.RegisterGradient(op_type)(function)


register()
