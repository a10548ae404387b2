"""The original EPL's `epl.profiler.profiler`: FLOPs and bytes of every op
of the default graph, before anything runs."""
import tensorflow as tf

from epl.parallel.cost import flops
from epl.tools import memory_estimate
from epl.ir.op_types import INPUT_READ_TYPES


def _shaped_graph(is_shape_unknown):
  """The default graph; with `is_shape_unknown`, a copy whose shapes
  TensorFlow inferred again with the input's unknown batch dimension set to
  the input pipeline's batch size (when its batching datasets agree on
  one)."""
  graph = tf.compat.v1.get_default_graph()
  if not is_shape_unknown:
    return graph
  batch_size = memory_estimate.dataset_batch_size(graph)
  if batch_size is None:
    return graph
  reads = [op for op in graph.get_operations() if op.type in INPUT_READ_TYPES]
  return memory_estimate.with_batch_size(graph, reads, batch_size)


def profile_flops(is_shape_unknown=True):
  """{op name: FLOPs} of every op of the default graph; dimensions still
  unknown count 1."""
  return flops.profile_flops(_shaped_graph(is_shape_unknown))


def profile_memory(is_shape_unknown=True):
  """{tensor name: bytes} of every output of the default graph whose shape
  is known."""
  graph = _shaped_graph(is_shape_unknown)
  return {t.name: flops.tensor_bytes(t) for op in graph.get_operations()
          for t in op.outputs if t.shape.is_fully_defined()}
