"""Public API contracts and the errors a user meets."""
import logging

import pytest
import tensorflow as tf

import epl
from epl.cluster import Cluster
from epl.ir.graph_state import state_of
from epl.ir.taskgraph import TaskGraph
from epl.parallel.plan import planner
from tests import training


def _init(devices=4, **config):
  settings = {"cluster.num_cpu_devices": devices}
  settings.update(config)
  return epl.init(epl.Config(settings))


def test_env_reports_cluster_and_config():
  env = _init(devices=3)
  assert epl.Env.get() is env
  assert env.config.cluster.num_cpu_devices == 3
  cluster = env.cluster
  assert (cluster.worker_num, cluster.worker_index) == (1, 0)
  assert cluster.devices_per_worker == 3 and cluster.total_devices == 3


def test_model_before_init_says_what_to_call():
  with pytest.raises(RuntimeError, match="epl.init"):
    with epl.replicate(1):
      pass
  with pytest.raises(RuntimeError, match="epl.init"):
    epl.set_default_strategy(epl.replicate(1))


def test_init_after_the_model_was_built_names_the_late_init():
  tf.compat.v1.get_variable("w", [3, 1])
  with pytest.raises(RuntimeError, match="epl.init.* after the model was "
                     "built.*1 variable.*'w'.*before building it"):
    _init()
  # A plain TensorFlow model kept in its own graph is fine.
  tf.compat.v1.reset_default_graph()
  with tf.Graph().as_default():
    tf.compat.v1.get_variable("w", [3, 1])
  _init()


def test_init_accepts_a_dict_and_rejects_bad_keys():
  assert epl.init({"pipeline.num_micro_batch": 2}).config.pipeline \
      .num_micro_batch == 2
  with pytest.raises(ValueError, match="num_micro_batch"):
    epl.init({"pipeline.num_micro_bach": 2})


def test_strategies_do_not_nest():
  _init()
  with tf.Graph().as_default():
    with epl.replicate(1, name="outer"):
      with pytest.raises(ValueError, match="do not nest.*inner.*outer"):
        with epl.replicate(1, name="inner"):
          pass


def test_a_scope_that_raised_before_building_leaves_no_stage():
  # The original EPL's users catch the nesting error and go on: the empty
  # outer scope must not count as a pipeline stage on a 1-device cluster.
  epl.init(epl.Config({"cluster.num_cpu_devices": 1}))
  graph = tf.Graph()
  with graph.as_default():
    for _ in range(2):
      with pytest.raises(RuntimeError, match="do not nest"):
        with epl.replicate(1):
          with epl.replicate(1):
            pass
    assert epl.Graph.get().num_stages == 0
    with epl.replicate(1):
      tf.constant(1.0)
    assert epl.Graph.get().num_stages == 1


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_strategy_device_count_must_be_positive_int(bad):
  with pytest.raises(ValueError, match="device_count"):
    epl.replicate(bad)


def test_ops_are_captured_per_taskgraph_and_phase():
  _init()
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.input_batch(8)
    with epl.replicate(1, name="stage_0"):
      hidden = tf.compat.v1.layers.dense(x, 4)
    with epl.replicate(1, name="stage_1"):
      loss = tf.reduce_mean(tf.square(tf.compat.v1.layers.dense(hidden, 1)
                                      - y))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
  state = state_of(graph)
  assert [t.name for t in state.taskgraphs] == ["stage_0", "stage_1"]
  assert state.taskgraph_of(hidden.op).name == "stage_0"
  assert state.taskgraph_of(loss.op).name == "stage_1"
  assert state.phase_of(loss.op).value == "forward"
  # Built before the first strategy scope: forward work of the first one.
  assert state.phase_of(x.op).value == "forward"
  assert state.taskgraph_of(x.op).name == "stage_0"
  grad_matmuls = [op for op in graph.get_operations()
                  if op.name.startswith("gradients/dense/") and
                  op.type == "MatMul"]
  assert grad_matmuls and all(
      state.phase_of(op).value == "backward" and
      state.taskgraph_of(op).name == "stage_0" for op in grad_matmuls)
  assert state.phase_of(train_op).value == "apply"
  [record] = state.gradient_records
  assert len(record.pairs) == 4
  [applied] = state.apply_records
  assert applied.train_op is train_op and len(applied.grads_and_vars) == 4


