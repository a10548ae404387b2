"""epl-plan / EPL_DRY_RUN: the plan is printed and nothing runs; the memory
estimate counts parameters, optimizer state and activations right."""
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

import epl
from epl.tools import memory_estimate
from epl.ir.graph_state import state_of
from epl.parallel import engine
from epl.parallel.plan.weight_partition import WeightSharding
from epl.tools import dry_run

import training

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from examples.bert_large import train as bert  # noqa: E402  pylint: disable=wrong-import-position
TIMEOUT = 240

# A two-stage pipeline (2 micro-batches) on 2 logical CPU devices. Its
# variable `flag` is initialised by a py_func that writes the file
# "initialised"; after its first training step the script writes
# "stepped". With "run_first" it runs a session before building a step;
# with "monitored_checkpoint_dir", its MonitoredTrainingSession writes
# events and checkpoints into the markers' folder "checkpoints".
SCRIPT = textwrap.dedent("""
    import os, sys
    import numpy as np
    import tensorflow as tf
    import epl

    tf.compat.v1.disable_eager_execution()
    mode, markers = sys.argv[1], sys.argv[2]

    def mark(name):
      def write():
        open(os.path.join(markers, name), "w").close()
        return np.float32(1)
      return write

    epl.init(epl.Config({"cluster.num_cpu_devices": 2,
                         "pipeline.num_micro_batch": 2}))
    if mode == "run_first":
      with tf.compat.v1.Session() as session:
        session.run(tf.constant(1.0))
    rng = np.random.RandomState(0)
    data = tf.data.Dataset.from_tensor_slices(
        (rng.normal(size=(64, 8)).astype(np.float32),
         rng.normal(size=(64, 1)).astype(np.float32)))
    x, y = tf.compat.v1.data.make_one_shot_iterator(
        data.repeat().batch(16, drop_remainder=True)).get_next()
    with epl.replicate(device_count=1, name="stage_0"):
      flag_value = tf.compat.v1.py_func(mark("initialised"), [], tf.float32)
      flag_value.set_shape([])
      flag = tf.compat.v1.get_variable("flag", initializer=flag_value,
                                       trainable=False)
      hidden = tf.compat.v1.layers.dense(x, 16, activation=tf.nn.tanh)
    with epl.replicate(device_count=1, name="stage_1"):
      loss = tf.reduce_mean(tf.square(
          tf.compat.v1.layers.dense(hidden, 1) - y)) * flag
    step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(
        loss, global_step=step)
    if mode.startswith("monitored"):
      checkpoint_dir = (os.path.join(markers, "checkpoints")
                        if mode == "monitored_checkpoint_dir" else None)
      with tf.compat.v1.train.MonitoredTrainingSession(
          checkpoint_dir=checkpoint_dir) as session:
        session.run(train_op)
    else:
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        session.run(train_op)
    mark("stepped")()
    print("trained")
""")


@pytest.fixture(name="script")
def _script(tmp_path):
  path = tmp_path / "train_small.py"
  path.write_text(SCRIPT)
  markers = tmp_path / "markers"
  markers.mkdir()
  return path, markers


def _run(command, dry, markers):
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  env.pop(dry_run.ENV_VAR, None)
  if dry:
    env[dry_run.ENV_VAR] = "1"
  process = subprocess.run(command, cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=TIMEOUT, check=False)
  return (process.returncode, process.stdout, process.stderr,
          sorted(os.listdir(markers)))


def _assert_plan_without_step(result):
  code, out, err, markers = result
  assert code == 0, err[-3000:]
  assert markers == [], "the dry run initialised or stepped: %s" % markers
  assert "trained" not in out
  assert "EPL plan (dry run" in out
  assert "pipeline: 2 stage(s), 2 micro-batch(es) per step, schedule " \
         "PreferBackward (1F1B)" in out
  assert "pipeline bubble: (p-1)/(m+p-1) = 1/3 = 33.3%" in out
  assert "0 'stage_0'" in out and "1 'stage_1'" in out
  assert "estimated memory per device at the step's peak (KiB" in out
  assert "ZeRO: weights + gradients + optimizer state per device" in out
  assert re.search(r"stage\s+parameters\s+W\s+G\s+K\s+off\s+v0\s+v1\s+"
                   r"v2\s+v3", out)
  assert re.search(r"/device:CPU:0\s+0\s", out)
  assert re.search(r"/device:CPU:1\s+1\s", out)


@pytest.mark.parametrize("mode", ["session", "monitored",
                                  "monitored_checkpoint_dir"])
