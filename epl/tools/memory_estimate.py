"""Estimated memory per device of a rewritten training step, before it runs.

    from epl.tools import memory_estimate
    estimates = memory_estimate.estimate(rewrite_context)
    for device in estimates: print(device.device, device.total)

Everything is counted from the rewritten graph itself (static shapes and
dtypes of its tensors, the devices the rewrite placed its ops on), so the
memory savers the rewrite applied are in the figures without a model of
each: AMP's half-precision activations have half-precision dtypes, ZeRO's
optimizer slots exist only on their owner (v3: a replica's variables and
slots are its shards), offloaded variables sit on the
host, gradient checkpointing leaves the backward pass reading recomputed
tensors instead of the forward ones.

Per device:

- parameters: the trained variables placed there;
- optimizer state: the variables `Optimizer.apply_gradients` created there
  (slots: Adam's m and v, momentum), counted from the graph;
- other state: every other variable (global step, loss scale, ...);
- gradients: the gradient tensors the update reads (accumulated over
  micro-batches), one set; two sets live when there are several
  micro-batches (the sum so far and the micro-batch's being added). With
  ZeRO v1 and v2 the update reads the gradient reduced on its owner, so a
  device counts the gradients of its own share (v3: its shard of each
  partitioned weight's); with v1 and several micro-batches every replica
  also sums its micro-batches in full first, which counts too;
- activations: the forward tensors of one micro-batch that the backward
  pass reads (buffers shared by views such as Reshape counted once), per
  stage, held from a micro-batch's forward to the end of its backward
  (its W under ZB-H1 and ZB-V): the most the device holds at once while it
  runs its passes in the schedule's order (`pipeline_order.device_orders`,
  the order the rewrite enforces). That is all M micro-batches for GPipe
  (PreferForward), min(stages - stage, M) for 1F1B (PreferBackward), one
  more on every stage but the last for PreferBackwardOptimizer, min(stages,
  M) on every stage for ZeroBubble; under interleaved 1F1B and ZB-V the
  passes of the device's stages in flight at its peak, each stage counting
  its own bytes. M with split TaskGraphs (no schedule orders their micro-batches);
- working memory: the largest one op of the step allocates at once (its
  outputs), which is live on top of the rest at the peak.

`zero_formula` gives the persistent bytes per device (weights, gradients,
optimizer state) that each ZeRO level would leave, from DeepSpeed's
formulas, and `zero_parameters` what they need from a rewritten graph.

When the input's batch dimension is not static (a batch without
`drop_remainder=True`), shapes are inferred again, by TensorFlow's shape
functions on a copy of the graph, with the batch size of the input
pipeline's batching dataset (`DeviceEstimate.batch_size_assumed`). Tensors
whose static shape is still not fully known cannot be counted; they are
reported in `DeviceEstimate.unknown_tensors` rather than guessed.
"""
import collections
import dataclasses
import logging
from typing import Dict, List

import tensorflow as tf

from epl.ir.op_types import SHAPE_READER_TYPES, VARIABLE_TYPES
from epl.ir.phase import Phase
from epl.parallel.cost.kept_activations import kept_activations_read
from epl.parallel.cost.kept_activations import tensor_bytes
from epl.ir.transfers import canonical_device
from epl.parallel.passes.training_subgraph import tensors_of
from epl.parallel.plan import pipeline_order

logger = logging.getLogger("epl")

def variable_elements(op):
  """Elements of the variable made by variable op `op` (0 if its shape
  is not fully known)."""
  shape = tf.TensorShape(op.get_attr("shape"))
  return shape.num_elements() if shape.is_fully_defined() else 0


def variable_bytes(op):
  """Bytes of the variable made by variable op `op` (0 if its shape is
  not fully known)."""
  return tf.as_dtype(op.get_attr("dtype")).size * variable_elements(op)


def in_flight_micro_batches(schedule, num_stages, stage, num_micro_batch):
  """Micro-batches whose activations stage `stage` holds at once
  (`schedule` a pipeline_order.Schedule or its name)."""
  return pipeline_order.in_flight(schedule, num_stages, stage,
                                 num_micro_batch)


