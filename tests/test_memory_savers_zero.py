"""ZeRO, offload and grouped apply train like single-device TensorFlow on
the same global batch, with data parallelism, micro-batches and pipelines;
where their state lives; checkpoints both ways; errors."""
import itertools
import logging

import numpy as np
import pytest
import tensorflow as tf

import epl
from epl.ir import graph_editor
from epl.ir.op_types import (VARIABLE_ASSIGN_TYPES, VARIABLE_READ_TYPES,
                             VARIABLE_TYPES)
from epl.ir.phase import Phase
from tests import training

MICRO = 8


# Adam's update of a resource variable, and of a reference variable
# (EPL_TEST_TF1_BEHAVIOUR=1).
ADAM_UPDATE_TYPES = ("ResourceApplyAdam", "ApplyAdam")


def _layouts():
  """(name, model, devices, config, default strategy, batch multiple)."""
  return {
      "dp4": (training.layers_model, {"cluster.num_cpu_devices": 4}, True, 4),
      "dp4_micro2": (training.layers_model,
                     {"cluster.num_cpu_devices": 4,
                      "pipeline.num_micro_batch": 2}, True, 8),
      "pipe2x2": (training.staged_model((16, 1)),
                  {"cluster.num_cpu_devices": 4,
                   "pipeline.num_micro_batch": 2}, False, 4),
  }


def _check(layout, optimizer, savers, model=None):
  layout_model, config, default_strategy, multiple = _layouts()[layout]
  model = model or layout_model
  expected, _, _ = training.train(model, optimizer, batch_size=MICRO * multiple,
                                  with_epl=False)
  actual, _, graph = training.train(
      model, optimizer, batch_size=MICRO, default_strategy=default_strategy,
      config=dict(config, **savers))
  training.assert_close(actual, expected)
  assert actual["global_step"] == 5
  return graph


# ------------------------------------------------------------ grouped apply


@pytest.mark.parametrize("layout", ["dp4", "dp4_micro2", "pipe2x2"])
@pytest.mark.parametrize("optimizer", ["adam", "momentum"])
def test_grouped_apply_matches_single_device(layout, optimizer):
  _check(layout, optimizer, {"optimizer.num_apply_group": 3})


def test_groups_run_one_after_another_and_finish_once():
  _, _, graph = training.train(
      optimizer="adam", steps=1,
      config={"cluster.num_cpu_devices": 2, "optimizer.num_apply_group": 3})
  updates = [op for op in graph.get_operations()
             if op.type in ADAM_UPDATE_TYPES and
             not op.name.startswith("EPL_REPLICA")]
  order = ["Adam_group_0", "Adam_group_1", "Adam"]
  # 4 variables (kernel 8x16, bias 16, kernel 16x1, bias 1) in 3 groups.
  assert sorted({op.name.split("/")[0] for op in updates}) == sorted(order)
  for op in updates:
    index = order.index(op.name.split("/")[0])
    before = {a.name for a in graph_editor.ancestors([op])}
    assert [g in before for g in order[:-1]] == [i < index for i in range(2)]
  beta_updates = [op for op in graph.get_operations()
                  if op.type in VARIABLE_ASSIGN_TYPES and
                  op.inputs[0].op.name == "beta1_power" and
                  op.name != "beta1_power/Assign"]  # not the initializer
  assert len(beta_updates) == 1


class _OwnApply(tf.compat.v1.train.GradientDescentOptimizer):
  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    return super().apply_gradients(grads_and_vars, global_step, name)


def test_grouped_apply_warns_for_an_optimizer_with_its_own_apply(caplog):
  training.OPTIMIZERS["own_apply"] = lambda: _OwnApply(0.05)
  try:
    expected, _, _ = training.train(optimizer="own_apply",
                                    batch_size=2 * MICRO, with_epl=False)
    with caplog.at_level(logging.WARNING, logger="epl"):
      actual, _, _ = training.train(
          optimizer="own_apply", batch_size=MICRO,
          config={"cluster.num_cpu_devices": 2,
                  "optimizer.num_apply_group": 2})
  finally:
    del training.OPTIMIZERS["own_apply"]
  training.assert_close(actual, expected)
  assert [r for r in caplog.records
          if "num_apply_group = 2" in r.getMessage()]


