"""Start-up time of BERT under EPL: from an empty graph to the end of the
first training step, against plain single-device TensorFlow.

Each measurement runs in a fresh Python process (so that peak RSS is its
own) and splits the time into:
  build    - the user's graph (model, AdamW, synthetic input), capture on
             for EPL;
  rewrite  - EPL's rewrite (`engine.ensure_rewritten`, what the first
             Session.run triggers), 0 for plain TF;
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
    python benchmarks/startup.py --runs tiny:1x1,tiny:8x4
    python benchmarks/startup.py --runs large:8x4:build
    python benchmarks/startup.py --runs tiny:8x4,tiny:8x4:grappler=default,tiny:8x4:grappler=off
    python benchmarks/startup.py --runs tiny:8x1,tiny:8x1:mirrored
    python benchmarks/startup.py --runs tiny:8x1,tiny:8x4,tiny:8x4:accumulation=copies
    python benchmarks/startup.py --runs tiny:8x1:mirrored,tiny:8x1:processes

A layout RxM runs R replicas (data parallel, one logical CPU device each)
and M micro-batches; the plain TF run uses one micro-batch as its batch.
':mirrored' builds the same model, optimizer and input under
tf.distribute.MirroredStrategy with R replicas instead (M must be 1); an
EPL row of the same layout after it is compared with it.
':grappler=default|fast|off' picks EPL's `optimizer.grappler` preset, or
turns Grappler off in the user's session config; without it, EPL's default
preset (and TensorFlow's own for plain TF and MirroredStrategy).
':accumulation=loop|copies' picks pipeline.accumulation (default loop,
the micro-batches as a while-loop; copies, a copy per micro-batch); an EPL row with M > 1
after an EPL Rx1 row of the same R is compared with it.
':processes' runs R x M as R processes of one logical CPU device each
(`epl-launch --processes_per_worker R`, in a private network namespace when
one can be made), each building and timing its own replica: the row shows
the slowest process's phases and ops, the CPU time and peak RSS summed over
the processes; a line below gives each process's time to step 1 and CPU
time, and the job's wall time including every process's Python and
TensorFlow start. On a machine with fewer cores than R the processes
compete for them: what stays flat as R grows is each process's graph and
CPU time, not its seconds.
"""
import argparse
import json
import os
import statistics
import subprocess
import resource
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from benchmarks import fresh_process  # pylint: disable=wrong-import-position
from benchmarks import horovod_data_parallel  # pylint: disable=wrong-import-position
from benchmarks import smoke  # pylint: disable=wrong-import-position
from benchmarks import verdict  # pylint: disable=wrong-import-position

SMOKE = ["--runs", "tiny:2x1:mirrored,tiny:2x1,tiny:2x2,tiny:2x1:processes",
         "--in_process"]


