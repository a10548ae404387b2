"""Data-parallel examples/s: EPL against plain TensorFlow,
MirroredStrategy and Horovod, same model, optimizer and global batch G per
step, each row saying what ran.

  TF 1 device               plain TensorFlow, one batch of G on one device:
                            on logical CPU devices that share the cores,
                            the limit of data parallelism at batch G
  TF MirroredStrategy       tf.distribute.MirroredStrategy over the N
                            devices in graph mode (call_for_each_replica,
                            G/N per replica)
  EPL DP                    EPL data parallel, N replicas of G/N in one
                            process, as configured by default: on one
                            host's CPUs gradients summed on one device
                            (communication.local_cpu_reduce) and one copy
                            of the weights, updated once per step
                            (communication.shared_weights)
  EPL DP, per-replica wts   the same with a copy of the weights per
                            replica, each updated by its replica
                            (shared_weights off: EPL before issue 35)
  EPL DP, ring              collective ring all-reduce (local_cpu_reduce
                            off), as across workers; on GPUs NCCL
  EPL DP, one pool          EPL DP with TensorFlow's one intra-op pool
                            shared by the logical CPU devices
                            (cluster.cpu_device_threads 0: EPL before
                            its per-device pools), in the same rounds
  EPL Horovod/Gloo 2x2      EPL with communication.backend "horovod",
                            horovodrun -np 2 x 2 logical devices per process
  EPL Horovod/Gloo 4x1      the same with 4 processes of one device
  Horovod alone/Gloo 4x1    plain TF + hvd.DistributedOptimizer, -np 4

EPL's rows run as a user's script runs them: EPL initialised, its hooks on
at every Session.run, fetching the user's train op and loss.

N is 4 logical CPU devices on a machine without GPUs, else its GPUs.
Models (benchmarks/horovod_data_parallel.py builds them): the standard
sizes `bert_base_2l` (BERT-Base's widths and vocabulary, 2 layers,
sequence 128, AdamW) and `resnet18` (ResNet-18 on 32x32 images,
Momentum); `mlp` (6 layers 1024 wide, Adam, issue 35's probe); the smoke
sizes `bert_tiny` and `resnet`. Each local row of a model (`--rows`)
runs in a process of its own (`row_process`), built and warmed up there
one row after another; all stay alive and are timed in turn
(`in_turn.rounds`: one step of each row a round, each round starting one
row later, each step timed in its row's process), so that load from
other jobs on a shared machine hits them alike: on 2 shared cores, rows
timed one after the other mostly measure which had the cores to itself.
The table "Timed in turn" gives each row's examples/s over plain TF's in
the same round, median over the `--steps` rounds (and over the quiet
rounds, other processes under QUIET cores: the row processes are not
"other"), its CPU time a step over plain TF's, and EPL DP against issue
35's goals. `--own_processes` times each row alone, one after the other
(no in-turn table).

The comparison is fair to every row: each runs as its users run it, in
a process of its own. Plain TF and Mirrored keep TensorFlow's defaults
(soft placement, TensorFlow's default intra- and inter-op threads, the
process-wide thread settings untouched: TF_OVERRIDE_GLOBAL_THREADPOOL is
removed from their environment), with 1 CPU device for plain TF and N
for Mirrored; plain TF's ops get all the intra-op threads. EPL's rows
call `epl.init` first in their process, as a user's script does, and
run with what it decides for that process (the logical CPU devices, and
their intra-op threads: `cluster.cpu_device_threads`). Plain TF and
Mirrored are built and stepped without EPL (`epl.env.detached`), EPL's
rows with EPL on. Each row process holds its own copy of TensorFlow and
of its model; the output ends with their peak RSS, together and the
largest.

examples/s = G / median step time after the warm-up;
the spread is the slowest and fastest step; CPU ms is the row process's
CPU time a step (median, `time.process_time`): what the step costs in work,
which the load of other jobs on a shared machine moves far less than the
wall time (the Horovod rows, in processes of their own, have none). "vs" columns are examples/s
over the anchor's (higher is better) with the verdict. A second table
splits one traced step of each local row into forward, backward, sums,
updates and copies (benchmarks/step_parts.py). MFU = model FLOPs per
second (static count of the one-device training step,
epl.parallel.cost.flops) over the peak of the devices used; the peak
comes from machine.PEAK_FLOPS by GPU name or --peak_tflops, so on CPUs
without the flag it is "-". The logical CPU devices (and the Horovod
processes) share this machine's cores: on a 2-core machine the rows
compare what each way of splitting the work costs, and plain TF on one
device is the limit. The Horovod rows need Horovod (`make horovod`; it
does not build against TensorFlow past 2.15); without it they are left
out and the output says why. On GPUs they still run on CPUs over Gloo.

    python benchmarks/data_parallel.py [--models bert_base_2l:16,resnet18:64]
        [--global_batch 32] [--steps 10] [--peak_tflops T] [--smoke]

(`name:G` gives a model its own global batch; --global_batch the others'.)
"""
import argparse
import contextlib
import copy
import importlib.util
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from benchmarks import horovod_data_parallel  # pylint: disable=wrong-import-position
from benchmarks import in_turn  # pylint: disable=wrong-import-position
from benchmarks import machine  # pylint: disable=wrong-import-position
from benchmarks import row_process  # pylint: disable=wrong-import-position
from benchmarks import smoke  # noqa: E402
from benchmarks import step_parts  # pylint: disable=wrong-import-position
from benchmarks import verdict  # pylint: disable=wrong-import-position

