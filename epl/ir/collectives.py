"""TensorFlow's V2 collective ops as groups: which ops are members of one
collective instance, and whether each instance has all its members.

A collective op completes only when every member of its group (the ops
that share its group key and instance key, one per device of the group,
`group_size` of them) runs in the same step. Keys are inputs of the op:
constants, or for the per-step instance keys of sparse gathers one
tensor that every member reads.
"""
import collections

from epl.ir import provenance
from epl.ir.op_types import COLLECTIVE_TYPES
from epl.tf_compat.ops import tensor_util


class BrokenGroupError(ValueError):
  """A collective whose group can never be whole in this process."""


def _key_input(op, name):
  """The input of collective `op` named `name` in its op definition
  (group_size, group_key, instance_key)."""
  names = [arg.name for arg in op.op_def.input_arg]
  return op.inputs[names.index(name)]


def _value_or_name(tensor):
  """A key tensor's constant value, or its name when it is computed."""
  value = tensor_util.constant_value(tensor)
  return int(value) if value is not None else tensor.name


def instance_of(op):
  """(group key, instance key) of collective `op`: the members of one
  collective instance share them."""
  return (_value_or_name(_key_input(op, "group_key")),
          _value_or_name(_key_input(op, "instance_key")))


def group_size_of(op):
  """The group size of collective `op`, None when it is computed."""
  value = tensor_util.constant_value(_key_input(op, "group_size"))
  return None if value is None else int(value)


def is_split_collective(op, origins):
  """Whether `op` is a collective a split lowering built (placeholder
  keys the rewrite replaces), by the provenance `origins`."""
  return op.type in COLLECTIVE_TYPES and (
      origins.role_of(op) == provenance.SPLIT_COLLECTIVE)


def instances(graph):
  """{(group key, instance key): [names of its members]} of `graph`."""
  members = collections.defaultdict(list)
  for op in graph.get_operations():
    if op.type in COLLECTIVE_TYPES:
      members[instance_of(op)].append(op.name)
  return members


def require_whole(op, members, what):
  """Raises BrokenGroupError when collective `op`'s instance has other
  than its group size of `members` (ops) in its graph; `what` says where
  it was met."""
  size = group_size_of(op)
  if size is None or len(members) == size:
    return
  group_key, instance_key = instance_of(op)
  raise BrokenGroupError(
      "EPL: %s collective %r (%s), whose group (group key %s, instance key "
      "%s) needs %d member(s), but %d exist in the graph (%s): it could "
      "never complete, so nothing ran. A collective built after the first "
      "Session.run (a split layer's argmax, top_k or loss built later, for "
      "an evaluation) has no copy in the other replicas: build every split "
      "output you will fetch before the first Session.run." % (
          what, op.name, op.type, group_key, instance_key,
          size, len(members),
          ", ".join("%r on %s" % (m.name, m.device or "no device")
                    for m in members)))


def check_whole_groups(graph):
  """Raises BrokenGroupError for the first collective instance of `graph`
  with fewer or more members than its group size (on one worker, where
  every member is in this graph)."""
  for names in instances(graph).values():
    members = [graph.get_operation_by_name(n) for n in names]
    require_whole(members[0], members, "after the rewrite, the graph has")
