"""TF2 scripts under EPL, eager execution on, one scenario per run:
`python tests/clients/tf2_scripts.py NAME`. tests/test_tf2.py runs them
(eager execution cannot be switched back on in the test process, whose
conftest switched it off) and reads what they print.

- eager_dp_adam, eager_dp_legacy: an eager loop over a `@tf.function`
  step (GradientTape, a Keras Sequential model, Keras Adam v2 or legacy)
  on 4 CPU replicas equals the same script without EPL on the same global
  batch after 5 steps; the returned loss is the global batch's.
- accumulation_adam, accumulation_legacy: the same with 4 micro-batches a
  replica (pipeline.num_micro_batch 4, a loop), equal to plain TF on the
  same global batch.
- checkpoint: after EPL training, `tf.train.Checkpoint` saves the one
  copy of each variable and restores it into a model built without EPL.
- fit_dp: Keras `compile`/`fit` (Adam, mse, an mae metric, 2 epochs of 5
  steps) on 4 CPU replicas equals plain `fit`: weights, and the loss and
  metric of each epoch (the whole batch's, not replica 0's).
- evaluation_untouched: a tf.function that computes no gradient runs as
  traced, on any batch.
- pipeline_adam, pipeline_legacy: a subclassed Keras model whose `call`
  opens two `epl.replicate` stages (its layers built lazily in them, in
  the step) trains 2 stages x 2 replicas x 4 micro-batches through EPL's
  engine, equal to the same script without EPL, also after an eager
  `set_weights` between two steps; `tf.train.Checkpoint` restores its
  weights into a model built without EPL.
- dp_with_recompute, dp_with_zero_v1, dp_with_zero_v2, dp_with_amp: the
  data-parallel script with gradient checkpointing (auto) or ZeRO v1/v2,
  also after an eager `set_weights` between two steps, equals plain TF;
  with AMP O1 (float16, loss scale 128), within the AMP tolerance.
- recompute_in_pipeline, amp_in_pipeline, zero_in_pipeline,
  zero_v3_in_pipeline: the pipeline with gradient checkpointing (auto),
  ZeRO v1 or ZeRO v3 equals plain TF (v3 also with a checkpoint round
  trip of model and optimizer between steps,
  zero_v3_checkpoint_round_trip; with one stage of 4 replicas,
  zero_v3_one_stage); with AMP
  O1 (float16, loss scale 128) it is within the suite's AMP tolerance.
- functional_pipeline: a functional model whose layers are called in two
  stage scopes while it is built (eagerly, before the step is traced)
  trains as those 2 stages x 2 replicas x 4 micro-batches, equal to the
  same script without EPL; sequential_pipeline: the same with a
  Sequential model whose layers are added in them. functional_in_one_scope: one built inside a
  single `epl.replicate(1)` scope trains data parallel, equal too.
- fit_pipeline, functional_fit_pipeline: Keras fit (Adam, mse, mae) of a
  model in 2 stages x 2 replicas x 4 micro-batches (subclassed, whose call
  opens the stages; functional, built in them) equals plain fit: weights,
  each epoch's loss and mae.
- fit_custom_step_dp, fit_custom_step_pipeline: Keras fit (2 epochs) of a
  model whose own train_step updates the compiled loss and mae with the
  whole batch, data parallel on 4 replicas (also with a loop of 4
  micro-batches, fit_custom_step_accumulation) or in 2 stages x 2
  replicas x 4 micro-batches, equals plain fit: weights, each epoch's loss and mae.
  fit_prediction_metrics_dp: the same (4 replicas x 2 micro-batches) with
  a Mean of the predictions and one of their maximum, which read neither
  the targets nor the loss, tracked in the train_step too.
  fit_two_outputs_dp: the same for Keras' own train_step of a model with
  two outputs (a weighted loss and an mae each).
- split_head_<shards>x<micro batches>: a subclassed Keras classifier whose
  `call` opens `epl.replicate` around its hidden layer and `epl.split`
  around its Dense head, trained with a sparse softmax cross-entropy on 4
  CPU replicas: weights, loss and the accuracy of the split logits equal
  the same script without EPL, and each replica's device holds its
  shard of the head's weights and Adam slots, the step nothing whole of
  them. functional_split_head: the same classifier as a functional model
  whose layers were called in the scopes while it was built.
  split_weights_round_trip: the head split over 4 with an eager set_weights
  and a tf.train.Checkpoint round trip of model and optimizer between
  steps.
- moe_experts_<shards>x<micro batches>: a subclassed Keras model whose
  `call` runs the MoE layer of examples/moe (top-2 gating, 4 experts)
  with its experts and their einsums inside `epl.split(shards)`, trained
  on 4 CPU replicas: each shard computes with its experts alone (EPL's
  log says so), and holds them (and their Adam slots) alone, and weights
  and loss equal the same script without EPL.
- called_after_update_accumulation, called_after_update_zero_v1: a step
  that returns the error of the model called again after its update (4
  replicas x 2 micro-batches; ZeRO v1); fit_called_after_update_*: Keras
  fit of a train_step that tracks that error (4 x 2 micro-batches; the
  pipeline): equal to plain TF.
- batch_norm_accumulation: a model with BatchNormalization, 4 replicas x 2
  micro-batches: weights and moving statistics equal plain TF's towers.
- moe_zero_v1, moe_recompute: moe_experts_4x1 with ZeRO v1, with
  gradient checkpointing (auto); fit_moe: Keras fit (eager) of the MoE
  model, experts split over 4: equal to plain fit.
- offload, offload_in_pipeline: offload.level v0 on the data-parallel and
  the pipeline script: equal to plain TF, and the rewritten step keeps
  the other replicas' variables and writes on the host.
- functional_layer_in_two_stages_refused, eager_tape_refused,
  fit_run_eagerly_refused, split_softmax_refused, split_clipnorm_refused,
  split_weight_read_elsewhere_refused, split_evaluation_refused,
  moe_not_dividing_refused, tf1_dense_in_traced_split_refused,
  grouped_apply_refused, fit_undecided_merge_refused,
  fit_undecided_prediction_merge_refused,
  uneven_batch_refused,
  iterator_step_refused: each raises EPL's error, which is printed.
"""
import collections
import contextlib
import logging
import sys
import tempfile

import numpy as np
import tensorflow as tf

import epl
from epl.runtime import traced_function
from examples.moe import model as moe
from tests import tolerance

REPLICAS = 4
STEPS = 5
GLOBAL_BATCH = 32


def _data(rows=STEPS * GLOBAL_BATCH):
  rng = np.random.RandomState(0)
  return (rng.normal(size=(rows, 8)).astype(np.float32),
          rng.normal(size=(rows, 1)).astype(np.float32))


def _model():
  model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="tanh"),
                               tf.keras.layers.Dense(1)])
  model.build((None, 8))
  rng = np.random.RandomState(1)
  model.set_weights([0.3 * rng.normal(size=w.shape).astype(np.float32)
                     for w in model.get_weights()])
  return model


def _optimizer(kind):
  if kind == "legacy":
    return tf.keras.optimizers.legacy.Adam(0.01)
  if kind == "v1":  # a TF1 optimizer in a TF2 step, as TF allows
    return tf.compat.v1.train.AdamOptimizer(0.01)
  return tf.keras.optimizers.Adam(0.01)


def _halve_weights_after_step_2(model, step, optimizer):
  """An eager write between two calls of the step."""
  del optimizer
  if step == 2:
    model.set_weights([0.5 * w for w in model.get_weights()])