CPU_DEVICES = 4
WARMUP = 3
ONE_DEVICE, MIRRORED = "TF 1 device", "TF MirroredStrategy"
# Row -> EPL config keys (None: not an EPL row).
LOCAL_ROWS = {
    ONE_DEVICE: None,
    MIRRORED: None,
    "EPL DP": {},
    "EPL DP, per-replica wts": {"communication.shared_weights": False},
    "EPL DP, ring": {"communication.local_cpu_reduce": False},
    # EPL before its per-device intra-op pools: TensorFlow's one pool
    # shared by the logical CPU devices.
    "EPL DP, one pool": {"cluster.cpu_device_threads": 0},
}
# The Horovod rows have a --smoke of their own (horovod_data_parallel.py).
SMOKE = ["--models", "resnet", "--global_batch", "4", "--steps", "1",
         "--warmup", "1", "--no_horovod"]
# Other processes' cores under which a round in turn counts as quiet.
QUIET = 0.1
# Issue 35's goals for EPL DP's examples/s: over plain TF on one device's,
# and over MirroredStrategy's.
GOAL_ONE_DEVICE, GOAL_MIRRORED = 0.95, 1.0
ROW_SEPARATOR = ";"
# Set by `epl.init` for several logical CPU devices and read once per
# process: a row process must not inherit it from this one (plain TF and
# Mirrored run with TensorFlow's defaults; EPL's rows with what epl.init
# decides in their own process).
THREADPOOL_OVERRIDE = "TF_OVERRIDE_GLOBAL_THREADPOOL"
# What to do when the row processes do not fit in memory together.
MEMORY_FIX = ("time fewer rows together (--rows) or each alone "
              "(--own_processes)")


def _devices():
  """(device type, count) the rows run on."""
  gpus = machine.gpus()
  return ("GPU", len(gpus)) if gpus else ("CPU", CPU_DEVICES)


def _build(row, model, global_batch, device_type, devices):
  """(train op, loss) of `row` in the default graph."""
  import tensorflow.compat.v1 as tf  # pylint: disable=import-outside-toplevel
  loss_of = horovod_data_parallel.model_loss
  optimizer_of = horovod_data_parallel.model_optimizer
  if row == ONE_DEVICE:
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


class Row:
  """One local row built into its own graph and session, ready to step
  (in its row process: `row_process.serve`)."""

  def __init__(self, row, model, global_batch):
    import tensorflow.compat.v1 as tf  # pylint: disable=import-outside-toplevel
    import epl  # pylint: disable=import-outside-toplevel
    from epl.parallel import engine  # pylint: disable=import-outside-toplevel
    self.step_flops = 0
    self.is_epl = LOCAL_ROWS[row] is not None
    device_type, devices = _devices()
    if row == ONE_DEVICE:
      devices = 1
    if row == MIRRORED:
      # MirroredStrategy builds its replicas in threads of its own, which
      # `detached` (per thread) does not reach: EPL must be off.
      epl.shutdown()
    self.graph = tf.Graph()
    with self.graph.as_default(), self.context():
      self.fetches = list(_build(row, model, global_batch, device_type,
                                 devices))
      if row == ONE_DEVICE:
        self.step_flops = _step_flops(*self.fetches)
      if self.is_epl:
        engine.ensure_rewritten(self.graph)
      self.parts_of = step_parts.classify(self.graph, self.fetches)
      init = tf.global_variables_initializer()
      config = tf.ConfigProto(allow_soft_placement=True)
      if device_type == "CPU":
        config.device_count["CPU"] = devices
      self.session = tf.Session(config=config)
      self.session.run(init)
    self.facts = {"step_flops": self.step_flops}

  def context(self):
    """EPL's rows run with EPL on, as in a user's script; the others
    without it (`epl.env.detached`)."""
    from epl.env import detached  # pylint: disable=import-outside-toplevel
    return contextlib.nullcontext() if self.is_epl else detached()

  def step(self):
    with self.context():
      self.session.run(self.fetches)

  def parts(self):
    with self.context():
      return step_parts.traced_parts(self.session, self.fetches,
                                     self.parts_of)


