"""Runs a TF2 train step (a `tf.function`) data parallel by rewriting its
traced graph; a step that opens `epl.replicate` scopes (pipeline stages)
goes to EPL's own engine instead (`epl.runtime.traced_engine`).

When a script calls its `@tf.function` step eagerly under EPL, the step is
traced for one micro-batch of one replica (`Function.get_concrete_function`
with each batch argument's first axis divided: a trace bakes static shapes
into its ops); if tracing recorded gradients (`epl.capture.traced_step`),
the call runs `ReplicatedStep` instead of the traced function. Other
functions run as traced.

- The traced `GraphDef` is cut in two. The *gradient part* is every node the
  recorded gradients need (forward and backward) and the outputs that do
  not wait for the update (the loss); the *update part* is what the
  side effects (the optimizer's writes, its step count, metric updates)
  and the other outputs need beyond it.
- The gradient part is imported once per replica, on that replica's device,
  with the replica's slice of every batch argument (each tensor argument
  of rank >= 1, split along its first axis); with
  `pipeline.num_micro_batch` M > 1, in a loop over the replica's M
  micro-batches. The gradients are averaged (summed on the first replica's
  device, as `LocalCommunicator` and MirroredStrategy do for the devices of
  one process).
- The update part is imported once, with the averaged gradients in place
  of the traced ones. It sees the step on the whole batch: it reads the
  whole batch, and the values of the batch it reads from the gradient part
  (the loss, predictions) merged over the replicas (`_merge`: a float
  scalar averaged, a tensor of rank >= 1 concatenated); so are the step's
  outputs.

Variables stay the user's own, one copy: every replica reads them (the
read runs where the variable lives, so its value is what crosses to a
replica's device, the broadcast half of an all-reduce) and the update runs
once. So `variable.numpy()`, `model.get_weights()`, `tf.train.Checkpoint`
and an eager `assign` between steps see and change the one value every
replica reads, and replicas cannot drift apart. Per-replica copies (the
layout MirroredStrategy uses, and what GPUs of several workers need) are
not made yet.
"""
import logging
import weakref

import numpy as np
import tensorflow as tf

from epl.capture import traced_step
from epl.parallel.ops import split_lowering
from epl.runtime import traced_engine

logger = logging.getLogger("epl")


class NotSupportedInTracedStep(NotImplementedError):
  """A TF2 step uses something EPL does not rewrite in a traced step yet."""


def _node_name(input_name):
  return input_name.lstrip("^").split(":")[0]


def _tensor_name(input_name):
  """A NodeDef input as `import_graph_def` names it ("op:0", "^op")."""
  if input_name.startswith("^") or ":" in input_name:
    return input_name
  return input_name + ":0"


def _closure(nodes, roots, stop):
  """Names of the nodes `roots` need (data and control inputs), without
  crossing the nodes of `stop`."""
  seen, pending = set(), list(roots)
  while pending:
    name = pending.pop()
    if name in seen or name in stop:
      continue
    seen.add(name)
    pending.extend(_node_name(i) for i in nodes[name].input)
  return seen


def _consumers_closure(graph_def, tensor_names):
  """Names of the nodes that read, directly or not, the tensors
  `tensor_names`."""
  consumers = {}
  for node in graph_def.node:
    for source in node.input:
      consumers.setdefault(_node_name(source), []).append(node.name)
  seen, pending = set(), [_node_name(n) for n in tensor_names]
  while pending:
    name = pending.pop()
    if name not in seen:
      seen.add(name)
      pending.extend(consumers.get(name, ()))
  return seen


def _part(graph_def, names, device_of):
  """A GraphDef of the nodes `names` of `graph_def` (its function library
  kept), each placed by `device_of(node)`; colocation with nodes left out
  is dropped."""
  part = tf.compat.v1.GraphDef()
  part.versions.CopyFrom(graph_def.versions)
  part.library.CopyFrom(graph_def.library)
  for node in graph_def.node:
    if node.name not in names:
      continue
    copy = part.node.add()
    copy.CopyFrom(node)
    copy.device = device_of(node)
    if "_class" in copy.attr:
      kept = [c for c in copy.attr["_class"].list.s
              if c.decode().split("@", 1)[-1] in names]
      del copy.attr["_class"]
      if kept:
        copy.attr["_class"].list.s.extend(kept)
  return part