# ------------------------------------------------------------------- ZeRO


@pytest.mark.parametrize("layout", ["dp4", "dp4_micro2", "pipe2x2"])
@pytest.mark.parametrize("level", ["v0", "v1"])
def test_zero_matches_single_device(layout, level):
  _check(layout, "adam", {"zero.level": level})


@pytest.mark.parametrize("layout", ["dp4", "dp4_micro2", "pipe2x2"])
@pytest.mark.parametrize("optimizer", ["adam", "momentum"])
def test_zero_v2_matches_single_device(layout, optimizer):
  _check(layout, optimizer, {"zero.level": "v2"})


@pytest.mark.parametrize("micro_batches", [1, 2])
@pytest.mark.parametrize("optimizer", ["adam", "momentum"])
def test_zero_v1_with_one_trained_variable(optimizer, micro_batches):
  # tied_stages trains one variable, w, on stage 0; the optimizer joins
  # stage 1. Adam's beta1_power and beta2_power are then read by w's update
  # alone, yet each replica's finish multiplies them: they stay one per
  # replica (not w's state, on w's owner, stepped by both replicas).
  config = {"cluster.num_cpu_devices": 4,
            "pipeline.num_micro_batch": micro_batches, "zero.level": "v1"}
  expected, _, _ = training.train(
      training.tied_stages, optimizer,
      batch_size=MICRO * micro_batches * 2, with_epl=False)
  actual, _, graph = training.train(
      training.tied_stages, optimizer, batch_size=MICRO,
      default_strategy=False, config=config)
  training.assert_close(actual, expected)
  powers = sorted(op.name for op in graph.get_operations()
                  if op.type in VARIABLE_TYPES and "_power" in op.name)
  assert powers == ([] if optimizer == "momentum" else [
      "EPL_REPLICA_1/beta1_power", "EPL_REPLICA_1/beta2_power",
      "beta1_power", "beta2_power"])
  # w's own slots still exist once, on its owner.
  assert sorted(_slots(graph)) == ([] if optimizer == "momentum" else
                                   ["w/Adam", "w/Adam_1"])


@pytest.mark.parametrize("layout", ["dp4", "dp4_micro2"])
@pytest.mark.parametrize("level", ["v0", "v1", "v2", "v3"])
def test_zero_with_one_trained_variable_and_data_parallel(layout, level):
  _check(layout, "adam", {"zero.level": level, "zero.min_partition_size": 0},
         model=training.one_variable_model)


# zero.level v3 partitioning every variable of the small test models.
V3 = {"zero.level": "v3", "zero.min_partition_size": 0}


@pytest.mark.parametrize("layout", ["dp4", "dp4_micro2", "pipe2x2"])
@pytest.mark.parametrize("optimizer", ["adam", "momentum"])
def test_zero_v3_matches_single_device(layout, optimizer):
  _check(layout, optimizer, V3)


@pytest.mark.parametrize("micro_batches", [1, 4])
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_zero_v3_with_a_fed_batch_read_by_a_partitioned_matmul(
    optimizer, micro_batches, caplog):
  # The first layer's MatMul reads the fed placeholder itself, so each
  # replica's shard gradient must be made from its own part of the fed
  # batch (a tf.data input is cloned per replica and never showed this).
  rows = 32  # 5 steps' batches within dataset_arrays' 256 rows
  expected, _ = training.train_fed(optimizer=optimizer, rows=rows, steps=5)
  with caplog.at_level(logging.INFO, logger="epl"), \
      training.epl_logs_caught(caplog):
    actual, _ = training.train_fed(
        {"cluster.num_cpu_devices": 2,
         "pipeline.num_micro_batch": micro_batches,
         "zero.level": "v3", "zero.min_partition_size": 16},
        optimizer=optimizer, rows=rows, steps=5)
  training.assert_close(actual, expected)
  # Both kernels partitioned, their shard gradients from the activations.
  assert "ZeRO v3: 3 weight(s) partitioned over 2 replicas" in caplog.text
  assert "gradient shards from activations 2" in caplog.text


