"""`epl-plan` and `EPL_DRY_RUN=1`: show the plan, run nothing.

    epl-plan examples/bert_large/train.py --parallel pipeline_data \\
        --num_stages 2 --num_micro_batch 4 --num_cpu_devices 4
    EPL_DRY_RUN=1 python train.py ...          # the same
    python -m epl.tools.dry_run train.py ...   # the same, without the entry

The user's script runs as usual until EPL would rewrite the graph (the
first `Session.run`, or `Graph.finalize` as `MonitoredTrainingSession`
does it). Then the rewrite runs in full, the plan is printed (replicas,
stages and their devices, micro-batches, the memory savers and
communication settings in effect, estimated memory per device from
`epl.tools.memory_estimate`, the persistent bytes per device each ZeRO
level would leave, the bytes each device sends per step by kind and
holds beside their formulas from `epl.tools.traffic`; for a pipeline its
schedule and bubble), and the
process exits with status 0: no variable is initialised and no step runs.

A `Session.run` before the script has built a training step for EPL to
plan ends a dry run with status 1 instead of running it; so does a script
that ends without one under `epl-plan`.

`EPL_DRY_RUN` is an environment variable, not a config key: a dry run is a
way of starting a script, not a property of the model, and a key could be
left on in a script by mistake and stop every real run.
"""
import importlib
import logging
import os
import runpy
import sys

import tensorflow as tf

from epl.tools import memory_estimate
from epl.ir.phase import Phase
from epl.tools import schedule_simulator
from epl.tools import shadowing
from epl.tools import traffic

logger = logging.getLogger("epl")

ENV_VAR = "EPL_DRY_RUN"
# Replicas whose devices are listed by name (the first ones and the last).
_LISTED_REPLICAS = 4
# Set once a plan was printed (epl-plan tells a planned exit from the
# script's own).
_planned = []


def enabled():
  """Whether this process is a dry run (EPL_DRY_RUN set to 1/true/yes)."""
  return os.environ.get(ENV_VAR, "").strip().lower() in ("1", "true", "yes")


_UNITS = (("GiB", 2.0 ** 30), ("MiB", 2.0 ** 20), ("KiB", 2.0 ** 10),
          ("B", 1.0))


def _unit(largest):
  """(name, bytes) of the unit that shows `largest` bytes best."""
  for name, size in _UNITS:
    if largest >= size:
      return name, size
  return _UNITS[-1]


def _batch_size(result, estimates):
  """Examples of one micro-batch, from the static shape of the first
  input read or the batch size the estimate assumed; None when neither
  is known."""
  for read in result.step.input_reads:
    for tensor in read.outputs:
      if tensor.shape.rank and tensor.shape.as_list()[0] is not None:
        return tensor.shape.as_list()[0]
  return estimates[0].batch_size_assumed if estimates else None


def _taskgraph_lines(result):
  plan, state = result.plan, result.context.state
  parameters = [0] * plan.num_stages
  forward_ops = [0] * plan.num_stages
  # Every trained variable, also those ZeRO v1-v3 reduce on their owner
  # rather than all-reduce, at its size as the user built it (not v3's
  # shard).
  trained = {variable.name
             for _, variable in memory_estimate.trained_points(result)}
  for op in result.subgraph.cloned:
    index = min(result.context.taskgraph_index(op), plan.num_stages - 1)
    if op.name in trained:
      parameters[index] += memory_estimate.unsharded_elements(result, op)
    elif (state.phase_of(op) is Phase.FORWARD and
          state.micro_batch_of(op) == 0):
      forward_ops[index] += 1
  lines = []
  for index, taskgraph in enumerate(plan.taskgraphs):
    devices = ["%s (replica %d)" % (plan.device(r, index), r)
               for r in range(plan.num_replicas)]
    if len(devices) > _LISTED_REPLICAS:
      devices[_LISTED_REPLICAS - 1:-1] = ["..."]
    devices = ", ".join(devices)
    lines.append("    %d %r: %s, %d device(s) per replica; %s parameters, "
                 "%d forward ops; on %s" % (
                     index, taskgraph.name, taskgraph.kind,
                     taskgraph.device_count, format(parameters[index], ","),
                     forward_ops[index], devices))
  return lines


