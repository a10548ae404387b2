"""Contracts of the TensorFlow and Keras internals EPL relies on.

One test per private call (epl.tf_compat.graph_edit, importer, ops, stats,
training) and per hook target (epl.tf_compat.targets, keras, estimator):
what EPL assumes it does, checked on plain TensorFlow without EPL. A
TensorFlow upgrade that renames or changes one fails here first; the fix
goes into epl.tf_compat and epl.tf_compat.VERSIONS.
"""
import collections
import functools
import importlib
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.layers import base as tf1_layers_base

import epl
from epl import tf_compat
from epl.tf_compat import estimator as tf_estimator
from epl.tf_compat import graph_edit
from epl.tf_compat import horovod
from epl.tf_compat import importer
from epl.tf_compat import keras
from epl.tf_compat import ops
from epl.tf_compat import stats
from epl.tf_compat import tape
from epl.tf_compat import targets
from epl.tf_compat import training

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TF_VERSION = tf_compat.parse_version(tf.__version__)
# epl.tf_compat.VERSIONS entry -> the contract tests that check it.
CONTRACTS = collections.defaultdict(list)


def contract(*entries):
  """Marks a test as the contract of `entries` (keys of
  epl.tf_compat.VERSIONS)."""
  def mark(test):
    for entry in entries:
      assert entry in tf_compat.VERSIONS, entry
      CONTRACTS[entry].append(test.__name__)
    return test
  return mark


def _python(script):
  """Runs `script` in a fresh Python process (this one's environment)."""
  return subprocess.run([sys.executable, "-c", script], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)


def _run(fetches, graph):
  with tf.compat.v1.Session(graph=graph) as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    return sess.run(fetches)


@pytest.fixture(name="calls")
def _calls(monkeypatch):
  """calls(target) wraps the (owner, attribute) `target` for this test and
  returns the list of the calls it saw (each call's positional arguments,
  `self` first for a method)."""
  def watch(target):
    owner, attribute = target
    original = getattr(owner, attribute)
    seen = []

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
      seen.append(args)
      return original(*args, **kwargs)
    if isinstance(owner.__dict__.get(attribute), staticmethod):
      wrapper = staticmethod(wrapper)
    monkeypatch.setattr(owner, attribute, wrapper)
    return seen
  return watch


# ------------------------------------------------------------- graph_edit


@contract("graph_edit.update_input")
def test_update_input_rewires_a_data_edge():
  graph = tf.Graph()
  with graph.as_default():
    a, b = tf.constant(1.0), tf.constant(2.0)
    c = tf.identity(a)
    graph_edit.update_input(c.op, 0, b)
  assert c.op.inputs[0] is b
  assert c.op in b.consumers() and c.op not in a.consumers()
  assert _run(c, graph) == 2.0


@contract("graph_edit.set_attr")
def test_set_attr_changes_an_attribute():
  graph = tf.Graph()
  with graph.as_default():
    tf.compat.v1.set_random_seed(1)
    noise = tf.random.uniform([3])
    graph_edit.set_attr(noise.op, "seed2", attr_value_pb2.AttrValue(i=77))
  assert noise.op.get_attr("seed2") == 77
  assert noise.op.node_def.attr["seed2"].i == 77


@contract(
    "graph_edit.add_control_inputs", "graph_edit.control_outputs",
    "graph_edit.remove_all_control_inputs")
def test_control_inputs_added_listed_and_removed():
  graph = tf.Graph()
  with graph.as_default():
    first, second = tf.no_op(), tf.no_op()
    graph_edit.add_control_inputs(second, [first])
    assert second.control_inputs == [first]
    assert graph_edit.control_outputs(first) == [second]
    graph_edit.remove_all_control_inputs(second)
  assert not second.control_inputs
  assert not graph_edit.control_outputs(first)


@contract("graph_edit.set_device")
def test_set_device_places_without_device_functions():
  graph = tf.Graph()
  with graph.as_default(), tf.device("/device:CPU:0"):
    value = tf.constant(1.0)
    graph_edit.set_device(value.op, "/device:CPU:1")
  assert value.op.device == "/device:CPU:1"


@contract("graph_edit.creation_index")
def test_creation_index_follows_creation_order():
  graph = tf.Graph()
  with graph.as_default():
    a = tf.constant(1.0)
    b = a + 1
    c = tf.constant(2.0)
  indices = [graph_edit.creation_index(t.op) for t in (a, b, c)]
  assert indices == sorted(indices) and len(set(indices)) == 3


@contract("graph_edit.is_ref_dtype")
def test_is_ref_dtype_tells_tf1_variables():
  graph = tf.Graph()
  with graph.as_default():
    ref = tf.compat.v1.Variable(1.0, use_resource=False)
    resource = tf.compat.v1.Variable(1.0, use_resource=True)
  assert graph_edit.is_ref_dtype(ref.op.outputs[0].dtype)
  assert not graph_edit.is_ref_dtype(resource.dtype)
  assert not graph_edit.is_ref_dtype(tf.float32)


@contract("graph_edit.declared_input_types")
def test_declared_input_types_tell_a_reference_taken_from_a_value_read():
  graph = tf.Graph()
  with graph.as_default():
    ref = tf.compat.v1.Variable([1.0], use_resource=False, name="ref")
    assign = tf.compat.v1.assign(ref, [2.0])
    tf.compat.v1.train.Saver([ref])
  save = graph.get_operation_by_name("save/SaveV2")
  reference = ref.op.outputs[0].dtype  # float32_ref
  assert graph_edit.is_ref_dtype(reference)
  # Assign takes the variable by reference (it changes it) ...
  assert assign.op.inputs[0].dtype == reference
  assert graph_edit.declared_input_types(assign.op) == [reference,
                                                        tf.float32]
  # ... SaveV2 reads the same reference tensor as a value.
  [variable_input] = [t for t in save.inputs if t.op.name == "ref"]
  assert variable_input.dtype == reference
  declared = graph_edit.declared_input_types(save)
  assert len(declared) == len(save.inputs)
  assert declared[list(save.inputs).index(variable_input)] == tf.float32


