"""Checkpoints of split variables: one full tensor under the user's name.

A Saver built before the rewrite saves replica 0's variables: for a split
variable that is one shard. `full_tensor_checkpoints` makes its SaveV2
write the shards of shard group 0 side by side (the padding of the last
shard cut off), so the checkpoint is the one single-device TF writes; and
makes its restore give every replica its own slice of the full tensor.
Either direction works between a split run and plain TF.
"""
import tensorflow as tf

from epl.ir import graph_editor
from epl.ir.op_types import VARIABLE_ASSIGN_TYPES
from epl.parallel.passes.variable_sync import (assign_value, read_value,
                                      variable_read_by)


def _restored_value(assign):
  """The RestoreV2 output an assign writes, through Identity ops; or None."""
  tensor = assign.inputs[1]
  while tensor.op.type == "Identity":
    tensor = tensor.op.inputs[0]
  return tensor if tensor.op.type == "RestoreV2" else None


def shard_slice(full, info, shard, rank):
  """Shard `shard` (ShardedVariable `info`) of `full`, a tensor of rank
  `rank` and the unsharded shape: its `info.columns` entries of axis
  `info.axis`, zeros past the end of the full tensor (the last shards'
  padding). Slices only the entries it keeps (no padded copy of the whole
  tensor)."""
  begin = shard * info.columns
  kept = max(0, min(info.columns, info.full_size - begin))
  starts = [0] * rank
  starts[info.axis] = min(begin, info.full_size)
  sizes = [-1] * rank
  sizes[info.axis] = kept
  part = tf.slice(full, starts, sizes)
  if kept == info.columns:
    return part
  padding = [[0, 0] for _ in range(rank)]
  padding[info.axis][1] = info.columns - kept
  return tf.pad(part, padding)


def joined_shards(shards, info):
  """The full tensor of ShardedVariable `info` from its `shards` in shard
  order: concatenated along `info.axis`, the padding cut off. Built on the
  current device."""
  full = tf.concat(shards, info.axis)
  size = [-1] * full.shape.rank
  size[info.axis] = info.full_size
  return tf.slice(full, [0] * full.shape.rank, size)


def _save_full_tensor(ctx, copies, save, sharded):
  for index, tensor in enumerate(save.inputs):
    variable = variable_read_by(tensor)
    info = sharded.get(variable.name) if variable is not None else None
    if info is None:
      continue
    group_zero = list(range(info.group_size))
    if not set(group_zero) <= set(ctx.replicas):
      if ctx.cluster.worker_index != 0:
        # Only worker 0 writes checkpoints (epl.runtime.checkpoint).
        continue
      raise NotImplementedError(
          "Checkpoints of split variable %r need every shard of shard group "
          "0 (replicas %s) on worker 0, which writes them; this worker has "
          "replicas %s." % (variable.name, group_zero, ctx.replicas))
    shards = [read_value(copies.op(ctx.replicas.index(r), variable))
              for r in group_zero]
    with tf.device(save.device):
      full = joined_shards(shards, info)
    # The Saver's tensors carry the shard's shape where the full tensor
    # now flows.
    graph_editor.update_input(save, index,
                            graph_editor.with_unknown_sizes(full))


def write_shards(ctx, copies, assign, info, shard_of):
  """Makes `assign`, a write of the full value into the user's (replica
  0's) copy of a sharded variable, write replica 0's shard instead, and
  adds a write of its own shard into every other local replica's copy.
  The ops that group `assign` (an init op, a Saver's restore_all) also
  wait for those writes. Returns the writes added."""
  variable = assign.inputs[0].op
  rank = len(variable.get_attr("shape").dim)
  with tf.device(assign.device):
    full = graph_editor.with_unknown_sizes(assign.inputs[1])
  groups = [op for op in ctx.graph.get_operations()
            if assign in op.control_inputs]
  def shard(local):
    # Where the variable was built whole (ZeRO v3), TensorFlow still knows
    # it by its full static shape.
    return graph_editor.with_unknown_sizes(
        shard_slice(full, info, shard_of(local, info.group_size), rank))

  with tf.device(assign.device):
    graph_editor.update_input(assign, 1, shard(0))
  writes = []
  for local in range(1, len(ctx.replicas)):
    copy = copies.op(local, variable)
    with tf.device(copy.device):
      writes.append(assign_value(copy, shard(local), name=None))
  for group in groups:
    graph_editor.add_control_inputs(group, writes)
  return writes


def full_tensor_checkpoints(ctx, copies, sharded, shard_of):
  """Rewrites the graph's Savers for the sharded variables.

  `copies`: the rewrite's Copies; `sharded`: {variable op name:
  ShardedVariable}; `shard_of(local,
  group_size)`: the shard index of local replica `local`. Every SaveV2 writes the full
  tensor of each sharded variable it saves; every restore of one writes
  each local replica's slice, and the op grouping the restore (a Saver's
  restore_all) also waits for the other replicas' writes. Other variables
  are untouched (`epl.parallel.passes.variable_sync` copies them), and so are
  saves and restores already rewritten (they no longer read a variable or
  a restored tensor directly), so it can run again after new ops.
  """
  for op in ctx.graph.get_operations():
    if op.type == "SaveV2":
      _save_full_tensor(ctx, copies, op, sharded)
    elif op.type in VARIABLE_ASSIGN_TYPES and (
        op.inputs[0].op.name in sharded) and _restored_value(op) is not None:
      write_shards(ctx, copies, op, sharded[op.inputs[0].op.name], shard_of)