def test_dry_run_prints_plan_and_runs_no_step(script, mode):
  """A dry run writes nothing: no marker, and no events file or checkpoint
  in the script's checkpoint_dir (its hooks make their writers before EPL
  plans)."""
  path, markers = script
  command = [sys.executable, str(path), mode, str(markers)]
  # Without the dry run the script initialises and trains (the markers
  # work), and writes into its checkpoint_dir.
  code, out, err, written = _run(command, False, markers)
  assert code == 0, err[-3000:]
  expected = ["initialised", "stepped"]
  if mode == "monitored_checkpoint_dir":
    expected.insert(0, "checkpoints")
    assert any(name.startswith("events.out.tfevents.") for name in
               os.listdir(os.path.join(markers, "checkpoints")))
  assert written == expected and "trained" in out
  for name in written:
    target = os.path.join(markers, name)
    (shutil.rmtree if os.path.isdir(target) else os.remove)(target)
  _assert_plan_without_step(_run(command, True, markers))


def test_epl_plan_entry_point(script):
  path, markers = script
  with open(os.path.join(ROOT, "setup.py"), encoding="utf-8") as setup:
    assert '"epl-plan=epl.tools.dry_run:main"' in setup.read()
  # What the console script runs: sys.exit(main()) with the arguments.
  entry = [sys.executable, "-c",
           "import sys; from epl.tools.dry_run import main; sys.exit(main())"]
  _assert_plan_without_step(
      _run(entry + [str(path), "session", str(markers)], False, markers))
  _assert_plan_without_step(_run(
      [sys.executable, "-m", "epl.tools.dry_run", str(path), "session",
       str(markers)], False, markers))


def test_dry_run_refuses_a_run_before_the_training_step(script):
  path, markers = script
  code, _, err, written = _run(
      [sys.executable, str(path), "run_first", str(markers)], True, markers)
  assert code == 1
  assert "runs its session before building a training step" in err
  assert written == []


def test_epl_plan_fails_on_a_script_without_a_plan(tmp_path):
  path = tmp_path / "no_epl.py"
  path.write_text("print('no model here')\n")
  code, out, err, _ = _run(
      [sys.executable, "-m", "epl.tools.dry_run", str(path)], False, tmp_path)
  assert code == 1
  assert "no model here" in out
  assert "ended without building a training step" in err


def staged_step(widths, static_batch=True):
  """A graph with the training step (Adam) of `training.staged_model`
  of `widths` built, not run, on batches of 16 examples whose batch
  dimension is static or not."""
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.dataset_arrays()
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
        16, drop_remainder=static_batch)
    x, y = tf.compat.v1.data.make_one_shot_iterator(data).get_next()
    loss = tf.reduce_mean(tf.square(training.staged_model(widths)(x) - y))
    tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss)
  return graph


def _pipeline_rewrite(schedule="PreferBackward", static_batch=True,
                      widths=(16, 1), micro_batches=2, **extra):
  """The rewrite result of a staged MLP (8 -> 16 tanh -> 1 by default, one
  stage per width, Adam), `micro_batches` micro-batches of 16 examples, on
  2 logical CPU devices, with config keys `extra`; the input's batch
  dimension is static or not."""
  epl.init(epl.Config(dict({"cluster.num_cpu_devices": 2,
                            "pipeline.num_micro_batch": micro_batches,
                            "pipeline.strategy": schedule}, **extra)))
  graph = staged_step(widths, static_batch)
  with graph.as_default():
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
  return state_of(graph).rewrite_result


def test_interleaved_estimate_holds_what_each_device_order_keeps():
  # 4 stages (8 -> 16 -> 16 -> 16 -> 1), two per device (v = 2), 4
  # micro-batches of 16.
  result = _pipeline_rewrite(widths=(16, 16, 16, 1), micro_batches=4,
                             **{"pipeline.virtual_stages": 2})
  device_0, device_1 = memory_estimate.estimate(result)
  assert (device_0.stages, device_1.stages) == ([0, 2], [1, 3])
  float32 = 4
  # What each stage's backward reads: its input and its tanh's output (the
  # last stage: its input and prediction - y).
  assert device_0.stage_activations == {0: (16 * 8 + 16 * 16) * float32,
                                        2: 2 * 16 * 16 * float32}
  assert device_1.stage_activations == {1: 2 * 16 * 16 * float32,
                                        3: (16 * 16 + 16) * float32}
  # Device 0 runs (D - 1) x 2 + (v - 1) x D = 4 forwards (stage 0 of
  # micro-batches 0 and 1, stage 2 of the same), then stage 0's forward of
  # micro-batch 2 before its first backward: 3 passes of stage 0 and 2 of
  # stage 2 at its peak. Device 1: 2 forwards of stage 1 first, then one
  # forward and one backward in turn; it peaks at 3 passes (two of stage
  # 1 and one of stage 3, or three of stage 1).
  stage = device_0.stage_activations
  assert (device_0.in_flight, device_0.activations) == (
      5, 3 * stage[0] + 2 * stage[2])
  stage = device_1.stage_activations
  assert (device_1.in_flight, device_1.activations) == (
      3, max(2 * stage[1] + stage[3], 3 * stage[1]))
  assert device_0.total == (device_0.persistent + 2 * device_0.gradients +
                            device_0.activations + device_0.working)
  text = dry_run.describe(result)
  assert ("schedule PreferBackward (1F1B), interleaved: 2 device(s) per "
          "replica, 2 stages on each") in text
  # (D - 1) / (v M + D - 1) = 1 / 9 with F = B = W.
  assert "pipeline bubble: 11.1% of a step (simulated with F = B = W)" in text


