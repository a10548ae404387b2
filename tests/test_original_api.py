"""The original EPL's public API as its users call it (issue 20, item 5):
`epl.init` and `epl.Env`, collections, nesting errors, the third pipeline
schedule, the cluster and its VirtualDevices, the profiler's arguments and
epl-launch's flags."""
import json
import logging
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import epl
from epl.parallel.plan import pipeline_order
from epl.profiler import flops
from epl.profiler import profiler
from epl.tools import launcher
from epl.tools import timeline
from tests import multiworker
from tests import training

F, B = "forward", "backward"


# ----------------------------------------------------------- init and Env


def test_env_before_init_is_the_one_init_fills_in():
  epl.Env.install(None)
  env = epl.Env.get()
  assert env.config is None and env.cluster is None
  assert not epl.Env.initialised()
  assert epl.env.Env is epl.Env
  epl.init(epl.Config({"pipeline.num_micro_batch": 3}))
  assert epl.Env.get() is env
  assert env.config.pipeline.num_micro_batch == 3
  # A later epl.init starts the same object afresh, as the original did.
  env.config.pipeline.num_micro_batch = 5
  epl.init()
  assert epl.Env.get() is env and env.config.pipeline.num_micro_batch == 1


def test_init_again_resets_the_default_graph_outside_a_graph_block():
  epl.init()
  kept = tf.constant(1.0, name="built_before_the_second_init")
  epl.init()
  assert kept.graph is not tf.compat.v1.get_default_graph()
  assert not tf.compat.v1.get_default_graph().get_operations()
  # Inside a `with graph.as_default():` block the graph is the user's.
  with tf.Graph().as_default() as graph:
    tf.constant(1.0, name="inside")
    epl.init()
    assert tf.compat.v1.get_default_graph() is graph
    assert graph.get_operation_by_name("inside")


def _session_of_merged_step(config, batch_size):
  """epl.init(config), data parallel; a graph whose loss is merged over
  replicas and micro-batches, and an initialised Session of it. Returns
  (session, train_op, loss, trainable variable names)."""
  epl.init(epl.Config(config))
  epl.set_default_strategy(epl.replicate(1))
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.input_batch(batch_size)
    loss = tf.reduce_mean(tf.square(training.layers_model(x) - y))
    epl.add_to_collection(loss, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)
    train_op = training.OPTIMIZERS["adam"]().minimize(loss)
    names = [v.op.name for v in tf.compat.v1.trainable_variables()]
    session = tf.compat.v1.Session(graph=graph)
    session.run(tf.compat.v1.global_variables_initializer())
  return session, train_op, loss, names


_FIRST = {"cluster.num_cpu_devices": 4, "pipeline.num_micro_batch": 2}


def _train_first_graph(interleaved):
  """Trains a graph of config _FIRST 4 steps; with `interleaved`, another
  config's graph is built and trained between its steps (by a later
  epl.init, as a script comparing configs in one process does). Returns
  (trainable values by name, losses of the first graph)."""
  session, train_op, loss, names = _session_of_merged_step(_FIRST, 2)
  losses = [session.run([train_op, loss])[1]]
  if interleaved:
    other = _session_of_merged_step({"cluster.num_cpu_devices": 2}, 8)
    other[0].run(other[1:3])
  for _ in range(3):
    losses.append(session.run([train_op, loss])[1])
    if interleaved:
      other[0].run(other[1:3])
  values = training.read_variables(session, session.graph, names)
  session.close()
  return values, losses


def test_graph_rewritten_before_a_later_init_keeps_its_config():
  # Before, the first graph's state counted as none after the second
  # epl.init: its fetched loss was replica 0's last micro-batch's instead
  # of the mean over its replicas and micro-batches.
  alone, alone_losses = _train_first_graph(interleaved=False)
  interleaved, interleaved_losses = _train_first_graph(interleaved=True)
  training.assert_close(interleaved, alone)
  np.testing.assert_allclose(interleaved_losses, alone_losses, atol=1e-5)