def _rss_mib():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def measure(config, replicas, micro_batches, plain, build_only, batch_size,
            grappler="", mirrored=False, accumulation=""):
  """One run in this process; returns a dict of seconds, op counts, RSS.
  `grappler`: "" (the default), an EPL preset ("default", "fast"), or "off"
  (the session config turns TF's graph optimiser off); with `mirrored` the
  model is built under MirroredStrategy (plain TF); `accumulation`: ""
  (EPL's default), "loop" or "copies" (pipeline.accumulation)."""
  import logging  # pylint: disable=g-import-not-at-top
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  from examples.bert_large import train  # pylint: disable=g-import-not-at-top
  tf.disable_eager_execution()
  logging.getLogger("epl").setLevel(logging.WARNING)
  os.environ.pop("EPL_OPTIMIZER_GRAPPLER", None)
  if grappler in ("default", "fast"):
    os.environ["EPL_OPTIMIZER_GRAPPLER"] = grappler
  os.environ.pop("EPL_PIPELINE_ACCUMULATION", None)
  if accumulation:
    os.environ["EPL_PIPELINE_ACCUMULATION"] = accumulation
  flags = train.make_flags(
      config=config, parallel="none" if plain else "data",
      num_cpu_devices=0 if plain else replicas,
      num_micro_batch=1 if plain else micro_batches, batch_size=batch_size,
      steps=1000, dropout=True)
  result = {}
  cpu_start = time.process_time()
  graph = tf.Graph()
  with graph.as_default():
    start = time.perf_counter()
    if mirrored:
      from benchmarks import bert_throughput  # pylint: disable=g-import-not-at-top
      train_op, _ = bert_throughput.mirrored_train_step(
          train.resolve_flags(flags), replicas)
      handles = {"train_op": train_op}
    else:
      handles = train.build_graph(flags)
    result["build"] = time.perf_counter() - start
    result["user_ops"] = len(graph.get_operations())
    result["rewrite"] = 0.0
    if not plain:
      from epl.parallel import engine  # pylint: disable=g-import-not-at-top
      start = time.perf_counter()
      engine.ensure_rewritten(graph)
      result["rewrite"] = time.perf_counter() - start
    result["ops"] = len(graph.get_operations())
    if not build_only:
      init = tf.global_variables_initializer()
      start = time.perf_counter()
      session_config = tf.ConfigProto()
      if mirrored:
        session_config.device_count["CPU"] = replicas
      session_config.graph_options.rewrite_options.disable_meta_optimizer = (
          grappler == "off")
      sess = tf.Session(config=session_config)
      sess.run(init)
      result["session"] = time.perf_counter() - start
      times = []
      for _ in range(2):
        start = time.perf_counter()
        sess.run(handles["train_op"])
        times.append(time.perf_counter() - start)
      result["step"] = times[1]
      result["setup"] = max(0.0, times[0] - times[1])
      sess.close()
  result["cpu"] = time.process_time() - cpu_start
  result["peak_rss_mib"] = _rss_mib()
  if not plain:
    # The steps ran with EPL on; the next row (--in_process) starts plain.
    import epl  # pylint: disable=g-import-not-at-top
    epl.shutdown()
  return result


def _child(args, config, layout, plain, build_only, grappler="",
           mirrored=False, accumulation=""):
  replicas, micro_batches = (int(x) for x in layout.split("x"))
  if mirrored and micro_batches != 1:
    raise SystemExit("--runs: MirroredStrategy has no micro-batches; use "
                     "%s:%dx1:mirrored" % (config, replicas))
  return fresh_process.measure_in_child(
      os.path.abspath(__file__),
      [config, replicas, micro_batches, plain, build_only, args.batch_size,
       grappler, mirrored, accumulation], args.timeout,
      in_process=measure if args.in_process else None)


def measure_processes(args, config, layout, build_only, grappler=""):
  """R x M (`layout`) as R processes of one device each, started by
  epl-launch --processes_per_worker R; each process runs `measure` as one
  replica of M micro-batches (answering as `--child` does). Returns the
  slowest process's result with the CPU time and peak RSS summed over the
  processes, "per_process" (each one's time to step 1) and "wall" (the
  whole job's seconds, Python and TensorFlow start included)."""
  replicas, micro_batches = (int(x) for x in layout.split("x"))
  child = [config, 1, micro_batches, False, build_only, args.batch_size,
           grappler, False]
  command = horovod_data_parallel.isolated([
      sys.executable, "-m", "epl.tools.launcher", "--num_workers", "1",
      "--gpu_per_worker", str(replicas), "--processes_per_worker",
      str(replicas), "--cpu", "--", sys.executable,
      os.path.abspath(__file__), "--child", json.dumps(child)],
                                              own_pids=True)
  start = time.perf_counter()
  done = subprocess.run(
      command, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout,
      check=False, env=dict(os.environ, PYTHONPATH=ROOT,
                            TF_CPP_MIN_LOG_LEVEL="2"))
  wall = time.perf_counter() - start
  answers = {}
  for line in done.stdout.splitlines():
    prefix, _, rest = line.partition("] ")
    if prefix.startswith("[worker ") and rest.startswith("{"):
      answers[int(prefix.split()[1])] = json.loads(rest)
  if done.returncode or len(answers) != replicas:
    sys.stderr.write((done.stdout + done.stderr)[-4000:])
    raise RuntimeError("%s:%s:processes failed (status %d, %d of %d "
                       "processes answered)" % (config, layout,
                                                done.returncode, len(answers),
                                                replicas))
  results = [answers[i] for i in range(replicas)]
  result = dict(max(results, key=_total))
  result["cpu"] = sum(r["cpu"] for r in results)
  result["peak_rss_mib"] = sum(r["peak_rss_mib"] for r in results)
  result["per_process"] = [_total(r) for r in results]
  result["per_process_cpu"] = [r["cpu"] for r in results]
  result["wall"] = wall
  return result


