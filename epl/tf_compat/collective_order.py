"""Collectives of several devices in one `tf.function`, left unchained.

A `tf.function` adds automatic control dependencies: it runs its stateful
ops that read no resource one after another, in the order they were
built (`auto_control_deps`, `last_write_to_resource[None]`). A rewritten
step imported into one function holds every replica's copy of each
collective; chained so, one member of a group would wait for the end of
the collective it must join, and the step hangs until the collective
timeout. The V2 collectives take resource `ordering_token`s, which
TensorFlow uses for that order only (its kernels do not read them): given
a token of its own, each collective is left unchained, as in a TF1 graph,
where members meet by instance key and what orders them is the graph's
own edges (EPL's schedule).

The traced step itself holds the chain its own tf.function made of its
collectives (one replica's). `drop_chain` removes it from the copy the
engine rewrites: a TF1 graph has none (instance keys match the members),
and through it an accuracy computed after the update would read a
gradient, as far as the rewrite can tell.
"""
# First: checks the TensorFlow version before its internals are imported.
from epl.tf_compat import version_check  # noqa: F401  pylint: disable=unused-import
import tensorflow as tf

_TOKEN_COUNT = "Nordering_token"
_TOKEN_PREFIX = "epl_collective_order"


def _is_collective(node):
  return _TOKEN_COUNT in node.attr


def _token_node(graph_def, collective):
  """A VarHandleOp beside `collective`: a resource tensor no op reads."""
  node = graph_def.node.add()
  node.name = "%s/%s" % (_TOKEN_PREFIX, collective.name)
  node.op = "VarHandleOp"
  node.device = collective.device
  node.attr["dtype"].type = tf.float32.as_datatype_enum
  node.attr["shape"].shape.SetInParent()
  node.attr["container"].s = b""
  node.attr["shared_name"].s = node.name.encode()
  return node.name


def unchain(graph_def):
  """Gives every V2 collective of `graph_def` that has no ordering token
  one of its own (changed in place)."""
  for node in list(graph_def.node):
    if not _is_collective(node) or node.attr[_TOKEN_COUNT].i:
      continue
    data = [i for i in node.input if not i.startswith("^")]
    controls = [i for i in node.input if i.startswith("^")]
    del node.input[:]
    node.input.extend(data + [_token_node(graph_def, node)] + controls)
    node.attr[_TOKEN_COUNT].i = 1
  return graph_def


def drop_chain(graph_def):
  """Removes the control inputs between the V2 collectives of
  `graph_def` (changed in place)."""
  collectives = {node.name for node in graph_def.node if _is_collective(node)}
  for node in graph_def.node:
    if node.name in collectives:
      kept = [i for i in node.input
              if not (i.startswith("^") and i[1:] in collectives)]
      del node.input[:]
      node.input.extend(kept)
  return graph_def
