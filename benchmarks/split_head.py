"""A large classification head, data parallel against split (DP + split).

Builds features [batch, feature_dim] (synthetic, as if from a backbone)
and a dense + softmax cross-entropy head of `num_classes`, trains it with
Momentum on `devices` logical CPU devices, once with the head data
parallel (`epl.replicate`) and once split (`epl.split`), side by side in
one run, and prints for each:

- per-device bytes of the head's weights and optimizer state (from the
  variables placed on device 0; split must be exactly 1/N of DP up to the
  padding of the last shard);
- bytes each device sends into collectives per step (from the collective
  ops of device 0 and their static shapes: all-reduce counts its input,
  all-gather and all-to-all their input, i.e. the payload before the ring
  algorithm's 2(n-1)/n factor);
- median step time over `steps` steps after one warm-up step.

    PYTHONPATH=. python benchmarks/split_head.py [--num_classes 100000]
"""
import argparse
import logging
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import epl  # noqa: E402

import timing  # noqa: E402  (benchmarks/, next to this script)

_COLLECTIVES = ("CollectiveReduceV2", "CollectiveGatherV2",
                "CollectiveAllToAllV2")


def _bytes(tensor):
  return tensor.shape.num_elements() * tensor.dtype.size


def _variable_bytes(variable):
  shape = [d.size for d in variable.get_attr("shape").dim]
  return int(np.prod(shape)) * tf.as_dtype(variable.get_attr("dtype")).size


def measure(mode, args):
  epl.init(epl.Config({"cluster.num_cpu_devices": args.devices,
                       "cluster.colocate_split_and_replicate": True}))
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
      with epl.split(args.devices) if mode == "split" else backbone:
        logits = tf.compat.v1.layers.dense(hidden, args.num_classes,
                                           name="head")
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels,
                                                                logits)
      train_op = tf.compat.v1.train.MomentumOptimizer(0.01, 0.9).minimize(
          loss)
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        step = timing.median_step_seconds(session, train_op, args.steps)
      on_device_0 = [op for op in graph.get_operations()
                     if op.device.endswith("CPU:0")]
      state = sum(_variable_bytes(op) for op in on_device_0
                  if op.type == "VarHandleOp" and op.name.startswith("head/"))
      sent = sum(_bytes(op.inputs[0]) for op in on_device_0
                 if op.type in _COLLECTIVES and
                 op.inputs[0].shape.num_elements())
    return state, sent, step
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
  args = parser.parse_args(argv)
  print("head %d x %d, %d logical CPU devices, batch %d per device, "
        "Momentum" % (args.feature_dim, args.num_classes, args.devices,
                      args.batch))
  results = {mode: measure(mode, args) for mode in ("dp", "split")}
  print("%-6s %26s %26s %14s" % ("mode", "head weights+slots/device",
                                 "collective bytes/step/dev", "step (s)"))
  for mode, (state, sent, step) in results.items():
    print("%-6s %26d %26d %14.3f" % (mode, state, sent, step))
  dp, split = results["dp"], results["split"]
  print("split / dp: state %.4f (1/N = %.4f), bytes sent %.4f, step time "
        "%.3f" % (split[0] / dp[0], 1.0 / args.devices, split[1] / dp[1],
                  split[2] / dp[2]))


if __name__ == "__main__":
  main()
