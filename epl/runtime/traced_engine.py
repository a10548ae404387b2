"""Runs a TF2 train step (a `tf.function`) through EPL's own rewrite: the
passes of `epl.parallel.engine`, as a TF1 graph is rewritten.

The step is traced with every batch argument's first axis unknown (a TF1
script's fed placeholder). Capture tags the traced `FuncGraph`'s ops as it
tags a TF1 graph's (TaskGraph of the scope each op is built in, phase).
The traced `GraphDef` is imported into a plain `tf.Graph`, its copy:

- the placeholder through which the trace captured each of the user's
  variables becomes a `VarHandleOp` of that name: the variable the engine
  replicates, partitions or splits;
- the tags and the recorded gradients go to the copy by op name (import
  keeps names);
- the step's outputs go into EPL's merged collections (a float scalar, a
  mean loss, is averaged over replicas and micro-batches; a tensor of rank
  >= 1 concatenated), as a TF1 script's fetches would be.

The engine rewrites the copy (`engine.ensure_rewritten`). The rewritten
`GraphDef` is then imported into a new `tf.function` at every call: the
user's variables (replica 0's) map to the eager variables' handles, the
argument placeholders to the call's whole batch (the rewrite splits it over
replicas and micro-batches as it splits a fed batch); the copies the
rewrite made of the variables (other replicas') are `VarHandleOp`s with
their own `shared_name`, which persist between calls in the eager
context's resource manager. At the first call they are all copied from
the user's variables; before every call, the trained ones again, so they
follow any write made eagerly between steps (`assign`, `set_weights`, a
checkpoint restore). The optimizer's state of the other replicas is then
their own (under ZeRO, each updates its share).

Before the rewrite, the copy is made to look as a TF1 graph captured by
EPL does: ops built outside every stage scope (the loss after the model,
the function's outputs) are left to the rewrite to place beside their
neighbours; the optimizer's ops are its update (APPLY), as the TF1
optimizer hook tags them; its slots go to the stage of their variable.
(A Keras optimizer's IdentityN of all gradients is bypassed: each update
reads its own gradient, which ZeRO v3 slices for that update alone.) The
backward pass reads each batch argument through an Identity that every
copy of the step makes, so what passes build from those reads read the
copy's part of the batch. Under ZeRO v3, replica 0's shards are the
function's own variables, kept in step with the user's
(`traced_shards`).
"""
import dataclasses
import logging

import tensorflow as tf

from epl import collections as epl_collections
from epl.capture import capture
from epl.ir import control_flow
from epl.ir import graph_editor
from epl.ir.graph_state import GradientRecord, state_of
from epl.ir.phase import Phase
from epl.parallel import engine
from epl.parallel.passes import training_subgraph
from epl.parallel.passes import variable_sync
from epl.runtime import traced_shards
from epl.runtime import traced_whole_batch
from epl.tf_compat import collective_order
from epl.tf_compat import ops as tf_ops

logger = logging.getLogger("epl")
_SYNC = "EPL_TRACED_SYNC"


def _variables_by_placeholder(func_graph):
  """{capture placeholder name: (dtype enum, shape proto, device)} of every
  variable the trace captured (its handle)."""
  found = {}
  for external, internal in func_graph.captures:
    if external.dtype == tf.resource:
      spec = tf_ops.variable_spec(external)
      if spec is not None:
        found[internal.op.name] = spec + (external.device,)
  return found


def _as_variable_node(node, variable):
  """Turns capture placeholder `node` into the VarHandleOp of `variable`
  (dtype, shape, device)."""
  name = node.name
  dtype, shape, device = variable
  node.Clear()
  node.name, node.op, node.device = name, "VarHandleOp", device
  node.attr["dtype"].type = dtype
  node.attr["shape"].shape.CopyFrom(shape)
  node.attr["container"].s = b""
  node.attr["shared_name"].s = ("epl_traced/" + name).encode()