def _runs(text):
  """[(config, build_only, [(layout, grappler, mirrored, accumulation,
  processes)])]
  from items such as 'tiny:8x4', 'tiny:8x4:grappler=off',
  'tiny:8x4:accumulation=copies', 'large:8x4:build', 'tiny:8x1:mirrored',
  'tiny:8x1:processes', in the order given."""
  runs = []
  for item in text.split(","):
    config, layout, *options = item.split(":")
    grappler = accumulation = ""
    for option in options:
      if option.startswith("grappler="):
        grappler = option.split("=", 1)[1]
      elif option.startswith("accumulation="):
        accumulation = option.split("=", 1)[1]
      elif option not in ("build", "mirrored", "processes"):
        raise SystemExit("--runs: unknown option %r in %r; use build, "
                         "mirrored, processes, grappler=default|fast|off or "
                         "accumulation=loop|copies" % (option, item))
    key = (config, "build" in options)
    if not runs or runs[-1][:2] != key:
      runs.append(key + ([],))
    runs[-1][2].append((layout, grappler, "mirrored" in options,
                        accumulation, "processes" in options))
  return runs


PHASES = ("build", "rewrite", "session", "setup", "step")


def _total(result):
  return sum(result.get(p, 0.0) for p in PHASES)


def _row(label, result):
  cells = ["%8.1f" % result.get(p, float("nan")) for p in PHASES]
  return "%-22s %s %9.1f %9.1f %9d %9.0f" % (
      label, " ".join(cells), _total(result), result["cpu"], result["ops"],
      result["peak_rss_mib"])


