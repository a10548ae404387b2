"""Fetches of tensors merged over replicas (epl.GraphKeys collections)."""
import tensorflow as tf

from epl.ir import graph_editor
from epl.ir import names as epl_names
from epl.parallel.passes import across_workers

# Summary ops: one that records a merged tensor records its merged value.
SUMMARY_TYPES = frozenset([
    "ScalarSummary", "HistogramSummary", "TensorSummary", "TensorSummaryV2",
    "WriteScalarSummary", "WriteHistogramSummary", "WriteSummary"])

# Graph collection of the ops outside the training step that read a merged
# tensor as its merged value (a Keras metric's update reads the model's
# outputs of the whole batch): `read_merged_values`.
MERGED_VALUE_READERS = "epl_merged_value_readers"

MERGES = {
    "global_mean_objects": lambda values: tf.add_n(values) / len(values),
    "global_sum_objects": tf.add_n,
    "global_concat_objects": lambda values: tf.concat(values, 0),
}


def read_merged_values(readers):
  """Makes each op of `readers`, built outside the training step, read the
  merged value of every tensor it reads from a merged collection once EPL
  rewrites the graph (before, it reads the tensor of one replica and
  micro-batch)."""
  for op in readers:
    op.graph.add_to_collection(MERGED_VALUE_READERS, op)


def merge_global_objects(ctx, copies):
  """Builds, for each tensor in GLOBAL_MEAN/SUM/CONCAT_OBJECTS, its merge.

  The merge reads the tensor of every micro-batch of every local replica
  (micro-batch 0 of replicas 0, 1, ..., then micro-batch 1, ...: the order
  in which they read their batches, so concatenation follows the input)
  and is placed with replica 0's copy; when replicas live on several
  workers, the workers' merges are then combined with collectives
  (`across_workers.merge`), so every worker must fetch it in the same
  steps. The `substitutes` it hands on map the user's tensor name to the
  merged tensor, which a session fetch returns in its place, and summary ops
  (`tf.compat.v1.summary.scalar`, ...) of the tensor record the merged
  value, so TensorBoard shows what the script prints, as do the ops
  registered by `read_merged_values`. The user's tensor itself is
  unchanged. When the micro-batches run as a loop, a fetch of
  one of the loop's tensors that the step hands out (the loss, ...)
  returns its value in micro-batch 0 of replica 0.
  """
  substitutes = {}
  readers = {op.name for op in ctx.graph.get_collection(MERGED_VALUE_READERS)}
  for name, values in (copies.loop_values or {}).items():
    # A tensor in the micro-batch loop's frame cannot be fetched: its
    # fetch returns its value in micro-batch 0, as the user's op (micro-
    # batch 0) returns it when the micro-batches are copies.
    substitutes[name] = values[0]
  with ctx.building(epl_names.MERGED_OUTPUTS):
    for key, merge in MERGES.items():
      for tensor in ctx.graph.get_collection(key):
        if not isinstance(tensor, tf.Tensor):
          continue
        values = [copies.tensor(l, copy)
                  for copy in copies.micro_batch_tensors(tensor)
                  for l in range(len(ctx.replicas))]
        with tf.device(tensor.op.device):
          merged = merge(values)
        merged = across_workers.merge(ctx, key, merged,
                                      ctx.taskgraph_index(tensor.op))
        substitutes[tensor.name] = merged
        # Outside the micro-batch loop, readers read its value kept for
        # micro-batch 0 (`accumulation_loop`), which they now read merged.
        read = values[0] if tensor.name in (copies.loop_values or {}) else (
            tensor)
        for reader in read.consumers():
          if reader.type in SUMMARY_TYPES or reader.name in readers:
            graph_editor.replace_input_in([reader], read, merged)
  return {"substitutes": substitutes}
