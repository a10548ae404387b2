"""The original EPL's IR as a view of EPL's graph state (issue 20, item 6):
`epl.Graph`, its TaskGraphs and `epl.Operation`, before and after the
rewrite."""
import pytest
import tensorflow as tf

import epl
from epl.ir.phase import ModelPhase
from tests import training


def _pipeline(replicas=2, micro_batches=2):
  """Two stages (layer_0, layer_1) x `replicas`, trained once; returns
  (graph, train_op)."""
  epl.init(epl.Config({"cluster.num_cpu_devices": 2 * replicas,
                       "pipeline.num_micro_batch": micro_batches}))
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.input_batch(8)
    loss = tf.reduce_mean(tf.square(training.staged_model()(x) - y))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
  return graph, train_op


def _run_once(graph, train_op):
  with graph.as_default(), tf.compat.v1.Session() as session:
    session.run(tf.compat.v1.global_variables_initializer())
    session.run(train_op)


def _names(operations):
  return {op.name for op in operations}


def test_graph_before_init_and_before_any_scope():
  assert epl.Graph.get() is None
  epl.init()
  with tf.Graph().as_default():
    assert epl.Graph.get() is None
    view = epl.Graph.get(may_create=True)
    assert view is epl.Graph.get() and view.num_stages == 0


def test_taskgraphs_stages_and_devices():
  graph, _ = _pipeline()
  with graph.as_default():
    view = epl.Graph.get()
  assert view.num_stages == 2 and view.pipeline_enabled
  assert view.get_pipeline_config().num_micro_batch == 2
  first, second = view.taskgraphs
  assert (first.index, second.index) == (0, 1)
  assert first.is_first_stage and not second.is_first_stage
  assert second.is_last_stage
  assert first.strategy.name == "stage_0"
  assert first.virtual_device.slice_devices == [["/device:CPU:0"],
                                                ["/device:CPU:2"]]
  assert second.virtual_device.get_device(1, 0) == "/device:CPU:3"
  assert (first.num_replicas, first.local_num_replicas) == (2, 2)


def test_data_parallel_alone_is_no_pipeline():
  epl.init(epl.Config({"cluster.num_cpu_devices": 2,
                       "pipeline.num_micro_batch": 2}))
  epl.set_default_strategy(epl.replicate(1))
  with tf.Graph().as_default():
    x, y = training.input_batch(4)
    tf.reduce_mean(tf.square(training.layers_model(x) - y))
    view = epl.Graph.get()
    assert view.num_stages == 1 and not view.pipeline_enabled
    assert view.taskgraphs[0].num_replicas == 2


def test_operations_phases_and_taskgraphs_before_the_rewrite():
  graph, _ = _pipeline()
  with graph.as_default():
    view = epl.Graph.get()
    # Built outside every strategy: outside the training step.
    epl.set_default_strategy(None)
    init = tf.compat.v1.global_variables_initializer()
  matmul = view.operations["layer_1/MatMul"]
  assert isinstance(matmul, epl.Operation)
  assert matmul.taskgraph is view.taskgraphs[1]
  assert matmul.phase == ModelPhase.FORWARD == "MODEL_FORWARD_PHASE"
  assert str(matmul) == (
      "epl.Operation(name='layer_1/MatMul', device=, type=MatMul, "
      "function=None, phase=MODEL_FORWARD_PHASE)")
  gradient = view.operations["gradients/layer_1/MatMul_grad/MatMul"]
  assert gradient.phase == ModelPhase.BACKWARD
  assert gradient.taskgraph.index == 1
  update = view.operations[
      "GradientDescent/update_layer_0/kernel/ResourceApplyGradientDescent"]
  assert update.phase == ModelPhase.APPLY
  assert view.operations[init.name].phase == ModelPhase.OTHER
  assert "layer_0/MatMul" in view.operations
  assert "no_such_op" not in view.operations
  assert view.get_operation_by_name("no_such_op") is None
  # Every op is replica 0's and micro-batch 0's until the rewrite.
  first = view.taskgraphs[0]
  assert "layer_0/MatMul" in _names(first.operations.forward_operations(0, 0))
  assert not first.operations.forward_operations(1, 0)
  assert view.get_local_replicas(view.operations["layer_0/MatMul"]) == []
  assert view.get_local_micro_batches(matmul) == []