def bubble_fraction(num_stages, num_micro_batch):
  """Idle fraction of a pipeline step, (p - 1) / (m + p - 1), for GPipe
  and 1F1B alike."""
  return (num_stages - 1) / float(num_micro_batch + num_stages - 1)


@dataclasses.dataclass
class DeviceEstimate:
  """Estimated memory of one device at the step's peak, in bytes."""
  device: str
  stages: List[int] = dataclasses.field(default_factory=list)
  parameters: int = 0
  optimizer_state: int = 0
  other_state: int = 0
  gradients: int = 0
  gradient_sets: int = 1
  # Bytes of one micro-batch's activations per stage on this device.
  stage_activations: Dict[int, int] = dataclasses.field(
      default_factory=dict)
  # The most (stage, micro-batch) passes whose activations the device
  # holds at once (with one stage per device: micro-batches in flight).
  in_flight: int = 0
  # Bytes of activations held at that peak.
  activations: int = 0
  recomputed: int = 0
  working: int = 0
  unknown_tensors: int = 0
  # The input pipeline's batch size, when shapes had to be inferred again
  # with it (the input's batch dimension is not static); else None.
  batch_size_assumed: object = None

  @property
  def persistent(self):
    return self.parameters + self.optimizer_state + self.other_state

  @property
  def activations_per_micro_batch(self):
    """One micro-batch's activations over the device's stages."""
    return sum(self.stage_activations.values())

  @property
  def total(self):
    return (self.persistent + self.gradients * self.gradient_sets +
            self.activations + self.recomputed + self.working)


class _Devices:
  """DeviceEstimate per device, made on first use; ops without a device
  count on this worker's host CPU, where TensorFlow places them."""

  def __init__(self, host):
    self.by_name = collections.OrderedDict()
    self._host = canonical_device(host)

  def __getitem__(self, device):
    device = canonical_device(device) or self._host
    if device not in self.by_name:
      self.by_name[device] = DeviceEstimate(device)
    return self.by_name[device]


_BATCH_DATASETS = frozenset(["BatchDataset", "BatchDatasetV2",
                             "PaddedBatchDataset", "PaddedBatchDatasetV2",
                             "ParallelBatchDataset"])


def dataset_batch_size(graph):
  """The batch size of the graph's batching datasets when they all agree
  on one constant; else None."""
  found = set()
  for op in graph.get_operations():
    if op.type in _BATCH_DATASETS:
      value = tf.get_static_value(op.inputs[1])
      found.add(None if value is None else int(value))
  if len(found) != 1 or None in found:
    return None
  return found.pop()


def with_batch_size(graph, input_reads, batch_size):
  """A copy of `graph` whose static shapes TensorFlow inferred again with
  the input reads' unknown leading dimension set to `batch_size`."""
  graph_def = graph.as_graph_def()
  reads = {op.name for op in input_reads}
  for node in graph_def.node:
    if node.name not in reads or "output_shapes" not in node.attr:
      continue
    for shape in node.attr["output_shapes"].list.shape:
      if shape.dim and shape.dim[0].size == -1:
        shape.dim[0].size = batch_size
  inferred = tf.Graph()
  with inferred.as_default():
    tf.graph_util.import_graph_def(graph_def, name="")
  return inferred


class TensorSizes:
  """tensor -> bytes (None if unknown). When the input's batch dimension
  is not static, shapes come from a copy of the graph inferred again with
  the batch size of the input pipeline."""

  def __init__(self, result):
    self.batch_size = None
    self._inferred = None
    # Every replica's and micro-batch's copy of each read: the copies of
    # identical replicas get the same shapes.
    copies = result.copies
    reads = [copies.op(local, op) for read in result.step.input_reads
             for op in copies.micro_batch_ops(read)
             for local in range(len(result.context.replicas))]
    if all(t.shape.is_fully_defined() for op in reads for t in op.outputs):
      return
    batch_size = dataset_batch_size(result.context.graph)
    if batch_size is None:
      return
    logger.info("Memory estimate: the input's batch dimension is not "
                "static; shapes inferred again with the input pipeline's "
                "batch size %d", batch_size)
    self.batch_size = batch_size
    self._inferred = with_batch_size(result.context.graph, reads,
                                     batch_size)

  def __call__(self, tensor):
    if self._inferred is not None and not tensor.shape.is_fully_defined():
      tensor = self._inferred.get_tensor_by_name(tensor.name)
    return tensor_bytes(tensor)