def _graph_copy(concrete, traced, default_strategy):
  """The traced graph as a plain tf.Graph the engine can rewrite, and the
  names of its variable ops that stand for the user's variables."""
  func_graph = concrete.graph
  variables = _variables_by_placeholder(func_graph)
  graph_def = collective_order.drop_chain(func_graph.as_graph_def())
  outputs = {t.op.name for t in func_graph.outputs}
  for node in graph_def.node:
    if node.name in variables:
      _as_variable_node(node, variables[node.name])
    elif node.name in outputs:
      # The function's output waits for every side effect (the update);
      # the rewritten function's own outputs will.
      kept = [i for i in node.input if not i.startswith("^")]
      del node.input[:]
      node.input.extend(kept)
  graph = tf.Graph()
  with graph.as_default(), capture.suspended():
    tf.graph_util.import_graph_def(graph_def, name="")
  state = _tag_copy(graph, state_of(func_graph), default_strategy)
  _batches_through_identity(graph, state, func_graph)
  placeholder_of = {id(external): internal.op.name
                    for external, internal in func_graph.captures}
  state.gradient_records.append(GradientRecord(tuple(
      (graph.get_tensor_by_name(grad.name),
       graph.get_operation_by_name(placeholder_of[id(variable.handle)]))
      for grad, variable in traced.gradients)))
  state.loss_seeds.update(traced.loss_seeds)
  _past_identity_n(graph, state.gradient_records[-1].pairs)
  _tag_updates(graph, state, traced.losses)
  _stage_unscoped_variables(graph, state, variables)
  if not traced.strategies:
    _tag_data_parallel(graph, state, default_strategy)
  return graph, variables


def _past_identity_n(graph, pairs):
  """The readers of a Keras optimizer's IdentityN of all gradients read
  each gradient itself (its k-th output is its k-th input): ZeRO v3
  slices and sums each gradient for its update alone, and an update must
  read it for that (`pairs`: the recorded (gradient, variable) pairs)."""
  gradients = {grad.name for grad, _ in pairs}
  for op in graph.get_operations():
    if op.type == "IdentityN" and any(t.name in gradients for t in op.inputs):
      for passed, output in zip(op.inputs, op.outputs):
        graph_editor.replace_input_in(list(output.consumers()), output,
                                      passed)


def _batches_through_identity(graph, state, func_graph):
  """The backward pass reads each batch argument through an Identity of
  its own, which each replica and micro-batch copies: the rewrite gives
  those copies their part of the batch, so what passes build from the
  backward's reads (ZeRO v3's shard gradients of a first layer's kernel)
  read that part, not the placeholder of the whole batch. (Other readers
  keep reading the placeholder: one outside the step is refused.)"""
  captured = {internal.name for _, internal in func_graph.captures}
  for argument in func_graph.inputs:
    if argument.name in captured or not argument.shape.rank:
      continue
    batch = graph.get_tensor_by_name(argument.name)
    readers = [op for op in batch.consumers()
               if state.phase_of(op) is Phase.BACKWARD]
    if not readers:
      continue
    with graph.as_default(), capture.suspended():
      read = tf.identity(batch, name=batch.op.name + "/backward_read")
    graph_editor.replace_input_in(readers, batch, read)
    state.tag(read.op, None, Phase.BACKWARD)


def _tag_copy(graph, source, default_strategy):
  """Tags the ops of `graph` as GraphState `source` tagged the traced
  graph's ops of the same names, but for ops built outside every stage
  scope (under the default strategy, or none: the loss after the last
  stage, the function's outputs): forward work of no TaskGraph yet, which
  the rewrite settles from their neighbours (`resolve_training_ops`), so
  that the loss joins the last stage instead of making one more."""
  state = state_of(graph, create=True)
  for op in graph.get_operations():
    taskgraph, phase = source.taskgraph_of(op), source.phase_of(op)
    if taskgraph is not None and taskgraph.strategy is default_strategy:
      taskgraph = None
    if taskgraph is not None:
      taskgraph = state.taskgraph_for(taskgraph.strategy)
    state.tag(op, taskgraph,
              Phase.FORWARD if phase is Phase.OTHER else phase)
  # A split head's lowering, for the rewrite's `lower_split`: the roles of
  # its shard index and collectives, and its sharded logits (by name).
  for name, role in source.provenance.roles().items():
    state.provenance.record_role(graph.get_operation_by_name(name), role)
  state.split = dataclasses.replace(
      source.split, logits=dict(source.split.logits),
      predictions=dict(source.split.predictions),
      variables=dict(source.split.variables))
  return state