@contract("graph_edit.create_op")
def test_create_op_takes_attrs_as_given(calls):
  created = calls(targets.CREATE_OP)
  graph = tf.Graph()
  with graph.as_default(), tf.device("/device:CPU:0"):
    x = tf.constant([1.0, 2.0])
    source = tf.square(x)
    attrs = dict(source.op.node_def.attr)
    copy = graph_edit.create_op(graph, "Square", [x], [tf.float32],
                                "copy", attrs, source.op.op_def)
  assert copy.type == "Square" and copy.name == "copy"
  assert copy.device == ""  # no device function ran
  assert copy in [args[1] for args in created]  # like every op
  np.testing.assert_allclose(_run(copy.outputs[0], graph), [1.0, 4.0])


@contract("graph_edit.default_original_op")
def test_default_original_op_is_the_op_a_gradient_is_built_for():
  seen = []

  @tf.RegisterGradient("EplTestOriginalOp")
  def _gradient(op, grad):
    seen.append((op, graph_edit.default_original_op(op.graph)))
    return grad
  graph = tf.Graph()
  with graph.as_default():
    x = tf.constant(3.0)
    with graph.gradient_override_map({"Identity": "EplTestOriginalOp"}):
      y = tf.identity(x)
    assert graph_edit.default_original_op(graph) is None
    tf.gradients(y, x)
  assert seen == [(y.op, y.op)]


@contract("graph_edit.graph_function")
def test_graph_function_finds_a_called_function():
  graph = tf.Graph()
  with graph.as_default():
    result = tf.function(lambda t: t * 2.0)(tf.constant(1.0))
    name = result.op.get_attr("f").name
  function = graph_edit.graph_function(graph, name)
  assert function is not None
  assert {n.op for n in function.definition.node_def} >= {"Mul"}
  assert graph_edit.graph_function(graph, "no_such_function") is None


@contract("graph_edit.in_graph_context")
def test_in_graph_context_tells_a_nested_default_graph():
  assert not graph_edit.in_graph_context()
  with tf.Graph().as_default():
    assert graph_edit.in_graph_context()
    with pytest.raises(AssertionError):
      tf.compat.v1.reset_default_graph()
  assert not graph_edit.in_graph_context()


@pytest.fixture(name="control_flow_v1")
def _control_flow_v1():
  tf.compat.v1.disable_control_flow_v2()
  yield
  tf.compat.v1.enable_control_flow_v2()


def _v1_loop_and_cond(graph):
  """A v1 while-loop with a cond in its body, in `graph`."""
  with graph.as_default():
    def body(i, x):
      return i + 1, tf.cond(x > 0.0, lambda: x * 0.5, lambda: x + 1.0)
    return tf.while_loop(lambda i, _: i < 3, body,
                         [tf.constant(0), tf.constant(-2.0)])


@contract(
    "graph_edit.control_flow_context", "graph_edit.containing_while_context",
    "graph_edit.containing_while_context_of", "graph_edit.nested_contexts")
def test_control_flow_contexts_of_ops(control_flow_v1):
  del control_flow_v1
  graph = tf.Graph()
  _v1_loop_and_cond(graph)
  merge = graph.get_operation_by_name("while/Merge_1")
  loop = graph_edit.control_flow_context(merge)
  assert loop.name == "while/while_context"
  in_cond = graph.get_operation_by_name("while/cond/mul")
  assert graph_edit.control_flow_context(in_cond).IsCondContext()
  assert graph_edit.containing_while_context(in_cond) is loop
  assert graph_edit.containing_while_context_of(None) is None
  assert graph_edit.control_flow_context(
      graph.get_operation_by_name("Const")) is None
  # The cond's two branches, in the order built.
  assert graph_edit.control_flow_context(in_cond) in (
      graph_edit.nested_contexts(loop))
  assert all(c.IsCondContext() for c in graph_edit.nested_contexts(loop))


@contract(
    "graph_edit.control_flow_context_def", "graph_edit.context_def_kind",
    "graph_edit.context_from_def", "graph_edit.set_control_flow_context")
def test_control_flow_contexts_copied_under_a_scope(control_flow_v1):
  del control_flow_v1
  graph = tf.Graph()
  _v1_loop_and_cond(graph)
  loop = graph_edit.control_flow_context(
      graph.get_operation_by_name("while/Merge_1"))
  context_def = graph_edit.control_flow_context_def(loop)
  kind, proto = graph_edit.context_def_kind(context_def)
  assert kind == "while" and proto.context_name == "while/while_context"
  with graph.as_default():
    tf.graph_util.import_graph_def(graph.as_graph_def(), name="copy")
  copy = graph_edit.context_from_def(graph, context_def, "copy")
  assert copy.name == "copy/while/while_context"
  copied_merge = graph.get_operation_by_name("copy/while/Merge_1")
  assert graph_edit.control_flow_context(copied_merge) is copy
  assert graph_edit.nested_contexts(copy)[0].IsCondContext()
  trigger = graph.get_operation_by_name("copy/while/Merge")
  graph_edit.set_control_flow_context(trigger, copy)
  assert graph_edit.control_flow_context(trigger) is copy


@contract("graph_edit.building_in_context")
def test_building_in_context_enters_a_loop(control_flow_v1):
  del control_flow_v1
  graph = tf.Graph()
  _v1_loop_and_cond(graph)
  in_loop = graph.get_operation_by_name("while/Identity_1")
  outside = graph.get_operation_by_name("Const_1").outputs[0]
  with graph.as_default(), graph_edit.building_in_context(
      graph, graph_edit.control_flow_context(in_loop)):
    added = tf.add(in_loop.outputs[0], outside)
  assert graph_edit.control_flow_context(added.op) is (
      graph_edit.control_flow_context(in_loop))
  # The outside value enters the loop through a new Enter op.
  assert added.op.inputs[1].op.type == "Enter"
  assert graph_edit.control_flow_context(
      graph.get_operation_by_name("Const_1")) is None


@contract(
    "graph_edit.building_v1_control_flow", "graph_edit.join_while_context",
    "graph_edit.enter_while_context", "graph_edit.while_control_pivot")