def split_points(result):
  """The (gradient, variable) pairs of the split variables (each replica
  trains its shard; the split rewrite reduces their gradients), as
  captured."""
  split = result.artifacts.get("split_variables") or {}
  return [(grad, variable) for record in result.step.gradient_records
          for grad, variable in record.pairs if variable.name in split]


def trained_points(result):
  """The (gradient, variable) pair of every trained variable: those the
  replicas all-reduce, those ZeRO reduces on their owner and the split
  variables."""
  points = [p for points in result.gradient_points for p in points]
  partition = result.zero_partition
  if partition is not None and partition.reduces_to_owners:
    points.extend(partition.reduced_points)
  return points + split_points(result)


def unsharded_elements(result, op):
  """Elements of variable op `op` as the user built it: the whole
  variable, also where ZeRO v3 made each replica's copy one shard."""
  partition = result.zero_partition
  weights = partition.weights if partition is not None else None
  if weights is not None and op.name in weights.full_shapes:
    return weights.full_shapes[op.name].num_elements()
  return variable_elements(op)


def _count_variables(result, devices):
  trained = set()
  for _, variable in trained_points(result):
    for local in range(len(result.context.replicas)):
      trained.add(result.copies.op(local, variable).name)
  for op in result.context.graph.get_operations():
    if op.type not in VARIABLE_TYPES:
      continue
    estimate = devices[op.device]
    size = variable_bytes(op)
    if op.name in trained:
      estimate.parameters += size
    elif result.context.state.phase_of(op) is Phase.APPLY:
      estimate.optimizer_state += size
    else:
      estimate.other_state += size


def _count_gradients(result, devices, sizes):
  """Every replica's copy of each all-reduced gradient and of each split
  variable's; with ZeRO v1 and v2, each reduced gradient on its owner,
  and (v1, several micro-batches) every replica's sum of its
  micro-batches."""
  several = result.plan.num_micro_batch > 1

  def count(tensor):
    size = sizes(tensor)
    estimate = devices[tensor.op.device]
    if size is None:
      estimate.unknown_tensors += 1
      return
    estimate.gradients += size
    if several:
      estimate.gradient_sets = 2

  replicas = range(len(result.context.replicas))
  for points in list(result.gradient_points) + [split_points(result)]:
    for grad, _ in points:
      for local in replicas:
        for tensor in tensors_of(grad):
          count(result.copies.tensor(local, tensor))
  partition = result.zero_partition
  if partition is None or not partition.reduces_to_owners:
    return
  reduced = partition.reduced_gradients
  for grad, variable in partition.reduced_points:
    for tensor in reduced[variable.name]:
      count(tensor)
    if several and variable.name not in partition.accumulations:
      for local in replicas:
        for tensor in tensors_of(grad):
          count(result.copies.tensor(local, tensor))


def _kept_activations(result, devices, sizes):
  """Per device and stage, bytes of the forward tensors of micro-batch 0
  that the stage's backward pass on that device reads (a tensor read by
  the backward of several stages on one device counts once, with the
  first of them)."""
  state = result.context.state
  kept = collections.defaultdict(dict)
  for op in result.context.graph.get_operations():
    stage = state.taskgraph_index(op)
    for root in kept_activations_read(state, op, micro_batch=0):
      # A tensor read on another device is kept there too (the copy
      # TensorFlow received).
      held = kept[devices[op.device].device]
      held[root] = min(held.get(root, stage), stage)
  for device, tensors in kept.items():
    estimate = devices[device]
    for tensor, stage in tensors.items():
      size = sizes(tensor)
      if size is None:
        estimate.unknown_tensors += 1
      else:
        estimate.stage_activations[stage] = (
            estimate.stage_activations.get(stage, 0) + size)


