"""Bytes each device sends and receives in one training step, by kind,
counted from the rewritten graph, beside the formula of its layout
(docs/traffic.md derives each).

    from epl.tools import traffic
    counts = traffic.count(result)           # [DeviceTraffic]
    rows = traffic.compare(result, counts)   # [Comparison]: measured/formula
    held = traffic.persistent(result)        # [(device, measured, formula)]

What a step sends (`count`): a step runs the ancestors of the training
step's train ops, each once (the micro-batch loop's once per
micro-batch).

- Collectives (TensorFlow's V2 ops, Horovod's): the graph gives each
  member's payload P and the group size N; the bytes on the wire are the
  algorithm's, sent and received alike by each member: ring all-reduce
  2(N-1)/N·P, all-gather (N-1)·P, all-to-all and reduce-scatter
  (N-1)/N·P; a broadcast's root sends (N-1)·P, each other member receives
  P. A collective in a condition's branch (the float16 all-reduce's
  float32 resend, on a step whose float16 sum overflowed) is not counted:
  a step runs it only when the branch is taken.
- Every other transfer is a cross-device edge (`epl.ir.transfers`: one
  per tensor and receiving device, devices as TensorFlow's placer sets
  them), its kind from the provenance of its ends: a local sum's is
  all-reduce; ZeRO's reduction of a gradient on its owner or shard is
  reduce-scatter, its copy of a variable's value to the other replicas or
  of shards (or the weight joined from them) to their reader all-gather; the offload pass's are host; one
  between a replica's forward, backward and update ops of different
  stages is pipeline; an input read's is input; under shared weights, a
  replica's read of replica 0's weights is a shared read; the rest other.

The formulas (`formulas`), bytes a device sends per step (received
alike), with N replicas, G and W the gradient and weight bytes of the
device's stage, M micro-batches:

- data parallel, ZeRO v0: all-reduce 2(N-1)/N·G (ring; G in float16 with
  communication.fp16). Local sums send as much over the group (a
  gradient's root receives and sends N-1 copies, each other member one
  each way): the ring's figure on average over the devices.
- ZeRO v1: reduce-scatter (N-1)/N·G to the owners and all-gather
  (N-1)/N·W of the updated weights; v2 reduces each micro-batch's
  gradient (M times); v3 too, and gathers each weight forward and
  backward in each micro-batch: 2M·(N-1)/N·W, (N+1)/N times that with
  local sums (one member joins the shards and sends the weight to the
  others). A kernel whose shard gradients v3's plan makes from the
  replicas' activations (`gradient_shards`) sends those instead of its
  rows: (N-1)·R·(in/N + out) elements, R a replica's rows a step.
- shared weights (`decisions.Weights.SHARED`): each replica sends its
  gradient G to the device that sums it, and each sum not on replica 0's
  device sends the mean to the one update there: G per device, G - G_0
  from replica 0's (G_0: the gradients summed there). Replica 0's device
  sends its weights to the N-1 other replicas, (N-1)·W: a shared read,
  which one process hands over without a copy (shown, not traffic).
- pipeline: per micro-batch, a stage's boundary activations A forward
  and the gradients of those a gradient flows through back; a weight
  another stage reads, once a step each way: M·A + 2·W_shared (M times
  under ZeRO v2 and v3, which read it and send its gradient in each
  micro-batch: `decisions.CrossStageWeights`).
- split and experts: each forward collective of a split layer, and its
  adjoint in backward where a gradient flows (the same bytes; an
  all-gather's adjoint is an all-to-all and a scalar all-reduce).
"""
import collections
import dataclasses
from fractions import Fraction
from typing import Dict

import tensorflow as tf

from epl.ir import collectives
from epl.ir import control_flow
from epl.ir import graph_editor
from epl.ir import transfers
from epl.ir.op_types import (COLLECTIVE_TYPES, INPUT_READ_TYPES,
                             VARIABLE_READ_TYPES, VARIABLE_TYPES)
