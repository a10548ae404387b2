"""tf.estimator.Estimator under EPL: the three EPL lines, nothing else.

Training is data parallel (4 logical CPU devices, 8 rows per replica) or
a 2-stage pipeline of 4 micro-batches (stage scopes inside model_fn), and
must give the weights that a single-device Estimator gets on the global
batch of 32 (read back from the checkpoint directories). Evaluation and
prediction are not rewritten and give the single-device answers.
"""
import json
import logging
import os

import numpy as np
import pytest
import tensorflow as tf

import epl
from tests import tolerance
from tests import multiworker
from tests import tf_versions
from tests import training

# Every test that builds an Estimator (all but the checkpoint wait).
NEEDS_ESTIMATOR = pytest.mark.tf_before((2, 16),
                                        reason=tf_versions.ESTIMATOR_GONE)

GLOBAL_BATCH = 32
STEPS = 5
ESTIMATOR_WORKER = os.path.join(multiworker.ROOT, "tests", "workers",
                                "estimator_worker.py")


def input_fn_for(batch_size):
  def input_fn():
    x, y = training.dataset_arrays()
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
        batch_size)
  return input_fn


def _predict_input_fn():
  x, _ = training.dataset_arrays()
  return tf.data.Dataset.from_tensor_slices(x[:GLOBAL_BATCH]).batch(8)


def model_fn_for(model):
  def model_fn(features, labels, mode):
    predictions = model(features)
    if mode == tf.estimator.ModeKeys.PREDICT:
      return tf.estimator.EstimatorSpec(mode, predictions=predictions)
    loss = tf.reduce_mean(tf.square(predictions - labels))
    # Built in every mode, as many model_fns do: evaluation must still not
    # be rewritten (it would read a batch per replica).
    step = tf.compat.v1.train.get_or_create_global_step()
    train_op = training.OPTIMIZERS["momentum"]().minimize(
        loss, global_step=step)
    return tf.estimator.EstimatorSpec(
        mode, loss=loss, train_op=train_op,
        eval_metric_ops={"mae": tf.compat.v1.metrics.mean_absolute_error(
            labels, predictions)})
  return model_fn


class _OpNames(tf.compat.v1.train.SessionRunHook):
  """Names of the ops of the graph a session ran."""

  def __init__(self):
    self.names = []

  def end(self, session):
    self.names = [op.name for op in session.graph.get_operations()]


def _run_single_device_graphs(estimator):
  """Evaluation results and predictions, checking that EPL rewrote
  neither graph."""
  hooks = [_OpNames(), _OpNames()]
  evaluation = estimator.evaluate(input_fn_for(GLOBAL_BATCH), steps=2,
                                  hooks=hooks[:1])
  predictions = np.stack(list(estimator.predict(_predict_input_fn,
                                                hooks=hooks[1:])))
  for hook in hooks:
    assert hook.names
    assert not [n for n in hook.names if n.startswith("EPL_")]
  return evaluation, predictions


def _estimator(model_dir, model=training.layers_model):
  return tf.estimator.Estimator(model_fn_for(model), model_dir=str(model_dir))


def _checkpoint_values(model_dir):
  """Trained variables and global_step of the latest checkpoint."""
  names = [name for name, _ in tf.train.list_variables(str(model_dir))
           if "Momentum" not in name]
  return {name: tf.train.load_variable(str(model_dir), name)
          for name in names}


def _single_device(model_dir, model=training.layers_model, calls=(STEPS,)):
  """A plain Estimator on the global batch: trained (`calls` train calls
  of so many steps), then evaluated and asked for predictions."""
  estimator = _estimator(model_dir, model)
  for steps in calls:
    estimator.train(input_fn_for(GLOBAL_BATCH), steps=steps)
  evaluation = estimator.evaluate(input_fn_for(GLOBAL_BATCH), steps=2)
  predictions = np.stack(list(estimator.predict(_predict_input_fn)))
  return _checkpoint_values(model_dir), evaluation, predictions


