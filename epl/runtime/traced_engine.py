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
their own `shared_name`, on their replica's device, which persist between
calls in the eager context's resource manager. At the first call they are all copied from
the user's variables; before every call, the trained ones again, so they
follow any write made eagerly between steps (`assign`, `set_weights`, a
checkpoint restore). The optimizer's state of the other replicas is then
their own (under ZeRO, each updates its share). In a multi-worker job
the first call writes worker 0's values into every worker's variables
before that (`traced_workers`).

Before the rewrite, the copy is made to look as a TF1 graph captured by
EPL does: ops built outside every stage scope (the loss after the model,
the function's outputs) are left to the rewrite to place beside their
neighbours; the optimizer's ops are its update (APPLY), as the TF1
optimizer hook tags them; its slots go to the stage of their variable.
(A Keras optimizer's IdentityN of all gradients is bypassed: each update
reads its own gradient, which ZeRO v3 slices for that update alone.) The
backward pass reads each batch argument through an Identity that every
copy of the step makes, so what passes build from those reads read the
copy's part of the batch. A split layer's weights become variables of
the shard's shape in the copy (`traced_split_weights`); under ZeRO v3,
and for those, every replica's shards are the function's own variables,
kept in step with the user's whole ones (`traced_shards`).
"""
import dataclasses
import itertools
import logging

import tensorflow as tf

from epl import collections as epl_collections
from epl.capture import capture
from epl.env import Env
from epl.ir import control_flow
from epl.ir import graph_editor
from epl.ir.graph_state import GradientRecord, state_of
from epl.ir.phase import Phase
from epl.parallel import engine
from epl.parallel.passes import training_subgraph
from epl.parallel.plan import planner
from epl.parallel.passes import variable_sync
from epl.runtime import failures
from epl.runtime import traced_shards
from epl.runtime import traced_split_weights
from epl.runtime import traced_whole_batch
from epl.runtime import traced_workers
from epl.tf_compat import collective_order
from epl.tf_compat import ops as tf_ops

logger = logging.getLogger("epl")
_SYNC = "EPL_TRACED_SYNC"
# Numbers the rewritten steps of the process: each one's resources (the
# replicas' copies and shards, loss-scale state) live under its own.
_STEP_NUMBERS = itertools.count()


def _variables_by_placeholder(func_graph):
  """{capture placeholder name: (dtype enum, shape proto)} of every
  variable the trace captured (its handle)."""
  found = {}
  for external, internal in func_graph.captures:
    if external.dtype == tf.resource:
      spec = tf_ops.variable_spec(external)
      if spec is not None:
        found[internal.op.name] = spec
  return found


def _user_names(func_graph):
  """{capture placeholder name: the name of the user's variable it
  stands for} (what EPL's messages call it)."""
  names = {id(v.handle): v.name for v in func_graph.variables}
  return {internal.op.name: names[id(external)]
          for external, internal in func_graph.captures
          if id(external) in names}


def _as_variable_node(node, variable):
  """Turns capture placeholder `node` into the VarHandleOp of `variable`
  (dtype, shape), placed by the rewrite: the device eager execution gave
  the user's variable is no choice of the script (on CPU the rewrite
  would keep it for every replica's copy, as a TF1 script's deliberate
  host placement), and replica 0's copy is the user's variable itself."""
  name = node.name
  dtype, shape = variable
  node.Clear()
  node.name, node.op = name, "VarHandleOp"
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
  graph = _imported(graph_def)
  placeholder_of = {id(external): internal.op.name
                    for external, internal in func_graph.captures}
  split = traced_split_weights.shard_weights(
      graph, graph_def, state_of(func_graph).split.traced_shards,
      {placeholder_of[id(variable.handle)]: grad.name
       for grad, variable in traced.gradients},
      sorted(traced.losses) + [t.name for t in func_graph.outputs],
      _user_names(func_graph))
  if split is not None:
    graph = _imported(split.graph_def)
  renamed = split.gradients if split is not None else {}
  state = _tag_copy(graph, state_of(func_graph), default_strategy)
  if split is not None:
    state.split.variables.update(split.variables)
    state.split.written_by_caller.update(split.variables)
  _batches_through_identity(graph, state, func_graph)
  state.gradient_records.append(GradientRecord(tuple(
      (graph.get_tensor_by_name(renamed.get(grad.name, grad.name)),
       graph.get_operation_by_name(placeholder_of[id(variable.handle)]))
      for grad, variable in traced.gradients)))
  state.loss_seeds.update(traced.loss_seeds)
  _past_identity_n(graph, state.gradient_records[-1].pairs)
  _tag_updates(graph, state, traced.losses)
  _stage_unscoped_variables(graph, state, variables)
  if not traced.strategies:
    _tag_data_parallel(graph, state, default_strategy)
  return graph, variables


def _imported(graph_def):
  """A tf.Graph of `graph_def`, its names kept."""
  graph = tf.Graph()
  with graph.as_default(), capture.suspended():
    tf.graph_util.import_graph_def(graph_def, name="")
  return graph


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
  # (Ops a split weight's shard no longer needs were left out of the copy:
  # traced_split_weights.)
  names = {op.name for op in graph.get_operations()}
  for name, role in source.provenance.roles().items():
    if name in names:
      state.provenance.record_role(graph.get_operation_by_name(name), role)
  state.split = dataclasses.replace(
      source.split, logits=dict(source.split.logits),
      predictions=dict(source.split.predictions),
      variables=dict(source.split.variables), traced_shards={},
      written_by_caller=set())
  return state


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
    gradient_part |= graph_editor.data_ancestor_names([op])
  gradient_names = {op.name for op in gradient_ops}
  computed = {name for name in gradient_part
              if graph.get_operation_by_name(name).type not in (
                  "VarHandleOp", "Placeholder", "ReadVariableOp", "Const")}
  for op in graph.get_operations():
    if not training_subgraph.written_variables(op):
      continue
    needs = graph_editor.data_ancestor_names([op])
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
      stages = [gradient_stage[n]
                for n in graph_editor.data_ancestor_names([writer])
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


def _sync_def(graph, result, names, from_worker_zero=()):
  """A GraphDef that copies the user's variables `names` into the copies
  the rewrite made of them (other replicas'), and the name of its group
  op; None when there is nothing to write (the replicas share those
  variables: the shared weights of one process's CPU devices). In a
  multi-worker job, worker 0's values of the user's variables
  `from_worker_zero` are first broadcast into every worker's
  (`traced_workers`)."""
  writes, values = traced_workers.broadcast_into_user_variables(
      result.context, from_worker_zero)
  with graph.as_default(), capture.suspended(), tf.name_scope(_SYNC):
    for local in range(1, len(result.copies.clones)):
      for name in names:
        variable = graph.get_operation_by_name(name)
        copy = result.copies.op(local, variable)
        if copy is not variable:
          value = values.get(name)
          if value is None:
            value = variable_sync.read_value(variable)
          writes.append(variable_sync.assign_value(copy, value, None))
  if not writes:
    return None
  return traced_shards.grouped_def(graph, writes, _SYNC + "/group")


def _argument_readers(graph, names, arguments):
  """The ops of `names` that read the rows of a batch argument (of
  `arguments`, names), not only its shape (Keras weighs its loss tracker
  by the batch's row count)."""
  return [name for name in names
          if graph.get_operation_by_name(name).type != "Shape" and any(
              t.name in arguments
              for t in graph.get_operation_by_name(name).inputs)]


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


def _own_resources(graph_def, namespace):
  """A copy of `graph_def` whose resources (every op with a `shared_name`)
  are named under `namespace`. The eager runtime keeps a function's
  resources by name for the whole process, and two traced steps' rewrites
  name their copies alike (`EPL_REPLICA_1/Adam/...` for two models' Adam
  optimizers): without it, one step would read and update the other's
  replicas' optimizer slots."""
  own = tf.compat.v1.GraphDef()
  own.CopyFrom(graph_def)
  for node in own.node:
    shared_name = node.attr["shared_name"].s if "shared_name" in node.attr \
        else b""
    if shared_name:
      node.attr["shared_name"].s = namespace.encode() + shared_name
  return own


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

  def __init__(self, concrete, traced, function_name, default_strategy,
               check_plan=None):
    """`check_plan(plan, names)`, when given, raises for a plan of the
    step that is not run (before the rewrite); `names`: the ops outside
    the divided step that read a batch argument's rows whole."""
    self._concrete = concrete
    self._namespace = "epl_step_%d/" % next(_STEP_NUMBERS)
    func_graph = concrete.graph
    graph, variables = _graph_copy(concrete, traced, default_strategy)
    self._captured = {internal.name: external
                      for external, internal in func_graph.captures}
    self._arguments = [t.name for t in func_graph.inputs
                       if t.name not in self._captured]
    sources, readers, result = self._rewritten(
        graph, [t.name for t in func_graph.outputs], traced.losses,
        function_name, check_plan)
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
    self._step_def = _own_resources(_run_def(
        graph, collective_order.unchain(graph.as_graph_def()), self._fetches),
                                    self._namespace)
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
    kept_whole = whole(variables)
    # In a multi-worker job worker 0's values reach every worker first.
    self._first_sync = self._sync_function(graph, result, kept_whole,
                                           from_worker_zero=kept_whole)
    self._sync = self._sync_function(graph, result, whole(trained))
    self._run = tf.function(self._body, autograph=False).get_concrete_function(
        *[tf.TensorSpec(t.shape, t.dtype) for t in (
            func_graph.get_tensor_by_name(n) for n in self._arguments)])
    logger.info("epl: tf.function %s runs as rewritten by EPL's engine: %s",
                function_name, result.plan.describe())

  def _rewritten(self, graph, outputs, losses, function_name, check_plan):
    """Rewrites the copy `graph` of the step whose outputs and losses are
    `outputs` and `losses` (names); returns (the names the outputs are
    read from, the ops outside the divided step, the RewriteResult)."""
    with graph.as_default():
      sources = _merged_outputs(graph, outputs)
      roots = [graph.get_tensor_by_name(name).op for name in sources]
      roots += [op for op in graph.get_operations()
                if op.op_def.is_stateful]
      readers = traced_whole_batch.read_whole_batch(
          graph, state_of(graph), losses, self._arguments, roots,
          function_name)
      plan = planner.plan_of(graph)
      if check_plan is not None and plan is not None:
        check_plan(plan, _argument_readers(graph, readers, self._arguments))
      result = engine.ensure_rewritten(graph)
      traced_whole_batch.read_after_every_write(graph)
    if result is None:
      raise ValueError(
          "tf.function %s computes gradients but EPL found no variable "
          "update built from them in its trace: apply the gradients in the "
          "step (optimizer.apply_gradients)." % function_name)
    return sources, readers, result

  @property
  def graph_def(self):
    """The rewritten step's GraphDef, which every call imports and runs."""
    return self._step_def

  def _shard_transfers(self, graph, result, function_name):
    """The variables the rewrite made shards of (zero.level v3's, a split
    layer's): every replica's shards are the function's own variables,
    written from the user's before every call and back after it
    (`traced_shards`); returns their names."""
    sharded = traced_shards.sharded_variables(result)
    self._sharded_inputs, self._into_shards = {}, None
    if sharded:
      shown = _user_names(self._concrete.graph)
      shards = traced_shards.ShardTransfers(graph, result.copies, sharded)
      self._sharded_inputs = shards.user_inputs
      self._into_shards = self._transfer_function(
          shards.into_shards, shards.into_shards_group)
      self._into_user = self._transfer_function(
          shards.into_user, shards.into_user_group)
      logger.info(
          "epl: tf.function %s keeps %d variable(s) in shards, one on each "
          "replica's device (the function's own variables: %s); the user's "
          "whole variables are written into them before every call and "
          "from them after it", function_name, len(sharded),
          ", ".join(sorted("%s %s (axis %d of %d)" % (
              shown.get(name, name),
              tf.TensorShape(graph.get_operation_by_name(name).get_attr(
                  "shape")), sharding.axis, sharding.full_size)
                           for name, sharding in sharded.items())))
    return sharded

  def _sync_function(self, graph, result, names, from_worker_zero=()):
    """The function that copies variables `names` into their replicas'
    copies (after worker 0's values of `from_worker_zero` reached every
    worker), or None when there is nothing to write."""
    found = _sync_def(graph, result, names, from_worker_zero)
    if found is None:
      return None
    return self._transfer_function(*found)

  def _transfer_function(self, graph_def, group):
    # Imported into a function, the writes run (automatic control
    # dependencies run every stateful op).
    graph_def = _own_resources(graph_def, self._namespace)
    return tf.function(
        lambda: _import(graph_def, self._transfer_inputs(), [group]) and None,
        autograph=False).get_concrete_function()

  def _transfer_inputs(self):
    """The captures of a transfer function: every variable handle, a
    sharded variable's at its input for the user's variable."""
    return {self._sharded_inputs.get(name, name): tf.identity(external)
            for name, external in self._captured.items()}

  def _step_inputs(self, arguments):
    """The step's inputs: the traced step's captures (variable handles,
    constants) as the function's own captures, but the user's sharded
    variables (the step reads its own shards of them), and the call's
    arguments."""
    inputs = {name: tf.identity(external)
              for name, external in self._captured.items()
              if name not in self._sharded_inputs}
    inputs.update(zip(self._arguments, arguments))
    return inputs

  def _body(self, *arguments):
    fetched = _import(self._step_def, self._step_inputs(arguments),
                      self._fetches)
    control_flow.restore_contexts(tf.compat.v1.get_default_graph(),
                                  self._step_contexts)
    return fetched

  @property
  def function(self):
    """The concrete function that runs the rewritten step (to inspect:
    its graph holds the step's own variables, the replicas' copies and
    shards, and captures the user's variables it reads)."""
    return self._run

  def _check_batch(self, flat_arguments):
    """Raises, before the step runs, for a batch the replicas and
    micro-batches do not divide (the checks a TF1 feed goes through)."""
    result = self._rewrite
    result.manager.run_later("on_feed", result.context, result.artifacts,
                             dict(zip(self._arguments, flat_arguments)))

  def __call__(self, flat_arguments):
    self._check_batch(flat_arguments)
    try:
      outputs = self._synced_run(flat_arguments)
    except tf.errors.OpError as error:
      # A lost peer of a multi-worker job: one error naming the worker.
      clear = failures.explain(Env.get(), error)
      if clear is None:
        raise
      raise clear from error
    structure = self._concrete.structured_outputs
    if structure is None:
      return None
    return tf.nest.pack_sequence_as(structure, outputs, expand_composites=True)

  def _synced_run(self, flat_arguments):
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
    return outputs