from epl.ir.phase import Phase
from epl.parallel import engine
from epl.parallel.passes.gradient_aggregation import aggregate_gradients
from epl.parallel.passes.forward_state import average_forward_state_updates
from epl.parallel.passes.offload import offload_variables
from epl.parallel.passes import zero
from epl.parallel.passes import zero_weights
from epl.parallel.passes.training_subgraph import tensors_of
from epl.parallel.plan.decisions import Communication, CrossStageWeights
from epl.parallel.plan.gradient_shards import GradientShards
from epl.tools import memory_estimate

ALL_REDUCE = "all-reduce"
ALL_GATHER = "all-gather"
REDUCE_SCATTER = "reduce-scatter"
ALL_TO_ALL = "all-to-all"
BROADCAST = "broadcast"
PIPELINE = "pipeline"
HOST = "host"
INPUT = "input"
OTHER = "other"
# Under shared weights, the other replicas' reads of replica 0's weights:
# a _Send/_Recv pair each, which within one process hands the reader the
# same buffer (no bytes move): shown, and not traffic.
SHARED_READ = "shared read (no copy)"
KINDS = (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, BROADCAST,
         PIPELINE, HOST, INPUT, OTHER, SHARED_READ)

# Collective op type -> (kind, bytes each member sends for a payload of 1
# byte in a group of n, bytes it receives).
_COLLECTIVES = {
    "CollectiveReduceV2": (ALL_REDUCE, lambda n: Fraction(2 * (n - 1), n)),
    "CollectiveGatherV2": (ALL_GATHER, lambda n: Fraction(n - 1)),
    "CollectiveAllToAllV2": (ALL_TO_ALL, lambda n: Fraction(n - 1, n)),
    "CollectiveReduceScatterV2": (REDUCE_SCATTER,
                                  lambda n: Fraction(n - 1, n)),
    "HorovodAllreduce": (ALL_REDUCE, lambda n: Fraction(2 * (n - 1), n)),
    "HorovodAllgather": (ALL_GATHER, lambda n: Fraction(n - 1)),
    # Horovod's root is a rank, not an op of this graph: the mean.
    "HorovodBroadcast": (BROADCAST, lambda n: Fraction(n - 1, n)),
}
_BROADCAST_SEND, _BROADCAST_RECEIVE = ("CollectiveBcastSendV2",
                                       "CollectiveBcastRecvV2")
_HOROVOD_TYPES = frozenset(t for t in _COLLECTIVES if t.startswith("Horovod"))


def _pass_names(*functions):
  return frozenset(p.name for p in engine.PASSES if p.function in functions)


# The passes whose transfers are each kind (by provenance).
_SUM_PASSES = _pass_names(aggregate_gradients, average_forward_state_updates)
_OWNER_PASSES = _pass_names(zero.place_updates,
                            zero_weights.partition_weights)
_HOST_PASSES = _pass_names(offload_variables)


@dataclasses.dataclass
class DeviceTraffic:
  """Bytes one device sends and receives in one step, by kind (exact
  fractions: a ring's share of a payload need not be whole bytes)."""
  device: str
  sent: Dict[str, Fraction] = dataclasses.field(
      default_factory=collections.Counter)
  received: Dict[str, Fraction] = dataclasses.field(
      default_factory=collections.Counter)
  # Transfers and collectives whose size the graph does not tell.
  unknown: int = 0


class _Devices(collections.OrderedDict):
  """DeviceTraffic per canonical device, made on first use."""

  def __init__(self, host):
    super().__init__()
    self.host = host

  def at(self, device):
    device = transfers.canonical_device(device, self.host)
    if device not in self:
      self[device] = DeviceTraffic(device)
    return self[device]


def step_roots(result):
  """The ops a training step fetches: the train ops (the NoOps that wait
  for the updates), else the updates."""
  return list(result.step.joins) or list(result.step.updates)


def _runs(result, op):
  """How many times one step runs `op`: M in the micro-batch loop."""
  if control_flow.in_rewritten_loop(op, result.context.state.provenance):
    return result.plan.num_micro_batch
  return 1


def _group_size(result, op):
  if op.type in _HOROVOD_TYPES:
    return result.context.cluster.worker_num
  return collectives.group_size_of(op)


