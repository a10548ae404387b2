"""Batches fed through placeholders, split over replicas and micro-batches.

A script that feeds its batch through placeholders (`feed_dict`) feeds, as
on one device, the batch of the whole step (of this worker): EPL gives
each replica and micro-batch its part, as a `tf.data` input does.
"""
import logging

import numpy as np
import tensorflow as tf

from epl.ir import graph_editor
from epl.ir import names as epl_names
from epl.ir.op_types import PLACEHOLDER_TYPES

logger = logging.getLogger("epl")


def is_fed_batch(placeholder):
  """A placeholder with an unknown first dimension: a fed batch."""
  shape = placeholder.outputs[0].shape
  return shape.rank is not None and shape.rank >= 1 and (
      tf.compat.dimension_value(shape[0]) is None)


def split_fed_batches(ctx, captured_step, subgraph, copies):
  """Gives each copy of the step its part of every fed batch.

  A placeholder whose first dimension is unknown (`[None, ...]`) and that
  the step's forward pass reads is cut along dimension 0 into local
  replicas x micro-batches equal parts; micro-batch m of local replica r
  reads part m * replicas + r (the order `tf.data` batches are read in).
  A fed batch that does not divide is an error naming the placeholder:
  `check_fed_rows` raises it before the step runs (the graph checks it
  too, for runs that bypass `Session.run`). Placeholders of fixed shape (a learning rate, a keep
  probability) are read whole by every copy, as before. Only the inputs of
  the step's forward ops change; the placeholder and everything else that
  reads it stay as they are. Runs as soon as the replicas are cloned, so
  that what later passes build from a copy's inputs (zero.level v3's
  gradient shards, from every replica's activations) reads that copy's
  part. Hands on the fed batches it split (`fed_batch_parts`).
  """
  replicas = len(ctx.replicas)
  micro_batches = copies.micro_batches or [{}]
  parts = replicas * len(micro_batches)
  fed_batch_parts = {}
  if parts == 1:
    return {"fed_batch_parts": fed_batch_parts}
  placeholders = [op for op in captured_step.shared
                  if op.type in PLACEHOLDER_TYPES and is_fed_batch(op)]
  with ctx.building(epl_names.FED_BATCH):
    for placeholder in placeholders:
      fed = placeholder.outputs[0]
      readers = [c for c in fed.consumers()
                 if c.name in subgraph.cloned_names and
                 ctx.state.micro_batch_of(c) is not None]
      if not readers:
        continue
      with tf.device(placeholder.device), tf.name_scope(placeholder.name):
        rows = tf.shape(fed, out_type=tf.int64)[0]
        check = tf.debugging.assert_equal(
            rows % parts, tf.constant(0, tf.int64), message=(
                "EPL splits the batch fed to placeholder %r into %d equal "
                "parts (%d local replica(s) x %d micro-batch(es)); feed a "
                "number of rows that is a multiple of %d" % (
                    placeholder.name, parts, replicas, len(micro_batches),
                    parts)))
        with tf.control_dependencies([check]):
          part = rows // parts
        pieces = [fed[index * part:(index + 1) * part]
                  for index in range(parts)]
        for reader in readers:
          micro_batch = ctx.state.micro_batch_of(reader)
          for local in range(replicas):
            piece = pieces[micro_batch * replicas + local]
            copy = copies.op(local, reader)
            for position, tensor in enumerate(copy.inputs):
              if tensor is fed:
                graph_editor.update_input(copy, position, piece)
      fed_batch_parts[fed.name] = (parts, replicas, len(micro_batches))
      logger.info("EPL: the batch fed to placeholder %r is split into %d "
                  "parts", placeholder.name, parts)
  return {"fed_batch_parts": fed_batch_parts}


def _fed_name(key):
  if isinstance(key, str):
    return key if ":" in key else key + ":0"
  return getattr(key, "name", None)


def check_fed_rows(ctx, feed_dict, fed_batch_parts):  # pylint: disable=unused-argument
  """Raises a one-line ValueError, before the step runs, when a batch fed
  through `feed_dict` to a placeholder that `split_fed_batches` cut does
  not divide into its parts."""
  if not feed_dict or not fed_batch_parts:
    return
  for key, value in feed_dict.items():
    found = fed_batch_parts.get(_fed_name(key))
    shape = np.shape(value)
    if found is None or not shape:
      continue
    parts, replicas, micro_batches = found
    if shape[0] % parts:
      raise ValueError(
          "The batch fed to placeholder %r has %d rows: EPL splits it into "
          "%d equal parts (%d local replica(s) x %d micro-batch(es)); feed "
          "a number of rows that is a multiple of %d." % (
              _fed_name(key).split(":")[0], shape[0], parts, replicas,
              micro_batches, parts))
