"""Every place where EPL hooks into TensorFlow, in one module.

EPL wraps these TensorFlow entry points (found in `epl.tf_compat.targets`,
`.keras` and `.estimator`); each wrapper only forwards to EPL code and
calls the original. This module is the wiring: it is the one that knows
capture, planning, the rewrite, the runtime and the tools together.

- `Graph._create_op_helper`: tags each new op with its TaskGraph and phase
  (`epl.capture.capture.on_op_created`).
- `gradients_util._GradientsHelper` (behind `tf.gradients`,
  `Optimizer.compute_gradients` and `minimize`) and
  `GradientTape.gradient` (Keras optimizers): with auto.auto_parallel,
  the first call of a graph first cuts its forward pass into stages
  (`epl.parallel.plan.auto`); ops built inside are BACKWARD; the gradients of
  variables are recorded
  (`epl.capture.capture.record_gradients`), dense when
  communication.sparse_as_dense.
- The gradient registry's `lookup` (`epl.tf_compat.tape`): with eager
  execution on, a gradient function a `GradientTape` calls inside a
  traced step runs under its forward op (as `tf.gradients` runs it), so
  capture puts the backward ops on the forward op's TaskGraph.
- `gradients_util._DefaultGradYs` (the ones `tf.gradients` seeds the
  backward pass with): the seeds of the losses are recorded
  (`epl.capture.capture.record_loss_seeds`), for the loss scale.
- With eager execution on (TF2 scripts): `GradientTape.gradient` inside a
  `tf.function` being traced builds BACKWARD ops from seeds it records
  as the losses' and records the gradients of variables
  (`epl.capture.traced_step`); run eagerly, outside any function, it
  raises (that step would train on one device), and `Function.__call__` made eagerly runs
  the rewrite of a traced training step instead of the trace
  (`epl.runtime.traced_function`); Keras 2's `Model.make_train_function`
  makes `Model.fit` call such a step with each batch's tensors
  (`epl.runtime.keras_fit`).
- Keras 2's `Layer.__call__` with eager execution on: a layer called
  eagerly inside a strategy scope (as a functional model is built)
  records the scope, and is called inside it again when a traced step
  calls it
  (`epl.capture.layer_scopes`).
- Keras 2 in graph mode (TF1 scripts, `epl.runtime.keras_graph_fit`):
  `training_v1.Model.compile` and `_make_train_function` (behind `fit`
  and `train_on_batch`) build the loss, metrics and optimizer step count
  in the stage of the model's outputs when the model was built in stage
  scopes, and the loss comes back merged over replicas;
  `GraphExecutionFunction._make_callable` (how Keras backend functions
  run) makes a callable that runs through `Session.run`, with EPL's hooks
  below; `_make_predict_function` fetches outputs of the whole batch when
  the step's micro-batches run as a loop.
- `Optimizer.apply_gradients`: ops built inside are APPLY; the
  (gradient, variable) pairs it applied are recorded, so that the rewrite
  knows which post-processed gradient belongs to which raw one; with
  optimizer.num_apply_group > 1 the update is built in groups
  (`epl.parallel.passes.grouped_apply`).
- `Graph.finalize`: the rewrite (`epl.parallel.engine`) runs before a graph
  is frozen (this is when `MonitoredTrainingSession` freezes it); in a dry
  run the plan is then printed and the process exits
  (`epl.tools.dry_run`). Here and before the first run, a
  worker that holds no replica's first stage serves instead
  (`epl.runtime.serving`).
- `BaseSession.__init__`: the session gets EPL's devices and settings.
- `BaseSession.run`: the rewrite runs before the first step (Keras'
  session, when it ran the graph before, is then replaced by a new one
  holding its variables' values, `epl.runtime.keras_session`; any other
  session that ran the graph before the rewrite raises,
  `epl.runtime.stale_sessions`); fetches of
  merged tensors are swapped for their merged values; in a multi-worker job
  an error that means a lost peer becomes `epl.WorkerFailureError`.
- `TFRecordDataset`, `TextLineDataset`, `FixedLengthRecordDataset`
  constructors and `Dataset.list_files`: with `io.slicing`, the file list is
  cut to this worker's share (`epl.capture.io_slicing`).
- `DatasetV1._make_one_shot_iterator` / `_make_initializable_iterator`
  (behind `tf.compat.v1.data.make_*_iterator`): a dataset built eagerly
  before `epl.init()` raises a clear error (`epl.capture.graph_mode`); in
  a multi-worker job, one whose data is in memory and not sharded logs a
  warning (`epl.capture.io_slicing.warn_unsharded_input`).
- `Saver.save`: in a multi-worker job only worker 0 writes
  (`epl.runtime.checkpoint`).
- `Saver.restore`: a checkpoint whose variables have other shapes than the
  model's is an error before anything is restored
  (`epl.runtime.checkpoint.check_shapes`).
- `EventFileWriter` as `FileWriter` makes it, and
  `training_util.write_graph`: in a multi-worker job only worker 0 writes
  event and graph files (`epl.runtime.summaries`).
- `RunConfig.__init__`, `Estimator._call_model_fn`, `latest_checkpoint`
  and `evaluate` (once the script imports tensorflow-estimator): RunConfig
  ignores TF_CONFIG and distribution arguments; evaluation and prediction
  graphs are not captured; in a multi-worker job the other workers
  evaluate worker 0's checkpoint once it is written
  (`epl.runtime.estimator`).
- `tf.compat.v1.layers.dense` (and calls of Dense layer objects), the
  sparse softmax cross-entropies,
  `gen_math_ops.arg_max`/`equal` and `gen_nn_ops.top_kv2`: inside
  `epl.split`, or on its sharded outputs, they build sharded ops
  (`epl.parallel.ops.split_lowering`); Keras `Layer.add_weight` and `tf.einsum`
  inside `epl.split` build expert-parallel ops (`epl.parallel.ops.expert_lowering`).
  The Keras ones only where the Keras that TensorFlow uses has them
  (`epl.tf_compat.keras`).
- Under Keras 3 (tf.keras 3.x): Keras 3's `Optimizer.apply` (behind
  `apply_gradients`) outside a TF2 step being traced, `Model.fit` and
  `Model.train_on_batch` raise an error that names Keras 3, the
  TensorFlow version and the fix
  (`epl.tf_compat.keras.keras3_training_error`): they update variables
  outside a training step EPL parallelises. Inside a `tf.function` traced
  with eager execution on, the optimizer's update is part of the traced
  step, which EPL rewrites. `tf.compat.v1.layers`
  and `tf.compat.v1.nn.rnn_cell`, which Keras 3 lacks, are replaced by
  stand-ins whose first use raises EPL's error naming the fix
  (`epl.tf_compat.keras.Keras3MissingModule`) instead of TensorFlow's.

`install()` is idempotent; `uninstall()` restores TensorFlow exactly.
"""
import functools
import threading

