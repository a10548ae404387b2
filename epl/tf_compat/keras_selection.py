"""TF_USE_LEGACY_KERAS: which Keras TensorFlow puts behind `tf.keras` and
`tf.compat.v1.layers`, read from the environment when they are first used.

Set to 1 ("true", "True"), TensorFlow imports the `tf_keras` package; when
that is not installed (TF 2.15's environment, which has its own Keras 2,
or a TF 2.16+ environment without tf-keras), its lazy loader logs a warning
and then recurses without end on the next attribute (`RecursionError`): a
variable exported for one environment breaks another in the same shell.
`import epl` removes the variable from such a process before TensorFlow
first reads it (`drop_unusable_request`), and `epl.init` says so
(`epl.tf_compat.keras.init_notice`). A script that uses tf.keras before
importing epl has already met TensorFlow's error.

This module does not import TensorFlow: `import epl` stays light.
"""
import importlib.util
import os

VARIABLE = "TF_USE_LEGACY_KERAS"
# The values TensorFlow takes for "use tf_keras".
_TRUE = ("true", "True", "1")
# The value `drop_unusable_request` removed, if it did.
_dropped = []


def value():
  """TF_USE_LEGACY_KERAS as the environment has it now, or None."""
  return os.environ.get(VARIABLE)


def legacy_requested():
  """Whether the environment asks TensorFlow for tf_keras."""
  return value() in _TRUE


def keras3_requested():
  """Whether the environment says no to tf_keras explicitly (such as
  TF_USE_LEGACY_KERAS=0): the script means to run under Keras 3."""
  return bool(value()) and not legacy_requested()


def tf_keras_installed():
  return importlib.util.find_spec("tf_keras") is not None


def drop_unusable_request():
  """Removes TF_USE_LEGACY_KERAS from this process's environment when it
  asks for tf_keras and tf_keras is not installed."""
  if legacy_requested() and not tf_keras_installed():
    _dropped.append(os.environ.pop(VARIABLE))


def dropped():
  """The value of TF_USE_LEGACY_KERAS that `drop_unusable_request`
  removed, or None."""
  return _dropped[0] if _dropped else None