class _Sizes:
  """tensor -> bytes (None if unknown): a variable's read from the
  variable, other tensors from their static shape
  (`memory_estimate.TensorSizes`); a copy EPL made whose shape TensorFlow
  did not infer again (the shapes a lowering set by hand are not in the
  NodeDefs copied) has the shape of the tensor it copies."""

  def __init__(self, result):
    self._known = memory_estimate.TensorSizes(result)
    self._graph = result.context.graph
    self._provenance = result.context.state.provenance

  def __call__(self, tensor):
    if _reads_variable(tensor.op):
      # The variable's own shape: a read's static shape is the one the
      # variable had when the read was built (ZeRO v3 shards a variable
      # after its reads were made).
      return memory_estimate.variable_bytes(tensor.op.inputs[0].op)
    size = self._known(tensor)
    if size is None and tensor.op.type == "PlaceholderWithDefault":
      # What hides a tensor's sizes (`graph_editor.with_unknown_sizes`:
      # ZeRO v3's shard reads) passes its input on.
      return self(tensor.op.inputs[0])
    while size is None:
      source = self._provenance.origin(tensor.op).source
      if source is None:
        return None
      tensor = self._graph.get_operation_by_name(source).outputs[
          tensor.value_index]
      size = self._known(tensor)
    return size


def _payload(sizes, tensor):
  """Bytes of `tensor`; through a Reshape whose shape is computed (an
  all-to-all's [members, -1] view) the bytes of what it reshapes."""
  size = sizes(tensor)
  if size is None and tensor.op.type == "Reshape":
    return sizes(tensor.op.inputs[0])
  return size


def _count_collective(result, op, devices, sizes):
  """Adds collective `op`'s wire bytes to its device."""
  here = devices.at(op.device)
  size = _group_size(result, op)
  payload = _payload(sizes, op.outputs[0] if op.type == _BROADCAST_RECEIVE
                     else op.inputs[0])
  if size is None or payload is None:
    here.unknown += 1
    return
  payload *= _runs(result, op)
  if op.type == _BROADCAST_SEND:
    here.sent[BROADCAST] += Fraction(payload * (size - 1))
  elif op.type == _BROADCAST_RECEIVE:
    here.received[BROADCAST] += Fraction(payload)
  else:
    kind, share = _COLLECTIVES[op.type]
    here.sent[kind] += share(size) * payload
    here.received[kind] += share(size) * payload


def _reads_variable(op):
  return op.type in VARIABLE_READ_TYPES and op.inputs and (
      op.inputs[0].op.type in VARIABLE_TYPES)


# The formula's term for ZeRO v3's gradient shards made from activations.
_FROM_ACTIVATIONS = " + (N-1)/N*R*(in + N*out) from activations"

# Ops that pass on or join their inputs' values: what ZeRO v3's local-sums
# gather builds from the shards (`joined_shards`).
_JOINING_TYPES = frozenset(["ConcatV2", "Slice", "PlaceholderWithDefault",
                            "Identity"])


def _made_of_weights(op):
  """Whether `op`'s value is variables' values: a read, or joined from
  reads (ZeRO v3's shards concatenated into the weight)."""
  if _reads_variable(op):
    return True
  inputs = [t.op for t in op.inputs if t.op.type != "Const"]
  return op.type in _JOINING_TYPES and bool(inputs) and all(
      _made_of_weights(i) for i in inputs)


def shares_weights(result):
  """Whether the replicas of `result` read one copy of every trained
  variable (`decisions.Weights.SHARED`, as the rewrite built it: no
  replica but replica 0 has a copy of its own)."""
  if len(result.context.replicas) < 2:
    return False
  variables = [v for _, v in memory_estimate.trained_points(result)]
  return bool(variables) and all(
      result.copies.op(local, v) is v for v in variables
      for local in range(1, len(result.context.replicas)))