def _data_ancestors(op):
  """Names of `op` and the ops its data inputs come from (control edges,
  which a traced step adds between all its stateful ops, left out)."""
  seen, pending = set(), [op]
  while pending:
    op = pending.pop()
    if op.name not in seen:
      seen.add(op.name)
      pending.extend(t.op for t in op.inputs)
  return seen


def _tag_updates(graph, state, losses):
  """Tags APPLY what a TF1 graph's optimizer hook would: the variable
  writes that read a gradient or were built outside every scope (a Keras
  optimizer's), and what they read that neither the gradients nor the
  `losses` (names) need (a metric's update reads the loss). A write that
  needs no gradient but a value the forward pass computes (batch norm's
  moving averages read the batch's statistics), built in a stage or in a
  step that opens no scope, is forward state, which the engine averages
  over replicas and micro-batches (`forward_state`)."""
  gradient_ops = [grad.op for record in state.gradient_records
                  for grad, _ in record.pairs]
  gradient_part = set()
  for op in gradient_ops + [graph.get_tensor_by_name(name).op
                            for name in losses]:
    gradient_part |= _data_ancestors(op)
  gradient_names = {op.name for op in gradient_ops}
  computed = {name for name in gradient_part
              if graph.get_operation_by_name(name).type not in (
                  "VarHandleOp", "Placeholder", "ReadVariableOp", "Const")}
  for op in graph.get_operations():
    if not training_subgraph.written_variables(op):
      continue
    needs = _data_ancestors(op)
    if not needs & gradient_names and (
        state.taskgraph_of(op) is not None or needs & computed):
      continue  # a forward state update (moving averages)
    for name in needs - gradient_part:
      update = graph.get_operation_by_name(name)
      if update.type not in ("VarHandleOp", "Placeholder"):
        state.tag(update, None, Phase.APPLY)


def _stage_unscoped_variables(graph, state, variables):
  """Gives each variable first read outside every scope (an optimizer's
  slots) the TaskGraph of the trained variable whose gradient its writes
  read, as a TF1 optimizer colocates a slot with its variable."""
  gradient_stage = {
      grad.op.name: state.taskgraph_of(variable)
      for record in state.gradient_records for grad, variable in record.pairs}
  for name in variables:
    variable = graph.get_operation_by_name(name)
    if state.taskgraph_of(variable) is not None:
      continue
    writers = [c for c in variable.outputs[0].consumers()
               if variable in training_subgraph.written_variables(c)]
    for writer in writers:
      stages = [gradient_stage[n] for n in _data_ancestors(writer)
                if n in gradient_stage]
      if stages:
        state.tag(variable, stages[0], Phase.FORWARD)
        break


def _tag_data_parallel(graph, state, default_strategy):
  """Puts the work of a step that opens no strategy scope, but its update,
  in the TaskGraph of the default strategy (data parallelism), as capture
  tags a TF1 graph built under it."""
  taskgraph = state.taskgraph_for(default_strategy)
  for op in graph.get_operations():
    phase = state.phase_of(op)
    if state.taskgraph_of(op) is None and phase is not Phase.APPLY:
      state.tag(op, taskgraph, phase)


def _merged_outputs(graph, output_names):
  """Puts the tensors the step returns into EPL's merged collections (a
  float scalar averaged, a tensor of rank >= 1 concatenated; another
  scalar is replica 0's); returns the name each output is read from."""
  sources = []
  for name in output_names:
    tensor = graph.get_tensor_by_name(name)
    # A function's output is an Identity that waits for every side effect.
    if tensor.op.type == "Identity":
      tensor = tensor.op.inputs[0]
    if tensor.shape.rank:
      graph.add_to_collection(epl_collections.GraphKeys.GLOBAL_CONCAT_OBJECTS,
                              tensor)
    elif tensor.dtype.is_floating:
      graph.add_to_collection(epl_collections.GraphKeys.GLOBAL_MEAN_OBJECTS,
                              tensor)
    sources.append(tensor.name)
  return sources