def _variable_shapes(graph):
  """{device: {variable op name without replica prefix: shape}}."""
  shapes = {}
  for op in graph.get_operations():
    if op.type in VARIABLE_TYPES and op.name != "global_step":
      name = op.name.split("/", 1)[1] if op.name.startswith(
          "EPL_REPLICA_") else op.name
      shapes.setdefault(op.device, {})[name] = tf.TensorShape(
          op.get_attr("shape")).as_list()
  return shapes


def test_zero_v3_devices_hold_their_shards_only():
  """Each of 4 replicas holds rows [r * c, (r + 1) * c) of every weight
  above zero.min_partition_size and of its Adam slots (c = ceil(rows / 4),
  zero padding past the end); the variables below it stay whole, their
  slots on one owner (v2); single-device values come back in full."""
  graph = _check("dp4", "adam", {"zero.level": "v3",
                                 "zero.min_partition_size": 16})
  shapes = _variable_shapes(graph)
  assert sorted(shapes) == ["/device:CPU:%d" % d for d in range(4)]
  sharded = {"dense/kernel": [2, 16], "dense/bias": [4],
             "dense_1/kernel": [4, 1]}
  owned_slots = {}
  for device, variables in shapes.items():
    for weight, shard in sharded.items():
      for name in (weight, weight + "/Adam", weight + "/Adam_1"):
        assert variables[name] == shard, (device, name)
    # One weight (dense_1/bias, 1 element) stays whole on every replica.
    assert variables["dense_1/bias"] == [1]
    for name in ("dense_1/bias/Adam", "dense_1/bias/Adam_1"):
      if name in variables:
        owned_slots.setdefault(name, []).append(device)
    assert variables["beta1_power"] == [] and variables["beta2_power"] == []
  assert [len(d) for d in owned_slots.values()] == [1, 1]
  # The updates of each shard run with it, on shard-sized gradients.
  updates = [op for op in graph.get_operations()
             if op.type in ADAM_UPDATE_TYPES]
  assert len(updates) == 4 * 3 + 1
  for op in updates:
    assert op.device == op.inputs[0].op.device, op.name


def _gathers_and_uses(step):
  """{device: [(all-gather, the ops reading the gathered weight)]} of the
  gathers of partitioned weights among the ops `step` (CollectiveGatherV2s,
  or with local sums one ConcatV2 of the shard reads that every replica
  reads)."""
  found = {}
  for op in step:
    if op.type == "ConcatV2" and not all(
        t.op.type == "PlaceholderWithDefault" and
        t.op.inputs[0].op.type in VARIABLE_READ_TYPES
        for t in op.inputs[:-1]):
      continue
    if op.type not in ("CollectiveGatherV2", "ConcatV2"):
      continue
    readers = list(op.outputs[0].consumers())
    if len(readers) == 1 and readers[0].type == "Slice":
      # The padding rows cut off.
      readers = list(readers[0].outputs[0].consumers())
    found.setdefault(op.device, []).append((op, readers))
  return found


def _alive_together(gathers, count):
  """Groups of `count` of `gathers` (of one device) that the graph lets
  exist at once: for none of their pairs do all readers of one come before
  the other's gather."""
  before = {gather.name: {a.name for a in graph_editor.ancestors([gather])}
            for gather, _ in gathers}

  def ordered(first, second):
    return (all(r.name in before[second[0].name] for r in first[1]) or
            all(r.name in before[first[0].name] for r in second[1]))
  return [tuple(g[0].name for g in group)
          for group in itertools.combinations(gathers, count)
          if not any(ordered(a, b)
                     for a, b in itertools.combinations(group, 2))]


@pytest.mark.parametrize("local_sums,window", [(False, 1), (True, 1),
                                               (True, 2)])
