"""Peak activation memory per pipeline stage: GPipe against 1F1B.

Trains a model of NUM_STAGES pipeline stages (each a stack of dense layers,
one logical CPU device per stage) for one warm-up step, then traces one
step for every number of micro-batches M and both schedules, and prints
each stage's peak memory from the step's allocation records (RunMetadata
step stats, per device; variables are allocated before the step and are
not counted, so the figure is activations, gradients and temporaries).

PreferForward (GPipe) runs every forward before any backward, so a stage
holds the activations of all M micro-batches; PreferBackward (1F1B) holds
at most (num_stages - stage) of them, whatever M is.

    python benchmarks/pipeline_memory.py [--micro_batches 2,4,8,16]
"""
import argparse
import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import epl  # noqa: E402
from epl.tools import timeline  # noqa: E402

import smoke  # noqa: E402  (benchmarks/, next to this script)
import stage_model  # noqa: E402

SMOKE = ["--micro_batches", "2", "--layers", "1", "--width", "16",
         "--micro_batch", "4"]

SCHEDULES = ("PreferForward", "PreferBackward")
MIB = 1024.0 * 1024.0


def measure(schedule, num_micro_batch, args):
  """{stage: peak bytes} of one traced step."""
  epl.init(epl.Config({
      "cluster.num_cpu_devices": args.num_stages,
      "pipeline.num_micro_batch": num_micro_batch,
      "pipeline.strategy": schedule}))
  logging.getLogger("epl").setLevel(logging.WARNING)
  graph = tf.Graph()
  try:
    with graph.as_default():
      train_op = stage_model.build_train_op(
          args.num_stages, args.layers, args.width, args.micro_batch,
          activation=tf.nn.relu)
      init = tf.compat.v1.global_variables_initializer()
      with tf.compat.v1.Session() as session:
        session.run(init)
        session.run(train_op)
        _, trace = timeline.trace_step(session, train_op)
        peaks = trace.peak_memory()
    return {row.stage: peaks[row.label] for row in trace.rows}
  finally:
    epl.shutdown()


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--micro_batches", default="2,4,8,16")
  parser.add_argument("--num_stages", type=int, default=2)
  parser.add_argument("--layers", type=int, default=4,
                      help="dense layers per stage")
  parser.add_argument("--width", type=int, default=512)
  parser.add_argument("--micro_batch", type=int, default=256,
                      help="examples per micro-batch")
  args = smoke.parse_args(parser, argv, SMOKE)
  counts = [int(m) for m in args.micro_batches.split(",")]
  tf.compat.v1.disable_eager_execution()
  activation = args.micro_batch * args.width * 4 / MIB
  print("Peak memory per stage (MiB) from RunMetadata allocation records")
  print("model: %d stages x %d dense layers of %d units, micro-batch %d "
        "examples (one layer output = %.2f MiB); %d logical CPU devices; "
        "TensorFlow %s" % (args.num_stages, args.layers, args.width,
                           args.micro_batch, activation, args.num_stages,
                           tf.__version__))
  results = {}
  for num_micro_batch in counts:
    for schedule in SCHEDULES:
      results[(schedule, num_micro_batch)] = measure(schedule,
                                                     num_micro_batch, args)
  stages = range(args.num_stages)
  header = ["M"] + ["%s s%d" % (name, s) for name in ("GPipe", "1F1B")
                    for s in stages] + ["GPipe/1F1B s%d" % s for s in stages]
  print(" | ".join("%14s" % h for h in header))
  for num_micro_batch in counts:
    gpipe = results[("PreferForward", num_micro_batch)]
    one_f_one_b = results[("PreferBackward", num_micro_batch)]
    cells = ["%14d" % num_micro_batch]
    cells += ["%14.2f" % (gpipe[s] / MIB) for s in stages]
    cells += ["%14.2f" % (one_f_one_b[s] / MIB) for s in stages]
    cells += ["%14.2f" % (gpipe[s] / one_f_one_b[s]) for s in stages]
    print(" | ".join(cells))
  first, last = counts[0], counts[-1]
  for schedule in SCHEDULES:
    growth = [results[(schedule, last)][s] / results[(schedule, first)][s]
              for s in stages]
    print("%s: peak at M=%d / peak at M=%d per stage: %s" % (
        schedule, last, first, ", ".join("%.2f" % g for g in growth)))
  return 0


if __name__ == "__main__":
  sys.exit(main())
