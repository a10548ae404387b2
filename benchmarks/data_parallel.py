"""Data-parallel examples/s on 4 logical CPU devices: EPL against plain
TensorFlow, MirroredStrategy and Horovod, same model, optimizer and global
batch G per step.

  TF 1 device        plain TensorFlow, one batch of G on one device
  TF Mirrored        tf.distribute.MirroredStrategy over 4 logical CPU
                     devices in graph mode (call_for_each_replica, G/4 per
                     replica)
  EPL collective     EPL data parallel, 4 replicas of G/4 in one process
                     (the default communication settings)
  EPL horovod 2x2    EPL with communication.backend "horovod", horovodrun
                     -np 2 x 2 logical devices per process
  EPL horovod 4x1    the same with 4 processes of one device
  Horovod alone 4x1  plain TF + hvd.DistributedOptimizer, -np 4

Models (benchmarks/horovod_data_parallel.py builds them): `bert_tiny`
(examples/bert_large, tiny config, AdamW with warm-up, sequence length 64)
and `resnet` (a small ResNet-style conv net on 32x32 images, Momentum).
Every row runs in its own process, one after the other, and times its
steps after a warm-up: examples/s = G / median step time. The 4 logical
devices (and the Horovod processes) share this machine's cores: on a
2-core machine the rows compare what each way of splitting the work costs,
not a speed-up over one device. The horovod rows need Horovod (`make
horovod`); without it they are left out and the output says so.

    python benchmarks/data_parallel.py [--models bert_tiny,resnet]
        [--global_batch 32] [--steps 10]
"""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from benchmarks import horovod_data_parallel  # pylint: disable=wrong-import-position
from benchmarks import timing  # pylint: disable=wrong-import-position

DEVICES = 4
WARMUP = 3
LOCAL_ROWS = ("TF 1 device", "TF Mirrored", "EPL collective")


def _build(row, model, global_batch):
  """(train op, loss) of `row` in the default graph."""
  import tensorflow.compat.v1 as tf  # pylint: disable=import-outside-toplevel
  loss_of = horovod_data_parallel.model_loss
  optimizer_of = horovod_data_parallel.model_optimizer
  if row == "TF 1 device":
    step = tf.train.get_or_create_global_step()
    loss = loss_of(model, global_batch)
    return optimizer_of(model, step).minimize(loss, global_step=step), loss
  if row == "EPL collective":
    import epl  # pylint: disable=import-outside-toplevel
    epl.init(epl.Config({"cluster.num_cpu_devices": DEVICES}))
    epl.set_default_strategy(epl.replicate(device_count=1))
    step = tf.train.get_or_create_global_step()
    loss = loss_of(model, global_batch // DEVICES)
    return optimizer_of(model, step).minimize(loss, global_step=step), loss
  strategy = tf.distribute.MirroredStrategy(
      devices=["/device:CPU:%d" % i for i in range(DEVICES)])
  with strategy.scope():
    step = tf.train.get_or_create_global_step()

    # Each replica reads an input pipeline of its own (synthetic data:
    # what is read does not change the cost).
    def step_fn():
      loss = loss_of(model, global_batch // DEVICES)
      train_op = optimizer_of(model, step).minimize(loss, global_step=step)
      with tf.control_dependencies([train_op]):
        return tf.identity(loss)

    per_replica = strategy.extended.call_for_each_replica(step_fn)
    loss = strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica,
                           axis=None)
  return loss.op, loss


def local_worker(args):
  """One single-process row: builds, warms up, times; writes examples/s."""
  import tensorflow.compat.v1 as tf  # pylint: disable=import-outside-toplevel
  tf.disable_eager_execution()
  devices = 1 if args.row == "TF 1 device" else DEVICES
  with tf.Graph().as_default():
    train_op, loss = _build(args.row, args.model, args.global_batch)
    init = tf.global_variables_initializer()
    config = tf.ConfigProto(device_count={"CPU": devices},
                            allow_soft_placement=True)
    with tf.Session(config=config) as session:
      session.run(init)
      # timing.step_seconds runs one more warm-up step.
      for _ in range(WARMUP - 1):
        session.run([train_op, loss])
      times = timing.step_seconds(session, [train_op, loss], args.steps)
  with open(args.out, "w") as f:
    json.dump({"examples_per_s": args.global_batch /
               statistics.median(times)}, f)


def _local_row(row, model, global_batch, steps):
  with tempfile.TemporaryDirectory() as directory:
    out = os.path.join(directory, "result.json")
    command = [sys.executable, os.path.abspath(__file__), "--row", row,
               "--model", model, "--global_batch", str(global_batch),
               "--steps", str(steps), "--out", out]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=ROOT)
    finished = subprocess.run(command, env=env, cwd=ROOT, capture_output=True,
                              text=True, timeout=1200, check=False)
    if finished.returncode != 0 or not os.path.exists(out):
      raise RuntimeError("%s / %s failed:\n%s" % (
          model, row, (finished.stdout + finished.stderr)[-4000:]))
    with open(out) as f:
      return json.load(f)["examples_per_s"]


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--models", default="bert_tiny,resnet")
  parser.add_argument("--global_batch", type=int, default=32)
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--row", default=None, help=argparse.SUPPRESS)
  parser.add_argument("--model", default=None, help=argparse.SUPPRESS)
  parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.row:
    local_worker(args)
    return
  if args.global_batch % DEVICES:
    raise SystemExit("--global_batch must be a multiple of %d" % DEVICES)
  with_horovod = importlib.util.find_spec("horovod") is not None
  print("global batch %d, %d timed steps after %d warm-up, %d logical CPU "
        "devices on this machine's %d cores; each row its own process%s" % (
            args.global_batch, args.steps, WARMUP, DEVICES, os.cpu_count(),
            "" if with_horovod else
            "; Horovod is not installed: its rows are left out"))
  print("%-10s %-18s %11s %12s %12s" % ("model", "run", "examples/s",
                                        "vs Mirrored", "vs Horovod"))
  for model in args.models.split(","):
    figures = {row: _local_row(row, model, args.global_batch, args.steps)
               for row in LOCAL_ROWS}
    if with_horovod:
      figures.update(horovod_data_parallel.run(model, args.global_batch,
                                               args.steps))
    mirrored = figures["TF Mirrored"]
    horovod = figures.get("Horovod alone 4x1")
    for row, value in figures.items():
      print("%-10s %-18s %11.1f %11.2fx %12s" % (
          model, row, value, value / mirrored,
          "%.2fx" % (value / horovod) if horovod else "-"), flush=True)


if __name__ == "__main__":
  main()