def test_existing_ops_join_a_v1_loop_built_under_control_flow_v2():
  graph = tf.Graph()
  with graph.as_default():
    outside = tf.constant(2.0)
    existing = tf.multiply(tf.constant(3.0), tf.constant(1.0))
    with graph_edit.building_v1_control_flow():
      def body(index, total):
        context = graph_edit.control_flow_context(index.op)
        graph_edit.join_while_context(existing.op, context)
        for position, tensor in enumerate(existing.op.inputs):
          graph_edit.update_input(
              existing.op, position,
              graph_edit.enter_while_context(context, tensor))
        assert graph_edit.while_control_pivot(context).type == "Identity"
        return index + 1, total + existing * outside
      _, total = tf.compat.v1.while_loop(
          lambda index, _: index < 3, body,
          (tf.constant(0), tf.constant(0.0)))
    assert {op.type for op in graph.get_operations()} >= {"Enter", "Exit"}
    assert existing.op.inputs[0].op.type == "Enter"
    assert not graph.is_fetchable(existing.op)
    with tf.compat.v1.Session() as session:
      assert session.run(total) == 18.0


# --------------------------------------------------------------- importer


def _variable_graph_def():
  source = tf.Graph()
  with source.as_default(), tf.device("/device:CPU:0"):
    variable = tf.compat.v1.get_variable(
        "v", initializer=tf.constant([1.0, 2.0]), use_resource=True)
    tf.identity(variable.read_value() * 2.0, name="doubled")
  return source.as_graph_def()


@contract("importer.import_nodes")
def test_import_nodes_keeps_shared_name_and_devices(calls):
  graph_def = _variable_graph_def()
  created = calls(targets.CREATE_OP)
  graph = tf.Graph()
  with graph.as_default():
    new_ops = importer.import_nodes(graph, graph_def, "copy", {})
  names = {op.name for op in new_ops}
  assert "copy/v" in names and "copy/doubled" in names
  handle = graph.get_operation_by_name("copy/v")
  # The import keeps the NodeDef's shared_name: two copies would share one
  # variable unless the caller renames it (epl.ir.graph_editor does).
  assert handle.get_attr("shared_name") == b"v"
  assert handle.device == "/device:CPU:0"
  assert "copy/v" in importer.names_in_use(graph)
  assert not created  # the op-creation hook does not see imported ops


@contract("importer.import_nodes", "importer.names_in_use")
def test_import_nodes_maps_inputs_and_does_not_check_names():
  graph_def = tf.compat.v1.GraphDef()
  source = tf.Graph()
  with source.as_default():
    x = tf.compat.v1.placeholder(tf.float32, [], name="x")
    tf.identity(x * 3.0, name="y")
  graph_def.CopyFrom(source.as_graph_def())
  del graph_def.node[0]  # the placeholder comes from input_map
  graph = tf.Graph()
  with graph.as_default():
    four = tf.constant(4.0)
    importer.import_nodes(graph, graph_def, "copy", {"x:0": four})
    y = graph.get_tensor_by_name("copy/y:0")
  assert _run(y, graph) == 12.0
  with graph.as_default():
    unknown = tf.compat.v1.GraphDef()
    unknown.node.add(name="z", op="EplNoSuchOpType")
    with pytest.raises(tf.errors.OpError):
      importer.import_nodes(graph, unknown, "other", {})
    # A taken name is neither refused nor renamed: callers check
    # importer.names_in_use before they import.
    assert "copy/y" in importer.names_in_use(graph)
    assert not importer.import_nodes(graph, graph_def, "copy",
                                     {"x:0": four})


# -------------------------------------------------------------------- ops


def _collective_graph():
  graph = tf.Graph()
  with graph.as_default():
    value = tf.constant([1.0, 2.0])
    reduced = ops.collective_ops.all_reduce_v2(
        value, group_size=1, group_key=5, instance_key=7,
        communication_hint="ring", timeout=3.0)
    gathered = ops.collective_ops.all_gather_v2(
        value, group_size=1, group_key=5, instance_key=8)
    exchanged = ops.collective_ops.all_to_all_v2(
        value, group_size=1, group_key=5, instance_key=9)
  return graph, reduced, gathered, exchanged


@contract("ops.collective_ops")
def test_collective_ops_inputs_and_attributes():
  graph, reduced, gathered, exchanged = _collective_graph()
  assert (reduced.op.type, gathered.op.type, exchanged.op.type) == (
      "CollectiveReduceV2", "CollectiveGatherV2", "CollectiveAllToAllV2")
  # EPL reads and rewrites the keys by position: input 1 the group size,
  # 2 the group key, 3 the instance key.
  for op, instance in ((reduced.op, 7), (gathered.op, 8),
                       (exchanged.op, 9)):
    constant = ops.tensor_util.constant_value
    assert [constant(op.inputs[i]) for i in (1, 2, 3)] == [1, 5, instance]
  assert reduced.op.get_attr("communication_hint") == b"ring"
  assert reduced.op.get_attr("timeout_seconds") == 3.0
  with graph.as_default():
    sent = ops.collective_ops.broadcast_send_v2(
        tf.constant([1.0]), group_size=2, group_key=5, instance_key=10)
    received = ops.collective_ops.broadcast_recv_v2(
        [1], tf.float32, group_size=2, group_key=5, instance_key=10)
  assert (sent.op.type, received.op.type) == ("CollectiveBcastSendV2",
                                              "CollectiveBcastRecvV2")


@contract(
    "ops.control_flow_ops", "ops.gen_resource_variable_ops",
    "ops.gen_state_ops", "ops.resource_variable_ops", "ops.tensor_util")
def test_op_modules_that_epl_builds_with():
  graph = tf.Graph()
  with graph.as_default():
    variable = tf.compat.v1.get_variable("v", initializer=1.0,
                                         use_resource=True)
    assert ops.resource_variable_ops.is_resource_variable(variable)
    read = ops.gen_resource_variable_ops.read_variable_op(
        variable.handle, tf.float32)
    write = ops.gen_resource_variable_ops.assign_variable_op(
        variable.handle, read + 1.0)
    ref = tf.compat.v1.Variable(1.0, use_resource=False)
    assigned = ops.gen_state_ops.assign(ref, 5.0)
    off, on = ops.control_flow_ops.switch(tf.constant(2.0), True)
    assert (off.op.type, on.op.type) == ("Switch", "Switch")
    assert ops.tensor_util.make_tensor_proto(3, tf.int32).int_val == [3]
  with tf.compat.v1.Session(graph=graph) as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(write)
    assert sess.run(read) == 2.0
    assert sess.run(assigned) == 5.0
    assert sess.run(on) == 2.0