def test_zero_v3_gathers_ahead_and_frees_after_use(local_sums, window):
  """Every forward and backward use of a partitioned weight reads an
  all-gather of its shards made for it alone (CollectiveGatherV2 on each
  of the 4 replicas' devices; with local sums one concatenation the 4
  replicas read); by the rewritten graph's dependencies, a device never
  holds more than the gathered weight in use and the `window`
  (zero.prefetch_layers) prefetched for the next uses, and may hold that
  many; the step computes no full-size weight gradient (each shard's rows
  are made from the layer's inputs)."""
  graph = _check("dp4", "adam", dict(
      V3, **{"communication.local_cpu_reduce": local_sums,
             "zero.prefetch_layers": window}),
                 model=training.four_equal_layers)
  # What minimize returned: the global step's increment.
  step = graph_editor.ancestors([graph.get_operation_by_name("Adam")])
  found = _gathers_and_uses(step)
  gathers = [g for pairs in found.values() for g in pairs]
  # Forward: 4 MatMuls; backward: the input gradient of each layer (the
  # first's too: minimize gates every gradient of a MatMul together).
  assert len(gathers) == 8 * (1 if local_sums else 4)
  for gather, readers in gathers:
    assert gather.type == ("ConcatV2" if local_sums else
                           "CollectiveGatherV2")
    assert [r.type for r in readers] == ["MatMul"] * (4 if local_sums else 1)
    if not local_sums:
      assert readers[0].device == gather.device
  # With local sums the worker holds one copy of each gathered weight,
  # wherever its concatenation runs: count them all together.
  for pairs in [gathers] if local_sums else found.values():
    assert _alive_together(pairs, window + 2) == [], pairs[0][0].device
    assert _alive_together(pairs, window + 1) != [], pairs[0][0].device
  full = [op.name for op in step if op.type == "MatMul" and
          op.outputs[0].shape.as_list() == [training.FEATURES] * 2]
  assert full == []


def _two_losses(x, y):
  """Two heads' losses summed: the second head's backward needs only its
  own forward (the sum's gradient is a constant), so a topological order
  may put it before the first head's forward, as BERT's two heads are."""
  init = tf.compat.v1.random_normal_initializer(stddev=0.3, seed=7)
  trunk = tf.compat.v1.get_variable(
      "trunk", [training.FEATURES, training.FEATURES], initializer=init)
  hidden = tf.nn.tanh(tf.matmul(x, trunk))
  losses = []
  # The first head is deep: its MatMul comes late in a topological order,
  # after the second head's backward (which needs no forward value but
  # its own) could have started.
  for name, depth in (("first", 12), ("second", 0)):
    inputs = hidden
    for _ in range(depth):
      inputs = tf.nn.tanh(inputs) * 0.9 + 0.1
    head = tf.compat.v1.get_variable(name, [training.FEATURES, 1],
                                     initializer=init)
    losses.append(tf.reduce_mean(tf.square(tf.matmul(inputs, head) - y)))
  return losses[0] + losses[1]


def _train_two_losses(batch_size, config=None):
  if config:
    epl.init(epl.Config(config))
    epl.set_default_strategy(epl.replicate(device_count=1))
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.input_batch(batch_size)
    train_op = training.OPTIMIZERS["momentum"]().minimize(_two_losses(x, y))
  return training.run_steps(graph, train_op, 4)


def test_zero_v3_gathers_respect_the_schedule_of_two_heads():
  """With micro-batches the schedule makes each micro-batch's backward
  wait for all its forward; the gathers' chain follows it (a chain in
  topological order alone closed a cycle through BERT's two heads)."""
  _, config, _, multiple = _layouts()["dp4_micro2"]
  expected = _train_two_losses(MICRO * multiple)
  actual = _train_two_losses(MICRO, dict(config, **V3))
  training.assert_close(actual, expected)


