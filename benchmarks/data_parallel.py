"""Data-parallel examples/s: EPL against plain TensorFlow,
MirroredStrategy and Horovod, same model, optimizer and global batch G per
step, each row saying what ran.

  TF 1 device               plain TensorFlow, one batch of G on one device
  TF MirroredStrategy       tf.distribute.MirroredStrategy over the N
                            devices in graph mode (call_for_each_replica,
                            G/N per replica)
  EPL DP, local sums        EPL data parallel, N replicas of G/N in one
                            process; gradients summed on one device and
                            read back (communication.local_cpu_reduce, the
                            default on one host's CPUs)
  EPL DP, ring              the same with collective ring all-reduce
                            (local_cpu_reduce off), as across workers; on
                            GPUs EPL's all-reduce is NCCL
  EPL Horovod/Gloo 2x2      EPL with communication.backend "horovod",
                            horovodrun -np 2 x 2 logical devices per process
  EPL Horovod/Gloo 4x1      the same with 4 processes of one device
  Horovod alone/Gloo 4x1    plain TF + hvd.DistributedOptimizer, -np 4

EPL's rows run as a user's script runs them: EPL initialised, its hooks on
at every Session.run, fetching the user's train op and loss; the gradients
go in communication.max_splits buckets over communication.num_communicators
communicators (their defaults unless set in the environment).

N is 4 logical CPU devices on a machine without GPUs, else its GPUs.
Models (benchmarks/horovod_data_parallel.py builds them): `bert_tiny`
(examples/bert_large, tiny config, AdamW with warm-up, sequence length 64)
and `resnet` (a small ResNet-style conv net on 32x32 images, Momentum).
Every row runs in its own process, one after the other, and times its
steps after a warm-up: examples/s = G / median step time. "vs" columns are
examples/s over the anchor's (higher is better) with the verdict. MFU =
model FLOPs per second (static count of the one-device training step,
epl.parallel.cost.flops, the profiler's) over the peak of the devices used; the
peak comes from machine.PEAK_FLOPS by GPU name or --peak_tflops, so on CPUs
without the flag it is "-". The logical CPU devices (and the Horovod
processes) share this machine's cores: on a 2-core machine the rows
compare what each way of splitting the work costs, not a speed-up over one
device. The Horovod rows need Horovod (`make horovod`; it does not build
against TensorFlow past 2.15); without it they are left out and the
output says why. On GPUs they still run on CPUs over Gloo (no NCCL build).

    python benchmarks/data_parallel.py [--models bert_tiny,resnet]
        [--global_batch 32] [--steps 10] [--peak_tflops T] [--smoke]
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
from benchmarks import machine  # pylint: disable=wrong-import-position
from benchmarks import smoke  # noqa: E402
from benchmarks import timing  # pylint: disable=wrong-import-position
from benchmarks import verdict  # pylint: disable=wrong-import-position

CPU_DEVICES = 4
WARMUP = 3
# Row -> EPL config keys (None: not an EPL row).
LOCAL_ROWS = {
    "TF 1 device": None,
    "TF MirroredStrategy": None,
    "EPL DP, local sums": {},
    "EPL DP, ring": {"communication.local_cpu_reduce": False},
}
# The Horovod rows have a --smoke of their own (horovod_data_parallel.py).
SMOKE = ["--models", "resnet", "--global_batch", "4", "--steps", "1",
         "--warmup", "1", "--no_horovod", "--in_process"]


def _devices():
  """(device type, count) the rows run on."""
  gpus = machine.gpus()
  return ("GPU", len(gpus)) if gpus else ("CPU", CPU_DEVICES)


def _build(row, model, global_batch, device_type, devices):
  """(train op, loss) of `row` in the default graph."""
  import tensorflow.compat.v1 as tf  # pylint: disable=import-outside-toplevel
  loss_of = horovod_data_parallel.model_loss
  optimizer_of = horovod_data_parallel.model_optimizer
  if row == "TF 1 device":
    step = tf.train.get_or_create_global_step()
    loss = loss_of(model, global_batch)
    return optimizer_of(model, step).minimize(loss, global_step=step), loss
  if LOCAL_ROWS[row] is not None:
    import epl  # pylint: disable=import-outside-toplevel
    config = dict(LOCAL_ROWS[row])
    if device_type == "CPU":
      config["cluster.num_cpu_devices"] = devices
    epl.init(epl.Config(config))
    epl.set_default_strategy(epl.replicate(device_count=1))
    step = tf.train.get_or_create_global_step()
    loss = loss_of(model, global_batch // devices)
    return optimizer_of(model, step).minimize(loss, global_step=step), loss

  # Each replica reads an input pipeline of its own (synthetic data: what
  # is read does not change the cost).
  def replica_step(step):
    loss = loss_of(model, global_batch // devices)
    return loss, optimizer_of(model, step).minimize(loss, global_step=step)

  from benchmarks import mirrored  # pylint: disable=import-outside-toplevel
  return mirrored.train_step(
      ["/device:%s:%d" % (device_type, i) for i in range(devices)],
      replica_step)


def _step_flops(train_op, loss):
  """Static FLOPs of the ops a step of `train_op` and `loss` runs."""
  from epl.parallel.cost import flops  # pylint: disable=import-outside-toplevel
  from epl.ir import graph_editor  # pylint: disable=import-outside-toplevel
  return sum(flops.profile_flops(
      train_op.graph, graph_editor.ancestors([train_op, loss.op])).values())


def measure_row(row, model, global_batch, steps, warmup):
  """Builds, warms up and times one row in this process; returns
  {"examples_per_s", "step_flops"} (FLOPs of the one-device row only)."""
  import tensorflow.compat.v1 as tf  # pylint: disable=import-outside-toplevel
  tf.disable_eager_execution()
  device_type, devices = _devices()
  if row == "TF 1 device":
    devices = 1
  result = {"step_flops": 0}
  try:
    with tf.Graph().as_default():
      train_op, loss = _build(row, model, global_batch, device_type,
                              devices)
      if row == "TF 1 device":
        result["step_flops"] = _step_flops(train_op, loss)
      init = tf.global_variables_initializer()
      config = tf.ConfigProto(allow_soft_placement=True)
      if device_type == "CPU":
        config.device_count["CPU"] = devices
      with tf.Session(config=config) as session:
        session.run(init)
        # timing.step_seconds runs one more warm-up step.
        for _ in range(warmup - 1):
          session.run([train_op, loss])
        times = timing.step_seconds(session, [train_op, loss], steps)
  finally:
    if LOCAL_ROWS[row] is not None:
      import epl  # pylint: disable=import-outside-toplevel
      epl.shutdown()
  result["examples_per_s"] = global_batch / statistics.median(times)
  return result


def _local_row(row, model, args):
  """measure_row in a fresh process (in this one with --in_process)."""
  if args.in_process:
    return measure_row(row, model, args.global_batch, args.steps,
                       args.warmup)
  with tempfile.TemporaryDirectory() as directory:
    out = os.path.join(directory, "result.json")
    command = [sys.executable, os.path.abspath(__file__), "--row", row,
               "--model", model, "--global_batch", str(args.global_batch),
               "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--out", out]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    if _devices()[0] == "CPU":
      env["CUDA_VISIBLE_DEVICES"] = ""
    finished = subprocess.run(command, env=env, cwd=ROOT, capture_output=True,
                              text=True, timeout=1200, check=False)
    if finished.returncode != 0 or not os.path.exists(out):
      raise RuntimeError("%s / %s failed:\n%s" % (
          model, row, (finished.stdout + finished.stderr)[-4000:]))
    with open(out) as f:
      return json.load(f)


def _horovod_missing():
  """Why the Horovod rows cannot run here, or None."""
  if importlib.util.find_spec("horovod") is None:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return ("Horovod is not installed (make horovod; Horovod 0.28.1 does not "
            "build against TensorFlow %s)" % tf.__version__
            if not tf.__version__.startswith("2.15") else
            "Horovod is not installed (make horovod)")
  return None


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--models", default="bert_tiny,resnet")
  parser.add_argument("--global_batch", type=int, default=32)
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--warmup", type=int, default=WARMUP)
  parser.add_argument("--peak_tflops", type=float, default=0.0,
                      help="peak TFLOP/s of one device, for MFU (default: "
                      "machine.PEAK_FLOPS by GPU name; none on CPUs)")
  parser.add_argument("--no_horovod", action="store_true",
                      help="leave out the Horovod rows")
  parser.add_argument("--in_process", action="store_true",
                      help="measure the local rows in this process, one "
                      "after the other, not each in a fresh one")
  parser.add_argument("--row", default=None, help=argparse.SUPPRESS)
  parser.add_argument("--model", default=None, help=argparse.SUPPRESS)
  parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
  args = smoke.parse_args(parser, argv, SMOKE)
  if args.row:
    with open(args.out, "w") as f:
      json.dump(measure_row(args.row, args.model, args.global_batch,
                            args.steps, args.warmup), f)
    return 0
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from epl.config import Config  # pylint: disable=import-outside-toplevel
  device_type, devices = _devices()
  if args.global_batch % devices:
    raise SystemExit("--global_batch must be a multiple of %d" % devices)
  missing = "left out (--no_horovod)" if args.no_horovod else (
      _horovod_missing())
  communication = Config().communication
  names = machine.gpus()
  peak = machine.peak_flops(names[0] if names else "", args.peak_tflops)
  print("global batch %d, %d timed steps after %d warm-up, %d %s devices; "
        "%s; each row %s; EPL: %d gradient buckets (max_splits) over %d "
        "communicators%s" % (
            args.global_batch, args.steps, args.warmup, devices,
            "logical CPU" if device_type == "CPU" else device_type,
            machine.describe(tf.__version__),
            "in this process" if args.in_process else "its own process",
            communication.max_splits, communication.num_communicators,
            "; Horovod rows: %s" % missing if missing else ""))
  print("%-10s %-24s %11s %12s %10s %12s %10s %7s" % (
      "model", "run", "examples/s", "vs Mirrored", "", "vs Horovod", "",
      "MFU"))
  for model in args.models.split(","):
    figures = {row: _local_row(row, model, args) for row in LOCAL_ROWS}
    step_flops = figures["TF 1 device"]["step_flops"]
    rates = {row: f["examples_per_s"] for row, f in figures.items()}
    if not missing:
      rates.update(horovod_data_parallel.run(model, args.global_batch,
                                             args.steps))
    mirrored = rates["TF MirroredStrategy"]
    horovod = rates.get(horovod_data_parallel.HOROVOD_ALONE)
    for row, rate in rates.items():
      epl_row = row.startswith("EPL")
      versus = [verdict.ratio(rate, mirrored),
                verdict.ratio(rate, horovod or 0)]
      used = 1 if row == "TF 1 device" else devices
      utilisation = machine.mfu(step_flops, args.global_batch / rate, peak,
                                used)
      print("%-10s %-24s %11.1f %11.2fx %10s %11s %10s %7s" % (
          model, row, rate, versus[0],
          verdict.verdict(versus[0]) if epl_row else "",
          "%.2fx" % versus[1] if horovod else "-",
          verdict.verdict(versus[1]) if epl_row and horovod else "",
          "%.3f" % utilisation if utilisation is not None else "-"),
            flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
