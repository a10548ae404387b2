"""Every collective a Session.run executes has its whole group in the run.

A collective op completes only when every member of its group (the ops
with its group and instance keys, one per device of the group) runs in
the same step. EPL builds one copy of a collective per replica; a fetch
that reaches replica 0's copy alone (a split head's accuracy, a loss
fetched without the train op, an evaluation run) would wait for members
nothing runs, until the collective timeout. So, for each new set of
fetches, before TensorFlow executes anything:

- the collectives the fetches reach are found, and the members of their
  groups that the run would not execute are added to it as extra targets
  (the original EPL ran every replica's copy of a fetch), until every
  group reached is whole;
- a group that cannot be whole in this process raises `BrokenGroupError`,
  naming the collective, the user's fetch that reaches it, its keys and
  the members it has and lacks: on a one-worker job, every member must be
  in this graph.

On several workers each worker's session runs its own members, so a group
is checked only for the members on this worker; the collective timeout
(`cluster.collective_timeout_seconds`, which every collective EPL builds
carries) bounds what no check can prove.
"""
import weakref

from epl.ir import collectives
from epl.ir import control_flow
from epl.ir import graph_editor
from epl.ir.collectives import instance_of
from epl.ir.op_types import COLLECTIVE_TYPES


class _GraphIndex:
  """The names of the collective ops of one graph version by instance,
  and the names of the extra targets already worked out for each set of
  fetches. Names, not ops: an op would keep its graph alive from this
  module's table."""

  def __init__(self, graph):
    self.version = graph.version
    self.members = collectives.instances(graph)
    self.extra_targets = {}


_INDEXES = weakref.WeakKeyDictionary()


def _index(graph):
  index = _INDEXES.get(graph)
  if index is None or index.version != graph.version:
    index = _GraphIndex(graph)
    _INDEXES[graph] = index
  return index


def members_of(op):
  """The members of collective `op`'s instance in its graph, `op` too."""
  return [op.graph.get_operation_by_name(n)
          for n in _index(op.graph).members[instance_of(op)]]


def _target_for(op):
  """What a run fetches to execute `op`: the op itself, or, for an op in a
  v1 while-loop (which cannot be fetched), an exit of its outermost loop,
  which runs the whole loop."""
  if not control_flow.in_loop(op):
    return op
  return control_flow.outermost_loop_exit(op)


def extra_targets(graph, fetch_ops, one_worker):
  """The ops to run beside `fetch_ops` so that every collective they reach
  has its whole group in the run (the members in this graph; on several
  workers, the others run theirs); raises BrokenGroupError, on one
  worker, for a group that cannot be whole. Cached per graph version and
  set of fetches."""
  index = _index(graph)
  if not index.members:
    return []
  key = frozenset(op.name for op in fetch_ops)
  if key in index.extra_targets:
    return [graph.get_operation_by_name(n) for n in index.extra_targets[key]]
  fetch_names = sorted(key)
  reached = {}

  def walk(roots):
    new = graph_editor.reachable(
        [r for r in roots if r.name not in reached],
        lambda o: [i for i in graph_editor.input_ops(o)
                   if i.name not in reached])
    reached.update((op.name, op) for op in new)
    return new

  extra = []
  new = walk(fetch_ops)
  while new:
    targets = {}
    for op in new:
      if op.type not in COLLECTIVE_TYPES:
        continue
      members = members_of(op)
      if one_worker:
        collectives.require_whole(
            op, members, "this Session.run, for your fetch %s, would "
            "execute" % ", ".join(repr(n) for n in fetch_names[:3]))
      for member in members:
        target = _target_for(member)
        if member.name not in reached and target.name not in reached:
          targets.setdefault(target.name, target)
    extra.extend(targets.values())
    new = walk(list(targets.values()))
  index.extra_targets[key] = [op.name for op in extra]
  return extra