def test_zero_v3_whole_values_outside_the_step():
  """Fetching a partitioned variable, or a slot, gives its whole value;
  assigning a whole value writes every replica's slice; an assign_add of
  a partitioned variable, and Variable.load (it feeds the initializer's
  value, now replica 0's slice), are errors naming it."""
  epl.init(epl.Config(dict(V3, **{"cluster.num_cpu_devices": 4})))
  epl.set_default_strategy(epl.replicate(device_count=1))
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.input_batch(MICRO)
    loss = tf.reduce_mean(tf.square(training.get_variable_model(x) - y))
    optimizer = training.OPTIMIZERS["momentum"]()
    train_op = optimizer.minimize(loss)
    w1 = [v for v in tf.compat.v1.global_variables() if v.op.name == "w1"][0]
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(train_op)
      value = session.run(w1)
      assert value.shape == (training.FEATURES, 16)
      assert session.run(optimizer.get_slot(w1, "momentum")).shape == (
          value.shape)
      session.run(w1.assign(np.ones_like(value)))
      np.testing.assert_array_equal(session.run(w1), np.ones_like(value))
      shards = training.read_variables(session, graph, [
          "EPL_REPLICA_%d/w1" % r for r in (1, 2, 3)])
      assert {v.shape for v in shards.values()} == {(2, 16)}
      assert all((v == 1).all() for v in shards.values())
      with pytest.raises(ValueError) as raised:
        w1.load(np.zeros_like(value), session)
      assert "Variable.load" in str(raised.value)
      assert "'w1'" in str(raised.value)
      increment = w1.assign_add(np.ones_like(value))
      with pytest.raises(ValueError) as raised:
        session.run(increment)
  for word in ("zero.level v3", increment.name.split(":")[0], "'w1'",
               "zero.min_partition_size"):
    assert word in str(raised.value)


@pytest.mark.parametrize("level", ["v1", "v2"])
def test_zero_v2_sums_micro_batches_on_the_owner_only(level):
  """With 2 micro-batches v1 has every replica sum its micro-batches'
  gradients (a full set per replica) before the owner reduces the sums; v2
  sends each micro-batch's gradient to its owner, which alone sums them.
  (v1 as copies, to compare the same structure; v2 always copies.)"""
  graph = _check("dp4_micro2", "momentum",
                 {"zero.level": level, "pipeline.accumulation": "copies"})
  step = graph_editor.ancestors([graph.get_operation_by_name("Momentum")])
  sums = [op for op in step
          if op.name.split("/")[-1].startswith("add_") and
          "EPL_MICRO_BATCH_ACCUMULATION" in op.name]
  # 4 weights, each summed over 2 micro-batches by one add per replica.
  assert len(sums) == (4 * 4 if level == "v1" else 0)
  # Resource variables, or reference ones under TF1 behaviour.
  updates = [op for op in step
             if op.type in ("ResourceApplyMomentum", "ApplyMomentum")]
  assert len(updates) == 4
  for update in updates:
    gradient = update.inputs[3].op
    reduced = graph_editor.ancestors([gradient])
    # Each replica's gradient of each micro-batch reaches the owner's sum
    # directly (v2), or through its replica's sum (v1).
    parts = [op for op in reduced if op.device != update.device and
             op.name.split("/")[-1] in ("MatMul_1", "Sum", "BiasAddGrad")]
    assert len({op.device for op in parts}) == 3
    assert gradient.device == update.device


def _slots(graph):
  """{slot variable op: device} of Adam's slots, every replica."""
  return {op.name: op.device for op in graph.get_operations()
          if op.type in VARIABLE_TYPES and op.name.split("/")[-1] in (
              "Adam", "Adam_1")}


def _slot_elements_per_device(graph):
  per_device = {}
  for op in graph.get_operations():
    if op.type in VARIABLE_TYPES and op.name.split("/")[-1] in ("Adam",
                                                                "Adam_1"):
      elements = tf.TensorShape(op.get_attr("shape")).num_elements()
      per_device[op.device] = per_device.get(op.device, 0) + elements
  return per_device


