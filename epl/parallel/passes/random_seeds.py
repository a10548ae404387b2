"""Random numbers per replica and micro-batch.

With a graph-level seed every random op has fixed `seed`/`seed2`
attributes, and a clone that copies them draws the same numbers as its
source: every replica and micro-batch would get the same dropout mask.
"""
from tensorflow.core.framework import attr_value_pb2
import tensorflow as tf

from epl.ir import graph_editor
from epl.ir import names as epl_names
from epl.ir.op_types import FUNCTION_BODY_TYPES

# Stateful random ops seeded by their `seed` and `seed2` attributes.
SEEDED_RANDOM_TYPES = frozenset([
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal",
    "TruncatedNormal", "ParameterizedTruncatedNormal", "RandomShuffle",
    "Multinomial", "RandomGamma", "RandomPoisson", "RandomPoissonV2",
    "RandomCrop", "SampleDistortedBoundingBox",
    "SampleDistortedBoundingBoxV2"])
# Stateless random ops and the op behind the V2 ones: their `seed` input
# decides the numbers.
SEED_INPUT_TYPES = frozenset([
    "StatelessRandomUniform", "StatelessRandomNormal",
    "StatelessTruncatedNormal", "StatelessRandomUniformInt",
    "StatelessRandomUniformFullInt", "StatelessMultinomial",
    "StatelessRandomBinomial", "StatelessRandomGammaV2",
    "StatelessRandomPoisson", "StatelessParameterizedTruncatedNormal",
    "StatelessRandomGetKeyCounter", "StatelessRandomGetKeyCounterAlg"])
# tf.random.Generator: its state is a variable, copied from replica 0.
GENERATOR_TYPES = frozenset([
    "StatefulUniform", "StatefulUniformInt", "StatefulUniformFullInt",
    "StatefulStandardNormal", "StatefulStandardNormalV2",
    "StatefulTruncatedNormal", "StatefulRandomBinomial", "RngSkip",
    "RngReadAndSkip"])


def _function_names(op):
  names = []
  for value in op.node_def.attr.values():
    if value.HasField("func"):
      names.append(value.func.name)
    names.extend(f.name for f in value.list.func)
  return names


def _seeded_random_in_functions(graph, op, seen=None):
  """The first seeded random op inside the functions `op` calls (nested
  calls included), as 'function/node'; None if there is none."""
  seen = set() if seen is None else seen
  for name in _function_names(op):
    if name in seen:
      continue
    seen.add(name)
    function = graph_editor.graph_function(graph, name)
    if function is None:
      continue
    for node in function.definition.node_def:
      attrs = node.attr
      if node.op in SEEDED_RANDOM_TYPES and (
          attrs["seed"].i or attrs["seed2"].i):
        return "%s/%s" % (name, node.name)
      if node.op in SEED_INPUT_TYPES:
        return "%s/%s" % (name, node.name)
      inner = _seeded_random_in_functions(graph, node, seen) if (
          node.op in FUNCTION_BODY_TYPES) else None
      if inner:
        return inner
  return None


def _copies(ctx, copies, op):
  """(copy index, op) for every copy of `op` but the user's own: copy
  index replica * num_micro_batch + micro-batch, replicas numbered over the
  whole job, so every worker derives the same seeds."""
  micro_batches = copies.micro_batch_ops(op)
  count = ctx.plan.num_micro_batch
  result = []
  for local, replica in enumerate(ctx.replicas):
    for micro_batch, copy in enumerate(micro_batches):
      index = replica * count + micro_batch
      if index:
        result.append((index, copies.op(local, copy)))
  return result


def _derived_seed2(seed, seed2, index):
  derived = (seed2 + index * 7919) % (2 ** 31 - 1)
  return derived or (1 if not seed else 0)


def vary_random_seeds(ctx, subgraph, copies):
  """Gives every replica and micro-batch its own random numbers.

  Each copy of a seeded random op (dropout's RandomUniform, ...) gets a
  `seed2` derived from the user's and its copy index; each copy of a
  stateless random op reads `seed + [0, index]`. The user's own ops
  (replica 0, micro-batch 0) keep theirs, so a run is deterministic under
  a graph-level seed and reruns reproduce it. Random ops without seeds
  already differ per copy and are left alone. Raises for what cannot be
  varied: `tf.random.Generator` ops, and seeded random ops inside
  `tf.cond`/`tf.while_loop` bodies (their function is shared by every
  copy). Nothing changes when the step has one copy.
  """
  if len(ctx.replicas) * ctx.plan.num_micro_batch == 1 and (
      ctx.plan.num_replicas == 1):
    return
  originals = [op for op in subgraph.cloned
               if ctx.state.micro_batch_of(op) in (None, 0)]
  for op in originals:
    if op.type in GENERATOR_TYPES:
      raise ValueError(
          "Op %r (%s) draws from a tf.random.Generator, whose state every "
          "replica copies from replica 0: all replicas would draw the same "
          "numbers. Use tf.random ops with a graph-level seed (dropout, "
          "tf.random.uniform) or stateless ops instead." % (op.name, op.type))
    if op.type in FUNCTION_BODY_TYPES:
      inner = _seeded_random_in_functions(ctx.graph, op)
      if inner:
        raise ValueError(
            "Op %r (%s) runs the seeded random op %r inside a function "
            "(tf.cond / tf.while_loop body) that every replica and "
            "micro-batch shares, so all would draw the same numbers. Build "
            "the random op outside the control flow and pass its result in, "
            "or give it no seed." % (op.name, op.type, inner))
  with ctx.building():
    for op in originals:
      if op.type in SEEDED_RANDOM_TYPES:
        seed, seed2 = op.get_attr("seed"), op.get_attr("seed2")
        if not seed and not seed2:
          continue
        for index, copy in _copies(ctx, copies, op):
          graph_editor.set_attr(copy, "seed2", attr_value_pb2.AttrValue(
              i=_derived_seed2(seed, seed2, index)))
      elif op.type in SEED_INPUT_TYPES:
        position = [a.name for a in op.op_def.input_arg].index("seed")
        for index, copy in _copies(ctx, copies, op):
          seed = copy.inputs[position]
          with tf.device(copy.device), tf.name_scope(
              "%s/%s" % (epl_names.RANDOM_SEEDS, copy.name)):
            offset = tf.constant([0, index], dtype=seed.dtype)
            graph_editor.update_input(copy, position, seed + offset)