def _print_processes(result, layout, plain, mirrored):
  """The processes-per-device row of `layout`, its ratios to plain TF and
  (when measured) MirroredStrategy, and each process's time to step 1."""
  replicas = int(layout.split("x")[0])
  print(_row("EPL %s, %d processes" % (layout, replicas), result),
        flush=True)
  print("%-22s to step 1 %.2fx plain (CPU time over all processes %.2fx), "
        "ops per process %.1fx, peak RSS over all processes %.2fx" % (
            "  ratio", _total(result) / _total(plain),
            result["cpu"] / plain["cpu"], result["ops"] / plain["ops"],
            result["peak_rss_mib"] / plain["peak_rss_mib"]), flush=True)
  if mirrored is not None:
    versus = _total(result) / _total(mirrored)
    print("%-22s to step 1 %.2fx Mirrored with as many replicas (lower is "
          "better): %s" % ("  vs Mirrored", versus, verdict.verdict(
              versus, higher_is_better=False)), flush=True)
  times = result["per_process"]
  cpu = statistics.median(result["per_process_cpu"])
  print("%-22s to step 1 per process min %.1f, median %.1f, max %.1f s; "
        "CPU time per process median %.1f s (%.2fx plain); job %.1f s with "
        "each process's Python and TensorFlow start (%d processes share %d "
        "cores)" % (
            "  processes", min(times), statistics.median(times), max(times),
            cpu, cpu / plain["cpu"], result["wall"], replicas,
            os.cpu_count()), flush=True)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
      "--runs", default="tiny:1x1,tiny:8x1:mirrored,tiny:8x1,"
      "tiny:8x1:processes,tiny:4x4,tiny:8x4,tiny:8x4:accumulation=copies,"
      "tiny:8x4:grappler=default,tiny:8x4:grappler=off,"
      "base:1x1,base:4x4,base:8x4:build,large:8x4:build",
      help="config:RxM items; ':build' = build and rewrite only (BERT-Base "
      "8x4 trains 8 copies of 110M parameters with Adam: 10+ GiB); "
      "':mirrored' = MirroredStrategy over R devices instead of EPL; "
      "':processes' = EPL as R processes of one device each; "
      "':grappler=default|fast|off' = EPL's optimizer.grappler preset, or "
      "rewrite_options.disable_meta_optimizer in the session config; "
      "':accumulation=loop|copies' = pipeline.accumulation")
  parser.add_argument("--batch_size", type=int, default=2,
                      help="micro-batch per replica (and plain TF's batch)")
  parser.add_argument("--timeout", type=int, default=3600)
  parser.add_argument("--in_process", action="store_true",
                      help="every row in this process (peak RSS is then "
                      "the largest so far)")
  parser.add_argument("--child", help=argparse.SUPPRESS)
  args = smoke.parse_args(parser, argv, SMOKE)
  if args.child:
    fresh_process.answer_child(args.child, measure)
    return 0
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  print("EPL start-up: BERT (examples/bert_large), data parallel on R "
        "logical CPU devices x M micro-batches, micro-batch %d; TensorFlow "
        "%s, %d CPU cores; each row %s; seconds." % (
            args.batch_size, tf.__version__, os.cpu_count(),
            "in this process (--in_process)" if args.in_process else
            "a fresh process"), flush=True)
  header = "%-22s %s %9s %9s %9s %9s" % (
      "", " ".join("%8s" % p for p in PHASES), "to step 1", "CPU s", "ops",
      "RSS MiB")
  for config, build_only, layouts in _runs(args.runs):
    print("\nBERT %s%s" % (config, " (build and rewrite only)"
                           if build_only else ""))
    print(header)
    plain = _child(args, config, "1x1", True, build_only)
    print(_row("plain TF", plain), flush=True)
    mirrored_results = {}
    single_micro_batch = {}
    for layout, grappler, mirrored, accumulation, processes in layouts:
      if processes:
        _print_processes(measure_processes(args, config, layout, build_only,
                                           grappler), layout, plain,
                         mirrored_results.get(layout))
        continue
      if mirrored:
        mirrored_results[layout] = result = _child(
            args, config, layout, True, build_only, grappler, True)
        print(_row("Mirrored %s" % layout, result), flush=True)
        print("%-22s to step 1 %.2fx plain (CPU time %.2fx), ops %.1fx, "
              "peak RSS %.2fx" % (
                  "  ratio", _total(result) / _total(plain),
                  result["cpu"] / plain["cpu"], result["ops"] / plain["ops"],
                  result["peak_rss_mib"] / plain["peak_rss_mib"]),
              flush=True)
        continue
      epl_result = _child(args, config, layout, False, build_only, grappler,
                          accumulation=accumulation)
      replicas, micro_batches = layout.split("x")
      if micro_batches == "1" and not grappler:
        single_micro_batch[replicas] = epl_result
      print(_row("EPL %s%s%s" % (
          layout, ", grappler " + grappler if grappler else "",
          ", " + (accumulation or "loop") if micro_batches != "1" else ""),
                 epl_result), flush=True)
      print("%-22s to step 1 %.2fx plain (CPU time %.2fx), EPL rewrite %.2fx "
            "plain build, ops %.1fx, peak RSS %.2fx" % (
                "  ratio", _total(epl_result) / _total(plain),
                epl_result["cpu"] / plain["cpu"],
                epl_result["rewrite"] / plain["build"],
                epl_result["ops"] / plain["ops"],
                epl_result["peak_rss_mib"] / plain["peak_rss_mib"]),
            flush=True)
      one = single_micro_batch.get(replicas)
      if micro_batches != "1" and one is not None:
        print("%-22s to step 1 %.2fx EPL %sx1, ops %.2fx" % (
            "  vs 1 micro-batch", _total(epl_result) / _total(one),
            replicas, epl_result["ops"] / one["ops"]), flush=True)
      mirrored = mirrored_results.get(layout)
      if mirrored is not None:
        versus = _total(epl_result) / _total(mirrored)
        print("%-22s to step 1 %.2fx Mirrored with as many replicas (lower "
              "is better): %s" % ("  vs Mirrored", versus, verdict.verdict(
                  versus, higher_is_better=False)), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
