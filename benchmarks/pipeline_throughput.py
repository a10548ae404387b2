"""Pipeline throughput: a 2-stage pipeline of dense layers against one
device, and the BERT example under EPL's schedules.

Dense layers. The same model (NUM_STAGES x LAYERS dense layers) trains on:
  - one device: EPL gradient accumulation over M micro-batches (the same
    work, cut the same way, without a pipeline), and plain TensorFlow with
    one batch of M micro-batches' examples;
  - a pipeline of 2 stages on 2 logical CPU devices with M micro-batches,
    under both schedules.
For each M the four runs are built first and then timed step by step in
turn, in this process, so that they share any load on the machine alike,
with the same session settings: every op single-threaded (intra_op_parallelism_threads=1)
and one inter-op thread per device (1 for the one-device runs, 2 for the
pipeline), so that a logical device stands for one core running one op at
a time, as a GPU runs one kernel stream. For each M the speedup over the one-device run is printed
next to the bound the pipeline bubble allows, p * (1 - (p-1)/(m+p-1)):
the bubble is the fraction (p-1)/(m+p-1) of a step in which a stage of a
p-stage pipeline idles.

BERT schedules. The BERT example (tiny, 2 encoder layers per device) as a
pipeline on --bert_devices devices with the same micro-batch size and
count under GPipe, 1F1B, interleaved 1F1B (two stages per device), ZB-H1,
ZB-V, V-Half and V-Min (two per device in a V) (`bert_schedules`): per
schedule the measured step time (median, all timed in turn), the step time and bubble the schedule simulator
gives from the per-stage F, B and W costs of one traced step of it
(`schedule_simulator.costs_from_trace`), the bubble it gives with unit
costs (F = B = W), and the activations each device holds at its peak by
EPL's memory estimate (the activations of the passes in flight in the
schedule's order: the memory budget each schedule needs). On logical CPU
devices that share a few cores the measured times cannot show a
pipeline's speed-up: passes of different devices compete for the same
cores, and the traced costs include that contention. With GPUs (TensorFlow
sees some) the BERT pipelines run on them: --bert_devices GPUs per
pipeline, replicated over every multiple of them.

    python benchmarks/pipeline_throughput.py [--micro_batches 1-16]
        [--bert_devices 2] [--bert_micro_batches 4] [--smoke]
"""
import argparse
import logging
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import epl  # noqa: E402
from epl.tools import memory_estimate  # noqa: E402
from epl.tools import schedule_simulator  # noqa: E402
from epl.tools import timeline  # noqa: E402

import bert_schedules  # noqa: E402  (benchmarks/, next to this script)
import smoke  # noqa: E402
import stage_model  # noqa: E402

SMOKE = ["--micro_batches", "2", "--layers", "1", "--width", "16",
         "--micro_batch", "4", "--steps", "1", "--warmup", "1",
         "--bert_micro_batches", "4", "--bert_micro_batch", "1",
         "--bert_seq_length", "8",
         "--bert_vocab_size", "100"]

NUM_STAGES = 2


def _parse_counts(text):
  if "-" in text:
    low, high = text.split("-")
    return list(range(int(low), int(high) + 1))
  return [int(m) for m in text.split(",")]


def _session_config(devices):
  """One thread per op, one inter-op thread per device: a logical device
  stands for one core running one op at a time."""
  return tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1,
                                  inter_op_parallelism_threads=devices)


def _start(args, train_op, devices):
  """A session on the built graph, initialised and warmed up."""
  session = tf.compat.v1.Session(config=_session_config(devices))
  session.run(tf.compat.v1.global_variables_initializer())
  for _ in range(args.warmup):
    session.run(train_op)
  return session


def start_epl(args, num_micro_batch, devices, schedule="PreferBackward"):
  """(session, train op) of M micro-batches under EPL on `devices` devices
  (one stage per device; on one device, one stage of gradient
  accumulation). The rewrite runs in the warm-up; EPL stays on for the
  timed steps, as in a user's script."""
  epl.init(epl.Config({"cluster.num_cpu_devices": devices,
                       "pipeline.num_micro_batch": num_micro_batch,
                       "pipeline.strategy": schedule}))
  logging.getLogger("epl").setLevel(logging.WARNING)
  with tf.Graph().as_default():
    scope = stage_model.stage_scope
    if devices == 1:
      epl.set_default_strategy(epl.replicate(device_count=1))
      scope = lambda _: stage_model.NoScope()  # noqa: E731
    train_op = stage_model.build_train_op(
        NUM_STAGES, args.layers, args.width, args.micro_batch, scope)
    return _start(args, train_op, devices), train_op


