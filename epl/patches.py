"""Every place where EPL hooks into TensorFlow, in one module.

EPL wraps these TensorFlow entry points; each wrapper only forwards to EPL
code and calls the original:

- `Graph._create_op_helper`: tags each new op with its TaskGraph and phase
  (`epl.ir.capture.on_op_created`).
- `gradients_util._GradientsHelper` (behind `tf.gradients`,
  `Optimizer.compute_gradients` and `minimize`) and
  `GradientTape.gradient` (Keras optimizers): with auto.auto_parallel,
  the first call of a graph first cuts its forward pass into stages
  (`epl.parallel.auto`); ops built inside are BACKWARD; the gradients of
  variables are recorded
  (`epl.ir.capture.record_gradients`), dense when
  communication.sparse_as_dense.
- `gradients_util._DefaultGradYs` (the ones `tf.gradients` seeds the
  backward pass with): the seeds of the losses are recorded
  (`epl.ir.capture.record_loss_seeds`), for the loss scale.
- `Optimizer.apply_gradients`: ops built inside are APPLY; the
  (gradient, variable) pairs it applied are recorded, so that the rewrite
  knows which post-processed gradient belongs to which raw one; with
  optimizer.num_apply_group > 1 the update is built in groups
  (`epl.parallel.grouped_apply`).
- `Graph.finalize`: the rewrite runs before a graph is frozen (this is when
  `MonitoredTrainingSession` freezes it). Here and before the first run, a
  worker that holds no replica's first stage serves instead
  (`epl.runtime.serving`).
- `BaseSession.__init__`: the session gets EPL's devices and settings.
- `BaseSession.run`: the rewrite runs before the first step; fetches of
  merged tensors are swapped for their merged values; in a multi-worker job
  an error that means a lost peer becomes `epl.WorkerFailureError`.
- `TFRecordDataset`, `TextLineDataset`, `FixedLengthRecordDataset`
  constructors and `Dataset.list_files`: with `io.slicing`, the file list is
  cut to this worker's share (`epl.io_slicing`).
- `DatasetV1._make_one_shot_iterator` / `_make_initializable_iterator`
  (behind `tf.compat.v1.data.make_*_iterator`): a dataset built eagerly
  before `epl.init()` raises a clear error (`epl.graph_mode`).
- `Saver.save`: in a multi-worker job only worker 0 writes
  (`epl.runtime.checkpoint`).
- `EventFileWriter` as `FileWriter` makes it, and
  `training_util.write_graph`: in a multi-worker job only worker 0 writes
  event and graph files (`epl.runtime.summaries`).
- `RunConfig.__init__`, `Estimator._call_model_fn`, `latest_checkpoint`
  and `evaluate` (when tensorflow-estimator is installed): RunConfig
  ignores TF_CONFIG and distribution arguments; evaluation and prediction
  graphs are not captured; in a multi-worker job the other workers
  evaluate worker 0's checkpoint once it is written
  (`epl.runtime.estimator`).
- `tf.compat.v1.layers.dense` (and calls of Dense layer objects), the
  sparse softmax cross-entropies,
  `gen_math_ops.arg_max`/`equal` and `gen_nn_ops.top_kv2`: inside
  `epl.split`, or on its sharded outputs, they build sharded ops
  (`epl.ops.split_lowering`); Keras `Layer.add_weight` and `tf.einsum`
  inside `epl.split` build expert-parallel ops (`epl.ops.expert_lowering`).

`install()` is idempotent; `uninstall()` restores TensorFlow exactly.
"""
import contextlib
import functools
import importlib
import threading

import tensorflow as tf

from keras.src.engine import base_layer
from keras.src.engine import base_layer_v1
from keras.src.layers.core import dense as keras_dense
from tensorflow.python.client import session as session_lib
from tensorflow.python.eager import backprop
from tensorflow.python.data.ops import dataset_ops
from tensorflow.python.data.ops import readers
from tensorflow.python.framework import errors as tf_errors
from tensorflow.python.framework import ops
from tensorflow.python.ops import gen_math_ops
from tensorflow.python.ops import gen_nn_ops
from tensorflow.python.ops import gradients_util
from tensorflow.python.summary.writer import writer as summary_writer
from tensorflow.python.training import optimizer as optimizer_lib
from tensorflow.python.training import saver as saver_lib
from tensorflow.python.training import training_util
from tensorflow.python.util import nest