def _sync_def(graph, result, names):
  """A GraphDef that copies the user's variables `names` into the copies
  the rewrite made of them (other replicas'), and the name of its group
  op; None when the replicas share those variables (no copies: the
  shared weights of one process's CPU devices)."""
  writes = []
  with graph.as_default(), capture.suspended(), tf.name_scope(_SYNC):
    for local in range(1, len(result.copies.clones)):
      for name in names:
        variable = graph.get_operation_by_name(name)
        copy = result.copies.op(local, variable)
        if copy is not variable:
          writes.append(variable_sync.assign_value(
              copy, variable_sync.read_value(variable), None))
  if not writes:
    return None
  return traced_shards.grouped_def(graph, writes, _SYNC + "/group")


def _run_def(graph, graph_def, fetches):
  """`graph_def` (of `graph`) less the ops a TF1 session would not run
  either: those neither the fetches nor a stateful op needs. A
  tf.function does not leave them out before it checks the frames, and
  some read the micro-batch loop's tensors from outside its frame (the
  gradient of a loss's denominator, which tf.gradients builds and nothing
  reads): ops with inputs from different frames. The v1 loop's own ops
  all stay, so that its contexts come back whole (`_body`)."""
  kept = [op.name for op in graph.get_operations()
          if op.op_def.is_stateful or control_flow.context_of(op) is not None
          or op.type in control_flow.V1_CONTROL_FLOW_TYPES]
  kept += [name.split(":")[0] for name in fetches]
  return tf.compat.v1.graph_util.extract_sub_graph(
      graph_def, sorted(set(kept)))


def _import(graph_def, input_map, return_elements):
  """Imports `graph_def` into the function being traced, mapping only the
  inputs it has (TensorFlow refuses a mapping of an absent one). A
  control input on a mapped op waits for its mapping instead (ZeRO v3's
  prefetching reads wait for the batch), else the unfed placeholder
  would run."""
  names = {node.name for node in graph_def.node}
  mapped = {k: v for k, v in input_map.items() if k.split(":")[0] in names}
  mapped.update({"^" + k.split(":")[0]: v for k, v in list(mapped.items())
                 if k.endswith(":0")})
  return tf.graph_util.import_graph_def(
      graph_def, return_elements=return_elements, name="",
      input_map=mapped)