def _import(part, input_map, return_elements, name):
  """Imports `part`, mapping only the inputs it reads (TensorFlow refuses
  a mapping of an input the GraphDef does not have)."""
  reads = set()
  for node in part.node:
    for source in node.input:
      reads.add(_tensor_name(source))
  return tf.graph_util.import_graph_def(
      part, input_map={k: v for k, v in input_map.items() if k in reads},
      return_elements=return_elements, name=name)


def _merge(per_replica):
  """One output of the replicas as the step on the whole batch returns it:
  a float scalar (a mean loss) is the mean of the replicas', a tensor of
  rank >= 1 (per example) their concatenation; another scalar is replica
  0's."""
  first = per_replica[0]
  if first.shape.rank:
    return tf.concat(per_replica, axis=0)
  if first.dtype.is_floating:
    return tf.add_n(per_replica) * (1.0 / len(per_replica))
  return first


def _batch_arguments(graph, captured, function_name):
  """The step's arguments that are not captured values: its batch, which
  must come as tensors."""
  arguments = [t for t in graph.inputs if t.name not in captured]
  if any(t.dtype in (tf.resource, tf.variant) for t in arguments):
    raise NotSupportedInTracedStep(
        "tf.function %s takes an iterator or a dataset and draws its batch "
        "inside (as Keras Model.fit's train function does): EPL divides "
        "a batch over replicas only when the step is given its batch as "
        "tensors (`for x, y in dataset: step(x, y)`); Model.fit and "
        "steps that read an iterator are not supported with eager "
        "execution yet (docs/tf2.md)." % function_name)
  return arguments


def _update_part(graph, nodes, gradient_part, placeholders):
  """The node names run once: what the outputs and the side effects (the
  optimizer's writes) need beyond the gradient part; gradient ops the
  recorded gradients do not need (a gradient of the input) are dropped."""
  effects = [op.name for op in graph.get_operations()
             if op.name not in gradient_part and op.op_def.is_stateful]
  return _closure(
      nodes, effects + [t.op.name for t in graph.outputs] +
      [op.name for op in graph.control_outputs],
      gradient_part | placeholders)