@contract("ops.EagerTensor")
def test_eager_tensor_type():
  # The tests run in graph mode: only the type is checked here, and that a
  # graph tensor is not one.
  assert isinstance(ops.EagerTensor, type)
  assert issubclass(ops.EagerTensor, tf.Tensor)
  graph = tf.Graph()
  with graph.as_default():
    assert not isinstance(tf.constant(1.0), ops.EagerTensor)


@contract("ops.variable_spec")
def test_variable_spec_of_an_eager_handle():
  # Eager execution is off in this process (conftest): a fresh one.
  result = _python(
      "import tensorflow as tf\n"
      "from epl.tf_compat import ops\n"
      "v = tf.Variable(tf.zeros([2, 3], tf.float16))\n"
      "dtype, shape = ops.variable_spec(v.handle)\n"
      "print('SPEC', tf.as_dtype(dtype).name,\n"
      "      tf.TensorShape(shape).as_list())\n"
      "print('NONE', ops.variable_spec(tf.constant(1.0)))\n")
  assert "SPEC float16 [2, 3]" in result.stdout, result.stderr[-3000:]
  assert "NONE None" in result.stdout


@contract("tape.GRADIENT_LOOKUP", "tape.is_gradient_registry",
          "tape.forward_op", "tape.original_op_scope")
def test_a_tape_in_a_function_finds_its_forward_ops(monkeypatch):
  owner, attribute = tape.GRADIENT_LOOKUP
  original = getattr(owner, attribute)
  seen = []

  def lookup(registry, op_type):
    function = original(registry, op_type)
    if not tape.is_gradient_registry(registry):
      return function

    def gradient(op, *grads):
      forward = tape.forward_op(op)
      with tape.original_op_scope(forward.graph, forward):
        seen.append((op.type, forward.name,
                     graph_edit.default_original_op(forward.graph).name))
        return function(op, *grads)
    return gradient
  monkeypatch.setattr(owner, attribute, lookup)

  @tf.function
  def step(x, w):
    with tf.GradientTape() as taped:
      taped.watch(w)
      y = tf.reduce_sum(tf.tanh(tf.matmul(x, w, name="product"),
                                name="activation"))
    return taped.gradient(y, w)
  with tf.Graph().as_default():
    step.get_concrete_function(tf.TensorSpec([2, 3]), tf.TensorSpec([3, 1]))
  # The tape's mock of the MatMul keeps no outputs: found by its inputs.
  assert ("MatMul", "product", "product") in seen, seen
  assert ("Tanh", "activation", "activation") in seen, seen


@contract("ops.gradient_registered")
def test_gradient_registered():
  assert ops.gradient_registered("MatMul")
  assert not ops.gradient_registered("EplNoSuchOpType")


# ------------------------------------------------------------------ stats


@contract(
    "stats.OpStats", "stats.register_statistics", "stats.stats_for_node_def",
    "stats.tensor_shape_from_node_def_name")
def test_flops_statistics_registry():
  graph = tf.Graph()
  with graph.as_default():
    product = tf.matmul(tf.ones([2, 3]), tf.ones([3, 4]))
  result = stats.stats_for_node_def(graph, product.op.node_def, "flops")
  assert result.value == 2 * 2 * 3 * 4
  assert stats.OpStats("flops", 5).value == 5
  assert stats.tensor_shape_from_node_def_name(
      graph, product.op.name).as_list() == [2, 4]
  with pytest.raises(KeyError):
    stats.register_statistics("MatMul", "flops", lambda graph, node: None)


# ---------------------------------------------------------------- targets


@contract("targets.CREATE_OP")
def test_create_op_hook_sees_every_op(calls):
  created = calls(targets.CREATE_OP)
  graph = tf.Graph()
  with graph.as_default():
    x = tf.constant(1.0)
    y = tf.raw_ops.AddV2(x=x, y=x)
    tf.graph_util.import_graph_def(graph.as_graph_def(), name="imported")
  names = {args[1].name for args in created}
  assert {x.op.name, y.op.name, "imported/" + x.op.name} <= names
  assert names == {op.name for op in graph.get_operations()}


@contract("targets.GRADIENTS")
def test_gradients_helper_is_behind_tf_gradients(calls):
  helped = calls(targets.GRADIENTS)
  graph = tf.Graph()
  with graph.as_default():
    x = tf.compat.v1.get_variable("x", initializer=2.0)
    loss = x * x
    tf.gradients(loss, x)
    assert len(helped) == 1
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    optimizer.compute_gradients(loss)
    assert len(helped) == 2
    optimizer.minimize(loss)
  assert len(helped) == 3


@contract("targets.DEFAULT_GRAD_YS")
def test_default_grad_ys_makes_the_seeds_of_tf_gradients(calls):
  seeded = calls(targets.DEFAULT_GRAD_YS)
  graph = tf.Graph()
  with graph.as_default():
    x = tf.constant([1.0, 2.0])
    loss = tf.reduce_sum(x * x)
    given = tf.constant(3.0)
    tf.gradients([loss, 2.0 * loss], x, grad_ys=[None, given])
  # Called once per tf.gradients call with its grad_ys and ys: the
  # seed it makes for the output given none is a ones-fill.
  assert len(seeded) == 1
  grad_ys, ys = seeded[0][:2]
  assert grad_ys[0] is None and grad_ys[1] is given and len(ys) == 2


@contract("ops.onednn_graph_rewrites")
def test_onednn_graph_rewrites_answers():
  assert ops.onednn_graph_rewrites() in (True, False)


@contract("targets.TAPE_GRADIENT")
def test_tape_gradient_is_the_method_tapes_call(calls):
  taped = calls(targets.TAPE_GRADIENT)
  assert tf.GradientTape is targets.TAPE_GRADIENT[0]
  graph = tf.Graph()
  with graph.as_default():
    x = tf.constant(3.0)
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = x * x
    grad = tape.gradient(y, x)
  assert len(taped) == 1 and _run(grad, graph) == 6.0


