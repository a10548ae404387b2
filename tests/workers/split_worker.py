"""One worker of the multi-worker split test (started by epl-launch).

A data-parallel backbone and a split(k) dense + softmax cross-entropy head
on 2 workers x 2 logical CPU devices; writes OUT/worker_<i>.json with the
losses and, per local replica, its shard of the head and its backbone.
"""
import argparse
import json
import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import epl  # noqa: E402
from tests import training  # noqa: E402

CLASSES = 10


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", required=True)
  parser.add_argument("--split", type=int, required=True)
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--micro", type=int, default=8)
  args = parser.parse_args()
  tf.compat.v1.disable_eager_execution()
  epl.init(epl.Config({"cluster.collective_timeout_seconds": 60.0,
                       "cluster.colocate_split_and_replicate": True}))
  cluster = epl.Env.get().cluster
  worker = cluster.worker_index
  total = cluster.total_devices
  graph = tf.Graph()
  with graph.as_default():
    rng = np.random.RandomState(0)
    x = rng.normal(size=(256, training.FEATURES)).astype(np.float32)
    labels = np.argmax(x @ rng.normal(size=(training.FEATURES, CLASSES)),
                       axis=1).astype(np.int64)
    per_worker = cluster.devices_per_worker * args.micro
    dataset = tf.data.Dataset.from_tensor_slices((x, labels)).repeat().batch(
        per_worker).shard(cluster.worker_num, worker).unbatch().batch(
            args.micro)
    features, targets = tf.compat.v1.data.make_one_shot_iterator(
        dataset).get_next()
    with epl.replicate(total):
      hidden = tf.compat.v1.layers.dense(
          features, 16, activation=tf.nn.tanh, name="backbone",
          kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=1))
    with epl.split(args.split):
      logits = tf.compat.v1.layers.dense(
          hidden, CLASSES, name="head",
          kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=2),
          bias_initializer=tf.compat.v1.random_normal_initializer(seed=3))
      loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(targets, logits)
    epl.add_to_collection(loss, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)
    train_op = training.OPTIMIZERS["momentum"]().minimize(loss)
    names = [v.op.name for v in tf.compat.v1.trainable_variables()]
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      losses = [float(session.run([train_op, loss])[1])
                for _ in range(args.steps)]
      local = range(worker * cluster.devices_per_worker,
                    (worker + 1) * cluster.devices_per_worker)
      replica_names = {}
      for replica in local:
        for name in names:
          copy = name if replica == local[0] else "EPL_REPLICA_%d/%s" % (
              replica, name)
          replica_names[copy] = (replica, name)
      values = training.read_variables(session, graph, list(replica_names))
  shards = {}
  for copy, (replica, name) in replica_names.items():
    shards.setdefault(str(replica), {})[name] = values[copy].tolist()
  with open(os.path.join(args.out, "worker_%d.json" % worker), "w") as f:
    json.dump({"losses": losses, "replicas": shards}, f)
  print("worker %d done" % worker, flush=True)


if __name__ == "__main__":
  main()