class ReplicatedStep:
  """The rewrite of one traced step over `devices` (one per replica)."""

  def __init__(self, concrete, step, devices, micro_batches, function_name):
    self._concrete = concrete
    self._replicas = len(devices)
    # Each replica's batch is cut into micro_batches, run in a loop.
    self._micro_batches = micro_batches
    graph = concrete.graph
    self._captured = {internal.name: external
                      for external, internal in graph.captures}
    self._arguments = _batch_arguments(graph, self._captured, function_name)
    graph_def = graph.as_graph_def()
    nodes = {node.name: node for node in graph_def.node}
    placeholders = {_node_name(name) for name in self._captured}
    placeholders.update(t.op.name for t in self._arguments)
    gradient_names = [grad.name for grad, _ in step.gradients]
    gradient_part = self._gradient_part(graph, graph_def, nodes,
                                        gradient_names, placeholders)
    _warn_shared_random_numbers(nodes, gradient_part, function_name)
    update_part = _update_part(graph, nodes, gradient_part, placeholders)
    # What the update part reads from the gradient part (replica 0's).
    boundary = set()
    for name in update_part:
      for source in nodes[name].input:
        if _node_name(source) in gradient_part:
          boundary.add(_tensor_name(source))
    self._gradient_names = gradient_names
    self._boundary = sorted(boundary - set(gradient_names))
    # Values of the batch the update part reads (the loss and predictions
    # Keras metrics update with) are merged over the replicas, and it reads
    # the whole batch: it sees the step on the whole batch. The others
    # (variable reads) are equal in every replica: replica 0's.
    from_batch = _consumers_closure(
        graph_def, [t.name for t in self._arguments])
    self._merged_boundary = [
        name for name in self._boundary
        if not name.startswith("^") and _node_name(name) in from_batch]
    self._outputs = [t.name for t in graph.outputs]
    self._gradient_part = gradient_part
    self._graph_def = graph_def
    self._update_def = _part(graph_def, update_part, lambda node: node.device)
    self._devices = list(devices)
    self._graph = graph
    self._run = tf.function(self._body, autograph=False).get_concrete_function(
        *[tf.TensorSpec(self._global_shape(t.shape), t.dtype)
          for t in self._arguments])
    logger.info(
        "epl: tf.function %s is data parallel over %d replicas (%s) x %d "
        "micro-batches (a loop): %d gradients averaged, %d ops a "
        "micro-batch, %d ops of update run once.",
        function_name, self._replicas, ", ".join(self._devices),
        micro_batches, len(gradient_names), len(gradient_part),
        len(update_part))

  def _gradient_part(self, graph, graph_def, nodes, gradient_names,
                     placeholders):
    """The node names every replica runs: what the gradients need, and the
    outputs that do not wait for the update (a loss), which are merged
    (recorded in `self._merged`)."""
    gradient_part = _closure(nodes, [_node_name(n) for n in gradient_names],
                             placeholders)
    # A function's output is an Identity that waits for every side effect
    # (the update); what it returns is its input.
    after_gradients = _consumers_closure(graph_def, gradient_names)
    self._merged = {}
    for output in graph.outputs:
      source = output.op.inputs[0] if output.op.type == "Identity" else output
      needs = _closure(nodes, [source.op.name], placeholders)
      if not needs & after_gradients:
        gradient_part |= needs
        self._merged[output.name] = source.name
    return gradient_part

  def _global_shape(self, replica_shape):
    if not replica_shape.rank or replica_shape[0] is None:
      return replica_shape
    return [replica_shape[0] * self._replicas * self._micro_batches] + (
        replica_shape[1:].as_list())

  def _replica_device(self, replica):
    graph, device = self._graph, self._devices[replica]

    def device_of(node):
      op = graph.get_operation_by_name(node.name)
      # Ops on a variable run where the variable lives (TensorFlow refuses
      # a resource from another device).
      if node.device or any(t.dtype == tf.resource
                            for t in list(op.inputs) + list(op.outputs)):
        return node.device
      return device
    return device_of

  def _inputs(self, captured, arguments):
    return dict(captured, **{
        placeholder.name: argument
        for placeholder, argument in zip(self._arguments, arguments)})

  def _body(self, *arguments):
    # The traced step's captures (variable handles, constants) enter this
    # function as its own captures.
    captured = {name: tf.identity(external)
                for name, external in self._captured.items()}
    slices = []
    for argument in arguments:
      if argument.shape.rank:
        slices.append(tf.split(argument, self._replicas, axis=0))
      else:
        slices.append([argument] * self._replicas)
    # A control input of the update part is an op ("^name" maps to it).
    wanted = self._gradient_names + [
        name.lstrip("^") for name in self._boundary] + sorted(
            set(self._merged.values()))
    replicas = []
    for replica in range(self._replicas):
      part = _part(self._graph_def, self._gradient_part,
                   self._replica_device(replica))
      with tf.device(self._devices[replica]):
        if self._micro_batches == 1:
          found = dict(zip(wanted, _import(
              part, self._inputs(captured, [s[replica] for s in slices]),
              wanted, "EPL_REPLICA_%d" % replica)))
        else:
          found = self._accumulate(part, captured,
                                   [s[replica] for s in slices], wanted,
                                   "EPL_REPLICA_%d" % replica)
      replicas.append(found)
    first = replicas[0]
    means = {}
    with tf.device(self._devices[0]):
      for name in self._gradient_names:
        means[name] = tf.add_n([r[name] for r in replicas]) * (
            1.0 / self._replicas)
    update_inputs = self._inputs(captured, arguments)
    update_inputs.update(means)
    for name in self._boundary:
      if name.startswith("^"):
        # TensorFlow maps a control input to the op of a tensor: one that
        # runs after replica 0's op.
        with tf.control_dependencies([first[name[1:]]]):
          update_inputs[name] = tf.constant(0)
      elif name in self._merged_boundary:
        with tf.device(self._devices[0]):
          update_inputs[name] = _merge([r[name] for r in replicas])
      else:
        update_inputs[name] = first[name]
    in_update = [name for name in self._outputs if name not in self._merged
                 and name not in update_inputs]
    found = _import(self._update_def, update_inputs, in_update, "EPL_UPDATE")
    values = dict(zip(in_update, found))
    with tf.device(self._devices[0]):
      values.update({name: _merge([r[source] for r in replicas])
                     for name, source in self._merged.items()})
    return [values.get(name, update_inputs.get(name))
            for name in self._outputs]

  def _accumulate(self, part, captured, arguments, wanted, name):
    """Runs the gradient part on each micro-batch of a replica's batch in
    a loop (one iteration at a time, so one micro-batch's activations are
    alive at once): the gradients and float scalars of the batch (a mean
    loss) are averaged over the micro-batches; the other values the update
    part reads are the last micro-batch's (variable reads: all equal)."""
    micro = self._micro_batches
    batches = []
    for placeholder, argument in zip(self._arguments, arguments):
      if argument.shape.rank:
        rows = placeholder.shape.as_list()
        batches.append(tf.reshape(argument, [micro] + [
            -1 if size is None else size for size in rows]))
      else:
        batches.append(argument)
    data = [n for n in wanted if not n.startswith("^") and ":" in n]
    merged = set(self._merged.values()) | set(self._merged_boundary)
    averaged = set(self._gradient_names) | {
        n for n in merged
        if self._graph.get_tensor_by_name(n).dtype.is_floating and
        not self._graph.get_tensor_by_name(n).shape.rank}
    initial = []
    for tensor_name in data:
      tensor = self._graph.get_tensor_by_name(tensor_name)
      if (not tensor.shape.is_fully_defined() or
          (tensor_name in merged and tensor_name not in averaged)):
        raise NotSupportedInTracedStep(
            "pipeline.num_micro_batch %d: the step's tensor %s (shape %s) "
            "leaves each micro-batch and is not a gradient or a float "
            "scalar; EPL accumulates only those in a traced TF2 step yet "
            "(docs/tf2.md)." % (micro, tensor_name, tensor.shape))
      initial.append(tf.zeros(tensor.shape, tensor.dtype))

    def body(index, values):
      # The loop's body is a graph of its own: what it reads from outside
      # enters it as its captures.
      inside = {n: tf.identity(t) for n, t in captured.items()}
      found = dict(zip(wanted, _import(
          part, self._inputs(inside, [
              tf.gather(b, index) if b.shape.rank else b for b in batches]),
          wanted, name)))
      return index + 1, [
          value + found[n] if n in averaged else found[n]
          for n, value in zip(data, values)]

    _, values = tf.while_loop(lambda index, _: index < micro, body,
                              [tf.constant(0), initial],
                              parallel_iterations=1)
    found = {n: value * (1.0 / micro) if n in averaged else value
             for n, value in zip(data, values)}
    # The update part's control inputs wait for the whole loop.
    with tf.control_dependencies(values):
      after_loop = tf.no_op()
    found.update({n: after_loop for n in wanted if n not in found})
    return found

  def __call__(self, flat_arguments):
    outputs = self._run(*flat_arguments)
    structure = self._concrete.structured_outputs
    if structure is None:
      return None
    return tf.nest.pack_sequence_as(structure, outputs, expand_composites=True)


