"""The order in which each pipeline device runs its passes, per schedule.

A pass is the forward (F), backward (B) or weight-gradient (W) work of one
stage for one micro-batch. GPipe and 1F1B run each backward whole (B is
then the full backward and there is no W); ZB-H1 splits it into B, the
gradients with respect to the stage's inputs that the previous stage waits
for, and W, the gradients with respect to the stage's weights, which
nothing downstream waits for and which fills what would be bubble.
Interleaved 1F1B (Megatron-LM) gives each device several stages (chunks).

Plain Python and plain data: the rewrite's schedule pass enforces these
orders with control edges (`epl.parallel.passes.schedule`), the simulator times them
(`epl.tools.schedule_simulator`), the memory estimate counts the
activations they keep.
"""
import collections

PREFER_FORWARD = "PreferForward"    # GPipe
PREFER_BACKWARD = "PreferBackward"  # 1F1B
# 1F1B with one more forward in flight on every stage but the last (the
# original EPL's third schedule).
PREFER_BACKWARD_OPTIMIZER = "PreferBackwardOptimizer"
ZERO_BUBBLE = "ZeroBubble"          # ZB-H1 (Qi et al., ICLR 2024)
SCHEDULES = (PREFER_BACKWARD, PREFER_FORWARD, PREFER_BACKWARD_OPTIMIZER,
             ZERO_BUBBLE)

FORWARD, BACKWARD, WEIGHT = "forward", "backward", "weight"

# One pass: `kind` (FORWARD, BACKWARD or WEIGHT) of stage `stage` for
# micro-batch `micro_batch`.
Pass = collections.namedtuple("Pass", ["kind", "stage", "micro_batch"])


def check_schedule(schedule):
  """Raises ValueError naming the known schedules if `schedule` is not
  one."""
  if schedule not in SCHEDULES:
    raise ValueError("Unknown pipeline.strategy %r; use one of %s." % (
        schedule, ", ".join(repr(s) for s in SCHEDULES)))


def splits_backward(schedule):
  """Whether `schedule` runs a stage's weight gradients (W) apart from its
  input gradients (B)."""
  return schedule == ZERO_BUBBLE


def warm_up(schedule, num_stages, stage, num_micro_batch):
  """The forwards stage `stage` runs before its first backward.

  PreferForward (GPipe): all of them. PreferBackward (1F1B) and
  ZeroBubble: num_stages - stage. PreferBackwardOptimizer: one more than
  1F1B on every stage but the last, so that a stage has the next forward
  done when the backward it waits for arrives (the original EPL's
  ordering).
  """
  check_schedule(schedule)
  if schedule == PREFER_FORWARD:
    return num_micro_batch
  ahead = num_stages - stage
  if schedule == PREFER_BACKWARD_OPTIMIZER and stage < num_stages - 1:
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
  last = WEIGHT if splits_backward(schedule) else BACKWARD
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
  ahead = warm_up(schedule, num_stages, stage, num_micro_batch)
  deferred = stage if schedule == ZERO_BUBBLE else None
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
        "Interleaved 1F1B needs pipeline.num_micro_batch to be a multiple "
        "of the devices of a pipeline (%d); it is %d." % (
            num_devices, num_micro_batch))
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


def device_orders(schedule, num_stages, num_micro_batch, virtual_stages=1):
  """[[Pass]] per device of one pipeline, in the order each runs them.

  With virtual_stages v > 1 (interleaved 1F1B, `schedule` PreferBackward),
  `num_stages` stages sit on num_stages / v devices; otherwise one stage
  per device.
  """
  if virtual_stages == 1:
    return [[Pass(kind, stage, m) for kind, m in stage_order(
        schedule, num_stages, stage, num_micro_batch)]
            for stage in range(num_stages)]
  if schedule != PREFER_BACKWARD:
    raise ValueError("Virtual stages (v = %d) interleave 1F1B only; "
                     "schedule %r has none: use %r or v = 1." % (
                         virtual_stages, schedule, PREFER_BACKWARD))
  if num_stages % virtual_stages:
    raise ValueError("%d stages do not divide into %d virtual stages per "
                     "device." % (num_stages, virtual_stages))
  devices = num_stages // virtual_stages
  return [interleaved_device_order(devices, virtual_stages, d,
                                   num_micro_batch)
          for d in range(devices)]