class EngineStep:
  """A traced step rewritten by EPL's engine, run at every call."""

  def __init__(self, concrete, traced, function_name, default_strategy):
    self._concrete = concrete
    func_graph = concrete.graph
    graph, variables = _graph_copy(concrete, traced, default_strategy)
    self._captured = {internal.name: external
                      for external, internal in func_graph.captures}
    self._arguments = [t.name for t in func_graph.inputs
                       if t.name not in self._captured]
    with graph.as_default():
      sources = _merged_outputs(graph, [t.name for t in func_graph.outputs])
      roots = [graph.get_tensor_by_name(name).op for name in sources]
      roots += [op for op in graph.get_operations()
                if op.op_def.is_stateful]
      readers = traced_whole_batch.read_whole_batch(
          graph, state_of(graph), traced.losses, self._arguments, roots,
          function_name)
      result = engine.ensure_rewritten(graph)
      traced_whole_batch.read_after_every_write(graph)
    if result is None:
      raise ValueError(
          "tf.function %s computes gradients but EPL found no variable "
          "update built from them in its trace: apply the gradients in the "
          "step (optimizer.apply_gradients)." % function_name)
    self._fetches = [getattr(result.substitutes.get(name), "name", name)
                     for name in sources]
    self._rewrite = result
    if readers:
      logger.info(
          "epl: tf.function %s: %d op(s) outside the divided step (%s) read "
          "the whole batch and the divided step's values merged over "
          "replicas and micro-batches", function_name, len(readers),
          ", ".join(readers[:3]))
    # Imported into one tf.function, the collectives stay unchained, as in
    # a TF1 graph.
    self._step_def = _run_def(
        graph, collective_order.unchain(graph.as_graph_def()), self._fetches)
    # The micro-batch loop's v1 contexts, which the import into the
    # function must give back to its ops (`_body`).
    self._step_contexts = control_flow.context_defs(graph)
    sharded = self._shard_transfers(graph, result, function_name)
    # Every copy starts from the user's variable; the trained ones follow
    # it before every call (an eager write between steps). The others (the
    # optimizer's slots) are then the replicas' own: under ZeRO each
    # replica updates the slots of its share of the variables.
    trained = {variable.name for record in state_of(graph).gradient_records
               for _, variable in record.pairs}
    whole = lambda names: [n for n in names if n not in sharded]
    self._first_sync = self._sync_function(graph, result, whole(variables))
    self._sync = self._sync_function(graph, result, whole(trained))
    self._run = tf.function(self._body, autograph=False).get_concrete_function(
        *[tf.TensorSpec(t.shape, t.dtype) for t in (
            func_graph.get_tensor_by_name(n) for n in self._arguments)])
    logger.info("epl: tf.function %s runs as rewritten by EPL's engine: %s",
                function_name, result.plan.describe())

  @property
  def graph_def(self):
    """The rewritten step's GraphDef, which every call imports and runs."""
    return self._step_def

  def _shard_transfers(self, graph, result, function_name):
    """zero.level v3: replica 0's shards are the function's own variables,
    written from the user's before every call and back after it
    (`traced_shards`); returns the names of the partitioned variables."""
    sharded = traced_shards.partitioned_names(result)
    self._sharded_inputs, self._into_shards = {}, None
    if sharded:
      shards = traced_shards.ShardTransfers(graph, sharded)
      self._sharded_inputs = shards.user_inputs
      self._into_shards = self._transfer_function(
          shards.into_shards, shards.into_shards_group)
      self._into_user = self._transfer_function(
          shards.into_user, shards.into_user_group)
      logger.info(
          "epl: tf.function %s: zero.level v3 keeps the shards of %d "
          "variable(s) in the function's own variables; the user's whole "
          "variables are written into them before every call and from "
          "them after it", function_name, len(sharded))
    return sharded

  def _sync_function(self, graph, result, names):
    """The function that copies variables `names` into their replicas'
    copies, or None when they have none."""
    found = _sync_def(graph, result, names)
    if found is None:
      return None
    return self._transfer_function(*found)

  def _transfer_function(self, graph_def, group):
    # Imported into a function, the writes run (automatic control
    # dependencies run every stateful op).
    return tf.function(
        lambda: _import(graph_def, self._inputs(), [group]) and None,
        autograph=False).get_concrete_function()

  def _inputs(self, arguments=()):
    # The traced step's captures (variable handles, constants) enter the
    # function as its own captures.
    inputs = {self._sharded_inputs.get(name, name): tf.identity(external)
              for name, external in self._captured.items()}
    inputs.update(zip(self._arguments, arguments))
    return inputs

  def _body(self, *arguments):
    fetched = _import(self._step_def, self._inputs(arguments), self._fetches)
    control_flow.restore_contexts(tf.compat.v1.get_default_graph(),
                                  self._step_contexts)
    return fetched

  def _check_batch(self, flat_arguments):
    """Raises, before the step runs, for a batch the replicas and
    micro-batches do not divide (the checks a TF1 feed goes through)."""
    result = self._rewrite
    result.manager.run_later("on_feed", result.context, result.artifacts,
                             dict(zip(self._arguments, flat_arguments)))

  def __call__(self, flat_arguments):
    self._check_batch(flat_arguments)
    if self._first_sync is not None:
      self._first_sync()
      self._first_sync = None
    if self._sync is not None:
      self._sync()
    if self._into_shards is not None:
      self._into_shards()
    outputs = self._run(*flat_arguments)
    if self._into_shards is not None:
      self._into_user()
    structure = self._concrete.structured_outputs
    if structure is None:
      return None
    return tf.nest.pack_sequence_as(structure, outputs, expand_composites=True)
