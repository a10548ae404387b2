"""Low-level graph editing: walking, cloning and re-wiring ops.

TensorFlow cannot delete ops, so the rewrite only adds ops and re-wires
inputs. Clones are built from each op's NodeDef: renamed under a prefix,
re-placed, and with inputs remapped to the clones of their producers.
The passes edit graphs through this module (and `control_flow` for v1
loops) only; the edits TensorFlow has no public API for come from
`epl.tf_compat.graph_edit`.
"""
import collections

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from epl.ir import control_flow
from epl.tf_compat import graph_edit
from epl.tf_compat import importer


# Edits in place and facts TensorFlow's public API lacks, as
# epl.tf_compat.graph_edit gives them.
update_input = graph_edit.update_input
set_attr = graph_edit.set_attr
remove_all_control_inputs = graph_edit.remove_all_control_inputs
control_outputs = graph_edit.control_outputs
creation_index = graph_edit.creation_index
is_ref_dtype = graph_edit.is_ref_dtype
declared_input_types = graph_edit.declared_input_types
create_op = graph_edit.create_op
graph_function = graph_edit.graph_function


def input_ops(op):
  """Producers of op's data inputs, then its control inputs."""
  return [t.op for t in op.inputs] + list(op.control_inputs)


def output_ops(op):
  """Consumers of op's outputs, then the ops it is a control input of."""
  return [c for t in op.outputs for c in t.consumers()] + list(
      graph_edit.control_outputs(op))


def reachable(roots, neighbours):
  """`roots` and every op reached from them through `neighbours(op)`."""
  seen = set()
  stack = list(roots)
  result = []
  while stack:
    op = stack.pop()
    if op.name in seen:
      continue
    seen.add(op.name)
    result.append(op)
    stack.extend(neighbours(op))
  return result


def ancestors(roots):
  """`roots` and every op they depend on, through data and control edges."""
  return reachable(roots, input_ops)


def data_ancestor_names(roots):
  """Names of `roots` and of every op their data come from (control
  edges left out: a traced step has them between all its stateful ops)."""
  return {op.name for op in reachable(roots, lambda op: [
      t.op for t in op.inputs])}


def descendants(roots):
  """`roots` and every op that depends on them, through data and control
  edges."""
  return reachable(roots, output_ops)


def topological_order(ops):
  """`ops` ordered so that every op comes after its inputs among `ops`
  (a v1 while-loop's back edge excepted)."""
  by_name = {op.name: op for op in ops}
  pending = {}
  consumers = collections.defaultdict(list)
  for op in ops:
    deps = {i.name for i in control_flow.forward_input_ops(op)
            if i.name in by_name}
    pending[op.name] = len(deps)
    for dep in deps:
      consumers[dep].append(op.name)
  ready = sorted((op for op in ops if pending[op.name] == 0),
                 key=graph_edit.creation_index)
  queue = collections.deque(ready)
  result = []
  while queue:
    op = queue.popleft()
    result.append(op)
    for name in consumers[op.name]:
      pending[name] -= 1
      if pending[name] == 0:
        queue.append(by_name[name])
  if len(result) != len(ops):
    cyclic = sorted(n for n, c in pending.items() if c)[:5]
    raise ValueError("The ops to copy have a cycle through %s (other than "
                     "a while-loop's NextIteration -> Merge back edge); "
                     "EPL can only copy an acyclic graph." % cyclic)
  return result


def _import(graph, graph_def, prefix, input_map):
  """Adds the nodes of `graph_def` to `graph`, named `<prefix><name>`,
  with the devices of their NodeDefs, in one call of TensorFlow's C API.

  Unlike tf.graph_util.import_graph_def, which then runs Python per op
  (device functions, colocation) and would double the cost of a copy, it
  only wraps the new nodes as tf.Operations; they do not go through the
  op-creation hook, so capture does not see them. A name that exists
  already is an error, never silently renamed. Returns the new
  tf.Operations.
  """
  with graph.as_default(), graph.control_dependencies(None), \
      graph.colocate_with(None, ignore_existing=True):
    try:
      return importer.import_nodes(graph, graph_def, prefix.rstrip("/"),
                                   input_map)
    except tf.errors.InvalidArgumentError as e:
      raise ValueError("EPL could not copy ops under %r: %s" %
                       (prefix, e.message)) from e


