"""Training graphs people really write: Keras optimizers, several train
ops, training EPL cannot see (an error, never a silent single-device run)."""
import numpy as np
import pytest
import tensorflow as tf

import epl
from tests import training

REPLICAS = 4
MICRO = 8
STEPS = 4

KERAS_OPTIMIZERS = {
    "sgd": lambda: tf.keras.optimizers.legacy.SGD(0.05, momentum=0.9),
    "adam": lambda: tf.keras.optimizers.legacy.Adam(0.01),
}


def _keras_step(optimizer, x, y, path):
  if path == "apply_gradients":
    loss = tf.reduce_mean(tf.square(training.layers_model(x) - y))
    variables = tf.compat.v1.trainable_variables()
    return optimizer.apply_gradients(
        zip(tf.gradients(loss, variables), variables))
  # minimize with a callable loss: Keras takes the gradients with a
  # GradientTape.
  return optimizer.minimize(
      lambda: tf.reduce_mean(tf.square(training.layers_model(x) - y)),
      var_list=tf.compat.v1.trainable_variables)


def _train_keras(name, path, batch_size, config=None, stages=False):
  if config is not None:
    epl.init(epl.Config(config))
    if not stages:  # staged_model sets its own
      epl.set_default_strategy(epl.replicate(1))
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.input_batch(batch_size)
    optimizer = KERAS_OPTIMIZERS[name]()
    if stages:
      model = training.staged_model()
      loss = tf.reduce_mean(tf.square(model(x) - y))
      variables = tf.compat.v1.trainable_variables()
      train_op = optimizer.apply_gradients(
          zip(tf.gradients(loss, variables), variables))
    else:
      train_op = _keras_step(optimizer, x, y, path)
  values = training.run_steps(graph, train_op, STEPS)
  epl.shutdown()
  return values


KERAS_SLOTS_OF_REFERENCES = (
    "Keras optimizers cannot make slots for reference variables (plain "
    "TensorFlow raises: initial_value ... float32_ref)")


@pytest.mark.tf2_behaviour_only(reason=KERAS_SLOTS_OF_REFERENCES)
@pytest.mark.parametrize("path", ["apply_gradients", "minimize"])
@pytest.mark.parametrize("name", sorted(KERAS_OPTIMIZERS))
def test_keras_legacy_optimizers_data_parallel(name, path):
  expected = _train_keras(name, path, REPLICAS * MICRO)
  actual = _train_keras(name, path, MICRO,
                        {"cluster.num_cpu_devices": REPLICAS})
  training.assert_close(actual, expected)


@pytest.mark.tf2_behaviour_only(reason=KERAS_SLOTS_OF_REFERENCES)
@pytest.mark.parametrize("name", sorted(KERAS_OPTIMIZERS))
def test_keras_legacy_optimizers_in_a_pipeline(name):
  expected = _train_keras(name, "apply_gradients", 4 * MICRO, stages=True)
  actual = _train_keras(name, "apply_gradients", MICRO,
                        {"cluster.num_cpu_devices": 2,
                         "pipeline.num_micro_batch": 4}, stages=True)
  training.assert_close(actual, expected)


def _build_tf_function_step(x, y):
  # Resource variables, which a GradientTape differentiates (also under
  # TF1 behaviour).
  kernel = tf.compat.v1.get_variable("kernel", [training.FEATURES, 1],
                                     use_resource=True)
  bias = tf.compat.v1.get_variable("bias", [1], use_resource=True)

  @tf.function
  def step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(tf.matmul(x, kernel) + bias - y))
    grads = tape.gradient(loss, [kernel, bias])
    kernel.assign_sub(0.1 * grads[0])
    bias.assign_sub(0.1 * grads[1])
    return loss
  return step()


def test_training_epl_cannot_see_is_an_error():
  epl.init(epl.Config({"cluster.num_cpu_devices": 2}))
  epl.set_default_strategy(epl.replicate(1))
  with tf.Graph().as_default():
    x, y = training.input_batch(MICRO)
    loss = _build_tf_function_step(x, y)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      with pytest.raises(RuntimeError, match="did not parallelise"):
        session.run(loss)


def test_the_error_names_a_few_of_many_variables():
  epl.init(epl.Config({"cluster.num_cpu_devices": 2}))
  epl.set_default_strategy(epl.replicate(1))
  with tf.Graph().as_default():
    x, y = training.input_batch(MICRO)
    weights = [tf.compat.v1.get_variable("w%d" % i, [training.FEATURES, 1],
                                         use_resource=True)
               for i in range(7)]

    @tf.function
    def step():
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(
            tf.add_n([tf.matmul(x, w) for w in weights]) - y))
      for weight, grad in zip(weights, tape.gradient(loss, weights)):
        weight.assign_sub(0.1 * grad)
      return loss
    loss = step()
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      with pytest.raises(RuntimeError, match=r"trains ('w\d', ){4}'w\d' and "
                         r"2 more variables through op"):
        session.run(loss)


def test_train_op_built_after_the_first_run_is_an_error():
  epl.init(epl.Config({"cluster.num_cpu_devices": 2}))
  epl.set_default_strategy(epl.replicate(1))
  with tf.Graph().as_default():
    x, y = training.input_batch(MICRO)
    loss = tf.reduce_mean(tf.square(training.layers_model(x) - y))
    first = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(first)
      known = set(tf.compat.v1.global_variables())
      late = tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss)
      session.run(tf.compat.v1.variables_initializer(
          [v for v in tf.compat.v1.global_variables() if v not in known]))
      with pytest.raises(RuntimeError, match="built after the first"):
        session.run(late)


