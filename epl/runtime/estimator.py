"""tf.estimator.Estimator under EPL.

The Estimator builds a fresh graph for each `train`, `evaluate` and
`predict` call, calls the user's `model_fn` in it and runs it with a
`MonitoredTrainingSession`, so EPL's usual path applies to training: the
graph is rewritten when the session freezes it, with the strategies set by
`epl.set_default_strategy` or the stage scopes inside `model_fn`.

What changes, because EPL drives the job:

- `RunConfig` ignores `TF_CONFIG` (epl-launch and schedulers set it for
  EPL; the Estimator would otherwise set up its own parameter-server or
  distribute-coordinator job from it), `train_distribute`,
  `eval_distribute` and `device_fn` (EPL places the ops), each with a
  warning. Every worker then trains as the Estimator's local chief; EPL
  makes the workers one job, worker 0 alone writes checkpoints
  (`epl.runtime.checkpoint`) and events (`epl.runtime.summaries`).
- `model_fn` called for evaluation or prediction builds plain
  single-device TensorFlow: EPL captures nothing there, so those graphs
  are never rewritten, even when `model_fn` also builds a train op.
- In a multi-worker job a worker other than 0 that looks for the latest
  checkpoint (to evaluate it, also in `train_and_evaluate`) waits until
  worker 0 has written the one its own training just saved
  (`epl.runtime.checkpoint.wait_for_worker_zero`): every worker evaluates
  the same, final weights.
- A default strategy set inside `model_fn` is undone when it returns, so
  that the next graph's input pipeline is built as the first one was.
"""
import inspect
import logging
import os

from epl.env import Env, detached
from epl.runtime import checkpoint
from epl.tf_compat import estimator as tf_estimator

logger = logging.getLogger("epl")

_TF_CONFIG = "TF_CONFIG"
_IGNORED_ARGUMENTS = ("train_distribute", "eval_distribute", "device_fn")


def run_config_init(original, run_config, *args, **kwargs):
  """RunConfig.__init__ without TF_CONFIG, distribution strategies or
  device functions."""
  arguments = inspect.signature(original).bind(run_config, *args, **kwargs)
  for name in _IGNORED_ARGUMENTS:
    if arguments.arguments.get(name) is not None:
      logger.warning(
          "EPL: RunConfig(%s=...) is ignored: EPL distributes and places "
          "the model itself (set its strategies with epl.replicate).", name)
      arguments.arguments[name] = None
  tf_config = os.environ.pop(_TF_CONFIG, None)
  if tf_config is not None:
    logger.warning(
        "EPL: RunConfig ignores TF_CONFIG: EPL runs the multi-worker job "
        "from it, and every worker trains as the Estimator's local chief.")
  try:
    original(*arguments.args, **arguments.kwargs)
  finally:
    if tf_config is not None:
      os.environ[_TF_CONFIG] = tf_config


def call_model_fn(original, estimator, features, labels, mode, config):
  """Estimator._call_model_fn: EPL captures the training graph only.

  A default strategy that model_fn sets (a pipeline's last stage, for the
  loss and optimizer) holds for that model only: the Estimator builds its
  next graph's input pipeline under the default set outside model_fn.
  """
  if mode == tf_estimator.train_mode():
    env = Env.get()
    default_strategy = env.default_strategy
    try:
      return original(estimator, features, labels, mode, config)
    finally:
      env.default_strategy = default_strategy
  logger.debug("EPL leaves the Estimator's %s graph single-device.", mode)
  with detached():
    return original(estimator, features, labels, mode, config)


def latest_checkpoint(env, original, estimator):
  """Estimator.latest_checkpoint, once worker 0 wrote this worker's last
  save."""
  if env.cluster.is_distributed and env.cluster.worker_index:
    checkpoint.wait_for_worker_zero(env, estimator.model_dir)
  return original(estimator)


def evaluate(original, estimator, *args, **kwargs):
  """Estimator.evaluate, of the checkpoint `latest_checkpoint` gives when
  none is named (the original reads the directory directly)."""
  arguments = inspect.signature(original).bind(estimator, *args, **kwargs)
  if not arguments.arguments.get("checkpoint_path"):
    arguments.arguments["checkpoint_path"] = estimator.latest_checkpoint()
  return original(*arguments.args, **arguments.kwargs)
