"""All-reduce of BERT-Base's gradients on 4 logical CPU devices: fused
against unfused, and 1, 2 or 4 communicators.

The gradients are BERT-Base's trainable variables' shapes (read from the
example's model, 110M floats, 440 MB per replica), held as variables on
each device, so a step is nothing but their all-reduce (mean), built the
way EPL's gradient aggregation builds it: gradient_buckets cuts the buckets
(communication.max_splits; "unfused" is one all-reduce per gradient) and
deals them round-robin to the communicators, each a CollectiveCommunicator
whose buckets run in order; a bucket is concatenated, reduced and split
back. "local sum" rows use LocalCommunicator (communication.local_cpu_reduce,
EPL's default on one host's CPUs): a sum on one device read by all. All configurations are built in one graph and timed in turn, step by
step, in one session; GB/s is the gradient bytes of one replica reduced
per second.

    python benchmarks/allreduce.py [--steps 5] [--config base]
"""
import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow.compat.v1 as tf  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from benchmarks import smoke  # noqa: E402
from epl.communicators.collective import (  # noqa: E402
    CollectiveCommunicator, CollectiveKeys)
from epl.communicators.local import LocalCommunicator  # noqa: E402
from epl.parallel.passes import gradient_buckets  # noqa: E402
from examples.bert_large import input_pipeline  # noqa: E402
from examples.bert_large import modeling  # noqa: E402

DEVICES = 4
SMOKE = ["--config", "tiny", "--steps", "1", "--configs",
         "unfused, 4 communicators;fused 5, 1 communicator;local sum, fused 5"]
# (name, communication.max_splits or None for unfused, communicators,
# communicator class)
CONFIGS = [("unfused, 1 communicator", None, 1, CollectiveCommunicator),
           ("unfused, 4 communicators", None, 4, CollectiveCommunicator),
           ("fused 5, 1 communicator", 5, 1, CollectiveCommunicator),
           ("fused 5, 2 communicators", 5, 2, CollectiveCommunicator),
           ("fused 5, 4 communicators", 5, 4, CollectiveCommunicator),
           ("fused 20, 1 communicator", 20, 1, CollectiveCommunicator),
           ("fused 20, 2 communicators", 20, 2, CollectiveCommunicator),
           ("fused 20, 4 communicators", 20, 4, CollectiveCommunicator),
           ("fused 1, 1 communicator", 1, 1, CollectiveCommunicator),
           ("local sum, unfused", None, 1, LocalCommunicator),
           ("local sum, fused 5", 5, 1, LocalCommunicator)]
# The configuration the others are compared with.
REFERENCE = "fused 5, 1 communicator"


def gradient_shapes(config_name):
  """Shapes of the trainable variables of the example's BERT model."""
  with tf.Graph().as_default():
    config = modeling.BertConfig.from_name(config_name)
    features = input_pipeline.get_next(input_pipeline.pretraining_dataset(
        "", 1, 8, 2, vocab_size=config.vocab_size, seed=1))
    modeling.build_pretraining_model(config, features, is_training=False)
    return [v.shape.as_list() for v in tf.trainable_variables()]


def gradients(shapes, devices):
  """[per device: a variable read per shape] (shared by every
  configuration)."""
  grads = []
  for device in devices:
    with tf.device(device):
      grads.append([
          tf.Variable(tf.random.normal(shape, seed=i), trainable=False)
          .read_value() for i, shape in enumerate(shapes)])
  return grads


def build(grads, max_splits, communicators, kind, keys, devices):
  """The all-reduce of one configuration: (a tensor whose fetch runs it,
  the number of all-reduces)."""
  done = []
  # Buckets of at least one element each: one all-reduce per gradient.
  max_splits = 2 ** 62 if max_splits is None else max_splits
  groups = [kind(devices, range(len(devices)), keys, 600, "CPU", group=g)
            for g in range(communicators)]
  index = {id(g): i for i, g in enumerate(grads[0])}
  transfers = gradient_buckets.plan_transfers({0: grads[0]}, max_splits,
                                              communicators)
  for transfer in transfers:
    members = [[g[index[id(t)]] for t in transfer.gradients] for g in grads]
    flats = []
    for device, parts in zip(devices, members):
      with tf.device(device):
        flats.append(tf.concat([tf.reshape(p, [-1]) for p in parts], 0))
    reduced = groups[transfer.group].all_reduce(flats, "mean")
    sizes = [t.shape.num_elements() for t in transfer.gradients]
    for device, flat in zip(devices, reduced):
      with tf.device(device):
        done.extend(tf.split(flat, sizes) if len(sizes) > 1 else [flat])
  # A data fetch: Grappler drops stateless ops that only feed a control
  # edge (the local sums), so every result's first element is fetched.
  return tf.stack([tf.reshape(t, [-1])[0] for t in done]), len(transfers)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--config", default="base")
  parser.add_argument("--configs", default="",
                      help="';'-separated names of CONFIGS to run (default: "
                      "all; 'fused 5, 1 communicator', the reference, is "
                      "always run)")
  args = smoke.parse_args(parser, argv, SMOKE)
  wanted = set(args.configs.split(";")) if args.configs else None
  configs = [c for c in CONFIGS if wanted is None or c[0] in wanted or
             c[0] == REFERENCE]
  unknown = (wanted or set()) - {c[0] for c in CONFIGS}
  if unknown:
    raise SystemExit("--configs: unknown %s" % sorted(unknown))
  tf.disable_eager_execution()
  shapes = gradient_shapes(args.config)
  floats = sum(int(np.prod(s)) for s in shapes)
  print("All-reduce (mean) of %s BERT's %d gradients, %.1fM floats (%.0f MB) "
        "per replica, over %d logical CPU devices; %d CPU cores; TensorFlow "
        "%s; median of %d timed steps after one warm-up, configurations "
        "timed in turn" % (args.config, len(shapes), floats / 1e6,
                           floats * 4 / 1e6, DEVICES, os.cpu_count(),
                           tf.__version__, args.steps), flush=True)
  devices = ["/device:CPU:%d" % i for i in range(DEVICES)]
  keys = CollectiveKeys()
  graph = tf.Graph()
  with graph.as_default():
    grads = gradients(shapes, devices)
    ops = [build(grads, splits, count, kind, keys, devices)
           for _, splits, count, kind in configs]
    session = tf.Session(config=tf.ConfigProto(
        device_count={"CPU": DEVICES}))
    session.run(tf.global_variables_initializer())
  times = [[] for _ in configs]
  for op, _ in ops:
    session.run(op)
  for _ in range(args.steps):
    for index, (op, _) in enumerate(ops):
      start = time.perf_counter()
      session.run(op)
      times[index].append(time.perf_counter() - start)
  medians = [float(np.median(t)) for t in times]
  reference = medians[[c[0] for c in configs].index(REFERENCE)]
  print("%-28s | %11s | %9s | %7s | %s" % (
      "configuration", "all-reduces", "step ms", "GB/s", "vs fused 5, 1 comm"))
  for (name, _, _, _), (_, count), median in zip(configs, ops, medians):
    print("%-28s | %11d | %9.1f | %7.2f | %.2f" % (
        name, count, 1e3 * median, floats * 4 / median / 1e9,
        reference / median))
  return 0


if __name__ == "__main__":
  sys.exit(main())
