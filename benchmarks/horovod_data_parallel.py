"""Data-parallel examples/s with Horovod: EPL's horovod backend against
Horovod alone, same model, optimizer and global batch G per step.

  EPL Horovod/Gloo 2x2    EPL (communication.backend "horovod"),
                          horovodrun -np 2, 2 logical CPU devices per
                          process: 4 replicas of G/4, reduced in each
                          process, then across with Horovod over Gloo
  EPL Horovod/Gloo 4x1    the same with 4 processes of one device each
  Horovod alone/Gloo 4x1  hand-written plain TF + hvd.DistributedOptimizer,
                          horovodrun -np 4, G/4 examples per process

Models (`model_loss`, `model_optimizer`; synthetic input): BERT of
examples/bert_large with AdamW and warm-up, `bert_tiny` (tiny config,
sequence 64) and `bert_base_2l` (BERT-Base widths, 2 layers, sequence
128); ResNets on 32x32 images with Momentum, `resnet` (small) and
`resnet18` (ResNet-18's widths and blocks); `mlp` (6 layers 1024 wide,
Adam). Every job runs on this machine over Gloo
(inside a private network namespace when `unshare -rn` works); each process
times its steps after a warm-up and rank 0 reports G / median step time.
The processes share this machine's cores: on a 2-core machine the figures
compare how each way of splitting the work costs, not a speed-up.

    python benchmarks/horovod_data_parallel.py [--models bert_tiny,resnet]
        [--global_batch 32] [--steps 10] [--smoke]

`run(model_name, global_batch, steps)` returns {row name: examples/s}.
"""
import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from benchmarks import smoke  # noqa: E402
from benchmarks import timing  # pylint: disable=wrong-import-position
from benchmarks import verdict  # pylint: disable=wrong-import-position

# name -> (launcher: "epl" or "horovod", processes, devices per process)
ROWS = {
    "EPL Horovod/Gloo 2x2": ("epl", 2, 2),
    "EPL Horovod/Gloo 4x1": ("epl", 4, 1),
    "Horovod alone/Gloo 4x1": ("horovod", 4, 1),
}
# The anchor the other rows of ROWS are compared with.
HOROVOD_ALONE = "Horovod alone/Gloo 4x1"
# --smoke: two jobs of 2 processes.
SMOKE_ROWS = {
    "EPL Horovod/Gloo 2x1": ("epl", 2, 1),
    "Horovod alone/Gloo 2x1": ("horovod", 2, 1),
}
SMOKE = ["--models", "resnet", "--global_batch", "4", "--steps", "1"]
WARMUP = 3
IMAGE, CLASSES = 32, 10


# ResNet widths: (channels per stage, residual blocks per stage).
RESNETS = {
    # A small ResNet-style net (smoke and CI).
    "resnet": ((32, 64, 64), (1, 1, 1)),
    # ResNet-18's real widths on 32x32 images (CIFAR's ResNet-18: 11M
    # weights), two blocks per stage as in ResNet-18.
    "resnet18": ((64, 128, 256, 512), (2, 2, 2, 2)),
}


def _resnet(images, labels, widths, blocks):
  """A ResNet: a stem, residual blocks of two 3x3 convolutions per stage
  (the first of each stage after the first with stride 2), pooled
  logits."""
  import tensorflow.compat.v1 as tf  # pylint: disable=import-outside-toplevel
  layers = tf.layers
  init = tf.glorot_uniform_initializer(seed=1)
  net = layers.conv2d(images, widths[0], 3, padding="same",
                      activation=tf.nn.relu, kernel_initializer=init)
  for stage, (width, count) in enumerate(zip(widths, blocks)):
    for block in range(count):
      strides = 2 if stage > 0 and block == 0 else 1
      shortcut = net if strides == 1 and net.shape[-1] == width else \
          layers.conv2d(net, width, 1, strides=strides,
                        kernel_initializer=init)
      net = layers.conv2d(net, width, 3, strides=strides, padding="same",
                          activation=tf.nn.relu, kernel_initializer=init)
      net = layers.conv2d(net, width, 3, padding="same",
                          kernel_initializer=init)
      net = tf.nn.relu(net + shortcut)
  logits = layers.dense(tf.reduce_mean(net, [1, 2]), CLASSES,
                        kernel_initializer=init)
  return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=labels, logits=logits))


MLP_WIDTH, MLP_LAYERS = 1024, 6