@pytest.mark.parametrize("static_batch", [True, False])
def test_estimate_of_small_mlp_matches_hand_count(static_batch):
  stage_0, stage_1 = memory_estimate.estimate(
      _pipeline_rewrite(static_batch=static_batch))
  assert (stage_0.device, stage_1.device) == ("/device:CPU:0",
                                              "/device:CPU:1")
  float32 = 4
  layer_0 = (8 * 16 + 16) * float32
  layer_1 = (16 * 1 + 1) * float32
  assert (stage_0.parameters, stage_1.parameters) == (layer_0, layer_1)
  # Adam: two slots per variable; beta1_power and beta2_power sit with
  # the first variable.
  assert stage_0.optimizer_state == 2 * layer_0 + 2 * float32
  assert stage_1.optimizer_state == 2 * layer_1
  assert (stage_0.gradients, stage_1.gradients) == (layer_0, layer_1)
  assert stage_0.gradient_sets == stage_1.gradient_sets == 2
  # Exact: what backward reads. Stage 0: the input x [16, 8] (kernel
  # gradient) and tanh's output [16, 16] (TanhGrad). Stage 1: tanh's
  # output as received (kernel gradient) and prediction - y [16, 1]
  # (Square's gradient).
  assert stage_0.activations_per_micro_batch == (16 * 8 + 16 * 16) * float32
  assert stage_1.activations_per_micro_batch == (16 * 16 + 16) * float32
  # 1F1B: stage s keeps min(p - s, M) micro-batches.
  assert (stage_0.in_flight, stage_1.in_flight) == (2, 1)
  assert stage_0.unknown_tensors == stage_1.unknown_tensors == 0
  # Without a static batch dimension, shapes are inferred again with the
  # dataset's batch size.
  assert stage_0.batch_size_assumed == (None if static_batch else 16)
  assert stage_0.total == (stage_0.persistent + 2 * layer_0 +
                           2 * stage_0.activations_per_micro_batch +
                           stage_0.working)


def test_data_parallel_plan_agrees_across_replicas_and_has_no_pipeline():
  # A batch dimension that is not static (no drop_remainder), as in the
  # quick start: every replica's copy of the input gets the batch size.
  epl.init(epl.Config({"cluster.num_cpu_devices": 4}))
  epl.set_default_strategy(epl.replicate(1))
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.dataset_arrays()
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8)
    x, y = tf.compat.v1.data.make_one_shot_iterator(data).get_next()
    loss = tf.reduce_mean(tf.square(training.layers_model(x) - y))
    tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
  result = state_of(graph).rewrite_result
  estimates = memory_estimate.estimate(result)
  assert len(estimates) == 4
  assert estimates[0].activations_per_micro_batch > 0
  assert len({e.activations_per_micro_batch for e in estimates}) == 1
  assert not any(e.unknown_tensors for e in estimates)
  text = dry_run.describe(result, estimates)
  assert "  pipeline:" not in text and "bubble" not in text
  assert "model replicas (data parallel): 4" in text


@pytest.mark.usefixtures("tf1_tensor_shapes")
@pytest.mark.parametrize("static_batch", [True, False])
def test_plan_text_with_tf1_tensor_shapes(static_batch):
  # The input's batch size is a Dimension (unknown: Dimension(None)); the
  # plan gives the micro-batch's size either way.
  text = dry_run.describe(_pipeline_rewrite(static_batch=static_batch))
  assert "batch: 16 examples per micro-batch, 32 per step" in text


