"""A split layer's weights in a traced TF2 step: made shards in its copy.

While a TF2 step is traced, a split layer (a Keras Dense head, MoE
expert einsums inside `epl.split`) reads the user's whole eager weight
and computes with one shard of it (`split_lowering.shard_of_whole`,
recorded with the shard's gradient). Before the engine rewrites the
step's copy (`traced_engine`), `shard_weights` makes each such weight
what a TF1 graph's split weight is:

- its variable op is declared with the shard's shape (the columns of a
  Dense kernel and bias, E / k experts of an expert weight), and so are
  its optimizer slots (the variables of its whole shape that its update
  writes from its gradient: Adam's m and v);
- the step reads that variable where it read the shard, and its update
  reads the shard's gradient where it read the whole one; the slicing
  and the whole gradient are left out of the copy;
- they are recorded as split variables whose shards the step's caller
  writes (`SplitRecords.written_by_caller`), so that the engine's
  `lower_split` makes each replica's copy its shard, with no initializer.

The user's eager variables then stay whole outside the step, kept in
step with the shards by `traced_shards`. Raises for a split weight that
the step also reads outside its split layer (that op would see one
shard), for optimizer state of another shape computed from its gradient
and for an update of it that is not elementwise (Keras' clipnorm): each
would need the whole weight or gradient.
"""
import dataclasses
from typing import Dict

import tensorflow as tf

from epl.ir import graph_editor
from epl.parallel.ops.split_lowering import ShardedVariable
from epl.parallel.passes.training_subgraph import written_variables
from epl.parallel.plan import weight_partition

# Ops between a variable and the value a split layer slices.
_READ_CHAIN_TYPES = ("Identity", "Cast", "ReadVariableOp")


@dataclasses.dataclass
class ShardedWeights:
  """What `shard_weights` made: the edited GraphDef of the copy,
  {whole gradient tensor name: the shard's gradient tensor name}, and
  {variable op name: ShardedVariable} of the weights and their slots."""
  graph_def: object
  gradients: Dict[str, str]
  variables: Dict[str, ShardedVariable]


def _read_chain(tensor):
  """The ops from a variable op to `tensor` (its read, through
  identities and casts), the variable op first."""
  chain = []
  while tensor.op.type in _READ_CHAIN_TYPES:
    chain.insert(0, tensor.op)
    tensor = tensor.op.inputs[0]
  if tensor.op.type != "VarHandleOp" or not chain or (
      chain[0].type != "ReadVariableOp"):
    raise RuntimeError(
        "EPL: a split layer of the traced step sliced %s, which is not a "
        "read of a variable; please report this." % tensor.name)
  return [tensor.op] + chain


def _update_from(gradient):
  """The ops computed from `gradient` (through a Keras optimizer's
  IdentityN of all gradients, only its own output; the IdentityN left
  out), and the names of the tensors that pass the gradient on."""
  ops, passed, pending = {}, set(), [gradient]
  while pending:
    tensor = pending.pop()
    if tensor.name in passed:
      continue
    passed.add(tensor.name)
    for consumer in tensor.consumers():
      if consumer.type == "IdentityN":
        pending.extend(out for t, out in zip(consumer.inputs,
                                             consumer.outputs)
                       if t is tensor)
      else:
        ops[consumer.name] = consumer
        pending.extend(consumer.outputs)
  return list(ops.values()), passed


def _shape(variable):
  return tf.TensorShape(variable.get_attr("shape"))