def _saver_lines(result):
  config = result.context.config
  gc = config.gradient_checkpoint
  if gc.type:
    recomputed = sum(len(s) for s in result.recomputed_segments)
    gc_text = ("%r: %d op(s) recomputed in %d segment(s)" %
               (gc.type, recomputed, len(result.recomputed_segments)))
  else:
    gc_text = "off"
  amp = config.amp
  amp_text = ("%s, %s, loss scale %s" % (amp.level, amp.dtype, amp.loss_scale)
              if amp.level else "off")
  return [
      "    gradient checkpointing: %s" % gc_text,
      "    ZeRO: %s" % (config.zero.level or "off"),
      "    AMP: %s" % amp_text,
      "    offload: %s" % (config.offload.level or "off"),
      "    optimizer apply groups: %d" % config.optimizer.num_apply_group,
  ]


def _communication_line(result, gradient_bytes):
  plan, comm = result.plan, result.context.config.communication
  if plan.num_replicas == 1:
    return "    none (one model replica)"
  ring = 2.0 * (plan.num_replicas - 1) / plan.num_replicas
  size = gradient_bytes * (0.5 if comm.fp16 else 1.0)
  communicator = result.context.communicator_class()
  text = "    gradients all-reduced (%s) over %d replicas by %s, " % (
      comm.gradients_reduce_method, plan.num_replicas, communicator.__name__)
  text += ("in at most %d fused bucket(s) per stage and dtype" %
           comm.max_splits if communicator.fuses else "one per gradient")
  text += (", in the order backward makes them, over %d collective "
           "group(s)" % comm.num_communicators)
  if comm.fp16:
    text += ", as float16 (scale %g)" % comm.fp16_scale
  if comm.sparse_as_dense:
    text += ", sparse gradients as dense"
  if comm.clip_after_allreduce:
    text += ", clipping after the all-reduce"
  name, unit = _unit(ring * size)
  text += ("; as a ring all-reduce, about %.2f %s per device and step" %
           (ring * size / unit, name))
  return text + _ZERO_COMMUNICATION.get(result.context.config.zero.level, "")


# What ZeRO changes in the communication line.
_ZERO_COMMUNICATION = {
    "v1": "; zero.level v1: gradients reduced on their owner instead",
    "v2": "; zero.level v2: gradients reduced on their owner instead",
    "v3": ("; zero.level v3: gradients of partitioned weights "
           "reduce-scattered to their shards instead, and each weight "
           "gathered from its shards before every use (about 1.5x the "
           "traffic)"),
}


def _zero_lines(result):
  """Per stage, the persistent bytes per device each ZeRO level leaves, by
  `memory_estimate.zero_formula`, over this worker's replicas (those ZeRO
  partitions over)."""
  stages = memory_estimate.zero_parameters(result)
  replicas = len(result.context.replicas)
  micro_batches = result.plan.num_micro_batch
  figures = [[memory_estimate.zero_formula(
      level, s.parameters, replicas, s.weight_bytes, s.gradient_bytes,
      s.optimizer_bytes, micro_batches)
              for level in memory_estimate.ZERO_LEVELS] for s in stages]
  unit_name, unit = _unit(max([max(f) for f in figures] or [0]))
  level = result.context.config.zero.level or "off"
  lines = ["  ZeRO: weights + gradients + optimizer state per device (%s) "
           "by level, from DeepSpeed's formulas over the %d replica(s) of "
           "this worker (W, G, K: bytes per parameter; this run: %s):" % (
               unit_name, replicas, level)]
  rows = [("stage", "parameters", "W", "G", "K") + tuple(
      l or "off" for l in memory_estimate.ZERO_LEVELS)]
  for stage, figure in zip(stages, figures):
    rows.append((str(stage.stage), format(stage.parameters, ","),
                 "%g" % stage.weight_bytes, "%g" % stage.gradient_bytes,
                 "%.3g" % stage.optimizer_bytes) +
                tuple("%.2f" % (f / unit) for f in figure))
  lines.extend(traffic.table(rows))
  return lines


