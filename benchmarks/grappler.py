"""What each of Grappler's optimizers costs and buys on EPL's graph of BERT.

Grappler (TensorFlow's graph optimiser) runs before the first step over the
whole graph EPL hands the session, which for R replicas x M micro-batches is
R x M times the user's. This benchmark builds EPL's graph of BERT (data
parallel on R logical CPU devices, M micro-batches), then, each setting in a
fresh process:

  setup   - the first training step's time less a later step's (placement,
            Grappler, partitioning, executors);
  step    - the median of the later steps;
  grappler - the time Grappler itself reports for the training step's
            graph (TF_CPP_VMODULE=meta_optimizer=1), with its node count
            before and after.
Each also in process CPU time (all threads), less disturbed than wall time
when other jobs share the machine; the ratios to the default row are of CPU
time.

The "default" run also gives the per-optimizer table: each optimizer's time
and the nodes it removed, summed over Grappler's iterations.

Settings: "default" (TensorFlow's), "off" (disable_meta_optimizer),
"epl:<preset>" (the session EPL opens with `optimizer.grappler` = preset),
"no:<optimizer>" (the default with that one optimizer switched off; names as
in the table below).

    python benchmarks/grappler.py                      # tiny 8x4, all settings
    python benchmarks/grappler.py --settings default,off,epl:fast
"""
import argparse
import os
import re
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from benchmarks import fresh_process  # pylint: disable=wrong-import-position

# Optimizer names as Grappler logs them -> how to switch each one off.
SWITCH_OFF = {
    "model_pruner": ("disable_model_pruning", True),
    "implementation_selector": ("implementation_selector", "OFF"),
    "common_subgraph_elimination": ("common_subgraph_elimination", "OFF"),
    "constant_folding": ("constant_folding", "OFF"),
    "arithmetic_optimizer": ("arithmetic_optimization", "OFF"),
    "layout": ("layout_optimizer", "OFF"),
    "remapper": ("remapping", "OFF"),
    "loop_optimizer": ("loop_optimization", "OFF"),
    "dependency_optimizer": ("dependency_optimization", "OFF"),
    "memory_optimizer": ("memory_optimization", "NO_MEM_OPT"),
    "tfg_optimizer": ("disable_tfg_optimizer", True),
    "second_iteration": ("meta_optimizer_iterations", "ONE"),
}

DEFAULT_SETTINGS = ["default", "off", "epl:fast"] + [
    "no:" + name for name in SWITCH_OFF]

_RESULT = re.compile(
    r"meta_optimizer\.cc:\d+\] (\w+)[^:]*: Graph size after: (\d+) nodes "
    r"\((-?\d+)\).*time = ([\d.]+)ms")
_ITEM = re.compile(r"Starting optimization for grappler item: (\S+)")
# After this line, an item's results are of its function library.
_MAIN_DONE = "Optimized main graph"


def parse_grappler_log(text):
  """Per item Grappler optimised, in the order it ran them: its name,
  {optimizer: [ms, nodes removed]} and its node count before and after."""
  items = []
  in_main_graph = False
  for line in text.splitlines():
    item_match = _ITEM.search(line)
    if item_match:
      items.append({"name": item_match.group(1), "optimizers": {},
                    "before": None, "after": None})
      in_main_graph = True
      continue
    if _MAIN_DONE in line:
      in_main_graph = False
    match = _RESULT.search(line)
    if not match or not in_main_graph:
      continue
    name, after, change, ms = match.groups()
    item = items[-1]
    if item["before"] is None:
      item["before"] = int(after) - int(change)
    item["after"] = int(after)
    cost = item["optimizers"].setdefault(name, [0.0, 0])
    cost[0] += float(ms)
    cost[1] -= int(change)
  return [item for item in items if item["before"] is not None]


def _rewriter_setting(setting, rewrite_options):
  from tensorflow.core.protobuf import rewriter_config_pb2  # pylint: disable=g-import-not-at-top
  if setting == "off":
    rewrite_options.disable_meta_optimizer = True
  elif setting.startswith("no:"):
    field, value = SWITCH_OFF[setting[3:]]
    if isinstance(value, str):
      enum = rewriter_config_pb2.RewriterConfig.DESCRIPTOR.fields_by_name[
          field].enum_type
      value = enum.values_by_name[value].number
    setattr(rewrite_options, field, value)


def _timed_step(sess, train_op):
  """(wall seconds, process CPU seconds over all threads) of one step."""
  start, start_cpu = time.perf_counter(), time.process_time()
  sess.run(train_op)
  return time.perf_counter() - start, time.process_time() - start_cpu


