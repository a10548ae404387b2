"""Start-up time of BERT under EPL: from an empty graph to the end of the
first training step, against plain single-device TensorFlow and against
tf.distribute.MirroredStrategy over the same devices.

Each measurement runs in a fresh Python process (so that peak RSS is its
own) and splits the time into:
  build    - the user's graph (model, AdamW, synthetic input), capture on
             for EPL; for MirroredStrategy, the strategy and its replicas;
  rewrite  - EPL's rewrite (`engine.ensure_rewritten`, what the first
             Session.run triggers), 0 for plain TF and MirroredStrategy;
  session  - tf.Session creation and the variables' initialisation run
             (TF places, optimises and partitions the init subgraph);
  setup    - TF's first-run work on the training subgraph (placement,
             grappler, partitioning, executors): the first step's time
             minus the second step's;
  step     - one training step (the second step's time).
"to step 1" = build + rewrite + session + setup + step (for build-only
runs, build + rewrite).
Also the process's CPU time over all of it (all threads; less disturbed
than wall time when other jobs share the machine), the op count of the
graph handed to TF and the process's peak RSS.

    python benchmarks/startup.py           # tiny, base (8x4 build only), large
    python benchmarks/startup.py --smoke   # tiny 1x1, 2x2 and MirroredStrategy 2: a quick check
    python benchmarks/startup.py --runs tiny:1x1,tiny:8x1:mirrored,tiny:8x1,tiny:8x4
    python benchmarks/startup.py --runs large:8x4:build
    python benchmarks/startup.py --runs tiny:8x4,tiny:8x4:grappler=default,tiny:8x4:grappler=off

A layout RxM runs R replicas (data parallel, one logical CPU device each)
and M micro-batches; the plain TF run uses one micro-batch as its batch.
Options after the layout: `build` (build and rewrite only), `mirrored`
(MirroredStrategy over R logical CPU devices instead of EPL, each replica
a batch of M micro-batches, so the global batch is EPL's), and
`grappler=default|fast|off` (EPL's `optimizer.grappler` preset, or the
user's session config turning Grappler off; without it, EPL's default
preset, and TensorFlow's own for plain TF and MirroredStrategy).
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


def _rss_mib():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _build_mirrored(train, flags, replicas):
  """The user's graph under MirroredStrategy over `replicas` logical CPU
  devices; returns the train op."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  strategy = tf.distribute.MirroredStrategy(
      ["/device:CPU:%d" % i for i in range(replicas)])
  with strategy.scope():
    train_ops = strategy.extended.call_for_each_replica(
        lambda: train.build_graph(flags)["train_op"])
    return strategy.group(train_ops)


def measure(config, replicas, micro_batches, system, build_only, batch_size,
            grappler):
  """One run in this process; returns a dict of seconds, op counts, RSS.

  `system`: "plain" (single-device TF), "epl" or "mirrored"; `grappler`:
  "" (the system's default), an EPL preset, or "off" (the session config
  turns Grappler off)."""
  import logging  # pylint: disable=g-import-not-at-top
  import tensorflow as tf2  # pylint: disable=g-import-not-at-top
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  from examples.bert_large import train  # pylint: disable=g-import-not-at-top
  if system == "mirrored":
    # Before the runtime starts: MirroredStrategy needs the devices to exist.
    tf2.config.set_logical_device_configuration(
        tf2.config.list_physical_devices("CPU")[0],
        [tf2.config.LogicalDeviceConfiguration()] * replicas)
  if grappler in ("default", "fast"):
    os.environ["EPL_OPTIMIZER_GRAPPLER"] = grappler
  tf.disable_eager_execution()
  logging.getLogger("epl").setLevel(logging.WARNING)
  flags = train.make_flags(
      config=config, parallel="data" if system == "epl" else "none",
      num_cpu_devices=replicas if system == "epl" else 0,
      num_micro_batch=micro_batches if system == "epl" else 1,
      batch_size=batch_size * (micro_batches if system == "mirrored" else 1),
      steps=1000, dropout=True)
  result = {}
  cpu_start = time.process_time()
  graph = tf.Graph()
  with graph.as_default():
    start = time.perf_counter()
    if system == "mirrored":
      train_op = _build_mirrored(train, flags, replicas)
    else:
      train_op = train.build_graph(flags)["train_op"]
    result["build"] = time.perf_counter() - start
    result["user_ops"] = len(graph.get_operations())
    result["rewrite"] = 0.0
    if system == "epl":
      from epl.passes import engine  # pylint: disable=g-import-not-at-top
      start = time.perf_counter()
      engine.ensure_rewritten(graph)
      result["rewrite"] = time.perf_counter() - start
    result["ops"] = len(graph.get_operations())
    if not build_only:
      init = tf.global_variables_initializer()
      start = time.perf_counter()
      session_config = tf.ConfigProto()
      if system == "mirrored":
        session_config.device_count["CPU"] = replicas
      session_config.graph_options.rewrite_options.disable_meta_optimizer = (
          grappler == "off")
      sess = tf.Session(config=session_config)
      sess.run(init)
      result["session"] = time.perf_counter() - start
      times = []
      for _ in range(2):
        start = time.perf_counter()
        sess.run(train_op)
        times.append(time.perf_counter() - start)
      result["step"] = times[1]
      result["setup"] = max(0.0, times[0] - times[1])
      sess.close()
  result["cpu"] = time.process_time() - cpu_start
  result["peak_rss_mib"] = _rss_mib()
  return result


