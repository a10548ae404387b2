"""Adding many nodes to a graph at once, through TensorFlow's C API.

`tf.graph_util.import_graph_def` runs Python per imported op (device
functions, colocation checks), which doubled the cost of a copy of a large
graph; `import_nodes` only asks the C API to add the nodes, then wraps each
new node as a tf.Operation. Keeps every attribute of the NodeDefs as given,
`shared_name` included: a caller that copies variables must rename it.
"""
# pylint: disable=protected-access
# First: checks the TensorFlow version before its internals are imported.
from epl.tf_compat import version_check  # noqa: F401  pylint: disable=unused-import
from tensorflow.python.client import pywrap_tf_session as c_api
from tensorflow.python.framework import c_api_util
from tensorflow.python.framework import importer
from tensorflow.python.framework import ops


def names_in_use(graph):
  """The names of `graph`'s ops and name scopes, lower case -> count (what
  `graph.unique_name` reads)."""
  return graph._names_in_use


def import_nodes(graph, graph_def, prefix, input_map):
  """Adds the nodes of `graph_def` to `graph`, named `<prefix>/<name>`,
  with the devices of their NodeDefs, in one call of the C API; inputs
  named in `input_map` ('name:index' -> tensor) read those tensors.

  Names are never made unique, nor is a taken one refused (the graph then
  holds two nodes of one name and cannot run): check `names_in_use`
  first. A NodeDef TensorFlow
  cannot build raises a tf.errors.OpError. The new ops do not go through
  the graph's
  op-creation hook (`Graph._create_op_helper`): no device function,
  control dependency, colocation or control-flow context applies to them.
  Returns the new tf.Operations.
  """
  options = c_api_util.ScopedTFImportGraphDefOptions()
  # The NodeDefs' devices are the new nodes' requested devices only: with
  # propagate_device_spec they were also their assigned devices, which a
  # GraphDef of the graph, and so a session, take over the requested
  # one, so that a pass that placed a copy again later (offload moves the
  # replicas' updates to the host) changed nothing that runs.
  importer._PopulateTFImportGraphDefOptions(
      options.options, prefix, input_map, return_elements=None,
      validate_colocation_constraints=True, propagate_device_spec=False)
  c_api.TF_ImportGraphDefOptionsSetUniquifyNames(options.options, False)
  with graph._mutation_lock():
    with c_api_util.tf_buffer(graph_def.SerializeToString()) as serialized:
      with graph._c_graph.get() as c_graph:
        results = c_api.TF_GraphImportGraphDefWithResults(
            c_graph, serialized, options.options)
      c_api_util.ScopedTFImportGraphDefResults(results)
    return _wrap_new_operations(graph)


def _wrap_new_operations(graph):
  """Makes the tf.Operation of each node added through the C API.

  What Graph._add_new_tf_operations does, less what cannot apply to nodes
  imported with every scope closed (device functions, control
  dependencies, colocation, v1 control-flow contexts, the op-creation
  hook), which was half the cost of a copy.
  """
  used = graph._names_in_use
  gradient_functions = graph._gradient_function_map
  new_ops = []
  for c_op in graph.new_operations():
    op = ops.Operation._from_c_op(c_op=c_op, g=graph)
    used.setdefault(op.name.lower(), 1)
    if gradient_functions:  # a gradient_override_map is open
      op._gradient_function = gradient_functions.get(op.type)
    new_ops.append(op)
  return new_ops