def _assert_evaluations_close(actual, expected):
  assert sorted(actual) == sorted(expected)
  for key in expected:
    tolerance.assert_equivalent(actual[key], expected[key], err_msg=key)


@NEEDS_ESTIMATOR
def test_data_parallel_train_evaluate_predict_match_single_device(tmp_path):
  epl.init(epl.Config({"cluster.num_cpu_devices": 4}))
  epl.set_default_strategy(epl.replicate(device_count=1))
  estimator = _estimator(tmp_path / "epl")
  estimator.train(input_fn_for(GLOBAL_BATCH // 4), steps=STEPS)
  trained = _checkpoint_values(tmp_path / "epl")
  evaluation, predictions = _run_single_device_graphs(estimator)
  epl.shutdown()

  plain, plain_evaluation, plain_predictions = _single_device(
      tmp_path / "plain")
  assert trained["global_step"] == STEPS
  training.assert_close(trained, plain)
  _assert_evaluations_close(evaluation, plain_evaluation)
  tolerance.assert_equivalent(predictions, plain_predictions)


@NEEDS_ESTIMATOR
def test_pipeline_in_model_fn_matches_single_device(tmp_path):
  epl.init(epl.Config({"cluster.num_cpu_devices": 2,
                       "pipeline.num_micro_batch": 4}))
  estimator = _estimator(tmp_path / "epl", training.staged_model())
  # Two calls: the second graph is built and staged as the first was, and
  # resumes from the checkpoint (its input starts again, as the plain
  # Estimator's does).
  estimator.train(input_fn_for(GLOBAL_BATCH // 4), steps=2)
  estimator.train(input_fn_for(GLOBAL_BATCH // 4), steps=STEPS - 2)
  trained = _checkpoint_values(tmp_path / "epl")
  evaluation, predictions = _run_single_device_graphs(estimator)
  epl.shutdown()

  plain, plain_evaluation, plain_predictions = _single_device(
      tmp_path / "plain", training.staged_model(), calls=(2, STEPS - 2))
  assert trained["global_step"] == STEPS
  training.assert_close(trained, plain)
  _assert_evaluations_close(evaluation, plain_evaluation)
  tolerance.assert_equivalent(predictions, plain_predictions)


def _train_and_evaluate(model_dir, batch_size):
  estimator = _estimator(model_dir)
  evaluation, _ = tf.estimator.train_and_evaluate(
      estimator,
      tf.estimator.TrainSpec(input_fn_for(batch_size), max_steps=STEPS),
      tf.estimator.EvalSpec(input_fn_for(GLOBAL_BATCH), steps=2,
                            throttle_secs=0))
  return _checkpoint_values(model_dir), evaluation


@NEEDS_ESTIMATOR
def test_train_and_evaluate_matches_single_device(tmp_path):
  epl.init(epl.Config({"cluster.num_cpu_devices": 4}))
  epl.set_default_strategy(epl.replicate(device_count=1))
  trained, evaluation = _train_and_evaluate(tmp_path / "epl",
                                            GLOBAL_BATCH // 4)
  epl.shutdown()
  plain, plain_evaluation = _train_and_evaluate(tmp_path / "plain",
                                                GLOBAL_BATCH)
  training.assert_close(trained, plain)
  _assert_evaluations_close(evaluation, plain_evaluation)


_TWO_WORKERS = json.dumps({
    "cluster": {"worker": ["localhost:1", "localhost:2"]},
    "task": {"type": "worker", "index": 1}})


@NEEDS_ESTIMATOR
def test_run_config_ignores_tf_config_and_distribution(monkeypatch, caplog):
  # Without EPL, a TF_CONFIG of workers without a chief is an error for
  # RunConfig, which would set up its own job from it.
  monkeypatch.setenv("TF_CONFIG", _TWO_WORKERS)
  with pytest.raises(ValueError, match="chief"):
    tf.estimator.RunConfig()
  monkeypatch.delenv("TF_CONFIG")
  epl.init()
  monkeypatch.setenv("TF_CONFIG", _TWO_WORKERS)
  monkeypatch.setattr(logging.getLogger("epl"), "propagate", True)
  with caplog.at_level(logging.WARNING, logger="epl"):
    config = tf.estimator.RunConfig(
        train_distribute=tf.distribute.OneDeviceStrategy("/cpu:0"),
        device_fn=lambda op: "/cpu:0")
  assert config.cluster_spec.as_dict() == {}
  assert config.is_chief and config.num_worker_replicas == 1
  assert config.train_distribute is None and config.device_fn is None
  assert "TF_CONFIG" in caplog.text
  assert "train_distribute" in caplog.text and "device_fn" in caplog.text
  # EPL still reads it.
  assert os.environ["TF_CONFIG"] == _TWO_WORKERS


def _estimator_job(tmp_path, name, model_dir, **options):
  """Runs tests/workers/estimator_worker.py on 2 workers x 2 devices."""
  multiworker.require_namespaces()
  return multiworker.train_job(tmp_path, name, script=ESTIMATOR_WORKER,
                               model_dir=model_dir, **options)


@NEEDS_ESTIMATOR
def test_two_workers_train_like_single_device_and_only_worker_0_writes(
    tmp_path):
  # 2 workers x 2 devices x 8 rows: the global batch of 32. Each worker
  # has its own model directory, to show what each writes.
  job, results = _estimator_job(tmp_path, "train",
                                str(tmp_path / "model_{worker}"))
  assert job.returncode == 0, job.output[-8000:]
  worker0, worker1 = results
  plain, _, _ = _single_device(tmp_path / "plain")
  training.assert_close(_checkpoint_values(tmp_path / "model_0"), plain)
  kinds = {name.split(".")[0] for name in worker0["files"]}
  assert {"checkpoint", "graph", "events", "model", "custom/events"} <= (
      kinds), worker0
  # Worker 1 trained in step but wrote no checkpoint, event or graph file,
  # neither through the Estimator's hooks nor through its own FileWriter.
  assert worker1["files"] == []
  worker1_log = "\n".join(job.lines(1))
  assert "only worker 0 writes event and graph files" in worker1_log
  assert "RunConfig ignores TF_CONFIG" in worker1_log


@NEEDS_ESTIMATOR
def test_two_workers_train_and_evaluate_in_one_directory(tmp_path):
  # One model directory for both workers, as on a shared file system:
  # every worker evaluates worker 0's final checkpoint.
  job, results = _estimator_job(tmp_path, "evaluate",
                                str(tmp_path / "model"), evaluate=True)
  assert job.returncode == 0, job.output[-8000:]
  plain, plain_evaluation = _train_and_evaluate(tmp_path / "plain",
                                                GLOBAL_BATCH)
  training.assert_close(_checkpoint_values(tmp_path / "model"), plain)
  for result in results:
    _assert_evaluations_close(result["evaluation"], plain_evaluation)


def test_other_workers_wait_for_worker_0s_checkpoint(tmp_path):
  """Worker 1's Saver.save only reports worker 0's path; reading the
  latest checkpoint then waits until worker 0 wrote it, or says why not."""
  from types import SimpleNamespace  # pylint: disable=import-outside-toplevel
  from epl.runtime import checkpoint  # pylint: disable=import-outside-toplevel
  env = SimpleNamespace(
      cluster=SimpleNamespace(is_distributed=True, worker_index=1),
      config=SimpleNamespace(cluster=SimpleNamespace(
          collective_timeout_seconds=0.5)))
  path = checkpoint.save(env, None, None, None, str(tmp_path / "model"),
                         global_step=7)
  assert path == str(tmp_path / "model-7")
  assert not os.listdir(tmp_path)
  with pytest.raises(RuntimeError, match="every worker sees"):
    checkpoint.wait_for_worker_zero(env, str(tmp_path))
  # Worker 0 writes it (the state file names it last).
  tf.compat.v1.train.update_checkpoint_state(str(tmp_path), path)
  checkpoint.wait_for_worker_zero(env, str(tmp_path))