@contract("targets.FUNCTION_CALL")
def test_function_call_is_what_calling_a_tf_function_runs(calls):
  called = calls(targets.FUNCTION_CALL)
  double = tf.function(lambda x: 2.0 * x)
  assert isinstance(double, targets.FUNCTION_CALL[0])
  graph = tf.Graph()
  with graph.as_default():
    result = double(tf.constant(3.0))
  assert len(called) == 1 and _run(result, graph) == 6.0
  concrete = double.get_concrete_function(tf.TensorSpec([], tf.float32))
  assert concrete.graph.captures == [] or list(concrete.graph.captures) == []
  assert concrete.structured_input_signature[0][0].shape == []


@pytest.mark.parametrize("make", [
    lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
    lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
    lambda: tf.compat.v1.train.AdamOptimizer(0.1),
    lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
    lambda: tf.compat.v1.train.RMSPropOptimizer(0.1),
])
@contract("targets.APPLY_GRADIENTS")
def test_compat_v1_optimizers_apply_through_the_patched_method(make, calls):
  owner, attribute = targets.APPLY_GRADIENTS
  assert owner is tf.compat.v1.train.Optimizer
  applied = calls(targets.APPLY_GRADIENTS)
  graph = tf.Graph()
  with graph.as_default():
    optimizer = make()
    assert getattr(type(optimizer), attribute) is getattr(owner, attribute)
    x = tf.compat.v1.get_variable("x", initializer=2.0)
    optimizer.minimize(x * x)
  assert [args[0] for args in applied] == [optimizer]


@contract("training.base_finish")
def test_base_finish_only_groups_the_updates():
  graph = tf.Graph()
  with graph.as_default():
    optimizer = tf.compat.v1.train.AdamOptimizer(0.1)
    x = tf.compat.v1.get_variable("x", initializer=2.0)
    optimizer.minimize(x * x)
    finish = training.base_finish(optimizer)
    assert finish.__func__ is tf.compat.v1.train.Optimizer._finish  # pylint: disable=protected-access
    grouped = finish([tf.no_op(name="update")], "finish")
  assert grouped.type == "NoOp" and grouped.name == "finish"
  assert [c.name for c in grouped.control_inputs] == ["update"]


@contract(
    "targets.GRAPH_FINALIZE", "targets.SESSION_INIT", "targets.SESSION_RUN",
    "targets.WRITE_GRAPH")
def test_graph_finalize_session_and_write_graph_entry_points(calls,
                                                             tmp_path):
  finalized = calls(targets.GRAPH_FINALIZE)
  opened = calls(targets.SESSION_INIT)
  ran = calls(targets.SESSION_RUN)
  assert tf.io.write_graph is targets.WRITE_GRAPH[0].write_graph
  graphs = calls(targets.WRITE_GRAPH)
  graph = tf.Graph()
  with graph.as_default():
    x = tf.constant(1.0)
    global_step = tf.compat.v1.train.get_or_create_global_step()
    step = tf.compat.v1.assign_add(global_step, 1)
  with tf.compat.v1.Session(graph=graph) as sess:
    assert sess.run(x) == 1.0
  assert len(opened) == 1 and len(ran) == 1
  with graph.as_default():
    with tf.compat.v1.train.MonitoredTrainingSession(
        checkpoint_dir=str(tmp_path)) as sess:
      sess.run(step)
  # MonitoredTrainingSession freezes the graph, runs through BaseSession
  # and writes graph.pbtxt through training_util.write_graph.
  assert finalized and finalized[-1][0] is graph
  assert len(opened) == 2 and len(ran) > 2
  assert graphs and graphs[0][1] == str(tmp_path)


@contract(
    "targets.DATASET_ITERATORS", "targets.DATASET_READERS",
    "targets.LIST_FILES")
def test_dataset_entry_points(calls, tmp_path):
  path = str(tmp_path / "data.txt")
  with open(path, "w") as out:
    out.write("a\nb\n")
  readers = [calls(target) for target in targets.DATASET_READERS]
  listed = calls(targets.LIST_FILES)
  iterators = [calls(target) for target in targets.DATASET_ITERATORS]
  graph = tf.Graph()
  with graph.as_default():
    tf.data.TFRecordDataset([path])
    lines = tf.data.TextLineDataset([path])
    tf.data.FixedLengthRecordDataset([path], 1)
    files = tf.data.Dataset.list_files(path, shuffle=False)
    tf.compat.v1.data.make_one_shot_iterator(lines)
    tf.compat.v1.data.make_initializable_iterator(lines)
  assert [len(seen) for seen in readers] == [1, 1, 1]
  assert listed == [(path,)]  # a static method: no `self`
  assert [len(seen) for seen in iterators] == [1, 1]
  assert isinstance(files, tf.data.Dataset)


@contract(
    "targets.EVENT_FILE_WRITER", "targets.SAVER_SAVE", "targets.SAVER_RESTORE")
def test_saver_and_summary_entry_points(calls, tmp_path):
  saved = calls(targets.SAVER_SAVE)
  restored = calls(targets.SAVER_RESTORE)
  writers = calls(targets.EVENT_FILE_WRITER)
  assert tf.compat.v1.train.Saver is targets.SAVER_SAVE[0]
  graph = tf.Graph()
  with graph.as_default():
    tf.compat.v1.get_variable("x", initializer=1.0)
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      path = saver.save(sess, str(tmp_path / "model"))
      saver.restore(sess, path)
    writer = tf.compat.v1.summary.FileWriter(str(tmp_path / "events"), graph)
    writer.close()
  assert [args[0] for args in saved] == [saver]
  assert [args[:3] for args in restored] == [(saver, sess, path)]
  assert [args[0] for args in writers] == [str(tmp_path / "events")]