import tensorflow as tf

from epl import user_warnings
from epl.capture import capture
from epl.capture import graph_mode
from epl.capture import io_slicing
from epl.capture import layer_scopes
from epl.capture import traced_step
from epl.env import active
from epl.ir.phase import Phase
from epl.parallel.ops import expert_lowering
from epl.parallel.ops import split_lowering
from epl.parallel import engine
from epl.parallel.passes import grouped_apply
from epl.parallel.plan import auto
from epl.parallel.plan import planner
from epl.runtime import checkpoint
from epl.runtime import cpu_threads
from epl.runtime import estimator
from epl.runtime import failures
from epl.runtime import keras_fit
from epl.runtime import keras_graph_fit
from epl.runtime import keras_session
from epl.runtime import serving
from epl.runtime import session as epl_session
from epl.runtime import stale_sessions
from epl.runtime import summaries
from epl.runtime import traced_function
from epl.tf_compat import estimator as tf_estimator
from epl.tf_compat import keras
from epl.tf_compat import tape as tf_tape
from epl.tf_compat import targets
from epl.tools import dry_run

_originals = {}
# Stands for an attribute a class inherits (uninstall deletes it again).
_INHERITED = object()


class _ApplyDepth(threading.local):
  # Optimizers that wrap another call apply_gradients inside
  # apply_gradients: only the outermost call is recorded.
  value = 0