@pytest.mark.parametrize("strategy, error, message", [
    (lambda: epl.split(device_count=2), ValueError,
     "colocate_split_and_replicate"),
], ids=["split_without_colocate"])
def test_rewrite_errors_raise_at_first_run(strategy, error, message):
  _init(devices=4)
  with tf.Graph().as_default():
    x, y = training.input_batch(8)
    with strategy():
      loss = tf.reduce_mean(tf.square(training.layers_model(x) - y))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    with tf.compat.v1.Session() as session:
      with pytest.raises(error, match=message):
        session.run(train_op)


@pytest.mark.parametrize("enter", [
    lambda: epl.replicate(device_count=8).__enter__(),
    lambda: epl.split(device_count=8).__enter__(),
    lambda: epl.set_default_strategy(epl.replicate(device_count=8)),
], ids=["replicate", "split", "default"])
def test_too_many_devices_raise_when_the_scope_is_entered(enter):
  _init(devices=4)
  with tf.Graph().as_default():
    with pytest.raises(ValueError, match="needs 8 device.*only 4.*"
                       "cluster.num_cpu_devices"):
      enter()
    assert not state_of(tf.compat.v1.get_default_graph())


def test_a_pipeline_stage_beyond_the_devices_raises_at_its_scope():
  # Before the graph of the later stages is built, not at the first run.
  _init(devices=2)
  with tf.Graph().as_default():
    for index in range(2):
      with epl.replicate(1, name="stage_%d" % index):
        tf.ones([2])
    with pytest.raises(ValueError, match=(
        "stage_2.*stage_0:1 \\+ stage_1:1 \\+ stage_2:1.* needs 3 "
        "device.*only 2")):
      with epl.replicate(1, name="stage_2"):
        pass
    # Entering an existing stage again needs no new device.
    with epl.replicate(1, name="stage_1"):
      pass


def test_repeated_unnamed_default_strategy_warns_and_checks_devices(
    caplog, monkeypatch):
  # The original's pipeline idiom (FastNN's BERT pipelines) switches
  # between unnamed default strategies: it builds stages, loudly.
  _init(devices=2)
  monkeypatch.setattr(logging.getLogger("epl"), "propagate", True)
  first = epl.replicate(1)
  epl.set_default_strategy(first)
  caplog.clear()
  with caplog.at_level(logging.INFO, logger="epl"):
    epl.set_default_strategy(first)  # the same one again changes nothing
    assert not caplog.records
    with tf.Graph().as_default():
      tf.constant(1.0)
    epl.set_default_strategy(epl.replicate(1))
  warnings = {r.getMessage() for r in caplog.records
              if r.levelno == logging.WARNING}
  assert len(warnings) == 1 and "new pipeline stage" in warnings.pop()
  # Named defaults switch stages at INFO.
  epl.set_default_strategy(None)
  caplog.clear()
  with caplog.at_level(logging.INFO, logger="epl"):
    epl.set_default_strategy(epl.replicate(1, name="stage_0"))
    epl.set_default_strategy(epl.replicate(1, name="stage_1"))
  assert {(r.levelno, "new pipeline stage" in r.getMessage())
          for r in caplog.records} == {(logging.INFO, True)}


def test_repeated_default_strategy_wider_than_the_cluster_names_the_stages():
  _init(devices=1)
  graph = tf.Graph()
  with graph.as_default():
    epl.set_default_strategy(epl.replicate(1))
    tf.constant(1.0)
    with pytest.raises(ValueError, match=(
        r"per replica: replicate_\d+:1 \+ replicate_\d+:1.*only 1")):
      epl.set_default_strategy(epl.replicate(1))


def test_set_default_strategy_rejects_non_strategies():
  _init()
  with pytest.raises(ValueError, match="set_default_strategy"):
    epl.set_default_strategy("replicate")


def test_add_to_collection_rejects_unknown_keys():
  with tf.Graph().as_default():
    with pytest.raises(ValueError, match="GraphKeys"):
      epl.add_to_collection(tf.constant(1.0), "mean")


class _Strategy:
  def __init__(self, name, device_count, kind=epl.replicate):
    self.strategy = kind(device_count, name=name)
    self.name = name
    self.device_count = device_count