def _train_step(model, optimizer, after_update=None):
  """The issue's tf.function step: the mean squared error of `model`,
  its gradients applied by `optimizer`; with `after_update(model, x, y)`,
  it also returns what that computes once the gradients are applied."""

  @tf.function
  def train_step(x, y):
    with tf.GradientTape() as tape:
      prediction = model(x, training=True)
      loss = tf.reduce_mean(tf.square(prediction - y))
      if model.losses:  # the layers' own (add_loss)
        loss += tf.add_n(model.losses)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    if after_update is None:
      return loss
    return loss, after_update(model, x, y)

  return train_step


def _train(kind, model=None, batch=GLOBAL_BATCH, between=None, feed=None,
           losses=None, after_update=None, inspect=None):
  """The script of the issue's first row: returns the model and the last
  loss. `between(model, step, optimizer)` runs eagerly after each step;
  `feed(x, y)` gives the rows of each batch the step is called with (a
  worker's share; all of them by default); `losses` (a list) gets every
  step's loss; with `after_update` (`_train_step`), the last loss is
  (loss, its value); `inspect(train_step, x, y)` runs after the last
  step."""
  model = model or _model()
  optimizer = _optimizer(kind)
  train_step = _train_step(model, optimizer, after_update)
  loss = None
  batches = tf.data.Dataset.from_tensor_slices(_data()).batch(batch)
  for step, (x, y) in enumerate(batches):
    loss = train_step(*(feed(x, y) if feed else (x, y)))
    if losses is not None:
      losses.append(float(loss))
    if between is not None:
      between(model, step, optimizer)
  if inspect is not None:
    inspect(train_step, x, y)
  return model, tf.nest.map_structure(float, loss)


def _init(micro_batches=1, default_strategy=True, config=None):
  epl.init(epl.Config(dict(config or {}, **{
      "cluster.num_cpu_devices": REPLICAS,
      "pipeline.num_micro_batch": micro_batches})))
  if default_strategy:
    epl.set_default_strategy(epl.replicate(device_count=1))


def eager_dp(kind, micro_batches=1):
  _init(micro_batches)
  assert tf.executing_eagerly()
  model, loss = _train(kind)
  epl.shutdown()
  expected_model, expected_loss = _train(kind)
  for actual, expected in zip(model.get_weights(),
                              expected_model.get_weights()):
    tolerance.assert_equivalent(actual, expected)
  tolerance.assert_equivalent(loss, expected_loss)
  print("TF2_EAGER_DP_OK tf=%s optimizer=%s replicas=%d micro_batches=%d "
        "loss=%.6f" % (tf.__version__, kind, REPLICAS, micro_batches, loss))


def _train_two_models():
  """Two models, each with its own Keras Adam and tf.function step,
  trained in turn on each batch (as a GAN's two steps): their weights."""
  models = [_model(), _model()]
  steps = [_train_step(model, _optimizer("adam")) for model in models]
  for x, y in tf.data.Dataset.from_tensor_slices(_data()).batch(
      GLOBAL_BATCH):
    steps[0](x, y)
    steps[1](x, -y)
  return models[0].get_weights() + models[1].get_weights()


def two_models_in_turn():
  """The two models' steps under ZeRO v1 (each replica updates the Adam
  slots of its share of the variables, in its own copies): equal to plain
  TF. Each rewritten step's copies are its own resources; before, the two
  rewrites named their replicas' copies alike and shared the slots
  (0.24 off plain TF)."""
  _init(config={"zero.level": "v1"})
  weights = _train_two_models()
  epl.shutdown()
  for actual, expected in zip(weights, _train_two_models()):
    tolerance.assert_equivalent(actual, expected)
  print("TF2_TWO_MODELS_OK tf=%s" % tf.__version__)


def checkpoint():
  _init()
  model, _ = _train("adam")
  path = tf.train.Checkpoint(model=model).save(tempfile.mkdtemp() + "/ckpt")
  epl.shutdown()
  restored = _model()
  tf.train.Checkpoint(model=restored).restore(path).assert_consumed()
  for actual, expected in zip(restored.get_weights(), model.get_weights()):
    np.testing.assert_array_equal(actual, expected)
  print("TF2_CHECKPOINT_OK")


def _fit(model, workers=1, worker=0, metrics=("mae",)):
  """Keras fit, 2 epochs; with `workers`, on worker `worker`'s rows of
  every global batch (its share of them)."""
  model.compile(optimizer=_optimizer("adam"), loss="mse",
                metrics=list(metrics))
  history = model.fit(
      tf.data.Dataset.from_tensor_slices(_data()).shard(workers, worker)
      .batch(GLOBAL_BATCH // workers), epochs=2, verbose=0, shuffle=False)
  return model.get_weights(), history.history


def _assert_fit_equal(fitted, expected):
  """(weights, History.history) of fit under EPL and without: equal, the
  weights and every epoch's value of every key."""
  for actual, wanted in zip(fitted[0], expected[0]):
    tolerance.assert_equivalent(actual, wanted)
  assert sorted(fitted[1]) == sorted(expected[1]), fitted[1]
  for key in expected[1]:
    tolerance.assert_equivalent(np.array(fitted[1][key]),
                                np.array(expected[1][key]))


def fit_dp():
  _init()
  fitted = _fit(_model())
  epl.shutdown()
  _assert_fit_equal(fitted, _fit(_model()))
  print("TF2_FIT_DP_OK loss=%s" % fitted[1]["loss"])


def _two_outputs():
  """_model()'s hidden layer with two heads, seeded."""
  seeded = tf.keras.initializers.GlorotUniform
  inputs = tf.keras.Input((8,))
  hidden = tf.keras.layers.Dense(16, activation="tanh",
                                 kernel_initializer=seeded(seed=1))(inputs)
  return tf.keras.Model(inputs, [
      tf.keras.layers.Dense(1, kernel_initializer=seeded(seed=seed),
                            name=name)(hidden)
      for seed, name in ((2, "first"), (3, "second"))])


def _fit_two_outputs(model):
  model.compile(optimizer=_optimizer("adam"), loss="mse", metrics=["mae"],
                loss_weights=[1.0, 0.5])
  x, y = _data()
  model.fit(tf.data.Dataset.from_tensor_slices((x, (y, 2 * y))).batch(
      GLOBAL_BATCH), epochs=2, verbose=0, shuffle=False)
  return model.get_weights(), model.history.history


def fit_two_outputs_dp():
  """Keras fit (2 epochs) of a data-parallel model with two outputs (a
  loss each, weighted, and an mae each): weights and every epoch's loss,
  per-output losses and maes equal plain fit."""
  _init()
  fitted = _fit_two_outputs(_two_outputs())
  epl.shutdown()
  _assert_fit_equal(fitted, _fit_two_outputs(_two_outputs()))
  print("TF2_FIT_TWO_OUTPUTS_OK %s" % sorted(fitted[1]))


def _refused(run, **init):
  _init(**init)
  try:
    run()
  # Raised in a Keras layer's call, which autograph converts, EPL's
  # NotSupportedInTracedStep comes as autograph's StagingError.
  except Exception as error:  # pylint: disable=broad-except
    print("TF2_ERROR %s: %s" % (type(error).__name__, error))
    return
  print("TF2_NO_ERROR")


def fit_run_eagerly_refused():
  def run():
    model = _model()
    model.compile(optimizer=_optimizer("adam"), loss="mse", run_eagerly=True)
    model.fit(tf.data.Dataset.from_tensor_slices(_data()).batch(GLOBAL_BATCH),
              epochs=1, verbose=0)
  _refused(run)


class _TwoStageModel(tf.keras.Model):
  """A subclassed Keras model whose `call` opens a stage scope around each
  half (none without EPL); its layers build their weights lazily, at
  their first call, inside the stage (seeded: the same weights with and
  without EPL)."""

  def __init__(self, stages=None):
    super().__init__()
    seeded = tf.keras.initializers.GlorotUniform
    self.hidden = tf.keras.layers.Dense(16, activation="tanh",
                                        kernel_initializer=seeded(seed=1))
    self.head = tf.keras.layers.Dense(1, kernel_initializer=seeded(seed=2))
    self.stages = stages or [contextlib.nullcontext(),
                             contextlib.nullcontext()]

  def call(self, x, training=None):
    del training  # no layer differs in training
    with self.stages[0]:
      hidden = self.hidden(x)
    with self.stages[1]:
      return self.head(hidden)


CLASSES = 10
SPLIT_CONFIG = {"cluster.colocate_split_and_replicate": True}


def _classifier_layers():
  """A hidden layer and a 10-class head, seeded."""
  seeded = tf.keras.initializers.GlorotUniform
  return (tf.keras.layers.Dense(16, activation="tanh",
                                kernel_initializer=seeded(seed=1)),
          tf.keras.layers.Dense(
              CLASSES, kernel_initializer=seeded(seed=2),
              bias_initializer=tf.keras.initializers.RandomNormal(seed=3)))


def _functional_classifier(body=None, head=None):
  """The classifier as a functional model whose layers are called in
  `body` and `head` while it is built."""
  hidden, head_layer = _classifier_layers()
  inputs = tf.keras.Input((8,))
  with body or contextlib.nullcontext():
    features = hidden(inputs)
  with head or contextlib.nullcontext():
    logits = head_layer(features)
  return tf.keras.Model(inputs, logits)


class _SplitHeadModel(tf.keras.Model):
  """A subclassed Keras classifier whose `call` opens `body` around its
  hidden layer and `head` around its 10-class Dense head (none without
  EPL); its layers build their weights lazily, in the step (seeded)."""

  def __init__(self, body=None, head=None):
    super().__init__()
    self.hidden, self.head = _classifier_layers()
    self.body_scope = body or contextlib.nullcontext()
    self.head_scope = head or contextlib.nullcontext()

  def call(self, x, training=None):
    del training  # no layer differs in training
    with self.body_scope:
      hidden = self.hidden(x)
    with self.head_scope:
      return self.head(hidden)


def _train_classifier(model, between=None, optimizer=None):
  """An eager loop over a tf.function step that trains `model` with a
  sparse softmax cross-entropy (`optimizer`, Keras Adam by default);
  returns the last loss and the accuracy of the last step's predictions.
  `between(model, step, optimizer)` runs eagerly after each step."""
  optimizer = optimizer or _optimizer("adam")
  x, _ = _data()
  labels = (np.abs(x[:, 0] * 7).astype(np.int64)) % CLASSES

  @tf.function
  def train_step(x, y):
    with tf.GradientTape() as tape:
      logits = model(x, training=True)
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
          labels=y, logits=logits))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), y),
                                      tf.float32))
    return loss, accuracy

  result = None
  batches = tf.data.Dataset.from_tensor_slices((x, labels)).batch(
      GLOBAL_BATCH)
  for step, (x_batch, y_batch) in enumerate(batches):
    result = train_step(x_batch, y_batch)
    if between is not None:
      between(model, step, optimizer)
  return [float(value) for value in result]