_apply_depth = _ApplyDepth()


def _rewrite(graph):
  """Rewrites `graph` when it holds a training step (`epl.parallel.engine`);
  a dry run then prints the plan and exits. Returns the RewriteResult, or
  None when there is no step to rewrite yet."""
  result = engine.ensure_rewritten(graph)
  if result is not None:
    dry_run.after_rewrite(result)
  return result


def _create_op_helper(original, graph, op, compute_device=True):
  original(graph, op, compute_device=compute_device)
  env = active()
  if env is not None:
    capture.on_op_created(env, op, auto.strategy_after_cut)


def _gradients_helper(original, ys, xs, *args, **kwargs):
  env = active()
  if env is None:
    return original(ys, xs, *args, **kwargs)
  auto.before_gradients(env, tf.nest.flatten(ys))
  with capture.phase_scope(Phase.BACKWARD):
    grads = original(ys, xs, *args, **kwargs)
    if env.config.communication.sparse_as_dense and not getattr(
        tf.compat.v1.get_default_graph(), "building_function", False):
      grads = capture.densify_sparse_gradients(grads)
  capture.record_gradients(tf.nest.flatten(xs), grads)
  return grads


def _default_grad_ys(original, grad_ys, ys, *args, **kwargs):
  seeds = original(grad_ys, ys, *args, **kwargs)
  if active() is not None:
    capture.record_loss_seeds(grad_ys, seeds)
  return seeds


def _tracing_tf2_step():
  """Whether ops are being built in a tf.function traced while eager
  execution is on: a TF2 step, which EPL rewrites when it is called."""
  return (tf.compat.v1.executing_eagerly_outside_functions() and
          not tf.executing_eagerly() and
          tf.compat.v1.get_default_graph().building_function)


def _tape_gradient(original, tape, target, sources, *args, **kwargs):
  env = active()
  if env is None:
    return original(tape, target, sources, *args, **kwargs)
  if tf.compat.v1.executing_eagerly_outside_functions():
    if tf.executing_eagerly():
      traced_function.refuse_eager_gradients()
    graph = tf.compat.v1.get_default_graph()
    if not graph.building_function:
      return original(tape, target, sources, *args, **kwargs)
    with capture.phase_scope(Phase.BACKWARD):
      if not args and kwargs.get("output_gradients") is None:
        # The seeds TensorFlow would make, made here to be recorded (the
        # loss scale multiplies them).
        kwargs["output_gradients"] = traced_step.seed_gradients(graph,
                                                                target)
      grads = original(tape, target, sources, *args, **kwargs)
    # Keras 3 variables hold the tf.Variable they train.
    traced_step.record_gradients(
        graph, [keras.tf_variable_of(source)
                for source in tf.nest.flatten(sources)],
        tf.nest.flatten(grads))
    return grads
  auto.before_gradients(env, tf.nest.flatten(target))
  with capture.phase_scope(Phase.BACKWARD):
    grads = original(tape, target, sources, *args, **kwargs)
  capture.record_gradients(tf.nest.flatten(sources),
                           tf.nest.flatten(grads))
  return grads


def _gradient_lookup(original, registry, op_type):
  function = original(registry, op_type)
  # None: an op registered not differentiable.
  if (function is None or active() is None or
      not tf_tape.is_gradient_registry(registry) or not _tracing_eagerly()):
    return function

  @functools.wraps(function)
  def gradient(op, *grads):
    graph = tf.compat.v1.get_default_graph()
    forward = tf_tape.forward_op(op) if graph.building_function else None
    if forward is None or forward.graph is not graph:
      return function(op, *grads)
    with tf_tape.original_op_scope(graph, forward):
      return function(op, *grads)
  return gradient


def _apply_gradients(original, optimizer, grads_and_vars, global_step=None,
                     name=None):
  env = active()
  if env is None:
    return original(optimizer, grads_and_vars, global_step=global_step,
                    name=name)
  grads_and_vars = list(grads_and_vars)
  if _apply_depth.value:
    train_op = original(optimizer, grads_and_vars, global_step=global_step,
                        name=name)
    capture.record_slots(optimizer, grads_and_vars)
    return train_op
  _apply_depth.value += 1
  try:
    with capture.phase_scope(Phase.APPLY):
      train_op = grouped_apply.apply_gradients(
          original, optimizer, grads_and_vars, global_step, name,
          env.config.optimizer.num_apply_group)
  finally:
    _apply_depth.value -= 1
  capture.record_apply(grads_and_vars, train_op, global_step)
  capture.record_slots(optimizer, grads_and_vars)
  return train_op


