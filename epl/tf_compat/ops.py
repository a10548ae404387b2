"""TensorFlow's private op modules and framework types that EPL builds with.

The public API has no equivalent for these: the V2 collectives with
explicit group and instance keys (`collective_ops`), the generated op
wrappers whose Python names EPL hooks or calls (`gen_*`), the v1 `switch`
(`control_flow_ops`), constant folding of a tensor (`tensor_util`), and the
resource-variable check (`resource_variable_ops`), and whether this
process runs TensorFlow's oneDNN graph rewrites (`_pywrap_util_port`).
EPL's modules import them from here, never from `tensorflow.python`.
"""
# First: checks the TensorFlow version before its internals are imported.
from epl.tf_compat import version_check  # noqa: F401  pylint: disable=unused-import
from tensorflow.python.framework import ops as _framework_ops
from tensorflow.python.framework import tensor_util
from tensorflow.python.ops import collective_ops
from tensorflow.python.ops import control_flow_ops
from tensorflow.python.ops import gen_resource_variable_ops
from tensorflow.python.ops import gen_state_ops
from tensorflow.python.ops import resource_variable_ops
from tensorflow.python.util import _pywrap_util_port

# The type of a tensor made eagerly (a value, not a graph tensor).
EagerTensor = _framework_ops.EagerTensor

__all__ = [
    "EagerTensor", "collective_ops", "control_flow_ops",
    "gen_resource_variable_ops", "gen_state_ops",
    "gradient_registered", "onednn_graph_rewrites", "resource_variable_ops",
    "tensor_util", "variable_spec",
]


def gradient_registered(op_type):
  """Whether a gradient function is registered for `op_type`."""
  try:
    _framework_ops.gradient_registry.lookup(op_type)
  except LookupError:
    return False
  return True


def onednn_graph_rewrites():
  """Whether TensorFlow's oneDNN (MKL) graph rewrites and the oneDNN
  patterns of Grappler's remapper run in this process: on x86 Linux builds
  unless TF_ENABLE_ONEDNN_OPTS=0 (read by TensorFlow at start)."""
  return bool(_pywrap_util_port.IsMklEnabled())


def variable_spec(handle):
  """(dtype, shape) of the variable behind eager resource handle `handle`
  (a traced function's capture of it, even one the trace never read as a
  value: an optimizer slot it only passes to ResourceApplyAdam); None when
  the handle carries no variable's type."""
  data = resource_variable_ops.get_eager_safe_handle_data(handle)
  if data is None or not data.is_set or not data.shape_and_type:
    return None
  first = data.shape_and_type[0]
  return first.dtype, first.shape