@contract("targets.ARG_MAX", "targets.EQUAL", "targets.TOP_K")
def test_generated_op_wrappers_behind_argmax_equal_top_k(calls):
  argmaxed = calls(targets.ARG_MAX)
  compared = calls(targets.EQUAL)
  topped = calls(targets.TOP_K)
  graph = tf.Graph()
  with graph.as_default():
    logits = tf.constant([[1.0, 3.0, 2.0]])
    tf.argmax(logits, 1)
    tf.compat.v1.argmax(logits, 1)
    tf.equal(logits, 1.0)
    tf.math.top_k(logits, 2)
    tf.nn.in_top_k(tf.constant([1]), logits, 1)
  assert len(argmaxed) == 2 and len(compared) == 1 and len(topped) == 1


# ------------------------------------------------------------------ keras


@contract("keras.targets")
def test_keras_targets_are_what_v1_layers_use(calls):
  found = keras.targets()
  assert found.problem is None, found.problem
  mro = tf.compat.v1.layers.Dense.__mro__
  owners = [owner for owner, _ in found.add_weight]
  assert len(owners) == 2 and all(owner in mro for owner in owners)
  assert found.dense_class in mro
  assert found.v1_dense == (tf.compat.v1.layers, "dense")
  assert issubclass(tf.keras.layers.Dense, found.dense_class)
  added = calls(found.add_weight[1])
  dense = calls(found.v1_dense)
  graph = tf.Graph()
  with graph.as_default():
    tf.compat.v1.layers.dense(tf.ones([2, 3]), 4)
    tf.compat.v1.layers.Dense(4)(tf.ones([2, 3]))
  # Each dense layer adds its kernel and bias through the v1 base layer.
  assert len(added) == 4 and len(dense) == 1


@contract("keras.targets")
def test_frozen_keras_targets_are_what_tf1_layer_subclasses_use(calls):
  # tensorflow.python.layers.base.Layer (TF's frozen Keras 2) adds its
  # weights through the frozen v1 base layer in TF1 graph mode: its class
  # hierarchy is switched to v1 when a layer is made.
  found = keras.targets()
  assert len(found.frozen_add_weight) == 2
  added = calls(found.frozen_add_weight[1])

  class Scale(tf1_layers_base.Layer):
    def build(self, input_shape):
      self.scale = self.add_weight("scale", [3], initializer="ones")
      super().build(input_shape)

    def call(self, inputs):
      return inputs * self.scale

  with tf.Graph().as_default():
    layer = Scale()
    layer(tf.ones([2, 3]))
  assert found.frozen_add_weight[1][0] in type(layer).__mro__
  assert len(added) == 1 and added[0][1] == "scale"


@contract("keras.targets")
def test_keras_graph_mode_targets_are_what_fit_runs(calls):
  # This process runs in graph mode, as a TF1 script's Model.fit does.
  found = keras.targets()
  compiled = calls(found.v1_compile)
  made = calls(found.graph_function_callable)
  with tf.Graph().as_default():
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
    model.compile(optimizer=tf.keras.optimizers.legacy.SGD(0.1), loss="mse")
    model.fit(np.ones((4, 2), np.float32), np.ones((4, 1), np.float32),
              batch_size=4, verbose=0)
    assert isinstance(model, found.v1_compile[0])
    assert isinstance(model.train_function, found.graph_function_callable[0])
    session = tf.compat.v1.keras.backend.get_session()
    assert keras.is_keras_session(session)
  keras.set_session(None)
  session.close()
  assert len(compiled) == 1 and len(made) == 1


@contract("keras.output_loss_results")
def test_keras_output_loss_results_are_what_fit_reports_per_output():
  # Graph mode (this process): fit of a model with two outputs returns,
  # after the total loss, each output's loss averaged over the epoch.
  with tf.Graph().as_default():
    inputs = tf.keras.Input((2,))
    model = tf.keras.Model(inputs, [tf.keras.layers.Dense(1)(inputs),
                                    tf.keras.layers.Dense(1)(inputs)])
    model.compile(optimizer=tf.keras.optimizers.legacy.SGD(0.1), loss="mse",
                  metrics=["mae"])
    ones = np.ones((4, 2), np.float32)
    model.fit(ones, [ones[:, :1], ones[:, :1]], batch_size=4, verbose=0)
    reported = dict(zip((t.name for t in model.train_function.outputs[1:]),
                        model.metrics_names[1:]))
    found = keras.output_loss_results(model)
    assert sorted(reported[name] for name in found) == sorted(
        name + "_loss" for name in model.output_names)
    session = tf.compat.v1.keras.backend.get_session()
  keras.set_session(None)
  session.close()


@contract("keras.targets")
def test_keras_layer_call_target_is_how_functional_models_call_layers():
  # With eager execution on (a fresh process: this one runs in graph
  # mode), a functional model is built by calling its layers through
  # layer_call, and its call in a traced function calls them through it
  # again.
  done = _python(
      "import tensorflow as tf\n"
      "from epl.tf_compat import keras\n"
      "owner, name = keras.targets().layer_call\n"
      "original, seen = getattr(owner, name), []\n"
      "def spy(layer, *args, **kwargs):\n"
      "  seen.append(type(layer).__name__)\n"
      "  return original(layer, *args, **kwargs)\n"
      "setattr(owner, name, spy)\n"
      "inputs = tf.keras.Input((2,))\n"
      "model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(inputs))\n"
      "built, seen[:] = list(seen), []\n"
      "tf.function(model)(tf.ones((1, 2)))\n"
      "print('built', built, 'traced', sorted(set(seen)))\n")
  assert done.returncode == 0, done.stderr[-2000:]
  assert "built ['Dense'] traced ['Dense', 'Functional']" in done.stdout, (
      done.stdout)


@contract("keras.graph_function_step", "keras.set_graph_function_callable",
          "keras.is_keras_session", "keras.set_session")