def _mlp_loss(batch):
  """Issue 35's data-parallel probe: 6 dense ReLU layers 1024 wide on
  synthetic 1024-wide inputs, 10 classes."""
  import tensorflow.compat.v1 as tf  # pylint: disable=import-outside-toplevel
  features = tf.random.stateless_uniform([batch, MLP_WIDTH], [1, 2])
  labels = tf.random.stateless_uniform([batch], [3, 4], maxval=CLASSES,
                                       dtype=tf.int32)
  dataset = tf.data.Dataset.from_tensors((features, labels)).repeat()
  net, labels = tf.data.make_one_shot_iterator(dataset).get_next()
  init = tf.glorot_uniform_initializer(seed=1)
  for _ in range(MLP_LAYERS):
    net = tf.layers.dense(net, MLP_WIDTH, activation=tf.nn.relu,
                          kernel_initializer=init)
  logits = tf.layers.dense(net, CLASSES, kernel_initializer=init)
  return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=labels, logits=logits))


def _resnet_loss(model, batch):
  import tensorflow.compat.v1 as tf  # pylint: disable=import-outside-toplevel
  images = tf.random.stateless_uniform([batch, IMAGE, IMAGE, 3], [1, 2])
  labels = tf.random.stateless_uniform([batch], [3, 4], maxval=CLASSES,
                                       dtype=tf.int32)
  dataset = tf.data.Dataset.from_tensors((images, labels)).repeat()
  return _resnet(*tf.data.make_one_shot_iterator(dataset).get_next(),
                 *RESNETS[model])


# BERT sizes: the example's preset and what is overridden.
BERTS = {
    "bert_tiny": dict(config="tiny"),
    # BERT-Base's real widths (hidden 768, 12 heads, feed-forward 3072,
    # its 30522-word vocabulary), 2 of its 12 layers, sequence 128.
    "bert_base_2l": dict(config="base", num_layers=2, seq_length=128),
}


def _bert_flags(model, batch):
  from examples.bert_large import train  # pylint: disable=import-outside-toplevel
  return train.resolve_flags(train.make_flags(
      batch_size=batch, parallel="none", num_cpu_devices=0,
      steps=100000, warmup_steps=10, learning_rate=1e-4, seed=1,
      **BERTS[model]))


def model_loss(model, batch, num_shards=1, shard_index=0):
  """The loss of `model` (of BERTS or RESNETS) on a batch of `batch`
  synthetic examples (shard `shard_index` of `num_shards` of the input)."""
  import tensorflow.compat.v1 as tf  # pylint: disable=import-outside-toplevel
  if model == "mlp":
    return _mlp_loss(batch)
  if model in RESNETS:
    return _resnet_loss(model, batch)
  from examples.bert_large import input_pipeline  # pylint: disable=import-outside-toplevel
  from examples.bert_large import modeling  # pylint: disable=import-outside-toplevel
  from examples.bert_large import train  # pylint: disable=import-outside-toplevel
  flags = _bert_flags(model, batch)
  config = train.bert_config_from_flags(flags)
  tf.set_random_seed(flags.seed)
  features = input_pipeline.get_next(input_pipeline.pretraining_dataset(
      "", batch, flags.seq_length, flags.max_predictions_per_seq,
      vocab_size=config.vocab_size, seed=flags.seed, num_shards=num_shards,
      shard_index=shard_index))
  return modeling.build_pretraining_model(config, features,
                                          is_training=True)["total_loss"]


def model_optimizer(model, step):
  """The optimizer `model` trains with: AdamW with BERT's warm-up,
  Momentum (ResNets) or Adam (the MLP)."""
  import tensorflow.compat.v1 as tf  # pylint: disable=import-outside-toplevel
  if model == "mlp":
    return tf.train.AdamOptimizer(1e-3)
  if model in RESNETS:
    return tf.train.MomentumOptimizer(0.01, 0.9)
  from examples.bert_large import optimization  # pylint: disable=import-outside-toplevel
  flags = _bert_flags(model, 1)
  return optimization.AdamWeightDecayOptimizer(
      learning_rate=optimization.learning_rate_schedule(
          step, flags.learning_rate, flags.steps, flags.warmup_steps),
      weight_decay_rate=flags.weight_decay)


def _build_epl(model, batch, devices):
  """EPL data parallel over Horovod (the processes come from horovodrun's
  environment); returns (train op, loss)."""
  import tensorflow.compat.v1 as tf  # pylint: disable=import-outside-toplevel
  import epl  # pylint: disable=import-outside-toplevel
  epl.init(epl.Config({"communication.backend": "horovod",
                       "cluster.num_cpu_devices": devices}))
  epl.set_default_strategy(epl.replicate(device_count=1))
  loss = model_loss(model, batch)
  step = tf.train.get_or_create_global_step()
  return model_optimizer(model, step).minimize(loss, global_step=step), loss


def _build_horovod(model, batch, hvd):
  """Plain TF with hvd.DistributedOptimizer; returns (train op, loss)."""
  import tensorflow.compat.v1 as tf  # pylint: disable=import-outside-toplevel
  step = tf.train.get_or_create_global_step()
  loss = model_loss(model, batch, hvd.size(), hvd.rank())
  return hvd.DistributedOptimizer(model_optimizer(model, step)).minimize(
      loss, global_step=step), loss