def transfer_kind(result, transfer):
  """The kind of cross-device Transfer `transfer` of the rewritten step."""
  state = result.context.state
  producer = transfer.tensor.op
  ends = (producer,) + transfer.readers
  built = {state.provenance.pass_of(op) for op in ends}
  if built & _HOST_PASSES:
    return HOST
  if producer.type in INPUT_READ_TYPES:
    return INPUT
  if built & _SUM_PASSES:
    return ALL_REDUCE
  if built & _OWNER_PASSES:
    return ALL_GATHER if _made_of_weights(producer) else REDUCE_SCATTER
  if _reads_variable(producer) and shares_weights(result):
    return SHARED_READ
  # From the forward or backward ops of one replica's stage to another
  # stage's (its update, for a weight two stages read): no pass of the
  # rewrite moves those between replicas.
  if state.phase_of(producer) in (Phase.FORWARD, Phase.BACKWARD) and any(
      state.phase_of(op) in (Phase.FORWARD, Phase.BACKWARD, Phase.APPLY)
      for op in transfer.readers):
    return PIPELINE
  return OTHER


def count(result, roots=None):
  """[DeviceTraffic] of one step of RewriteResult `result` (the ancestors
  of `roots`, ops; by default the train ops), in plan order, then any
  other device (the host)."""
  ctx = result.context
  devices = _Devices(ctx.cluster.host_device(ctx.cluster.worker_index))
  for replica in ctx.replicas:
    for device in result.plan.devices[replica]:
      devices.at(device)
  sizes, placement = _Sizes(result), transfers.Placement(devices.host)
  ops = transfers.step_ops(roots or step_roots(result))
  for op in ops:
    if ((op.type in COLLECTIVE_TYPES or op.type in _HOROVOD_TYPES) and
        not control_flow.in_cond_branch(op)):
      _count_collective(result, op, devices, sizes)
  for transfer in transfers.cross_device_transfers(ops, placement):
    size = sizes(transfer.tensor)
    if size is None:
      devices.at(transfer.destination).unknown += 1
      continue
    size *= max(_runs(result, op) for op in transfer.readers)
    kind = transfer_kind(result, transfer)
    devices.at(transfer.source).sent[kind] += Fraction(size)
    devices.at(transfer.destination).received[kind] += Fraction(size)
  return list(devices.values())


@dataclasses.dataclass
class StageBytes:
  """Per stage (TaskGraph), the bytes of the trained weights (W) and of
  their gradients (G) as the user built them (ZeRO v3's whole weights),
  less split variables (each split member trains its own shard), and of
  the gradients as the replicas all-reduce them (float16 with
  communication.fp16)."""
  weights: int = 0
  gradients: int = 0
  reduced: int = 0


def stage_bytes(result):
  """{stage: StageBytes} of the step of RewriteResult `result`."""
  ctx = result.context
  split = split_variables(result)
  half = ctx.config.communication.fp16
  stages = collections.defaultdict(StageBytes)
  for grad, variable in memory_estimate.trained_points(result):
    if variable.name in split:
      continue
    elements = memory_estimate.unsharded_elements(result, variable)
    stage = stages[ctx.taskgraph_index(variable)]
    stage.weights += elements * tf.as_dtype(
        variable.get_attr("dtype")).base_dtype.size
    dtype = tensors_of(grad)[0].dtype.base_dtype
    stage.gradients += elements * dtype.size
    stage.reduced += elements * (
        tf.float16.size if half and dtype == tf.float32 else dtype.size)
  return dict(stages)


def split_variables(result):
  """Names of the split variables (each member of a split trains its own
  shard of them)."""
  return frozenset(result.artifacts.get("split_variables") or {})


def _synchronisation(result):
  """{kind: (times G, times W, formula)}: the bytes a device sends per
  step to synchronise its stage's gradients (G bytes) and weights (W)
  over the replicas (see the module's formulas): all of them for an
  all-reduce, this worker's for ZeRO's owners."""
  level = result.plan.decisions.zero.value.value
  micro_batches = result.plan.num_micro_batch
  n = (result.plan.num_replicas if level in ("", "v0") else
       len(result.context.replicas))
  if n < 2:
    return {}
  share = Fraction(n - 1, n)
  if level in ("", "v0"):
    return {ALL_REDUCE: (2 * share, 0, "2(N-1)/N*G")}
  # v1 sums a replica's micro-batches before it sends them; v2 and v3
  # send each micro-batch's gradient, and v3 gathers each weight in each
  # micro-batch's forward and backward.
  scatters = 1 if level == "v1" else micro_batches
  gathers = 2 * micro_batches if level == "v3" else 1
  gathered, joined = gathers * share, ""
  if level == "v3" and result.plan.decisions.communication.value is (
      Communication.LOCAL_SUMS):
    # One member joins the N-1 shards it receives and sends the weight to
    # the N-1 others: (N-1)/N W + (N-1) W a gather, over N devices.
    gathered, joined = gathered * Fraction(n + 1, n), "*(N+1)/N"

  def times(count):
    return "%d*" % count if count > 1 else ""
  return {REDUCE_SCATTER: (scatters * share, 0,
                           times(scatters) + "(N-1)/N*G"),
          ALL_GATHER: (0, gathered,
                       times(gathers) + "(N-1)/N*W" + joined)}


