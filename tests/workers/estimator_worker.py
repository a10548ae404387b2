"""One worker of the multi-worker Estimator tests (started by epl-launch).

Trains tests/test_estimator.py's model with a tf.estimator.Estimator, data
parallel over this worker's devices, each worker reading its share of
every global batch (its replicas' rows, in replica order). Writes
OUT/worker_<i>.json: the files under this worker's model directory (after
train, the script also writes an event with a FileWriter of its own under
it), and with --evaluate the results of train_and_evaluate.

--model_dir may hold `{worker}` (a directory per worker: shows what each
worker writes) or not (one directory shared by the workers, as a job on
a shared file system has).
"""
import argparse
import json
import os
import sys

import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import epl  # noqa: E402
from tests import test_estimator  # noqa: E402
from tests import training  # noqa: E402


def _args():
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", required=True)
  parser.add_argument("--model_dir", required=True)
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--micro", type=int, default=8)
  parser.add_argument("--evaluate", action="store_true",
                      help="train_and_evaluate instead of train")
  return parser.parse_args()


def _sharded_input_fn(rows_per_worker):
  cluster = epl.Env.get().cluster

  def input_fn():
    x, y = training.dataset_arrays()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
        rows_per_worker).shard(cluster.worker_num, cluster.worker_index)
    return dataset.unbatch().batch(
        rows_per_worker // cluster.devices_per_worker)
  return input_fn


def _files(directory):
  return sorted(os.path.relpath(os.path.join(root, name), directory)
                for root, _, names in os.walk(directory) for name in names)


def main():
  args = _args()
  epl.init(epl.Config({"cluster.collective_timeout_seconds": 60}))
  epl.set_default_strategy(epl.replicate(device_count=1))
  cluster = epl.Env.get().cluster
  model_dir = args.model_dir.format(worker=cluster.worker_index)
  estimator = tf.estimator.Estimator(
      test_estimator.model_fn_for(training.layers_model),
      config=tf.estimator.RunConfig(model_dir=model_dir,
                                    save_summary_steps=1))
  train_input = _sharded_input_fn(args.micro * cluster.devices_per_worker)
  result = {"worker": cluster.worker_index}
  if args.evaluate:
    evaluation, _ = tf.estimator.train_and_evaluate(
        estimator, tf.estimator.TrainSpec(train_input, max_steps=args.steps),
        tf.estimator.EvalSpec(
            test_estimator.input_fn_for(test_estimator.GLOBAL_BATCH),
            steps=2, throttle_secs=0))
    result["evaluation"] = {k: float(v) for k, v in evaluation.items()}
  else:
    estimator.train(train_input, steps=args.steps)
    # A FileWriter of the script's own, as a TF1 script opens one.
    with tf.Graph().as_default():
      writer = tf.compat.v1.summary.FileWriter(
          os.path.join(model_dir, "custom"))
      writer.add_summary(tf.compat.v1.Summary(value=[
          tf.compat.v1.Summary.Value(tag="done", simple_value=1.0)]))
      writer.close()
  result["files"] = _files(model_dir) if os.path.isdir(model_dir) else []
  with open(os.path.join(args.out, "worker_%d.json" % cluster.worker_index),
            "w") as f:
    json.dump(result, f)
  print("worker %d done" % cluster.worker_index, flush=True)


if __name__ == "__main__":
  main()
