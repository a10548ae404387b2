"""Strategy scopes that mark which part of the model runs how.

A strategy is a context manager. Ops created inside it belong to the
strategy's TaskGraph in the current default graph. Only the forward part of
the model is annotated: the backward and apply ops follow the forward ops
they come from. Strategies do not nest.
"""
import itertools

import tensorflow as tf

from epl import config as epl_config
from epl.env import Env
from epl.ir.graph_state import state_of
from epl.tf_compat import keras

_auto_name_counter = itertools.count()


class Strategy:
  """Base class of the parallel strategies."""

  kind = "strategy"
  # The device count used when the user passes None.
  default_device_count = 1

  def __init__(self, device_count=None, name=None):
    if device_count is not None and (
        isinstance(device_count, bool) or not isinstance(device_count, int) or
        device_count < 1):
      raise ValueError(
          "epl.%s(device_count=%r): device_count must be a positive int or "
          "None." % (self.kind, device_count))
    if name is not None and not isinstance(name, str):
      raise ValueError("epl.%s(name=%r): name must be a string." %
                       (self.kind, name))
    self.device_count = (self.default_device_count
                         if device_count is None else device_count)
    # Whether the user named the scope (a pipeline stage is known by name).
    self.named = bool(name)
    self.name = name or "%s_%d" % (self.kind, next(_auto_name_counter))

  def __enter__(self):
    env = Env.require()
    env.enter_strategy(self)
    try:
      require_devices(self)
    except ValueError:
      env.exit_strategy(self)
      raise
    # The TaskGraph exists from now on, so that TaskGraphs are ordered as
    # their scopes were first entered.
    state_of(tf.compat.v1.get_default_graph(), create=True).taskgraph_for(
        self)
    return self

  def __exit__(self, exc_type, *_):
    Env.get().exit_strategy(self)
    if exc_type is not None:
      state = state_of(tf.compat.v1.get_default_graph())
      if state is not None:
        state.discard_if_empty(self)
    return False

  def __repr__(self):
    return "epl.%s(device_count=%r, name=%r)" % (self.kind, self.device_count,
                                                 self.name)


class Replicate(Strategy):
  """Data parallelism: every device of the slice holds a whole copy."""
  kind = "replicate"


class Split(Strategy):
  """Tensor/expert parallelism: the ops are sharded over the device slice.

  The layers built inside are lowered to sharded ops
  (`epl.parallel.ops.split_lowering`, `epl.parallel.ops.expert_lowering`); the rewrite makes
  each data-parallel replica's copy one shard (`epl.parallel.passes.split`).
  """
  kind = "split"
  # None: every device of the job, resolved by the planner.
  default_device_count = None

  def __enter__(self):
    # The lowerings hook Keras layers: without those hooks the layers
    # built inside would silently stay unsharded.
    keras.require_layer_hooks("epl.split")
    return super().__enter__()


def require_single_device_stages(stages):
  """Raises for a pipeline (several replicate scopes, `stages` their
  strategies or TaskGraphs) with a stage of several devices, which EPL
  does not build: each stage runs on one device per replica, and the
  data-parallel degree comes from the devices left."""
  if len(stages) > 1 and any(s.device_count != 1 for s in stages):
    raise NotImplementedError(
        "Pipeline stages with device_count > 1 (%s) are not built; give "
        "each stage epl.replicate(device_count=1): EPL then runs as many "
        "replicas of the pipeline as the devices allow (8 devices, 2 "
        "stages: 4 replicas)." %
        ", ".join("%s:%d" % (s.name, s.device_count) for s in stages))


def require_devices(strategy):
  """Raises now, before the model is built, when the cluster cannot hold
  `strategy` with the TaskGraphs the default graph has so far: a scope
  wider than the cluster, or replicate scopes (a pipeline's stages) that
  need more devices per replica together than it has (their count
  divided by pipeline.virtual_stages, rounded up)."""
  state = state_of(tf.compat.v1.get_default_graph())
  strategies = {t.name: t.strategy
                for t in (state.taskgraphs if state is not None else [])}
  strategies.setdefault(strategy.name, strategy)
  cluster = Env.get().cluster
  if any(isinstance(s, Split) for s in strategies.values()):
    # Split and replicate parts share the devices (epl.parallel.plan.planner).
    cluster.require_devices(strategy.device_count or 0, repr(strategy))
    return
  replicated = list(strategies.values())
  require_single_device_stages(replicated)
  # With pipeline.virtual_stages v, v stages share a device (ZB-V: 2).
  virtual_stages = epl_config.stages_per_device(Env.get().config)
  cluster.require_devices(
      -(-sum(s.device_count for s in replicated) // virtual_stages),
      "%r: the model (per replica: %s%s)" % (strategy, " + ".join(
          "%s:%d" % (s.name, s.device_count) for s in replicated),
          ", %d stages per device" % virtual_stages
          if virtual_stages > 1 else ""))


def replicate(device_count=None, name=None):
  """A data-parallel strategy scope of `device_count` devices (default 1)."""
  return Replicate(device_count, name)


def split(device_count=None, name=None):
  """A tensor/expert-parallel strategy scope of `device_count` devices."""
  return Split(device_count, name)