def _activation_shards(result):
  """{stage: bytes a device of it sends a step} less what the formula of
  gradient rows counts for them, of the ZeRO v3 weights whose shard
  gradients the plan makes from the replicas' activations
  (`gradient_shards`: its figure, (N-1)·R·(in/N + out) elements a
  replica)."""
  weights = result.plan.decisions.partition
  if weights is None or len(result.context.replicas) < 2:
    return {}
  n = len(result.context.replicas)
  rows = result.plan.num_micro_batch * Fraction(n - 1, n)
  delta = collections.Counter()
  for grad, variable in memory_estimate.trained_points(result):
    route = dict(weights.routes).get(variable.name)
    if route is None or route.decision.value is not (
        GradientShards.FROM_ACTIVATIONS) or route.from_activations is None:
      continue
    gradient = memory_estimate.unsharded_elements(
        result, variable) * tensors_of(grad)[0].dtype.base_dtype.size
    delta[result.context.taskgraph_index(variable)] += (
        route.from_activations - rows * gradient)
  return delta


def _summed_on(result, device):
  """Bytes of the trained gradients whose local sum runs on `device` (the
  local sums rotate the member that sums)."""
  placement, sums = transfers.Placement(), 0
  provenance = result.context.state.provenance
  for grad, variable in memory_estimate.trained_points(result):
    tensor = tensors_of(grad)[0]
    adds = [op for op in tensor.consumers()
            if provenance.pass_of(op) in _SUM_PASSES]
    if adds and placement(adds[0]) == device:
      sums += memory_estimate.unsharded_elements(result, variable) * (
          tensor.dtype.base_dtype.size)
  return sums


def _shared_weights(result):
  """({device: {kind: bytes sent per step}}, {kind: formula text}) of the
  replicas' one copy of the weights (`shares_weights`): each replica sends
  its gradient to the device that sums it, and each sum but those on
  replica 0's device sends the mean to the one update there (no mean goes
  back to the replicas): G per device, G - G_0 from replica 0's, where
  G_0 is summed. Replica 0's device sends its weights to the N-1 others,
  which read them without a copy: (N-1)*W there."""
  ctx, plan = result.context, result.plan
  stage = stage_bytes(result).get(0, StageBytes())
  update = transfers.canonical_device(plan.device(ctx.replicas[0], 0))
  expected = collections.defaultdict(collections.Counter)
  for replica in ctx.replicas:
    expected[transfers.canonical_device(plan.device(replica, 0))][
        ALL_REDUCE] += stage.gradients
  expected[update][ALL_REDUCE] -= _summed_on(result, update)
  expected[update][SHARED_READ] += (len(ctx.replicas) - 1) * stage.weights
  return expected, {ALL_REDUCE: "G; replica 0: G-G_0 (shared weights)",
                    SHARED_READ: "(N-1)*W from replica 0"}


@dataclasses.dataclass
class _Boundaries:
  """What the user's forward ops of one micro-batch (replica 0's) read
  from another stage's device, by (sending stage, reading stage): the
  activations' bytes, those of them a gradient flows back through, and
  the trained weights read there; tensors of unknown size by name."""
  activations: Dict = dataclasses.field(default_factory=collections.Counter)
  gradients: Dict = dataclasses.field(default_factory=collections.Counter)
  weights: Dict = dataclasses.field(default_factory=collections.Counter)
  unknown: list = dataclasses.field(default_factory=list)