def start_plain(args, num_micro_batch):
  """(session, train op) of plain TensorFlow on one batch of M x
  micro-batch examples, built without EPL."""
  epl.shutdown()
  with tf.Graph().as_default():
    train_op = stage_model.build_train_op(
        NUM_STAGES, args.layers, args.width,
        args.micro_batch * num_micro_batch, lambda _: stage_model.NoScope())
    return _start(args, train_op, 1), train_op


def step_times(runs, steps):
  """Median seconds per step of each (session, train op), timed in turn
  step by step so that they share any load on the machine alike."""
  times = [[] for _ in runs]
  for _ in range(steps):
    for index, (session, train_op) in enumerate(runs):
      start = time.perf_counter()
      session.run(train_op)
      times[index].append(time.perf_counter() - start)
  for session, _ in runs:
    session.close()
  return [float(np.median(t)) for t in times]


def host_parallelism(args, chains=NUM_STAGES):
  """How many single-threaded op chains this host runs at once (2.0: two
  free cores for two devices): `chains` x the time of one chain of matmuls
  over the time of `chains` such chains, one per device and thread."""
  def seconds(count):
    with tf.Graph().as_default() as graph:
      outputs = []
      for chain in range(count):
        with tf.device("/device:CPU:%d" % chain):
          value = tf.random.normal([args.width, args.width], seed=chain)
          for _ in range(10):
            value = tf.tanh(tf.matmul(value, value) * 1e-2)
          outputs.append(tf.reduce_sum(value))
    config = tf.compat.v1.ConfigProto(
        device_count={"CPU": chains}, intra_op_parallelism_threads=1,
        inter_op_parallelism_threads=count)
    with tf.compat.v1.Session(graph=graph, config=config) as session:
      session.run(outputs)
      times = []
      for _ in range(args.steps):
        start = time.perf_counter()
        session.run(outputs)
        times.append(time.perf_counter() - start)
    return float(np.median(times))
  return chains * seconds(1) / seconds(chains)


def dense_table(args):
  """The 2-stage dense pipeline against one device, for each M."""
  p = NUM_STAGES
  print("Pipeline throughput: %d stages x %d dense layers of %d units, "
        "micro-batch %d examples; median of %d steps after %d warm-up "
        "steps, the four runs of a row timed in turn; intra-op threads 1, "
        "inter-op threads = devices (1 or %d); %d CPU cores; "
        "TensorFlow %s" % (p, args.layers, args.width, args.micro_batch,
                           args.steps, args.warmup, p, os.cpu_count(),
                           tf.__version__))
  print("examples/s: 1dev = one device, M micro-batches accumulated; "
        "plain = plain TF, one batch of M x micro-batch; 1F1B / GPipe = "
        "%d-stage pipeline on %d devices; bubble = (p-1)/(m+p-1); bound = "
        "p x (1 - bubble), the speedup over one device the bubble allows"
        % (p, p))
  parallelism = host_parallelism(args)
  print("host parallelism before: %.2f of %d (%d independent single-threaded "
        "matmul chains on %d devices run %.2fx as fast as one; other jobs on "
        "this machine lower it)" % (parallelism, p, p, p, parallelism))
  header = ("M", "1dev ex/s", "plain ex/s", "1F1B ex/s", "GPipe ex/s",
            "1F1B/1dev", "GPipe/1dev", "bubble", "bound")
  print(" | ".join("%10s" % h for h in header))
  for m in _parse_counts(args.micro_batches):
    examples = m * args.micro_batch
    runs = [start_epl(args, m, 1), start_plain(args, m),
            start_epl(args, m, p, "PreferBackward"),
            start_epl(args, m, p, "PreferForward")]
    one, plain, one_f_one_b, gpipe = [
        examples / t for t in step_times(runs, args.steps)]
    bubble = (p - 1) / (m + p - 1)
    bound = p * (1 - bubble)
    print(" | ".join([
        "%10d" % m, "%10.0f" % one, "%10.0f" % plain, "%10.0f" % one_f_one_b,
        "%10.0f" % gpipe, "%10.2f" % (one_f_one_b / one),
        "%10.2f" % (gpipe / one), "%10.3f" % bubble, "%10.2f" % bound]),
          flush=True)
  epl.shutdown()
  print("host parallelism after: %.2f of %d" % (host_parallelism(args), p))


def _schedule_figures(pipeline):
  """(simulated step seconds and bubble from the costs of one traced
  step, bubble with unit costs, activations per device at its peak in
  bytes, passes in flight at that peak) of a built BERT pipeline."""
  trace = timeline.trace_step(pipeline.session, pipeline.train_op)[1]
  plan = pipeline.result.plan
  schedule = pipeline.schedule
  traced = schedule_simulator.simulate(
      schedule.strategy, pipeline.stages, plan.num_micro_batch,
      schedule.virtual_stages, schedule_simulator.costs_from_trace(trace))
  unit = schedule_simulator.simulate(
      schedule.strategy, pipeline.stages, plan.num_micro_batch,
      schedule.virtual_stages)
  estimates = memory_estimate.estimate(pipeline.result)[:pipeline.devices]
  return (traced.makespan / 1e6, traced.bubble_fraction,
          unit.bubble_fraction, [e.activations for e in estimates],
          [e.in_flight for e in estimates])