def _memory_lines(estimates, interleaved=False):
  unit_name, unit = _unit(max([e.total for e in estimates] or [0]))

  def size(value):
    return "%.2f" % (value / unit)

  def activations(e):
    if interleaved:
      return "%s in %d" % (size(e.activations), e.in_flight)
    return "%s x %d" % (size(e.activations_per_micro_batch), e.in_flight)
  lines = ["  estimated memory per device at the step's peak (%s; gradients: "
           "one set x sets live while micro-batches are summed; "
           "activations: %s):" % (
               unit_name, "held at the peak in that many (stage, "
               "micro-batch) passes in flight, over the device's stages"
               if interleaved else "per micro-batch x in flight")]
  header = ("device", "stages", "params", "optimizer", "other", "gradients",
            "activations", "recomputed", "working", "total")
  rows = [header]
  for e in estimates:
    rows.append((e.device, ",".join(str(s) for s in e.stages) or "-",
                 size(e.parameters), size(e.optimizer_state),
                 size(e.other_state),
                 "%s x %d" % (size(e.gradients), e.gradient_sets),
                 activations(e),
                 size(e.recomputed), size(e.working), size(e.total)))
  lines.extend(traffic.table(rows))
  if estimates and estimates[0].batch_size_assumed:
    lines.append("    (the input's batch dimension is not static: shapes "
                 "inferred with the input pipeline's batch size %d)" %
                 estimates[0].batch_size_assumed)
  unknown = sum(e.unknown_tensors for e in estimates)
  if unknown:
    lines.append("    WARNING: %d tensor(s) have no fully known static shape "
                 "and are not counted: the estimate is low. Give the input "
                 "a static batch size (drop_remainder=True)." % unknown)
  return lines