def measure(config, replicas, micro_batches, batch_size, setting, steps):
  """One setting in this process: seconds, op counts, Grappler's log."""
  log_file = tempfile.TemporaryFile(mode="w+")
  os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
  os.environ["TF_CPP_VMODULE"] = "meta_optimizer=1"
  os.dup2(log_file.fileno(), 2)
  import logging  # pylint: disable=g-import-not-at-top
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  from examples.bert_large import train  # pylint: disable=g-import-not-at-top
  from epl.parallel import engine  # pylint: disable=g-import-not-at-top
  tf.disable_eager_execution()
  logging.getLogger("epl").setLevel(logging.WARNING)
  # The other settings change TensorFlow's own preset.
  os.environ["EPL_OPTIMIZER_GRAPPLER"] = (
      setting[4:] if setting.startswith("epl:") else "default")
  flags = train.make_flags(
      config=config, parallel="data", num_cpu_devices=replicas,
      num_micro_batch=micro_batches, batch_size=batch_size, steps=1000,
      dropout=True)
  result = {}
  graph = tf.Graph()
  with graph.as_default():
    handles = train.build_graph(flags)
    engine.ensure_rewritten(graph)
    result["ops"] = len(graph.get_operations())
    init = tf.global_variables_initializer()
    session_config = tf.ConfigProto()
    _rewriter_setting(setting, session_config.graph_options.rewrite_options)
    with tf.Session(config=session_config) as sess:
      sess.run(init)
      log_file.flush()
      log_start = log_file.tell()
      first, first_cpu = _timed_step(sess, handles["train_op"])
      times, cpu_times = zip(*(_timed_step(sess, handles["train_op"])
                               for _ in range(steps)))
  result["step"] = statistics.median(times)
  result["setup"] = max(0.0, first - result["step"])
  result["step_cpu"] = statistics.median(cpu_times)
  result["setup_cpu"] = max(0.0, first_cpu - result["step_cpu"])
  log_file.flush()
  log_file.seek(log_start)
  items = parse_grappler_log(log_file.read())
  # The session's graph is the item "tf_graph"; tf.data optimises its
  # datasets' graphs with Grappler too, under other names.
  session_items = [item for item in items if item["name"] == "tf_graph"]
  result["grappler"] = max(session_items, key=lambda item: item["before"]) \
      if session_items else None
  return result


def _row(setting, result, default):
  grappler = result["grappler"]
  if grappler:
    ms = sum(cost[0] for cost in grappler["optimizers"].values())
    nodes = "%9d %9d" % (grappler["before"], grappler["after"])
  else:
    ms, nodes = 0.0, "%9s %9s" % ("-", "-")
  ratio = ""
  if default is not None:
    ratio = "%8.2fx %8.2fx" % (result["setup_cpu"] / default["setup_cpu"],
                               result["step_cpu"] / default["step_cpu"])
  return "%-30s %8.1f %8.1f %8.3f %8.3f %9.1f %s %s" % (
      setting, result["setup"], result["setup_cpu"], result["step"],
      result["step_cpu"], ms / 1000.0, nodes, ratio)


def _optimizer_table(grappler):
  lines = ["%-30s %9s %14s" % ("optimizer (default run)", "seconds",
                               "nodes removed")]
  ranked = sorted(grappler["optimizers"].items(), key=lambda kv: -kv[1][0])
  for name, (ms, removed) in ranked:
    lines.append("%-30s %9.2f %14d" % (name, ms / 1000.0, removed))
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="tiny")
  parser.add_argument("--layout", default="8x4",
                      help="RxM: replicas x micro-batches")
  parser.add_argument("--settings", default=",".join(DEFAULT_SETTINGS))
  parser.add_argument("--batch_size", type=int, default=2,
                      help="micro-batch per replica")
  parser.add_argument("--steps", type=int, default=10,
                      help="timed steps after the first")
  parser.add_argument("--timeout", type=int, default=1800)
  parser.add_argument("--child", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    fresh_process.answer_child(args.child, measure)
    return 0
  replicas, micro_batches = (int(x) for x in args.layout.split("x"))
  print("Grappler on EPL's graph: BERT %s, data parallel %d replicas x %d "
        "micro-batches of %d on logical CPU devices, %d CPU cores; each row "
        "a fresh process; seconds; ratios to the default row." % (
            args.config, replicas, micro_batches, args.batch_size,
            os.cpu_count()), flush=True)
  print("%-30s %8s %8s %8s %8s %9s %9s %9s %9s %9s" % (
      "setting", "setup", "CPU", "step", "CPU", "grappler", "nodes in",
      "nodes out", "setup CPU", "step CPU"), flush=True)
  default = None
  tables = []
  for setting in args.settings.split(","):
    result = fresh_process.measure_in_child(
        os.path.abspath(__file__),
        [args.config, replicas, micro_batches, args.batch_size, setting,
         args.steps], args.timeout)
    if setting == "default":
      default = result
      print(_row(setting, result, None), flush=True)
      if result["grappler"]:
        tables.append(_optimizer_table(result["grappler"]))
    else:
      print(_row(setting, result, default), flush=True)
  for table in tables:
    print()
    print(table)
  return 0


if __name__ == "__main__":
  sys.exit(main())