_rewritten = weakref.WeakKeyDictionary()


def _flat_tensor_arguments(concrete, args, kwargs):
  """The call's tensors in the order of the traced graph's arguments."""
  specs = tf.nest.flatten(concrete.structured_input_signature,
                          expand_composites=True)
  values = tf.nest.flatten((args, kwargs), expand_composites=True)
  if len(specs) != len(values):
    raise NotSupportedInTracedStep(
        "EPL could not match the arguments of this tf.function call to its "
        "traced signature %s: pass the step its tensors as positional "
        "arguments." % (concrete.structured_input_signature,))
  return [value for value, spec in zip(values, specs)
          if isinstance(spec, tf.TensorSpec)]


def refuse_eager_gradients():
  """Raises for a gradient taken eagerly (outside any tf.function) under
  EPL: such a step would train on one device only."""
  raise NotSupportedInTracedStep(
      "GradientTape.gradient ran eagerly, outside any tf.function: EPL "
      "parallelises a TF2 train step when it is a tf.function (its traced "
      "graph is what EPL rewrites), and would otherwise train on one "
      "device. Decorate the train step with @tf.function (docs/tf2.md).")


def _refuse_unsupported_gradients(step, name):
  if step.unsupported_gradients:
    kind, variable = step.unsupported_gradients[0]
    raise NotSupportedInTracedStep(
        "tf.function %s: the gradient of %s is a %s; EPL averages only "
        "dense gradients taken in the step's own graph yet. Densify a "
        "sparse one in the step (tf.convert_to_tensor(grad)), take the "
        "gradient in the step itself (no jit_compile), or build the step "
        "TF1 style (docs/tf2.md)." % (name, variable, kind))


def _refuse_multi_worker(name, env):
  if env.cluster.is_distributed:
    raise NotSupportedInTracedStep(
        "tf.function %s: a traced TF2 step is parallelised over the "
        "devices of one worker only; this job has %d workers "
        "(docs/tf2.md)." % (name, env.cluster.worker_num))


