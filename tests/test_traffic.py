"""Traffic per device and kind, counted from the rewritten graph, equals
each layout's formula exactly on small layouts (epl.tools.traffic), and
what TensorFlow sends when the step runs."""
import collections
from fractions import Fraction

import pytest
import tensorflow as tf

import epl
from epl.ir import transfers
from epl.parallel import engine
from epl.tools import dry_run
from epl.tools import memory_estimate
from epl.tools import traffic
from examples.moe import model as moe
from tests import test_moe
from tests import test_split
from tests import tf_versions
from tests import training

DEVICES = 4
FLOAT32 = 4
# training.four_equal_layers: four 8x8 float32 weights, one per replica
# under ZeRO's size-balanced partition.
PSI = 4 * 8 * 8 * FLOAT32


def _rewrite(config, model=training.four_equal_layers, default_strategy=True,
             batch=16):
  """The rewrite result of `model` (squared error, Momentum: no optimizer
  state shared by the variables) under `config`, built without a run,
  `batch` examples a replica (None: fed, of unknown size)."""
  epl.init(epl.Config(dict({"cluster.num_cpu_devices": DEVICES}, **config)))
  if default_strategy:
    epl.set_default_strategy(epl.replicate(device_count=1))
  graph = tf.Graph()
  with graph.as_default():
    if batch is None:
      x = tf.compat.v1.placeholder(tf.float32, [None, training.FEATURES])
      y = tf.compat.v1.placeholder(tf.float32, [None, 1])
    else:
      x, y = training.input_batch(batch, static_batch=True)
    loss = tf.reduce_mean(tf.square(model(x) - y))
    training.OPTIMIZERS["momentum"]().minimize(loss)
    return engine.ensure_rewritten(graph)


def _sent(result, kind):
  return [device.sent.get(kind, 0) for device in traffic.count(result)]


def _received(result, kind):
  return [device.received.get(kind, 0) for device in traffic.count(result)]


def _row(result, kind):
  (row,) = [r for r in traffic.compare(result) if r.kind == kind]
  return row


@pytest.mark.parametrize("local_sums", [False, True])
@pytest.mark.parametrize("micro_batches", [1, 2])
def test_data_parallel_sends_the_ring_formula(local_sums, micro_batches):
  """A copy of the weights per replica, ring all-reduce: 2(N-1)/N * Ψ
  per replica, once per step (the micro-batch loop sums first). Local
  sums: each of the four equal gradients has its own root, which receives
  3 and sends 3 copies; each other member sends and receives one: per
  device the same."""
  result = _rewrite({"communication.local_cpu_reduce": local_sums,
                     "communication.shared_weights": False,
                     "pipeline.num_micro_batch": micro_batches})
  ring = Fraction(2 * (DEVICES - 1), DEVICES) * PSI
  assert _sent(result, traffic.ALL_REDUCE) == [ring] * DEVICES
  assert _received(result, traffic.ALL_REDUCE) == [ring] * DEVICES
  row = _row(result, traffic.ALL_REDUCE)
  assert (row.formula, row.ratio, row.worst) == ("2(N-1)/N*G", 1, 1)
  # No other traffic but the other replicas' batches, read on device 0.
  kinds = {r.kind for r in traffic.compare(result)}
  assert kinds == {traffic.ALL_REDUCE, traffic.INPUT}


def test_shared_weights_send_gradients_to_their_sums_and_means_once():
  """One copy of the weights on CPU:0, read by the 3 other replicas
  without a copy. Each of the four equal gradients (g = Ψ/4) is summed on
  its own device (the local sums rotate): each replica sends its other 3
  gradients there, and the 3 sums not on CPU:0 send their mean to the one
  update on CPU:0: Ψ per device, 3g from CPU:0. Nothing goes back."""
  result = _rewrite({})
  gradient = PSI // DEVICES
  assert _sent(result, traffic.ALL_REDUCE) == [3 * gradient] + [PSI] * 3
  # A sum's device receives the 3 other replicas' gradient; CPU:0 also
  # the 3 means.
  assert _received(result, traffic.ALL_REDUCE) == [6 * gradient] + [
      3 * gradient] * 3
  row = _row(result, traffic.ALL_REDUCE)
  assert (row.formula, row.ratio, row.worst) == (
      "G; replica 0: G-G_0 (shared weights)", 1, 1)
  assert _sent(result, traffic.SHARED_READ) == [3 * PSI, 0, 0, 0]
  assert _received(result, traffic.SHARED_READ) == [0] + [PSI] * 3
  row = _row(result, traffic.SHARED_READ)
  assert (row.formula, row.ratio, row.worst) == (
      "(N-1)*W from replica 0", 1, 1)
  assert {r.kind for r in traffic.compare(result)} == {
      traffic.ALL_REDUCE, traffic.SHARED_READ, traffic.INPUT}
  assert "handed over without a copy: not traffic" in dry_run.describe(
      result)