@pytest.mark.parametrize("level", ["v0", "v1"])
def test_zero_slots_exist_once_on_their_owner(level):
  expected, _, plain = training.train(training.four_equal_layers, "adam",
                                      batch_size=4 * MICRO, with_epl=False)
  actual, _, graph = training.train(
      training.four_equal_layers, "adam", batch_size=MICRO,
      # Collective all-reduce, as across workers, for the check below.
      config={"cluster.num_cpu_devices": 4, "zero.level": level,
              "communication.local_cpu_reduce": False})
  training.assert_close(actual, expected)
  slots = _slots(graph)
  # Once over all replicas, under the user's names.
  assert sorted(slots) == sorted(_slots(plain))
  per_device = _slot_elements_per_device(graph)
  total = sum(_slot_elements_per_device(plain).values())
  assert sorted(per_device) == ["/device:CPU:%d" % d for d in range(4)]
  assert set(per_device.values()) == {total // 4}
  # Each slot sits with its owner's copy of the variable and its update.
  for name, device in slots.items():
    weight = name.split("/")[0]
    [update] = [op for op in graph.get_operations()
                if op.name.startswith("Adam/update_%s/" % weight) and
                op.type in ADAM_UPDATE_TYPES]
    assert update.device == device
    owner = device[-1]
    assert update.inputs[0].op.name == (
        weight if owner == "0" else "EPL_REPLICA_%s/%s" % (owner, weight))
  # v0 all-reduces the gradients; v1 reduces each on its owner only.
  all_reduces = [op for op in graph.get_operations()
                 if op.type == "CollectiveReduceV2"]
  assert bool(all_reduces) == (level == "v0")


# ------------------------------------------------------------ checkpoints


def _run(config, steps, restore=None, save=None):
  """Trains Adam `steps` steps (under EPL with `config` on 4 replicas, else
  plain TF on their global batch) after restoring `restore`; saves to
  `save`; returns the trained values."""
  batch = MICRO if config else 4 * MICRO
  epl.shutdown()
  if config:
    epl.init(epl.Config(dict({"cluster.num_cpu_devices": 4}, **config)))
    epl.set_default_strategy(epl.replicate(device_count=1))
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.input_batch(batch)
    loss = tf.reduce_mean(tf.square(training.layers_model(x) - y))
    step = tf.compat.v1.train.get_or_create_global_step()
    train_op = training.OPTIMIZERS["adam"]().minimize(loss, global_step=step)
    saver = tf.compat.v1.train.Saver()
    names = [v.op.name for v in tf.compat.v1.global_variables()]
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      if restore:
        saver.restore(session, restore)
      for _ in range(steps):
        session.run(train_op)
      if save:
        saver.save(session, save)
      return training.read_variables(session, graph, names)


def _checkpoint(path):
  reader = tf.train.load_checkpoint(path)
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()}


SAVERS = [{"zero.level": "v0"}, {"zero.level": "v1"}, {"zero.level": "v2"},
          V3, {"zero.level": "v3", "zero.min_partition_size": 16},
          {"offload.level": "v0"},
          {"zero.level": "v1", "offload.level": "v0",
           "optimizer.num_apply_group": 2}]


@pytest.mark.parametrize("savers", SAVERS, ids=lambda s: ",".join(
    "%s=%s" % kv for kv in sorted(s.items())))
def test_checkpoints_round_trip_with_single_device(savers, tmp_path):
  single, parallel = str(tmp_path / "single"), str(tmp_path / "parallel")
  _run(None, 3, save=single)
  _run(savers, 3, save=parallel)
  # The parallel run's checkpoint: every variable and slot once, under its
  # own name, equal to the single-device one.
  training.assert_close(_checkpoint(parallel), _checkpoint(single))
  # A single-device checkpoint (slots included) restores into the parallel
  # run: it goes on as single-device TF does.
  expected = _run(None, 2, restore=single)
  training.assert_close(_run(savers, 2, restore=single), expected)
  # And the parallel run's checkpoint into single-device TF.
  training.assert_close(_run(None, 2, restore=parallel), expected)


