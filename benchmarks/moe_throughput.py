"""MoE tokens per second: experts split over the devices (expert
parallelism, all-to-all) against experts replicated (data parallelism,
all-reduce of the expert gradients), side by side in one run.

Uses the model of examples/moe/train.py (top-2 gating, E experts per
layer) on `cluster.num_cpu_devices` logical CPU devices; prints the
tokens/s of the median of `--steps` steps after one warm-up step, and the
expert weights each device holds.

    PYTHONPATH=. python benchmarks/moe_throughput.py [--experts 8]
"""
import logging
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import epl  # noqa: E402
from examples.moe import train as moe_train  # noqa: E402

import smoke  # noqa: E402  (benchmarks/, next to this script)
import timing  # noqa: E402

SMOKE = ["--experts", "4", "--model_dim", "8", "--hidden", "16", "--tokens",
         "8", "--capacity", "4", "--batch_size", "1", "--layers", "1",
         "--steps", "1"]

DEVICES = 4


def measure(mode, args):
  args.mode = mode
  epl.init(epl.Config({"cluster.num_cpu_devices": DEVICES,
                       "cluster.colocate_split_and_replicate": True}))
  logging.getLogger("epl").setLevel(logging.WARNING)
  try:
    with tf.Graph().as_default() as graph:
      train_op, _, tokens = moe_train.build(args)
      with tf.compat.v1.Session(graph=graph) as session:
        session.run(tf.compat.v1.global_variables_initializer())
        seconds = timing.median_step_seconds(session, train_op, args.steps)
      # Devices are set by the rewrite, at the first run.
      expert_bytes = sum(
          v.shape.num_elements() * 4 for v in tf.compat.v1.global_variables()
          if "/experts/" in v.name and v.device.endswith("CPU:0"))
    return tokens / seconds, expert_bytes
  finally:
    epl.shutdown()


def main(argv=None):
  args = smoke.parse_args(moe_train.parser(), argv, SMOKE)
  print("MoE: %d layers, %d experts, model %d, hidden %d, %d tokens x %d "
        "groups per device, capacity %d, %d logical CPU devices" % (
            args.layers, args.experts, args.model_dim, args.hidden,
            args.tokens, args.batch_size, args.capacity, DEVICES))
  results = {mode: measure(mode, args) for mode in ("replicated", "split")}
  for mode, (rate, expert_bytes) in results.items():
    print("%-10s %10.0f tokens/s   expert weights on device 0: %d bytes" % (
        mode, rate, expert_bytes))
  print("split / replicated: tokens/s %.3f, expert bytes %.3f" % (
      results["split"][0] / results["replicated"][0],
      results["split"][1] / results["replicated"][1]))


if __name__ == "__main__":
  main()