def _slots(variable, gradient, sharding, trained, shown):
  """The optimizer slots of split `variable`: the untrained variables of
  its shape that ops computed from its `gradient` write. Raises for state
  of another shape written so, and for an update that is not elementwise
  (either would need the whole gradient); `shown`: names for people."""
  update, passed = _update_from(gradient)
  slots = []
  written = {v.name: v for op in update for v in written_variables(op)}
  for name, state in sorted(written.items()):
    if name == variable.name or name in trained:
      continue
    shape = _shape(state)
    if shape == _shape(variable):
      slots.append(state)
    elif shape.rank:
      raise ValueError(
          "The optimizer keeps %s of shape %s for the split weight %s "
          "(shape %s) and computes it from its gradient: EPL shards a "
          "split weight's optimizer state only when it has the weight's "
          "shape (Adam's, SGD's momentum), along axis %d. Use such an "
          "optimizer for a step with epl.split." % (
              shown.get(name, name), shape,
              shown.get(variable.name, variable.name), _shape(variable),
              sharding.axis))
  # What the update reads of the weight and its slots is theirs.
  update += [reader for held in [variable] + slots
             for reader in held.outputs[0].consumers()
             if reader.type == "ReadVariableOp"]
  reasons = weight_partition.not_elementwise(update, variable, passed)
  if reasons:
    raise ValueError(
        "The update of the split weight %s is not elementwise (%s): each "
        "device updates its shard with its shard's gradient alone, so an "
        "update that reads the whole gradient or weight (clipnorm, a "
        "norm) would see one shard. Drop it for this step, or build the "
        "step TF1 style." % (shown.get(variable.name, variable.name),
                             ", ".join(reasons)))
  return slots


def _gradient_parts(graph, gradient, shard_gradients):
  """Those of `shard_gradients` (names) that the whole `gradient` (name)
  is computed from: a shard's gradients of another backward pass (a
  second GradientTape.gradient) are not part of it."""
  sources = graph_editor.data_ancestor_names(
      [graph.get_tensor_by_name(gradient).op])
  parts = [g for g in shard_gradients if g.split(":")[0] in sources]
  if not parts:
    raise RuntimeError(
        "EPL: the gradient %s of a split weight of the traced step does not "
        "come from the shards its split layer took; please report this." %
        gradient)
  return parts


def _refuse_other_uses(variable, chains, slicing, needed, shown):
  """Raises for an op of the step's forward or backward (`needed`) that
  reads `variable` other than through its split layers' `chains` and the
  ops that take its shards (`slicing`); `shown`: the weight's name."""
  readers = list(variable.outputs[0].consumers())
  readers += [c for chain in chains for op in chain[1:]
              for c in op.outputs[0].consumers()]
  allowed = slicing | {op.name for chain in chains for op in chain}
  for reader in readers:
    if reader.name not in allowed and reader.name in needed:
      raise ValueError(
          "Op %r (%s) of the traced step reads the split weight %s outside "
          "its layer in epl.split: EPL keeps one shard of that weight on "
          "each device, so that op would see one shard. Use the weight "
          "only in its split layer (or build the step TF1 style)." % (
              reader.name, reader.type, shown))


def _reference(tensor_name):
  """How a GraphDef input names tensor `tensor_name` ("op" for output 0)."""
  return tensor_name[:-2] if tensor_name.endswith(":0") else tensor_name


def _op_name(reference):
  return reference.lstrip("^").split(":")[0]


class _Edits:
  """Edits of a GraphDef: readers re-pointed, sums added, shapes set, ops
  that lost every reader left out."""

  def __init__(self, graph_def):
    self.graph_def = graph_def
    self._pointed = {}

  def point(self, old, new):
    """The readers of tensor `old` read tensor `new` (those that wait for
    its op wait for `new`'s)."""
    self._pointed[_reference(old)] = _reference(new)
    self._pointed["^" + _op_name(old)] = "^" + _op_name(new)

  def summed(self, name, tensors, dtype):
    """A tensor that sums `tensors` (names), added as `name`; the tensor
    itself when there is one."""
    if len(tensors) == 1:
      return tensors[0]
    node = self.graph_def.node.add()
    node.name, node.op = name, "AddN"
    node.input.extend(_reference(t) for t in tensors)
    node.attr["N"].i = len(tensors)
    node.attr["T"].type = dtype.as_datatype_enum
    return name + ":0"

  def apply(self, shapes, stateless):
    """Re-points the readers, sets the `shapes` ({variable op name:
    TensorShape}) of variables, and leaves out the ops
    named by `stateless` (a predicate) that lost every reader, and what
    only they read."""
    was_read = {_op_name(i) for node in self.graph_def.node
                for i in node.input}
    for node in self.graph_def.node:
      if node.name in shapes:
        node.attr["shape"].shape.CopyFrom(shapes[node.name].as_proto())
      pointed = [self._pointed.get(i, i) for i in node.input]
      del node.input[:]
      node.input.extend(pointed)
    readers = {}
    inputs = {node.name: [_op_name(i) for i in node.input]
              for node in self.graph_def.node}
    for names in inputs.values():
      for name in names:
        readers[name] = readers.get(name, 0) + 1
    pending = [name for name in inputs if name in was_read and
               not readers.get(name) and stateless(name)]
    dead = set()
    while pending:
      name = pending.pop()
      if name in dead:
        continue
      dead.add(name)
      for read in inputs[name]:
        readers[read] -= 1
        if not readers[read] and stateless(read):
          pending.append(read)
    kept = [node for node in self.graph_def.node if node.name not in dead]
    del self.graph_def.node[:]
    self.graph_def.node.extend(kept)


