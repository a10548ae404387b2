"""Keeping every replica's variables equal to replica 0's outside training.

Initializers and checkpoint restores write the user's (replica 0's)
variables. Wherever such a write is grouped into a larger op (the `init`
op of `global_variables_initializer`, a Saver's `restore_all`, a
Scaffold's init op), the group also copies the new value into every other
replica's copy of the variable, after the write. When replicas live on
several workers, worker 0's value is first broadcast to the other workers
(a collective), so every worker starts from the same weights even when
each ran its own random initializers.
"""
import tensorflow as tf

from epl.capture import capture
from epl.ir import graph_editor
from epl.ir import names
from epl.ir.op_types import VARIABLE_TYPES
from epl.ir.phase import Phase
from epl.parallel.passes import across_workers
from epl.parallel.passes.training_subgraph import written_variables
from epl.tf_compat.ops import gen_resource_variable_ops
from epl.tf_compat.ops import gen_state_ops


def read_value(variable):
  """The value of variable op `variable`, read on its device."""
  with tf.device(variable.device):
    if variable.type == "VarHandleOp":
      return gen_resource_variable_ops.read_variable_op(
          variable.outputs[0], variable.get_attr("dtype"))
    return tf.identity(variable.outputs[0])


def variable_read_by(tensor):
  """The variable op whose value `tensor` is: a resource variable's
  ReadVariableOp, a reference variable's own output or its Identity read;
  None for any other tensor."""
  op = tensor.op
  if op.type == "ReadVariableOp" or (
      op.type == "Identity" and op.inputs and
      graph_editor.is_ref_dtype(op.inputs[0].dtype)):
    op = op.inputs[0].op
  return op if op.type in VARIABLE_TYPES else None


def assign_value(target, value, name):
  """Writes `value` into variable op `target`, on its device; the write."""
  with tf.device(target.device):
    if target.type == "VarHandleOp":
      return gen_resource_variable_ops.assign_variable_op(
          target.outputs[0], value, name=name)
    return gen_state_ops.assign(target.outputs[0], value, name=name).op