def test_step_never_run_before_a_later_init_is_refused():
  epl.init(epl.Config({"cluster.num_cpu_devices": 2}))
  epl.set_default_strategy(epl.replicate(1))
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.input_batch(8)
    loss = tf.reduce_mean(tf.square(training.layers_model(x) - y))
    train_op = training.OPTIMIZERS["sgd"]().minimize(loss)
    init = tf.compat.v1.global_variables_initializer()
  epl.init(epl.Config({"cluster.num_cpu_devices": 4}))
  with tf.compat.v1.Session(graph=graph) as session:
    with pytest.raises(RuntimeError, match="earlier epl.init.*once per "
                       "process"):
      session.run(init)
      session.run(train_op)


def test_first_init_keeps_what_was_built_before_it():
  epl.Env.install(None)
  tf.compat.v1.reset_default_graph()
  before = tf.constant(1.0, name="before_init")
  epl.init()
  assert before.graph is tf.compat.v1.get_default_graph()


# ------------------------------------------------------------ collections


def test_add_to_collection_takes_a_list():
  epl.init(epl.Config({"cluster.num_cpu_devices": 2}))
  epl.set_default_strategy(epl.replicate(1))
  with tf.Graph().as_default():
    x, y = training.input_batch(4)
    loss = tf.reduce_mean(tf.square(training.layers_model(x) - y))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    rows = tf.shape(x)[0]
    epl.add_to_collection([rows, tf.reduce_sum(y)],
                          epl.GraphKeys.GLOBAL_SUM_OBJECTS)
    assert len(epl.get_collection(epl.GraphKeys.GLOBAL_SUM_OBJECTS)) == 2
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      _, merged_rows = session.run([train_op, rows])
  assert merged_rows == 8  # 2 replicas x 4 rows


def test_collection_errors_are_the_original_s_and_epl_s():
  epl.init()
  with tf.Graph().as_default():
    tensor = tf.constant(1.0)
    for error in (KeyError, ValueError):
      with pytest.raises(error, match="Unknown EPL collection 'no_such'"):
        epl.add_to_collection(tensor, "no_such")
    with pytest.raises(ValueError, match="a list of them, got 3"):
      epl.add_to_collection([tensor, 3], epl.GraphKeys.GLOBAL_MEAN_OBJECTS)
    # Nothing of a rejected list was added.
    assert not epl.get_collection(epl.GraphKeys.GLOBAL_MEAN_OBJECTS)


@pytest.mark.parametrize("error", [RuntimeError, ValueError])
def test_nesting_errors_are_runtime_and_value_errors(error):
  epl.init()
  with tf.Graph().as_default():
    with epl.replicate(1, name="outer"):
      with pytest.raises(error, match="do not nest"):
        with epl.split(name="inner"):
          pass
  assert issubclass(epl.StrategyNestingError, (RuntimeError, ValueError))


# --------------------------------------------------- PreferBackwardOptimizer


def test_prefer_backward_optimizer_keeps_one_more_forward_in_flight():
  order = pipeline_order.stage_order("PreferBackwardOptimizer", 3, 1, 5)
  f, b = "forward", "backward"
  assert order == [(f, 0), (f, 1), (f, 2), (b, 0), (f, 3), (b, 1), (f, 4),
                   (b, 2), (b, 3), (b, 4)]
  # The last stage runs 1F1B; no stage holds more than all micro-batches.
  assert pipeline_order.warm_up("PreferBackwardOptimizer", 3, 2, 5) == 1
  assert pipeline_order.warm_up("PreferBackwardOptimizer", 3, 0, 3) == 3
  assert [pipeline_order.warm_up("PreferBackward", 3, s, 5)
          for s in range(3)] == [3, 2, 1]
  assert epl.Config({"pipeline.strategy": "preferbackwardoptimizer"}) \
      .pipeline.strategy == "PreferBackwardOptimizer"


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_prefer_backward_optimizer_trains_as_one_device(optimizer):
  micro, micro_batches = 8, 4
  model = training.staged_model((16, 16, 1))
  expected, _, _ = training.train(model, optimizer,
                                  batch_size=micro * micro_batches,
                                  with_epl=False)
  actual, _, _ = training.train(
      model, optimizer, batch_size=micro, default_strategy=False,
      config={"cluster.num_cpu_devices": 3,
              "pipeline.num_micro_batch": micro_batches,
              "pipeline.strategy": "PreferBackwardOptimizer"})
  training.assert_close(actual, expected)
  assert actual["global_step"] == 5