def _by_variable(graph, records, shown):
  """The TracedShard `records` by variable op name: {name: [(its read
  chain, the shard's tensor name)]}, {name: its ShardedVariable}, {name:
  [its shard gradients' names]}. Raises for a weight cut in two ways."""
  chains, shardings, gradients = {}, {}, {}
  for shard_name, record in records.items():
    chain = _read_chain(graph.get_tensor_by_name(record.whole))
    variable = chain[0]
    if shardings.setdefault(variable.name, record.sharding) != (
        record.sharding):
      raise ValueError(
          "The split weight %s is cut in two ways in the traced step (%s "
          "and %s): use one split layer per weight." % (
              shown.get(variable.name, variable.name),
              shardings[variable.name], record.sharding))
    chains.setdefault(variable.name, []).append((chain, shard_name))
    gradients.setdefault(variable.name, []).extend(record.gradients)
  return chains, shardings, gradients


def shard_weights(graph, graph_def, records, trained, roots, shown):
  """Makes the weights the split layers of a traced step sliced shards
  of their own in `graph_def` (what `graph`, the copy, was imported
  from). `records`: {shard tensor name: TracedShard} of the trace;
  `trained`: {variable op name: its whole gradient tensor name};
  `roots`: names of the tensors the step computes (losses, outputs);
  `shown`: {variable op name: the user's name of its variable}.
  Returns ShardedWeights, or None without split layers."""
  if not records:
    return None
  chains, shardings, gradients = _by_variable(graph, records, shown)
  needed = graph_editor.data_ancestor_names(
      [graph.get_tensor_by_name(n).op for n in roots] +
      [graph.get_tensor_by_name(g).op for g in trained.values()])
  edits = _Edits(graph_def)
  shapes, variables, renamed = {}, {}, {}
  for name, sharding in shardings.items():
    variable = graph.get_operation_by_name(name)
    shards = [graph.get_tensor_by_name(n) for _, n in chains[name]]
    _refuse_other_uses(
        variable, [c for c, _ in chains[name]],
        graph_editor.data_ancestor_names([t.op for t in shards]), needed,
        shown.get(name, name))
    for chain, shard_name in chains[name]:
      edits.point(shard_name, chain[-1].outputs[0].name)
    sharded = [variable]
    if name in trained:
      shard_gradient = edits.summed(
          name + "/shard_gradient_sum",
          _gradient_parts(graph, trained[name], gradients[name]),
          variable.get_attr("dtype"))
      renamed[trained[name]] = shard_gradient
      edits.point(trained[name], shard_gradient)
      sharded += _slots(variable, graph.get_tensor_by_name(trained[name]),
                        sharding, trained, shown)
    for op in sharded:
      shape = _shape(op).as_list()
      shape[sharding.axis] = sharding.columns
      shapes[op.name] = tf.TensorShape(shape)
      variables[op.name] = sharding

  def stateless(op_name):
    try:
      op = graph.get_operation_by_name(op_name)
    except KeyError:  # a sum added here
      return False
    return op.type != "Placeholder" and not op.op_def.is_stateful
  edits.apply(shapes, stateless)
  return ShardedWeights(graph_def, renamed, variables)