def test_keras_backend_function_runs_the_callable_it_is_given():
  graph = tf.Graph()
  with graph.as_default():
    x = tf.compat.v1.placeholder(tf.float32, [None])
    extra = tf.compat.v1.placeholder(tf.float32, [])
    weight = tf.Variable(1.0)
    function = tf.compat.v1.keras.backend.function(
        [x], [tf.reduce_sum(x)], updates=[weight.assign_add(extra)],
        feed_dict={extra: 2.0})
    fetches, target, fed = keras.graph_function_step(function)
    assert fetches == function.outputs and fed == [extra]
    session = tf.compat.v1.Session()
    keras.set_session(session)
    assert keras.is_keras_session(session)
    session.run(weight.initializer)
    arrays_seen = []

    def run(*arrays, run_metadata=None):
      del run_metadata
      arrays_seen.append(len(arrays))
      return session.run([fetches, target], dict(zip([x] + fed, arrays)))[0]

    keras.set_graph_function_callable(function, run, ([x], [], []), session)
    # Keras keeps the callable (the same feeds and session): it runs it with
    # the array for x and the value of its own feed_dict.
    assert function([np.ones(3, np.float32)]) == [3.0]
    assert arrays_seen == [2] and session.run(weight) == 3.0
    keras.set_session(None)
    assert not keras.is_keras_session(session)
    session.close()


@contract("keras.tf_variable_of")
def test_tf_variable_of_is_the_variable_a_gradient_trains(monkeypatch):
  with tf.Graph().as_default():
    variable = tf.Variable(1.0)
    assert keras.tf_variable_of(variable) is variable
    assert keras.tf_variable_of(variable + 1.0) is None
  if importlib.util.find_spec("keras") is None or not importlib.metadata.version(
      "keras").startswith("3."):
    return
  # A Keras 3 variable (TensorFlow backend) holds a tf.Variable.
  monkeypatch.setenv("TF_USE_LEGACY_KERAS", "0")
  done = _python(
      "import keras\n"
      "from epl.tf_compat import keras as compat\n"
      "variable = keras.Variable(1.0)\n"
      "assert compat.tf_variable_of(variable) is variable.value\n"
      "print('found')\n")
  assert done.returncode == 0 and "found" in done.stdout, done.stderr[-2000:]


def test_keras_3_installs_no_layer_hooks(monkeypatch):
  # Under Keras 3 (TF >= 2.16 without TF_USE_LEGACY_KERAS) the v1 layers'
  # package reports a 3.x version: nothing is hooked, and the error says
  # how to get tf-keras.
  package = sys.modules[tf.compat.v1.layers.Dense.__module__.split(".")[0]]
  monkeypatch.setattr(package, "__version__", "3.6.0")
  keras.targets.cache_clear()
  try:
    found = keras.targets()
    assert not found.add_weight and found.dense_call is None
    assert not found.frozen_add_weight
    assert "Keras 3" in found.problem and "TF_USE_LEGACY_KERAS=1" in (
        found.problem)
    with pytest.raises(RuntimeError, match="tf-keras"):
      keras.require_layer_hooks("epl.split")
  finally:
    monkeypatch.undo()
    keras.targets.cache_clear()
  assert keras.targets().problem is None


@contract("keras.keras3_training_targets")
def test_keras3_training_targets_only_where_tf_keras_is_keras3():
  # Keras 3's optimizer `apply` and Model.fit/train_on_batch are refused
  # under EPL only where tf.keras is Keras 3 (tests/test_keras3.py runs
  # that case in a subprocess); Keras 2 ones are never touched.
  found = keras.keras3_training_targets()
  if str(getattr(tf.keras, "__version__", "")).startswith("3."):
    owners = {owner for owner, _ in found}
    assert owners == {tf.keras.optimizers.Optimizer, tf.keras.Model}
    assert issubclass(tf.keras.optimizers.Adam, tf.keras.optimizers.Optimizer)
    for owner, attribute in found:
      assert callable(getattr(owner, attribute)), attribute
  else:
    assert found == ()


def test_missing_keras_targets_raise_a_clear_error(monkeypatch):
  keras.require_layer_hooks("epl.split")
  missing = keras.KerasTargets(problem="TensorFlow 9.9 uses Keras 3 ...")
  monkeypatch.setattr(keras, "targets", lambda: missing)
  with pytest.raises(RuntimeError, match="epl.split needs .*Keras 3"):
    keras.require_layer_hooks("epl.split")
  epl.init()
  with pytest.raises(RuntimeError, match="TensorFlow 9.9 uses Keras 3"):
    with epl.split(1):
      pass


# ---------------------------------------------- estimator, horovod, VERSIONS


@contract("estimator.targets")
@pytest.mark.skipif(not tf_estimator.available(),
                    reason="tensorflow-estimator is not installed")
def test_estimator_targets():
  assert tf.estimator.Estimator and tf_estimator.imported()
  targets = tf_estimator.targets()
  for owner, attribute in targets:
    assert callable(getattr(owner, attribute))
  assert targets[0][0] is tf.estimator.RunConfig
  assert issubclass(tf.estimator.Estimator, targets[1][0])
  assert tf_estimator.train_mode() == tf.estimator.ModeKeys.TRAIN


@pytest.mark.skipif(not tf_estimator.available(),
                    reason="tensorflow-estimator is not installed")
def test_estimator_import_is_watched_not_made():
  # In a fresh process: epl.init does not import the Estimator (importing
  # it marks TF's session hooks deprecated), and EPL's hooks are on the
  # Estimator as soon as the script imports it.
  script = (
      "import sys, tensorflow as tf, epl\n"
      "epl.init()\n"
      "assert 'tensorflow_estimator' not in sys.modules\n"
      "from epl.tf_compat import estimator\n"
      "run_config_init = tf.estimator.RunConfig.__init__\n"
      "assert estimator.imported()\n"
      "hooked = lambda f: f.__code__.co_filename.endswith('hooks.py')\n"
      "assert hooked(run_config_init)\n"
      "epl.shutdown()\n"
      "assert not hooked(tf.estimator.RunConfig.__init__)\n"
      "print('ok')\n")
  result = _python(script)
  assert result.stdout.strip() == "ok", result.stderr[-3000:]


@contract("horovod.horovod_api")
def test_horovod_missing_says_how_to_install(monkeypatch):
  monkeypatch.setitem(sys.modules, "horovod.tensorflow", None)
  with pytest.raises(ImportError, match="make horovod"):
    horovod.horovod_api()


