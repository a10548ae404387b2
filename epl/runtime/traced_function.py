"""Runs a TF2 train step (a `tf.function`) as EPL's engine rewrites its
traced graph (`epl.runtime.traced_engine`): the passes a TF1 graph goes
through, data parallel or in pipeline stages, with micro-batches, GC,
AMP and ZeRO.

When a script calls its `@tf.function` step eagerly under EPL, the step is
traced with each batch argument's first axis unknown (a TF1 script's fed
placeholder, which the rewrite splits over replicas and micro-batches);
if tracing recorded gradients (`epl.capture.traced_step`), the call runs
the rewritten step instead of the traced function. Other functions (an
evaluation) run as traced. A step that opens no strategy scope runs under
the default strategy, which must then be `epl.replicate(device_count=1)`:
data parallelism over every device of the worker (of every worker, in a
multi-worker job: `traced_workers`).
"""
import weakref

import numpy as np
import tensorflow as tf

from epl.capture import traced_step
from epl.parallel.ops import split_lowering
from epl.runtime import traced_engine
from epl.runtime import traced_workers


class NotSupportedInTracedStep(NotImplementedError):
  """A TF2 step uses something EPL does not rewrite in a traced step yet."""


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


def _refuse_across_workers(name, env):
  """Returns the check of a multi-worker job's plan for the traced step
  (`traced_workers.refuse`, before the rewrite), None on one worker."""
  if not env.cluster.is_distributed:
    return None

  def check(plan, whole_batch_readers):
    reason = traced_workers.refuse(plan, env.config, name,
                                   whole_batch_readers)
    if reason is not None:
      raise NotSupportedInTracedStep(reason)
  return check


def _refuse_without_default_replicate(name, env):
  """Raises for a training step that opens no strategy scope when the
  default strategy is not one replica a device (data parallelism)."""
  strategy = env.default_strategy
  if strategy is None or strategy.device_count != 1:
    raise NotSupportedInTracedStep(
        "tf.function %s trains under EPL and opens no strategy scope, so "
        "it runs under the default strategy, which must be data "
        "parallelism: call epl.set_default_strategy(epl.replicate("
        "device_count=1)) after epl.init() (default strategy now: %r), or "
        "open epl.replicate scopes (pipeline stages) in the step." % (
            name, strategy))


def _refuse_iterator_arguments(concrete, name):
  """Raises for a step given an iterator or a dataset, whose batch the
  rewrite cannot divide: it is drawn inside."""
  captured = {internal.name for _, internal in concrete.graph.captures}
  if any(t.dtype in (tf.resource, tf.variant)
         for t in concrete.graph.inputs if t.name not in captured):
    raise NotSupportedInTracedStep(
        "tf.function %s takes an iterator or a dataset and draws its batch "
        "inside (as Keras Model.fit's own train function does): EPL "
        "divides a batch over replicas only when the step is given its "
        "batch as tensors (`for x, y in dataset: step(x, y)`) (docs/"
        "tf2.md)." % name)


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
  """Raises for what EPL's engine does not do yet for a traced step."""
  _refuse_unsupported_gradients(step, name)
  # Gradient checkpointing, AMP, ZeRO v0-v3 and offload come through the
  # engine's own passes (tested; v3's shards are the function's own
  # variables, traced_shards).
  _refuse_grouped_apply(name, env.config)


def _refuse_grouped_apply(name, config):
  """optimizer.num_apply_group groups an update while a
  tf.compat.v1.train.Optimizer's apply_gradients builds it
  (`grouped_apply`); no pass of the engine groups an update already
  built, and a traced step's is a Keras optimizer's."""
  if config.optimizer.num_apply_group > 1:
    raise NotSupportedInTracedStep(
        "tf.function %s: optimizer.num_apply_group %d asked, but EPL groups "
        "an update only while a tf.compat.v1.train.Optimizer's "
        "apply_gradients builds it in a TF1 graph (the groups one after "
        "another); the update of a traced TF2 step is a Keras optimizer's, "
        "built whole, which no pass of EPL's engine cuts into groups, so "
        "the step would apply every variable at once. Leave it unset for "
        "this script, or build the step TF1 style (docs/tf2.md)." % (
            name, config.optimizer.num_apply_group))


def _whole_batch_spec(value):
  """What the step is traced for of an argument: a tensor of rank >= 1 is
  a batch, its first axis left unknown (a TF1 script's fed placeholder,
  which the engine's rewrite splits over its replicas and micro-batches)."""
  if not isinstance(value, (tf.Tensor, np.ndarray)) or isinstance(
      value, tf.Variable):
    return value
  shape = tf.TensorShape(value.shape)
  if shape.rank:
    shape = [None] + shape[1:].as_list()
  return tf.TensorSpec(shape, tf.as_dtype(value.dtype))


def _whole_batch_trace(function, args, kwargs):
  """The concrete function of `function` traced for the call's arguments,
  each batch's first axis unknown."""
  whole_args, whole_kwargs = tf.nest.map_structure(_whole_batch_spec,
                                                   (args, kwargs))
  return function.get_concrete_function(*whole_args, **whole_kwargs)


def rewritten_step(function, *args, **kwargs):
  """The EngineStep that calls of tf.function `function` with such
  arguments run (its `graph_def` is what runs), or None before the first
  call or for a function that trains nothing."""
  return _rewritten.get(_whole_batch_trace(function, args, kwargs).graph)


def call(env, function, original, args, kwargs):
  """Calls `function` (a tf.function called eagerly): as EPL's engine
  rewrites it when its trace is a training step, else the traced function
  itself."""
  name = getattr(function, "__name__", repr(function))
  concrete = _whole_batch_trace(function, args, kwargs)
  step = _rewritten.get(concrete.graph)
  if step is None:
    traced = traced_step.step_of(concrete.graph)
    if traced is None:
      _refuse_untrained_split(concrete.graph, name)
      return original(function, *args, **kwargs)
    if not traced.strategies:
      _refuse_without_default_replicate(name, env)
    _refuse_iterator_arguments(concrete, name)
    step = _rewritten[concrete.graph] = _engine_step(env, concrete, traced,
                                                     name)
  return step(_flat_tensor_arguments(concrete, args, kwargs))


def rewritten_steps():
  """The traced steps EPL's engine rewrote (traced_engine.EngineStep),
  of the traced graphs still alive."""
  return list(_rewritten.values())


def _engine_step(env, concrete, traced, name):
  """The traced step `concrete` as EPL's engine rewrites it."""
  _refuse_in_engine(traced, name, env)
  return traced_engine.EngineStep(concrete, traced, name,
                                  env.default_strategy,
                                  _refuse_across_workers(name, env))
