"""One process of the Horovod tests (started by horovodrun).

Runs every case named by --cases in turn, each with a fresh epl.init
(communication.backend "horovod") and graph, on this process's share of
each global batch of 32 rows, and writes OUT/rank_<r>.json: per case the
trained variables, losses and merged fetches. Processes other than rank 0
initialise with another graph seed, so equal results also show the
initial broadcast from rank 0.
"""
import argparse
import json
import os
import sys

import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import epl  # noqa: E402
from tests import training  # noqa: E402

GLOBAL_BATCH = 32
STEPS = 5
VOCAB = 6


def embedding_model(x):
  """A model whose table gets a sparse (IndexedSlices) gradient."""
  ids = tf.cast(tf.abs(x[:, :3]) * 4.0, tf.int32) % VOCAB
  table = tf.compat.v1.get_variable(
      "table", [VOCAB, 4],
      initializer=tf.compat.v1.random_normal_initializer(stddev=0.5, seed=5))
  looked_up = tf.reduce_sum(tf.nn.embedding_lookup(table, ids), 1)
  return training.layers_model(tf.concat([x, looked_up], 1))


MODELS = {
    "dense": training.layers_model,
    "sparse": embedding_model,
    "pipeline": training.staged_model(),
}

# name -> (model, optimizer, extra config)
CASES = {
    "dense_momentum": ("dense", "momentum", {}),
    "dense_adam": ("dense", "adam", {}),
    "sparse_momentum": ("sparse", "momentum", {}),
    "sparse_adam": ("sparse", "adam", {}),
    # float16 of gradients x 1e6 overflows: the buckets go again as float32.
    "fp16_overflow": ("dense", "momentum", {"communication.fp16": True,
                                            "communication.fp16_scale": 1e6}),
    "pipeline": ("pipeline", "momentum", {"pipeline.num_micro_batch": 2}),
    # ZeRO: gradients reduced to their owners, across processes too.
    "zero_v1": ("dense", "adam", {"zero.level": "v1"}),
    # ZeRO v2: each micro-batch's gradients summed on their owners.
    "zero_v2": ("dense", "adam", {"zero.level": "v2",
                                  "pipeline.num_micro_batch": 2}),
    # ZeRO v3: weights sharded in each process; each shard's gradient
    # all-reduced with the same shard of the other process.
    "zero_v3": ("dense", "adam", {"zero.level": "v3",
                                  "zero.min_partition_size": 0,
                                  "pipeline.num_micro_batch": 2}),
}


def _input(rank, size, rows_per_process, micro):
  """This process's rows of each global batch, `micro` rows at a time."""
  x, y = training.dataset_arrays()
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
      rows_per_process).shard(size, rank).unbatch().batch(micro)
  return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()


def run_case(name, out):
  model_name, optimizer, extra = CASES[name]
  config = {"communication.backend": "horovod"}
  config.update(extra)
  epl.init(epl.Config(config))
  cluster = epl.Env.get().cluster
  rank, size = cluster.worker_index, cluster.worker_num
  pipeline = model_name == "pipeline"
  if not pipeline:
    epl.set_default_strategy(epl.replicate(device_count=1))
  micro_batches = config.get("pipeline.num_micro_batch", 1)
  replicas = cluster.total_devices // (2 if pipeline else 1)
  micro = GLOBAL_BATCH // replicas // micro_batches
  graph = tf.Graph()
  with graph.as_default():
    if rank:
      tf.compat.v1.set_random_seed(1000 + rank)
    features, labels = _input(rank, size, GLOBAL_BATCH // size, micro)
    loss = tf.reduce_mean(tf.square(MODELS[model_name](features) - labels))
    step = tf.compat.v1.train.get_or_create_global_step()
    train_op = training.OPTIMIZERS[optimizer]().minimize(loss,
                                                          global_step=step)
    merged_loss = tf.identity(loss)
    epl.add_to_collection(merged_loss, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)
    seen = tf.reshape(labels, [-1])
    epl.add_to_collection(seen, epl.GraphKeys.GLOBAL_CONCAT_OBJECTS)
    saver = tf.compat.v1.train.Saver()
    names = [v.op.name for v in tf.compat.v1.trainable_variables()]
    result = {"merged_losses": [], "labels": []}
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(STEPS):
        _, value, labels_seen = session.run([train_op, merged_loss, seen])
        result["merged_losses"].append(float(value))
        result["labels"].append(labels_seen.tolist())
      if name == "dense_momentum":
        # Every process saves into its own directory: only rank 0 writes.
        directory = os.path.join(out, "ckpt_%d" % rank)
        os.makedirs(directory)
        result["checkpoint"] = saver.save(
            session, os.path.join(directory, "model"), global_step=step)
      result["variables"] = {
          k: v.tolist() for k, v in training.read_variables(
              session, graph, names).items()}
      result["global_step"] = int(session.run(step))
      result["devices"] = sorted({op.device for op in graph.get_operations()
                                  if op.device})
  return result


def read_sliced_files(files):
  """The records this process reads of TFRecordDataset(files) with
  io.slicing."""
  epl.init(epl.Config({"communication.backend": "horovod",
                       "io.slicing": True}))
  epl.set_default_strategy(epl.replicate(device_count=1))
  graph = tf.Graph()
  with graph.as_default():
    dataset = tf.data.TFRecordDataset(files)
    record = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    records = []
    with tf.compat.v1.Session() as session:
      try:
        while True:
          records.append(session.run(record).decode())
      except tf.errors.OutOfRangeError:
        pass
  return records


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", required=True)
  parser.add_argument("--cases", default=",".join(CASES))
  parser.add_argument("--files", default="",
                      help="comma-separated TFRecord files to read with "
                           "io.slicing")
  args = parser.parse_args()
  tf.compat.v1.disable_eager_execution()
  results = {}
  for name in [c for c in args.cases.split(",") if c]:
    results[name] = run_case(name, args.out)
  if args.files:
    results["sliced_records"] = read_sliced_files(args.files.split(","))
  rank = epl.Env.get().cluster.worker_index
  with open(os.path.join(args.out, "rank_%d.json" % rank), "w") as f:
    json.dump(results, f)
  print("rank %d done" % rank, flush=True)


if __name__ == "__main__":
  main()