def test_gpipe_keeps_every_micro_batch():
  estimates = memory_estimate.estimate(_pipeline_rewrite("PreferForward"))
  assert [e.in_flight for e in estimates] == [2, 2]


def test_zero_bubble_plan_keeps_1f1b_peak_and_simulates_its_bubble():
  result = _pipeline_rewrite("ZeroBubble")
  assert [e.in_flight for e in memory_estimate.estimate(result)] == [2, 2]
  text = dry_run.describe(result)
  assert "schedule ZeroBubble (ZB-H1)" in text
  # 2 stages, 2 micro-batches, F = B = W: (p-1) / (3m + p - 1) = 1/7.
  assert "pipeline bubble: 14.3% of a step (simulated with F = B = W)" in text


@pytest.mark.parametrize("stages, micro_batches, expected", [
    (1, 8, 0.0), (2, 4, 1 / 5.0), (4, 8, 3 / 11.0), (4, 1, 3 / 4.0)])
def test_bubble_fraction(stages, micro_batches, expected):
  assert memory_estimate.bubble_fraction(stages, micro_batches) == \
      pytest.approx(expected)


@pytest.mark.parametrize("schedule, expected", [
    ("PreferBackward", [4, 3, 2, 1]), ("PreferForward", [8, 8, 8, 8]),
    ("ZeroBubble", [4, 4, 4, 4])])
def test_in_flight_micro_batches(schedule, expected):
  assert [memory_estimate.in_flight_micro_batches(schedule, 4, s, 8)
          for s in range(4)] == expected
  assert memory_estimate.in_flight_micro_batches(
      "PreferBackward", 4, 0, 2) == 2


@pytest.mark.parametrize("zero_level", ["", "v0", "v1", "v2"])
@pytest.mark.parametrize("micro_batches", [1, 2])
def test_estimate_counts_zero_slots_on_their_owner(zero_level, micro_batches):
  """Data parallel over 2 devices: each replica has its own Adam slots;
  with ZeRO w1's slots live on replica 0's device, b1's and w2's on
  replica 1's (the partition EPL logs). v1 and v2 reduce each gradient on
  its owner; with micro-batches v1's replicas sum theirs in full first."""
  _, _, graph = training.train(
      model=training.get_variable_model, optimizer="adam", steps=1,
      config=dict(training.PER_REPLICA_WEIGHTS,
                  **{"cluster.num_cpu_devices": 2, "zero.level": zero_level,
                     "pipeline.num_micro_batch": micro_batches}))
  estimates = memory_estimate.estimate(state_of(graph).rewrite_result)
  w1, b1, w2 = 8 * 16 * 4, 16 * 4, 16 * 1 * 4
  assert [e.parameters for e in estimates] == [w1 + b1 + w2] * 2
  beta_powers = 2 * 4  # each replica's
  if zero_level:
    expected = [2 * w1 + beta_powers, 2 * (b1 + w2) + beta_powers]
  else:
    expected = [2 * (w1 + b1 + w2) + beta_powers] * 2
  assert [e.optimizer_state for e in estimates] == expected
  full, shares = w1 + b1 + w2, [w1, b1 + w2]
  gradients = {"": [full] * 2, "v0": [full] * 2, "v1": shares, "v2": shares}
  if zero_level == "v1" and micro_batches > 1:
    gradients["v1"] = [full + share for share in shares]
  assert [e.gradients for e in estimates] == gradients[zero_level]
  assert [e.gradient_sets for e in estimates] == [micro_batches] * 2


def test_estimate_counts_shared_weights_once():
  """Shared weights (2 logical CPU devices of one process): the weights,
  Adam's slots and beta powers live on replica 0's device only; each
  replica still makes its full gradient."""
  _, _, graph = training.train(
      model=training.get_variable_model, optimizer="adam", steps=1,
      config={"cluster.num_cpu_devices": 2})
  estimates = memory_estimate.estimate(state_of(graph).rewrite_result)
  full = 8 * 16 * 4 + 16 * 4 + 16 * 1 * 4
  assert [e.parameters for e in estimates] == [full, 0]
  assert [e.optimizer_state for e in estimates] == [2 * full + 2 * 4, 0]
  assert [e.gradients for e in estimates] == [full, full]


