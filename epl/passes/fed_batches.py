"""Batches fed through placeholders, split over replicas and micro-batches.

A script that feeds its batch through placeholders (`feed_dict`) feeds, as
on one device, the batch of the whole step (of this worker): EPL gives
each replica and micro-batch its part, as a `tf.data` input does.
"""
import logging

import tensorflow as tf

from epl.capture import capture
from epl.ir.op_types import PLACEHOLDER_TYPES
from epl.tf_compat import graph_edit

logger = logging.getLogger("epl")
FED_BATCH_SCOPE = "EPL_FED_BATCH"


def _is_batch(placeholder):
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
  A fed batch that does not divide is an error at run time naming the
  placeholder. Placeholders of fixed shape (a learning rate, a keep
  probability) are read whole by every copy, as before. Only the inputs of
  the step's forward ops change; the placeholder and everything else that
  reads it stay as they are.
  """
  replicas = len(ctx.replicas)
  micro_batches = copies.micro_batches or [{}]
  parts = replicas * len(micro_batches)
  if parts == 1:
    return
  placeholders = [op for op in captured_step.shared
                  if op.type in PLACEHOLDER_TYPES and _is_batch(op)]
  with capture.suspended(), ctx.graph.as_default(), ctx.graph.name_scope(
      FED_BATCH_SCOPE), ctx.graph.control_dependencies(None):
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
                graph_edit.update_input(copy, position, piece)
      logger.info("EPL: the batch fed to placeholder %r is split into %d "
                  "parts", placeholder.name, parts)