def _serve_row(row, model, global_batch, warmup, channel):
  """The row process of `row`: builds it (EPL's rows call epl.init there,
  as a user's script does), runs its warm-up steps, then steps it on the
  parent's command (`row_process.serve`)."""
  import tensorflow.compat.v1 as tf  # pylint: disable=import-outside-toplevel
  tf.disable_eager_execution()

  def build():
    built = Row(row, model, global_batch)
    for _ in range(warmup):
      built.step()
    return built

  row_process.serve(channel, build)


def _start_row(row, model, args, name):
  """The row process of `row`, built and warmed up; `name` in errors."""
  command = [sys.executable, os.path.abspath(__file__), "--row", row,
             "--model", model, "--global_batch", str(args.global_batch),
             "--warmup", str(args.warmup)]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
  env.pop(THREADPOOL_OVERRIDE, None)
  if _devices()[0] == "CPU":
    env["CUDA_VISIBLE_DEVICES"] = ""
  return row_process.RowProcess(name, command, env, cwd=ROOT)


def _figures(global_batch, timed, step_flops, parts, others, peak_rss):
  """A row's figures from its (wall s, CPU s) of each timed step;
  `others`: the cores other processes kept busy meanwhile."""
  times, cpu_times = (list(column) for column in zip(*timed))
  return {"examples_per_s": global_batch / statistics.median(times),
          "step_s": times, "step_flops": step_flops,
          "cpu_s": statistics.median(cpu_times), "others": others,
          "parts": parts, "peak_rss": peak_rss}


def _time_together(rows, model, args):
  """({row: figures}, {row: [(wall s, CPU s) a round]}, [quiet rounds])
  of `rows`, each in a row process of its own, built one after another
  and all alive while they are timed in turn (`in_turn.rounds`)."""
  started = []
  try:
    for row in rows:
      label = "%s / %s" % (model, row)
      row_process.check_memory(started, label, MEMORY_FIX)
      started.append(_start_row(row, model, args, label))
    timed, quiet, others = in_turn.rounds(
        [(row.name, row.step) for row in started], args.steps, QUIET,
        self_timed=True, child_pids=[row.pid for row in started])
    parts = [row.parts() for row in started]
    figures = {
        name: _figures(args.global_batch, timed[row.name],
                       row.ready["step_flops"], row_parts, others,
                       row.stop())
        for name, row, row_parts in zip(rows, started, parts)}
  finally:
    row_process.stop_all(started)
  return figures, {name: timed[row.name] for name, row in
                   zip(rows, started)}, quiet


def measure(model, args):
  """{row: {"examples_per_s", "step_s", "step_flops", "cpu_s", "others",
  "parts", "peak_rss", and, timed in turn, for every row but ONE_DEVICE
  "in_turn": {"rate", "cpu", "quiet_rate", "mirrored", "rounds",
  "quiet"}}} of the local rows `args.rows`: its examples/s and CPU time a
  step over ONE_DEVICE's, median over the rounds (and over the quiet
  rounds). With `args.own_processes` each row is timed alone, one after
  the other (no "in_turn")."""
  if args.own_processes:
    return {row: _time_together([row], model, args)[0][row]
            for row in args.rows}
  figures, timed, quiet = _time_together(args.rows, model, args)
  base = timed.get(ONE_DEVICE)
  for name, pairs in timed.items():
    if base is None or name == ONE_DEVICE:
      continue
    calm = [(p, b) for p, b, q in zip(pairs, base, quiet) if q]
    figures[name]["in_turn"] = {
        # examples/s over ONE_DEVICE's = its step over this row's.
        "rate": 1.0 / in_turn.median_ratio(pairs, base, 0),
        "cpu": in_turn.median_ratio(pairs, base, 1),
        "quiet_rate": 1.0 / in_turn.median_ratio(*zip(*calm), 0)
                      if calm else None,
        # examples/s over MIRRORED's, by the same rounds.
        "mirrored": in_turn.median_ratio(timed[MIRRORED], pairs, 0)
                    if MIRRORED in timed else None,
        "rounds": len(pairs), "quiet": len(calm)}
  return figures