class Cloner:
  """Makes copies of one set of ops, each with a single graph import.

  The ops' NodeDefs are read once into a template GraphDef: inputs produced
  inside the set stay by name (the import prefixes them, as it prefixes
  `loc:@` colocation groups), data inputs from outside are mapped to their
  tensors, and control inputs from outside (which an import cannot map to
  an op without outputs) are added to each copy afterwards. A copy then
  costs one import (TensorFlow's C API builds every node in one call) plus
  setting each node's device in the template.

  Each copy of a v1 while-loop runs in its own frame: its Enter ops name
  `<prefix><frame>`; the copies get copies of their originals' v1
  control-flow contexts.
  """

  def __init__(self, graph, ops):
    """`ops`: topologically ordered (producers first)."""
    self._graph = graph
    self._ops = list(ops)
    names = {op.name for op in self._ops}
    self._template = graph_pb2.GraphDef()
    self._template.versions.CopyFrom(graph.graph_def_versions)
    self._outside_inputs = {}  # 'name:index' -> tensor outside the set
    self._outside_controls = {}  # op name -> control inputs outside the set
    self._shared_names = []  # nodes that name a resource (variables)
    self._enters = []  # (Enter op name, its frame) of v1 while-loops
    for op in self._ops:
      node = self._template.node.add()
      node.CopyFrom(op.node_def)
      del node.input[:]
      for tensor in op.inputs:
        node.input.append(tensor.name)
        if tensor.op.name not in names:
          self._outside_inputs[tensor.name] = tensor
      for control in op.control_inputs:
        if control.name in names:
          node.input.append("^" + control.name)
        else:
          self._outside_controls.setdefault(op.name, []).append(control)
      if "_class" in node.attr:
        groups = [entry for entry in node.attr["_class"].list.s
                  if entry.decode()[len("loc:@"):] in names]
        if groups:
          node.attr["_class"].list.s[:] = groups
        else:
          del node.attr["_class"]
      if "shared_name" in node.attr and node.attr["shared_name"].s:
        self._shared_names.append(node)
      if op.type in control_flow.ENTER_TYPES:
        self._enters.append((op.name, op.get_attr("frame_name").decode()))
    self._contexts = control_flow.ContextCopier(self._ops)

  def clone(self, prefix, device_fn, tensor_map=None, provenance=None,
            replica=None, micro_batch=None):
    """One copy of the ops, named `<prefix><name>`.

    Inputs produced by copied ops are wired to the copies; other inputs
    keep the original tensor unless `tensor_map` (tensor name -> tensor)
    says otherwise; control inputs likewise (outside ones kept).
    `device_fn(op)` gives each copy's device. Colocation with a copied op
    follows the copy; colocation with an op outside the set is dropped (it
    would pin the copy to the original's device). Resource `shared_name`s
    are renamed to the copy's name, so that a copied variable is a new
    variable. With `provenance` (epl.ir.provenance.Provenance), the copies
    are recorded there as made for `replica` and `micro_batch` (see
    Provenance.record_copies).

    Returns {original op name: copy}.
    """
    if not prefix.endswith("/"):
      raise ValueError("Clone prefix %r must end with '/'." % prefix)
    tensor_map = tensor_map or {}
    names_in_use = importer.names_in_use(self._graph)
    taken = [prefix + node.name for node in self._template.node
             if (prefix + node.name).lower() in names_in_use]
    if taken:
      raise ValueError("EPL cannot copy ops under %r: %s already exist." %
                       (prefix, ", ".join(taken[:3])))
    for node, op in zip(self._template.node, self._ops):
      node.device = device_fn(op)
    for node in self._shared_names:
      node.attr["shared_name"].s = (prefix + node.name).encode()
    input_map = {key: tensor_map.get(key, tensor)
                 for key, tensor in self._outside_inputs.items()}
    new_ops = _import(self._graph, self._template, prefix, input_map)
    clones = {op.name[len(prefix):]: op for op in new_ops}
    if len(clones) != len(self._ops):
      raise ValueError("EPL copied %d ops under %r, expected %d." %
                       (len(clones), prefix, len(self._ops)))
    for name, controls in self._outside_controls.items():
      graph_edit.add_control_inputs(clones[name], controls)
    self._contexts.copy(self._graph, prefix, clones)
    for name, frame in self._enters:
      # The name of the copy of the loop's context. Set after the contexts
      # are copied: importing a context under a scope renames the frame of
      # every Enter its values name, also of another loop's Enter that a
      # gradient loop reads.
      control_flow.set_frame(clones[name], prefix + frame)
    if provenance is not None:
      provenance.record_copies(clones, prefix, replica, micro_batch)
    return clones


def clone_ops(graph, ops, prefix, device_fn, tensor_map=None,
              provenance=None, replica=None, micro_batch=None):
  """One copy of `ops` (topologically ordered): see Cloner.clone.

  To make several copies of the same ops, make one Cloner and call its
  `clone` once per copy: the template is then read only once.
  """
  return Cloner(graph, ops).clone(prefix, device_fn, tensor_map, provenance,
                                  replica, micro_batch)


def replace_input_in(consumers, old, new):
  """Every consumer in `consumers` that reads tensor `old` reads `new`."""
  for op in consumers:
    for index, tensor in enumerate(op.inputs):
      if tensor is old or tensor.name == old.name:
        graph_edit.update_input(op, index, new)


def with_unknown_sizes(tensor):
  """`tensor` (its value, through a PlaceholderWithDefault) with a static
  shape of its rank and unknown sizes.

  TensorFlow refuses to rewire an edge to a tensor whose static shape
  differs from the one it replaces ("Cannot update edge, incompatible
  shapes"), although the consumer's kernel takes any size: a rewrite that
  hands a consumer another size (the rows of every micro-batch, a full
  tensor where one shard flowed) rewires it to this tensor instead. Keeps
  a tensor of unknown rank as it is.
  """
  if tensor.shape.rank is None:
    return tensor
  return tf.compat.v1.placeholder_with_default(
      tensor, [None] * tensor.shape.rank)


def consumers_of(tensor, among):
  """Ops in the set of names `among` that read `tensor`."""
  return [op for op in tensor.consumers() if op.name in among]


def add_control_inputs(op, controls):
  controls = [c for c in controls if c not in op.control_inputs]
  if controls:
    graph_edit.add_control_inputs(op, controls)


def remove_control_input(op, control):
  """`op` no longer waits for `control` (its other control inputs stay)."""
  keep = [c for c in op.control_inputs if c is not control]
  if len(keep) == len(op.control_inputs):
    return
  graph_edit.remove_all_control_inputs(op)
  if keep:
    graph_edit.add_control_inputs(op, keep)


def set_device(op, device):
  graph_edit.set_device(op, device)

