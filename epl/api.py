"""The entry points that set EPL up and take it down: `epl.init`,
`epl.shutdown`, `epl.set_default_strategy`."""
import logging

import tensorflow as tf

from epl import cluster
from epl import hooks
from epl.config import Config
from epl.env import Env
from epl.ir.graph_state import state_of
from epl.parallel.plan import planner
from epl.runtime import cpu_threads
from epl.runtime import eager_devices
from epl.runtime import server
from epl.strategies.strategy import Replicate, require_devices
from epl.tf_compat import graph_edit
from epl.tf_compat import keras

logger = logging.getLogger("epl")


def set_default_strategy(strategy):
  """Every op built outside a strategy scope belongs to `strategy`.

  Switching the default to another strategy starts a new TaskGraph (a
  pipeline stage): the original EPL's idiom, which FastNN's BERT pipelines
  use with unnamed strategies. Because calling it twice by mistake would
  build a 2-stage pipeline, an unnamed switch is logged as a warning that
  names the new stage (named stages are logged at INFO), and a pipeline
  wider than the cluster fails at this call, naming the stages.
  EPL starts keeping the default graph's state here, as the original EPL
  did, so that `epl.Graph.get()` taken right after this call is the view
  that the model built next fills in.
  """
  if strategy is not None and not isinstance(strategy, Replicate):
    raise ValueError(
        "epl.set_default_strategy expects epl.replicate(...), got %r; a "
        "split part is built inside `with epl.split(...):`." % (strategy,))
  env = Env.require()
  previous = env.default_strategy
  if (strategy is not None and previous is not None and
      strategy is not previous):
    log = logger.info if strategy.named and previous.named else (
        logger.warning)
    log("epl.set_default_strategy(%r) after %r: the ops built from here on "
        "form a new pipeline stage. For data parallelism alone call it "
        "once; name the stages (epl.replicate(1, name=\"stage_1\")) to "
        "say that a pipeline is meant.", strategy, previous)
  if strategy is not None:
    require_devices(strategy)
  env.default_strategy = strategy
  state_of(tf.compat.v1.get_default_graph(), create=True)


def _configure_logging():
  if not logger.handlers:
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[EPL %(levelname)s] %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def _refuse_built_model(graph):
  """Raises when `graph`, the graph the model is about to be built in,
  already holds variables: EPL captures a model while it is built, so a
  model built before `epl.init` would not be parallelised."""
  with graph.as_default():
    built = tf.compat.v1.global_variables()
  if built:
    raise RuntimeError(
        "epl.init() is called after the model was built: the default graph "
        "already holds %d variable(s) (%s). EPL records the model while it "
        "is built: call epl.init() before building it (a plain TensorFlow "
        "model built first belongs inside `with tf.Graph().as_default():`)."
        % (len(built), ", ".join(repr(v.op.name) for v in built[:3]) +
           (", ..." if len(built) > 3 else "")))


def init(config=None):
  """Initialises EPL; call once before building the model.

  Leaves eager execution as the script set it (a TF1 script switches it
  off itself; a TF2 script's `tf.function` steps are rewritten when
  traced: docs/tf2.md), reads the cluster (TF_CONFIG, devices), installs the capture and session hooks, and
  in a multi-worker job starts this worker's tf.distribute.Server (with
  eager execution on, the eager context serves the worker instead).
  Calling it again starts afresh with the new config, in the same
  `epl.Env.get()` object; as in the original EPL, it then also resets
  TensorFlow's default graph unless a `with graph.as_default():` block is
  open, so that the model is built again from an empty graph. A first call
  whose default graph already holds variables raises: the model was built
  before EPL could record it.
  """
  _configure_logging()
  if config is None:
    config = Config()
  elif isinstance(config, dict):
    config = Config(config)
  elif not isinstance(config, Config):
    raise ValueError("epl.init(config=...) expects epl.Config or a dict, got "
                     "%r." % (config,))
  unbuilt = config.unbuilt_settings()
  if unbuilt:
    logger.warning("epl.init: these settings are accepted but their feature "
                   "is not built yet, so they have no effect: %s", unbuilt)
  job = cluster.Cluster.from_environment(config)
  if Env.initialised() and not graph_edit.in_graph_context():
    tf.compat.v1.reset_default_graph()
  else:
    _refuse_built_model(tf.compat.v1.get_default_graph())
  env = Env.get()
  env.reset(config, job)
  cluster.set_layout_planner(planner.planned_virtual_devices)
  env.cpu_threads = cpu_threads.plan_at_init(config, job)
  eager_devices.ensure_logical_cpus(job, env.cpu_threads)
  hooks.install()
  notice = keras.init_notice()
  if notice is not None:
    logger.log(*notice)
  # A multi-worker job (TF_CONFIG) starts this worker's gRPC server now, so
  # that peers can reach it before the first collective.
  server.start(env)
  logger.info("epl.init: %s", env.cluster)
  return env


def shutdown():
  """Forgets the environment and removes EPL's hooks from TensorFlow.

  After it, graphs build and run as plain TensorFlow (used by tests that
  compare against single-device training in the same process).
  """
  hooks.uninstall()
  Env.install(None)