@pytest.mark.parametrize("entry", sorted(tf_compat.VERSIONS))
def test_versions_entry_is_a_compat_function_with_a_contract(entry):
  module, name = entry.split(".")
  assert hasattr(importlib.import_module("epl.tf_compat." + module), name)
  assert CONTRACTS[entry], "no contract test checks %s" % entry
  supported = tf_compat.VERSIONS[entry]
  assert supported.first <= supported.last
  assert supported.keras in (tf_compat.ANY_KERAS, tf_compat.KERAS_2,
                             tf_compat.KERAS_3)


def test_this_tensorflow_is_in_every_required_range():
  tf_compat.check(tf.__version__)
  assert all(s.holds(TF_VERSION) for s in tf_compat.VERSIONS.values()
             if not s.optional)


@pytest.mark.parametrize("version", ["2.14.1", "2.22.0", "3.0.0rc1"])
def test_an_unsupported_tensorflow_is_refused_naming_the_function(version):
  with pytest.raises(ImportError, match=(
      r"TensorFlow %s: epl\.tf_compat\.graph_edit\.update_input \(and \d+ "
      r"more\) .* TensorFlow 2\.15-2\.21" % re.escape(version))):
    tf_compat.check(version)


def test_an_unsupported_tensorflow_fails_at_import():
  # In a fresh process whose TensorFlow says it is 2.22: importing any
  # compat module raises EPL's error before TensorFlow's internals load.
  script = (
      "import tensorflow as tf\n"
      "tf.__version__ = '2.22.0'\n"
      "try:\n"
      "  from epl.tf_compat import graph_edit\n"
      "except ImportError as error:\n"
      "  print(error)\n")
  result = _python(script)
  assert "EPL does not support TensorFlow 2.22.0" in result.stdout, (
      result.stdout + result.stderr[-3000:])


@contract("keras.build_layer")
def test_keras_layer_built_in_a_trace_has_eager_weights():
  # A split Dense head builds its weights while the step is traced: they
  # must be eager variables, as at its first call.
  done = _python(
      "import tensorflow as tf\n"
      "from epl.tf_compat import keras\n"
      "layer = tf.keras.layers.Dense(5)\n"
      "@tf.function\n"
      "def step(x):\n"
      "  keras.build_layer(layer, x)\n"
      "  return tf.matmul(x, layer.kernel)\n"
      "step(tf.ones([2, 3]))\n"
      "assert layer.built and layer.kernel.shape == (3, 5)\n"
      "print('built', layer.kernel.numpy().shape)\n")
  assert done.returncode == 0 and "built" in done.stdout, done.stderr[-2000:]


@contract("collective_order.unchain", "collective_order.drop_chain")
def test_collectives_in_a_function_are_chained_unless_each_has_a_token():
  done = _python(
      "import tensorflow as tf\n"
      "from epl.tf_compat import collective_order\n"
      "from epl.tf_compat.ops import collective_ops\n"
      "spec = tf.TensorSpec([], tf.float32)\n"
      "@tf.function\n"
      "def two(x):\n"
      "  return (collective_ops.all_reduce_v2(x, 1, 7, 1) +\n"
      "          collective_ops.all_reduce_v2(x, 1, 7, 2))\n"
      "def chained(graph):\n"
      "  ops = [op for op in graph.get_operations()\n"
      "         if op.type == 'CollectiveReduceV2']\n"
      "  assert len(ops) == 2\n"
      "  return any(c in ops for op in ops for c in op.control_inputs)\n"
      "graph = two.get_concrete_function(spec).graph\n"
      "assert chained(graph)\n"
      "graph_def = collective_order.drop_chain(graph.as_graph_def())\n"
      "collective_order.unchain(graph_def)\n"
      "out = [t.name for t in graph.outputs][0]\n"
      "@tf.function\n"
      "def imported(x):\n"
      "  return tf.graph_util.import_graph_def(\n"
      "      graph_def, input_map={'x:0': x}, return_elements=[out],\n"
      "      name='')[0]\n"
      "assert not chained(imported.get_concrete_function(spec).graph)\n"
      "print('unchained', float(imported(tf.constant(3.0))))\n")
  assert done.returncode == 0 and "unchained 6.0" in done.stdout, (
      done.stderr[-2000:])


@contract("keras.count_train_step", "keras.steps_per_execution")
def test_keras_fit_counters_are_what_fit_keeps():
  # Eagerly, as Model.fit keeps them (this process runs in graph mode).
  done = _python(
      "import tensorflow as tf\n"
      "from epl.tf_compat import keras\n"
      "model = tf.keras.Sequential([tf.keras.layers.Dense(1, "
      "input_shape=(2,))])\n"
      "model.compile(optimizer='sgd', loss='mse', steps_per_execution=3)\n"
      "assert keras.steps_per_execution(model) == 3\n"
      "before = int(model._train_counter.numpy())\n"
      "keras.count_train_step(model)\n"
      "assert int(model._train_counter.numpy()) == before + 1\n"
      "print('counted')\n")
  assert done.returncode == 0 and "counted" in done.stdout, done.stderr[-2000:]


@contract("thread_pools.ask_pool_per_device")
def test_asked_before_the_first_device_every_cpu_device_has_its_own_pool():
  # With one pool per process, a second session's devices would start no
  # intra-op threads; with a pool per device each session's 4 devices start
  # one each (intra_op_parallelism_threads 1), and closing frees them.
  done = _python(
      "import os\n"
      "import tensorflow as tf\n"
      "from epl.tf_compat import thread_pools\n"
      "thread_pools.ask_pool_per_device()\n"
      "assert thread_pools.pool_per_device_in_environment()\n"
      "tf.compat.v1.disable_eager_execution()\n"
      "def threads():\n"
      "  return len(os.listdir('/proc/self/task'))\n"
      "config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1)\n"
      "config.device_count['CPU'] = 4\n"
      "started = []\n"
      "for _ in range(2):\n"
      "  before = threads()\n"
      "  session = tf.compat.v1.Session(config=config)\n"
      "  started.append(threads() - before)\n"
      "  session.close()\n"
      "print('started', *started)\n")
  assert done.returncode == 0, done.stderr[-2000:]
  started = [int(n) for n in done.stdout.split("started", 1)[1].split()]
  assert started[1] >= 4, started