# ---------------------------------------------------------------- offload


@pytest.mark.parametrize("layout", ["dp4", "dp4_micro2", "pipe2x2"])
def test_offload_matches_single_device(layout):
  graph = _check(layout, "adam", {"offload.level": "v0"})
  host = "/device:CPU:0"
  variables = [op for op in graph.get_operations()
               if op.type in VARIABLE_TYPES and op.name != "global_step"]
  replicas = 2 if layout == "pipe2x2" else 4
  # 4 weights with Adam's 2 slots each, and Adam's 2 powers, per replica.
  assert len(variables) == replicas * (4 * 3 + 2)
  assert {op.device for op in variables} == {host}
  updates = [op for op in graph.get_operations()
             if op.type in ADAM_UPDATE_TYPES]
  assert len(updates) == replicas * 4
  assert {op.device for op in updates} == {host}
  # So does the GraphDef a session runs (the copies' devices used to stay
  # those they were copied with there).
  placed = {node.name: node.device for node in graph.as_graph_def().node}
  assert {placed[op.name] for op in variables + updates} == {host}
  # The compute stays on the replicas' devices; each op there reads the
  # weights through a read of its own, made after its other inputs.
  checked = 0
  for op in graph.get_operations():
    reads = [t.op for t in op.inputs if t.op.type in VARIABLE_READ_TYPES and
             t.op.inputs and t.op.inputs[0].op.type in VARIABLE_TYPES]
    if op.device == host or not reads:
      continue
    checked += 1
    assert len(reads) == 1, op.name
    read = reads[0]
    assert read.device == host and read.name.startswith("EPL_OFFLOAD/")
    assert [c.name for c in read.outputs[0].consumers()] == [op.name]
    other = [t.op for t in op.inputs if t.op is not read]
    assert set(read.control_inputs) == set(other), op.name
  # At least the forward reads of every weight off the host.
  assert checked >= 4 * replicas - 4


# ----------------------------------------------------- together, and errors


@pytest.mark.parametrize("level, micro_batches", [
    ("v0", 1), ("v1", 1), ("v2", 1), ("v1", 2), ("v2", 2), ("v3", 1),
    ("v3", 2)])
def test_zero_with_sparse_gradients(level, micro_batches, caplog):
  from tests.test_data_parallel import _embedding_train  # pylint: disable=import-outside-toplevel
  expected = _embedding_train(False, 4 * micro_batches * MICRO, "adam")
  with training.epl_logs_caught(caplog):
    actual = _embedding_train(True, MICRO, "adam", {
        "zero.level": level, "pipeline.num_micro_batch": micro_batches,
        "zero.min_partition_size": 0})
  training.assert_close(actual, expected)
  # v3 keeps the embedding table (sparse gradients) whole, and says so.
  assert bool([r for r in caplog.records if "table get sparse gradients"
               in r.getMessage()]) == (level == "v3")


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_zero_v3_partitions_embeddings_with_dense_gradients(micro_batches):
  """With communication.sparse_as_dense, v3 partitions the embedding
  table too: each lookup gathers its rows from the gathered table."""
  from tests.test_data_parallel import _embedding_train  # pylint: disable=import-outside-toplevel
  settings = {"communication.sparse_as_dense": True}
  expected = _embedding_train(True, 4 * micro_batches * MICRO, "momentum",
                              dict(settings, **{"cluster.num_cpu_devices": 1}))
  actual = _embedding_train(True, MICRO, "momentum", dict(
      settings, **V3, **{"pipeline.num_micro_batch": micro_batches}))
  training.assert_close(actual, expected)


@pytest.mark.parametrize("layout", ["dp4", "dp4_micro2", "pipe2x2"])
@pytest.mark.parametrize("level", ["v0", "v1"])
def test_zero_offload_and_grouped_apply_together(layout, level):
  _check(layout, "adam", {"zero.level": level, "offload.level": "v0",
                          "optimizer.num_apply_group": 2})