def _horovod_missing():
  """Why the Horovod rows cannot run here, or None."""
  if importlib.util.find_spec("horovod") is None:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return ("Horovod is not installed (make horovod; Horovod 0.28.1 does not "
            "build against TensorFlow %s)" % tf.__version__
            if not tf.__version__.startswith("2.15") else
            "Horovod is not installed (make horovod)")
  return None


def _spread(figure):
  """'[fastest-slowest] ms' of a local row's steps."""
  times = figure.get("step_s")
  if not times:
    return "-"
  return "%.0f-%.0f" % (1e3 * min(times), 1e3 * max(times))


def _cpu_ms(figure):
  """The median CPU ms a step of a local row; '-' for the others."""
  return "%.1f" % (1e3 * figure["cpu_s"]) if "cpu_s" in figure else "-"


def _print_model(model, figures, rates, devices, global_batch, peak):
  one_device = rates[ONE_DEVICE]
  mirrored = rates[MIRRORED]
  horovod = rates.get(horovod_data_parallel.HOROVOD_ALONE)
  step_flops = figures[ONE_DEVICE]["step_flops"]
  for row, rate in rates.items():
    epl_row = row.startswith("EPL")
    versus = [verdict.ratio(rate, one_device), verdict.ratio(rate, mirrored),
              verdict.ratio(rate, horovod or 0)]
    used = 1 if row == ONE_DEVICE else devices
    utilisation = machine.mfu(step_flops, global_batch / rate, peak, used)
    others = figures.get(row, {}).get("others")
    print("%-16s %-24s %10.1f %11s %8s %8.2fx %9s %8.2fx %9s %8s %9s %6s %6s"
          % (model, row, rate, _spread(figures.get(row, {})),
             _cpu_ms(figures.get(row, {})), versus[0],
        verdict.verdict(versus[0]) if epl_row else "", versus[1],
        verdict.verdict(versus[1]) if epl_row else "",
        "%.2fx" % versus[2] if horovod else "-",
        verdict.verdict(versus[2]) if epl_row and horovod else "",
             "%.3f" % utilisation if utilisation is not None else "-",
             "-" if others is None else "%.2f" % others), flush=True)


def _local_rows(names):
  """The local rows of --rows `names`, in LOCAL_ROWS' order, with the
  anchors."""
  wanted = set(names.split(ROW_SEPARATOR)) | {ONE_DEVICE, MIRRORED}
  unknown = wanted - set(LOCAL_ROWS)
  if unknown:
    raise SystemExit("--rows: unknown %s (known: %s)" % (
        sorted(unknown), ", ".join(LOCAL_ROWS)))
  return [row for row in LOCAL_ROWS if row in wanted]