def test_float16_communication_halves_the_all_reduce():
  result = _rewrite({"communication.fp16": True,
                     "communication.local_cpu_reduce": False})
  ring = Fraction(2 * (DEVICES - 1), DEVICES) * PSI
  assert _sent(result, traffic.ALL_REDUCE) == [ring / 2] * DEVICES
  row = _row(result, traffic.ALL_REDUCE)
  assert (row.formula, row.ratio) == ("2(N-1)/N*G (G as float16)", 1)


def test_two_stage_pipeline_sends_its_boundary_both_ways():
  """8 -> 16 tanh | -> 1, 2 micro-batches of 16: stage 0 sends the
  [16, 16] activation of each micro-batch and receives its gradient."""
  result = _rewrite({"pipeline.num_micro_batch": 2,
                     "cluster.num_cpu_devices": 2},
                    model=training.staged_model(), default_strategy=False)
  boundary = 16 * 16 * FLOAT32
  assert _sent(result, traffic.PIPELINE) == [2 * boundary] * 2
  assert _received(result, traffic.PIPELINE) == [2 * boundary] * 2
  row = _row(result, traffic.PIPELINE)
  assert (row.formula, row.ratio, row.worst) == ("M*A", 1, 1)
  # The labels, read with stage 0's input, go to stage 1 once per
  # micro-batch.
  assert _sent(result, traffic.INPUT) == [2 * 16 * FLOAT32, 0]
  assert not any(_sent(result, traffic.OTHER))


# v3 gathers every use of a weight, over TensorFlow's collectives here
# (with local sums one member joins the shards: see the next test).
@pytest.mark.parametrize("level, micro_batches, scatters, gathers", [
    ("v1", 1, 1, 1), ("v2", 1, 1, 1), ("v3", 1, 1, 2),
    # v1 sums a replica's micro-batches before it sends them; v2 and v3
    # send each micro-batch's gradient; v3 gathers in each micro-batch's
    # forward and backward.
    ("v1", 2, 1, 1), ("v2", 2, 2, 1), ("v3", 2, 2, 4)])
def test_zero_reduces_to_owners_and_gathers_weights(level, micro_batches,
                                                    scatters, gathers):
  """Each replica owns one weight (v3: one shard of each): it receives
  the 3 others' gradients of it and sends its new value (v3: its shard)
  to them; it sends its gradient of each of the 3 others' weights and
  receives their values. (N-1)/N * Ψ each way: 2(N-1)/N * Ψ in all for v1
  and v2 as the ring, 3(N-1)/N * Ψ for v3 (16 rows a replica against
  8x8 weights: v3 sends gradient rows, see
  test_v3_makes_shard_gradients_from_few_activation_rows)."""
  result = _rewrite({"zero.level": level, "zero.min_partition_size": 0,
                     "pipeline.num_micro_batch": micro_batches,
                     "communication.local_cpu_reduce": False})
  share = Fraction(DEVICES - 1, DEVICES) * PSI
  for kind, times in ((traffic.REDUCE_SCATTER, scatters),
                      (traffic.ALL_GATHER, gathers)):
    assert _sent(result, kind) == [times * share] * DEVICES, kind
    assert _received(result, kind) == [times * share] * DEVICES, kind
    assert (_row(result, kind).ratio, _row(result, kind).worst) == (1, 1)
  assert _row(result, traffic.ALL_GATHER).formula == (
      "%s(N-1)/N*W" % ("%d*" % gathers if gathers > 1 else ""))
  assert traffic.ALL_REDUCE not in {r.kind for r in traffic.compare(result)}


