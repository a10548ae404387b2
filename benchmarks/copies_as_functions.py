"""What a replica or micro-batch that is a function call, not a copy of
every op, would save at start-up: measured on plain TensorFlow, before
choosing a design for EPL's copies.

Plain TF (no EPL), BERT forward + backward (examples/bert_large, dropout
off, one set of variables, plain SGD), on R logical CPU devices x M
micro-batches, the gradients of all copies summed into one update:
  plain     - one copy on one device (the baseline);
  ops       - R x M copies of every op, as EPL makes them today;
  function  - the forward + backward pass built once as a tf.function
              (`_noinline`), called R x M - 1 times, once per copy on its
              device (the first copy stays ops, as EPL keeps the user's).
Each row runs in a fresh process: graph build, first step (TF's placement,
grappler, partitioning, function instantiation and one step), second
step, CPU time, op count, peak RSS. A lower bound for the function design
in EPL: no per-replica variables, optimizer state or all-reduce, which EPL
would add per copy.

    python benchmarks/copies_as_functions.py
    python benchmarks/copies_as_functions.py --layouts 8x4 --config base
"""
import argparse
import os
import resource
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from benchmarks import fresh_process  # pylint: disable=wrong-import-position
from benchmarks import smoke  # pylint: disable=wrong-import-position

SMOKE = ["--layouts", "2x1", "--seq_length", "8", "--in_process"]


def measure(config_name, mode, replicas, micro_batches, batch_size,
            seq_length):
  """One run in this process; returns a dict of seconds, ops and RSS."""
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  from examples.bert_large import input_pipeline  # pylint: disable=g-import-not-at-top
  from examples.bert_large import modeling  # pylint: disable=g-import-not-at-top
  tf.disable_eager_execution()
  config = modeling.BertConfig.from_name(config_name)
  cpu_start, start = time.process_time(), time.perf_counter()
  graph = tf.Graph()
  with graph.as_default():
    tf.set_random_seed(1)
    dataset = input_pipeline.pretraining_dataset(
        None, batch_size, seq_length, 20, vocab_size=config.vocab_size,
        seed=1)
    iterator = tf.data.make_one_shot_iterator(dataset)

    def loss_of(features):
      with tf.variable_scope("", reuse=tf.AUTO_REUSE):
        return modeling.build_pretraining_model(
            config, features, is_training=False)["total_loss"]

    with tf.device("/device:CPU:0"):
      features = iterator.get_next()
      loss = loss_of(features)
    variables = tf.trainable_variables()
    total = tf.gradients(loss, variables)
    keys = sorted(features)

    @tf.function(autograph=False, experimental_attributes={"_noinline": True})
    def forward_backward(*inputs):
      copy_loss = loss_of(dict(zip(keys, inputs)))
      return tf.gradients(copy_loss, variables)

    for replica in range(replicas):
      for micro_batch in range(micro_batches):
        if replica == 0 and micro_batch == 0:
          continue
        with tf.device("/device:CPU:%d" % replica):
          copy_features = iterator.get_next()
          if mode == "function":
            grads = forward_backward(*[copy_features[k] for k in keys])
          else:
            grads = tf.gradients(loss_of(copy_features), variables)
        total = [a + b for a, b in zip(total, grads)]
    train_op = tf.train.GradientDescentOptimizer(1e-4).apply_gradients(
        zip(total, variables))
    init = tf.global_variables_initializer()
    result = {"build": time.perf_counter() - start,
              "ops": len(graph.get_operations())}
    session_config = tf.ConfigProto(device_count={"CPU": replicas})
    with tf.Session(config=session_config) as sess:
      sess.run(init)
      steps = []
      for _ in range(2):
        begin = time.perf_counter()
        sess.run(train_op)
        steps.append(time.perf_counter() - begin)
  result["first_step"], result["step"] = steps
  result["total"] = time.perf_counter() - start
  result["cpu"] = time.process_time() - cpu_start
  result["peak_rss_mib"] = resource.getrusage(
      resource.RUSAGE_SELF).ru_maxrss / 1024.0
  return result


def _child(args, mode, replicas, micro_batches):
  return fresh_process.measure_in_child(
      os.path.abspath(__file__),
      [args.config, mode, replicas, micro_batches, args.batch_size,
       args.seq_length], args.timeout,
      in_process=measure if args.in_process else None)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="tiny")
  parser.add_argument("--layouts", default="4x4,8x4",
                      help="RxM items: R devices x M micro-batches")
  parser.add_argument("--batch_size", type=int, default=2)
  parser.add_argument("--seq_length", type=int, default=128)
  parser.add_argument("--timeout", type=int, default=1800)
  parser.add_argument("--in_process", action="store_true",
                      help="every row in this process (peak RSS is then "
                      "the largest so far)")
  parser.add_argument("--child", help=argparse.SUPPRESS)
  args = smoke.parse_args(parser, argv, SMOKE)
  if args.child:
    fresh_process.answer_child(args.child, measure)
    return 0
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  print("Copies as ops vs as function calls, plain TensorFlow %s, BERT %s "
        "forward + backward, micro-batch %d x %d tokens, %d CPU cores; "
        "each row %s; seconds." % (
            tf.__version__, args.config, args.batch_size, args.seq_length,
            os.cpu_count(), "in this process (--in_process)"
            if args.in_process else "a fresh process"))
  print("%-16s %8s %11s %8s %9s %8s %8s %8s" % (
      "run", "build", "first step", "step", "total", "CPU s", "ops",
      "RSS MiB"))

  def row(label, result):
    print("%-16s %8.1f %11.1f %8.2f %9.1f %8.1f %8d %8.0f" % (
        label, result["build"], result["first_step"], result["step"],
        result["total"], result["cpu"], result["ops"],
        result["peak_rss_mib"]), flush=True)

  plain = _child(args, "ops", 1, 1)
  row("plain 1x1", plain)
  for layout in args.layouts.split(","):
    replicas, micro_batches = (int(x) for x in layout.split("x"))
    results = {mode: _child(args, mode, replicas, micro_batches)
               for mode in ("ops", "function")}
    for mode, result in results.items():
      row("%s %s" % (mode, layout), result)
    ops, function = results["ops"], results["function"]
    print("  %s: total vs plain: ops %.2fx, function %.2fx; first step "
          "vs plain: ops %.1fx, function %.1fx; function vs ops: total "
          "%.2fx, step %.2fx, ops %.2fx" % (
              layout, ops["total"] / plain["total"],
              function["total"] / plain["total"],
              ops["first_step"] / plain["first_step"],
              function["first_step"] / plain["first_step"],
              function["total"] / ops["total"],
              function["step"] / ops["step"],
              function["ops"] / ops["ops"]), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