def _assert_sharded_in_step(weights, shards):
  """The rewritten step holds each of the user's split `weights` ((eager
  variable, the axis it is split on)) and its two Adam slots as shards of
  its own, 3 variables of the shard's shape on each of the 4 replicas'
  devices (`shards` replicas a group), and neither reads the user's
  variables nor computes any tensor of a whole weight's shape."""
  steps = traced_function.rewritten_steps()
  assert len(steps) == 1, steps
  graph = steps[0].function.graph
  captured = {id(external) for external, _ in graph.captures}
  shapes = [tuple(t.shape.as_list()) for op in graph.get_operations()
            for t in op.outputs if t.shape.rank]
  held = collections.Counter(
      (tf.DeviceSpec.from_string(op.device).device_index,
       tuple(tf.TensorShape(op.get_attr("shape")).as_list()))
      for op in graph.get_operations() if op.type == "VarHandleOp")
  for variable, axis in weights:
    whole = variable.shape.as_list()
    shard = list(whole)
    shard[axis] = -(-whole[axis] // shards)
    assert id(variable.handle) not in captured, variable.name
    assert tuple(whole) not in shapes, (variable.name, whole)
    assert tuple(whole) not in {shape for _, shape in held}, variable.name
    for device in range(REPLICAS):
      assert held[(device, tuple(shard))] == 3, (variable.name, device, held)


def _split_round_trip(model, step, optimizer):
  """An eager set_weights after step 1; after step 2, a checkpoint round
  trip of the model and Adam (every weight and slot zeroed in between)
  and Adam's slots halved eagerly."""
  if step == 1:
    model.set_weights([0.5 * w for w in model.get_weights()])
  _restore_after_zeros(model, step, optimizer)


def split_head(shards, micro_batches=1, functional=False, between=None):
  """A Keras classifier whose hidden layer is data parallel over 4
  replicas and whose 10-class head is split over `shards` devices (4: one
  shard group, the last shards padded; 2: two groups), trained 5 steps:
  weights, loss and the accuracy of the split logits (tf.argmax,
  tf.equal) equal the same script without EPL, and so do the logits of
  an eager call after training. Each replica's device holds its shard of
  the head's kernel and bias and of their slots, the step nothing whole
  of them. `between` runs after each step, with EPL and without."""
  _init(micro_batches, default_strategy=False, config=SPLIT_CONFIG)
  build = _functional_classifier if functional else _SplitHeadModel
  model = build(epl.replicate(1, name="body"), epl.split(shards, name="head"))
  loss, accuracy = _train_classifier(model, between)
  head = model.layers[-1]
  _assert_sharded_in_step([(head.kernel, 1), (head.bias, 0)], shards)
  x = _data(GLOBAL_BATCH)[0]
  # Eagerly, the split head computes whole, on the trained weights.
  logits = model(x).numpy()
  epl.shutdown()
  expected = build()
  expected_loss, expected_accuracy = _train_classifier(expected, between)
  tolerance.assert_equivalent(logits, expected(x).numpy())
  differences = [float(np.max(np.abs(a - b))) for a, b in zip(
      model.get_weights(), expected.get_weights())]
  for actual, wanted in zip(model.get_weights(), expected.get_weights()):
    tolerance.assert_equivalent(actual, wanted)
  tolerance.assert_equivalent(loss, expected_loss)
  tolerance.assert_equivalent(accuracy, expected_accuracy)
  print("TF2_SPLIT_OK tf=%s %s shards=%d replicas=%d micro_batches=%d "
        "loss=%.6f accuracy=%.4f max_abs_diff=%.3g" % (
            tf.__version__, type(model).__name__, shards, REPLICAS,
            micro_batches, loss, accuracy, max(differences)))
  return model


def functional_split_head():
  """The classifier as a functional model whose head was called in
  epl.split(4) while it was built: split in the traced step too."""
  split_head(4, functional=True)


def split_weights_round_trip():
  """The split head over 4 devices with an eager set_weights and a
  tf.train.Checkpoint round trip of the model and Adam between steps
  (the shards follow both), equal to plain TF doing the same; a
  checkpoint of the model then restores, whole, into a model built
  without EPL."""
  model = split_head(4, between=_split_round_trip)
  _restores_without_epl(model, _SplitHeadModel)
  print("TF2_SPLIT_ROUND_TRIP_OK")


def split_softmax_refused():
  """tf.nn.softmax of a split head's sharded logits (no sharded version):
  EPL's error naming the op, before the step runs."""
  def run():
    model = _SplitHeadModel(epl.replicate(1, name="body"),
                            epl.split(2, name="head"))
    optimizer = _optimizer("adam")

    @tf.function
    def train_step(x):
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.nn.softmax(model(x))[:, 0])
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
      return loss

    train_step(tf.constant(_data(GLOBAL_BATCH)[0]))
  _refused(run, default_strategy=False, config=SPLIT_CONFIG)