def test_v3_local_sums_gather_joins_the_shards_on_one_member():
  """Local sums gather a weight by one concatenation on one member
  (rotating) that every member reads: it receives N-1 shards and sends
  N-1 weights, (N+1)/N times the ring's bytes over the devices."""
  result = _rewrite({"zero.level": "v3", "zero.min_partition_size": 0})
  row = _row(result, traffic.ALL_GATHER)
  assert row.formula == "2*(N-1)/N*W*(N+1)/N"
  assert row.measured == DEVICES * 2 * Fraction(DEVICES - 1, DEVICES) * (
      Fraction(DEVICES + 1, DEVICES)) * PSI
  assert row.ratio == 1
  assert _row(result, traffic.REDUCE_SCATTER).ratio == 1


@pytest.mark.parametrize("batch, micro_batches", [(1, 1), (1, 2)])
def test_v3_makes_shard_gradients_from_few_activation_rows(batch,
                                                           micro_batches):
  """R = M `batch` rows a replica against 8x8 kernels over N = 4: from
  activations a replica sends each other one its x columns [R, 2] and its
  dy [R, 8], (N-1) R (2 + 8) floats a kernel, fewer than M (N-1) 2 x 8 of
  gradient rows; the plan takes that route for each kernel, says why, and
  the formula counts it exactly."""
  result = _rewrite({"zero.level": "v3", "zero.min_partition_size": 0,
                     "pipeline.num_micro_batch": micro_batches,
                     "communication.local_cpu_reduce": False}, batch=batch)
  columns = training.FEATURES // DEVICES
  moved = 4 * (DEVICES - 1) * micro_batches * batch * (columns + training.FEATURES) * FLOAT32
  assert moved < 4 * micro_batches * (DEVICES - 1) * columns * (
      training.FEATURES) * FLOAT32
  assert _sent(result, traffic.REDUCE_SCATTER) == [moved] * DEVICES
  assert _received(result, traffic.REDUCE_SCATTER) == [moved] * DEVICES
  row = _row(result, traffic.REDUCE_SCATTER)
  assert (row.ratio, row.worst) == (1, 1)
  assert row.formula.endswith("(N-1)/N*R*(in + N*out) from activations")
  routes = [l for l in result.plan.decisions.lines()
            if l.startswith("v3 gradient shards of")]
  assert len(routes) == 4 and all(
      "gradient shards from activations, because a replica sends %d bytes"
      % (moved // 4) in l for l in routes), routes


@pytest.mark.parametrize("level, shared", [
    ("", False), ("", True), ("v1", False), ("v2", False), ("v3", False)])
def test_persistent_bytes_equal_the_zero_formula(level, shared):
  """Weights, gradients and momentum per device: (W + G + K)Ψ without
  ZeRO, WΨ + (G + K)Ψ/N for v1 and v2, (W + G + K)Ψ/N for v3. Shared
  weights: (W + G + K)Ψ on replica 0's device, which holds the weights
  and their momentum once, and each other replica's own gradients GΨ."""
  result = _rewrite({"zero.level": level, "zero.min_partition_size": 0,
                     "communication.shared_weights": shared})
  per_device = {"": [3 * PSI] * DEVICES,
                "v1": [PSI + 2 * PSI // DEVICES] * DEVICES,
                "v2": [PSI + 2 * PSI // DEVICES] * DEVICES,
                "v3": [3 * PSI // DEVICES] * DEVICES}[level]
  if shared:
    per_device = [3 * PSI] + [PSI] * (DEVICES - 1)
  assert traffic.persistent(result) == [
      ("/device:CPU:%d" % d, held, held)
      for d, held in enumerate(per_device)]


def test_pipeline_of_two_replicas_sums_each_stage_over_its_replicas():
  """2 stages x 2 replicas on 4 devices: each device all-reduces its
  stage's gradients with the other replica's (N = 2) and sends its
  boundary both ways."""
  result = _rewrite({"pipeline.num_micro_batch": 2},
                    model=training.staged_model(), default_strategy=False)
  layers = [(8 * 16 + 16) * FLOAT32, (16 + 1) * FLOAT32]
  # Plan order: replica 0's stages, then replica 1's.
  assert _sent(result, traffic.ALL_REDUCE) == layers * 2
  assert _sent(result, traffic.PIPELINE) == [2 * 16 * 16 * FLOAT32] * 4
  for kind in (traffic.ALL_REDUCE, traffic.PIPELINE):
    assert (_row(result, kind).ratio, _row(result, kind).worst) == (1, 1)


def test_offloaded_variables_are_host_transfers():
  """offload v0 keeps every variable and update on the host (CPU:0 here,
  also replica 0's device): the other replicas read the weights from it
  (their gradients reach it through the all-reduce)."""
  result = _rewrite({"offload.level": "v0"})
  sent = _sent(result, traffic.HOST)
  assert sent[0] > 0 and not any(sent[1:])
  assert all(_received(result, traffic.HOST)[1:])
  assert _row(result, traffic.HOST).formula == "-"


def test_expert_all_to_alls_match_the_moe_formula():
  """An expert layer over 4 devices, one example of 4 tokens per device:
  dispatch and combine are all-to-alls of the [experts, groups, capacity,
  model] buffer B, each moving (N-1)/N * B; backward runs the combine's
  adjoint (nothing before the layer is trained, so not the dispatch's)."""
  epl.init(epl.Config({"cluster.num_cpu_devices": DEVICES,
                       "cluster.colocate_split_and_replicate": True}))
  epl.set_default_strategy(epl.replicate(DEVICES))
  graph = tf.Graph()
  with graph.as_default():
    x, y = test_moe._batch(test_moe.LOCAL_BATCH)  # pylint: disable=protected-access
    outputs, aux_loss = moe.moe_layer(
        x, test_moe.EXPERTS, test_moe.HIDDEN, test_moe.CAPACITY, seed=5,
        split_scope=epl.split(DEVICES))
    loss = tf.reduce_mean(tf.square(outputs - y)) + 0.01 * aux_loss
    training.OPTIMIZERS["momentum"]().minimize(loss)
    result = engine.ensure_rewritten(graph)
  buffer = (test_moe.EXPERTS * test_moe.LOCAL_BATCH * test_moe.CAPACITY *
            test_moe.MODEL * FLOAT32)
  exchanged = 3 * Fraction(DEVICES - 1, DEVICES) * buffer
  assert _sent(result, traffic.ALL_TO_ALL) == [exchanged] * DEVICES
  row = _row(result, traffic.ALL_TO_ALL)
  assert (row.ratio, row.worst) == (1, 1)
  assert _row(result, traffic.ALL_REDUCE).ratio == 1
  # Each member's expert shards (their slots, gradients) and a copy of
  # the gate.
  assert all(m == f for _, m, f in traffic.persistent(result))


def test_epl_plan_prints_traffic_beside_the_formula():
  text = dry_run.describe(_rewrite({"zero.level": "v1"}))
  assert "traffic per step (bytes each device sends" in text
  assert "persistent bytes per device" in text
  (line,) = [l for l in text.splitlines()
             if l.strip().startswith("reduce-scatter")]
  assert line.split()[1:] == ["(N-1)/N*G", "768", "768", "1.000", "1.000"]


def test_split_head_gathers_its_input_and_scatters_its_gradient():
  """A data-parallel backbone and a dense + softmax head split over the 4
  devices: forward gathers the hidden [8, 16] float32 rows and the int64
  labels of every device ((N-1) * P each); backward reduce-scatters the
  rows' gradient as an all-to-all of the same bytes."""
  epl.init(epl.Config({"cluster.num_cpu_devices": DEVICES,
                       "cluster.colocate_split_and_replicate": True}))
  graph = tf.Graph()
  with graph.as_default():
    x, labels = test_split._classification_batch(  # pylint: disable=protected-access
        test_split.LOCAL_BATCH, 12, static_batch=True)
    with epl.replicate(DEVICES):
      hidden = tf.compat.v1.layers.dense(x, 16, activation=tf.nn.tanh)
    with epl.split(DEVICES):
      loss, _ = test_split._head(hidden, labels, 12, "losses")  # pylint: disable=protected-access
    training.OPTIMIZERS["momentum"]().minimize(loss)
    result = engine.ensure_rewritten(graph)
  rows = test_split.LOCAL_BATCH
  hidden_bytes, label_bytes = rows * 16 * FLOAT32, rows * 8
  assert _sent(result, traffic.ALL_GATHER) == [
      (DEVICES - 1) * (hidden_bytes + label_bytes)] * DEVICES
  assert _sent(result, traffic.ALL_TO_ALL) == [
      (DEVICES - 1) * hidden_bytes] * DEVICES
  assert not any(d.unknown for d in traffic.count(result))
  for kind in (traffic.ALL_GATHER, traffic.ALL_TO_ALL):
    assert (_row(result, kind).ratio, _row(result, kind).worst) == (1, 1)
  # The backbone's gradients by local sums (their roots differ in size),
  # the softmax statistics' all-reduces and their adjoints.
  assert _row(result, traffic.ALL_REDUCE).ratio == 1
  # The head's kernel and bias count at their shard's size.
  assert all(m == f for _, m, f in traffic.persistent(result))


def test_weight_read_by_another_stage_crosses_once_a_step_each_way():
  """A weight W that stage 1 reads too is sent to it once a step, read
  there by both micro-batches (M = 2), and stage 1 sums its part of W's
  gradient over them before sending it back once: M A + W each way, the
  formula."""
  result = _rewrite({"pipeline.num_micro_batch": 2,
                     "cluster.num_cpu_devices": 2},
                    model=training.tied_stages, default_strategy=False)
  activations, weight = 2 * 16 * 16 * FLOAT32, 8 * 16 * FLOAT32
  assert _sent(result, traffic.PIPELINE) == [activations + weight] * 2
  assert _received(result, traffic.PIPELINE) == [activations + weight] * 2
  row = _row(result, traffic.PIPELINE)
  assert (row.formula, row.ratio, row.worst) == ("M*A + 2*W_shared", 1, 1)
  assert "cross stage weights: once a step, because" in dry_run.describe(result)


def test_zero_v2_reads_a_weight_of_another_stage_in_each_micro_batch():
  """ZeRO v2 sends each micro-batch's gradient to its owner: the plan
  keeps a read of the shared weight per micro-batch, and the formula
  counts it M times each way (2 replicas); epl-plan says so."""
  result = _rewrite({"pipeline.num_micro_batch": 2,
                     "cluster.num_cpu_devices": 4, "zero.level": "v2"},
                    model=training.tied_stages, default_strategy=False)
  row = _row(result, traffic.PIPELINE)
  assert (row.formula, row.ratio) == ("M*A + 2*M*W_shared", 1)
  assert ("cross stage weights: each micro-batch, because zero.level v2"
          in dry_run.describe(result))


@pytest.mark.parametrize("shared", [False, True])
def test_tensors_of_unknown_size_are_reported_not_guessed(shared):
  """A fed batch of unknown size: its rows' transfers cannot be counted;
  the gradients' sums still are (with a copy of the weights per replica
  and with one they share), and epl-plan says what it left out."""
  result = _rewrite({"cluster.num_cpu_devices": 2,
                     "communication.shared_weights": shared}, batch=None)
  assert any(d.unknown for d in traffic.count(result))
  assert _row(result, traffic.ALL_REDUCE).ratio == 1
  assert traffic.shares_weights(result) is shared
  assert "are not counted: the counts are low" in "\n".join(
      traffic.lines(result))


def test_v3_makes_shard_gradients_from_activations_of_unknown_rows():
  """A batch of unknown size: the bytes of the two routes cannot be
  compared; the plan makes the kernels' shard gradients from the
  activations (no full-size gradient on a replica) and says why."""
  result = _rewrite({"zero.level": "v3", "zero.min_partition_size": 0},
                    batch=None)
  routes = [l for l in result.plan.decisions.lines()
            if l.startswith("v3 gradient shards of")]
  assert len(routes) == 4 and all(
      "from activations, because its batch size is not static" in l
      for l in routes), routes


def test_horovod_sums_within_a_process_on_the_first_member():
  """One Horovod process of 4 replicas: the sum runs on the first
  member's device, which receives the 3 other gradients and sends the sum
  to each (no Horovod op: there is no other process); the mean over the
  devices is the ring's."""
  tf_versions.require_horovod()
  result = _rewrite({"communication.backend": "horovod"})
  assert _sent(result, traffic.ALL_REDUCE) == [3 * PSI, PSI, PSI, PSI]
  row = _row(result, traffic.ALL_REDUCE)
  assert (row.ratio, row.worst) == (1, 2)


def _partitioned_sends(config, model, default_strategy=True):
  """({device: bytes it sends}, {device: bytes it receives}) of one step
  as TensorFlow's partitioner made it (the _Send nodes of the run's
  partition graphs, less those of control edges, which send no tensor of
  the graph, and of constants, which TensorFlow 2.21 copies instead), and
  the rewrite result."""
  result = _rewrite(config, model, default_strategy)
  graph = result.context.graph
  metadata = tf.compat.v1.RunMetadata()
  with graph.as_default(), tf.compat.v1.Session() as session:
    session.run(tf.compat.v1.global_variables_initializer())
    session.run(traffic.step_roots(result), options=tf.compat.v1.RunOptions(
        output_partition_graphs=True), run_metadata=metadata)
  names = {t.name: t for op in graph.get_operations() for t in op.outputs}
  sent, received = collections.Counter(), collections.Counter()
  for partition in metadata.partition_graphs:
    for node in partition.node:
      name = node.input[0] if node.op == "_Send" else ""
      tensor = names.get(name if ":" in name else name + ":0")
      if tensor is None or tensor.op.type == "Const":
        continue
      size = memory_estimate.tensor_bytes(tensor)
      sent[_local(node.attr["send_device"].s.decode())] += size
      received[_local(node.attr["recv_device"].s.decode())] += size
  return sent, received, result


def _local(device):
  """`device` without its job, replica and task (the runtime names them,
  the graph does not)."""
  spec = tf.DeviceSpec.from_string(device)
  return tf.DeviceSpec(device_type=spec.device_type,
                       device_index=spec.device_index).to_string()


@pytest.mark.parametrize("config, model, default_strategy", [
    ({}, training.four_equal_layers, True),
    ({"communication.shared_weights": False}, training.four_equal_layers,
     True),
    ({"zero.level": "v1"}, training.four_equal_layers, True),
    ({"pipeline.num_micro_batch": 2, "cluster.num_cpu_devices": 2},
     training.staged_model(), False),
    ({"pipeline.num_micro_batch": 2, "cluster.num_cpu_devices": 2},
     training.tied_stages, False)],
                         ids=["shared_weights", "local_sums", "zero_v1",
                              "pipeline", "tied"])
def test_counts_are_what_tensorflow_sends(config, model, default_strategy):
  """Every transfer counted is one TensorFlow's partitioner makes when
  the step runs, byte for byte per device (these layouts use no
  collective op; a shared read is a _Send/_Recv pair too)."""
  sent, received, result = _partitioned_sends(config, model,
                                              default_strategy)
  counts = traffic.count(result)
  assert {_local(c.device): sum(c.sent.values()) for c in counts} == sent
  assert {_local(c.device): sum(c.received.values())
          for c in counts} == received


def test_a_variable_read_runs_where_the_variable_is():
  """TensorFlow's placer runs a read asked on CPU:1 of a variable on
  CPU:0 on CPU:0, and sends the value: the one transfer counted."""
  graph = tf.Graph()
  with graph.as_default():
    with tf.device("/device:CPU:0"):
      variable = tf.compat.v1.get_variable("v", [4, 4], use_resource=True)
    with tf.device("/device:CPU:1"):
      read = tf.raw_ops.ReadVariableOp(resource=variable.handle,
                                       dtype=tf.float32)
      doubled = read * 2.0
    metadata = tf.compat.v1.RunMetadata()
    with tf.compat.v1.Session(config=tf.compat.v1.ConfigProto(
        device_count={"CPU": 2})) as session:
      session.run(variable.initializer)
      session.run(doubled, options=tf.compat.v1.RunOptions(
          output_partition_graphs=True), run_metadata=metadata)
  placed = {node.name: _local(node.device)
            for partition in metadata.partition_graphs
            for node in partition.node}
  placement = transfers.Placement()
  assert placement(read.op) == placed[read.op.name] == "/device:CPU:0"
  (transfer,) = transfers.cross_device_transfers(
      transfers.step_ops([doubled.op]), placement)
  assert (transfer.tensor, transfer.source, transfer.destination,
          transfer.readers) == (read, "/device:CPU:0", "/device:CPU:1",
                                (doubled.op,))
