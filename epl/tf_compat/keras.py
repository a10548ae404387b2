"""The Keras classes EPL hooks for `epl.split`, found for the Keras that
TensorFlow uses.

`tf.compat.v1.layers` is built on Keras 2: the `keras` package bundled with
TF 2.15 (`keras.src.engine`), or the `tf_keras` package on TF 2.16 and later
under TF_USE_LEGACY_KERAS=1 (`tf_keras.src.engine`). Under Keras 3 (TF 2.16
and later by default) there is no `engine`, the v1 layers are unavailable,
and `Layer.add_weight` takes other arguments, so nothing is hooked there.

TensorFlow also keeps a frozen copy of Keras 2 (`tensorflow.python.keras`),
whose `tensorflow.python.layers.base.Layer` TF1 code subclasses (the
original EPL's tests do): its base layers' `add_weight` is hooked too, on
every Keras but Keras 3 (where `epl.split` is refused anyway).

Importing this module never fails for a missing Keras: targets that are not
found are left out (logged at DEBUG), and `require_layer_hooks` raises, for
a feature that needs them, an error that names the fix.
"""
import dataclasses
import functools
import importlib
import logging
import types

# First: checks the TensorFlow version before its internals are imported.
from epl.tf_compat import version_check  # noqa: F401  pylint: disable=unused-import
import tensorflow as tf

from epl.tf_compat import keras_selection

logger = logging.getLogger("epl")


@dataclasses.dataclass(frozen=True)
class KerasTargets:
  """The Keras hook targets found, and why the others are missing."""
  # (owner, attribute) pairs of `Layer.add_weight`: the Keras 2 base layer
  # and the v1 base layer that tf.compat.v1.layers (TF1 graph mode) uses.
  add_weight: tuple = ()
  # (owner, attribute) pairs of `Layer.add_weight` of TensorFlow's frozen
  # Keras 2 (tensorflow.python.keras.engine): the base layers of
  # tensorflow.python.layers.base.Layer (v1 in TF1 graph mode).
  frozen_add_weight: tuple = ()
  # (Dense, "__call__"), or None.
  dense_call: tuple = None
  # (tf.compat.v1.layers, "dense"), or None.
  v1_dense: tuple = None
  # Why targets are missing; None when every one was found.
  problem: str = None
  # Under Keras 3 only: (owner, attribute) pairs of the Keras 3 training
  # entry points EPL refuses (`keras3_training_error`): the optimizer's
  # `apply` (behind `apply_gradients` and Model.fit's update) and
  # `Model.fit`, `Model.train_on_batch`.
  keras3_training: tuple = ()
  # Under Keras 3 only: ((owner, attribute), public name) of the TF1
  # modules built on Keras 2 that Keras 3 lacks (`tf.compat.v1.layers`,
  # the v1 RNN cells), which EPL replaces by a `Keras3MissingModule`.
  keras3_missing_modules: tuple = ()
  # (Model, "make_train_function") of Keras 2, or None: with eager
  # execution on, EPL makes Model.fit's train function a step that takes
  # its batch as tensors (epl.runtime.keras_fit).
  make_train_function: tuple = None
  # (training_v1.Model, "_make_train_function") of Keras 2, or None: what
  # Model.fit and train_on_batch build their update with in graph mode.
  v1_make_train_function: tuple = None
  # (GraphExecutionFunction, "_make_callable") of Keras 2, or None: how a
  # Keras backend function (Model.fit's train function in graph mode)
  # runs its step: a callable of the session, which bypasses Session.run.
  graph_function_callable: tuple = None
  # (training_v1.Model, "_make_predict_function") of Keras 2, or None:
  # what Model.predict builds its function with in graph mode.
  v1_make_predict_function: tuple = None
  # (training_v1.Model, "compile") of Keras 2, or None: in graph mode it
  # builds the loss and the metrics, outside the user's stage scopes.
  v1_compile: tuple = None
  # Keras 2's holder of the session its graph-mode functions run in (its
  # `.session`), or None.
  session_holder: object = None
  # (Layer, "__call__") of Keras 2's v2 base layer, or None: how every
  # layer of a model is called, when a functional model is built on Keras
  # tensors and when its `call` calls the layers in a traced step.
  layer_call: tuple = None

  @property
  def dense_class(self):
    return self.dense_call[0] if self.dense_call else None


