"""tf.estimator (the `tensorflow-estimator` package, TF 2.15 only: it is
gone from TF 2.16), read only once the user's script imports it.

Importing the package marks TensorFlow's session-run hooks
(`StopAtStepHook`, `SessionRunArgs`, ...) deprecated, so a script that
never uses the Estimator would print deprecation warnings under EPL that
it does not print without it. EPL therefore never imports it itself:
`when_imported` runs a callback once the script has imported it (at once
when it already has). When the package is not installed, `available()` is
False and the callback never runs.
"""
import importlib.abc
import importlib.util
import sys

# Imported by every way into the Estimator (tf.estimator, the package's
# own API modules); the others below come with it.
_ESTIMATOR = "tensorflow_estimator.python.estimator.estimator"


def available():
  """Whether tensorflow-estimator is installed (it is not imported)."""
  return importlib.util.find_spec("tensorflow_estimator") is not None


def imported():
  """Whether this process has imported the Estimator."""
  return _ESTIMATOR in sys.modules


def targets():
  """(RunConfig.__init__, Estimator._call_model_fn,
  Estimator.latest_checkpoint, Estimator.evaluate) as (owner, attribute)
  pairs; only once `imported()`."""
  # pylint: disable=import-outside-toplevel
  from tensorflow_estimator.python.estimator import estimator
  from tensorflow_estimator.python.estimator import run_config
  return ((run_config.RunConfig, "__init__"),
          (estimator.Estimator, "_call_model_fn"),
          (estimator.Estimator, "latest_checkpoint"),
          (estimator.Estimator, "evaluate"))


def train_mode():
  """ModeKeys.TRAIN; only once `imported()`."""
  # pylint: disable=import-outside-toplevel
  from tensorflow_estimator.python.estimator.mode_keys import ModeKeys
  return ModeKeys.TRAIN


class _CallAfterLoading(importlib.abc.Loader):
  """A module's own loader, then `callback()` once the module ran."""

  def __init__(self, loader, callback):
    self._loader = loader
    self._callback = callback

  def create_module(self, spec):
    return self._loader.create_module(spec)

  def exec_module(self, module):
    self._loader.exec_module(module)
    self._callback()

  def __getattr__(self, name):
    return getattr(self._loader, name)


class _EstimatorWatch(importlib.abc.MetaPathFinder):
  """Finds the Estimator module as the other finders do and calls
  `callback()` once it is loaded; then takes itself off sys.meta_path."""

  def __init__(self, callback):
    self._callback = callback

  def find_spec(self, fullname, path, target=None):
    if fullname != _ESTIMATOR:
      return None
    cancel()
    spec = importlib.util.find_spec(fullname)
    if spec is not None and spec.loader is not None:
      spec.loader = _CallAfterLoading(spec.loader, self._callback)
    return spec


def when_imported(callback):
  """Calls `callback()` once the Estimator is imported: now if it already
  is, never if it is not installed. Replaces an earlier callback not yet
  called."""
  cancel()
  if imported():
    callback()
  elif available():
    sys.meta_path.insert(0, _EstimatorWatch(callback))


def cancel():
  """Forgets the callback `when_imported` is waiting to call."""
  sys.meta_path[:] = [f for f in sys.meta_path
                      if not isinstance(f, _EstimatorWatch)]