def _function_call(original, function, *args, **kwargs):
  env = active()
  if env is None or not tf.executing_eagerly():
    return original(function, *args, **kwargs)
  return traced_function.call(env, function, original, args, kwargs)


def _make_train_function(original, model, *args, **kwargs):
  if active() is None or not tf.executing_eagerly():
    return original(model, *args, **kwargs)
  return keras_fit.make_train_function(original, model, *args, **kwargs)


def _v1_make_train_function(original, model, *args, **kwargs):
  if active() is None:
    return original(model, *args, **kwargs)
  return keras_graph_fit.make_train_function(original, model, *args,
                                             **kwargs)


def _v1_make_predict_function(original, model):
  original(model)
  if active() is not None:
    keras_graph_fit.predict_whole_batch(model)


def _v1_compile(original, model, *args, **kwargs):
  stage = keras_graph_fit.output_stage(model, "the loss and metrics")
  if stage is None:
    return original(model, *args, **kwargs)
  with stage:
    return original(model, *args, **kwargs)


def _graph_function_callable(original, function, feed_arrays, feed_symbols,
                             symbol_vals, session):
  if active() is None:
    return original(function, feed_arrays, feed_symbols, symbol_vals,
                    session)
  return keras_graph_fit.make_callable(
      function, (feed_arrays, feed_symbols, symbol_vals), session)


def _finalize(original, graph):
  env = active()
  if env is not None and not graph.finalized:
    serving.maybe_serve(env, graph)
    _rewrite(graph)
  original(graph)


def _session_init(original, session, target="", graph=None, config=None):
  env = active()
  if env is None:
    original(session, target, graph, config)
    return
  target, config = epl_session.session_settings(env, target, config, graph)
  threads_before = cpu_threads.thread_count()
  original(session, target, graph, config)
  if not target:
    # A local session makes its own devices (a server's were made with it).
    cpu_threads.check_session(env.cpu_threads, threads_before)


def _session_run(original, session, fetches, feed_dict=None, options=None,
                 run_metadata=None):
  env = active()
  if env is None:
    return original(session, fetches, feed_dict, options, run_metadata)
  serving.maybe_serve(env, session.graph)
  saved = keras_session.values_before_rewrite(
      session, functools.partial(original, session))
  if _rewrite(session.graph) is None and dry_run.enabled():
    dry_run.refuse_run()
  session = keras_session.session_after_rewrite(session, saved)
  stale_sessions.check_run(session)
  fetches, beside = epl_session.before_run(session.graph, fetches,
                                          feed_dict)
  try:
    if beside:
      return original(session, [fetches, beside], feed_dict, options,
                      run_metadata)[0]
    return original(session, fetches, feed_dict, options, run_metadata)
  except tf.errors.OpError as error:
    clear = failures.explain(env, error)
    if clear is None:
      raise
    raise clear from error


def _dataset_init(original, dataset, *args, **kwargs):
  if active() is not None:
    what = type(dataset).__name__
    if "filenames" in kwargs:
      kwargs["filenames"] = io_slicing.maybe_slice(
          kwargs["filenames"], what, planner.make_plan)
    elif args:
      args = (io_slicing.maybe_slice(args[0], what, planner.make_plan),
              *args[1:])
  original(dataset, *args, **kwargs)


def _dataset_iterator(original, dataset, *args, **kwargs):
  if active() is not None:
    graph_mode.check_dataset_in_graph(dataset)
    io_slicing.warn_unsharded_input(dataset)
  return original(dataset, *args, **kwargs)


def _list_files(original, *args, **kwargs):
  if active() is None:
    return original(*args, **kwargs)
  return io_slicing.list_files(original, planner.make_plan, *args, **kwargs)