def split_clipnorm_refused():
  """Keras Adam with clipnorm (a norm of each whole gradient) on a split
  head: EPL's error naming the weight (each device would clip its
  shard's gradient by the shard's norm)."""
  def run():
    model = _SplitHeadModel(epl.replicate(1, name="body"),
                            epl.split(2, name="head"))
    _train_classifier(model, optimizer=tf.keras.optimizers.Adam(
        0.01, clipnorm=1.0))
  _refused(run, default_strategy=False, config=SPLIT_CONFIG)


def split_weight_read_elsewhere_refused():
  """A loss that also reads the split head's kernel (an L2 penalty
  outside the split layer): EPL's error naming the op and the weight
  (the op would see one shard)."""
  def run():
    model = _SplitHeadModel(epl.replicate(1, name="body"),
                            epl.split(2, name="head"))
    optimizer = _optimizer("adam")

    @tf.function
    def train_step(x, y):
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=y, logits=model(x)))
        loss += 1e-3 * tf.reduce_sum(tf.square(model.head.kernel))
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
      return loss

    x = _data(GLOBAL_BATCH)[0]
    train_step(x, np.zeros(GLOBAL_BATCH, np.int64))
  _refused(run, default_strategy=False, config=SPLIT_CONFIG)


def split_evaluation_refused():
  """A tf.function that calls a model with a split head but trains
  nothing: EPL's error (its collectives would wait for shards that only
  a training step's rewrite makes)."""
  def run():
    model = _SplitHeadModel(epl.replicate(1, name="body"),
                            epl.split(4, name="head"))
    predict = tf.function(lambda x: tf.argmax(model(x), 1))
    predict(tf.constant(_data(GLOBAL_BATCH)[0]))
  _refused(run, default_strategy=False, config=SPLIT_CONFIG)


EXPERTS = 4


class _MoEModel(tf.keras.Model):
  """A subclassed Keras model with the MoE layer of examples/moe: top-2
  gating of groups of 8 tokens (capacity 4, so tokens are dropped) to 4
  experts whose weights [4, 8, 16] and [4, 16, 8] and einsums its `call`
  builds inside `experts_scope` (none without EPL), then a Dense head;
  its layers build their weights lazily, in the step (seeded). Groups of
  `tokens_per_group` rows: the same groups, gated alike, in a replica's
  micro-batch as in the whole batch."""

  def __init__(self, experts_scope=None, tokens_per_group=8):
    super().__init__()
    self.tokens_per_group = tokens_per_group
    self.gate = tf.keras.layers.Dense(
        EXPERTS, use_bias=False,
        kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1))
    self.experts = moe.Experts(EXPERTS, 16, seed=2, name="experts")
    self.head = tf.keras.layers.Dense(
        1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=4))
    self.experts_scope = experts_scope or contextlib.nullcontext()

  def call(self, x, training=None):
    del training  # no layer differs in training
    tokens = tf.reshape(x, [-1, self.tokens_per_group, x.shape[-1]])
    if not self.gate.built:  # its kernel is what the gating reads
      self.gate.build(tokens.shape)
    combine, dispatch, aux_loss = moe.top2_gating(tokens, self.gate.kernel,
                                                  capacity=4)
    dispatched = tf.einsum("GSEC,GSM->EGCM", dispatch, tokens)
    with self.experts_scope:
      outputs = tf.einsum("GSEC,EGCM->GSM", combine,
                          self.experts(dispatched))
    self.add_loss(0.01 * aux_loss)
    return self.head(tf.reshape(outputs + tokens, [-1, x.shape[-1]]))