from epl.ir import capture
from epl.ir.phase import Phase
from epl.parallel import auto
from epl.parallel import grouped_apply

_originals = {}
# Stands for an attribute a class inherits (uninstall deletes it again).
_INHERITED = object()


class _ApplyDepth(threading.local):
  # Optimizers that wrap another call apply_gradients inside
  # apply_gradients: only the outermost call is recorded.
  value = 0


_apply_depth = _ApplyDepth()


class _Detached(threading.local):
  # Depth of `detached()` scopes.
  value = 0


_detached = _Detached()


@contextlib.contextmanager
def detached():
  """TensorFlow calls made inside run as without EPL: nothing is captured
  or recorded (an Estimator's evaluation and prediction graphs)."""
  _detached.value += 1
  try:
    yield
  finally:
    _detached.value -= 1


def _env():
  from epl.env import Env  # pylint: disable=import-outside-toplevel
  if _detached.value or not Env.initialised():
    return None
  return Env.get()


def _create_op_helper(original, graph, op, compute_device=True):
  original(graph, op, compute_device=compute_device)
  env = _env()
  if env is not None:
    capture.on_op_created(env, op)


def _gradients_helper(original, ys, xs, *args, **kwargs):
  env = _env()
  if env is None:
    return original(ys, xs, *args, **kwargs)
  auto.before_gradients(env, nest.flatten(ys))
  with capture.phase_scope(Phase.BACKWARD):
    grads = original(ys, xs, *args, **kwargs)
    if env.config.communication.sparse_as_dense and not getattr(
        ops.get_default_graph(), "building_function", False):
      grads = capture.densify_sparse_gradients(grads)
  capture.record_gradients(nest.flatten(xs), grads)
  return grads


def _default_grad_ys(original, grad_ys, ys, *args, **kwargs):
  seeds = original(grad_ys, ys, *args, **kwargs)
  if _env() is not None:
    capture.record_loss_seeds(grad_ys, seeds)
  return seeds


def _tape_gradient(original, tape, target, sources, *args, **kwargs):
  env = _env()
  if env is None or ops.executing_eagerly_outside_functions():
    return original(tape, target, sources, *args, **kwargs)
  auto.before_gradients(env, nest.flatten(target))
  with capture.phase_scope(Phase.BACKWARD):
    grads = original(tape, target, sources, *args, **kwargs)
  capture.record_gradients(nest.flatten(sources), nest.flatten(grads))
  return grads


def _apply_gradients(original, optimizer, grads_and_vars, global_step=None,
                     name=None):
  env = _env()
  if env is None or _apply_depth.value:
    return original(optimizer, grads_and_vars, global_step=global_step,
                    name=name)
  grads_and_vars = list(grads_and_vars)
  _apply_depth.value += 1
  try:
    with capture.phase_scope(Phase.APPLY):
      train_op = grouped_apply.apply_gradients(
          original, optimizer, grads_and_vars, global_step, name,
          env.config.optimizer.num_apply_group)
  finally:
    _apply_depth.value -= 1
  capture.record_apply(grads_and_vars, train_op, global_step)
  return train_op


def _finalize(original, graph):
  env = _env()
  if env is not None and not graph.finalized:
    from epl.parallel import engine  # pylint: disable=import-outside-toplevel
    from epl.runtime import serving  # pylint: disable=import-outside-toplevel
    serving.maybe_serve(env, graph)
    engine.before_finalize(graph)
  original(graph)


def _session_init(original, session, target="", graph=None, config=None):
  env = _env()
  if env is not None:
    from epl.runtime import session as epl_session  # pylint: disable=import-outside-toplevel
    target, config = epl_session.session_settings(env, target, config,
                                                  graph)
  original(session, target, graph, config)


def _session_run(original, session, fetches, feed_dict=None, options=None,
                 run_metadata=None):
  env = _env()
  if env is None:
    return original(session, fetches, feed_dict, options, run_metadata)
  from epl.runtime import failures  # pylint: disable=import-outside-toplevel
  from epl.runtime import session as epl_session  # pylint: disable=import-outside-toplevel
  from epl.runtime import serving  # pylint: disable=import-outside-toplevel
  serving.maybe_serve(env, session.graph)
  fetches = epl_session.before_run(session.graph, fetches)
  try:
    return original(session, fetches, feed_dict, options, run_metadata)
  except tf_errors.OpError as error:
    clear = failures.explain(env, error)
    if clear is None:
      raise
    raise clear from error


