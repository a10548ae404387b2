"""ZeRO v3's shards of a traced step run through EPL's engine
(`traced_engine`), and the user's eager variables they stand for.

Under zero.level "v3" the engine's rewrite declares every local replica's
copy of a partitioned variable (a weight, and its optimizer slots) with
its shard's shape, replica 0's copy included: the user's whole eager
variable cannot be that copy. So the `VarHandleOp`s of replica 0's
partitioned variables are not mapped to the user's handles: they are the
rewritten function's own variables (a fixed `shared_name` keeps a
`VarHandleOp`'s value between calls), as the other replicas' copies are.

The user's variables stay the whole truth between calls:

- before every call each shard is written from the user's variable (its
  rows, the last shards padded with zeros), by the rewrite's own
  translation of a whole-value write outside the step
  (`zero_weights.update_after_rewrite`), so an eager write between steps
  (`set_weights`, `assign`, a checkpoint restore, of a weight or a slot)
  reaches every shard;
- after every call the user's variable is written with the shards joined
  (the same translation of a read outside the step), so `get_weights()`,
  `numpy()`, `tf.train.Checkpoint` and `save_weights` see full tensors.

Memory: the user's eager variables keep one full copy of the partitioned
weights and slots (where they were created); the replicas' devices hold
one shard each, and the step gathers a weight just before each use. Each
call also moves every partitioned variable twice (in and out), which a
TF1 graph does not.
"""
import tensorflow as tf

from epl.capture import capture
from epl.parallel import engine
from epl.parallel.passes import variable_sync

_USER = "EPL_TRACED_USER"


def partitioned_names(result):
  """Names of the variable ops (weights and slots) the rewrite `result`
  made shards of (zero.level v3); empty without."""
  weights = result.zero_partition.weights if result.zero_partition else None
  return sorted(weights.shards) if weights else []


def grouped_def(graph, ops, name):
  """A GraphDef of what `ops` need, and the name of the op `name` that
  groups them (what the traced step's transfer functions import)."""
  with graph.as_default(), capture.suspended():
    group = tf.group(ops, name=name)
  return tf.compat.v1.graph_util.extract_sub_graph(
      graph.as_graph_def(), [group.name]), group.name


class ShardTransfers:
  """The graph defs that write each shard of the partitioned variables
  `names` of rewritten `graph` from the user's variable (`into_shards`),
  and the user's variable from the shards joined (`into_user`). Built
  after the step's GraphDef was taken: they are not part of the step.
  `user_inputs`: {the step's input of replica 0's copy of each variable
  (its VarHandleOp, left unmapped): the input of these graph defs the
  user's variable (its handle) is given at}."""

  def __init__(self, graph, names):
    writes, reads, handles = [], [], []
    with graph.as_default(), capture.suspended(), tf.name_scope(_USER):
      for name in names:
        variable = graph.get_operation_by_name(name)
        handle = tf.compat.v1.placeholder(tf.resource, name=name)
        whole = tf.raw_ops.ReadVariableOp(
            resource=handle, dtype=variable.get_attr("dtype"))
        writes.append(variable_sync.assign_value(variable, whole, None))
        reads.append(variable_sync.read_value(variable))
        handles.append(handle)
      # The engine turns each whole-value write of a partitioned variable
      # outside the step into its shards' writes, and each read into the
      # shards joined (fetch substitutes).
      substitutes = engine.before_run(graph)
      back = [tf.raw_ops.AssignVariableOp(
          resource=handle, value=substitutes[read.name])
              for handle, read in zip(handles, reads)]
    self.user_inputs = {name + ":0": handle.name
                        for name, handle in zip(names, handles)}
    self.into_shards, self.into_shards_group = grouped_def(
        graph, [substitutes[write.name] for write in writes],
        _USER + "/group")
    self.into_user, self.into_user_group = grouped_def(
        graph, back, _USER + "/group")
