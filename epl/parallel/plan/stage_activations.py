"""Activation bytes each stage keeps per micro-batch, counted from the
training step as captured (before the rewrite), for choosing a schedule
under a budget in bytes (`schedule_choice`).

What a stage keeps for one micro-batch does not depend on the schedule;
only how many micro-batches of it a device holds at once does. The
captured step's forward pass is one micro-batch (each micro-batch reads
its own batch from the input), so its static shapes give the bytes: the
forward tensors (buffers shared through views counted once) that each
stage's backward pass reads, as the memory estimate counts them on the
rewritten graph. A tensor the backward passes of several stages read is
kept once on a device that runs more than one of them. The captured step
is in its own dtypes and keeps every activation: AMP's half-precision
copies and gradient checkpointing's recomputation, which the rewrite
adds, would keep less, so under them the count is an upper bound.
"""
import collections
import dataclasses
from typing import FrozenSet

from epl.ir import graph_state
from epl.parallel.cost import kept_activations


@dataclasses.dataclass(frozen=True)
class KeptTensor:
  """A forward tensor kept for the backward pass: its name, bytes per
  micro-batch and the stages whose backward pass reads it."""
  name: str
  bytes: int
  stages: FrozenSet[int]


def measure(graph):
  """[KeptTensor] of the training step captured in `graph`; ValueError
  when it has no backward pass yet or a kept tensor's static shape is not
  fully known (naming it)."""
  state = graph_state.state_of(graph)
  readers = collections.OrderedDict()
  for op in graph.get_operations():
    for root in kept_activations.kept_activations_read(state, op, None):
      readers.setdefault(root, set()).add(state.taskgraph_index(op))
  if not readers:
    raise ValueError(
        "pipeline.activation_memory in bytes: the schedule is chosen from "
        "the activations the built training step's backward pass reads, "
        "and this graph has no backward pass yet. Build the step (the "
        "optimizer's minimize) before the plan is made, or give the "
        "budget as a fraction of 1F1B's (e.g. 0.5).")
  sizes = {t: kept_activations.tensor_bytes(t) for t in readers}
  unknown = [t for t, size in sizes.items() if size is None]
  if unknown:
    raise ValueError(
        "pipeline.activation_memory in bytes: the backward pass keeps %s "
        "(from %r), whose bytes are not known (shape %s, dtype %s)%s. Give "
        "it a static shape (batch the input with drop_remainder=True), or "
        "give the budget as a fraction of 1F1B's (e.g. 0.5)." % (
            unknown[0].name, unknown[0].op.type, _shape_text(unknown[0]),
            unknown[0].dtype.name,
            ", and %d more such tensor(s)" % (len(unknown) - 1)
            if len(unknown) > 1 else ""))
  return [KeptTensor(t.name, sizes[t], frozenset(stages))
          for t, stages in readers.items()]


def _shape_text(tensor):
  """`tensor`'s shape as people read it, "(None, 1)" also under TF1
  behaviour (whose shapes print "(?, 1)")."""
  if tensor.shape.rank is None:
    return "unknown"
  return str(tuple(tensor.shape.as_list()))