def bert_table(args):
  """The BERT example under every schedule at one micro-batch size and
  count."""
  gpus = len(tf.config.list_physical_devices("GPU"))
  devices = args.bert_devices
  where = ("%d GPU(s) found: pipelines of %d GPUs" % (gpus, devices) if gpus
           else "%d logical CPU devices sharing %d CPU cores (measured "
           "times cannot show a pipeline's speed-up there)" % (
               devices, os.cpu_count()))
  print("BERT schedules: tiny BERT, %d encoder layers, sequence %d, "
        "micro-batch %d, %d micro-batches, on %s; median of %d steps after "
        "%d warm-up steps, all timed in turn; TensorFlow %s" % (
            bert_schedules.layers_needed(devices), args.bert_seq_length,
            args.bert_micro_batch, args.bert_micro_batches, where,
            args.steps, args.warmup, tf.__version__))
  print("measured = step time; traced sim = the simulator's step time and "
        "bubble from this schedule's per-stage F/B/W costs of one traced "
        "step (traced with FULL_TRACE, its passes take longer than "
        "untraced ones, the more so where devices share cores: compare it "
        "between schedules, not with measured); unit bubble = the "
        "simulator's with F = B = W; activations = "
        "EPL's estimate of the activations each device holds at its peak "
        "(MiB, per device), passes = (stage, micro-batch) passes in flight "
        "then")
  pipelines, figures = [], []
  for schedule in bert_schedules.SCHEDULES:
    pipeline = bert_schedules.Pipeline(
        schedule, devices, 0 if gpus else devices,
        bert_schedules.layers_needed(devices), args.bert_micro_batches,
        args.bert_micro_batch, args.bert_seq_length, args.bert_vocab_size)
    logging.getLogger("epl").setLevel(logging.WARNING)
    for _ in range(args.warmup):
      pipeline.step()
    pipelines.append(pipeline)
    # Traced while EPL still holds this graph's rewrite (the next
    # pipeline's epl.init starts afresh).
    figures.append(_schedule_figures(pipeline))
  measured = step_times([(p.session, p.train_op) for p in pipelines],
                        args.steps)
  header = ("schedule", "stages", "measured ms", "examples/s",
            "traced sim ms", "traced bubble", "unit bubble",
            "activations MiB", "passes")
  print(" | ".join("%16s" % h for h in header))
  for pipeline, seconds, (simulated, bubble, unit, held, passes) in zip(
      pipelines, measured, figures):
    print(" | ".join([
        "%16s" % pipeline.schedule.name,
        "%16s" % ("%d on %d dev" % (pipeline.stages, pipeline.devices)),
        "%16.1f" % (seconds * 1e3),
        "%16.1f" % (pipeline.examples / seconds),
        "%16.1f" % (simulated * 1e3), "%16.3f" % bubble, "%16.3f" % unit,
        "%16s" % " / ".join("%.2f" % (b / 2.0 ** 20) for b in held),
        "%16s" % " / ".join(str(n) for n in passes)]), flush=True)
  epl.shutdown()


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--micro_batches", default="1-16",
                      help="M values: '1-16' or '1,2,4'")
  parser.add_argument("--layers", type=int, default=4,
                      help="dense layers per stage")
  parser.add_argument("--width", type=int, default=512)
  parser.add_argument("--micro_batch", type=int, default=64,
                      help="examples per micro-batch")
  parser.add_argument("--steps", type=int, default=15)
  parser.add_argument("--warmup", type=int, default=3)
  parser.add_argument("--bert_devices", type=int, default=2,
                      help="devices of a BERT pipeline")
  parser.add_argument("--bert_micro_batches", type=int, default=4,
                      help="micro-batches of a BERT step (a multiple of "
                      "--bert_devices, for interleaved 1F1B; at least "
                      "2 x --bert_devices - 1, for ZB-V)")
  parser.add_argument("--bert_micro_batch", type=int, default=4,
                      help="examples per BERT micro-batch")
  parser.add_argument("--bert_seq_length", type=int, default=64)
  parser.add_argument("--bert_vocab_size", type=int, default=1000)
  args = smoke.parse_args(parser, argv, SMOKE)
  tf.compat.v1.disable_eager_execution()
  dense_table(args)
  bert_table(args)
  return 0


if __name__ == "__main__":
  sys.exit(main())