def _count_held(result, devices):
  """Per pipeline device, the activations it holds at its peak: its
  passes in the schedule's order (`pipeline_order.device_orders`), each
  forward adding its stage's bytes of one micro-batch until the backward
  pass that ends it (`pipeline_order.held_at_peak`). Split TaskGraphs
  have no schedule: every micro-batch is held."""
  plan = result.plan
  if plan.has_split:
    for replica in result.context.replicas:
      estimate = devices[plan.devices[replica][0]]
      estimate.in_flight = plan.num_micro_batch
      estimate.activations = (estimate.activations_per_micro_batch *
                              plan.num_micro_batch)
    return
  orders = pipeline_order.device_orders(
      plan.schedule, plan.num_stages, plan.num_micro_batch,
      plan.virtual_stages)
  for replica in result.context.replicas:
    for pipeline_device, order in enumerate(orders):
      estimate = devices[plan.device(replica, pipeline_device)]
      stages = {step.stage for step in order}
      if not stages.issuperset(estimate.stage_activations):
        # A backward op of a stage placed on another device: the rewrite
        # places every op on its own stage's device, so this is a bug.
        raise AssertionError(
            "memory estimate: %s holds activations of stages %s but runs "
            "the passes of stages %s" % (
                estimate.device, sorted(estimate.stage_activations),
                sorted(stages)))
      estimate.in_flight = max(
          estimate.in_flight, pipeline_order.held_at_peak(plan.schedule,
                                                          order))
      estimate.activations = max(
          estimate.activations, pipeline_order.held_at_peak(
              plan.schedule, order,
              lambda stage, held=estimate.stage_activations:
              held.get(stage, 0)))


def _count_recomputed(result, devices, sizes):
  """Per device, the largest segment of recomputed tensors that backward
  reads (gradient checkpointing recomputes one segment at a time). A
  segment may span stages (an attention mask of the first stage that every
  layer reads goes with the last layer's): each device counts its own
  ops' part."""
  for segment in result.recomputed_segments:
    names = {op.name for op in segment}
    read_sizes = [sum(sizes(t) or 0 for t in op.outputs
                      if any(c.name not in names and
                             c.type not in SHAPE_READER_TYPES
                             for c in t.consumers()))
                  for op in segment]
    for local in range(len(result.context.replicas)):
      per_device = collections.Counter()
      for op, size in zip(segment, read_sizes):
        per_device[result.copies.op(local, op).device] += size
      for device, size in per_device.items():
        estimate = devices[device]
        estimate.recomputed = max(estimate.recomputed, size)


def _count_working(result, devices, sizes):
  for op in result.context.graph.get_operations():
    # Constants and variables are allocated once, not by each step.
    if (result.context.state.phase_of(op) is Phase.OTHER or
        op.type == "Const" or
        op.type in VARIABLE_TYPES):
      continue
    size = sum(sizes(t) or 0 for t in op.outputs)
    estimate = devices[op.device]
    estimate.working = max(estimate.working, size)


ZERO_LEVELS = ("", "v0", "v1", "v2", "v3")