@pytest.mark.parametrize("bytes_per_parameter, expected", [
    # DeepSpeed's mixed-precision Adam.
    ((2, 2, 12), {"": 16.0, "v0": 4 + 12 / 8.0, "v1": 2 + 14 / 8.0,
                  "v2": 2 + 14 / 8.0, "v3": 16 / 8.0}),
    # EPL's float32 Adam.
    ((4, 4, 8), {"": 16.0, "v0": 8 + 8 / 8.0, "v1": 4 + 12 / 8.0,
                 "v2": 4 + 12 / 8.0, "v3": 16 / 8.0}),
])
def test_zero_formula_is_deepspeeds(bytes_per_parameter, expected):
  for level, per_parameter in expected.items():
    assert memory_estimate.zero_formula(
        level, 1000, 8, *bytes_per_parameter) == pytest.approx(
            1000 * per_parameter)
  # v1 sums every micro-batch in full on each replica first.
  assert memory_estimate.zero_formula(
      "v1", 1000, 8, 4, 4, 8, num_micro_batch=2) == pytest.approx(
          1000 * (8 + 12 / 8.0))


@pytest.mark.parametrize("zero_level", ["", "v0", "v1", "v2", "v3"])
def test_estimate_matches_the_zero_formula(zero_level):
  """Four equal weights on 4 replicas, Adam: each device's weights,
  gradients and optimizer state are what the formula says (up to each
  replica's own beta powers, 8 bytes); v3 partitions every weight."""
  _, _, graph = training.train(
      model=training.four_equal_layers, optimizer="adam", steps=1,
      config={"cluster.num_cpu_devices": 4, "zero.level": zero_level,
              "pipeline.num_micro_batch": 2, "zero.min_partition_size": 0})
  result = state_of(graph).rewrite_result
  (stage,) = memory_estimate.zero_parameters(result)
  assert stage.parameters == 4 * 8 * 8
  assert (stage.weight_bytes, stage.gradient_bytes) == (4, 4)
  assert stage.optimizer_bytes == pytest.approx(8 + 8.0 / stage.parameters)
  expected = memory_estimate.zero_formula(
      zero_level, stage.parameters, 4, 4, 4, 8, num_micro_batch=2)
  for e in memory_estimate.estimate(result):
    persistent = e.parameters + e.gradients + e.optimizer_state
    assert persistent - 8 == expected, e.device
  # epl-plan's TaskGraph line counts what the ZeRO table counts (it said 0
  # for v1-v3, whose gradients are reduced on owners, not all-reduced).
  (line,) = [l for l in dry_run.describe(result).splitlines()
             if l.startswith("    0 '")]
  assert "; 256 parameters, " in line, line


def test_recomputed_segment_counts_on_every_stage_it_spans(monkeypatch):
  """Auto parallel gives each of 4 BERT layers a stage and gradient
  checkpointing recomputes each layer. The attention mask, built on stage
  0 and read by every layer, goes with the last layer's segment: each
  stage still counts its own layer's recomputed tensors (the last stage
  counted none while a segment was charged to its first op's device)."""
  monkeypatch.setenv("EPL_GRADIENT_CHECKPOINT_TYPE", "auto")
  graph = tf.Graph()
  with graph.as_default():
    bert.build_graph(bert.make_flags(
        config="tiny", num_layers=4, seq_length=32,
        max_predictions_per_seq=2, parallel="auto", num_stages=4,
        num_micro_batch=2, num_cpu_devices=4, batch_size=2, steps=1))
    result = engine.ensure_rewritten(graph)
  estimates = memory_estimate.estimate(result)
  assert len(estimates) == 4
  assert all(e.recomputed > 0 for e in estimates), [
      (e.device, e.recomputed) for e in estimates]


def test_plan_decides_which_variables_zero_v3_partitions():
  """zero.level v3's partitioned variables are the plan's decision, one
  line each with its reason in epl-plan's decisions, and the rewrite
  partitions those."""
  _, _, graph = training.train(
      optimizer="adam", steps=1,
      config={"cluster.num_cpu_devices": 4, "zero.level": "v3",
              "zero.min_partition_size": 16})
  result = state_of(graph).rewrite_result
  partition = result.plan.decisions.partition
  assert partition.names(WeightSharding.PARTITIONED) == [
      "dense/kernel", "dense/bias", "dense_1/kernel"]
  assert partition.names(WeightSharding.SMALL) == ["dense_1/bias"]
  assert sorted(v.name for _, v in result.zero_partition.weights.points) == (
      sorted(partition.names(WeightSharding.PARTITIONED)))
  lines = dry_run.describe(result).splitlines()
  for expected in (
      "v3 weight dense/kernel: partitioned, because (8, 16), 128 elements, "
      "dense gradient, elementwise update",
      "v3 weight dense_1/bias: whole, small, because (1,) has fewer than "
      "zero.min_partition_size = 16 elements"):
    assert "    " + expected in lines, expected