def _two_player_graph(batch_size):
  """A GAN-shaped graph: two losses, two optimizers on disjoint variables,
  each with its own input."""
  x_a, y_a = training.input_batch(batch_size)
  x_b, _ = training.input_batch(batch_size)
  with tf.compat.v1.variable_scope("generator"):
    fake = tf.compat.v1.layers.dense(
        x_b, training.FEATURES, activation=tf.nn.tanh,
        kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=3))
  with tf.compat.v1.variable_scope("critic", reuse=tf.compat.v1.AUTO_REUSE):
    def critic(inputs):
      return tf.compat.v1.layers.dense(
          inputs, 1, name="score",
          kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=4))
    real_score, fake_score = critic(x_a), critic(fake)
  critic_vars = tf.compat.v1.trainable_variables("critic")
  generator_vars = tf.compat.v1.trainable_variables("generator")
  critic_loss = tf.reduce_mean(tf.square(real_score - y_a)) + tf.reduce_mean(
      tf.square(fake_score))
  generator_loss = tf.reduce_mean(tf.square(fake_score - 1.0))
  critic_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(
      critic_loss, var_list=critic_vars)
  generator_op = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9).minimize(
      generator_loss, var_list=generator_vars)
  return critic_op, generator_op


def _train_two_players(batch_size, config=None):
  if config is not None:
    epl.init(epl.Config(config))
    epl.set_default_strategy(epl.replicate(1))
  graph = tf.Graph()
  with graph.as_default():
    critic_op, generator_op = _two_player_graph(batch_size)
    names = [v.op.name for v in tf.compat.v1.trainable_variables()]
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      # Each train op alone, then both in one run.
      for fetch in [critic_op, generator_op, critic_op, critic_op,
                    generator_op, [critic_op, generator_op]]:
        session.run(fetch)
      values = training.read_variables(session, graph, names)
  epl.shutdown()
  return values


def test_two_train_ops_run_alone_or_together():
  # Running both in one step reads one batch per input, as one device does;
  # the critic's update and the generator's read the same weights.
  expected = _train_two_players(REPLICAS * MICRO)
  actual = _train_two_players(MICRO, {"cluster.num_cpu_devices": REPLICAS})
  training.assert_close(actual, expected)
  assert set(expected) == {n for n in actual}
  assert not np.allclose(expected["generator/dense/kernel"], 0)


def _control_flow_model(x):
  """A model with tf.cond and tf.while_loop (control flow v2) in it."""
  hidden = training.layers_model(x)
  hidden = tf.cond(tf.reduce_mean(x) > -10.0, lambda: hidden * 1.5,
                   lambda: hidden)
  _, hidden = tf.while_loop(lambda i, h: i < 3,
                            lambda i, h: (i + 1, tf.tanh(h) + h * 0.5),
                            [tf.constant(0), hidden])
  return hidden


@pytest.mark.parametrize("config", [
    {"cluster.num_cpu_devices": REPLICAS},
    {"cluster.num_cpu_devices": 2, "pipeline.num_micro_batch": 2}],
                         ids=["data_parallel", "micro_batches"])
def test_control_flow_v2_in_the_model(config):
  copies = config["cluster.num_cpu_devices"] * config.get(
      "pipeline.num_micro_batch", 1)
  expected, _, _ = training.train(_control_flow_model, "adam",
                                  batch_size=copies * MICRO, with_epl=False)
  actual, _, _ = training.train(_control_flow_model, "adam", batch_size=MICRO,
                                config=config)
  training.assert_close(actual, expected)


def _train_interleaved(batch_size, config=None):
  """Two losses on shared variables: compute_gradients for both, then
  apply_gradients for both (each its own optimizer, one post-processes)."""
  if config is not None:
    epl.init(epl.Config(config))
    epl.set_default_strategy(epl.replicate(1))
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.input_batch(batch_size)
    prediction = training.layers_model(x)
    loss_a = tf.reduce_mean(tf.square(prediction - y))
    loss_b = tf.reduce_mean(tf.abs(prediction - y))
    opt_a = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9)
    opt_b = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    grads_a = opt_a.compute_gradients(loss_a)
    grads_b = opt_b.compute_gradients(loss_b)
    train_a = opt_a.apply_gradients([(g * 0.5, v) for g, v in grads_a])
    train_b = opt_b.apply_gradients(grads_b)
    names = [v.op.name for v in tf.compat.v1.trainable_variables()]
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for fetch in [train_a, train_b, train_a, [train_a, train_b]]:
        session.run(fetch)
      values = training.read_variables(session, graph, names)
  epl.shutdown()
  return values


@pytest.mark.tf2_behaviour_only(
    reason="two train ops that update the same reference variables, "
    "fetched in one run, race in plain TensorFlow: a backward op reads the "
    "weight before or after the other train op's update, as ops happen to "
    "run")
@pytest.mark.parametrize("clip_after_allreduce", [False, True])
def test_interleaved_compute_and_apply_pairs_match_their_own_gradients(
    clip_after_allreduce):
  expected = _train_interleaved(REPLICAS * MICRO)
  actual = _train_interleaved(MICRO, {
      "cluster.num_cpu_devices": REPLICAS,
      "communication.clip_after_allreduce": clip_after_allreduce})
  training.assert_close(actual, expected)