def _child(args, config, layout, system, build_only, grappler=""):
  replicas, micro_batches = (int(x) for x in layout.split("x"))
  return fresh_process.measure_in_child(
      os.path.abspath(__file__),
      [config, replicas, micro_batches, system, build_only, args.batch_size,
       grappler], args.timeout)


class _Run:
  """One item of --runs: 'config:RxM[:build][:mirrored][:grappler=P]'."""

  def __init__(self, item):
    self.config, self.layout, *options = item.split(":")
    self.build_only = "build" in options
    self.system = "mirrored" if "mirrored" in options else "epl"
    self.grappler = ""
    for option in options:
      if option.startswith("grappler="):
        self.grappler = option.split("=", 1)[1]
      elif option not in ("build", "mirrored"):
        raise ValueError("Unknown option %r in --runs item %r: use build, "
                         "mirrored or grappler=default|fast|off." % (
                             option, item))
    self.replicas = int(self.layout.split("x")[0])

  @property
  def label(self):
    if self.system == "mirrored":
      return "Mirrored %d" % self.replicas
    return "EPL %s%s" % (self.layout, ", grappler %s" % self.grappler
                         if self.grappler else "")


def _runs(text):
  """[(config, build_only, [_Run])] from the items of --runs, grouped by
  model and build-only in the order given."""
  groups = []
  for item in text.split(","):
    run = _Run(item)
    key = (run.config, run.build_only)
    if not groups or groups[-1][:2] != key:
      groups.append(key + ([],))
    groups[-1][2].append(run)
  return groups


PHASES = ("build", "rewrite", "session", "setup", "step")


def _total(result):
  return sum(result.get(p, 0.0) for p in PHASES)


def _row(label, result):
  cells = ["%8.1f" % result.get(p, float("nan")) for p in PHASES]
  return "%-22s %s %9.1f %9.1f %9d %9.0f" % (
      label, " ".join(cells), _total(result), result["cpu"], result["ops"],
      result["peak_rss_mib"])


SMOKE_RUNS = "tiny:1x1,tiny:2x1:mirrored,tiny:2x2"


def _ratios(result, plain, mirrored):
  """The ratio line of an EPL or MirroredStrategy row."""
  text = ("to step 1 %.2fx plain (CPU time %.2fx)" % (
      _total(result) / _total(plain), result["cpu"] / plain["cpu"]))
  if mirrored is not None and mirrored is not result:
    text += ", %.2fx MirroredStrategy (CPU time %.2fx)" % (
        _total(result) / _total(mirrored), result["cpu"] / mirrored["cpu"])
  return "%-22s %s, rewrite %.2fx plain build, ops %.1fx, peak RSS %.2fx" % (
      "  ratio", text, result["rewrite"] / plain["build"],
      result["ops"] / plain["ops"],
      result["peak_rss_mib"] / plain["peak_rss_mib"])


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
      "--runs", default="tiny:1x1,tiny:8x1:mirrored,tiny:8x1,tiny:4x4,"
      "tiny:8x4,tiny:8x4:grappler=default,tiny:8x4:grappler=off,"
      "base:1x1,base:4x4,base:8x4:build,large:8x4:build",
      help="config:RxM items; ':build' = build and rewrite only (BERT-Base "
      "8x4 trains 8 copies of 110M parameters with Adam: 10+ GiB); "
      "':mirrored' = MirroredStrategy over R devices instead of EPL; "
      "':grappler=default|fast|off' = EPL's optimizer.grappler preset, or "
      "rewrite_options.disable_meta_optimizer in the session config")
  parser.add_argument("--smoke", action="store_true",
                      help="only --runs %s: checks the script in a few "
                      "minutes" % SMOKE_RUNS)
  parser.add_argument("--batch_size", type=int, default=2,
                      help="micro-batch per replica (and plain TF's batch)")
  parser.add_argument("--timeout", type=int, default=3600)
  parser.add_argument("--child", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    fresh_process.answer_child(args.child, measure)
    return 0
  if args.smoke:
    args.runs = SMOKE_RUNS
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  print("EPL start-up: BERT (examples/bert_large), data parallel on R "
        "logical CPU devices x M micro-batches, micro-batch %d; TensorFlow "
        "%s, %d CPU cores; each row a fresh process; seconds." % (
            args.batch_size, tf.__version__, os.cpu_count()), flush=True)
  header = "%-22s %s %9s %9s %9s %9s" % (
      "", " ".join("%8s" % p for p in PHASES), "to step 1", "CPU s", "ops",
      "RSS MiB")
  for config, build_only, runs in _runs(args.runs):
    print("\nBERT %s%s" % (config, " (build and rewrite only)"
                           if build_only else ""))
    print(header)
    plain = _child(args, config, "1x1", "plain", build_only)
    print(_row("plain TF", plain), flush=True)
    mirrored = {}
    for run in runs:
      result = _child(args, config, run.layout, run.system, build_only,
                      run.grappler)
      if run.system == "mirrored":
        mirrored[run.replicas] = result
      print(_row(run.label, result), flush=True)
      print(_ratios(result, plain, mirrored.get(run.replicas)), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
