"""What the plan decides from the configuration, once, before the passes
run: typed values (enums, not the configuration's strings), each with its
reason, that the passes apply and `epl-plan` prints.

Plain Python: `decide` reads the configuration (the planner calls it when
it makes a plan); no pass reads it after.
"""
import dataclasses
import enum
from typing import Optional

from epl import config as epl_config
from epl.parallel.plan import schedule_choice
# The pipeline schedule is the enum the pass orders are keyed on.
from epl.parallel.plan.pipeline_order import Schedule


# In each enum, the first member is what the step does when the
# configuration asks for nothing (not logged at each rewrite).


class MicroBatching(enum.Enum):
  """How a step runs its micro-batches."""
  ONE = "one micro-batch"
  LOOP = "loop"
  COPIES = "copies"


class Precision(enum.Enum):
  """The dtype the painted ops of the step run in (amp.level O1)."""
  FULL = "float32"
  FLOAT16 = "float16"
  BFLOAT16 = "bfloat16"


class LossScaling(enum.Enum):
  NONE = "none"
  FIXED = "fixed"
  DYNAMIC = "dynamic"


class ZeroLevel(enum.Enum):
  """zero.level: what each data-parallel replica keeps of the others'."""
  NONE = ""
  V0 = "v0"
  V1 = "v1"
  V2 = "v2"
  V3 = "v3"

  @property
  def reduces_to_owners(self):
    """Gradients are reduced on their variable's owner only."""
    return self in (ZeroLevel.V1, ZeroLevel.V2, ZeroLevel.V3)

  @property
  def partitions_gradients(self):
    """Each micro-batch's gradients go to their owner replica."""
    return self in (ZeroLevel.V2, ZeroLevel.V3)

  @property
  def partitions_weights(self):
    return self is ZeroLevel.V3


class Offload(enum.Enum):
  NONE = ""
  HOST = "v0"


class Reduction(enum.Enum):
  """How gradients over replicas and micro-batches are combined."""
  MEAN = "mean"
  SUM = "sum"


class Communication(enum.Enum):
  """What carries the replicas' collectives (gradients, variable sync)."""
  COLLECTIVES = "TensorFlow collectives"
  LOCAL_SUMS = "local sums"
  HOROVOD = "Horovod"


class Buckets(enum.Enum):
  """How dense gradients travel: fused into buckets (at most
  communication.max_splits per stage and dtype) or one per gradient."""
  FUSED = "fused"
  PER_GRADIENT = "one per gradient"


class Weights(enum.Enum):
  """Where the data-parallel replicas keep the variables they train."""
  PER_REPLICA = "a copy per replica, each updated by its replica"
  SHARED = "one copy every replica reads, updated once per step"


class Checkpoints(enum.Enum):
  """Where gradient checkpointing takes its checkpoints."""
  NONE = ""
  COLLECTION = "collection"
  AUTO = "auto"


class CrossStageWeights(enum.Enum):
  """How a pipeline stage reads a weight of a stage on another device
  (tied word embeddings), and where its part of the weight's gradient is
  summed over the micro-batches (`epl.parallel.passes.cross_stage_weights`)."""
  NONE = ""
  # Read in each micro-batch; each micro-batch's part of the gradient sent
  # back: 2 M W across the devices per step.
  EACH_MICRO_BATCH = "each micro-batch"
  # Read once a step on the reading device and summed there: 2 W, for a
  # copy of W and its gradient's sum held there for the step.
  ONCE_A_STEP = "once a step"


@dataclasses.dataclass(frozen=True)
class Decision:
  """`value`, because `reason`; `asked`: what the configuration asked for,
  when the plan decided otherwise (a fallback the passes warn about)."""
  value: enum.Enum
  reason: str
  asked: Optional[enum.Enum] = None

  def describe(self):
    text = self.value.value or "off"
    if self.asked is not None:
      text += " (asked: %s)" % self.asked.value
    return "%s, because %s" % (text, self.reason)


