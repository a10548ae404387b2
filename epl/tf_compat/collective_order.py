"""Collectives of several devices in one `tf.function`, ordered per device.

A `tf.function` adds automatic control dependencies: it runs its stateful
ops that read no resource one after another, in the order they were
built (`auto_control_deps`, `last_write_to_resource[None]`). A rewritten
step imported into one function holds every replica's copy of each
collective; chained so, one member of a group would wait for the end of
the collective it must join, and the step hangs until the collective
timeout. The V2 collectives take resource `ordering_token`s, which
TensorFlow uses for that order only (its kernels do not read them): given
one token per device, each device's collectives keep their order and the
devices run side by side.
"""
# First: checks the TensorFlow version before its internals are imported.
from epl.tf_compat import version_check  # noqa: F401  pylint: disable=unused-import
import tensorflow as tf

_TOKEN_COUNT = "Nordering_token"
_TOKEN_PREFIX = "epl_collective_order"


def _token_node(graph_def, device, index):
  """A VarHandleOp on `device`: a resource tensor no op reads."""
  node = graph_def.node.add()
  node.name = "%s/%d" % (_TOKEN_PREFIX, index)
  node.op = "VarHandleOp"
  node.device = device
  node.attr["dtype"].type = tf.float32.as_datatype_enum
  node.attr["shape"].shape.SetInParent()
  node.attr["container"].s = b""
  node.attr["shared_name"].s = node.name.encode()
  return node.name


def order_per_device(graph_def):
  """Gives every V2 collective of `graph_def` that has no ordering token
  the token of its device (changed in place)."""
  tokens = {}
  for node in list(graph_def.node):
    if _TOKEN_COUNT not in node.attr or node.attr[_TOKEN_COUNT].i:
      continue
    if node.device not in tokens:
      tokens[node.device] = _token_node(graph_def, node.device, len(tokens))
    data = [i for i in node.input if not i.startswith("^")]
    controls = [i for i in node.input if i.startswith("^")]
    del node.input[:]
    node.input.extend(data + [tokens[node.device]] + controls)
    node.attr[_TOKEN_COUNT].i = 1
  return graph_def
