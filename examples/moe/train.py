"""A mixture-of-experts model (top-2 gating) with its experts split over the
devices (expert parallelism) or replicated (data parallelism).

The original's MoE idiom: `replicate(total)` as the default strategy, the
expert weights and the expert einsums under `epl.split(total)`. Inside the
split scope each device holds E/N experts; the tokens go to their experts
by all-to-all and come back by the inverse all-to-all. Synthetic tokens.
From the repository root (examples/moe/README.md):

    EPL_CLUSTER_NUM_CPU_DEVICES=4 python -m examples.moe.train --mode split
"""
import argparse
import logging
import time

import numpy as np
import tensorflow as tf

import epl

try:  # as a module: python -m examples.moe.train (and tests)
  from . import model as moe
except ImportError:  # as a file: python examples/moe/train.py
  import model as moe  # pylint: disable=import-error


def build(args):
  """The training step; returns (train_op, loss, tokens per step)."""
  total = epl.Env.get().cluster.total_devices
  epl.set_default_strategy(epl.replicate(total))
  rng = np.random.RandomState(0)
  inputs = rng.normal(size=(4 * args.batch_size, args.tokens,
                            args.model_dim)).astype(np.float32)
  dataset = tf.data.Dataset.from_tensor_slices(inputs).repeat().batch(
      args.batch_size, drop_remainder=True)
  x = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
  hidden = x
  for layer in range(args.layers):
    with tf.compat.v1.variable_scope("moe_%d" % layer):
      outputs, aux_loss = moe.moe_layer(
          hidden, args.experts, args.hidden, args.capacity,
          split_scope=epl.split(total) if args.mode == "split" else None)
      hidden = hidden + outputs
      tf.compat.v1.add_to_collection("aux_losses", aux_loss)
  loss = tf.reduce_mean(tf.square(hidden - x)) + 1e-2 * tf.add_n(
      tf.compat.v1.get_collection("aux_losses"))
  train_op = tf.compat.v1.train.AdamOptimizer(1e-3).minimize(loss)
  return train_op, loss, args.batch_size * args.tokens * total


def parser():
  flags = argparse.ArgumentParser(
      description=__doc__.split("\n\n")[0].replace("\n", " "))
  flags.add_argument("--mode", choices=["split", "replicated"],
                     default="split")
  flags.add_argument("--experts", type=int, default=8)
  flags.add_argument("--model_dim", type=int, default=64)
  flags.add_argument("--hidden", type=int, default=256)
  flags.add_argument("--tokens", type=int, default=64,
                     help="tokens per group (one group per example)")
  flags.add_argument("--capacity", type=int, default=20,
                     help="tokens per expert and group")
  flags.add_argument("--batch_size", type=int, default=4, help="per device")
  flags.add_argument("--layers", type=int, default=2)
  flags.add_argument("--steps", type=int, default=5)
  return flags


def main(argv=None):
  args = parser().parse_args(argv)
  logging.getLogger("epl").setLevel(logging.INFO)
  tf.compat.v1.disable_eager_execution()  # a TF1 script, as without EPL
  epl.init(epl.Config({"cluster.colocate_split_and_replicate": True}))
  train_op, loss, tokens = build(args)
  with tf.compat.v1.Session() as session:
    session.run(tf.compat.v1.global_variables_initializer())
    for step in range(args.steps):
      start = time.perf_counter()
      _, value = session.run([train_op, loss])
      print("step %d  loss %.4f  %.0f tokens/s (%s)" % (
          step, value, tokens / (time.perf_counter() - start), args.mode))


if __name__ == "__main__":
  main()
