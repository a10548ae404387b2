"""A large classification head, data parallel against split (DP + split).

Builds features [batch, feature_dim] (synthetic, as if from a backbone)
and a dense + softmax cross-entropy head of `num_classes`, trains it with
Momentum on `devices` logical CPU devices, side by side in one run:

  dp, local sums  the head data parallel (`epl.replicate`) with EPL's
                  default on one host's CPUs: each gradient bucket summed
                  on one device and read back by the others
                  (communication.local_cpu_reduce)
  dp, ring        the same with collective ring all-reduce
                  (communication.local_cpu_reduce off), as across workers
                  and on GPUs
  split           the head split over the devices (`epl.split`): each
                  holds 1/N of the classes and exchanges features, labels
                  and per-row scalars

For each it prints:

- per-device bytes of the head's weights and optimizer state (variables
  placed on device 0; split is 1/N of DP up to the last shard's padding);
- bytes device 0 sends per step, static shapes: `collective` is the
  payload of its collective ops (all-reduce, all-gather, all-to-all
  inputs, before the ring algorithm's 2(n-1)/n factor), `edges` the
  tensors it hands to ops on other devices (TensorFlow's send/recv, which
  is how local sums move gradients);
- median step time over `steps` steps after one warm-up step, run as a
  user's script runs them (EPL initialised, its hooks on);
- split against each DP row: state, bytes sent and step time as ratios,
  and whether split wins (lower is better for all three).

    PYTHONPATH=. python benchmarks/split_head.py [--num_classes 100000]
"""
import argparse
import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

import tensorflow as tf  # noqa: E402

import epl  # noqa: E402
from benchmarks import smoke  # noqa: E402
from benchmarks import timing  # noqa: E402
from benchmarks import verdict  # noqa: E402
from epl.parallel.cost import flops  # noqa: E402
from epl.ir import graph_editor  # noqa: E402
from epl.tools.timeline import device_key  # noqa: E402

_COLLECTIVES = ("CollectiveReduceV2", "CollectiveGatherV2",
                "CollectiveAllToAllV2")
# Row -> (head strategy, EPL config keys).
ROWS = (
    ("dp, local sums", "replicate", {}),
    ("dp, ring", "replicate", {"communication.local_cpu_reduce": False}),
    ("split", "split", {}),
)
SMOKE = ["--num_classes", "1000", "--feature_dim", "32", "--batch", "4",
         "--steps", "1"]


def _sent_bytes(step_ops, device):
  """(collective payload, edge bytes) that `device` sends in a step that
  runs `step_ops`."""
  collective = edges = 0
  sent = set()
  for op in step_ops:
    if not op.device:
      continue
    here = device_key(op.device)
    for tensor in op.inputs:
      source = tensor.op
      if (source.device and device_key(source.device) == device and
          here != device and (tensor.name, here) not in sent):
        sent.add((tensor.name, here))
        edges += flops.tensor_bytes(tensor)
    if here == device and op.type in _COLLECTIVES:
      collective += flops.tensor_bytes(op.inputs[0])
  return collective, edges


def measure(strategy, keys, args):
  """(state bytes, collective bytes, edge bytes, step seconds) of one
  row."""
  config = {"cluster.num_cpu_devices": args.devices,
            "cluster.colocate_split_and_replicate": True}
  config.update(keys)
  epl.init(epl.Config(config))
  logging.getLogger("epl").setLevel(logging.WARNING)
  graph = tf.Graph()
  try:
    with graph.as_default():
      features = tf.random.normal([args.batch, args.feature_dim], seed=1)
      labels = tf.random.uniform([args.batch], 0, args.num_classes,
                                 tf.int64, seed=2)
      backbone = epl.replicate(args.devices, name="backbone")
      with backbone:
        hidden = tf.identity(features)
      with epl.split(args.devices) if strategy == "split" else backbone:
        logits = tf.compat.v1.layers.dense(hidden, args.num_classes,
                                           name="head")
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels,
                                                                logits)
      train_op = tf.compat.v1.train.MomentumOptimizer(0.01, 0.9).minimize(
          loss)
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        step = timing.median_step_seconds(session, [train_op, loss],
                                          args.steps)
      device_0 = device_key("/device:CPU:0")
      state = sum(flops.variable_bytes(op) for op in graph.get_operations()
                  if op.type == "VarHandleOp" and op.device and
                  device_key(op.device) == device_0 and
                  op.name.startswith("head/"))
      collective, edges = _sent_bytes(
          graph_editor.ancestors([train_op, loss.op]), device_0)
    return state, collective, edges, step
  finally:
    epl.shutdown()


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--num_classes", type=int, default=100000)
  parser.add_argument("--feature_dim", type=int, default=2048)
  parser.add_argument("--batch", type=int, default=32,
                      help="per device")
  parser.add_argument("--devices", type=int, default=4)
  parser.add_argument("--steps", type=int, default=5)
  args = smoke.parse_args(parser, argv, SMOKE)
  tf.compat.v1.disable_eager_execution()
  print("head %d x %d, %d logical CPU devices, batch %d per device, "
        "Momentum; %d CPU cores; TensorFlow %s; median of %d steps, EPL on "
        "as in a user's script" % (
            args.feature_dim, args.num_classes, args.devices, args.batch,
            os.cpu_count(), tf.__version__, args.steps))
  results = {name: measure(strategy, keys, args)
             for name, strategy, keys in ROWS}
  print("%-15s %15s %15s %15s %10s" % (
      "run", "state/dev B", "collective B", "edges B", "step s"))
  for name, (state, collective, edges, step) in results.items():
    print("%-15s %15d %15d %15d %10.3f" % (name, state, collective, edges,
                                           step))
  split = results["split"]
  print("split against each DP run (lower is better for all three; 1/N = "
        "%.4f):" % (1.0 / args.devices))
  print("%-15s %15s %15s %15s %10s" % ("split / ...", "state", "bytes sent",
                                       "step time", "split"))
  for name in ("dp, local sums", "dp, ring"):
    dp = results[name]
    step_ratio = verdict.ratio(split[3], dp[3])
    print("%-15s %15.4f %15.4f %15.3f %10s" % (
        name, verdict.ratio(split[0], dp[0]),
        verdict.ratio(split[1] + split[2], dp[1] + dp[2]), step_ratio,
        verdict.verdict(step_ratio, higher_is_better=False)
        .replace("EPL", "split")), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