def _boundaries(result):
  """The _Boundaries of the step of `result` (input reads are no
  activations: a stage reads its own)."""
  state, plan, ctx = result.context.state, result.plan, result.context
  stages = {}
  for stage in range(len(plan.taskgraphs)):
    stages.setdefault(transfers.canonical_device(
        plan.device(ctx.replicas[0], stage)), stage)
  placement, sizes = transfers.Placement(), _Sizes(result)
  trained, found, seen = _trained_descendants(result), _Boundaries(), set()
  for op in result.subgraph.cloned:
    if (state.phase_of(op) is not Phase.FORWARD or
        state.micro_batch_of(op) not in (0, None)):
      continue
    for tensor in op.inputs:
      ends = (stages.get(placement(tensor.op)), stages.get(placement(op)))
      if (ends[0] == ends[1] or None in ends or (tensor.name, ends) in seen
          or state.phase_of(tensor.op) is not Phase.FORWARD or
          tensor.op.type in INPUT_READ_TYPES):
        continue
      seen.add((tensor.name, ends))
      size = sizes(tensor)
      if size is None:
        found.unknown.append(tensor.name)
      elif _reads_variable(tensor.op):
        found.weights[ends] += size
      else:
        found.activations[ends] += size
        if tensor.dtype.is_floating and tensor.op.name in trained:
          found.gradients[ends] += size
  return found


def _pipeline(result, found):
  """{stage: bytes per device} a stage sends, by _Boundaries `found`: per
  micro-batch, its boundary activations forward and the gradients of
  those it reads backward; once a step (each micro-batch under ZeRO v2
  and v3), the weights other stages read and their gradients (summed
  over the micro-batches where they are read)."""
  sent = collections.Counter()
  micro_batches = result.plan.num_micro_batch
  for (producer, reader), size in found.activations.items():
    sent[producer] += size * micro_batches
  for (producer, reader), size in found.gradients.items():
    sent[reader] += size * micro_batches
  reads = _weight_reads(result)
  for (producer, reader), size in found.weights.items():
    sent[producer] += size * reads
    sent[reader] += size * reads
  return sent


def _weight_reads(result):
  """How many times a step sends a weight to another stage that reads it
  (and its gradient back), as the plan decided: 1, or M under ZeRO v2
  and v3 (`decisions.CrossStageWeights`)."""
  if result.plan.decisions.cross_stage_weights.value is (
      CrossStageWeights.EACH_MICRO_BATCH):
    return result.plan.num_micro_batch
  return 1


def _trained_descendants(result):
  """Names of the ops whose values depend on a trained variable (of any
  replica) through values a gradient can flow through (floating point,
  and the handles and variants that carry them), as tf.gradients marks
  the ops it differentiates."""
  roots = [result.copies.op(local, variable)
           for _, variable in memory_estimate.trained_points(result)
           for local in range(len(result.context.replicas))]
  return {op.name for op in graph_editor.reachable(
      roots, lambda op: [c for t in op.outputs if _carries_gradient(t)
                         for c in t.consumers()])}


def _carries_gradient(tensor):
  dtype = tensor.dtype.base_dtype
  return (dtype.is_floating or dtype.is_complex or
          dtype in (tf.resource, tf.variant))


def _differentiated(op, trained):
  """Whether backward runs the adjoint of forward collective `op`."""
  if not op.outputs[0].dtype.is_floating or op.inputs[0].op.name not in (
      trained):
    return False
  return op.type != "CollectiveReduceV2" or (
      op.get_attr("merge_op") == b"Add")


