"""IO slicing: each worker reads its own share of the input files.

With `io.slicing` on, a file-based tf.data input built from a list of files
(`tf.data.TFRecordDataset(files)`, `TextLineDataset(files)`,
`FixedLengthRecordDataset(files, ...)`, or `tf.data.Dataset.list_files(
pattern)`, whose pattern is expanded when the graph is built) reads on each
worker only that worker's files, as the original EPL did. The replicas of
one worker share its input pipeline and take consecutive batches of it, so
files are split between workers, in proportion to the replicas each holds
(usually equal). Remove your own sharding when this is on.

Files are dealt out round-robin: with P parts (one per worker for equal
replica counts), file i goes to part i mod P. When the count does not
divide evenly, `io.drop_last_files` drops the files left over and
`io.unbalanced_io_slicing` lets some workers read one file more; with
neither, or with fewer files than parts, slicing is an error that says so.
A file list only known when the graph runs (a tensor computed from other
ops) is not sliced; EPL logs that it was left alone.

An input that reads data the script holds in memory
(`Dataset.from_tensor_slices`, `from_tensors`) and is not sharded gives
every worker the same batches: when the job has several workers, making
an iterator of one logs a warning that names the dataset and the fix
(`warn_unsharded_input`).

`epl.hooks` routes the dataset constructors here, with the planner
(`epl.parallel.plan.planner.make_plan`, a layer above capture) that tells the
replicas of each worker; this module holds the logic.
"""
import collections
import logging
import math
import weakref

import numpy as np
import tensorflow as tf

from epl import user_warnings
from epl.env import Env
from epl.ir.graph_state import state_of
from epl.ir.taskgraph import TaskGraph

logger = logging.getLogger("epl")

# Dataset ops whose elements are data the script holds in memory: the same
# on every worker unless the script made them differ.
_IN_MEMORY_SOURCES = frozenset(["TensorSliceDataset", "TensorDataset",
                                "SparseTensorSliceDataset"])
# Dataset ops that read files (each worker may read its own files).
_FILE_READERS = ("TFRecordDataset", "TextLineDataset",
                 "FixedLengthRecordDataset")

# graph -> the reader shares slicing assumed, checked against the plan.
_assumed = weakref.WeakKeyDictionary()


def reader_shares(plan):
  """{worker: number of replicas whose input it reads} from a plan."""
  counts = collections.Counter(
      plan.device_workers[r][0] for r in range(plan.num_replicas))
  return dict(sorted(counts.items()))


def _expected_shares(env, graph, make_plan):
  """Reader shares from the strategies known when the dataset is built."""
  state = state_of(graph)
  taskgraphs = list(state.taskgraphs) if state is not None else []
  if not taskgraphs and env.default_strategy is not None:
    taskgraphs = [TaskGraph(0, env.default_strategy)]
  if taskgraphs:
    try:
      return reader_shares(make_plan(env.cluster, taskgraphs, env.config))
    except (ValueError, NotImplementedError):
      pass  # the rewrite reports it
  return {w: 1 for w in range(env.cluster.worker_num)}