def _saver_save(original, saver, sess, save_path, *args, **kwargs):
  env = active()
  if env is None:
    return original(saver, sess, save_path, *args, **kwargs)
  return checkpoint.save(env, original, saver, sess, save_path, *args,
                         **kwargs)


def _saver_restore(original, saver, sess, save_path, *args, **kwargs):
  if active() is not None and save_path is not None:
    checkpoint.check_shapes(saver, sess.graph, save_path)
  return original(saver, sess, save_path, *args, **kwargs)


def _event_file_writer(original, logdir, *args, **kwargs):
  env = active()
  if env is None:
    return original(logdir, *args, **kwargs)
  return summaries.event_file_writer(env, dry_run.enabled(), original, logdir,
                                    *args, **kwargs)


def _write_graph(original, *args, **kwargs):
  env = active()
  if env is None:
    return original(*args, **kwargs)
  return summaries.write_graph(env, dry_run.enabled(), original, *args,
                              **kwargs)


def _run_config_init(original, run_config, *args, **kwargs):
  if active() is None:
    return original(run_config, *args, **kwargs)
  return estimator.run_config_init(original, run_config, *args, **kwargs)


def _call_model_fn(original, estimator_object, *args, **kwargs):
  if active() is None:
    return original(estimator_object, *args, **kwargs)
  return estimator.call_model_fn(original, estimator_object, *args, **kwargs)


def _latest_checkpoint(original, estimator_object):
  env = active()
  if env is None:
    return original(estimator_object)
  return estimator.latest_checkpoint(env, original, estimator_object)


def _evaluate(original, estimator_object, *args, **kwargs):
  if active() is None:
    return original(estimator_object, *args, **kwargs)
  return estimator.evaluate(original, estimator_object, *args, **kwargs)


def _install_estimator_hooks():
  """Wraps the Estimator's entry points, once the script imported it."""
  _wrap(zip(tf_estimator.targets(), (_run_config_init, _call_model_fn,
                                     _latest_checkpoint, _evaluate)))


def _tracing_eagerly():
  """Whether ops are built with eager execution on (eagerly, or for a
  tf.function traced so): a TF2 step, whose split layers take their
  shards of the user's whole eager weights (`_dense_layer_call`,
  `expert_lowering.traced_einsum`), which the rewrite makes variables of
  the shard's shape; the lowerings that build variables of their own are
  TF1 graph only."""
  return tf.compat.v1.executing_eagerly_outside_functions()


# Lowerings that make variables of their own (a TF1 graph's): refused in a
# split scope of a traced TF2 step, with what they are.
_GRAPH_ONLY_LOWERINGS = {
    "dense": "tf.compat.v1.layers.dense",
}

# Lowerings that differ in a traced TF2 step's split scope, where they
# take shards of the user's whole eager weights; None: the original call
# (Keras makes a layer's weights eagerly, whole, traced or not).
_TRACED_LOWERINGS = {
    "einsum": expert_lowering.traced_einsum,
    "add_weight": None,
}


def _refuse_in_traced_split(name):
  """Raises for lowering `name` of a TF1 graph called inside a split scope
  of a traced TF2 step, naming what works there."""
  if tf.executing_eagerly() or name not in _GRAPH_ONLY_LOWERINGS or (
      split_lowering.split_strategy() is None):
    return
  raise traced_function.NotSupportedInTracedStep(
      "%s inside %r with eager execution on (a TF2 step, traced by "
      "tf.function): EPL splits Keras Dense layers (a split "
      "classification head, with tf.nn.sparse_softmax_cross_entropy_with_"
      "logits, tf.argmax, tf.math.top_k on its logits) and MoE expert "
      "einsums there; use tf.keras.layers.Dense, or build the layer TF1 "
      "style, in a graph run by a Session (docs/tf2.md)." % (
          _GRAPH_ONLY_LOWERINGS[name], split_lowering.split_strategy()))