def moe_experts(shards, micro_batches=1, config=None):
  """The MoE model on 4 CPU replicas, its experts split over `shards`
  devices (4: one expert a shard; 2: two groups of 2 experts a shard),
  with `micro_batches` a replica (groups of 8 / micro_batches rows) and
  `config` besides, trained 5 steps: weights and loss equal the same
  script without EPL."""
  _init(micro_batches, config=dict(SPLIT_CONFIG, **(config or {})))
  logged = _Logged()
  group = 8 // micro_batches
  model, loss = _train("adam", _MoEModel(epl.split(shards, name="experts"),
                                         tokens_per_group=group))
  _assert_sharded_in_step([(model.experts.inner, 0),
                           (model.experts.outer, 0)], shards)
  epl.shutdown()
  # Each shard's einsums read its experts alone (so the tokens went to
  # them by all-to-all: the experts axes would not meet otherwise).
  divided = [line for line in logged.lines
             if "computes with %d of the %d experts" % (
                 EXPERTS // shards, EXPERTS) in line]
  assert {"EGCM,EMH->EGCH", "EGCH,EHM->EGCM"} == {
      line.split("'")[1] for line in divided}, logged.lines
  expected, expected_loss = _train("adam",
                                   _MoEModel(tokens_per_group=group))
  differences = [float(np.max(np.abs(a - b))) for a, b in zip(
      model.get_weights(), expected.get_weights())]
  for actual, wanted in zip(model.get_weights(), expected.get_weights()):
    tolerance.assert_equivalent(actual, wanted)
  tolerance.assert_equivalent(loss, expected_loss)
  print("TF2_MOE_OK tf=%s shards=%d replicas=%d micro_batches=%d "
        "experts=%d loss=%.6f max_abs_diff=%.3g" % (
            tf.__version__, shards, REPLICAS, micro_batches, EXPERTS, loss,
            max(differences)))
  return logged.lines


def moe_zero_v1():
  """The MoE model, experts over 4 shards, with zero.level v1: the
  replicated weights are dealt to owners (logged)."""
  logged = moe_experts(4, config={"zero.level": "v1"})
  assert any("variables dealt to 4 replicas" in line for line in logged), (
      logged)


def moe_recompute():
  """The MoE model, experts over 4 shards, with gradient checkpointing
  (auto): the engine chose checkpoints (logged)."""
  logged = moe_experts(4, config={"gradient_checkpoint.type": "auto"})
  assert any("checkpoint tensor(s)" in line for line in logged), logged


def _fit_moe(experts_scope=None):
  """Keras fit (Adam, mse and the layer's auxiliary loss, an mae metric,
  2 epochs of 5 steps) of the MoE model: its weights and History."""
  return _fit(_MoEModel(experts_scope))


def fit_moe():
  """Keras fit (eager) of the MoE model whose experts are split over the
  4 replicas: weights and each epoch's loss and mae equal plain fit."""
  _init(config=SPLIT_CONFIG)
  logged = _Logged()
  fitted = _fit_moe(epl.split(4, name="experts"))
  epl.shutdown()
  _assert_fit_equal(fitted, _fit_moe())
  assert any("computes with 1 of the 4 experts" in line
             for line in logged.lines), logged.lines
  print("TF2_FIT_MOE_OK loss=%s mae=%s" % (fitted[1]["loss"],
                                           fitted[1]["mae"]))


def moe_not_dividing_refused():
  """Expert weights whose experts do not divide by the shards: EPL's
  error naming the einsum and the variable."""
  def run():
    _train("adam", _MoEModel(epl.split(3, name="experts")))
  _refused(run, config=SPLIT_CONFIG)


def tf1_dense_in_traced_split_refused():
  """tf.compat.v1.layers.dense in a split scope of a traced step (its
  lowering makes sharded variables of its own, a TF1 graph's): EPL's
  error naming what works there."""
  def run():
    @tf.function
    def step(x):
      with epl.split(2, name="head"):
        return tf.compat.v1.layers.dense(x, CLASSES)

    step(tf.constant(_data(GLOBAL_BATCH)[0]))
  _refused(run, default_strategy=False, config=SPLIT_CONFIG)


def _pipeline_run(kind, config=None, between=_halve_weights_after_step_2,
                  one_stage=False, inspect=None):
  """The pipeline script under EPL (2 stages x 2 replicas, 4
  micro-batches, `config` besides; with `one_stage`, both halves in one
  scope: 4 replicas of one stage; `inspect` as `_train`'s) and without,
  `between` run after each step: the two models and losses, and what EPL
  logged."""
  _init(micro_batches=4, default_strategy=kind == "legacy", config=config)
  logged = _Logged()
  stages = [epl.replicate(1, name="stage_0")]
  stages.append(stages[0] if one_stage else epl.replicate(1, name="stage_1"))
  model, loss = _train(kind, _TwoStageModel(stages), between=between,
                       inspect=inspect)
  epl.shutdown()
  expected, expected_loss = _train(kind, _TwoStageModel(), between=between)
  return (model, loss), (expected, expected_loss), logged.lines


class _Logged(logging.Handler):
  """The messages EPL's logger emits from now on."""

  def __init__(self):
    super().__init__()
    self.lines = []
    logging.getLogger("epl").addHandler(self)

  def emit(self, record):
    self.lines.append(record.getMessage())


def _restores_without_epl(model, build=_TwoStageModel):
  """A checkpoint of `model`, trained under EPL, holds one full copy of
  each weight under its own name: it restores into the model `build()`
  makes without EPL, equal."""
  path = tf.train.Checkpoint(model=model).save(tempfile.mkdtemp() + "/ckpt")
  restored = build()
  restored(_data(1)[0])
  tf.train.Checkpoint(model=restored).restore(
      path).assert_existing_objects_matched()
  for actual, wanted in zip(restored.get_weights(), model.get_weights()):
    np.testing.assert_array_equal(actual, wanted)


def pipeline(kind):
  """2 stages x 2 replicas (4 CPU devices), 4 micro-batches: equal to the
  same script without EPL, and a checkpoint of it restores into a model
  built without EPL. With the legacy optimizer the script also sets the
  default strategy, as the issue's scripts do (the loss, built outside
  the stages, joins the last stage either way)."""
  (model, loss), (expected, expected_loss), _ = _pipeline_run(kind)
  for actual, wanted in zip(model.get_weights(), expected.get_weights()):
    tolerance.assert_equivalent(actual, wanted)
  tolerance.assert_equivalent(loss, expected_loss)
  _restores_without_epl(model)
  print("TF2_PIPELINE_OK tf=%s optimizer=%s stages=2 replicas=2 "
        "micro_batches=4 loss=%.6f" % (tf.__version__, kind, loss))


def recompute_in_pipeline():
  """The pipeline with gradient_checkpoint.type auto: checkpoints chosen,
  weights equal to the same script without EPL."""
  (model, _), (expected, _), logged = _pipeline_run(
      "adam", {"gradient_checkpoint.type": "auto"})
  for actual, wanted in zip(model.get_weights(), expected.get_weights()):
    tolerance.assert_equivalent(actual, wanted)
  chosen = [line for line in logged if "checkpoint tensor(s)" in line]
  assert chosen, logged
  print("TF2_RECOMPUTE_OK %s" % chosen[0])


def amp_in_pipeline():
  """The pipeline with amp.level O1 (float16, loss scale 128): weights
  within the suite's AMP tolerance of float32 training without EPL."""
  (model, _), (expected, _), logged = _pipeline_run(
      "adam", {"amp.level": "O1", "amp.loss_scale": 128})
  for actual, wanted in zip(model.get_weights(), expected.get_weights()):
    np.testing.assert_allclose(actual, wanted,
                               atol=tolerance.AMP_TOLERANCE["float16"])
  assert any("precision: float16" in line for line in logged), logged
  print("TF2_AMP_OK")


def zero_in_pipeline():
  """The pipeline with zero.level v1 (Keras Adam): each replica updates its
  share of each stage's variables; weights equal to plain TF."""
  (model, _), (expected, _), logged = _pipeline_run(
      "adam", {"zero.level": "v1"})
  for actual, wanted in zip(model.get_weights(), expected.get_weights()):
    tolerance.assert_equivalent(actual, wanted)
  dealt = [line for line in logged if "variables dealt to 2 replicas" in line]
  assert len(dealt) == 2, logged
  print("TF2_ZERO_OK %s" % dealt[0])


def _functional_model(scopes, sequential=False):
  """A functional Keras model whose two layers are called in `scopes`
  (stage scopes, one scope twice, or none) while it is built, with the
  same seeded weights with and without EPL; or a Sequential model with
  an input whose layers are added in them."""
  seeded = tf.keras.initializers.GlorotUniform
  layers = [tf.keras.layers.Dense(16, activation="tanh",
                                  kernel_initializer=seeded(seed=1)),
            tf.keras.layers.Dense(1, kernel_initializer=seeded(seed=2))]
  if sequential:
    model = tf.keras.Sequential([tf.keras.Input((8,))])
    for scope, layer in zip(scopes, layers):
      with scope:
        model.add(layer)
    return model
  outputs = inputs = tf.keras.Input((8,))
  for scope, layer in zip(scopes, layers):
    with scope:
      outputs = layer(outputs)
  return tf.keras.Model(inputs, outputs)


def _no_scopes():
  return [contextlib.nullcontext(), contextlib.nullcontext()]


# saver: (config, what the engine logs, the tolerance: None for the
# suite's equivalence, else an absolute one).
_DATA_PARALLEL_SAVERS = {
    "recompute": ({"gradient_checkpoint.type": "auto"},
                  "checkpoint tensor(s)", None),
    "zero_v1": ({"zero.level": "v1"}, "variables dealt to 4 replicas", None),
    "zero_v2": ({"zero.level": "v2"}, "variables dealt to 4 replicas", None),
    "amp": ({"amp.level": "O1", "amp.loss_scale": 128},
            "precision: float16", tolerance.AMP_TOLERANCE["float16"]),
}


def data_parallel_with(saver):
  """The data-parallel script (4 replicas, no scope in the step, an eager
  `set_weights` between two steps) with gradient checkpointing, ZeRO or
  AMP from EPL's engine: weights and loss equal to plain TF (AMP: within
  its tolerance of float32), and the engine logged the saver it applied."""
  config, says, atol = _DATA_PARALLEL_SAVERS[saver]
  _init(config=config)
  logged = _Logged()
  model, loss = _train("adam", between=_halve_weights_after_step_2)
  epl.shutdown()
  expected, expected_loss = _train("adam",
                                   between=_halve_weights_after_step_2)
  for actual, wanted in zip(model.get_weights() + [loss],
                            expected.get_weights() + [expected_loss]):
    if atol is None:
      tolerance.assert_equivalent(actual, wanted)
    else:
      np.testing.assert_allclose(actual, wanted, atol=atol)
  applied = [line for line in logged.lines if says in line]
  assert applied, logged.lines
  print("TF2_DP_SAVER_OK %s tf=%s %s" % (saver, tf.__version__, applied[0]))


def functional_pipeline(sequential=False):
  """A functional model whose layers were called in two stage scopes while
  it was built: the traced step calls them in those stages (2 stages x 2
  replicas x 4 micro-batches through the engine), equal to plain TF."""
  _init(micro_batches=4, default_strategy=False)
  logged = _Logged()
  model, loss = _train("adam", _functional_model(
      [epl.replicate(1, name="stage_0"), epl.replicate(1, name="stage_1")],
      sequential))
  epl.shutdown()
  expected, expected_loss = _train("adam", _functional_model(_no_scopes(),
                                                             sequential))
  for actual, wanted in zip(model.get_weights(), expected.get_weights()):
    tolerance.assert_equivalent(actual, wanted)
  tolerance.assert_equivalent(loss, expected_loss)
  engine = [line for line in logged.lines if "EPL's engine" in line]
  assert engine and "stage_1" in engine[0], logged.lines
  print("TF2_FUNCTIONAL_PIPELINE_OK %s stages=2 replicas=2 "
        "micro_batches=4 loss=%.6f %s" % (type(model).__name__, loss,
                                          engine[0]))


def sequential_pipeline():
  """The same with a Sequential model whose layers are added in the
  stage scopes."""
  functional_pipeline(sequential=True)


def functional_in_one_scope():
  """A functional model built inside one `epl.replicate(1)` scope (and
  the default strategy set, as the issue's scripts do) trains data
  parallel (4 replicas of one TaskGraph), equal to plain TF."""
  _init()
  logged = _Logged()
  scope = epl.replicate(1)
  model, loss = _train("adam", _functional_model([scope, scope]))
  epl.shutdown()
  expected, expected_loss = _train("adam", _functional_model(_no_scopes()))
  for actual, wanted in zip(model.get_weights(), expected.get_weights()):
    tolerance.assert_equivalent(actual, wanted)
  tolerance.assert_equivalent(loss, expected_loss)
  assert any("4 model replica(s) x 1 TaskGraph(s)" in line
             for line in logged.lines), logged.lines
  print("TF2_FUNCTIONAL_DP_OK loss=%.6f" % loss)


def functional_layer_in_two_stages_refused():
  """One layer object called in two stage scopes while models are built."""
  def run():
    shared = tf.keras.layers.Dense(8)
    inputs = tf.keras.Input((8,))
    with epl.replicate(1, name="stage_0"):
      hidden = shared(inputs)
    with epl.replicate(1, name="stage_1"):
      shared(hidden)
  _refused(run, micro_batches=4, default_strategy=False)


def fit_pipeline(functional=False):
  """Keras fit (Adam, mse, an mae metric, 2 epochs of 5 steps) of a model
  in 2 stages x 2 replicas x 4 micro-batches, subclassed (its call opens
  the stages) or functional (built in them), equals plain fit: weights,
  and the loss and mae of each epoch (the whole batch's)."""
  _init(micro_batches=4, default_strategy=False)
  logged = _Logged()
  stages = [epl.replicate(1, name="stage_0"), epl.replicate(1, name="stage_1")]
  fitted = _fit(_functional_model(stages) if functional
                else _TwoStageModel(stages))
  epl.shutdown()
  _assert_fit_equal(fitted, _fit(
      _functional_model(_no_scopes()) if functional else _TwoStageModel()))
  engine = [line for line in logged.lines if "EPL's engine" in line]
  assert engine and "stage_1" in engine[0], logged.lines
  print("TF2_FIT_PIPELINE_OK functional=%s stages=2 replicas=2 "
        "micro_batches=4 loss=%s mae=%s" % (functional, fitted[1]["loss"],
                                            fitted[1]["mae"]))


class _MetricsStep:
  """A model's own train_step as Keras' guide "Customizing what happens in
  fit()" writes it: the compiled loss and metrics update with the whole
  batch, outside the model's micro-batches."""

  def train_step(self, data):
    x, y = data
    with tf.GradientTape() as tape:
      y_pred = self(x, training=True)
      loss = self.compiled_loss(y, y_pred, regularization_losses=self.losses)
    gradients = tape.gradient(loss, self.trainable_variables)
    self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
    self.update_metrics(y, y_pred)
    return {metric.name: metric.result() for metric in self.metrics}

  def update_metrics(self, y, y_pred):
    self.compiled_metrics.update_state(y, y_pred)


class _CustomStepModel(_MetricsStep, _TwoStageModel):
  """A model in two stages whose train_step is its own."""


class _CustomStepSequential(_MetricsStep, tf.keras.Sequential):
  """_model()'s layers in a Sequential whose train_step is its own."""


def _custom_step_sequential(kind=_CustomStepSequential):
  """_model()'s layers in a Sequential of the class `kind`."""
  model = kind(_model().layers)
  model.build((None, 8))
  return model


def fit_custom_step_dp(micro_batches=1):
  """Keras fit (2 epochs) of a data-parallel model whose own train_step
  updates the compiled loss and mae with the whole batch, with a loop of
  `micro_batches` a replica: equal to plain fit."""
  _init(micro_batches)
  fitted = _fit(_custom_step_sequential())
  epl.shutdown()
  _assert_fit_equal(fitted, _fit(_custom_step_sequential()))
  print("TF2_FIT_CUSTOM_STEP_OK replicas=%d micro_batches=%d loss=%s mae=%s"
        % (REPLICAS, micro_batches, fitted[1]["loss"], fitted[1]["mae"]))


def fit_custom_step_accumulation():
  fit_custom_step_dp(micro_batches=4)


class _PredictionTrackedSequential(_CustomStepSequential):
  """_custom_step_sequential()'s train_step that also tracks the mean and
  the peak of the predictions alone (reading neither the targets nor the
  loss): Keras computes both over the whole batch."""

  def __init__(self, layers):
    super().__init__(layers)
    self.mean_tracker = tf.keras.metrics.Mean("mean_prediction")
    self.peak_tracker = tf.keras.metrics.Mean("peak_prediction")

  def update_metrics(self, y, y_pred):
    super().update_metrics(y, y_pred)
    self.mean_tracker.update_state(y_pred)
    self.peak_tracker.update_state(tf.reduce_max(y_pred))


def fit_prediction_metrics_dp():
  """Keras fit of a data-parallel model (4 replicas x 2 micro-batches)
  whose own train_step tracks metrics of its predictions alone: they read
  the predictions merged, equal to plain fit."""
  _init(micro_batches=2)
  fitted = _fit(_custom_step_sequential(_PredictionTrackedSequential))
  epl.shutdown()
  _assert_fit_equal(fitted, _fit(_custom_step_sequential(
      _PredictionTrackedSequential)))
  print("TF2_FIT_PREDICTION_METRICS_OK peak=%s" %
        fitted[1]["peak_prediction"])


def functional_fit_pipeline():
  fit_pipeline(functional=True)


def zero_v3_in_pipeline():
  """The pipeline with zero.level v3 (Keras Adam): each replica of a stage
  holds one shard of its partitioned weights and slots in the rewritten
  function's own variables; the user's variables get the full values
  after every step. Weights (also after the eager set_weights after step
  2) equal plain TF; a checkpoint of the model restores into one built
  without EPL."""
  config = {"zero.level": "v3", "zero.min_partition_size": 16}
  (model, _), (expected, _), logged = _pipeline_run("adam", config)
  for actual, wanted in zip(model.get_weights(), expected.get_weights()):
    tolerance.assert_equivalent(actual, wanted)
  _restores_without_epl(model)
  partitioned = [line for line in logged if "weight(s) partitioned" in line]
  assert partitioned == ["ZeRO v3: 3 weight(s) partitioned over 2 replicas "
                         "(9 variables with slots)"], logged
  print("TF2_ZERO_V3_OK tf=%s %s" % (tf.__version__, partitioned[0]))


def zero_v3_one_stage():
  """v3 through the engine with one stage scope around the whole model:
  data parallel over 4 replicas, 4 micro-batches; equal to plain TF."""
  (model, _), (expected, _), logged = _pipeline_run(
      "adam", {"zero.level": "v3", "zero.min_partition_size": 16},
      one_stage=True)
  for actual, wanted in zip(model.get_weights(), expected.get_weights()):
    tolerance.assert_equivalent(actual, wanted)
  partitioned = [line for line in logged if "weight(s) partitioned" in line]
  assert partitioned == ["ZeRO v3: 3 weight(s) partitioned over 4 replicas "
                         "(9 variables with slots)"], logged
  print("TF2_ZERO_V3_ONE_STAGE_OK tf=%s" % tf.__version__)


def _restore_after_zeros(model, step, optimizer):
  """After step 2: a checkpoint of the model and the optimizer, every
  weight and slot then set to zero, and the checkpoint restored; then
  the slots (Adam's m and v) halved. Training goes on as without EPL only
  if the checkpoint held the current weights and slots and the restore
  and the halving reached what the step reads."""
  if step != 2:
    return
  saved = tf.train.Checkpoint(model=model, optimizer=optimizer)
  path = saved.save(tempfile.mkdtemp() + "/ckpt")
  for variable in model.variables + optimizer.variables():
    variable.assign(tf.zeros_like(variable))
  saved.restore(path).assert_consumed()
  for variable in optimizer.variables():
    if variable.shape.rank:
      variable.assign(0.5 * variable)


def zero_v3_checkpoint_round_trip():
  """The v3 pipeline with a tf.train.Checkpoint round trip of the model
  and Keras Adam (slots included) and an eager write of the slots between
  steps 2 and 3: equal to plain TF doing the same."""
  (model, _), (expected, _), _ = _pipeline_run(
      "adam", {"zero.level": "v3", "zero.min_partition_size": 16},
      between=_restore_after_zeros)
  for actual, wanted in zip(model.get_weights(), expected.get_weights()):
    tolerance.assert_equivalent(actual, wanted)
  print("TF2_ZERO_V3_CHECKPOINT_OK tf=%s" % tf.__version__)


def fit_custom_step_pipeline():
  """Keras fit of a model in 2 stages x 2 replicas x 4 micro-batches whose
  own train_step updates the compiled loss and mae with the whole batch:
  equal to plain fit."""
  _init(micro_batches=4, default_strategy=False)
  fitted = _fit(_CustomStepModel(
      [epl.replicate(1, name="stage_0"), epl.replicate(1, name="stage_1")]))
  epl.shutdown()
  _assert_fit_equal(fitted, _fit(_CustomStepModel()))
  print("TF2_FIT_CUSTOM_STEP_OK stages=2 replicas=2 micro_batches=4 loss=%s "
        "mae=%s" % (fitted[1]["loss"], fitted[1]["mae"]))


class _PenaltyTrackedSequential(tf.keras.Sequential):
  """A train_step whose loss adds a penalty on the mean prediction, and
  which tracks that mean, weighted by the batch's rows, outside the
  loss: a value EPL cannot merge over the parts."""

  def __init__(self, layers):
    super().__init__(layers)
    self.tracker = tf.keras.metrics.Mean("mean_prediction")

  def train_step(self, data):
    x, y = data
    with tf.GradientTape() as tape:
      mean_prediction = tf.reduce_mean(self(x, training=True))
      loss = self.compiled_loss(y, self(x, training=True)) + tf.square(
          mean_prediction)
    self.optimizer.minimize(loss, self.trainable_variables, tape=tape)
    rows = tf.cast(tf.shape(y)[0], tf.float32)
    self.tracker.update_state(mean_prediction, sample_weight=rows)
    return {"loss": loss}


def fit_undecided_merge_refused():
  """The tracked mean prediction, read outside the divided step."""
  _refused(lambda: _fit(_custom_step_sequential(_PenaltyTrackedSequential)))


class _PeakPenaltySequential(_CustomStepSequential):
  """A train_step whose loss adds a penalty on the square of the peak
  prediction, and which tracks that peak itself: a maximum of each part
  that is no term of the loss, which EPL cannot merge over the parts."""

  def __init__(self, layers):
    super().__init__(layers)
    self.peak_tracker = tf.keras.metrics.Mean("peak_prediction")

  def train_step(self, data):
    x, y = data
    with tf.GradientTape() as tape:
      y_pred = self(x, training=True)
      peak = tf.reduce_max(y_pred)
      loss = self.compiled_loss(y, y_pred) + tf.square(peak)
    self.optimizer.minimize(loss, self.trainable_variables, tape=tape)
    self.peak_tracker.update_state(peak)
    return {"loss": loss}


def fit_undecided_prediction_merge_refused():
  """The tracked peak prediction, computed in the divided step."""
  _refused(lambda: _fit(_custom_step_sequential(_PeakPenaltySequential)))


def _batch_norm_model():
  """Dense (no bias: the batch norm centres its output, so a bias would
  get no gradient but rounding, which Adam scales up), BatchNormalization,
  tanh, Dense; seeded."""
  seeded = tf.keras.initializers.GlorotUniform
  model = tf.keras.Sequential([
      tf.keras.layers.Dense(16, use_bias=False,
                            kernel_initializer=seeded(seed=1)),
      tf.keras.layers.BatchNormalization(),
      tf.keras.layers.Activation("tanh"),
      tf.keras.layers.Dense(1, kernel_initializer=seeded(seed=2))])
  model.build((None, 8))
  return model


def _train_towers(model, towers):
  """Plain TF, as data parallelism defines batch norm: each step the
  model runs on `towers` equal parts of the global batch, each normalized
  by its own statistics, the gradients of the parts' mean loss applied
  (Keras Adam), and the moving statistics moved once by the mean of the
  parts' updates."""
  optimizer = _optimizer("adam")
  norm = [layer for layer in model.layers
          if isinstance(layer, tf.keras.layers.BatchNormalization)][0]
  moving = [norm.moving_mean, norm.moving_variance]

  @tf.function
  def train_step(x, y):
    before = [variable.read_value() for variable in moving]
    losses, moved = [], []
    with tf.GradientTape() as tape:
      for part_x, part_y in zip(tf.split(x, towers), tf.split(y, towers)):
        for variable, value in zip(moving, before):
          variable.assign(value)  # each part moves them from the start
        losses.append(tf.reduce_mean(tf.square(
            model(part_x, training=True) - part_y)))
        moved.append([value - variable.read_value()
                      for variable, value in zip(moving, before)])
      loss = tf.add_n(losses) / towers
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    for variable, value, decrements in zip(moving, before, zip(*moved)):
      variable.assign(value - tf.add_n(decrements) / towers)

  for x, y in tf.data.Dataset.from_tensor_slices(_data()).batch(GLOBAL_BATCH):
    train_step(x, y)
  return model


def batch_norm_accumulation():
  """A Keras model with BatchNormalization in a data-parallel step, 4
  replicas x 2 micro-batches: the trained weights and the moving
  statistics equal plain TF's towers on the same 8 parts (the moving
  statistics moved by the mean of the parts' updates, as MirroredStrategy
  and EPL's TF1 graphs do)."""
  _init(micro_batches=2)
  model, _ = _train("adam", _batch_norm_model())
  epl.shutdown()
  expected = _train_towers(_batch_norm_model(), REPLICAS * 2)
  names = [w.name for w in model.weights]
  for name, actual, wanted in zip(names, model.get_weights(),
                                  expected.get_weights()):
    tolerance.assert_equivalent(actual, wanted, err_msg=name)
  moved = model.layers[1].moving_mean.numpy()
  assert np.abs(moved).max() > 1e-3, moved  # they did move
  print("TF2_BATCH_NORM_OK moving_mean=%s" % moved[:3])


def _updated_error(model, x, y):
  """The mean squared error of `model` called again, in inference mode."""
  return tf.reduce_mean(tf.square(model(x, training=False) - y))


def called_after_update(micro_batches=2, zero=None):
  """The model called again after the update in a data-parallel step (4
  replicas x `micro_batches`, ZeRO `zero`), its error returned by the
  step: that call runs once, on the whole batch, after every replica's
  update; weights and the step's outputs equal plain TF."""
  _init(micro_batches, config={"zero.level": zero} if zero else None)
  model, outputs = _train("adam", after_update=_updated_error)
  epl.shutdown()
  expected, expected_outputs = _train("adam", after_update=_updated_error)
  for actual, wanted in zip(model.get_weights(), expected.get_weights()):
    tolerance.assert_equivalent(actual, wanted)
  tolerance.assert_equivalent(np.array(outputs), np.array(expected_outputs))
  print("TF2_CALLED_AFTER_UPDATE_OK micro_batches=%d zero=%s error=%.6f" % (
      micro_batches, zero, outputs[1]))


def called_after_update_accumulation():
  called_after_update(micro_batches=2)


def called_after_update_zero_v1():
  called_after_update(micro_batches=1, zero="v1")


class _CalledAfterUpdate:
  """A train_step that also tracks the squared error of the model called
  again, in inference mode, once the gradients are applied."""

  def __init__(self, *args):
    super().__init__(*args)
    self.updated_error = tf.keras.metrics.Mean("updated_error")

  def train_step(self, data):
    x, y = data
    with tf.GradientTape() as tape:
      y_pred = self(x, training=True)
      loss = self.compiled_loss(y, y_pred)
    gradients = tape.gradient(loss, self.trainable_variables)
    self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
    self.compiled_metrics.update_state(y, y_pred)
    self.updated_error.update_state(tf.square(self(x, training=False) - y))
    return {metric.name: metric.result() for metric in self.metrics}


class _CalledAfterUpdateSequential(_CalledAfterUpdate, tf.keras.Sequential):
  """_model()'s layers, called again after the update."""


class _CalledAfterUpdateStages(_CalledAfterUpdate, _TwoStageModel):
  """The two-stage model, called again after the update."""


def fit_called_after_update_accumulation():
  """Keras fit of a data-parallel model (4 replicas x 2 micro-batches)
  whose own train_step calls it again after the update: equal to plain
  fit (weights, each epoch's loss, mae and updated error)."""
  _init(micro_batches=2)
  fitted = _fit(_custom_step_sequential(_CalledAfterUpdateSequential))
  epl.shutdown()
  _assert_fit_equal(fitted, _fit(_custom_step_sequential(
      _CalledAfterUpdateSequential)))
  print("TF2_CALLED_AFTER_UPDATE_OK fit %s" % fitted[1]["updated_error"])


def fit_called_after_update_pipeline():
  """The same in 2 stages x 2 replicas x 4 micro-batches."""
  _init(micro_batches=4, default_strategy=False)
  fitted = _fit(_CalledAfterUpdateStages(
      [epl.replicate(1, name="stage_0"), epl.replicate(1, name="stage_1")]))
  epl.shutdown()
  _assert_fit_equal(fitted, _fit(_CalledAfterUpdateStages()))
  print("TF2_CALLED_AFTER_UPDATE_OK fit pipeline %s" %
        fitted[1]["updated_error"])


_VARIABLE_WRITES = ("AssignVariableOp", "AssignAddVariableOp",
                    "AssignSubVariableOp")


def _replica_state_devices(train_step, x, y):
  """The devices of the other replicas' variables and variable writes in
  the GraphDef EPL's rewritten `train_step` runs, and how many there are."""
  step = traced_function.rewritten_step(train_step, x, y)
  devices = [node.device for node in step.graph_def.node
             if node.name.startswith("EPL_REPLICA_") and
             (node.op == "VarHandleOp" or node.op in _VARIABLE_WRITES)]
  return set(devices), len(devices)


def offload(pipeline=False):
  """offload.level v0 on a traced step (Keras Adam), data parallel over 4
  replicas or in 2 stages x 2 replicas x 4 micro-batches, with an eager
  set_weights after step 2: weights equal plain TF, and the rewritten step
  that runs keeps every replica's variables and updates on the host
  (CPU:0; the replicas compute on CPU:1-3)."""
  config = {"offload.level": "v0"}
  placed = []
  record = lambda *call: placed.append(_replica_state_devices(*call))
  if pipeline:
    (model, _), (expected, _), logged = _pipeline_run("adam", config,
                                                      inspect=record)
  else:
    _init(config=config)
    logged = _Logged().lines
    model, _ = _train("adam", between=_halve_weights_after_step_2,
                      inspect=record)
    epl.shutdown()
    expected, _ = _train("adam", between=_halve_weights_after_step_2)
  for actual, wanted in zip(model.get_weights(), expected.get_weights()):
    tolerance.assert_equivalent(actual, wanted)
  (devices, count), = placed
  assert count and {d.split("device:")[-1] for d in devices} == {"CPU:0"}, (
      devices)
  moved = [line for line in logged if "on the host CPU" in line]
  assert moved, logged
  print("TF2_OFFLOAD_OK pipeline=%s %d replica variables and writes on %s; "
        "%s" % (pipeline, count, sorted(devices), moved[0]))


def offload_in_pipeline():
  offload(pipeline=True)


def grouped_apply_refused():
  _refused(lambda: _train("adam"),
           config={"optimizer.num_apply_group": 2})


def uneven_batch_refused():
  _refused(lambda: _train("adam", batch=30))


def iterator_step_refused():
  """A step given the dataset's iterator draws its batch inside, where EPL
  cannot divide it."""
  def run():
    model, optimizer = _model(), _optimizer("adam")

    @tf.function
    def train_step(batches):
      x, y = next(batches)
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
      return loss
    train_step(iter(tf.data.Dataset.from_tensor_slices(_data()).batch(
        GLOBAL_BATCH)))
  _refused(run)


def eager_tape_refused():
  def run():
    model = _model()
    x, y = _data(GLOBAL_BATCH)
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(model(x) - y))
    tape.gradient(loss, model.trainable_variables)
  _refused(run)


def init_after_model_refused():
  """epl.init() after the model was built eagerly (the trial's trap: it
  used to fail with TensorFlow's "No variables to optimize")."""
  model = _model()
  try:
    _init()
    _train("adam", model=model)
  except RuntimeError as error:
    print("TF2_ERROR %s: %s" % (type(error).__name__, error))
    return
  print("TF2_NO_ERROR")


def evaluation_untouched():
  """A tf.function that does not train runs as traced, whatever its batch
  (30 rows do not divide over 4 replicas)."""
  _init()
  model = _model()
  predict = tf.function(lambda x: model(x, training=False))
  x, _ = _data(30)
  tolerance.assert_equivalent(predict(x).numpy(), model(x).numpy())
  print("TF2_EVALUATION_OK")


if __name__ == "__main__":
  scenario = sys.argv[1]
  if scenario.startswith("eager_dp_"):
    eager_dp(scenario[len("eager_dp_"):])
  elif scenario.startswith("pipeline_"):
    pipeline(scenario[len("pipeline_"):])
  elif scenario.startswith("split_head_"):
    split_head(*[int(n) for n in scenario[len("split_head_"):].split("x")])
  elif scenario.startswith("moe_experts_"):
    moe_experts(*[int(n) for n in scenario[len("moe_experts_"):].split("x")])
  elif scenario.startswith("dp_with_"):
    data_parallel_with(scenario[len("dp_with_"):])
  elif scenario.startswith("accumulation_"):
    eager_dp(scenario[len("accumulation_"):], micro_batches=4)
  else:
    globals()[scenario]()
