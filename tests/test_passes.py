"""The pass manager, the provenance of the ops EPL builds, and the plan kept
with the graph."""
import logging
import types

import numpy as np
import pytest
import tensorflow as tf

import epl
from epl.ir import names
from epl.ir import provenance
from epl.ir.graph_state import state_of
from epl.parallel import engine
from epl.parallel.plan import planner
from epl.tools import diagram
from epl.parallel.manager import Artifact, Pass, PassError, PassManager
from tests import training

TODAYS_ORDER = [
    "resolve_training_ops", "check_stages",
    "select_gradient_points", "check_grouped", "place_replica_zero",
    "convert_to_half", "scale_loss", "recompute_activations",
    "clone_micro_batches", "partition_updates", "share_weights",
    "clone_replicas", "split_fed_batches",
    "vary_random_seeds", "place_updates", "partition_weights",
    "offload_variables",
    "order_input_reads", "lower_split", "join_replicas",
    "order_shared_writes",
    "order_reference_updates", "average_forward_state_updates",
    "aggregate_gradients", "skip_nonfinite_updates", "schedule_pipeline",
    "merge_global_objects", "sync_variables", "translate_whole_values"]


# ------------------------------------------------------------ the manager


def _make(ctx):  # pylint: disable=unused-argument
  return {"made": 1}


def _use(ctx, made):  # pylint: disable=unused-argument
  return None


def _remake(ctx, made):  # pylint: disable=unused-argument
  return {"made": made + 1}


def _small_manager():
  return PassManager([Artifact("made", "int", "A number."),
                      Artifact("given", "int", "Given.")], given=("given",))


def test_the_rewrite_passes_run_in_todays_order():
  assert [p.name for p in engine.pass_manager().passes] == TODAYS_ORDER


def test_a_pass_that_reads_what_no_earlier_pass_writes_is_refused():
  manager = _small_manager()
  with pytest.raises(PassError, match="'use' reads 'made', which no earlier "
                     "pass writes and the rewrite is not given"):
    manager.register(Pass("use", _use, reads=("made",)))
  manager.register(Pass("make", _make, writes=("made",)))
  manager.register(Pass("use", _use, reads=("made",)))
  manager.register(Pass("remake", _remake, reads=("made",),
                        writes=("made",)))
  assert [p.name for p in manager.passes] == ["make", "use", "remake"]
  assert manager.dependencies() == {
      "make": [], "use": [("make", "made")], "remake": [("make", "made")]}


@pytest.mark.parametrize("bad, message", [
    (Pass("make", _make, writes=("made",)), "named 'make' is registered"),
    (Pass("other", _make, writes=("unknown",)), "artifact 'unknown', which "
     "is not declared"),
    (Pass("other", _use, reads=("given",)), r"_use takes \(ctx, made\) but "
     "the pass reads given"),
])
def test_declarations_that_do_not_fit_are_refused(bad, message):
  manager = _small_manager()
  manager.register(Pass("make", _make, writes=("made",)))
  with pytest.raises(PassError, match=message):
    manager.register(bad)


def _context():
  graph = tf.Graph()
  return types.SimpleNamespace(
      graph=graph, config=epl.Config(), plan=None,
      state=types.SimpleNamespace(provenance=provenance.Provenance()))


def test_run_skips_disabled_passes_and_checks_what_a_pass_returns():
  manager = _small_manager()
  manager.register(Pass("make", _make, writes=("made",)))
  manager.register(Pass("remake", _remake, reads=("made",), writes=("made",),
                        enabled=lambda ctx: False))
  assert manager.run(_context(), {"given": 0}) == {"given": 0, "made": 1}

  def forgetful(ctx):  # pylint: disable=unused-argument
    return None
  manager = _small_manager()
  manager.register(Pass("forgetful", forgetful, writes=("made",)))
  with pytest.raises(PassError, match=r"returned \[\]; it declares it "
                     r"writes \['made'\]"):
    manager.run(_context(), {"given": 0})


def _training_graph(config):
  """(graph, loss, train op) of layers_model trained by gradient descent,
  under EPL with `config`."""
  epl.init(epl.Config(config))
  epl.set_default_strategy(epl.replicate(1))
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.input_batch(4)
    loss = tf.reduce_mean(tf.square(training.layers_model(x) - y))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
  return graph, loss, train_op


def _rewrite(config):
  graph, _, _ = _training_graph(config)
  with graph.as_default():
    result = engine.ensure_rewritten(graph)
  return graph, result


def _logged_rewrite(caplog, config):
  """_rewrite(config); the lines the pass manager logged."""
  logger = logging.getLogger("epl")
  propagate = logger.propagate
  logger.addHandler(caplog.handler)
  logger.propagate = False  # each record once
  try:
    with caplog.at_level(logging.INFO, logger="epl"):
      graph, _ = _rewrite(config)
  finally:
    logger.removeHandler(caplog.handler)
    logger.propagate = propagate
  return graph, [r.getMessage() for r in caplog.records
                 if r.getMessage().startswith("EPL pass ")]


@pytest.mark.parametrize("how", ["config", "environment"])
def test_log_passes_logs_each_pass(caplog, monkeypatch, how):
  config = {"cluster.num_cpu_devices": 2}
  if how == "config":
    config["log.passes"] = True
  else:
    monkeypatch.setenv("EPL_LOG_PASSES", "1")
  graph, lines = _logged_rewrite(caplog, config)
  assert len(lines) == len(TODAYS_ORDER)
  assert "EPL pass convert_to_half: off (runs when amp.level O1)" in lines
  [cloned] = [line for line in lines
              if line.startswith("EPL pass clone_replicas: ")]
  origins = state_of(graph).provenance
  added = sum(1 for op in graph.get_operations()
              if origins.pass_of(op) == "clone_replicas")
  assert cloned.startswith("EPL pass clone_replicas: %d ops added, " % added)
  assert cloned.endswith(" s")