def slice_files(files, shares, worker, drop_last=False, unbalanced=False):
  """The files of `worker` when `shares` ({worker: weight}) read `files`."""
  files = list(files)
  if worker not in shares:
    return []
  divisor = 0
  for weight in shares.values():
    divisor = math.gcd(divisor, weight)
  parts = {w: s // divisor for w, s in shares.items()}
  total = sum(parts.values())
  if total == 1:
    return files
  if len(files) < total:
    raise ValueError(
        "io.slicing: %d input file(s) cannot be split over %d reader(s) "
        "(workers %s, in proportion to their replicas): every worker needs "
        "at least one file. Use at least %d files (split your data into "
        "more files), or turn io.slicing off and shard the input yourself." %
        (len(files), total, sorted(shares), total))
  remainder = len(files) % total
  if remainder and not unbalanced:
    if not drop_last:
      raise ValueError(
          "io.slicing: %d input files do not split evenly over %d "
          "reader(s) (workers %s); %d are left over. Set "
          "io.drop_last_files to drop them, or io.unbalanced_io_slicing to "
          "let some workers read one file more." % (
              len(files), total, sorted(shares), remainder))
    files = files[:len(files) - remainder]
  start = sum(p for w, p in parts.items() if w < worker)
  mine = range(start, start + parts[worker])
  return [f for i, f in enumerate(files) if i % total in mine]


def _static_files(filenames):
  """The file list as a Python list, or None when only known at run time."""
  if isinstance(filenames, tf.data.Dataset):
    return None
  if isinstance(filenames, (str, bytes)):
    return [filenames]
  if isinstance(filenames, (list, tuple, np.ndarray)):
    values = list(np.asarray(filenames).reshape([-1]))
  elif isinstance(filenames, tf.Tensor):
    value = tf.get_static_value(filenames)
    if value is None:
      return None
    values = list(np.asarray(value).reshape([-1]))
  else:
    return None
  return [v.decode() if isinstance(v, bytes) else str(v) for v in values]


def _active_env():
  if not Env.initialised():
    return None
  env = Env.get()
  if not env.config.io.slicing or env.cluster.worker_num == 1:
    return None
  return env


def _building_function():
  graph = tf.compat.v1.get_default_graph()
  return getattr(graph, "building_function", False)


def maybe_slice(filenames, what, make_plan):
  """`filenames` reduced to this worker's share when io.slicing is on;
  `make_plan(cluster, taskgraphs, config)` is the planner."""
  env = _active_env()
  if env is None:
    return filenames
  files = _static_files(filenames)
  if files is None:
    if not _building_function():
      logger.warning("io.slicing: %s reads a file list known only at run "
                     "time; it is not sliced. Pass the list of files (or "
                     "use tf.data.Dataset.list_files).", what)
    return filenames
  graph = tf.compat.v1.get_default_graph()
  shares = _expected_shares(env, graph, make_plan)
  config = env.config.io
  mine = slice_files(files, shares, env.cluster.worker_index,
                     drop_last=config.drop_last_files,
                     unbalanced=config.unbalanced_io_slicing)
  assumed = _assumed.setdefault(graph, [])
  if shares not in assumed:
    assumed.append(shares)
  logger.info("io.slicing: worker %d reads %d of %d file(s) for %s: %s",
              env.cluster.worker_index, len(mine), len(files), what,
              mine[:4] + (["..."] if len(mine) > 4 else []))
  return mine


def list_files(original, make_plan, file_pattern, shuffle=None, seed=None,
               name=None):
  """`Dataset.list_files` over this worker's share of the matching files
  (`make_plan` as for `maybe_slice`)."""
  env = _active_env()
  patterns = _static_files(file_pattern) if env is not None else None
  if patterns is None:
    return original(file_pattern, shuffle=shuffle, seed=seed, name=name)
  files = sorted(f for pattern in patterns for f in tf.io.gfile.glob(pattern))
  if not files:
    raise ValueError("io.slicing: no file matches %r." % (file_pattern,))
  mine = maybe_slice(files, "Dataset.list_files(%r)" % (file_pattern,),
                     make_plan)
  dataset = tf.data.Dataset.from_tensor_slices(mine)
  if shuffle is None or shuffle:
    dataset = dataset.shuffle(len(mine), seed=seed)
  return dataset


def check_rewritten(graph):
  """Once the graph is rewritten: raises if slicing assumed other readers
  than the plan has."""
  assumed = _assumed.get(graph)
  if not assumed:
    return
  state = state_of(graph)
  result = state.rewrite_result if state is not None else None
  if result is None:
    return
  del _assumed[graph]
  actual = reader_shares(result.plan)
  wrong = [s for s in assumed if s != actual]
  if wrong:
    raise ValueError(
        "io.slicing split the input files between workers %s, but the "
        "model's plan reads input on workers %s (replicas per worker). "
        "Build the input pipeline after the strategy scopes (or call "
        "epl.set_default_strategy first) so that slicing knows the plan." %
        (wrong[0], actual))


def _dataset_ops(dataset):
  """The dataset ops `dataset` is built of, from the graph's side (the
  datasets inside functions such as `interleave`'s are not seen)."""
  seen, pending = {}, [tf.data.experimental.to_variant(dataset).op]
  while pending:
    op = pending.pop()
    if op.name in seen:
      continue
    seen[op.name] = op
    pending.extend(t.op for t in op.inputs if t.dtype == tf.variant)
  return list(seen.values())


def _where_built(op):
  """`file:line` of the user's code that built `op`, or its name."""
  for frame in reversed(op.traceback):
    if user_warnings.is_user_file(frame.filename):
      return "%s:%d" % (frame.filename, frame.lineno)
  return op.name


def warn_unsharded_input(dataset):
  """Warns, in a job of several workers, when `dataset` (an iterator is
  being made of it) reads data held in memory and nothing shards it: every
  worker would then train on the same batches."""
  if not Env.initialised() or Env.get().cluster.worker_num == 1:
    return
  ops = _dataset_ops(dataset)
  if any(op.type == "ShardDataset" or op.type.startswith(_FILE_READERS)
         for op in ops):
    return
  sources = [op for op in ops if op.type in _IN_MEMORY_SOURCES]
  if not sources:
    return
  cluster = Env.get().cluster
  logger.warning(
      "EPL: every one of the %d workers reads the same batches: the input "
      "dataset %s (built at %s) holds data in memory and is not sharded, so "
      "the workers train on identical batches. Shard it before batching: "
      "dataset.shard(epl.Env.get().cluster.worker_num, "
      "epl.Env.get().cluster.worker_index) (this is worker %d), or read "
      "the data from files with the config key io.slicing on. If each "
      "worker made different data, ignore this.",
      cluster.worker_num, sources[0].type, _where_built(sources[0]),
      cluster.worker_index)