def describe(result, estimates=None):
  """The plan of RewriteResult `result` as text for people."""
  plan, cluster = result.plan, result.context.cluster
  if estimates is None:
    estimates = memory_estimate.estimate(result)
  stages = 1 if plan.has_split else plan.num_stages
  micro_batch = _batch_size(result, estimates)
  lines = ["EPL plan (dry run: nothing was initialised, no step ran)",
           "  cluster: %d worker(s) x %d %s device(s)" % (
               cluster.worker_num, cluster.devices_per_worker,
               cluster.device_type),
           "  model replicas (data parallel): %d" % plan.num_replicas]
  interleaved = plan.virtual_stages > 1
  if stages > 1:
    lines.append("  pipeline: %d stage(s), %d micro-batch(es) per step, "
                 "schedule %s (%s)" % (
                     stages, plan.num_micro_batch, plan.schedule.value,
                     plan.schedule.label))
    if plan.schedule.v_shaped:
      lines[-1] += (", in a V: %d device(s) per replica, device d holding "
                    "stages d and %d - d" % (stages // 2, stages - 1))
    elif interleaved:
      lines[-1] += (", interleaved: %d device(s) per replica, %d stages "
                    "on each" % (stages // plan.virtual_stages,
                                 plan.virtual_stages))
  elif plan.num_micro_batch > 1:
    lines.append("  micro-batches: %d per step (gradient accumulation, no "
                 "pipeline)" % plan.num_micro_batch)
  if micro_batch is not None:
    lines.append("  batch: %d examples per micro-batch, %d per step (%d "
                 "replica(s) x %d micro-batch(es) x %d)" % (
                     micro_batch,
                     micro_batch * plan.num_micro_batch * plan.num_replicas,
                     plan.num_replicas, plan.num_micro_batch, micro_batch))
  if stages > 1 and (interleaved or plan.schedule.splits_backward):
    bubble = schedule_simulator.simulate(
        plan.schedule, stages, plan.num_micro_batch,
        plan.virtual_stages).bubble_fraction
    lines.append("  pipeline bubble: %.1f%% of a step (simulated with "
                 "F = B = W)" % (100.0 * bubble))
  elif stages > 1:
    bubble = memory_estimate.bubble_fraction(stages, plan.num_micro_batch)
    lines.append("  pipeline bubble: (p-1)/(m+p-1) = %d/%d = %.1f%% of a "
                 "step" % (stages - 1, plan.num_micro_batch + stages - 1,
                           100.0 * bubble))
  lines.append("  decisions (the plan's, which the passes apply):")
  lines.extend("    " + line for line in result.decisions.lines())
  lines.append("  TaskGraphs:")
  lines.extend(_taskgraph_lines(result))
  lines.append("  memory savers:")
  lines.extend(_saver_lines(result))
  lines.append("  communication:")
  gradient_bytes = max([e.gradients for e in estimates] or [0])
  lines.append(_communication_line(result, gradient_bytes))
  lines.extend(_memory_lines(estimates, interleaved))
  lines.extend(_zero_lines(result))
  lines.extend(traffic.lines(result, estimates))
  return "\n".join(lines)


def after_rewrite(result):
  """Called once the rewrite is done: in a dry run, prints the plan and
  ends the process with status 0."""
  if not enabled():
    return
  text = describe(result)
  _planned.append(text)
  logger.info("EPL dry run: plan printed, exiting before the first step")
  print(text, flush=True)
  sys.exit(0)


def refuse_run():
  """Ends a dry run with status 1 before a Session.run that has no plan
  (a dry run runs nothing)."""
  print("EPL dry run: the script runs its session before building a "
        "training step under EPL (gradients and their update), so there is "
        "no plan to show; nothing was run. Build the train op before the "
        "first Session.run.", file=sys.stderr, flush=True)
  sys.exit(1)


def _usage():
  return ("usage: epl-plan script.py [args...]\n"
          "       epl-plan -m module [args...]\n"
          "Runs the EPL script up to its first training step, prints the "
          "plan with estimated memory per device, and exits without "
          "running a step.")


def main(argv=None):
  """`epl-plan`: runs a script (or `-m module`) as a dry run."""
  argv = list(sys.argv[1:] if argv is None else argv)
  if not argv or argv[0] in ("-h", "--help"):
    print(_usage(), file=sys.stderr if not argv else sys.stdout)
    sys.exit(0 if argv else 2)
  os.environ[ENV_VAR] = "1"
  module = argv[0] == "-m"
  if module and len(argv) < 2:
    print(_usage(), file=sys.stderr)
    sys.exit(2)
  target = argv[1] if module else argv[0]
  shadow = shadowing.shadowing_path(
      os.getcwd() if module else os.path.dirname(os.path.abspath(target)))
  if shadow is not None:
    print(shadowing.error(shadow, "epl-plan " + " ".join(argv)),
          file=sys.stderr, flush=True)
    sys.exit(2)
  sys.argv = [target] + argv[2 if module else 1:]
  try:
    if module:
      runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
      sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
      runpy.run_path(target, run_name="__main__")
  except SystemExit as exit_:
    if _planned or exit_.code not in (None, 0):
      raise
  print("epl-plan: %s ended without building a training step for EPL to "
        "plan: it must call epl.init() and build its train op before it "
        "first runs a session." % target, file=sys.stderr, flush=True)
  sys.exit(1)


if __name__ == "__main__":
  # Run as `python -m epl.tools.dry_run`, this file is `__main__`, a second
  # copy of the module: run main() of the copy that epl.hooks imports, so
  # that its record of a printed plan is the one main() reads.
  importlib.import_module("epl.tools.dry_run").main()