def _split_collectives(result, ops):
  """({device: {kind: bytes sent}}, count of collectives of unknown size)
  of the split layers' forward collectives among `ops` and the adjoints
  backward runs for them."""
  state, sizes = result.context.state, _Sizes(result)
  trained, unknown = _trained_descendants(result), 0
  sent = collections.defaultdict(collections.Counter)
  for op in ops:
    if (state.phase_of(op) is not Phase.FORWARD or
        not collectives.is_split_collective(op, state.provenance) or
        op.type not in _COLLECTIVES):
      continue
    n, payload = collectives.group_size_of(op), _payload(sizes,
                                                         op.inputs[0])
    if n is None or payload is None:
      unknown += 1
      continue
    kind, share = _COLLECTIVES[op.type]
    wire = share(n) * payload * _runs(result, op)
    here = sent[transfers.canonical_device(op.device)]
    here[kind] += wire
    if _differentiated(op, trained):
      # A gather's adjoint is a reduce-scatter, built as an all-to-all of
      # the same wire bytes and a scalar float32 all-reduce.
      here[ALL_TO_ALL if kind == ALL_GATHER else kind] += wire
      if kind == ALL_GATHER:
        here[ALL_REDUCE] += _COLLECTIVES["CollectiveReduceV2"][1](n) * 4
  return sent, unknown


def _pipeline_text(result, found):
  if not (any(found.activations.values()) or any(found.weights.values()) or
          found.unknown):
    return {}
  text = "M*A"
  if any(found.weights.values()):
    text += " + 2*%sW_shared" % ("M*" if _weight_reads(result) > 1 else "")
  if found.unknown:
    text += " (less %d tensor(s) of unknown size)" % len(found.unknown)
  return {PIPELINE: text}


def formulas(result, roots=None):
  """({device: {kind: bytes sent per step}}, {kind: formula text}) of
  the layout of RewriteResult `result` (see the module's formulas)."""
  plan, ctx = result.plan, result.context
  shared = shares_weights(result)
  synchronisation = {} if shared else _synchronisation(result)
  found = _boundaries(result)
  texts = dict(_pipeline_text(result, found),
               **{kind: text for kind, (_, _, text)
                  in synchronisation.items()})
  if ALL_REDUCE in texts and ctx.config.communication.fp16:
    texts[ALL_REDUCE] += " (G as float16)"
  stages, pipeline = stage_bytes(result), _pipeline(result, found)
  activations = _activation_shards(result)
  if activations:
    texts[REDUCE_SCATTER] = texts[REDUCE_SCATTER].replace(
        "*G", "*G_rows") + _FROM_ACTIVATIONS
  expected = collections.defaultdict(collections.Counter)
  for replica in ctx.replicas:
    for stage in range(len(plan.taskgraphs)):
      device = transfers.canonical_device(plan.device(replica, stage))
      sizes = stages.get(stage, StageBytes())
      for kind, (gradients, weights, _) in synchronisation.items():
        # communication.fp16 all-reduces float32 gradients as float16.
        sent = sizes.reduced if kind == ALL_REDUCE else sizes.gradients
        expected[device][kind] += gradients * sent + weights * sizes.weights
      expected[device][PIPELINE] += pipeline.get(stage, 0)
      expected[device][REDUCE_SCATTER] += activations.get(stage, 0)
  if shared:
    sums, sum_texts = _shared_weights(result)
    texts.update(sum_texts)
    for device, kinds in sums.items():
      expected[device].update(kinds)
  ops = transfers.step_ops(roots or step_roots(result))
  split, unknown = _split_collectives(result, ops)
  term = "split" + (" (less %d of unknown size)" % unknown if unknown
                    else "")
  for device, kinds in split.items():
    expected[device].update(kinds)
    for kind in kinds:
      if term not in texts.get(kind, ""):
        texts[kind] = " + ".join(
            ([texts[kind]] if kind in texts else []) + [term])
  return expected, texts


@dataclasses.dataclass
class Comparison:
  """One kind of traffic of a layout: what the graph sends against the
  formula, over the devices (bytes per step)."""
  kind: str
  formula: str
  measured: Fraction
  expected: Fraction
  # The largest measured/formula of one device (None: no formula).
  worst: object

  @property
  def ratio(self):
    """measured/formula over the devices (None: no formula)."""
    return self.measured / self.expected if self.expected else None