def _print_in_turn(rows):
  """The in-turn ratios to TF 1 device of each (model, row, figures) of
  `rows`, then each EPL DP row against GOAL_ONE_DEVICE and
  GOAL_MIRRORED (the median over the rounds of its examples/s over
  Mirrored's)."""
  print("\nTimed in turn: examples/s over %s's in the same round "
        "(median over the rounds, higher is better; over the quiet rounds, "
        "other processes under %.2f cores), CPU a step over %s's (median, "
        "lower is better); others = cores other processes kept busy"
        % (ONE_DEVICE, QUIET, ONE_DEVICE))
  print("%-16s %-24s %7s %12s %14s %12s %7s" % (
      "model", "run", "rounds", "vs TF 1dev", "quiet rounds", "CPU x 1dev",
      "others"))
  for model, row, figures in rows:
    ratio = figures["in_turn"]
    print("%-16s %-24s %7d %11.2fx %14s %11.2fx %7s" % (
        model, row, ratio["rounds"], ratio["rate"],
        "-" if ratio["quiet_rate"] is None else "%.2fx (%d)" % (
            ratio["quiet_rate"], ratio["quiet"]), ratio["cpu"],
        "-" if figures["others"] is None else "%.2f" % figures["others"]))
  for model, row, figures in rows:
    if row != "EPL DP":
      continue
    ratio = figures["in_turn"]
    versus = ratio["mirrored"]
    print("%s %s: %.2fx TF 1 device's examples/s (goal at least %.2fx: "
          "%s), %.2fx MirroredStrategy's (goal at least %.2fx: %s); CPU "
          "%.2fx TF 1 device's" % (
              model, row, ratio["rate"], GOAL_ONE_DEVICE,
              "meets" if ratio["rate"] >= GOAL_ONE_DEVICE else "misses",
              versus, GOAL_MIRRORED,
              "meets" if versus >= GOAL_MIRRORED else "misses",
              ratio["cpu"]))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--models", default="bert_base_2l,resnet18")
  parser.add_argument("--global_batch", type=int, default=32)
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--warmup", type=int, default=WARMUP)
  parser.add_argument("--peak_tflops", type=float, default=0.0,
                      help="peak TFLOP/s of one device, for MFU (default: "
                      "machine.PEAK_FLOPS by GPU name; none on CPUs)")
  parser.add_argument("--no_horovod", action="store_true",
                      help="leave out the Horovod rows")
  parser.add_argument("--own_processes", action="store_true",
                      help="time each local row alone, one after the other, "
                      "not all in turn (each is in a process of its own "
                      "either way)")
  # Row names hold commas: ";" separates them.
  parser.add_argument("--rows", default=ROW_SEPARATOR.join(LOCAL_ROWS),
                      help="semicolon-separated local rows (%s); %s and %s "
                      "always run: the ratios are to them" % (
                          ", ".join(LOCAL_ROWS), ONE_DEVICE, MIRRORED))
  # A row process's: its row, model and command pipes (_start_row).
  parser.add_argument("--row", default=None, help=argparse.SUPPRESS)
  parser.add_argument("--model", default=None, help=argparse.SUPPRESS)
  parser.add_argument("--serve", default=None, help=argparse.SUPPRESS)
  args = smoke.parse_args(parser, argv, SMOKE)
  args.rows = _local_rows(args.rows)
  if args.serve:
    _serve_row(args.row, args.model, args.global_batch, args.warmup,
               args.serve)
    return 0
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  device_type, devices = _devices()
  default_batch = args.global_batch
  missing = "left out (--no_horovod)" if args.no_horovod else (
      _horovod_missing())
  names = machine.gpus()
  peak = machine.peak_flops(names[0] if names else "", args.peak_tflops)
  print("model/global batch (default %d), %d timed steps after %d warm-up, "
        "%d %s devices; %s; local rows %s%s" % (
            args.global_batch, args.steps, args.warmup, devices,
            "logical CPU" if device_type == "CPU" else device_type,
            machine.describe(tf.__version__),
            "each in a process of its own, timed alone one after the other"
            if args.own_processes else "each in a process of its own, "
            "timed step by step in turn",
            "; Horovod rows: %s" % missing if missing else ""))
  print("examples/s: higher is better; vs = examples/s over the anchor's "
        "(higher is better); spread = fastest-slowest step, ms; CPU ms = "
        "the row process's CPU time a step, median (lower is better)")
  print("%-16s %-24s %10s %11s %8s %9s %9s %9s %9s %8s %9s %6s %6s" % (
      "model", "run", "examples/s", "spread ms", "CPU ms", "vs TF 1dev", "",
      "vs Mirr.", "", "vs Horovod", "", "MFU", "others"))
  all_parts, in_turn_rows, memory = [], [], []
  for spec in args.models.split(","):
    # name[:global batch]: each model at a batch that says something
    # about it (ResNet-18 at 16 gives each replica 4 images).
    model, _, batch = spec.partition(":")
    args = copy.copy(args)
    args.global_batch = int(batch or default_batch)
    if args.global_batch % devices:
      raise SystemExit("%s: the global batch must be a multiple of %d" % (
          spec, devices))
    figures = measure(model, args)
    rates = {row: f["examples_per_s"] for row, f in figures.items()}
    if not missing:
      rates.update(horovod_data_parallel.run(model, args.global_batch,
                                             args.steps))
    label = "%s/%d" % (model, args.global_batch)
    _print_model(label, figures, rates, devices, args.global_batch, peak)
    all_parts += [(label, row, f["parts"]) for row, f in figures.items()]
    in_turn_rows += [(label, row, f) for row, f in figures.items()
                     if "in_turn" in f]
    memory.append((label, [f["peak_rss"] for f in figures.values()]))
  if in_turn_rows:
    _print_in_turn(in_turn_rows)
  print("\nOne traced step of each local row split into parts "
        "(benchmarks/step_parts.py): busy ms of each part, lower is "
        "better; parts overlap, so they do not add up to the step")
  print(step_parts.header())
  for model, row, parts in all_parts:
    print(step_parts.line(model, row, parts))
  print()
  for model, peaks in memory:
    print("%s: peak RSS of the row processes %.2f GiB together, %.2f GiB "
          "the largest" % (model, sum(peaks) / 2 ** 30, max(peaks) / 2 ** 30))
  return 0


if __name__ == "__main__":
  sys.exit(main())
