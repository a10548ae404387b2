"""optimizer.grappler: the Grappler preset EPL hands every session, and the
user's own session settings winning over it."""
import os
import subprocess
import sys

import pytest
import tensorflow as tf

import epl
from epl.cluster import Cluster
from epl.env import Env
from epl.runtime import grappler
from epl.runtime import session as epl_session

RewriterConfig = type(tf.compat.v1.ConfigProto().graph_options.rewrite_options)


def _rewrite_options(config=None, session_config=None):
  env = Env(epl.Config(config or {}), Cluster.of([], 0, "CPU", 2))
  _, proto = epl_session.session_settings(env, "", session_config)
  return proto.graph_options.rewrite_options


def _fast_value(field):
  return grappler._value(RewriterConfig(), field, grappler.FAST[field])  # pylint: disable=protected-access


def test_fast_preset_sets_every_field_of_the_preset():
  options = _rewrite_options({"optimizer.grappler": "fast"})
  for field in grappler.preset_fields("fast"):
    assert getattr(options, field) == _fast_value(field), field
  assert not options.disable_meta_optimizer


@pytest.mark.parametrize("onednn", [True, False])
def test_fast_preset_keeps_the_arithmetic_pass_where_onednn_runs(
    monkeypatch, onednn):
  monkeypatch.setattr(grappler.ops, "onednn_graph_rewrites", lambda: onednn)
  options = _rewrite_options({"optimizer.grappler": "fast"})
  if onednn:
    assert options.arithmetic_optimization == RewriterConfig.DEFAULT
    assert set(grappler.preset_fields("fast")) == (
        set(grappler.FAST) - set(grappler.ONEDNN_UNSAFE))
  else:
    assert options.arithmetic_optimization == RewriterConfig.OFF
    assert grappler.preset_fields("fast") == grappler.FAST


# Tiny BERT with recomputation on 2 replicas: the graph whose first step
# aborted TensorFlow 2.15 (`FindInstanceNorm`, "key not found: value",
# segfault) on CPUs with oneDNN rewrites while the preset turned the
# arithmetic pass off. Run in its own process, which the crash would kill.
_RECOMPUTED_LAYER_NORM_STEP = """
import os, sys
sys.path.insert(0, %r)
os.environ["EPL_GRADIENT_CHECKPOINT_TYPE"] = "auto"
os.environ["EPL_OPTIMIZER_GRAPPLER"] = "fast"
import tensorflow as tf
from examples.bert_large import train
with tf.Graph().as_default():
  built = train.build_graph(train.make_flags(
      config="tiny", num_layers=1, parallel="data", num_cpu_devices=2,
      batch_size=1, seq_length=8, dropout=False, steps=10))
  with tf.compat.v1.Session() as session:
    session.run(tf.compat.v1.global_variables_initializer())
    print("loss", session.run([built["train_op"], built["loss"]])[1])
"""


@pytest.mark.timeout(300)
def test_fast_preset_keeps_onednn_graphs_safe():
  # Fails (exit -11) without the oneDNN exception of the preset on CPUs
  # where TensorFlow runs its oneDNN rewrites; passes anywhere else.
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  done = subprocess.run(
      [sys.executable, "-c", _RECOMPUTED_LAYER_NORM_STEP % root],
      capture_output=True, text=True, timeout=280, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "loss" in done.stdout


def test_default_preset_leaves_tensorflows_settings():
  assert _rewrite_options({"optimizer.grappler": "default"}) == (
      RewriterConfig())


def test_the_key_comes_from_the_environment(monkeypatch):
  monkeypatch.setenv("EPL_OPTIMIZER_GRAPPLER", "default")
  assert epl.Config().optimizer.grappler == "default"
  assert _rewrite_options() == RewriterConfig()


def test_a_field_the_user_set_wins():
  user = tf.compat.v1.ConfigProto()
  field = next(iter(grappler.FAST))
  enum = RewriterConfig.DESCRIPTOR.fields_by_name[field].enum_type
  mine = next(v.number for v in enum.values
              if v.number not in (0, _fast_value(field)))
  setattr(user.graph_options.rewrite_options, field, mine)
  user.graph_options.rewrite_options.arithmetic_optimization = (
      RewriterConfig.ON)
  options = _rewrite_options({"optimizer.grappler": "fast"}, user)
  assert getattr(options, field) == mine
  assert options.arithmetic_optimization == RewriterConfig.ON
  # The user's proto itself is not changed.
  assert user.graph_options.rewrite_options.memory_optimization == 0


@pytest.mark.parametrize("choice", ["off", "named optimizers"])
def test_a_user_choice_of_optimizers_is_left_alone(choice):
  user = tf.compat.v1.ConfigProto()
  if choice == "off":
    user.graph_options.rewrite_options.disable_meta_optimizer = True
  else:
    user.graph_options.rewrite_options.optimizers.append("constfold")
  options = _rewrite_options({"optimizer.grappler": "fast"}, user)
  assert options == user.graph_options.rewrite_options


def test_an_epl_session_runs_with_the_preset(monkeypatch):
  # The preset reaches the session the user opens (through epl.init's
  # hooks), and a model trained there computes what it computes under
  # TensorFlow's own preset.
  handed = []

  def recording(*args, **kwargs):
    target, proto = session_settings(*args, **kwargs)
    handed.append(proto.graph_options.rewrite_options)
    return target, proto

  session_settings = epl_session.session_settings
  monkeypatch.setattr(epl_session, "session_settings", recording)
  results = {}
  for preset in ("fast", "default"):
    epl.shutdown()
    with tf.Graph().as_default():
      epl.init(epl.Config({"optimizer.grappler": preset,
                           "cluster.num_cpu_devices": 2}))
      epl.set_default_strategy(epl.replicate(device_count=1))
      x = tf.random.stateless_normal([4, 3], seed=[1, 2])
      w = tf.compat.v1.get_variable(
          "w", initializer=tf.compat.v1.constant([[0.5], [-0.2], [0.1]]))
      loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.0))
      train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
      with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(3):
          sess.run(train)
        results[preset] = sess.run(w)
  fast, default = handed
  for field in grappler.preset_fields("fast"):
    assert getattr(fast, field) == _fast_value(field), field
  assert default == RewriterConfig()
  assert results["fast"] == pytest.approx(results["default"], abs=1e-6)