def _dataset_init(original, dataset, *args, **kwargs):
  if _env() is not None:
    from epl import io_slicing  # pylint: disable=import-outside-toplevel
    what = type(dataset).__name__
    if "filenames" in kwargs:
      kwargs["filenames"] = io_slicing.maybe_slice(kwargs["filenames"], what)
    elif args:
      args = (io_slicing.maybe_slice(args[0], what),) + args[1:]
  original(dataset, *args, **kwargs)


def _dataset_iterator(original, dataset, *args, **kwargs):
  if _env() is not None:
    from epl import graph_mode  # pylint: disable=import-outside-toplevel
    graph_mode.check_dataset_in_graph(dataset)
  return original(dataset, *args, **kwargs)


def _list_files(original, *args, **kwargs):
  if _env() is None:
    return original(*args, **kwargs)
  from epl import io_slicing  # pylint: disable=import-outside-toplevel
  return io_slicing.list_files(original, *args, **kwargs)


def _saver_save(original, saver, sess, save_path, *args, **kwargs):
  env = _env()
  if env is None:
    return original(saver, sess, save_path, *args, **kwargs)
  from epl.runtime import checkpoint  # pylint: disable=import-outside-toplevel
  return checkpoint.save(env, original, saver, sess, save_path, *args,
                         **kwargs)


def _event_file_writer(original, logdir, *args, **kwargs):
  env = _env()
  if env is None:
    return original(logdir, *args, **kwargs)
  from epl.runtime import summaries  # pylint: disable=import-outside-toplevel
  return summaries.event_file_writer(env, original, logdir, *args, **kwargs)


def _write_graph(original, *args, **kwargs):
  env = _env()
  if env is None:
    return original(*args, **kwargs)
  from epl.runtime import summaries  # pylint: disable=import-outside-toplevel
  return summaries.write_graph(env, original, *args, **kwargs)


def _run_config_init(original, run_config, *args, **kwargs):
  if _env() is None:
    return original(run_config, *args, **kwargs)
  from epl.runtime import estimator  # pylint: disable=import-outside-toplevel
  return estimator.run_config_init(original, run_config, *args, **kwargs)


def _call_model_fn(original, estimator_object, *args, **kwargs):
  if _env() is None:
    return original(estimator_object, *args, **kwargs)
  from epl.runtime import estimator  # pylint: disable=import-outside-toplevel
  return estimator.call_model_fn(original, estimator_object, *args, **kwargs)


def _latest_checkpoint(original, estimator_object):
  env = _env()
  if env is None:
    return original(estimator_object)
  from epl.runtime import estimator  # pylint: disable=import-outside-toplevel
  return estimator.latest_checkpoint(env, original, estimator_object)


def _evaluate(original, estimator_object, *args, **kwargs):
  if _env() is None:
    return original(estimator_object, *args, **kwargs)
  from epl.runtime import estimator  # pylint: disable=import-outside-toplevel
  return estimator.evaluate(original, estimator_object, *args, **kwargs)


def _estimator_patches():
  try:
    from tensorflow_estimator.python.estimator import estimator as estimator_lib  # pylint: disable=import-outside-toplevel
    from tensorflow_estimator.python.estimator import run_config  # pylint: disable=import-outside-toplevel
  except ImportError:
    return ()
  return ((run_config.RunConfig, "__init__", _run_config_init),
          (estimator_lib.Estimator, "_call_model_fn", _call_model_fn),
          (estimator_lib.Estimator, "latest_checkpoint", _latest_checkpoint),
          (estimator_lib.Estimator, "evaluate", _evaluate))


def _split_lowering(name, module="split_lowering"):
  """A wrapper that forwards to `epl.ops.<module>.<name>` (autograph, which
  converts Keras `call`s, leaves it alone)."""
  @tf.autograph.experimental.do_not_convert
  def wrapper(original, *args, **kwargs):
    if _env() is None:
      return original(*args, **kwargs)
    lowering = importlib.import_module("epl.ops." + module)
    return getattr(lowering, name)(original, *args, **kwargs)
  return wrapper


