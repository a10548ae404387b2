"""Every place where EPL hooks into TensorFlow, in one module.

EPL wraps these TensorFlow entry points; each wrapper only forwards to EPL
code and calls the original:

- `Graph._create_op_helper`: tags each new op with its TaskGraph and phase
  (`epl.ir.capture.on_op_created`).
- `gradients_util._GradientsHelper` (behind `tf.gradients` and
  `Optimizer.compute_gradients`): ops built inside are BACKWARD.
- `Optimizer.compute_gradients`: remembers the raw gradients.
- `Optimizer.apply_gradients`: ops built inside are APPLY; the
  (gradient, variable) pairs and the returned op are recorded.
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
- `Saver.save`: in a multi-worker job only worker 0 writes
  (`epl.runtime.checkpoint`).
- `tf.compat.v1.layers.dense`, the sparse softmax cross-entropies,
  `gen_math_ops.arg_max`/`equal` and `gen_nn_ops.top_kv2`: inside
  `epl.split`, or on its sharded outputs, they build sharded ops
  (`epl.ops.split_lowering`); Keras `Layer.add_weight` and `tf.einsum`
  inside `epl.split` build expert-parallel ops (`epl.ops.expert_lowering`).

`install()` is idempotent; `uninstall()` restores TensorFlow exactly.
"""
import functools
import importlib

import tensorflow as tf

from keras.src.engine import base_layer
from keras.src.engine import base_layer_v1
from tensorflow.python.client import session as session_lib
from tensorflow.python.data.ops import dataset_ops
from tensorflow.python.data.ops import readers
from tensorflow.python.framework import errors as tf_errors
from tensorflow.python.framework import ops
from tensorflow.python.ops import gen_math_ops
from tensorflow.python.ops import gen_nn_ops
from tensorflow.python.ops import gradients_util
from tensorflow.python.training import optimizer as optimizer_lib
from tensorflow.python.training import saver as saver_lib

from epl.ir import capture
from epl.ir.phase import Phase

_originals = {}
_apply_depth = [0]


def _env():
  from epl.env import Env  # pylint: disable=import-outside-toplevel
  return Env.get() if Env.initialised() else None


def _create_op_helper(original, graph, op, compute_device=True):
  original(graph, op, compute_device=compute_device)
  env = _env()
  if env is not None:
    capture.on_op_created(env, op)


def _gradients_helper(original, *args, **kwargs):
  with capture.phase_scope(Phase.BACKWARD):
    return original(*args, **kwargs)


def _compute_gradients(original, optimizer, *args, **kwargs):
  grads_and_vars = original(optimizer, *args, **kwargs)
  env = _env()
  if env is not None:
    capture.record_computed_gradients(env, grads_and_vars)
  return grads_and_vars


def _apply_gradients(original, optimizer, grads_and_vars, global_step=None,
                     name=None):
  env = _env()
  if env is None or _apply_depth[0]:
    return original(optimizer, grads_and_vars, global_step=global_step,
                    name=name)
  grads_and_vars = list(grads_and_vars)
  if env.config.communication.sparse_as_dense:
    grads_and_vars = capture.densify_sparse_gradients(grads_and_vars)
  _apply_depth[0] += 1
  try:
    with capture.phase_scope(Phase.APPLY):
      train_op = original(optimizer, grads_and_vars, global_step=global_step,
                          name=name)
  finally:
    _apply_depth[0] -= 1
  capture.record_apply(env, grads_and_vars, train_op, global_step)
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


_PATCHES = (
    (ops.Graph, "_create_op_helper", _create_op_helper),
    (gradients_util, "_GradientsHelper", _gradients_helper),
    (optimizer_lib.Optimizer, "compute_gradients", _compute_gradients),
    (optimizer_lib.Optimizer, "apply_gradients", _apply_gradients),
    (ops.Graph, "finalize", _finalize),
    (session_lib.BaseSession, "__init__", _session_init),
    (session_lib.BaseSession, "run", _session_run),
    (readers.TFRecordDatasetV2, "__init__", _dataset_init),
    (readers.TextLineDatasetV2, "__init__", _dataset_init),
    (readers.FixedLengthRecordDatasetV2, "__init__", _dataset_init),
    (dataset_ops.DatasetV2, "list_files", _list_files),
    (saver_lib.Saver, "save", _saver_save),
    (tf.compat.v1.layers, "dense", _split_lowering("dense")),
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
  for owner, attribute, wrapper in _PATCHES:
    key = (owner, attribute)
    if key in _originals:
      continue
    original = getattr(owner, attribute)
    _originals[key] = owner.__dict__.get(attribute, original)
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
    setattr(owner, attribute, original)
    del _originals[(owner, attribute)]
