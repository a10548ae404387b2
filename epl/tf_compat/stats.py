"""TensorFlow's registry of per-op statistics (FLOPs), behind
`tf.compat.v1.profiler`.

Importing this module registers TensorFlow's own FLOPs statistics
(`flops_registry`), which TensorFlow only loads with its profiler.
"""
# First: checks the TensorFlow version before its internals are imported.
from epl.tf_compat import version_check  # noqa: F401  pylint: disable=unused-import
from tensorflow.python.framework import graph_util
from tensorflow.python.framework import ops as _framework_ops
from tensorflow.python.profiler.internal import flops_registry  # pylint: disable=unused-import  (registers TF's FLOPs statistics)

# One statistic of one op: OpStats(statistic type, value).
OpStats = _framework_ops.OpStats


def register_statistics(op_type, statistic_type, function):
  """Registers `function(graph, node_def) -> OpStats` for `op_type`;
  KeyError when one is registered already."""
  _framework_ops.RegisterStatistics(op_type, statistic_type)(function)


def stats_for_node_def(graph, node_def, statistic_type):
  """The OpStats of `node_def` in `graph` (shapes read through
  `graph.get_tensor_by_name(name).get_shape()`)."""
  return _framework_ops.get_stats_for_node_def(graph, node_def,
                                               statistic_type)


def tensor_shape_from_node_def_name(graph, name):
  """The static shape of the tensor `name` (an op name: its output 0)."""
  return graph_util.tensor_shape_from_node_def_name(graph, name)
