"""Keras `Model.fit` in graph mode (issue 34 item 4): a TF1-style script
with tf-keras and legacy optimizers trains under EPL, data parallel and
as a pipeline, with ZeRO and gradient checkpointing, equal to the same
script without EPL, and its ModelCheckpoint files and `load_weights` hold
and restore the one value of each weight; compiled metrics (mae,
accuracy) report, per epoch and in `evaluate`, what they report without
EPL; the Keras v2 optimizers give TensorFlow's own error.
Each scenario runs in a subprocess (tests/clients/keras_graph_fit.py):
each switches eager execution off in its own way, and Keras keeps a
session per process. `make test-latest` runs them on TF 2.21 with
tf-keras."""
import pytest

from tests import training

SCRIPT = "tests/clients/keras_graph_fit.py"


def _run(*arguments):
  return training.run_client(SCRIPT, *arguments)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("scenario", [
    "dp", "dp_in_scope", "dp_v1_behavior", "pipeline", "pipeline_sequential",
    "checkpoints", "dp_metrics", "dp_accuracy", "dp_weighted_metrics",
    "pipeline_metrics",
    "pipeline_accuracy", "pipeline_two_outputs",
    "pipeline_v1_behavior_metrics"])
def test_fit_in_graph_mode_matches_plain_keras(scenario):
  printed = _run(scenario)
  assert "KERAS_GRAPH_FIT_OK" in printed, printed
  if scenario.startswith("pipeline"):
    assert "Keras Model.predict of a model built in 2 pipeline stages" in (
        printed), printed


@pytest.mark.timeout(300)
@pytest.mark.parametrize("scenario, setting, says", [
    ("dp_v1_behavior", "zero.level=v1",
     "ZeRO v1: TaskGraph 0's 4 variables dealt to 4 replicas"),
    ("pipeline", "zero.level=v1", "EPL plan: zero: v1"),
    ("dp", "gradient_checkpoint.type=auto", "Gradient checkpointing (auto)"),
    ("pipeline", "gradient_checkpoint.type=auto",
     "Gradient checkpointing (auto)"),
])
def test_fit_in_graph_mode_with_memory_savers_matches_plain_keras(
    scenario, setting, says):
  printed = _run(scenario, setting)
  assert "KERAS_GRAPH_FIT_OK" in printed and says in printed, printed


@pytest.mark.timeout(300)
def test_predict_after_fit_with_a_loop_of_micro_batches_matches_plain_keras():
  """Data parallel with 4 micro-batches a replica as a loop: predict after
  fit (which used to fail: the loop reads the targets, which predict does
  not feed) returns what plain Keras predict returns."""
  printed = _run("dp", "pipeline.num_micro_batch=4")
  assert "KERAS_GRAPH_FIT_OK" in printed, printed
  assert "micro-batches: loop" in printed, printed
  assert ("Keras Model.predict of sequential computes its outputs on the "
          "whole batch") in printed, printed


@pytest.mark.timeout(300)
@pytest.mark.parametrize("scenario, says", [
    ("v2_optimizer", "AttributeError: 'Adam' object has no attribute "
                     "'get_updates'"),
    ("metrics_refused", "MetricsNotSupported: Keras Model.fit of model "
                        "in graph mode under EPL: the metric 'hidden_mean' "
                        "reads 'dense/Tanh:0', a tensor of the model's "
                        "forward pass"),
])
def test_what_fit_in_graph_mode_refuses(scenario, says):
  printed = _run(scenario)
  assert "KERAS_GRAPH_FIT_ERROR " + says in printed, printed