def zero_formula(level, parameters, replicas, weight_bytes, gradient_bytes,
                 optimizer_bytes, num_micro_batch=1):
  """Persistent bytes per device (weights + gradients + optimizer state)
  of `parameters` (Ψ) trained parameters under ZeRO `level` ("" is off)
  over `replicas` (N) data-parallel replicas, from DeepSpeed's formulas
  (Rajbhandari et al. 2019) with W, G, K the bytes per parameter of
  weights, gradients and optimizer state:

  - off: (W + G + K)Ψ
  - v0 (optimizer state partitioned, DeepSpeed's ZeRO-1): (W + G)Ψ + KΨ/N
  - v1 (gradients reduced on their owner): WΨ + (G + K)Ψ/N, plus GΨ with
    several micro-batches (each replica sums its micro-batches in full)
  - v2 (DeepSpeed's ZeRO-2, micro-batches summed on the owner too):
    WΨ + (G + K)Ψ/N
  - v3 (weights partitioned, ZeRO-3): (W + G + K)Ψ/N

  Mixed-precision Adam (W = 2, G = 2, K = 12: float32 master weights, m
  and v) gives DeepSpeed's 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N and 16Ψ/N.
  EPL keeps float32 variables, also under AMP, so float32 Adam is W = 4,
  G = 4, K = 8: 16Ψ, 8Ψ + 8Ψ/N, 4Ψ + 12Ψ/N, 16Ψ/N (momentum: K = 4).
  """
  if level not in ZERO_LEVELS:
    raise ValueError("zero level %r: expected one of %s." % (
        level, ", ".join(repr(l) for l in ZERO_LEVELS)))
  weights = weight_bytes * parameters
  gradients = gradient_bytes * parameters
  optimizer = optimizer_bytes * parameters
  if level == "":
    return weights + gradients + optimizer
  if level == "v0":
    return weights + gradients + optimizer / replicas
  if level == "v3":
    return (weights + gradients + optimizer) / replicas
  summed_in_full = gradients if level == "v1" and num_micro_batch > 1 else 0
  return weights + summed_in_full + (gradients + optimizer) / replicas


@dataclasses.dataclass
class StageParameters:
  """What `zero_formula` needs for one stage (TaskGraph): its trained
  parameters, and their bytes per parameter of weights, gradients and
  optimizer state (the slots `apply_gradients` made for them)."""
  stage: int
  parameters: int = 0
  weight_bytes: float = 0.0
  gradient_bytes: float = 0.0
  optimizer_bytes: float = 0.0


def zero_parameters(result):
  """[StageParameters] of the rewritten step of RewriteResult `result`, by
  stage: counted from the user's own variables (one replica's weights; the
  optimizer's slots, which ZeRO places on their owners under their own
  names) and the dtypes of their gradients."""
  ctx = result.context
  by_stage = collections.OrderedDict()
  totals = collections.defaultdict(lambda: [0, 0, 0, 0])
  trained = set()
  for grad, variable in trained_points(result):
    trained.add(variable.name)
    stage = ctx.taskgraph_index(variable)
    elements = unsharded_elements(result, variable)
    totals[stage][0] += elements
    totals[stage][1] += tf.as_dtype(variable.get_attr("dtype")).size * (
        elements)
    totals[stage][2] += tensors_of(grad)[0].dtype.base_dtype.size * elements
  for op in ctx.graph.get_operations():
    if (op.type in VARIABLE_TYPES and op.name not in trained and
        ctx.state.phase_of(op) is Phase.APPLY and
        not ctx.state.provenance.built_by_rewrite(op) and
        ctx.taskgraph_index(op) in totals):
      totals[ctx.taskgraph_index(op)][3] += tf.as_dtype(
          op.get_attr("dtype")).size * unsharded_elements(result, op)
  for stage in sorted(totals):
    parameters, weights, gradients, optimizer = totals[stage]
    by_stage[stage] = StageParameters(
        stage, parameters, weights / float(parameters or 1),
        gradients / float(parameters or 1),
        optimizer / float(parameters or 1))
  return list(by_stage.values())


def estimate(result):
  """[DeviceEstimate] of the rewritten step of RewriteResult `result`: one
  per device of this worker's replicas in plan order, then any other
  device the step uses (the host, with offload)."""
  plan = result.plan
  cluster = result.context.cluster
  devices = _Devices(cluster.host_device(cluster.worker_index))
  order = []
  for replica in result.context.replicas:
    for stage in range(len(plan.devices[replica])):
      device = devices[plan.devices[replica][stage]]
      device.stages.append(stage)
      order.append(device.device)
  _count_variables(result, devices)
  sizes = TensorSizes(result)
  _count_gradients(result, devices, sizes)
  _kept_activations(result, devices, sizes)
  _count_held(result, devices)
  _count_recomputed(result, devices, sizes)
  _count_working(result, devices, sizes)
  for device in devices.by_name.values():
    device.batch_size_assumed = sizes.batch_size
  known = list(dict.fromkeys(order))
  others = [d for d in devices.by_name if d not in known]
  return [devices.by_name[d] for d in known + others]