class VariableSync:
  """Adds replica copies to groups of variable writes; runs again on new ops.

  Writes EPL built (the rewrite's copies, ZeRO's broadcasts), as the
  graph's provenance tells, are not the user's and are left alone.
  """

  def __init__(self, ctx, step, subgraph, copies, substitutes):
    self._ctx = ctx
    self._subgraph = subgraph
    self._copies_of = copies
    self._substitutes = substitutes
    self._provenance = ctx.state.provenance
    self._variables = {v.name: v for v in subgraph.variables}
    # (writer op name, across workers too) -> copy ops for the other
    # replicas.
    self._copies = {}
    # (group op name, TaskGraph) -> communicator of its broadcasts, so that
    # the broadcasts of one group run in one order on every worker.
    self._broadcasters = {}
    # Ops never to handle (again): groups handled, and the copy ops, which
    # wait for the write they copy.
    self._done = set()
    self._step_updates = {op.name for op in step.updates}
    # Writes outside the step already substituted at fetch time.
    self._substituted = set()

  def _from_worker_zero(self, variable, value, group):
    """Broadcast of worker 0's value to the other workers' replica 0.

    Returns (op, value): on worker 0 the send and `value`; elsewhere the
    write of the received value into the user's variable and that value.
    """
    ctx = self._ctx
    taskgraph = ctx.taskgraph_index(variable)
    key = (group.name, taskgraph)
    communicator = self._broadcasters.get(key)
    if communicator is None:
      communicator = across_workers.leader_communicator(ctx, taskgraph)
      self._broadcasters[key] = communicator
    received = across_workers.broadcast_from_worker_zero(communicator, value)
    if ctx.cluster.worker_index == ctx.plan.device_workers[0][0]:
      return received.op, value
    name = names.replica_prefix(ctx.replicas[0]) + (
        variable.name + "/sync_from_worker_0")
    return assign_value(variable, received, name), received

  def _copy_ops(self, writer, variable, group, across_workers_too=True):
    key = (writer.name, across_workers_too)
    if key in self._copies:
      return self._copies[key]
    ctx = self._ctx
    copies = []
    waiting = {op.name for op in graph_editor.control_outputs(writer)}
    with capture.suspended(), ctx.graph.as_default(), ctx.graph.name_scope(
        None), ctx.graph.control_dependencies([writer]), \
        ctx.graph.colocate_with(None, ignore_existing=True):
      # Replica 0's value, read after the write (a ref variable's value
      # would otherwise be sent before it).
      value = read_value(variable)
      if across_workers_too and across_workers.spans_workers(ctx):
        sync, value = self._from_worker_zero(variable, value, group)
        copies.append(sync)
      for local in range(1, len(ctx.replicas)):
        name = names.replica_prefix(ctx.replicas[local]) + (
            variable.name + "/sync_from_replica_0")
        copies.append(assign_value(self._copies_of.op(local, variable),
                                   value, name))
    self._done.update(op.name for op in graph_editor.control_outputs(writer)
                      if op.name not in waiting)
    self._copies[key] = copies
    return copies

  def _written_variable(self, op):
    """The replicated variable a write outside the training step writes.

    The step's own updates (also those ZeRO moved out of the cloned part)
    and EPL's writes (copies, ZeRO's broadcasts) are not such writes."""
    if (op.name in self._subgraph.cloned_names or
        op.name in self._step_updates or
        self._provenance.built_by_rewrite(op)):
      return None
    for written in written_variables(op):
      variable = self._variables.get(written.name)
      if variable is not None:
        return variable
    return None

  def _substitute_standalone_write(self, writer, variable):
    """A write the user may run by itself (`var.load`, an assign op, Keras
    `set_weights`): fetching it, or its output, runs the copies into this
    worker's other replicas too (the fetch substitutes). Across workers each
    worker runs its own writes: no broadcast, which every worker would
    have to join."""
    ctx = self._ctx
    copies = self._copy_ops(writer, variable, writer, across_workers_too=False)
    if not copies:
      return
    with capture.suspended(), ctx.graph.as_default(), ctx.graph.name_scope(
        "%s/%s" % (names.VARIABLE_SYNC, writer.name)), \
        ctx.graph.control_dependencies(copies):
      self._substitutes[writer.name] = tf.group(copies, name="write")
      for output in writer.outputs:
        self._substitutes[output.name] = tf.identity(output)

  def _new_standalone_writes(self):
    """Writes of replicated variables outside the training step (the
    user's, not EPL's) not substituted yet, in the order they were built."""
    writes = []
    for variable in self._variables.values():
      for op in variable.outputs[0].consumers():
        if (op.name in self._substituted or
            self._written_variable(op) is None or
            self._ctx.state.phase_of(op) in (Phase.APPLY, Phase.BACKWARD)):
          continue
        self._substituted.add(op.name)
        writes.append(op)
    return sorted(writes, key=graph_editor.creation_index)

  def _new_groups(self):
    """Ops with a write to a replicated variable among their control inputs
    that no update handled yet, in the order they were built.

    Found from the variables' writers, so the cost does not grow with the
    ops the rewrite added (replicas, micro-batches).
    """
    groups = {}
    for variable in self._variables.values():
      for writer in variable.outputs[0].consumers():
        if self._written_variable(writer) is None:
          continue
        for group in graph_editor.control_outputs(writer):
          if group.name not in self._done:
            groups[group.name] = group
    return sorted(groups.values(), key=graph_editor.creation_index)

  def update(self):
    """Handles the writes and groups of writes not handled yet (built since
    the last call, or since the rewrite).

    Each op that has a write to a replicated variable among its control
    inputs gets, as further control inputs, the copies of that write into
    the other replicas (and, across workers, the broadcast from worker 0).
    A write outside the training step that the user may run by itself is
    substituted at fetch time by the write and its copies. Does nothing
    with a single replica in the job.
    """
    ctx = self._ctx
    if len(ctx.replicas) <= 1 and not across_workers.spans_workers(ctx):
      return
    for write in self._new_standalone_writes():
      self._substitute_standalone_write(write, self._written_variable(write))
    for group in self._new_groups():
      copies = []
      # By name: a node's control inputs come back in an order that differs
      # between processes, and the broadcasts' collective keys follow it.
      for writer in sorted(group.control_inputs, key=lambda op: op.name):
        variable = self._written_variable(writer)
        if variable is not None:
          copies.extend(self._copy_ops(writer, variable, group))
      graph_editor.add_control_inputs(group, copies)
      self._done.add(group.name)


def sync_variables(ctx, captured_step, subgraph, copies, substitutes):
  """Makes initialisers and restores reach every replica (VariableSync).

  Each group of writes of replica 0's variables built so far also copies
  the new values into the other replicas (across workers, from worker 0
  first); writes the user may run alone are substituted at fetch time.
  Hands on the VariableSync, which runs again before later runs for ops
  built since (`sync_new_writes`), and the substitutes it added to.
  """
  variable_sync = VariableSync(ctx, captured_step, subgraph, copies,
                               substitutes)
  variable_sync.update()
  return {"variable_sync": variable_sync, "substitutes": substitutes}


def sync_new_writes(ctx, variable_sync):  # pylint: disable=unused-argument
  """Before a Session.run: the writes of replicated variables built since
  the rewrite reach every replica (`VariableSync.update`)."""
  variable_sync.update()