def _keras_package():
  """'keras' or 'tf_keras': the Keras 2 package behind
  tf.compat.v1.layers; None under Keras 3."""
  try:
    package = tf.compat.v1.layers.Dense.__module__.split(".")[0]
  except Exception:  # pylint: disable=broad-except  (Keras 3 refuses the v1 layers in several ways)
    return None
  if package not in ("keras", "tf_keras"):
    return None
  version = getattr(importlib.import_module(package), "__version__", "")
  return package if version.startswith("2.") else None


def _find(module_name, class_name):
  try:
    module = importlib.import_module(module_name)
  except ImportError:
    return None
  return getattr(module, class_name, None)


@functools.cache
def targets():
  """The KerasTargets of this process (found once)."""
  package = _keras_package()
  if package is None:
    problem = (
        "TensorFlow %s uses Keras 3, whose layers EPL does not hook "
        "(keras.src.engine is missing and tf.compat.v1.layers is "
        "unavailable). Install tf-keras of the same version (pip install "
        "'tf-keras~=%s.0') and set TF_USE_LEGACY_KERAS=1 before TensorFlow "
        "is imported." % (tf.__version__, tf.__version__.rsplit(".", 1)[0]))
    logger.debug("Keras layer hooks not installed: %s", problem)
    return KerasTargets(
        problem=problem, keras3_training=keras3_training_targets(),
        keras3_missing_modules=(
            ((tf.compat.v1, "layers"), "tf.compat.v1.layers"),
            ((tf.compat.v1.nn, "rnn_cell"), "tf.compat.v1.nn.rnn_cell")))
  frozen = [_find("tensorflow.python.keras.engine." + module, "Layer")
            for module in ("base_layer", "base_layer_v1")]
  prefix = package + ".src."
  layers = [_find(prefix + "engine.base_layer", "Layer"),
            _find(prefix + "engine.base_layer_v1", "Layer")]
  dense = _find(prefix + "layers.core.dense", "Dense")
  model = _find(prefix + "engine.training", "Model")
  v1_model = _find(prefix + "engine.training_v1", "Model")
  graph_function = _find(prefix + "backend", "GraphExecutionFunction")
  session_holder = _find(prefix + "backend", "_SESSION")
  missing = [name for name, found in (
      ("engine.base_layer.Layer", layers[0]),
      ("engine.base_layer_v1.Layer", layers[1]),
      ("layers.core.dense.Dense", dense)) if found is None]
  problem = None
  if missing:
    problem = (
        "TensorFlow %s with %s %s lacks %s, which EPL hooks. Use a version "
        "that epl.tf_compat.VERSIONS lists." % (
            tf.__version__, package,
            importlib.import_module(package).__version__,
            ", ".join(prefix + m for m in missing)))
    logger.debug("Keras hooks not installed: %s", problem)
  return KerasTargets(
      add_weight=tuple((layer, "add_weight") for layer in layers
                       if layer is not None),
      frozen_add_weight=tuple((layer, "add_weight") for layer in frozen
                              if layer is not None),
      dense_call=(dense, "__call__") if dense is not None else None,
      v1_dense=(tf.compat.v1.layers, "dense"),
      make_train_function=(model, "make_train_function") if model else None,
      v1_make_train_function=(
          (v1_model, "_make_train_function") if v1_model else None),
      v1_make_predict_function=(
          (v1_model, "_make_predict_function") if v1_model else None),
      v1_compile=(v1_model, "compile") if v1_model else None,
      session_holder=session_holder,
      layer_call=(layers[0], "__call__") if layers[0] else None,
      graph_function_callable=(
          (graph_function, "_make_callable") if graph_function else None),
      problem=problem)


def build_layer(layer, inputs):
  """Makes Keras 2 `layer` create its weights for `inputs`, as its first
  call would (eager variables, also while a step is traced), without
  calling it."""
  layer._maybe_build(inputs)  # pylint: disable=protected-access