def _split_lowering(name, module=split_lowering):
  """A wrapper that forwards to `<module>.<name>` (autograph, which
  converts Keras `call`s, leaves it alone)."""
  lowering = getattr(module, name)

  @tf.autograph.experimental.do_not_convert
  def wrapper(original, *args, **kwargs):
    # TensorFlow's own warnings (tf.layers.dense is deprecated) then name
    # the user's line, not this wrapper's.
    original = user_warnings.as_user(original)
    if active() is None:
      return original(*args, **kwargs)
    if _tracing_eagerly() and (tf.executing_eagerly() or
                               name in _GRAPH_ONLY_LOWERINGS or
                               name in _TRACED_LOWERINGS):
      traced = _TRACED_LOWERINGS.get(name)
      if traced is not None and not tf.executing_eagerly():
        return traced(original, *args, **kwargs)
      _refuse_in_traced_split(name)
      return original(*args, **kwargs)
    return lowering(original, *args, **kwargs)
  return wrapper


def _dense_layer_call(original, layer, *args, **kwargs):
  """Dense.__call__: forwards to epl.parallel.ops.split_lowering.dense_layer_call.
  Dense inherits __call__, and tf.compat.v1.layers.Dense from another base
  than Keras' Dense: `original` is the wrong one for it, so the instance's
  next __call__ in its own class order is called instead. In a traced TF2
  step, a Dense layer in a split scope (its own, or the one it was called
  in while a functional model was built) computes with its shard of its
  whole weights (`split_lowering.traced_dense_layer_call`)."""
  del original
  env = active()

  def call(*call_args, **call_kwargs):
    return super(keras.targets().dense_class, layer).__call__(*call_args,
                                                              **call_kwargs)
  if env is None or (_tracing_eagerly() and tf.executing_eagerly()):
    return call(*args, **kwargs)
  if not _tracing_eagerly():
    return split_lowering.dense_layer_call(call, layer, *args, **kwargs)
  with layer_scopes.scope_for_traced_call(env, layer):
    if split_lowering.split_strategy() is None:
      return call(*args, **kwargs)
    keras.build_layer(layer, args[0] if args else kwargs.get("inputs"))
    return split_lowering.traced_dense_layer_call(layer, *args, **kwargs)


def _layer_call(original, layer, *args, **kwargs):
  """Layer.__call__ of Keras 2 with eager execution on: records the scope
  a layer is called in eagerly (a functional model is built so), and
  calls the layer in a traced step inside that scope
  (`epl.capture.layer_scopes`)."""
  env = active()
  if env is None or not tf.compat.v1.executing_eagerly_outside_functions():
    return original(layer, *args, **kwargs)
  if tf.executing_eagerly():
    layer_scopes.record(env, layer)
    return original(layer, *args, **kwargs)
  with layer_scopes.scope_for_traced_call(env, layer):
    return original(layer, *args, **kwargs)


_HOOKS = (
    (targets.CREATE_OP, _create_op_helper),
    (targets.GRADIENTS, _gradients_helper),
    (targets.DEFAULT_GRAD_YS, _default_grad_ys),
    (targets.TAPE_GRADIENT, _tape_gradient),
    (tf_tape.GRADIENT_LOOKUP, _gradient_lookup),
    (targets.APPLY_GRADIENTS, _apply_gradients),
    (targets.FUNCTION_CALL, _function_call),
    (targets.GRAPH_FINALIZE, _finalize),
    (targets.SESSION_INIT, _session_init),
    (targets.SESSION_RUN, _session_run),
    *[(target, _dataset_init) for target in targets.DATASET_READERS],
    (targets.LIST_FILES, _list_files),
    *[(target, _dataset_iterator) for target in targets.DATASET_ITERATORS],
    (targets.SAVER_SAVE, _saver_save),
    (targets.SAVER_RESTORE, _saver_restore),
    (targets.EVENT_FILE_WRITER, _event_file_writer),
    (targets.WRITE_GRAPH, _write_graph),
    ((tf.compat.v1.losses, "sparse_softmax_cross_entropy"),
     _split_lowering("losses_sparse_softmax_cross_entropy")),
    ((tf.nn, "sparse_softmax_cross_entropy_with_logits"),
     _split_lowering("nn_sparse_softmax_cross_entropy_with_logits")),
    ((tf.compat.v1.nn, "sparse_softmax_cross_entropy_with_logits"),
     _split_lowering("nn_sparse_softmax_cross_entropy_with_logits")),
    (targets.ARG_MAX, _split_lowering("arg_max")),
    (targets.EQUAL, _split_lowering("equal")),
    (targets.TOP_K, _split_lowering("top_kv2")),
    ((tf, "einsum"), _split_lowering("einsum", expert_lowering)),
    ((tf.linalg, "einsum"), _split_lowering("einsum", expert_lowering)),
    ((tf.compat.v1, "einsum"), _split_lowering("einsum", expert_lowering)),
)
# Static methods among the entry points: wrapped without a `self`.
_STATIC = frozenset([targets.LIST_FILES])