def test_prefer_backward_optimizer_traced_order():
  epl.init(epl.Config({"cluster.num_cpu_devices": 3,
                       "pipeline.num_micro_batch": 4,
                       "pipeline.strategy": "PreferBackwardOptimizer"}))
  with tf.Graph().as_default():
    x, y = training.input_batch(8)
    loss = tf.reduce_mean(tf.square(
        training.staged_model((16, 16, 1))(x) - y))
    train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      _, trace = timeline.trace_step(session, train_op)
  assert trace.order(0) == [(F, 0), (F, 1), (F, 2), (F, 3),
                            (B, 0), (B, 1), (B, 2), (B, 3)]
  assert trace.order(1) == [(F, 0), (F, 1), (F, 2), (B, 0), (F, 3),
                            (B, 1), (B, 2), (B, 3)]
  assert trace.order(2) == [(F, 0), (B, 0), (F, 1), (B, 1), (F, 2), (B, 2),
                            (F, 3), (B, 3)]


# --------------------------------------------------------------- Cluster


def _two_stages_model():
  x, y = training.input_batch(8)
  loss = tf.reduce_mean(tf.square(training.staged_model()(x) - y))
  return tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)


def test_virtual_devices_one_per_stage():
  epl.init(epl.Config({"cluster.num_cpu_devices": 4,
                       "pipeline.num_micro_batch": 2}))
  cluster = epl.Env.get().cluster
  # Before any strategy scope: the original's "all" layout.
  [every] = cluster.virtual_devices
  assert every.slice_devices == [["/device:CPU:%d" % i] for i in range(4)]
  with tf.Graph().as_default():
    _two_stages_model()
    first, second = cluster.virtual_devices
  assert first.slice_devices == [["/device:CPU:0"], ["/device:CPU:2"]]
  assert second.slice_devices == [["/device:CPU:1"], ["/device:CPU:3"]]
  assert first.num_replicas == 2 and second.get_device(1, 0) == (
      "/device:CPU:3")
  assert second.local_devices == ["/device:CPU:1", "/device:CPU:3"]


def test_virtual_devices_of_a_split_model_are_shared():
  epl.init(epl.Config({"cluster.num_cpu_devices": 2,
                       "cluster.colocate_split_and_replicate": True}))
  epl.set_default_strategy(epl.replicate(1))
  with tf.Graph().as_default():
    x = tf.compat.v1.placeholder(tf.float32, [None, 4])
    with epl.split():
      tf.compat.v1.layers.dense(x, 6)
    [shared] = epl.Env.get().cluster.virtual_devices
  assert shared.slice_devices == [["/device:CPU:0"], ["/device:CPU:1"]]


def test_cluster_built_as_the_original_built_it(monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  epl.init(epl.Config({"cluster.num_cpu_devices": 2}))
  cluster = epl.Cluster(worker_hosts="10.0.0.1:2222,10.0.0.2:2222",
                        worker_index=1, layout="all")
  assert (cluster.worker_num, cluster.worker_index) == (2, 1)
  assert cluster.hosts == "10.0.0.1:2222,10.0.0.2:2222"
  assert cluster.gpu_num_per_worker == 2 and cluster.total_gpu_num == 4
  assert cluster.available_devices[2] == (
      "/job:worker/replica:0/task:1/device:CPU:0")
  assert cluster.virtual_devices[0].local_devices == (
      cluster.available_devices[2:])
  with cluster as entered:
    assert entered is cluster and epl.Env.get().cluster is cluster
  assert epl.Env.get().cluster is cluster
  # Without worker_hosts: TF_CONFIG, else one local worker.
  monkeypatch.setenv("TF_CONFIG", json.dumps({
      "cluster": {"worker": ["h0:1", "h1:1", "h2:1"]},
      "task": {"type": "worker", "index": 2}}))
  assert (epl.Cluster().worker_num, epl.Cluster().worker_index) == (3, 2)
  monkeypatch.delenv("TF_CONFIG")
  assert epl.Cluster(layout=None).hosts == "localhost:0"


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(layout={"specific": [[["/gpu:0"]]]}), NotImplementedError,
     "'specific' and 'aware_row' layouts are not built"),
    (dict(layout={"aware_row": 2}), NotImplementedError, "layout"),
    (dict(worker_hosts="a:1", ps_hosts="b:1"), ValueError,
     "no parameter servers"),
    (dict(worker_hosts="a:1,b:1", worker_index=2), ValueError,
     "is not a worker of"),
    (dict(worker_hosts="a:1", job_name="ps"), ValueError, "job_name"),
])
def test_cluster_arguments_epl_does_not_build(kwargs, error, match):
  with pytest.raises(error, match=match):
    epl.Cluster(**kwargs)