def count_train_step(model):
  """Adds one to the step count Keras keeps for `Model.fit` (what its own
  train function does after each step)."""
  model._train_counter.assign_add(1)  # pylint: disable=protected-access


def output_loss_results(model):
  """Names of the result tensors of the metrics Keras 2 builds in graph
  mode for a model with several outputs, one per output (`<output>_loss`:
  that output's loss averaged over the epoch's steps)."""
  metrics = model._output_loss_metrics or []  # pylint: disable=protected-access
  return {metric._call_result.name for metric in metrics  # pylint: disable=protected-access
          if hasattr(metric, "_call_result")}


def set_graph_function_callable(function, callable_fn, feeds, session):
  """Makes Keras backend function `function` (a GraphExecutionFunction)
  run `callable_fn(*fed_arrays, run_metadata=...)`, keeping what Keras
  compares at each call to decide whether to make a callable again.
  `feeds` is (feed_arrays, feed_symbols, symbol_vals), as Keras passes
  them to `_make_callable`."""
  # pylint: disable=protected-access
  feed_arrays, feed_symbols, symbol_vals = feeds
  function._callable_fn = callable_fn
  function._feed_arrays = feed_arrays
  function._feed_symbols = feed_symbols
  function._symbol_vals = symbol_vals
  function._fetches = list(function.fetches)
  function._session = session


def is_keras_session(session):
  """Whether `session` is the one Keras 2 runs its graph-mode functions
  in (its own, or the one given to `set_session`)."""
  holder = targets().session_holder
  return holder is not None and getattr(holder, "session", None) is session


def set_session(session):
  """Makes `session` the one Keras 2 runs its graph-mode functions in."""
  tf.compat.v1.keras.backend.set_session(session)


def graph_function_step(function):
  """(fetches, target, fed keys) of Keras backend function `function`: the
  tensors it returns (its outputs, then its extra fetches), the op that
  runs its updates, and the extra tensors of its `feed_dict` in the order
  it feeds them, after the arrays its caller passes."""
  extra = sorted(function.feed_dict.keys()) if function.feed_dict else []
  return (list(function.outputs) + list(function.fetches),
          function.updates_op, extra)


def set_predict_outputs(model, outputs):
  """Makes Keras 2's graph-mode `model.predict` fetch `outputs` instead of
  the model's outputs: its predict function as `training_v1.Model.
  _make_predict_function` builds it, with those outputs."""
  # pylint: disable=protected-access
  backend = importlib.import_module(_keras_package() + ".src.backend")
  model.predict_function = backend.function(
      model._feed_inputs, outputs, updates=model.state_updates,
      name="predict_function", **getattr(model, "_function_kwargs", {}))


def steps_per_execution(model):
  """`Model.compile(steps_per_execution=...)`, 1 when unset."""
  steps = model._steps_per_execution  # pylint: disable=protected-access
  return 1 if steps is None else int(steps.numpy())


def tf_variable_of(source):
  """The tf.Variable behind `source`: itself, or the one a Keras 3
  variable (TensorFlow backend) holds as its `value`; None for anything
  else."""
  if isinstance(source, tf.Variable):
    return source
  value = getattr(source, "value", None) if "keras" in type(
      source).__module__ else None
  return value if isinstance(value, tf.Variable) else None


def keras3_training_targets():
  """Keras 3's optimizer `apply` and Model.fit/train_on_batch, when
  tf.keras is Keras 3; () otherwise."""
  try:
    keras3 = tf.keras
    if not str(getattr(keras3, "__version__", "")).startswith("3."):
      return ()
    return ((keras3.optimizers.Optimizer, "apply"),
            (keras3.Model, "fit"),
            (keras3.Model, "train_on_batch"))
  except Exception:  # pylint: disable=broad-except  (no Keras at all)
    return ()


def fix_for_legacy_keras():
  """How to get Keras 2 on this TensorFlow: tf-keras of its version and
  TF_USE_LEGACY_KERAS=1."""
  return ("pip install 'tf-keras~=%s.0' and set TF_USE_LEGACY_KERAS=1 "
          "before TensorFlow is imported" % tf.__version__.rsplit(".", 1)[0])


