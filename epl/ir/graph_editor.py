"""Low-level graph editing: walking, cloning and re-wiring ops.

TensorFlow cannot delete ops, so the rewrite only adds ops and re-wires
inputs. Clones are built from each op's NodeDef: renamed under a prefix,
re-placed, and with inputs remapped to the clones of their producers.
"""
import collections

from tensorflow.core.framework import attr_value_pb2

from epl.ir import capture

_V1_CONTROL_FLOW = frozenset(
    ["Enter", "Exit", "Switch", "Merge", "NextIteration", "RefEnter",
     "RefExit", "RefSwitch", "RefMerge", "RefNextIteration", "LoopCond"])


def input_ops(op):
  """Producers of op's data inputs, then its control inputs."""
  return [t.op for t in op.inputs] + list(op.control_inputs)


def output_ops(op):
  """Consumers of op's outputs, then the ops it is a control input of."""
  return [c for t in op.outputs for c in t.consumers()] + list(
      op._control_outputs)  # pylint: disable=protected-access


def _reachable(roots, neighbours):
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
  return _reachable(roots, input_ops)


def descendants(roots):
  """`roots` and every op that depends on them, through data and control
  edges."""
  return _reachable(roots, output_ops)


def topological_order(ops):
  """`ops` ordered so that every op comes after its inputs among `ops`."""
  by_name = {op.name: op for op in ops}
  pending = {}
  consumers = collections.defaultdict(list)
  for op in ops:
    deps = {i.name for i in input_ops(op) if i.name in by_name}
    pending[op.name] = len(deps)
    for dep in deps:
      consumers[dep].append(op.name)
  ready = sorted((op for op in ops if pending[op.name] == 0),
                 key=lambda o: o._id)  # pylint: disable=protected-access
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
    raise ValueError("The graph to clone has a cycle through %s; TF1 "
                     "while-loops (control flow v1) cannot be replicated." %
                     cyclic)
  return result


def check_cloneable(ops):
  """Raises for ops EPL cannot clone (TF1 control flow)."""
  bad = [op.name for op in ops if op.type in _V1_CONTROL_FLOW]
  if bad:
    raise ValueError(
        "EPL cannot replicate TF1 control-flow ops (%s ...). Build the model "
        "with control flow v2: call tf.compat.v1.enable_control_flow_v2() "
        "before building it (it is the default unless "
        "tf.compat.v1.disable_v2_behavior() was called)." %
        ", ".join(bad[:3]))


def _remap_colocation(attr, name_map, keep_unmapped):
  groups = []
  for entry in attr.list.s:
    target = entry.decode()[len("loc:@"):]
    if target in name_map:
      groups.append(("loc:@" + name_map[target]).encode())
    elif keep_unmapped:
      groups.append(entry)
  return attr_value_pb2.AttrValue(
      list=attr_value_pb2.AttrValue.ListValue(s=groups))


def clone_ops(graph, ops, prefix, device_fn, tensor_map=None):
  """Clones `ops` (topologically ordered) under name prefix `prefix`.

  Inputs produced by cloned ops are wired to the clones; other inputs keep
  the original tensor unless `tensor_map` (tensor name -> tensor) says
  otherwise. Control inputs are remapped the same way. `device_fn(op)`
  gives each clone's device. Colocation with a cloned op follows the clone;
  colocation with an op outside the set is dropped (it would pin the clone
  to the original's device). Resource `shared_name`s are renamed so that a
  cloned variable is a new variable.

  Returns {original op name: clone}.
  """
  tensor_map = dict(tensor_map or {})
  clones = {}
  name_map = {}

  def mapped(tensor):
    clone = clones.get(tensor.op.name)
    if clone is not None:
      return clone.outputs[tensor.value_index]
    return tensor_map.get(tensor.name, tensor)

  with capture.suspended(), graph.as_default(), graph.name_scope(None), \
      graph.control_dependencies(None), \
      graph.colocate_with(None, ignore_existing=True):
    for op in ops:
      name = prefix + op.name
      attrs = {}
      for key, value in op.node_def.attr.items():
        if key == "_class":
          value = _remap_colocation(value, name_map, keep_unmapped=False)
          if not value.list.s:
            continue
        elif key == "shared_name" and value.s:
          value = attr_value_pb2.AttrValue(s=name.encode())
        attrs[key] = value
      clone = graph._create_op_internal(  # pylint: disable=protected-access
          op.type, [mapped(t) for t in op.inputs],
          dtypes=[t.dtype for t in op.outputs],
          input_types=op._input_types,  # pylint: disable=protected-access
          name=name, attrs=attrs, op_def=op.op_def, compute_device=False)
      clone._set_device(device_fn(op))  # pylint: disable=protected-access
      controls = []
      for control in op.control_inputs:
        control_clone = clones.get(control.name)
        controls.append(control_clone if control_clone is not None
                        else control)
      if controls:
        clone._add_control_inputs(controls)  # pylint: disable=protected-access
      clones[op.name] = clone
      name_map[op.name] = clone.name
  return clones


def replace_input_in(consumers, old, new):
  """Every consumer in `consumers` that reads tensor `old` reads `new`."""
  for op in consumers:
    for index, tensor in enumerate(op.inputs):
      if tensor is old or tensor.name == old.name:
        op._update_input(index, new)  # pylint: disable=protected-access


def consumers_of(tensor, among):
  """Ops in the set of names `among` that read `tensor`."""
  return [op for op in tensor.consumers() if op.name in among]


def add_control_inputs(op, controls):
  controls = [c for c in controls if c not in op.control_inputs]
  if controls:
    op._add_control_inputs(controls)  # pylint: disable=protected-access


def remove_control_input(op, control):
  """`op` no longer waits for `control` (its other control inputs stay)."""
  keep = [c for c in op.control_inputs if c is not control]
  if len(keep) == len(op.control_inputs):
    return
  op._remove_all_control_inputs()  # pylint: disable=protected-access
  if keep:
    op._add_control_inputs(keep)  # pylint: disable=protected-access


def set_device(op, device):
  op._set_device(device)  # pylint: disable=protected-access

