"""Provenance: where each op EPL added to a graph comes from.

For every op the rewrite builds, which pass built it; for every copy, the
op it copies and the replica and micro-batch it was made for; and for the
few ops EPL builds while the user builds the model that the rewrite must
find again (the split lowerings' placeholders), their role. The record is
kept with the graph's state (`GraphState.provenance`), and EPL decides
from it, never from an op's name: a user scope named `EPL_...` is the
user's.

Recording is cheap, since the rewrite copies whole graphs: the pass of an
op comes from the span of op ids the pass created (one entry per pass),
and the copies of one clone are recorded with one dict update.
"""
import bisect
import contextlib
import dataclasses
import itertools
from collections.abc import Mapping
from typing import Optional

from epl.tf_compat import graph_edit

# Roles of the ops `epl.parallel.ops.split_lowering` builds while the user builds the
# model, which the split rewrite sets per replica.
SHARD_INDEX = "shard_index"              # the Const holding the shard index
SHARD_RANDOM = "shard_random"            # random ops of a shard's initial value
SPLIT_COLLECTIVE = "split_collective"    # collectives with placeholder keys


@dataclasses.dataclass(frozen=True)
class Origin:
  """Where one op comes from.

  `pass_name`: the rewrite pass (or run-time step) that built it; None for
  the user's ops. `source`: the name of the op it copies, if a copy.
  `replica`: the replica (numbered over the job) a copy was made for.
  `micro_batch`: the micro-batch a copy computes; None when it runs once
  per step. `role`: the role of a split lowering op or of what it copies.
  """
  pass_name: Optional[str]
  source: Optional[str]
  replica: Optional[int]
  micro_batch: Optional[int]
  role: Optional[str]


class Provenance:
  """The origin of the ops EPL added to one graph."""

  def __init__(self):
    self._starts = []   # first op id of each span, ascending
    self._spans = []    # (first op id, last op id, pass name)
    self._copies = {}   # copy op name -> (source name, replica, micro-batch)
    self._roles = {}    # op name -> role

  @contextlib.contextmanager
  def building(self, pass_name, graph):
    """The ops added to `graph` inside were built by `pass_name`.

    Not nested: each op belongs to one pass.
    """
    count = graph.version
    try:
      yield
    finally:
      new = graph.get_operations()[count:]
      if new:
        first, last = graph_edit.creation_index(new[0]), graph_edit.creation_index(new[-1])
        index = bisect.bisect(self._starts, first)
        self._starts.insert(index, first)
        self._spans.insert(index, (first, last, pass_name))

  def record_copies(self, clones, prefix, replica=None, micro_batch=None):
    """Records the copies `clones` ({source op name: copy}, named
    `<prefix><source name>`) of one clone.

    `micro_batch`: the micro-batch of every copy, or a mapping from source
    name to micro-batch (a source absent from it runs once per step).
    """
    names = list(clones)
    if isinstance(micro_batch, Mapping):
      micro_batches = map(micro_batch.get, names)
    else:
      micro_batches = itertools.repeat(micro_batch)
    self._copies.update(zip(
        [prefix + name for name in names],
        zip(names, itertools.repeat(replica), micro_batches)))

  def record_copy(self, copy, source, replica=None, micro_batch=None):
    """Records op `copy` as a copy of op `source`."""
    self._copies[copy.name] = (source.name, replica, micro_batch)

  def record_role(self, op, role):
    self._roles[op.name] = role

  def roles(self):
    """{op name: role} of the ops recorded with one (copies left out)."""
    return dict(self._roles)

  def pass_of(self, op):
    """The pass that built `op`; None for an op no pass built."""
    op_id = graph_edit.creation_index(op)
    index = bisect.bisect(self._starts, op_id) - 1
    if index < 0:
      return None
    _, last, pass_name = self._spans[index]
    return pass_name if op_id <= last else None

  def built_by_rewrite(self, op):
    """Whether a pass of the rewrite (not the user) built `op`."""
    return self.pass_of(op) is not None

  def role_of(self, op):
    """The role of `op`, or of the op it copies (through copies of
    copies); None when it has none."""
    name = op.name
    while name is not None:
      role = self._roles.get(name)
      if role is not None:
        return role
      copy = self._copies.get(name)
      name = copy[0] if copy is not None else None
    return None

  def origin(self, op):
    """The Origin of `op`."""
    source, replica, micro_batch = self._copies.get(op.name,
                                                    (None, None, None))
    return Origin(pass_name=self.pass_of(op), source=source, replica=replica,
                  micro_batch=micro_batch, role=self.role_of(op))