@dataclasses.dataclass(frozen=True)
class Decisions:
  """Every decision of the plan the passes apply."""
  micro_batches: Decision
  schedule: Decision
  precision: Decision
  loss_scaling: Decision
  # The fixed loss scale (LossScaling.FIXED); None otherwise.
  loss_scale: Optional[float]
  zero: Decision
  offload: Decision
  reduction: Decision
  communication: Decision
  buckets: Decision
  # The most buckets per stage and dtype (Buckets.FUSED); None otherwise.
  max_buckets: Optional[int]
  checkpoints: Decision
  weights: Decision
  cross_stage_weights: Decision
  # Which trained variables zero.level v3 partitions
  # (weight_partition.WeightPartition), decided with the graph's records
  # when the rewrite takes the plan (`planner.plan_of`); None otherwise.
  partition: Optional[object] = None

  def lines(self, notable_only=False):
    """One line per decision, for people (`epl-plan`; the rewrite logs the
    `notable_only` ones: those that do something)."""
    lines = []
    for field in dataclasses.fields(self):
      decision = getattr(self, field.name)
      if not isinstance(decision, Decision) or (
          notable_only and decision.value is next(iter(type(decision.value)))):
        continue
      label = field.name.replace("micro_batches", "micro-batches")
      lines.append("%s: %s" % (label.replace("_", " "), decision.describe()))
    if self.partition is not None:
      lines.extend(self.partition.lines(notable_only))
    return lines


def _micro_batches(config, num_stages, has_split, zero, offload):
  count = config.pipeline.num_micro_batch
  if count == 1:
    return Decision(MicroBatching.ONE, "pipeline.num_micro_batch is 1")
  if config.pipeline.accumulation == MicroBatching.COPIES.value:
    return Decision(MicroBatching.COPIES,
                    "pipeline.accumulation is \"copies\"")
  if num_stages > 1 and not has_split:
    return Decision(MicroBatching.COPIES, "a pipeline keeps one copy per "
                    "micro-batch for its schedule")
  if has_split:
    return Decision(MicroBatching.COPIES, "split TaskGraphs run their "
                    "micro-batches as copies")
  if zero.value.partitions_gradients:
    return Decision(MicroBatching.COPIES, "zero.level %s sends each "
                    "micro-batch's gradients to their owner replica" %
                    zero.value.value, asked=MicroBatching.LOOP)
  if offload.value is not Offload.NONE:
    # Measured: the first step never ended (variables on the host read in
    # every replica's loop, 4 replicas x 2 micro-batches).
    return Decision(MicroBatching.COPIES, "offload.level %s keeps the "
                    "variables on the host, which the loop does not "
                    "support yet" % offload.value.value,
                    asked=MicroBatching.LOOP)
  return Decision(MicroBatching.LOOP, "pipeline.accumulation is \"loop\" "
                  "and the step has one stage (ops the loop cannot hold "
                  "turn it into copies, with a warning naming the op)")


def _cross_stage_weights(config, num_stages, zero):
  if num_stages < 2 or config.pipeline.num_micro_batch == 1:
    return Decision(CrossStageWeights.NONE, "no pipeline of several "
                    "micro-batches")
  if zero.value.partitions_gradients:
    return Decision(CrossStageWeights.EACH_MICRO_BATCH, "zero.level %s sends "
                    "each micro-batch's gradients to their owner replica" %
                    zero.value.value)
  return Decision(CrossStageWeights.ONCE_A_STEP, "weights do not change "
                  "before the update: a weight read on another device's "
                  "stage crosses once a step each way (its copy and the "
                  "sum of its gradient held there for the step)")


def _precision(config):
  if config.amp.level != "O1":
    return Decision(Precision.FULL, "amp.level is not set")
  return Decision(Precision(config.amp.dtype),
                  "amp.level O1 with amp.dtype %s" % config.amp.dtype)


def _loss_scaling(config, precision):
  if precision.value is not Precision.FLOAT16:
    return Decision(LossScaling.NONE, "the step does not run in float16")
  if config.amp.loss_scale == LossScaling.DYNAMIC.value:
    return Decision(LossScaling.DYNAMIC, "amp.loss_scale is \"dynamic\"")
  return Decision(LossScaling.FIXED,
                  "amp.loss_scale is %s" % config.amp.loss_scale)


def _communication(config, device_type, all_local):
  if config.communication.backend == "horovod":
    return Decision(Communication.HOROVOD,
                    "communication.backend is \"horovod\"")
  if config.communication.local_cpu_reduce and device_type == "CPU" and (
      all_local):
    return Decision(Communication.LOCAL_SUMS, "every replica is a CPU "
                    "device of this process and "
                    "communication.local_cpu_reduce is on")
  return Decision(Communication.COLLECTIVES,
                  "communication.backend is \"collective\"")