def _refuse_unsupported(step, name, env):
  """Raises for what the data-parallel rewrite (ReplicatedStep) of a step
  that opens no strategy scope does not do."""
  _refuse_unsupported_gradients(step, name)
  strategy = env.default_strategy
  if strategy is None or strategy.device_count != 1:
    raise NotSupportedInTracedStep(
        "tf.function %s trains under EPL, which rewrites a traced TF2 step "
        "that opens no strategy scope only for data parallelism: call "
        "epl.set_default_strategy(epl.replicate(device_count=1)) after "
        "epl.init() (default strategy now: %r), or open epl.replicate "
        "scopes (pipeline stages) in the step." % (name, strategy))
  _refuse_multi_worker(name, env)
  savers = _memory_savers_asked(env.config)
  if savers:
    raise NotSupportedInTracedStep(
        "tf.function %s: %s asked, but a traced TF2 step that opens no "
        "strategy scope is rewritten for data parallelism only, which "
        "would train without them. Leave them unset for this script, or "
        "build the step TF1 style, where they apply (docs/tf2.md)." % (
            name, ", ".join(savers)))


def _refuse_untrained_split(graph, name):
  """Raises for a traced function that trains nothing but computes a
  split layer: its collectives wait for shards that only the engine's
  rewrite of a training step makes (it would hang until the collective
  timeout)."""
  logits = sorted(split_lowering.sharded_logits_in(graph))
  if logits:
    raise NotSupportedInTracedStep(
        "tf.function %s computes the split layer output %s but trains "
        "nothing: EPL shards a split layer only in a training step (one "
        "that applies gradients). Evaluate outside a tf.function (an eager "
        "model(x) computes the whole layer), or in the training step's own "
        "outputs (docs/tf2.md)." % (name, logits[0]))


def _refuse_in_engine(step, name, env):
  """Raises for what EPL's engine does not do yet for a traced step that
  opens strategy scopes."""
  _refuse_unsupported_gradients(step, name)
  _refuse_multi_worker(name, env)
  # Gradient checkpointing, AMP and ZeRO v0-v3 come through the engine's
  # own passes (tested; v3's shards are the function's own variables,
  # traced_shards); offload and grouped apply are not checked on a traced
  # step yet.
  savers = _memory_savers_asked(env.config, engine=True)
  if savers:
    raise NotSupportedInTracedStep(
        "tf.function %s: %s asked, but they are not built for a traced "
        "TF2 step yet, which would train without them. Leave them unset "
        "for this script, or build the step TF1 style, where they apply "
        "(docs/tf2.md)." % (name, ", ".join(savers)))


def _memory_savers_asked(config, engine=False):
  """The memory-saver settings of `config` that are on, as config keys;
  with `engine`, those the engine's rewrite of a traced step does not
  apply yet."""
  asked = []
  if config.zero.level and not engine:
    asked.append("zero.level %r" % config.zero.level)
  if config.gradient_checkpoint.type and not engine:
    asked.append("gradient_checkpoint.type %r" %
                 config.gradient_checkpoint.type)
  if config.amp.level and not engine:
    asked.append("amp.level %r" % config.amp.level)
  if config.offload.level:
    asked.append("offload.level %r" % config.offload.level)
  if config.optimizer.num_apply_group > 1:
    asked.append("optimizer.num_apply_group %d" %
                 config.optimizer.num_apply_group)
  return asked


def _warn_shared_random_numbers(nodes, gradient_part, name):
  """Warns once per step whose replicas draw random numbers (dropout): each
  replica's copy of a random op draws the same numbers for its slice of the
  batch, where one device draws different ones for every row."""
  random = sorted(n for n in gradient_part if "Random" in nodes[n].op)
  if random:
    logger.warning(
        "epl: tf.function %s draws random numbers in its gradient part (%s): "
        "every replica draws the same ones for its slice of the batch, so "
        "dropout masks repeat across replicas, unlike one device on the "
        "whole batch.", name, ", ".join(random[:3]))


class _Indivisible(Exception):
  """A batch argument whose rows the replicas and micro-batches do not
  divide (an error only when the function is a training step)."""

  def __init__(self, shape, parts):
    super().__init__(shape, parts)
    self.shape, self.parts = shape, parts