def compare(result, counts=None, roots=None):
  """[Comparison] per kind the step sends or its formula expects."""
  counts = counts if counts is not None else count(result, roots)
  expected, texts = formulas(result, roots)
  rows = []
  for kind in KINDS:
    measured = {c.device: c.sent.get(kind, 0) for c in counts}
    wanted = {d: e.get(kind, 0) for d, e in expected.items()}
    if not any(measured.values()) and not any(wanted.values()):
      continue
    ratios = [measured.get(d, 0) / w for d, w in wanted.items() if w]
    rows.append(Comparison(kind, texts.get(kind, "-"),
                           sum(measured.values(), Fraction(0)),
                           sum(wanted.values(), Fraction(0)),
                           max(ratios) if ratios else None))
  return rows


def persistent(result, estimates=None):
  """[(device, measured, formula)]: the bytes of weights, gradients and
  optimizer state a device holds (`memory_estimate`, counted from the
  graph) against `memory_estimate.zero_formula` of its stages at the
  run's ZeRO level (split variables count at their shard's size)."""
  estimates = estimates or memory_estimate.estimate(result)
  plan, level = result.plan, result.plan.decisions.zero.value.value
  formula = {s.stage: memory_estimate.zero_formula(
      level, s.parameters, len(result.context.replicas), s.weight_bytes,
      s.gradient_bytes, s.optimizer_bytes, plan.num_micro_batch)
             for s in memory_estimate.zero_parameters(result)}
  # Shared weights: replica 0's device holds the weights and the
  # optimizer state once; every replica its own gradients.
  gradients = {s.stage: s.gradient_bytes * s.parameters
               for s in memory_estimate.zero_parameters(result)}
  shared = shares_weights(result)
  expected = collections.Counter()
  for local, replica in enumerate(result.context.replicas):
    for stage in sorted(set(range(len(plan.taskgraphs))) & set(formula)):
      expected[transfers.canonical_device(plan.device(replica, stage))] += (
          gradients[stage] if shared and local else formula[stage])
  return [(e.device, e.parameters + e.gradients + e.optimizer_state,
           expected[e.device]) for e in estimates if e.device in expected]


def _ratio(value):
  return "-" if value is None else "%.3f" % value


def lines(result, estimates=None):
  """The traffic and persistent memory of `result` (its memory
  `estimates`, when made already) beside their formulas, as text for
  `epl-plan`."""
  rows = [("kind", "formula", "sent/device", "formula/device",
           "measured/formula", "worst device")]
  counts = count(result)
  devices = max(len(counts), 1)
  for row in compare(result, counts):
    rows.append((row.kind, row.formula, "%.0f" % (row.measured / devices),
                 "%.0f" % (row.expected / devices) if row.expected else "-",
                 _ratio(row.ratio), _ratio(row.worst)))
  text = ["  traffic per step (bytes each device sends, received alike; "
          "N replicas, G/W gradient/weight bytes of the device's stage, M "
          "micro-batches, A boundary activations; docs/traffic.md):"]
  text.extend(table(rows))
  if any(_FROM_ACTIVATIONS in row[1] for row in rows):
    text.append("    G_rows: the gradients sent as rows; R*(in + N*out): "
                "the activation rows (R a replica's, a step) that make the "
                "shard gradients of each kernel [in, out] v3 makes from "
                "activations (the 'v3 gradient shards' lines)")
  if any(c.sent.get(SHARED_READ) for c in counts):
    text.append("    shared read (no copy): the replicas read replica 0's "
                "weights in this process's memory, handed over without a "
                "copy: not traffic.")
  unknown = sum(c.unknown for c in counts)
  if unknown:
    text.append("    WARNING: %d transfer(s) and collective(s) have no "
                "fully known static shape and are not counted: the counts "
                "are low. Give the input a static batch size "
                "(drop_remainder=True)." % unknown)
  text.append("  persistent bytes per device (weights + gradients + "
              "optimizer state) against the ZeRO formula:")
  text.extend(table([("device", "measured", "formula", "measured/formula")]
                     + [(device, str(measured), "%.0f" % formula,
                         _ratio(measured / formula if formula else None))
                        for device, measured, formula
                        in persistent(result, estimates)]))
  return text


def table(rows):
  """`rows` (the first a header) as aligned lines: the first column to the
  left, the others to the right."""
  widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
  return ["    " + "  ".join(cell.rjust(w) if i else cell.ljust(w)
                             for i, (cell, w) in enumerate(zip(row, widths)))
          for row in rows]
