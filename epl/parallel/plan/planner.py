"""The plan: replicas, device slices, micro-batches and every decision the
passes apply, as plain data.

A plan is computed from the cluster, the TaskGraphs' strategies and the
configuration, before any graph is touched, so it can be printed and
unit-tested alone. `plan_of` is its one entry point for a graph: the
rewrite, the session set-up, serving and input slicing all get their plan
there.
"""
import dataclasses
import weakref
from typing import List, Optional

import tensorflow as tf

from epl import config as epl_config
from epl.cluster import VirtualDevice
from epl.env import Env
from epl.ir import graph_state
from epl.parallel.plan import auto
from epl.parallel.plan import decisions as plan_decisions
from epl.parallel.plan import pipeline_order
from epl.parallel.plan import stage_activations
from epl.parallel.plan import weight_partition
from epl.strategies.strategy import (Replicate, Split,
                                     require_single_device_stages)


@dataclasses.dataclass
class TaskGraphPlan:
  name: str
  kind: str
  device_count: int


@dataclasses.dataclass
class Plan:
  """How the model is laid out on the cluster.

  `devices[r][t]` is the device (a TF device string) of TaskGraph `t` in
  model replica `r`; replicas are numbered globally over all workers.
  """
  taskgraphs: List[TaskGraphPlan]
  num_replicas: int
  devices: List[List[str]]
  device_workers: List[List[int]]
  worker_index: int
  num_micro_batch: int
  # Stages per pipeline device (pipeline.virtual_stages, 2 under ZB-V):
  # `pipeline_order.device_of_stage` says which stages share a device.
  virtual_stages: int = 1
  # What the passes apply (micro-batches, precision, ZeRO, ...), with
  # reasons; set by make_plan.
  decisions: Optional[plan_decisions.Decisions] = None

  @property
  def schedule(self):
    """The pipeline schedule (a pipeline_order.Schedule)."""
    return self.decisions.schedule.value

  @property
  def num_stages(self):
    return len(self.taskgraphs)

  @property
  def has_split(self):
    """Split TaskGraphs share the devices of the data-parallel one: the
    TaskGraphs are then not pipeline stages."""
    return any(t.kind == "split" for t in self.taskgraphs)

  def device(self, replica, taskgraph_index):
    """The device of TaskGraph `taskgraph_index` in `replica`.

    A plan of one TaskGraph has one device per replica, whatever the
    index asked for; a pipeline has one per stage.
    """
    devices = self.devices[replica]
    return devices[min(taskgraph_index, len(devices) - 1)]

  @property
  def local_replicas(self):
    """Replicas whose first stage lives on this worker, in order."""
    return [r for r in range(self.num_replicas)
            if self.device_workers[r][0] == self.worker_index]

  def describe(self):
    lines = ["%d model replica(s) x %d TaskGraph(s), %d micro-batch(es), "
             "schedule %s" % (self.num_replicas, self.num_stages,
                              self.num_micro_batch, self.schedule.value)]
    if self.schedule.v_shaped:
      lines[0] += " in a V, 2 stages per device"
    elif self.virtual_stages > 1:
      lines[0] += " interleaved, %d stages per device" % self.virtual_stages
    for t, taskgraph in enumerate(self.taskgraphs):
      lines.append("  TaskGraph %d %r (%s): %s" % (
          t, taskgraph.name, taskgraph.kind,
          ", ".join(self.device(r, t) for r in range(self.num_replicas))))
    return "\n".join(lines)

  def virtual_devices(self, cluster):
    """The plan as the original EPL's VirtualDevices: one per TaskGraph,
    slice r holding its device in replica r. Split TaskGraphs share the
    devices of the data-parallel one: one VirtualDevice, as the original's
    "all" layout."""
    stages = 1 if self.has_split else self.num_stages
    return [VirtualDevice([[self.device(r, t)]
                           for r in range(self.num_replicas)], cluster)
            for t in range(stages)]

  def split_groups(self, taskgraph_index):
    """The replicas of each shard group of split TaskGraph
    `taskgraph_index`: consecutive replicas, k = its device count each."""
    count = self.taskgraphs[taskgraph_index].device_count
    return [list(range(start, start + count))
            for start in range(0, self.num_replicas, count)]


