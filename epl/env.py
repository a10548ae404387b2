"""The process-wide EPL environment: what `epl.init` set up.

A leaf module: it holds state (config, cluster, strategy scopes, and
whether this thread runs TensorFlow without EPL) and imports nothing else
of EPL, so every module may read it. The entry points
that build an environment (`epl.init`, `epl.shutdown`) live in `epl.api`.
Capture state of each graph lives on the graph (`epl.ir.graph_state`).
"""
import contextlib
import itertools
import threading

_generations = itertools.count(1)


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


def active():
  """The environment EPL's hooks act for: None before `epl.init`, after
  `epl.shutdown` and inside `detached()`."""
  if _detached.value or not Env.initialised():
    return None
  return Env.get()


class StrategyNestingError(RuntimeError, ValueError):
  """A strategy scope opened inside another. The original EPL raised
  RuntimeError; EPL's checks raise ValueError: this is both."""


class Env:
  """The process's EPL environment: `Env.get().config` and
  `Env.get().cluster`.

  As in the original EPL there is one, for the whole process: `Env.get()`
  before `epl.init` returns it uninitialised (config and cluster None), and
  each `epl.init` starts it afresh in place, so an `Env.get()` held from
  before sees the new config and cluster.
  """

  _instance = None

  def __init__(self, config=None, cluster=None):
    self.reset(config, cluster)

  def reset(self, config, cluster):
    """Starts this environment afresh with `config` and `cluster` (None,
    None: uninitialised)."""
    self.config = config
    self.cluster = cluster
    self.default_strategy = None
    # How the CPU devices share the cores (runtime.cpu_threads.ThreadPlan),
    # decided by epl.init.
    self.cpu_threads = None
    # Distinguishes environments: a graph's capture state belongs to the
    # environment that made it, and a later epl.init starts afresh.
    self.generation = next(_generations)
    self._scopes = threading.local()

  @classmethod
  def get(cls):
    """The process's environment, created uninitialised on first use."""
    if cls._instance is None:
      cls._instance = cls()
    return cls._instance

  @classmethod
  def initialised(cls):
    """True between `epl.init` and `epl.shutdown`."""
    return cls._instance is not None and cls._instance.config is not None

  @classmethod
  def require(cls):
    """The environment of the last `epl.init`; raises if there was none."""
    if not cls.initialised():
      raise RuntimeError(
          "EPL is not initialised: call epl.init() before building the model.")
    return cls._instance

  @classmethod
  def install(cls, env):
    cls._instance = env

  # Strategy scopes: per thread, as TensorFlow's own graph scopes are.

  @property
  def active_strategy(self):
    return getattr(self._scopes, "strategy", None)

  def enter_strategy(self, strategy):
    if self.config.auto.auto_parallel:
      raise ValueError(
          "auto.auto_parallel is on, so EPL chooses the stages itself: the "
          "model must not enter strategy scopes (%r was entered). Remove the "
          "epl.replicate/epl.split scopes, or set auto.auto_parallel to "
          "False to annotate the model by hand." % (strategy,))
    if self.active_strategy is not None:
      raise StrategyNestingError(
          "Strategies do not nest: %r was opened inside %r. Close the outer "
          "scope first; to give one stage several kinds of parallelism use "
          "consecutive scopes." % (strategy, self.active_strategy))
    self._scopes.strategy = strategy

  def exit_strategy(self, strategy):
    assert self.active_strategy is strategy
    self._scopes.strategy = None

  def current_strategy(self):
    """The strategy new ops belong to: the open scope, else the default."""
    return self.active_strategy or self.default_strategy
