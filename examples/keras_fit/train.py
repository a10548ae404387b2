"""A Keras classifier trained with `model.fit` under EPL, data parallel or
as a 2-stage pipeline with 4 micro-batches.

`--mode dp` is a TF2 script (eager execution on): EPL divides each batch
of `fit` over every device. `--mode pipeline` is a TF1-style script
(eager execution off, as such a script sets it without EPL, with a
legacy Keras optimizer): the model's layers are called inside two
`epl.replicate` stage scopes, EPL runs them as a pipeline, each step's
batch cut into micro-batches, with one pipeline per pair of devices.
`--graph` runs the data-parallel script in graph mode too. Synthetic
data. From the repository root (examples/keras_fit/README.md):

    EPL_CLUSTER_NUM_CPU_DEVICES=4 python -m examples.keras_fit.train --mode dp
"""
import argparse
import contextlib
import time

import numpy as np
import tensorflow as tf

import epl


def parser():
  flags = argparse.ArgumentParser(
      description=__doc__.split("\n\n")[0].replace("\n", " "))
  flags.add_argument("--mode", choices=["dp", "pipeline"], default="dp")
  flags.add_argument("--graph", action="store_true",
                     help="--mode dp in graph mode (TF1 style); --mode "
                          "pipeline always is")
  flags.add_argument("--micro_batches", type=int, default=4)
  flags.add_argument("--batch_size", type=int, default=256,
                     help="the global batch of each step")
  flags.add_argument("--steps_per_epoch", type=int, default=20)
  flags.add_argument("--epochs", type=int, default=3)
  flags.add_argument("--features", type=int, default=64)
  flags.add_argument("--hidden", type=int, default=512)
  flags.add_argument("--classes", type=int, default=10)
  return flags


def synthetic_data(args):
  """Features and the class a fixed random linear map gives them."""
  rng = np.random.RandomState(0)
  rows = args.batch_size * args.steps_per_epoch
  features = rng.normal(size=(rows, args.features)).astype(np.float32)
  labels = np.argmax(features @ rng.normal(size=(args.features,
                                                 args.classes)), axis=1)
  return features, labels.astype(np.int64)


def build_model(args, stages):
  """A 4-layer MLP whose first two layers are called in `stages[0]` and
  the others in `stages[1]`."""
  dense = tf.keras.layers.Dense
  inputs = tf.keras.Input((args.features,))
  with stages[0]:
    hidden = dense(args.hidden, activation="relu")(inputs)
    hidden = dense(args.hidden, activation="relu")(hidden)
  with stages[1]:
    hidden = dense(args.hidden, activation="relu")(hidden)
    logits = dense(args.classes)(hidden)
  return tf.keras.Model(inputs, logits)


def main(argv=None):
  args = parser().parse_args(argv)
  graph_mode = args.graph or args.mode == "pipeline"
  if graph_mode:
    tf.compat.v1.disable_eager_execution()  # a TF1 script, as without EPL
  if args.mode == "pipeline":
    epl.init(epl.Config({"pipeline.num_micro_batch": args.micro_batches}))
    stages = [epl.replicate(1, name="stage_0"),
              epl.replicate(1, name="stage_1")]
  else:
    epl.init()                                               # EPL
    epl.set_default_strategy(epl.replicate(device_count=1))  # EPL
    stages = [contextlib.nullcontext()] * 2
  model = build_model(args, stages)
  # Graph mode takes the legacy Keras optimizers, with or without EPL.
  optimizer = (tf.keras.optimizers.legacy.Adam(1e-3) if graph_mode
               else tf.keras.optimizers.Adam(1e-3))
  model.compile(optimizer=optimizer, loss=tf.keras.losses.
                SparseCategoricalCrossentropy(from_logits=True))
  features, labels = synthetic_data(args)
  start = time.perf_counter()
  history = model.fit(features, labels, batch_size=args.batch_size,
                      epochs=args.epochs, verbose=0)
  seconds = time.perf_counter() - start
  for epoch, loss in enumerate(history.history["loss"]):
    print("epoch %d  loss %.4f" % (epoch, loss))
  print("%s (%s mode): %d steps in %.1f s, %.1f steps/s" % (
      args.mode, "graph" if graph_mode else "eager",
      args.epochs * args.steps_per_epoch, seconds,
      args.epochs * args.steps_per_epoch / seconds))


if __name__ == "__main__":
  main()