def _dense_layer_call(original, layer, *args, **kwargs):
  """Dense.__call__: forwards to epl.ops.split_lowering.dense_layer_call.
  Dense inherits __call__, and tf.compat.v1.layers.Dense from another base
  than Keras' Dense: `original` is the wrong one for it, so the instance's
  next __call__ in its own class order is called instead."""
  del original

  def call(*call_args, **call_kwargs):
    return super(keras_dense.Dense, layer).__call__(*call_args,
                                                    **call_kwargs)
  if _env() is None:
    return call(*args, **kwargs)
  from epl.ops import split_lowering  # pylint: disable=import-outside-toplevel
  return split_lowering.dense_layer_call(call, layer, *args, **kwargs)


_PATCHES = (
    (ops.Graph, "_create_op_helper", _create_op_helper),
    (gradients_util, "_GradientsHelper", _gradients_helper),
    (gradients_util, "_DefaultGradYs", _default_grad_ys),
    (backprop.GradientTape, "gradient", _tape_gradient),
    (optimizer_lib.Optimizer, "apply_gradients", _apply_gradients),
    (ops.Graph, "finalize", _finalize),
    (session_lib.BaseSession, "__init__", _session_init),
    (session_lib.BaseSession, "run", _session_run),
    (readers.TFRecordDatasetV2, "__init__", _dataset_init),
    (readers.TextLineDatasetV2, "__init__", _dataset_init),
    (readers.FixedLengthRecordDatasetV2, "__init__", _dataset_init),
    (dataset_ops.DatasetV2, "list_files", _list_files),
    (dataset_ops.DatasetV1, "_make_one_shot_iterator", _dataset_iterator),
    (dataset_ops.DatasetV1, "_make_initializable_iterator", _dataset_iterator),
    (saver_lib.Saver, "save", _saver_save),
    (summary_writer, "EventFileWriter", _event_file_writer),
    (training_util, "write_graph", _write_graph),
    (tf.compat.v1.layers, "dense", _split_lowering("dense")),
    (keras_dense.Dense, "__call__", _dense_layer_call),
    (tf.compat.v1.losses, "sparse_softmax_cross_entropy",
     _split_lowering("losses_sparse_softmax_cross_entropy")),
    (tf.nn, "sparse_softmax_cross_entropy_with_logits",
     _split_lowering("nn_sparse_softmax_cross_entropy_with_logits")),
    (tf.compat.v1.nn, "sparse_softmax_cross_entropy_with_logits",
     _split_lowering("nn_sparse_softmax_cross_entropy_with_logits")),
    (gen_math_ops, "arg_max", _split_lowering("arg_max")),
    (gen_math_ops, "equal", _split_lowering("equal")),
    (gen_nn_ops, "top_kv2", _split_lowering("top_kv2")),
    (base_layer.Layer, "add_weight",
     _split_lowering("add_weight", "expert_lowering")),
    # Keras builds its layers on this class in TF1 graph mode.
    (base_layer_v1.Layer, "add_weight",
     _split_lowering("add_weight", "expert_lowering")),
    (tf, "einsum", _split_lowering("einsum", "expert_lowering")),
    (tf.linalg, "einsum", _split_lowering("einsum", "expert_lowering")),
    (tf.compat.v1, "einsum", _split_lowering("einsum", "expert_lowering")),
)
# Static methods among the entry points: wrapped without a `self`.
_STATIC = frozenset([(dataset_ops.DatasetV2, "list_files")])


def install():
  """Wraps the entry points above (once)."""
  for owner, attribute, wrapper in _PATCHES + _estimator_patches():
    key = (owner, attribute)
    if key in _originals:
      continue
    original = getattr(owner, attribute)
    # An inherited attribute is deleted again, not set on the class.
    _originals[key] = owner.__dict__.get(attribute, _INHERITED)
    if key in _STATIC:
      replacement = staticmethod(
          functools.wraps(original)(functools.partial(wrapper, original)))
    elif not isinstance(owner, type):
      replacement = functools.wraps(original)(
          functools.partial(wrapper, original))
    else:
      replacement = _as_method(original, wrapper)
    setattr(owner, attribute, replacement)


def _as_method(original, wrapper):
  @functools.wraps(original)
  def method(self, *args, **kwargs):
    return wrapper(original, self, *args, **kwargs)
  return method


def uninstall():
  """Restores every wrapped entry point."""
  for (owner, attribute), original in list(_originals.items()):
    if original is _INHERITED:
      delattr(owner, attribute)
    else:
      setattr(owner, attribute, original)
    del _originals[(owner, attribute)]