def _plan(taskgraphs, workers=1, devices=4, intra_node=True):
  cluster = Cluster.of(["w%d:1" % i for i in range(workers)] if workers > 1
                       else [], 0, "CPU", devices)
  config = epl.Config({"cluster.device_place_prefer_intra_node": intra_node})
  return planner.make_plan(cluster, taskgraphs, config)


def test_plan_data_parallel_uses_every_device():
  plan = _plan([_Strategy("model", 1)])
  assert plan.num_replicas == 4
  assert plan.devices == [["/device:CPU:%d" % i] for i in range(4)]
  assert plan.local_replicas == [0, 1, 2, 3]
  assert "4 model replica(s)" in plan.describe()


def test_plan_infers_pipeline_replicas_and_placement():
  stages = [_Strategy("stage_0", 1), _Strategy("stage_1", 1)]
  plan = _plan(stages, workers=2, devices=2)
  assert plan.num_replicas == 2
  assert plan.devices[1] == ["/job:worker/replica:0/task:1/device:CPU:0",
                             "/job:worker/replica:0/task:1/device:CPU:1"]
  spread = _plan(stages, workers=2, devices=2, intra_node=False)
  assert spread.device_workers == [[0, 1], [0, 1]]
  assert spread.local_replicas == [0, 1]


def test_plan_errors_name_both_numbers():
  with pytest.raises(ValueError, match="3 devices do not divide.*2 device"):
    _plan([_Strategy("a", 1), _Strategy("b", 1)], devices=3)
  with pytest.raises(ValueError, match="needs 5 device"):
    _plan([_Strategy("a", 5)])
  with pytest.raises(ValueError, match="No strategy scope"):
    _plan([])


def test_init_warns_about_settings_not_built_yet(caplog, monkeypatch):
  import logging  # pylint: disable=import-outside-toplevel
  from tests.test_config import mark_unbuilt  # pylint: disable=import-outside-toplevel
  mark_unbuilt(monkeypatch, "communication.num_communicators")
  logger = logging.getLogger("epl")
  logger.addHandler(caplog.handler)
  try:
    epl.init({"communication.num_communicators": 4})
  finally:
    logger.removeHandler(caplog.handler)
  assert "communication.num_communicators" in caplog.text and (
      "not built yet" in caplog.text)


def test_run_visible_devices_reach_a_single_worker_session():
  from epl.env import Env  # pylint: disable=import-outside-toplevel
  from epl.runtime import session as epl_session  # pylint: disable=import-outside-toplevel
  config = epl.Config({"cluster.run_visible_devices": "1,3"})
  env = Env(config, Cluster.of([], 0, "GPU", 2))
  _, proto = epl_session.session_settings(env, "", None)
  assert proto.gpu_options.visible_device_list == "1,3"
  assert proto.allow_soft_placement


def test_replicate_device_count_replicates_over_every_device():
  # As documented (and as the original EPL): one replicate scope is data
  # parallel over every device; device_count must divide the device count.
  plan = planner.make_plan(Cluster.of([], 0, "CPU", 4),
                           [TaskGraph(0, epl.replicate(device_count=2))],
                           epl.Config())
  assert plan.num_replicas == 4
  with pytest.raises(ValueError, match="do not divide"):
    planner.make_plan(Cluster.of([], 0, "CPU", 4),
                      [TaskGraph(0, epl.replicate(device_count=3))],
                      epl.Config())


@pytest.mark.parametrize("devices", [2, 6, 8])
def test_pipeline_stages_of_several_devices_are_refused_at_the_scope(devices):
  # Whatever the device count (too few, not a multiple, enough), the
  # answer is the same: stages are one device each; replicas are inferred.
  epl.init(epl.Config({"cluster.num_cpu_devices": devices}))
  with tf.Graph().as_default():
    with epl.replicate(device_count=2, name="stage_0"):
      tf.constant(1.0)
    with pytest.raises(NotImplementedError, match=(
        r"stages with device_count > 1 \(stage_0:2, stage_1:2\) are not "
        r"built; give each stage epl.replicate\(device_count=1\)")):
      with epl.replicate(device_count=2, name="stage_1"):
        pass
  epl.shutdown()