def decide_schedule(config, num_stages, kept_activations=None):
  """The pipeline schedule of `num_stages` pipeline stages (1: no
  pipeline), taken before the layout (a V-shaped one places two stages
  per device): pipeline.strategy, or under pipeline.activation_memory the
  least bubble that fits (`schedule_choice`). A budget in bytes needs
  `kept_activations`, which returns what the built step's stages keep
  ([stage_activations.KeptTensor]); without it, ValueError."""
  budget = config.pipeline.activation_memory
  per_device = epl_config.stages_per_device(config)
  # Without a pipeline, or with a stage count the planner reports as not
  # fitting its devices, the written schedule.
  if not budget or num_stages < 2 or num_stages % per_device:
    return Decision(Schedule.of(config.pipeline.strategy),
                    "pipeline.strategy is %r" % config.pipeline.strategy)
  if not isinstance(budget, str):
    best, reason = schedule_choice.choose(
        num_stages, config.pipeline.num_micro_batch, per_device, budget)
  elif kept_activations is None:
    raise ValueError(
        "pipeline.activation_memory %s: a budget in bytes is compared with "
        "the activations of the built training step, and this plan is made "
        "without it. Give the budget as a fraction of 1F1B's (e.g. 0.5)."
        % budget)
  else:
    best, reason = schedule_choice.choose_bytes(
        num_stages, config.pipeline.num_micro_batch, per_device, budget,
        kept_activations())
  return Decision(best.schedule, reason)


def _weights(config, num_replicas, num_stages, has_split, communication,
             others):
  """Shared weights where the replicas share one process's memory: there
  N per-replica updates repeat the same work on the same cores (the
  updates of a 6-layer MLP with Adam on 4 logical CPU devices took 2-3x
  plain TF's: `benchmarks/data_parallel.py --models mlp:256`). `others`:
  the decisions that rule it out (ZeRO, offload, micro-batches, loss
  scaling)."""
  def per_replica(reason):
    return Decision(Weights.PER_REPLICA, reason)
  if not config.communication.shared_weights:
    return per_replica("communication.shared_weights is off")
  if num_replicas < 2:
    return per_replica("the step has one replica")
  if communication.value is not Communication.LOCAL_SUMS:
    return per_replica("the replicas do not all share this process's "
                       "memory (communication: %s)" %
                       communication.value.value)
  if num_stages > 1 or has_split:
    return per_replica("the model has pipeline stages or split parts")
  if config.communication.fp16:
    return per_replica("communication.fp16 falls back to collectives")
  if config.optimizer.num_apply_group > 1:
    return per_replica("optimizer.num_apply_group groups the updates")
  for name, decision in others:
    if decision.value is not next(iter(type(decision.value))):
      return per_replica("%s is %s" % (name, decision.value.value))
  return Decision(Weights.SHARED, "every replica is a CPU device of this "
                  "process, sharing its memory and cores (communication."
                  "shared_weights is on): an update per replica would "
                  "repeat the same work")


def decide(config, num_stages, has_split, device_type, all_local, schedule,
           num_replicas=1):
  """The Decisions for `config`, for a plan of `num_stages` TaskGraphs
  (`has_split`: some are split) on devices of `device_type` ("CPU",
  "GPU"), all of whose `num_replicas` replicas this worker builds when
  `all_local`; `schedule` is the plan's `decide_schedule`."""
  zero = Decision(ZeroLevel(config.zero.level),
                  "zero.level is %r" % config.zero.level)
  offload = Decision(Offload(config.offload.level),
                     "offload.level is %r" % config.offload.level)
  precision = _precision(config)
  loss_scaling = _loss_scaling(config, precision)
  communication = _communication(config, device_type, all_local)
  buckets = (
      Decision(Buckets.PER_GRADIENT, "local sums add each gradient where "
               "it is") if communication.value is Communication.LOCAL_SUMS
      else Decision(Buckets.FUSED, "%s fuse a bucket into one collective; "
                    "communication.max_splits is %d" % (
                        communication.value.value,
                        config.communication.max_splits)))
  micro_batches = _micro_batches(config, num_stages, has_split, zero,
                                 offload)
  return Decisions(
      micro_batches=micro_batches,
      schedule=schedule,
      precision=precision,
      loss_scaling=loss_scaling,
      loss_scale=(config.amp.loss_scale
                  if loss_scaling.value is LossScaling.FIXED else None),
      zero=zero,
      offload=offload,
      reduction=Decision(
          Reduction(config.communication.gradients_reduce_method),
          "communication.gradients_reduce_method is %r" %
          config.communication.gradients_reduce_method),
      communication=communication,
      buckets=buckets,
      max_buckets=(config.communication.max_splits
                   if buckets.value is Buckets.FUSED else None),
      checkpoints=Decision(
          Checkpoints(config.gradient_checkpoint.type),
          "gradient_checkpoint.type is %r" %
          config.gradient_checkpoint.type),
      weights=_weights(config, num_replicas, num_stages, has_split,
                       communication,
                       (("zero.level", zero), ("offload.level", offload),
                        ("the micro-batching", micro_batches),
                        ("the loss scaling", loss_scaling))),
      cross_stage_weights=_cross_stage_weights(config, num_stages, zero))
