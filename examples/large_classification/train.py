"""Large-scale classification: a small ResNet-style backbone, data parallel,
and a huge softmax head, data parallel or split over the devices.

The EPL idiom of the original (FastNN resnet_split.py): the backbone under
`epl.replicate(total)`, the head under `epl.split(total)`, with
`cluster.colocate_split_and_replicate`. With `--mode split` every device
holds 1/N of the head's kernel and optimizer state, the features are
all-gathered (the logits never are) and the softmax cross-entropy is
computed across the shards; with `--mode dp` the head is replicated and its
gradient all-reduced. Synthetic images, so it runs anywhere. From the
repository root (examples/large_classification/README.md):

    EPL_CLUSTER_NUM_CPU_DEVICES=4 python -m examples.large_classification.train \
        --mode split --num_classes 100000 --steps 5
"""
import argparse
import logging
import time

import numpy as np
import tensorflow as tf

import epl


def residual_block(x, filters, stride, name):
  with tf.compat.v1.variable_scope(name):
    shortcut = x
    if stride != 1 or x.shape[-1] != filters:
      shortcut = tf.compat.v1.layers.conv2d(x, filters, 1, stride,
                                            name="shortcut")
    y = tf.compat.v1.layers.conv2d(x, filters, 3, stride, padding="same",
                                   activation=tf.nn.relu, name="conv1")
    y = tf.compat.v1.layers.conv2d(y, filters, 3, 1, padding="same",
                                   name="conv2")
    return tf.nn.relu(y + shortcut)


def backbone(images, feature_dim):
  x = tf.compat.v1.layers.conv2d(images, 16, 3, padding="same",
                                 activation=tf.nn.relu, name="stem")
  for index, (filters, stride) in enumerate([(16, 1), (32, 2), (64, 2)]):
    x = residual_block(x, filters, stride, "block_%d" % index)
  pooled = tf.reduce_mean(x, axis=[1, 2])
  return tf.compat.v1.layers.dense(pooled, feature_dim, activation=tf.nn.relu,
                                   name="features")


def synthetic_batch(batch_size, num_classes, image_size):
  rng = np.random.RandomState(0)
  images = rng.normal(size=(4 * batch_size, image_size, image_size, 3))
  labels = rng.randint(0, num_classes, 4 * batch_size)
  dataset = tf.data.Dataset.from_tensor_slices(
      (images.astype(np.float32), labels.astype(np.int64))).repeat().batch(
          batch_size, drop_remainder=True)
  return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()


def main(argv=None):
  parser = argparse.ArgumentParser(
      description=__doc__.split("\n\n")[0].replace("\n", " "))
  parser.add_argument("--mode", choices=["dp", "split"], default="split")
  parser.add_argument("--num_classes", type=int, default=100000)
  parser.add_argument("--feature_dim", type=int, default=2048)
  parser.add_argument("--batch_size", type=int, default=8,
                      help="per device")
  parser.add_argument("--image_size", type=int, default=32)
  parser.add_argument("--steps", type=int, default=5)
  args = parser.parse_args(argv)
  logging.getLogger("epl").setLevel(logging.INFO)
  tf.compat.v1.disable_eager_execution()  # a TF1 script, as without EPL

  epl.init(epl.Config({"cluster.colocate_split_and_replicate": True}))
  total = epl.Env.get().cluster.total_devices
  images, labels = synthetic_batch(args.batch_size, args.num_classes,
                                   args.image_size)
  replicated = epl.replicate(total, name="backbone")
  with replicated:
    features = backbone(images, args.feature_dim)
  with epl.split(total) if args.mode == "split" else replicated:
    logits = tf.compat.v1.layers.dense(features, args.num_classes,
                                       name="head")
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    accuracy = tf.reduce_mean(tf.cast(tf.equal(
        tf.argmax(logits, axis=1), labels), tf.float32))
  epl.add_to_collection(loss, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)
  epl.add_to_collection(accuracy, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)
  global_step = tf.compat.v1.train.get_or_create_global_step()
  train_op = tf.compat.v1.train.AdamOptimizer(1e-3).minimize(
      loss, global_step=global_step)
  hooks = [tf.compat.v1.train.StopAtStepHook(last_step=args.steps)]
  with tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks) as session:
    while not session.should_stop():
      start = time.perf_counter()
      _, step, value, correct = session.run([train_op, global_step, loss,
                                             accuracy])
      # The first step includes the graph's optimisation; compare the
      # later ones between --mode split and dp.
      print("step %d  loss %.4f  accuracy %.4f  %.2f s/step  (%s, %d "
            "devices)" % (step, value, correct, time.perf_counter() - start,
                          args.mode, total))


if __name__ == "__main__":
  main()
