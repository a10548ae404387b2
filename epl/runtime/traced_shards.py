"""Sharded variables of a traced step run through EPL's engine
(`traced_engine`), and the user's eager variables they stand for.

Two kinds of variable of the rewritten step hold one shard per replica:

- zero.level v3's partitioned weights and their optimizer slots: shard
  r of N (the local replicas of their stage) holds rows
  `[r * ceil(rows / N), ...)`, the last shards padded with zeros;
- split layers' weights and their slots (`traced_split_weights`): the
  replica of shard s of each group of k holds columns (a Dense kernel's
  axis 1, its bias' axis 0) or experts (axis 0) `[s * ceil(n / k), ...)`.

Either way each replica's copy, replica 0's too, is declared with its
shard's shape, so the user's whole eager variable cannot be that copy:
the copies are the rewritten function's own `VarHandleOp`s (a fixed
`shared_name` keeps a `VarHandleOp`'s value between calls), and the step
does not read the user's variable at all. `ShardTransfers` builds, from
the rewrite's {variable: ShardedVariable} alone (along the axis it says):

- the writes of every copy from the user's variable (its slice of the
  whole value), run before every call, so that an eager write between
  steps (`set_weights`, `assign`, a checkpoint restore, of a weight or a
  slot) reaches every shard;
- the write of the user's variable with the shards of group 0 joined
  (the padding cut off), run after every call, so that `get_weights()`,
  `numpy()`, `tf.train.Checkpoint` and `save_weights` see full, current
  tensors.

Memory and time: the user's eager variables keep one full copy of each
sharded weight and slot (on the device they were created on); each
replica's device holds its shard. Each call moves every sharded variable
twice (in before the step, out after it), which a TF1 graph does not.
"""
import tensorflow as tf

from epl.capture import capture
from epl.ir import graph_editor
from epl.parallel.passes import variable_sync
from epl.parallel.passes.split_checkpoint import joined_shards, shard_slice

_USER = "EPL_TRACED_USER"


def sharded_variables(result):
  """{variable op name: ShardedVariable} of the variables (weights and
  slots) the rewrite `result` made shards of: zero.level v3's partitioned
  ones and the split layers'."""
  weights = result.zero_partition.weights if result.zero_partition else None
  found = dict(weights.shards) if weights else {}
  found.update(result.artifacts.get("split_variables") or {})
  return found


def grouped_def(graph, ops, name):
  """A GraphDef of what `ops` need, and the name of the op `name` that
  groups them (what the traced step's transfer functions import)."""
  with graph.as_default(), capture.suspended():
    group = tf.group(ops, name=name)
  return tf.compat.v1.graph_util.extract_sub_graph(
      graph.as_graph_def(), [group.name]), group.name


class ShardTransfers:
  """The graph defs that write each local replica's shard of the sharded
  variables `shards` ({variable op name: ShardedVariable}) of rewritten
  `graph` from the user's variable (`into_shards`), and the user's
  variable from the shards joined (`into_user`). Local replica l holds
  shard l % group_size (one worker: ZeRO's group is every local replica
  of the stage, a split's groups are consecutive replicas). `copies`:
  the rewrite's Copies. Built after the step's GraphDef was taken: they
  are not part of the step. `user_inputs`: {the step's input of replica
  0's copy of each variable (its VarHandleOp, left unmapped): the input
  of these graph defs the user's variable (its handle) is given at}."""

  def __init__(self, graph, copies, shards):
    writes, back, self.user_inputs = [], [], {}
    with graph.as_default(), capture.suspended(), tf.name_scope(_USER):
      for name, sharding in sorted(shards.items()):
        variable = graph.get_operation_by_name(name)
        handle = tf.compat.v1.placeholder(tf.resource, name=name)
        self.user_inputs[name + ":0"] = handle.name
        whole = tf.raw_ops.ReadVariableOp(
            resource=handle, dtype=variable.get_attr("dtype"))
        rank = len(variable.get_attr("shape").dim)
        local_copies = [copies.op(local, variable)
                        for local in range(len(copies.clones))]
        for local, copy in enumerate(local_copies):
          # TensorFlow may still know a copy by the variable's whole
          # static shape (ZeRO v3 declared it so first).
          part = graph_editor.with_unknown_sizes(shard_slice(
              whole, sharding, local % sharding.group_size, rank))
          writes.append(variable_sync.assign_value(copy, part, None))
        joined = joined_shards(
            [graph_editor.with_unknown_sizes(variable_sync.read_value(copy))
             for copy in local_copies[:sharding.group_size]], sharding)
        back.append(tf.raw_ops.AssignVariableOp(resource=handle,
                                                value=joined))
    self.into_shards, self.into_shards_group = grouped_def(
        graph, writes, _USER + "/group")
    self.into_user, self.into_user_group = grouped_def(
        graph, back, _USER + "/group")
