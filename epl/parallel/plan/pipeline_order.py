"""The order in which each pipeline device runs its passes, per schedule.

A pass is the forward (F), backward (B) or weight-gradient (W) work of one
stage for one micro-batch. GPipe and 1F1B run each backward whole (B is
then the full backward and there is no W); ZB-H1 splits it into B, the
gradients with respect to the stage's inputs that the previous stage waits
for, and W, the gradients with respect to the stage's weights, which
nothing downstream waits for and which fills what would be bubble.
Interleaved 1F1B (Megatron-LM) gives each device several stages (chunks);
ZB-V, V-Half and V-Min give each device two, placed in a V, with ZB-H1's
split. Schedules are the enum `Schedule`; every function here also takes
a schedule's configuration name.

Plain Python and plain data: the rewrite's schedule pass enforces these
orders with control edges (`epl.parallel.passes.schedule`), the simulator times them
(`epl.tools.schedule_simulator`), the memory estimate counts the
activations they keep.
"""
import collections
import enum


class Schedule(enum.Enum):
  """A pipeline schedule (pipeline.strategy); its value is the
  configuration's name for it."""
  PREFER_BACKWARD = "PreferBackward"    # 1F1B
  PREFER_FORWARD = "PreferForward"      # GPipe
  # 1F1B with one more forward in flight on every stage but the last (the
  # original EPL's third schedule).
  PREFER_BACKWARD_OPTIMIZER = "PreferBackwardOptimizer"
  ZERO_BUBBLE = "ZeroBubble"            # ZB-H1 (Qi et al., ICLR 2024)
  # ZB-V (the same paper): two stages per device, placed in a V.
  ZERO_BUBBLE_V = "ZeroBubbleV"
  # V-shaped with the activations a device holds capped at V-Half's and
  # V-Min's (Qi et al., NeurIPS 2024), ordered greedily (`capped_v_orders`).
  ZERO_BUBBLE_V_HALF = "ZeroBubbleVHalf"
  ZERO_BUBBLE_V_MIN = "ZeroBubbleVMin"

  @classmethod
  def of(cls, schedule):
    """The Schedule `schedule` is (a Schedule, or its configuration
    name); ValueError naming the known ones otherwise."""
    try:
      return cls(schedule)
    except ValueError:
      raise ValueError("Unknown pipeline.strategy %r; use one of %s." % (
          schedule, ", ".join(repr(s.value) for s in cls))) from None

  @property
  def splits_backward(self):
    """Each backward runs as B (input gradients) and W (weight
    gradients), apart."""
    return self is Schedule.ZERO_BUBBLE or self.v_shaped

  @property
  def v_shaped(self):
    """Two stages per device, device d holding stages d and 2p - 1 - d of
    2p (the forward goes down the devices and comes back up)."""
    return self in (Schedule.ZERO_BUBBLE_V, Schedule.ZERO_BUBBLE_V_HALF,
                    Schedule.ZERO_BUBBLE_V_MIN)

  def activation_cap(self, num_devices):
    """The most stage-micro-batches (of one of the 2p stages) a device
    may hold at once under a capped V schedule on `num_devices` devices:
    V-Half (p + 2) / 2 and V-Min (p + 4) / 3 micro-batches of a whole
    device's model part (two stages), rounded up; None for the others."""
    if self is Schedule.ZERO_BUBBLE_V_HALF:
      return num_devices + 2
    if self is Schedule.ZERO_BUBBLE_V_MIN:
      return -(-2 * (num_devices + 4) // 3)
    return None

  @property
  def label(self):
    """The name people know it by."""
    return _LABELS[self]


_LABELS = {Schedule.PREFER_BACKWARD: "1F1B",
           Schedule.PREFER_FORWARD: "GPipe",
           Schedule.PREFER_BACKWARD_OPTIMIZER:
               "1F1B, one more forward in flight",
           Schedule.ZERO_BUBBLE: "ZB-H1",
           Schedule.ZERO_BUBBLE_V: "ZB-V",
           Schedule.ZERO_BUBBLE_V_HALF: "V-Half",
           Schedule.ZERO_BUBBLE_V_MIN: "V-Min"}

FORWARD, BACKWARD, WEIGHT = "forward", "backward", "weight"

# One pass: `kind` (FORWARD, BACKWARD or WEIGHT) of stage `stage` for
# micro-batch `micro_batch`.
Pass = collections.namedtuple("Pass", ["kind", "stage", "micro_batch"])


def warm_up(schedule, num_stages, stage, num_micro_batch):
  """The forwards stage `stage` runs before its first backward.

  PreferForward (GPipe): all of them. PreferBackward (1F1B) and
  ZeroBubble: num_stages - stage. PreferBackwardOptimizer: one more than
  1F1B on every stage but the last, so that a stage has the next forward
  done when the backward it waits for arrives (the original EPL's
  ordering).
  """
  schedule = Schedule.of(schedule)
  if schedule.v_shaped:
    raise ValueError("%s has no order per stage: each device runs two "
                     "stages (device_orders)." % schedule.label)
  if schedule is Schedule.PREFER_FORWARD:
    return num_micro_batch
  ahead = num_stages - stage
  if schedule is Schedule.PREFER_BACKWARD_OPTIMIZER and stage < num_stages - 1:
    ahead += 1
  return min(ahead, num_micro_batch)


def in_flight(schedule, num_stages, stage, num_micro_batch):
  """The most micro-batches whose activations stage `stage` holds at once,
  counted from its order (`held_at_peak`).

  GPipe and the 1F1B schedules: the warm-up forwards. ZeroBubble: stage s
  defers s weight passes, so every stage holds min(num_stages, M), the
  most 1F1B holds on any stage (its first): ZB-H1's peak memory is
  1F1B's peak.
  """
  order = [Pass(kind, stage, m) for kind, m in stage_order(
      schedule, num_stages, stage, num_micro_batch)]
  return held_at_peak(schedule, order)


def held_at_peak(schedule, order, size=None):
  """The most activations a device running `order` ([Pass], in order)
  holds at once: each forward of a stage adds `size(stage)` (1 by
  default: then the count of (stage, micro-batch) pairs in flight), which
  the pass that ends that micro-batch's backward of the stage frees (its
  W when `schedule` splits the backward, else its B)."""
  last = WEIGHT if Schedule.of(schedule).splits_backward else BACKWARD
  live = peak = 0
  for step in order:
    amount = 1 if size is None else size(step.stage)
    if step.kind == FORWARD:
      live += amount
      peak = max(peak, live)
    elif step.kind == last:
      live -= amount
  return peak


def stage_order(schedule, num_stages, stage, num_micro_batch):
  """The (kind, micro-batch) pairs stage `stage` runs, in order.

  The `warm_up` forwards, then one backward and one forward in turn, then
  the backwards left (for GPipe: every forward, then every backward).
  ZeroBubble (ZB-H1) runs 1F1B's order with each B followed by the W of
  the micro-batch `stage` backwards before it: stage s defers s weight
  passes, which run last, in the time the stage would wait for backwards
  from later stages under 1F1B.
  """
  schedule = Schedule.of(schedule)
  ahead = warm_up(schedule, num_stages, stage, num_micro_batch)
  deferred = stage if schedule is Schedule.ZERO_BUBBLE else None
  order = [(FORWARD, m) for m in range(ahead)]
  for m in range(num_micro_batch):
    order.append((BACKWARD, m))
    if deferred is not None and m >= deferred:
      order.append((WEIGHT, m - deferred))
    if ahead + m < num_micro_batch:
      order.append((FORWARD, ahead + m))
  if deferred is not None:
    order.extend((WEIGHT, m) for m in range(
        max(num_micro_batch - deferred, 0), num_micro_batch))
  return order


def interleaved_device_order(num_devices, virtual_stages, device,
                             num_micro_batch):
  """The passes device `device` runs under Megatron-LM's interleaved 1F1B:
  num_devices x virtual_stages stages, stage s on device s mod
  num_devices (chunk s // num_devices of it).

  Forwards go chunk by chunk in groups of num_devices micro-batches (chunk
  0 of micro-batches 0..d-1, chunk 1 of the same, ..., then the next
  group); backwards the same with the chunks reversed. The device runs
  (d - device - 1) * 2 + (v - 1) * d forwards first (all of them when M is
  d), then one forward and one backward in turn, then the backwards left.
  `num_micro_batch` must be a multiple of num_devices.
  """
  if num_micro_batch % num_devices:
    raise ValueError(
        "Interleaved 1F1B (%d stages on %d devices per pipeline) needs "
        "pipeline.num_micro_batch to be a multiple of %d; it is %d." % (
            num_devices * virtual_stages, num_devices, num_devices,
            num_micro_batch))
  total = num_micro_batch * virtual_stages
  group = num_devices * virtual_stages

  def nth(k, kind):
    chunk = (k % group) // num_devices
    if kind == BACKWARD:
      chunk = virtual_stages - 1 - chunk
    micro_batch = (k // group) * num_devices + k % num_devices
    return Pass(kind, chunk * num_devices + device, micro_batch)

  if num_micro_batch == num_devices:
    ahead = total
  else:
    ahead = min((num_devices - device - 1) * 2 +
                (virtual_stages - 1) * num_devices, total)
  order = [nth(k, FORWARD) for k in range(ahead)]
  for k in range(total - ahead):
    order.append(nth(ahead + k, FORWARD))
    order.append(nth(k, BACKWARD))
  order.extend(nth(k, BACKWARD) for k in range(total - ahead, total))
  return order


def v_device_order(num_devices, device, num_micro_batch):
  """The passes device `device` runs under ZB-V (Qi et al., ICLR 2024):
  2p stages on p = num_devices devices, the device holding stage d on the
  way down (`down`) and stage 2p - 1 - d on the way back up (`up`), each
  backward split into B and W.

  Warm-up: 2(p - d) - 1 forwards of `down`, then d times a forward of `up`
  and one of `down`, then p - d times F, B, W of `up` (the first
  backwards arrive). Steady state: F of `down` (while any is left), B and
  W of `down`, F, B and W of `up`, until every forward ran. Cool-down: d
  times the B of both stages (their W wait), p - d times B and W of
  `down`, then the W left, `up`'s first. Each device holds at most 2p
  stage-micro-batches of half a 1F1B stage: 1F1B's peak, without its
  bubble. Needs num_micro_batch >= 2p - 1 (device 0's warm-up).
  """
  p, d = num_devices, device
  if num_micro_batch < 2 * p - 1:
    raise ValueError(
        "ZB-V (pipeline.strategy \"ZeroBubbleV\") on %d devices per "
        "pipeline needs pipeline.num_micro_batch >= %d (the first device's "
        "warm-up); it is %d. Raise it, or use \"ZeroBubble\" (ZB-H1)." % (
            p, 2 * p - 1, num_micro_batch))
  down, up = d, 2 * p - 1 - d
  done = collections.Counter()
  order = []

  def run(*passes):
    for kind, stage in passes:
      order.append(Pass(kind, stage, done[(kind, stage)]))
      done[(kind, stage)] += 1

  run(*[(FORWARD, down)] * (2 * (p - d) - 1))
  run(*[(FORWARD, up), (FORWARD, down)] * d)
  run(*[(FORWARD, up), (BACKWARD, up), (WEIGHT, up)] * (p - d))
  while done[(FORWARD, up)] < num_micro_batch:
    if done[(FORWARD, down)] < num_micro_batch:
      run((FORWARD, down))
    run((BACKWARD, down), (WEIGHT, down), (FORWARD, up), (BACKWARD, up),
        (WEIGHT, up))
  run(*[(BACKWARD, down), (BACKWARD, up)] * d)
  run(*[(BACKWARD, down), (WEIGHT, down)] * (p - d))
  run(*[(WEIGHT, up)] * (num_micro_batch - done[(WEIGHT, up)]))
  run(*[(WEIGHT, down)] * (num_micro_batch - done[(WEIGHT, down)]))
  return order


def needs(step, num_stages):
  """The passes pass `step` waits for: a forward the previous stage's
  forward of its micro-batch; a backward (B) its own forward and the next
  stage's backward; a weight pass (W) its B."""
  kind, stage, micro_batch = step
  if kind == FORWARD:
    return [Pass(FORWARD, stage - 1, micro_batch)] if stage else []
  if kind == WEIGHT:
    return [Pass(BACKWARD, stage, micro_batch)]
  result = [Pass(FORWARD, stage, micro_batch)]
  if stage < num_stages - 1:
    result.append(Pass(BACKWARD, stage + 1, micro_batch))
  return result


def _capped_v_pass(device, num_devices, num_micro_batch, cap, state):
  """The pass device `device` runs next under a capped V schedule, or
  None: the earliest ready B (the critical path), else a ready forward
  that keeps its held activations within `cap`, else the earliest ready
  W (which frees a micro-batch's activations). A forward of the `down`
  stage also keeps room for the `up` forward of each micro-batch that
  went down and has not come back, so the device never fills up with
  forwards whose backwards cannot start."""
  ran, ready, held = state
  up, down = 2 * num_devices - 1 - device, device

  def next_ready(kind, stage):
    step = Pass(kind, stage, ran[(kind, stage)])
    if step.micro_batch < num_micro_batch and ready(step):
      return step
    return None

  for kind in (BACKWARD, FORWARD, WEIGHT):
    steps = [step for step in (next_ready(kind, up), next_ready(kind, down))
             if step is not None]
    if kind == FORWARD:
      returning = ran[(FORWARD, down)] - ran[(FORWARD, up)]
      steps = [step for step in steps if held[device] + 1 + (
          0 if step.stage == up else returning + 1) <= cap]
    if steps:
      return min(steps, key=lambda step: (step.micro_batch, -step.stage))
  return None


def capped_v_orders(num_devices, num_micro_batch, cap):
  """[[Pass]] per device of a V-shaped pipeline (2p stages, device d
  holding d and 2p - 1 - d) in which no device holds more than `cap`
  stage-micro-batches of activations (from a forward to its W).

  The orders are those of a greedy run with F = B = W = 1: at each time
  unit, each free device takes `_capped_v_pass`. A run is a valid
  execution, so the rewrite's control edges following its orders cannot
  wait in a cycle. ValueError when the cap leaves every device waiting.
  """
  num_stages = 2 * num_devices
  ended, orders = {}, [[] for _ in range(num_devices)]
  ran, held = collections.Counter(), [0] * num_devices
  time, total = 0, 3 * num_stages * num_micro_batch

  def ready(step):
    """Every pass `step` needs has ended by the current `time`."""
    return all(ended.get(need, time + 1) <= time
               for need in needs(step, num_stages))

  state = (ran, ready, held)
  while sum(len(order) for order in orders) < total:
    busy = False
    for device, order in enumerate(orders):
      if order and ended[order[-1]] > time:
        busy = True
        continue
      step = _capped_v_pass(device, num_devices, num_micro_batch, cap,
                            state)
      if step is None:
        continue
      busy = True
      ended[step] = time + 1
      order.append(step)
      ran[(step.kind, step.stage)] += 1
      held[device] += {FORWARD: 1, WEIGHT: -1}.get(step.kind, 0)
    if not busy:
      raise ValueError(
          "No V-shaped order on %d devices keeps each device within %d "
          "stage-micro-batches of activations." % (num_devices, cap))
    time += 1
  return orders


def device_of_stage(schedule, stage, num_devices):
  """The pipeline device (0 .. num_devices - 1) of stage `stage`: under a
  V-shaped schedule stage s and 2p - 1 - s share device s; otherwise stage
  s is on device s mod num_devices (one stage per device, or interleaved
  1F1B's round robin)."""
  if Schedule.of(schedule).v_shaped and stage >= num_devices:
    return 2 * num_devices - 1 - stage
  return stage % num_devices


def stages_per_device(schedule, virtual_stages):
  """The stages each pipeline device holds under `schedule` with
  pipeline.virtual_stages `virtual_stages`: 2 under a V-shaped schedule
  (which implies it: 1 is taken as unset), else `virtual_stages`."""
  schedule = Schedule.of(schedule)
  if not schedule.v_shaped:
    return virtual_stages
  if virtual_stages not in (1, 2):
    raise ValueError(
        "pipeline.strategy %r (%s) holds 2 stages per device, but "
        "pipeline.virtual_stages is %d: set it to 2 or leave it at 1." % (
            schedule.value, schedule.label, virtual_stages))
  return 2


def device_orders(schedule, num_stages, num_micro_batch, virtual_stages=1):
  """[[Pass]] per device of one pipeline, in the order each runs them.

  With virtual_stages v > 1 (interleaved 1F1B under PreferBackward, ZB-V
  with v = 2), `num_stages` stages sit on num_stages / v devices;
  otherwise one stage per device.
  """
  schedule = Schedule.of(schedule)
  virtual_stages = stages_per_device(schedule, virtual_stages)
  if virtual_stages == 1:
    return [[Pass(kind, stage, m) for kind, m in stage_order(
        schedule, num_stages, stage, num_micro_batch)]
            for stage in range(num_stages)]
  if schedule is not Schedule.PREFER_BACKWARD and not schedule.v_shaped:
    raise ValueError("Virtual stages (v = %d) interleave 1F1B only; "
                     "schedule %r has none: use %r or v = 1." % (
                         virtual_stages, schedule.value,
                         Schedule.PREFER_BACKWARD.value))
  if num_stages % virtual_stages:
    raise ValueError("%d stages do not divide into %d virtual stages per "
                     "device." % (num_stages, virtual_stages))
  devices = num_stages // virtual_stages
  if schedule.activation_cap(devices) is not None:
    return capped_v_orders(devices, num_micro_batch,
                           schedule.activation_cap(devices))
  if schedule.v_shaped:
    return [v_device_order(devices, d, num_micro_batch)
            for d in range(devices)]
  return [interleaved_device_order(devices, virtual_stages, d,
                                   num_micro_batch)
          for d in range(devices)]