# GraphState -> (what its plan was made from, or None once the rewrite
# uses it; the plan).
_PLANS = weakref.WeakKeyDictionary()


def plan_of(graph, for_rewrite=False):
  """The plan of `graph`'s TaskGraphs on the current cluster and config.

  Made once and kept in the graph's state; made again only when the
  TaskGraphs or the configuration changed since, until the rewrite asks
  (`for_rewrite`): that plan is the graph's from then on, and takes the
  decisions that need the graph's records (zero.level v3's partitioned
  variables, `weight_partition`). None when the
  graph has no TaskGraph. When no plan can be made, the rewrite gets the
  error (ValueError or NotImplementedError); anyone else gets None (the
  rewrite reports it at the first run).
  """
  state = graph_state.state_of(graph)
  if state is None or not state.taskgraphs:
    return None
  env = Env.get()
  key = (len(state.taskgraphs), tuple(env.config.to_dict().items()))
  cached = _PLANS.get(state)
  fixed = cached is not None and cached[0] is None
  if fixed or (cached is not None and cached[0] == key):
    plan = cached[1]
  else:
    try:
      plan = make_plan(env.cluster, state.taskgraphs, env.config, graph)
    except (ValueError, NotImplementedError):
      if for_rewrite:
        raise
      return None
  if for_rewrite and not fixed:
    _decide_weights(graph, state, plan, env.config)
  if not fixed:
    _PLANS[state] = (None if for_rewrite else key, plan)
  return plan


def _decide_weights(graph, state, plan, config):
  """zero.level v3: which variables are partitioned, decided from the
  graph's records once its step is built (when the rewrite takes the
  plan)."""
  if plan.decisions.zero.value.partitions_weights:
    plan.decisions = dataclasses.replace(
        plan.decisions, partition=weight_partition.decide(
            graph, state, plan, config.zero.min_partition_size))


def make_plan(cluster, taskgraphs, config, graph=None):
  """Lays the TaskGraphs out on the cluster's devices and takes the
  decisions the passes apply (`decisions.decide`); a budget in bytes
  chooses the schedule from the step built in `graph`."""
  schedule = plan_decisions.decide_schedule(
      config, 1 if any(isinstance(t.strategy, Split) for t in taskgraphs)
      else len(taskgraphs),
      None if graph is None else lambda: stage_activations.measure(graph))
  plan = _layout(cluster, taskgraphs, config, schedule.value)
  plan.decisions = plan_decisions.decide(
      config, plan.num_stages, plan.has_split, cluster.device_type,
      len(plan.local_replicas) == plan.num_replicas, schedule,
      num_replicas=plan.num_replicas)
  return plan


