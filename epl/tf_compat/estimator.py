"""tf.estimator (the `tensorflow-estimator` package, TF 2.15 only: it is
gone from TF 2.16).

When the package does not import, `available()` is False, `TARGETS` is
empty and EPL installs no Estimator hook.
"""
try:
  from tensorflow_estimator.python.estimator import estimator as _estimator_lib
  from tensorflow_estimator.python.estimator import run_config as _run_config
  from tensorflow_estimator.python.estimator.mode_keys import ModeKeys
except ImportError:
  _estimator_lib = _run_config = ModeKeys = None

if _estimator_lib is not None:
  RUN_CONFIG_INIT = (_run_config.RunConfig, "__init__")
  CALL_MODEL_FN = (_estimator_lib.Estimator, "_call_model_fn")
  LATEST_CHECKPOINT = (_estimator_lib.Estimator, "latest_checkpoint")
  EVALUATE = (_estimator_lib.Estimator, "evaluate")
  TRAIN = ModeKeys.TRAIN
else:
  RUN_CONFIG_INIT = CALL_MODEL_FN = LATEST_CHECKPOINT = EVALUATE = None
  TRAIN = None


def available():
  """Whether tf.estimator imports in this process."""
  return _estimator_lib is not None