def _replica_spec(value, parts):
  """What one micro-batch of one replica is given of an argument: a
  tensor of rank >= 1 is a batch, whose first axis the replicas and their
  micro-batches (`parts` in all) divide. With `parts` None, the first
  axis is left unknown: a TF1 script's fed placeholder, which the engine's
  rewrite splits over its replicas and micro-batches."""
  if not isinstance(value, (tf.Tensor, np.ndarray)) or isinstance(
      value, tf.Variable):
    return value
  shape = tf.TensorShape(value.shape)
  if not shape.rank:
    return tf.TensorSpec(shape, tf.as_dtype(value.dtype))
  rows = shape[0]
  if rows is not None and parts is not None and rows % parts:
    raise _Indivisible(shape, parts)
  return tf.TensorSpec(
      [None if rows is None or parts is None else rows // parts] +
      shape[1:].as_list(), tf.as_dtype(value.dtype))


def call(env, function, original, args, kwargs):
  """Calls `function` (a tf.function called eagerly): its rewrite when its
  trace is a training step, else the traced function itself. The step is
  traced for one micro-batch of one replica: a trace bakes static shapes
  into its ops."""
  replicas = env.cluster.devices_per_worker
  micro_batches = env.config.pipeline.num_micro_batch
  name = getattr(function, "__name__", repr(function))
  try:
    replica_args, replica_kwargs = tf.nest.map_structure(
        lambda value: _replica_spec(value, replicas * micro_batches),
        (args, kwargs))
  except _Indivisible as indivisible:
    # Fine for a function that does not train (an evaluation's last,
    # smaller batch); a training step cannot divide it.
    whole = function.get_concrete_function(*args, **kwargs)
    traced = traced_step.step_of(whole.graph)
    if traced is None:
      _refuse_untrained_split(whole.graph, name)
      return original(function, *args, **kwargs)
    if traced.strategies:
      # The engine divides the batch over its own replicas, and says so
      # when it cannot.
      return _engine_call(env, function, name, args, kwargs)
    raise ValueError(
        "tf.function %s: EPL divides each tensor argument of rank >= 1 (a "
        "batch) over %d replicas x micro-batches along its first axis, but "
        "a batch of shape %s has %d rows. Make the global batch a multiple "
        "of %d (dataset.batch(..., drop_remainder=True))." % (
            name, indivisible.parts, indivisible.shape,
            indivisible.shape[0], indivisible.parts)) from None
  concrete = function.get_concrete_function(*replica_args, **replica_kwargs)
  step = _rewritten.get(concrete.graph)
  if step is None:
    traced = traced_step.step_of(concrete.graph)
    if traced is None:
      _refuse_untrained_split(concrete.graph, name)
      return original(function, *args, **kwargs)
    if traced.strategies:
      return _engine_call(env, function, name, args, kwargs)
    _refuse_unsupported(traced, name, env)
    devices = [env.cluster.device_name(index)
               for index in range(env.cluster.devices_per_worker)]
    step = _rewritten[concrete.graph] = ReplicatedStep(
        concrete, traced, devices, micro_batches, name)
  return step(_flat_tensor_arguments(concrete, args, kwargs))


def opens_strategy_scopes(function, args):
  """Whether tf.function `function`, traced for `args` (a whole batch: the
  trace `_engine_call` makes, kept for the call), is a training step that
  opens strategy scopes, which EPL's engine runs."""
  whole_args = tf.nest.map_structure(
      lambda value: _replica_spec(value, None), args)
  traced = traced_step.step_of(
      function.get_concrete_function(*whole_args).graph)
  return traced is not None and bool(traced.strategies)


def _engine_call(env, function, name, args, kwargs):
  """Calls `function`, a training step that opens strategy scopes, as
  EPL's engine rewrites it (epl.runtime.traced_engine)."""
  whole_args, whole_kwargs = tf.nest.map_structure(
      lambda value: _replica_spec(value, None), (args, kwargs))
  concrete = function.get_concrete_function(*whole_args, **whole_kwargs)
  step = _rewritten.get(concrete.graph)
  if step is None:
    traced = traced_step.step_of(concrete.graph)
    _refuse_in_engine(traced, name, env)
    step = traced_engine.EngineStep(concrete, traced, name,
                                    env.default_strategy)
    if step.whole_batch_readers:
      raise NotSupportedInTracedStep(
          "tf.function %s opens strategy scopes and reads its whole batch "
          "outside the micro-batches of its model (%s: a metric's update, "
          "as a Keras train_step of the model's own makes); EPL's engine "
          "divides the batch among the stages' micro-batches only. Compute "
          "what reads the batch (the loss) in the step itself, keep Keras' "
          "own Model.train_step, or train with a tf.function step in an "
          "eager loop (docs/tf2.md)." % (
              name, ", ".join(step.whole_batch_readers[:3])))
    _rewritten[concrete.graph] = step
  return step(_flat_tensor_arguments(concrete, args, kwargs))