def _layout(cluster, taskgraphs, config, schedule):
  """Lays the TaskGraphs out on the cluster's devices (as `schedule`
  places the stages).

  Devices per model replica are the sum of the TaskGraphs' device counts;
  the data-parallel degree is the total device count divided by that. A
  single `replicate(k)` TaskGraph is data parallel over every device (k
  only has to divide the device count).
  """
  if not taskgraphs:
    raise ValueError("No strategy scope was used: annotate the model with "
                     "epl.replicate(...) or call epl.set_default_strategy.")
  for taskgraph in taskgraphs:
    assert isinstance(taskgraph.strategy, (Replicate, Split)), taskgraph
  if any(isinstance(t.strategy, Split) for t in taskgraphs):
    return cluster.check_plan(_split_plan(cluster, taskgraphs, config,
                                          schedule))
  wanted_stages = config.pipeline.num_stages
  if wanted_stages != -1 and config.auto.auto_parallel:
    wanted_stages = auto.cut_stages(config)
  if wanted_stages != -1 and wanted_stages != len(taskgraphs):
    raise ValueError(
        "pipeline.num_stages is %d but the model has %d stage scope(s) (%s). "
        "Set pipeline.num_stages to -1 or to the number of scopes, or drop "
        "the scopes and set auto.auto_parallel to True to have EPL cut the "
        "stages itself." % (
            wanted_stages, len(taskgraphs),
            ", ".join(t.name for t in taskgraphs)))
  require_single_device_stages(taskgraphs)
  total = cluster.total_devices
  counts = [t.device_count for t in taskgraphs]
  virtual_stages = _check_virtual_stages(taskgraphs, config, schedule)
  per_replica = sum(counts) // virtual_stages
  cluster.require_devices(per_replica, "The model (per replica: %s)" % (
      " + ".join("%s:%d" % (t.name, t.device_count) for t in taskgraphs)))
  if total % per_replica:
    raise ValueError(
        "The cluster's %d devices do not divide into model replicas of %d "
        "device(s) each (%s). Use a device count that is a multiple of %d." %
        (total, per_replica, ", ".join(t.name for t in taskgraphs),
         per_replica))
  slots = 1 if len(taskgraphs) == 1 else per_replica
  num_replicas = total // slots
  devices, workers = [], []
  for replica in range(num_replicas):
    indices = [_device_index(replica, pipeline_order.device_of_stage(
        schedule, stage, slots), num_replicas, slots,
                             config.cluster.device_place_prefer_intra_node)
               for stage in range(len(taskgraphs))]
    devices.append([cluster.device_name(i) for i in indices])
    workers.append([cluster.worker_of(i) for i in indices])
  return cluster.check_plan(Plan(
      taskgraphs=[TaskGraphPlan(t.name, t.strategy.kind, t.device_count)
                  for t in taskgraphs],
      num_replicas=num_replicas,
      devices=devices,
      device_workers=workers,
      worker_index=cluster.worker_index,
      num_micro_batch=config.pipeline.num_micro_batch,
      virtual_stages=virtual_stages))


def _check_virtual_stages(taskgraphs, config, schedule):
  """The stages per pipeline device (pipeline.virtual_stages v, 2 under
  ZB-V), checked against the S stage scopes: S a multiple of v, the
  schedule one with several stages per device (interleaved 1F1B or ZB-V)
  and num_micro_batch what its order needs; raises ValueError naming the
  fix otherwise."""
  virtual_stages = pipeline_order.stages_per_device(
      schedule, epl_config.stages_per_device(config))
  if virtual_stages == 1:
    return 1
  stages = len(taskgraphs)
  names = ", ".join(t.name for t in taskgraphs)
  if schedule.v_shaped and (stages % 2 or stages < 4):
    raise ValueError(
        "%s (pipeline.strategy %r) places 2 stage scopes per device in a "
        "V, but the model has %d stage scope(s) (%s). Use an even count of "
        "at least 4 (twice the devices of a pipeline)." %
        (schedule.label, schedule.value, stages, names))
  if stages % virtual_stages:
    raise ValueError(
        "pipeline.virtual_stages is %d but the model's %d stage scope(s) "
        "(%s) do not divide into %d per device. Use a stage count that is a "
        "multiple of pipeline.virtual_stages, or set it to a divisor of %d." %
        (virtual_stages, stages, names, virtual_stages, stages))
  if (schedule is not pipeline_order.Schedule.PREFER_BACKWARD and
      not schedule.v_shaped):
    raise ValueError(
        "pipeline.virtual_stages %d interleaves 1F1B only, but "
        "pipeline.strategy is %r: set it to %r (or %r for ZB-V), or set "
        "pipeline.virtual_stages to 1." % (
            virtual_stages, schedule.value,
            pipeline_order.Schedule.PREFER_BACKWARD.value,
            pipeline_order.Schedule.ZERO_BUBBLE_V.value))
  # The orders raise naming what num_micro_batch they need.
  pipeline_order.device_orders(schedule, stages,
                               config.pipeline.num_micro_batch,
                               virtual_stages)
  return virtual_stages