def test_passes_are_not_logged_by_default(caplog):
  _, lines = _logged_rewrite(caplog, {"cluster.num_cpu_devices": 2})
  assert not lines and "EPL rewrite: " in caplog.text


# ------------------------------------------------------------ provenance


def test_provenance_names_the_pass_source_replica_and_micro_batch():
  graph, _ = _rewrite({"cluster.num_cpu_devices": 2,
                       "pipeline.num_micro_batch": 2,
                       "pipeline.accumulation": "copies"})
  origins = state_of(graph).provenance
  name = "dense/MatMul"
  micro_batch = names.micro_batch_prefix(1) + name
  both = names.replica_prefix(1) + micro_batch
  assert origins.origin(graph.get_operation_by_name(name)) == (
      provenance.Origin(None, None, None, None, None))
  assert origins.origin(graph.get_operation_by_name(micro_batch)) == (
      provenance.Origin("clone_micro_batches", name, 0, 1, None))
  assert origins.origin(graph.get_operation_by_name(both)) == (
      provenance.Origin("clone_replicas", micro_batch, 1, 1, None))
  replica_copy = graph.get_operation_by_name(names.replica_prefix(1) + name)
  assert origins.origin(replica_copy).micro_batch == 0
  passes = {origins.pass_of(op) for op in graph.get_operations()}
  assert {"clone_micro_batches", "clone_replicas", "aggregate_gradients",
          "sync_variables"} <= passes


def test_a_user_scope_named_like_epl_is_the_users_in_the_coverage_check():
  graph, loss, first = _training_graph({"cluster.num_cpu_devices": 2})
  with graph.as_default():
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(first)
      with tf.name_scope("EPL_x"):
        late = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            loss)
      with pytest.raises(RuntimeError, match="did not parallelise"):
        session.run(late)


def test_a_user_write_in_a_scope_named_like_epl_reaches_every_replica():
  graph, _, train_op = _training_graph(dict(training.PER_REPLICA_WEIGHTS,
                                            **{"cluster.num_cpu_devices": 2}))
  with graph.as_default():
    [kernel] = [v for v in tf.compat.v1.trainable_variables()
                if v.op.name == "dense/kernel"]
    new_value = np.full(kernel.shape, 0.25, np.float32)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(train_op)
      with tf.name_scope("EPL_x"):
        write = tf.compat.v1.assign(kernel, new_value)
      session.run(write)
      copy = names.replica_prefix(1) + "dense/kernel"
      values = training.read_variables(session, graph, ["dense/kernel", copy])
  np.testing.assert_array_equal(values["dense/kernel"], new_value)
  np.testing.assert_array_equal(values[copy], new_value)


def test_the_seeds_of_the_losses_are_recorded_where_gradients_are_made():
  epl.init(epl.Config())
  epl.set_default_strategy(epl.replicate(1))
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.input_batch(4)
    loss = tf.reduce_mean(tf.square(training.layers_model(x) - y))
    variables = tf.compat.v1.trainable_variables()
    tf.gradients(loss, variables)
    seeds = set(state_of(graph).loss_seeds)
    tf.gradients(loss, variables, grad_ys=tf.constant(2.0))
  [seed] = seeds
  assert graph.get_operation_by_name(seed).type == "Fill"
  assert state_of(graph).loss_seeds == seeds


# ------------------------------------------------------------ the plan


def test_the_plan_is_made_once_and_is_the_rewrites_from_then_on():
  graph, _, _ = _training_graph({"cluster.num_cpu_devices": 2})
  with graph.as_default():
    plan = planner.plan_of(graph)
    assert planner.plan_of(graph) is plan and plan.num_micro_batch == 1
    epl.Env.get().config.pipeline.num_micro_batch = 2
    plan = planner.plan_of(graph)
    assert plan.num_micro_batch == 2
    result = engine.ensure_rewritten(graph)
    assert result.plan is plan
    epl.Env.get().config.pipeline.num_micro_batch = 4
    assert planner.plan_of(graph) is plan


def test_no_plan_before_the_rewrite_reports_it():
  # Too few devices is caught at scope entry; a stage count that does not
  # match the scopes is known only to the planner.
  epl.init(epl.Config({"cluster.num_cpu_devices": 2,
                       "pipeline.num_stages": 3}))
  graph = tf.Graph()
  with graph.as_default():
    with epl.replicate(device_count=1):
      tf.constant(1.0)
    assert planner.plan_of(graph) is None
    with pytest.raises(ValueError, match="pipeline.num_stages is 3"):
      planner.plan_of(graph, for_rewrite=True)


# ------------------------------------------------------------ the diagram


def test_the_architecture_diagram_matches_the_declarations():
  manager = engine.pass_manager()
  with open(diagram.SVG_PATH) as f:
    assert f.read() == diagram.svg(manager), (
        "docs/architecture.svg is out of date: run python -m "
        "epl.tools.diagram")
  with open(diagram.MARKDOWN_PATH) as f:
    text = f.read()
  assert diagram.updated_markdown(text, manager) == text, (
      "docs/architecture.md is out of date: run python -m epl.tools.diagram")