class Keras3MissingError(AttributeError):
  """A TF1 Keras 2 API used under Keras 3. An AttributeError, as
  TensorFlow's own (so `hasattr` answers False), that names the fix."""


class Keras3MissingModule(types.ModuleType):
  """Stands for a TF1 module that Keras 3 lacks (`tf.compat.v1.layers`):
  its first use raises EPL's error, which names the fix, rather than
  TensorFlow's ("`dense` is not available with Keras 3")."""

  def __getattr__(self, attribute):
    if attribute.startswith("__"):
      raise AttributeError(attribute)
    raise Keras3MissingError(
        "%s.%s is not available: TensorFlow %s uses Keras 3 (keras %s), "
        "which has no TF1 layers or RNN cells. Use Keras 2: %s (`make "
        "venv-latest` builds an environment with both)." % (
            self.__name__, attribute, tf.__version__, tf.keras.__version__,
            fix_for_legacy_keras()))


def init_notice():
  """(logging level, line) that `epl.init` logs about the Keras behind
  tf.keras, or None when there is nothing to say: TF_USE_LEGACY_KERAS
  removed (`epl.tf_compat.keras_selection`), or Keras 3 behind
  tf.compat.v1.layers. Keras 3 is a WARNING unless the environment chose it
  (TF_USE_LEGACY_KERAS=0): the script uses only what EPL supports of it."""
  dropped = keras_selection.dropped()
  removed = (
      "TF_USE_LEGACY_KERAS=%s was removed from this process's environment: "
      "tf-keras is not installed, and TensorFlow's tf.keras fails with the "
      "variable set and no tf-keras (RecursionError)" % dropped
      if dropped is not None else None)
  package = _keras_package()
  if package is not None:
    if removed is None:
      return None
    return logging.WARNING, "epl.init: %s; TensorFlow %s uses Keras 2 " \
        "(package %s) without it." % (removed, tf.__version__, package)
  keras3 = (
      "TensorFlow %s uses Keras 3: tf.compat.v1.layers, the v1 RNN cells, "
      "epl.split, Model.fit and Keras 3 optimizers outside a tf.function "
      "train step will raise (EPL supports Keras 3 layers trained in an "
      "eager loop over a tf.function step, or by a tf.compat.v1.train "
      "optimizer in a TF1 graph)" %
      tf.__version__)
  if keras_selection.keras3_requested():
    return logging.INFO, "epl.init: %s; TF_USE_LEGACY_KERAS=%s chose it." % (
        keras3, keras_selection.value())
  return logging.WARNING, "epl.init: %s%s. Fix: %s." % (
      removed + "; " if removed else "", keras3, fix_for_legacy_keras())


def keras3_training_error(what):
  """The error for a Keras 3 training entry point (`what`) used under
  EPL."""
  return RuntimeError(
      "EPL does not support %s: TensorFlow %s uses Keras %s, whose "
      "Model.fit/train_on_batch, and optimizers outside a tf.function "
      "train step, update variables outside a training step that EPL "
      "parallelises. With eager execution on, call the Keras 3 optimizer "
      "in your own @tf.function train step (GradientTape, "
      "optimizer.apply_gradients: EPL rewrites it, docs/tf2.md); in a TF1 "
      "graph, train with a tf.compat.v1.train optimizer (minimize or "
      "compute_gradients/apply_gradients) and tf.compat.v1.Session; or use "
      "Keras 2: %s, then Model.fit and tf.keras.optimizers.legacy "
      "optimizers work under EPL." % (
          what, tf.__version__, tf.keras.__version__, fix_for_legacy_keras()))


def require_layer_hooks(feature):
  """Raises, naming the TensorFlow version and the fix, when `feature`
  (such as "epl.split") needs Keras hooks that could not be installed."""
  problem = targets().problem
  if problem is not None:
    raise RuntimeError("%s needs EPL's Keras layer hooks: %s" %
                       (feature, problem))