def _split_plan(cluster, taskgraphs, config, schedule):
  """Split TaskGraphs share each device with the data-parallel backbone.

  Every device holds one replica of the backbone (data parallel over all
  devices); `split(k)` shards its part over k consecutive replicas, so the
  job has devices / k shard groups, each data parallel with the others.
  """
  total = cluster.total_devices
  if not config.cluster.colocate_split_and_replicate:
    raise ValueError(
        "epl.split (%s) shares the devices of the data-parallel part: set "
        "the config key cluster.colocate_split_and_replicate to True, as "
        "the original EPL requires." % ", ".join(
            t.name for t in taskgraphs if isinstance(t.strategy, Split)))
  if config.pipeline.virtual_stages != 1 or schedule.v_shaped:
    raise NotImplementedError(
        "pipeline.virtual_stages %d with epl.split (%s) is not built "
        "(pipeline.strategy %r): split parts have no pipeline stages to "
        "place on a device together. Set pipeline.virtual_stages to 1 and "
        "use a schedule with one stage per device." % (
            pipeline_order.stages_per_device(
                schedule, config.pipeline.virtual_stages), ", ".join(
                    t.name for t in taskgraphs
                    if isinstance(t.strategy, Split)), schedule.value))
  replicated = [t for t in taskgraphs if isinstance(t.strategy, Replicate)]
  if len(replicated) > 1 or config.pipeline.num_stages not in (-1, 1):
    raise NotImplementedError(
        "epl.split with pipeline stages (%s) is not built yet: a split part "
        "shares the devices of the one data-parallel part, and a last "
        "stage holding it would need shard groups of its own stage's "
        "devices. Use one epl.replicate scope (or the default strategy) for "
        "the rest of the model." % ", ".join(t.name for t in replicated))
  counts = []
  for taskgraph in taskgraphs:
    count = taskgraph.device_count or total
    if total % count:
      raise ValueError(
          "%r: the cluster's %d devices do not divide into shard groups of "
          "%d. Use a device count that divides %d." % (
              taskgraph.strategy, total, count, total))
    counts.append(count if isinstance(taskgraph.strategy, Split) else 1)
  return Plan(
      taskgraphs=[TaskGraphPlan(t.name, t.strategy.kind, count)
                  for t, count in zip(taskgraphs, counts)],
      num_replicas=total,
      devices=[[cluster.device_name(r)] for r in range(total)],
      device_workers=[[cluster.worker_of(r)] for r in range(total)],
      worker_index=cluster.worker_index,
      num_micro_batch=config.pipeline.num_micro_batch)


def _device_index(replica, stage, num_replicas, stages, prefer_intra_node):
  """Global device index of `stage` of `replica`.

  Intra-node: a replica's stages take consecutive devices (one worker when
  they fit). Otherwise stage s of every replica is grouped: the stages of
  one replica spread over the workers.
  """
  if prefer_intra_node:
    return replica * stages + stage
  return stage * num_replicas + replica


def planned_virtual_devices(cluster):
  """The VirtualDevices of the model built so far in the default graph on
  `cluster`: its rewrite's plan, or the plan it would get now; None
  before any strategy scope (`Cluster.virtual_devices`)."""
  state = graph_state.state_of(tf.compat.v1.get_default_graph())
  if state is None or not state.taskgraphs:
    return None
  env = Env.get()
  result = state.rewrite_result
  if result is not None and cluster is env.cluster:
    plan = result.plan
  else:
    plan = make_plan(cluster, state.taskgraphs, env.config,
                     tf.compat.v1.get_default_graph())
  return plan.virtual_devices(cluster)