# -------------------------------------------------------------- profiler


def _dense_model():
  x = tf.compat.v1.data.make_one_shot_iterator(
      tf.data.Dataset.from_tensor_slices(
          np.ones((40, 10), np.float32)).batch(10)).get_next()
  return tf.compat.v1.layers.dense(x, 16, name="dense1")


def test_profile_flops_and_memory_of_the_default_graph():
  with tf.Graph().as_default():
    _dense_model()
    counts = profiler.profile_flops()
    sizes = profiler.profile_memory()
  assert counts["dense1/MatMul"] == 10 * 10 * 16 * 2
  assert counts["dense1/BiasAdd"] == 10 * 16
  assert sizes["dense1/MatMul:0"] == 10 * 16 * 4


def test_profile_flops_of_a_traced_step_and_the_hook_s_cmds(caplog):
  # The profiler's tables are INFO records, whatever level an earlier test
  # in this process left EPL's logger at (restored after the test).
  caplog.set_level(logging.INFO, logger="epl")
  logger = logging.getLogger("epl")
  logger.addHandler(caplog.handler)
  try:
    with tf.Graph().as_default():
      out = _dense_model()
      hook = flops.FlopsProfilerHook(cmds=["scope", "op"])
      with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:
        metadata = tf.compat.v1.RunMetadata()
        sess.run(out, options=tf.compat.v1.RunOptions(
            trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
                 run_metadata=metadata)
        total = flops.profile_flops(sess, metadata, "graph")
  finally:
    logger.removeHandler(caplog.handler)
  # Every op of the graph: the layer and its kernel's initializer.
  assert total >= 10 * 10 * 16 * 2 + 10 * 16 + 2 * 10 * 16
  assert hook.op_flops["dense1/MatMul"] == 10 * 10 * 16 * 2
  assert "FLOPs profiler (scope)" in caplog.text
  assert "FLOPs profiler (op)" in caplog.text and "MatMul" in caplog.text
  assert "FLOPs profiler (graph)" in caplog.text
  # The original's positional form, and its check of the views.
  assert flops.FlopsProfilerHook("op")._cmds == ["op"]  # pylint: disable=protected-access
  with pytest.raises(ValueError, match="cmds"):
    flops.FlopsProfilerHook(cmds="timeline")


# ------------------------------------------------------------ epl-launch


def test_launcher_takes_the_original_s_flags():
  parse = launcher._parser().parse_args  # pylint: disable=protected-access
  assert parse(["--num_workers=2", "--debug=True", "t.sh"]).debug is True
  assert parse(["--num_workers=2", "--debug", "yes", "t.sh"]).debug is True
  assert parse(["--num_workers=2", "--debug=False", "t.sh"]).debug is False
  assert parse(["--num_workers=2", "t.sh"]).debug is False
  args = parse(["--num_workers=2", "--gpu_per_worker=1", "--task_label=x",
                "train.py"])
  assert launcher.log_dir(args).endswith("_2w1g_train_x")
  assert launcher.log_dir(parse(["--num_workers=1", "--log_dir=L",
                                 "--task_label=x", "t.sh"])) == "L"


def test_debug_runs_worker_zero_in_the_foreground():
  # One write per line: worker 0 writes to the terminal the launcher also
  # relays worker 1's lines to, and `print` of several items writes each
  # piece on its own when unbuffered, so the lines could interleave.
  code = ("import json, os, sys; "
          "sys.stdout.write('task %d\\n' % json.loads("
          "os.environ['TF_CONFIG'])['task']['index']); sys.stdout.flush()")
  job = subprocess.run(
      [sys.executable, "-m", "epl.tools.launcher", "--num_workers=2", "--cpu",
       "--debug=True", "--", sys.executable, "-c", code],
      cwd=multiworker.ROOT, capture_output=True, text=True, timeout=120,
      check=False)
  assert job.returncode == 0, job.stdout + job.stderr
  lines = job.stdout.splitlines()
  assert "task 0" in lines  # unprefixed: on this terminal
  assert "[worker 1] task 1" in lines