def _keras3_training(original, owner, *args, **kwargs):
  # A Keras 3 optimizer in a TF2 step updates the variables in the traced
  # graph, which EPL rewrites like any other.
  if active() is None or (isinstance(owner, tf.keras.optimizers.Optimizer)
                          and _tracing_tf2_step()):
    return original(owner, *args, **kwargs)
  raise keras.keras3_training_error("Keras 3's %s.%s" % (
      type(owner).__name__, original.__name__))


def _keras_hooks():
  """The Keras layer hooks, for the Keras targets this process has: Keras
  builds TF1 graph-mode layers on the v1 base layer, others on the v2 one
  (`epl.tf_compat.keras`)."""
  found = keras.targets()
  hooks = [(target, _split_lowering("add_weight", expert_lowering))
           for target in found.add_weight + found.frozen_add_weight]
  if found.v1_dense is not None:
    hooks.append((found.v1_dense, _split_lowering("dense")))
  if found.dense_call is not None:
    hooks.append((found.dense_call, _dense_layer_call))
  if found.layer_call is not None:
    hooks.append((found.layer_call, _layer_call))
  hooks.extend((target, _keras3_training) for target in found.keras3_training)
  if found.make_train_function is not None:
    hooks.append((found.make_train_function, _make_train_function))
  if found.v1_make_train_function is not None:
    hooks.append((found.v1_make_train_function, _v1_make_train_function))
  if found.v1_make_predict_function is not None:
    hooks.append((found.v1_make_predict_function, _v1_make_predict_function))
  if found.v1_compile is not None:
    hooks.append((found.v1_compile, _v1_compile))
  if found.graph_function_callable is not None:
    hooks.append((found.graph_function_callable, _graph_function_callable))
  return tuple(hooks)


def install():
  """Wraps the entry points above (once); the Estimator's once the script
  imports it (`epl.tf_compat.estimator`: importing it eagerly would
  print deprecation warnings of its own)."""
  _wrap(_HOOKS + _keras_hooks())
  for key, name in keras.targets().keras3_missing_modules:
    _replace(key, keras.Keras3MissingModule(name))
  tf_estimator.when_imported(_install_estimator_hooks)


def _wrap(hooks):
  """Replaces each (owner, attribute) of `hooks` by its wrapper (once)."""
  for key, wrapper in hooks:
    owner, attribute = key
    if key in _originals:
      continue
    original = getattr(owner, attribute)
    if key in _STATIC:
      replacement = staticmethod(
          functools.wraps(original)(functools.partial(wrapper, original)))
    elif not isinstance(owner, type):
      replacement = functools.wraps(original)(
          functools.partial(wrapper, original))
    else:
      replacement = _as_method(original, wrapper)
    _replace(key, replacement)


def _replace(key, replacement):
  """Sets attribute `key` (owner, attribute) to `replacement` (once),
  keeping what `uninstall` restores."""
  owner, attribute = key
  if key in _originals:
    return
  # An inherited attribute is deleted again, not set on the class.
  _originals[key] = owner.__dict__.get(attribute, _INHERITED)
  setattr(owner, attribute, replacement)


def _as_method(original, wrapper):
  @functools.wraps(original)
  def method(self, *args, **kwargs):
    return wrapper(original, self, *args, **kwargs)
  return method


def uninstall():
  """Restores every wrapped entry point."""
  tf_estimator.cancel()
  for (owner, attribute), original in list(_originals.items()):
    if original is _INHERITED:
      delattr(owner, attribute)
    else:
      setattr(owner, attribute, original)
    del _originals[(owner, attribute)]