@pytest.mark.parametrize("config, error, words", [
    ({"zero.level": "v1", "communication.clip_after_allreduce": True},
     ValueError, ["zero.level", "communication.clip_after_allreduce"]),
    ({"zero.level": "v2", "communication.clip_after_allreduce": True},
     ValueError, ["zero.level", "'v2'", "communication.clip_after_allreduce"]),
])
def test_zero_settings_that_cannot_work(config, error, words):
  with pytest.raises(error) as raised:
    training.train(steps=1, config=dict({"cluster.num_cpu_devices": 2},
                                        **config))
  for word in words:
    assert word in str(raised.value)


def test_zero_v3_under_the_partition_size_warns_and_works_as_v2(caplog):
  """The test model's largest variable has 128 elements, under the
  default zero.min_partition_size: nothing is partitioned, v2 runs."""
  with training.epl_logs_caught(caplog):
    graph = _check("dp4", "adam", {"zero.level": "v3"})
  assert [r for r in caplog.records
          if "partitions no variable" in r.getMessage() and
          "zero.min_partition_size" in r.getMessage()]
  assert len(_slots(graph)) == 8  # each slot once, on its owner (v2)


def test_zero_with_one_replica_warns(caplog):
  with caplog.at_level(logging.WARNING, logger="epl"):
    training.train(steps=1, config={"zero.level": "v0"})
  assert [r for r in caplog.records if "no effect" in r.getMessage()]


@pytest.mark.parametrize("savers", SAVERS, ids=lambda s: ",".join(
    "%s=%s" % kv for kv in sorted(s.items())))
def test_reference_variables(savers):
  """TF1 reference variables (VariableV2): reads are Identity ops."""
  expected, _, _ = training.train(training.ref_variable_model, "adam",
                                  batch_size=4 * MICRO, with_epl=False)
  actual, _, _ = training.train(
      training.ref_variable_model, "adam", batch_size=MICRO,
      config=dict({"cluster.num_cpu_devices": 4}, **savers))
  training.assert_close(actual, expected)


@pytest.mark.parametrize("level, micro_batches", [
    ("v0", 1), ("v1", 1), ("v2", 1), ("v2", 2)])
def test_zero_with_summed_gradients(level, micro_batches):
  # Summing 4 replicas' (and micro-batches') mean-loss gradients equals the
  # gradient of 4 (8) x the global mean loss.
  parts = 4 * micro_batches
  expected, _, _ = training.train(batch_size=parts * MICRO, loss_scale=parts,
                                  with_epl=False)
  actual, _, _ = training.train(
      batch_size=MICRO, config={
          "cluster.num_cpu_devices": 4, "zero.level": level,
          "pipeline.num_micro_batch": micro_batches,
          "communication.gradients_reduce_method": "sum"})
  training.assert_close(actual, expected)


def test_zero_v0_with_clipping_after_the_all_reduce():
  def run(config, batch_size):
    epl.shutdown()
    if config:
      epl.init(epl.Config(config))
      epl.set_default_strategy(epl.replicate(device_count=1))
    return training.clipped_training(
        lambda: tf.compat.v1.train.AdamOptimizer(0.05), batch_size)
  expected = run(None, 4 * MICRO)
  training.assert_close(run({"cluster.num_cpu_devices": 4, "zero.level": "v0",
                             "communication.clip_after_allreduce": True},
                            MICRO), expected)


def test_zero_partitions_each_stage_over_its_replicas():
  graph = _check("pipe2x2", "adam", {"zero.level": "v1"})
  # Replica 0's stages are on devices 0 and 1, replica 1's on 2 and 3; each
  # stage's larger variable goes to replica 0, its smaller one to replica 1.
  expected = {"layer_0/kernel": 0, "layer_0/bias": 2, "layer_1/kernel": 1,
              "layer_1/bias": 3}
  slots = _slots(graph)
  assert len(slots) == 2 * len(expected)
  for name, device in slots.items():
    assert device == "/device:CPU:%d" % expected[name.rsplit("/", 1)[0]], name