def test_replicas_and_micro_batches_after_the_rewrite():
  graph, train_op = _pipeline()
  _run_once(graph, train_op)
  with graph.as_default():
    view = epl.Graph.get()
  first, second = view.taskgraphs
  assert "EPL_REPLICA_1/EPL_MICRO_BATCH_1/layer_0/MatMul" in _names(
      first.operations.forward_operations(1, 1))
  assert "layer_0/MatMul" in _names(first.operations.forward_operations(0, 0))
  assert "EPL_MICRO_BATCH_1/layer_0/MatMul" not in _names(
      first.operations.forward_operations(0, 0))
  backward = _names(second.operations.backward_operations(0, 1))
  assert "EPL_MICRO_BATCH_1/gradients/layer_1/MatMul_grad/MatMul" in backward
  assert not any(name.startswith("EPL_REPLICA_1/") for name in backward)
  assert ("EPL_REPLICA_1/GradientDescent/update_layer_1/kernel/"
          "ResourceApplyGradientDescent") in _names(second.operations
                                            .apply_operations(1))
  matmul = view.operations["layer_0/MatMul"]
  [replica] = view.get_local_replicas(matmul)
  assert replica.name == "EPL_REPLICA_1/layer_0/MatMul"
  assert replica.taskgraph is first and replica.phase == ModelPhase.FORWARD
  assert [t.name for t in view.get_local_replicas(matmul.outputs[0])] == [
      "EPL_REPLICA_1/layer_0/MatMul:0"]
  assert [op.name for op in view.get_local_micro_batches(matmul)] == [
      "EPL_MICRO_BATCH_1/layer_0/MatMul"]
  assert [op.name for op in view.get_local_micro_batches(replica)] == [
      "EPL_REPLICA_1/EPL_MICRO_BATCH_1/layer_0/MatMul"]
  # Once-per-step ops have no micro-batch copies.
  update = view.operations[
      "GradientDescent/update_layer_0/kernel/ResourceApplyGradientDescent"]
  assert view.get_local_micro_batches(update) == []
  assert [t.name for t in second.get_variables(0)] == [
      "layer_1/kernel:0", "layer_1/bias:0"]
  assert [t.name for t in second.get_variables(1)] == [
      "EPL_REPLICA_1/layer_1/kernel:0", "EPL_REPLICA_1/layer_1/bias:0"]


def test_tensors_and_their_taskgraphs():
  graph, _ = _pipeline()
  with graph.as_default():
    view = epl.Graph.get()
  hidden = view.get_tensor_by_name("layer_0/Tanh:0")
  assert hidden.taskgraph.index == 0 and hidden.op.name == "layer_0/Tanh"
  assert "layer_1/MatMul" in _names(hidden.consumers)
  assert hidden == view.operations["layer_0/Tanh"].outputs[0]
  assert view.get_tensor_by_name("layer_0/Tanh:7") is None


def test_model_phase_names_and_no_phase_scope():
  assert ModelPhase.APPLY == "MODEL_APPLY_PHASE"
  assert ModelPhase.SAVE_AND_RESTORE == "SAVE_AND_RESTORE_PHASE"
  assert epl.ir.phase.ModelPhase is ModelPhase
  with pytest.raises(NotImplementedError, match="Operation.phase"):
    ModelPhase(ModelPhase.BACKWARD)


def test_graph_keys_and_collections_through_the_ir_module():
  from epl.ir.graph import GraphKeys  # where the original's users import it
  assert GraphKeys is epl.GraphKeys
  epl.init()
  with tf.Graph().as_default():
    loss = tf.reduce_sum(tf.ones([2]), name="loss")
    epl.add_to_collection(loss, GraphKeys.GLOBAL_MEAN_OBJECTS)
    view = epl.Graph.get(may_create=True)
    assert view.get_collection(GraphKeys.GLOBAL_MEAN_OBJECTS) == [loss]
    assert view.get_collection(GraphKeys.GLOBAL_SUM_OBJECTS) == []


def test_graph_taken_right_after_set_default_strategy_fills_in():
  epl.init(epl.Config({"cluster.num_cpu_devices": 2}))
  with tf.Graph().as_default():
    epl.set_default_strategy(epl.replicate(1))
    view = epl.Graph.get()
    assert view is not None and view.num_stages == 0
    x, y = training.input_batch(4)
    tf.reduce_mean(tf.square(training.layers_model(x) - y))
    assert view is epl.Graph.get()
    assert view.num_stages == 1 and view.taskgraphs[0].num_replicas == 2