def worker(args):
  """One process of a job: builds, warms up, times; rank 0 writes
  examples/s to args.out."""
  import tensorflow.compat.v1 as tf  # pylint: disable=import-outside-toplevel
  import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
  tf.disable_eager_execution()
  hvd.init()
  processes, devices = hvd.size(), args.devices
  batch = args.global_batch // (processes * devices)
  graph = tf.Graph()
  with graph.as_default():
    if args.worker == "epl":
      train_op, loss = _build_epl(args.model, batch, devices)
      broadcast = None
    else:
      train_op, loss = _build_horovod(args.model, batch, hvd)
      broadcast = hvd.broadcast_global_variables(0)
    init = tf.global_variables_initializer()
    config = tf.ConfigProto(device_count={"CPU": devices},
                            allow_soft_placement=True)
    with tf.Session(config=config) as session:
      session.run(init)
      if broadcast is not None:
        session.run(broadcast)
      # timing.step_seconds runs one more warm-up step.
      for _ in range(WARMUP - 1):
        session.run([train_op, loss])
      times = timing.step_seconds(session, [train_op, loss], args.steps)
  if hvd.rank() == 0:
    with open(args.out, "w") as f:
      json.dump({"examples_per_s": args.global_batch /
                 statistics.median(times), "step_s": times}, f)


def isolated(command, own_pids=False):
  """`command` in a private network namespace when one can be made; with
  `own_pids` also in a private PID namespace, so that stopping the command
  (a timeout) ends every process it started."""
  pids = ["--pid", "--fork", "--kill-child"] if own_pids else []
  if shutil.which("unshare") and shutil.which("ip") and subprocess.run(
      ["unshare", "-rn"] + pids + ["true"], capture_output=True, check=False
  ).returncode == 0:
    return ["unshare", "-rn"] + pids + [
        "sh", "-c", 'ip link set lo up && exec "$0" "$@"'] + command
  return command


def _job(model, row, global_batch, steps, rows):
  kind, processes, devices = rows[row]
  with tempfile.TemporaryDirectory() as directory:
    out = os.path.join(directory, "result.json")
    command = [sys.executable, "-m", "horovod.runner.launch", "-np",
               str(processes), "-H", "localhost:%d" % processes, "--gloo",
               sys.executable, os.path.abspath(__file__), "--worker", kind,
               "--model", model, "--global_batch", str(global_batch),
               "--steps", str(steps), "--devices", str(devices), "--out", out]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=ROOT, EPL_COMMUNICATION_BACKEND="horovod")
    finished = subprocess.run(isolated(command), env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=1200,
                              check=False)
    if finished.returncode != 0 or not os.path.exists(out):
      raise RuntimeError("%s / %s failed:\n%s" % (
          model, row, (finished.stdout + finished.stderr)[-4000:]))
    with open(out) as f:
      return json.load(f)["examples_per_s"]


def run(model_name, global_batch, steps, rows=None):
  """{row name: examples/s} of every row of `rows` (default ROWS) for
  `model_name`."""
  rows = rows or ROWS
  return {row: _job(model_name, row, global_batch, steps, rows)
          for row in rows}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--models", default="bert_tiny,resnet")
  parser.add_argument("--global_batch", type=int, default=32)
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--worker", choices=("epl", "horovod"), default=None,
                      help=argparse.SUPPRESS)
  parser.add_argument("--model", default=None, help=argparse.SUPPRESS)
  parser.add_argument("--devices", type=int, default=1,
                      help=argparse.SUPPRESS)
  parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
  args = smoke.parse_args(parser, argv, SMOKE)
  if args.worker:
    worker(args)
    return 0
  if importlib.util.find_spec("horovod") is None:
    raise SystemExit(
        "horovod_data_parallel.py needs Horovod: `make horovod` builds it "
        "into .venv (TensorFlow 2.15; Horovod 0.28.1 does not build against "
        "later TensorFlow).")
  rows = SMOKE_ROWS if args.smoke else ROWS
  print("global batch %d, %d timed steps after %d warm-up, Gloo on this "
        "machine (%d cores); EPL rows run as a user's script runs them (EPL "
        "on, its hooks at every Session.run)" % (
            args.global_batch, args.steps, WARMUP, os.cpu_count()))
  print("%-10s %-24s %12s %10s %10s" % ("model", "run", "examples/s",
                                        "vs Horovod", ""))
  for model in args.models.split(","):
    figures = run(model, args.global_batch, args.steps, rows)
    reference = next(figures[row] for row, (kind, _, _) in rows.items()
                     if kind == "horovod")
    for row, value in figures.items():
      ratio = value / reference
      print("%-10s %-24s %12.1f %9.2fx %10s" % (
          model, row, value, ratio,
          verdict.verdict(ratio) if row.startswith("EPL") else ""),
            flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
