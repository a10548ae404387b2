"""The process-wide EPL environment: config, cluster, strategies, captures."""
import logging
import weakref

import tensorflow as tf

from epl.ir.graph_state import GraphState

logger = logging.getLogger("epl")


class Env:
  """What `epl.init` set up: `Env.get().config` and `Env.get().cluster`."""

  _instance = None

  def __init__(self, config, cluster):
    self.config = config
    self.cluster = cluster
    self.default_strategy = None
    self._active_strategy = None
    self._graph_states = weakref.WeakKeyDictionary()

  @classmethod
  def get(cls):
    """The environment of the last `epl.init`; raises if there was none."""
    if cls._instance is None:
      raise RuntimeError(
          "EPL is not initialised: call epl.init() before building the model.")
    return cls._instance

  @classmethod
  def initialised(cls):
    return cls._instance is not None

  # Strategy scopes.

  def enter_strategy(self, strategy, graph):
    if self._active_strategy is not None:
      raise ValueError(
          "Strategies do not nest: %r was opened inside %r. Close the outer "
          "scope first; to give one stage several kinds of parallelism use "
          "consecutive scopes." % (strategy, self._active_strategy))
    self.graph_state(graph).taskgraph_for(strategy)
    self._active_strategy = strategy

  def exit_strategy(self, strategy):
    assert self._active_strategy is strategy
    self._active_strategy = None

  def current_strategy(self):
    """The strategy new ops belong to: the open scope, else the default."""
    return self._active_strategy or self.default_strategy

  # Capture state.

  def graph_state(self, graph, create=True):
    """The GraphState of `graph`; None when absent and not `create`."""
    state = self._graph_states.get(graph)
    if state is None and create:
      state = GraphState(graph)
      self._graph_states[graph] = state
    return state


def set_default_strategy(strategy):
  """Every op built outside a strategy scope belongs to `strategy`."""
  from epl.strategies.strategy import Replicate  # pylint: disable=import-outside-toplevel
  if strategy is not None and not isinstance(strategy, Replicate):
    raise ValueError(
        "epl.set_default_strategy expects epl.replicate(...), got %r; a "
        "split part is built inside `with epl.split(...):`." % (strategy,))
  Env.get().default_strategy = strategy


def _ensure_graph_mode():
  """EPL rewrites graphs: switch eager TF2 to graph mode before any build."""
  if tf.executing_eagerly():
    tf.compat.v1.disable_eager_execution()
    logger.info("epl.init: eager execution was on; switched to graph mode "
                "(tf.compat.v1.disable_eager_execution).")


def _configure_logging():
  if not logger.handlers:
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[EPL %(levelname)s] %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def init(config=None):
  """Initialises EPL; call once before building the model.

  Switches TensorFlow to graph mode if it is executing eagerly, reads the
  cluster (TF_CONFIG, devices), installs the capture and session hooks, and
  in a multi-worker job starts this worker's tf.distribute.Server.
  Calling it again starts afresh with the new config.
  """
  from epl import patches  # pylint: disable=import-outside-toplevel
  from epl.cluster import Cluster  # pylint: disable=import-outside-toplevel
  from epl.config import Config  # pylint: disable=import-outside-toplevel
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
  _ensure_graph_mode()
  Env._instance = Env(config, Cluster.from_environment(config))  # pylint: disable=protected-access
  patches.install()
  # A multi-worker job (TF_CONFIG) starts this worker's gRPC server now, so
  # that peers can reach it before the first collective.
  from epl.runtime import server  # pylint: disable=import-outside-toplevel
  server.get_or_start(Env._instance)  # pylint: disable=protected-access
  logger.info("epl.init: %s", Env._instance.cluster)  # pylint: disable=protected-access
  return Env._instance  # pylint: disable=protected-access


def shutdown():
  """Forgets the environment and removes EPL's hooks from TensorFlow.

  After it, graphs build and run as plain TensorFlow (used by tests that
  compare against single-device training in the same process).
  """
  from epl import patches  # pylint: disable=import-outside-toplevel
  patches.uninstall()
  Env._instance = None
