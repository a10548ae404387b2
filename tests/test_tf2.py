"""TF2 scripts with eager execution on (issue 34): an eager loop over a
`@tf.function` step with a Keras model and optimizer is data parallel, with
or without a loop over micro-batches, GC or ZeRO (EPL's engine rewrites
the traced step), and so is Keras `Model.fit`; each
equals the same script without EPL; what is not supported yet raises EPL's
error. Each scenario runs in a subprocess (tests/clients/tf2_scripts.py):
this process runs in graph mode (conftest), and eager execution cannot be
switched back on. `make test-latest` runs them on TF 2.21 with tf-keras."""
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "clients" / "tf2_scripts.py"


def _run(scenario, with_log=False):
  """What the scenario prints (and, `with_log`, then what it logs)."""
  env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
  result = subprocess.run([sys.executable, str(SCRIPT), scenario],
                          capture_output=True, text=True, timeout=240,
                          check=False, env=env, cwd=str(ROOT))
  assert result.returncode == 0, result.stdout + result.stderr[-5000:]
  return result.stdout + (result.stderr if with_log else "")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("optimizer", ["adam", "legacy", "v1"])
def test_eager_tf_function_loop_data_parallel_matches_single_device(
    optimizer):
  assert "TF2_EAGER_DP_OK" in _run("eager_dp_" + optimizer)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("optimizer", ["adam", "legacy", "v1"])
@pytest.mark.parametrize("scenario, says", [
    # A loop over 4 micro-batches a replica (no stages).
    ("accumulation_", "TF2_EAGER_DP_OK"),
    # 2 stages x 2 replicas x 4 micro-batches through EPL's engine.
    ("pipeline_", "TF2_PIPELINE_OK"),
])
def test_four_micro_batches_match_single_device(scenario, says, optimizer):
  printed = _run(scenario + optimizer, with_log=True)
  assert says in printed and "micro_batches=4" in printed
  if scenario == "accumulation_":
    # The traced step's batch arguments are fed placeholders of the
    # engine's copy: their parts reach the engine's loop, no copies.
    assert "micro-batches: loop" in printed
    assert "not as a loop" not in printed, printed


@pytest.mark.timeout(300)
@pytest.mark.parametrize("saver", ["recompute", "zero_v1", "zero_v2", "amp"])
def test_memory_savers_of_the_engine_apply_to_a_data_parallel_step(saver):
  # The step opens no scope: EPL's engine runs it under the default
  # strategy, with its passes.
  assert "TF2_DP_SAVER_OK " + saver in _run("dp_with_" + saver)


@pytest.mark.timeout(300)
def test_two_traced_steps_keep_their_own_replicas_state():
  # Two models' steps called in turn under ZeRO v1: each rewrite's copies
  # of its Adam slots are its own, though both name them alike.
  assert "TF2_TWO_MODELS_OK" in _run("two_models_in_turn")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("scenario", ["offload", "offload_in_pipeline"])
def test_offload_of_a_traced_step_keeps_the_state_on_the_host(scenario):
  """offload.level v0 through the engine's pass: equal to plain TF, and
  the GraphDef the rewritten step runs places the replicas' variables and
  updates on the host (before the importer's fix, the copies kept their
  replica's device there)."""
  assert "TF2_OFFLOAD_OK" in _run(scenario)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("scenario, says", [
    ("recompute_in_pipeline", "TF2_RECOMPUTE_OK"),
    ("amp_in_pipeline", "TF2_AMP_OK"),
    ("zero_in_pipeline", "TF2_ZERO_OK"),
    # v3: 3 weights and their 6 Adam slots in shards of 2 replicas a stage.
    ("zero_v3_in_pipeline", "TF2_ZERO_V3_OK"),
    # v3 with a checkpoint of model and optimizer restored between steps
    # (after zeroing them) and the slots written eagerly.
    ("zero_v3_checkpoint_round_trip", "TF2_ZERO_V3_CHECKPOINT_OK"),
    # v3 with the model in one stage scope: 4 replicas, data parallel
    # through the engine.
    ("zero_v3_one_stage", "TF2_ZERO_V3_ONE_STAGE_OK"),
])
def test_memory_savers_of_the_engine_apply_to_a_traced_pipeline(scenario,
                                                                says):
  assert says in _run(scenario)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("scenario, says", [
    # Layers called in two stage scopes while the model is built: the
    # traced step calls them in those stages (2 x 2 replicas x 4).
    ("functional_pipeline", "TF2_FUNCTIONAL_PIPELINE_OK"),
    ("sequential_pipeline", "TF2_FUNCTIONAL_PIPELINE_OK Sequential"),
    # Built in one replicate(1) scope: data parallel, as before.
    ("functional_in_one_scope", "TF2_FUNCTIONAL_DP_OK"),
])
def test_functional_model_built_in_scopes_matches_single_device(scenario,
                                                                says):
  assert says in _run(scenario)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("shards, micro_batches", [
    (4, 1),  # one shard group, 10 classes in 4 shards of 3 (padded)
    (2, 1),  # two shard groups, data parallel with each other
    (4, 4),  # with a loop over 4 micro-batches
])
def test_split_head_in_a_traced_step_matches_single_device(shards,
                                                           micro_batches):
  printed = _run("split_head_%dx%d" % (shards, micro_batches))
  assert "TF2_SPLIT_OK" in printed and "shards=%d" % shards in printed


@pytest.mark.timeout(300)
def test_functional_model_built_with_a_split_head_matches_single_device():
  printed = _run("functional_split_head")
  assert "TF2_SPLIT_OK" in printed and "Functional shards=4" in printed


@pytest.mark.timeout(300)
def test_split_head_shards_follow_eager_writes_and_checkpoints():
  # An eager set_weights after step 1; after step 2 a tf.train.Checkpoint
  # of model and Adam, everything zeroed, restored, the slots halved: the
  # shards each device holds follow, and the checkpoint is whole.
  printed = _run("split_weights_round_trip")
  assert "TF2_SPLIT_OK" in printed and "TF2_SPLIT_ROUND_TRIP_OK" in printed


@pytest.mark.timeout(300)
@pytest.mark.parametrize("shards, micro_batches", [
    (4, 1),  # one expert a shard, one shard group
    (2, 1),  # two experts a shard, two shard groups
    (4, 4),  # with a loop over 4 micro-batches
])
def test_moe_experts_in_a_traced_step_match_single_device(shards,
                                                          micro_batches):
  printed = _run("moe_experts_%dx%d" % (shards, micro_batches))
  assert "TF2_MOE_OK" in printed and "shards=%d replicas=4 micro_batches=%d" % (
      shards, micro_batches) in printed


@pytest.mark.timeout(300)
@pytest.mark.parametrize("scenario, says", [
    # The experts' weights dealt to owners with the others.
    ("moe_zero_v1", "TF2_MOE_OK"),
    # Gradient checkpointing (auto) around the experts.
    ("moe_recompute", "TF2_MOE_OK"),
    # Keras fit (eager), the experts split over 4.
    ("fit_moe", "TF2_FIT_MOE_OK"),
])
def test_moe_experts_with_savers_and_keras_fit_match_single_device(scenario,
                                                                   says):
  assert says in _run(scenario)


@pytest.mark.timeout(300)
def test_batch_norm_statistics_in_a_traced_step_match_towers():
  """The moving statistics of a data-parallel step with micro-batches move
  by the mean of the parts' updates (they used to be optimizer updates,
  moved by one part's statistics on each replica)."""
  assert "TF2_BATCH_NORM_OK" in _run("batch_norm_accumulation")


@pytest.mark.timeout(300)
def test_keras_fit_data_parallel_matches_plain_fit():
  assert "TF2_FIT_DP_OK" in _run("fit_dp")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("scenario", ["fit_pipeline", "functional_fit_pipeline"])
def test_keras_fit_pipeline_matches_plain_fit(scenario):
  assert "TF2_FIT_PIPELINE_OK" in _run(scenario)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("scenario", ["fit_custom_step_dp",
                                      "fit_custom_step_accumulation",
                                      "fit_custom_step_pipeline"])
def test_own_train_step_updating_metrics_matches_plain_fit(scenario):
  """A model's own train_step that updates the compiled loss and metrics
  with the whole batch (Keras' guide "Customizing what happens in fit()")
  reads the model's outputs and loss merged over replicas and
  micro-batches."""
  assert "TF2_FIT_CUSTOM_STEP_OK" in _run(scenario)


@pytest.mark.timeout(300)
def test_metrics_of_the_predictions_alone_match_plain_fit():
  """A Mean of the predictions and one of their maximum, updated in the
  model's own train_step, read neither the targets nor the loss: they
  too run outside the divided step, on the predictions concatenated."""
  assert "TF2_FIT_PREDICTION_METRICS_OK" in _run("fit_prediction_metrics_dp")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("scenario", [
    # 4 replicas x 2 micro-batches: the call after the update used to be
    # put in the micro-batch loop, before the update (a cycle).
    "called_after_update_accumulation",
    # ZeRO v1: the call used to read replica 0's copies before the owners'
    # new values reached them.
    "called_after_update_zero_v1",
    # Keras fit, own train_step: a shape error (one replica's rows against
    # the whole batch's targets), and a cycle in a pipeline.
    "fit_called_after_update_accumulation",
    "fit_called_after_update_pipeline"])
def test_model_called_again_after_the_update_matches_single_device(scenario):
  assert "TF2_CALLED_AFTER_UPDATE_OK" in _run(scenario)


@pytest.mark.timeout(300)
def test_keras_fit_of_two_outputs_matches_plain_fit():
  assert "TF2_FIT_TWO_OUTPUTS_OK" in _run("fit_two_outputs_dp")


@pytest.mark.timeout(300)
def test_functions_that_do_not_train_run_as_traced():
  assert "TF2_EVALUATION_OK" in _run("evaluation_untouched")


@pytest.mark.timeout(300)
def test_checkpoint_after_eager_training_holds_one_copy():
  assert "TF2_CHECKPOINT_OK" in _run("checkpoint")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("scenario, says", [
    ("eager_tape_refused", "Decorate the train step with @tf.function"),
    ("fit_run_eagerly_refused", "runs eagerly (run_eagerly=True)"),
    ("split_softmax_refused", "Op 'Softmax' (Softmax) reads the sharded "
                              "logits"),
    ("split_clipnorm_refused", "The update of the split weight "
                               "private__split_head_model/kernel:0 is not "
                               "elementwise (Greater, Sum"),
    ("split_weight_read_elsewhere_refused",
     "Op 'Square/ReadVariableOp' (ReadVariableOp) of the traced step reads "
     "the split weight private__split_head_model/kernel:0 outside its "
     "layer in epl.split"),
    ("split_evaluation_refused", "computes the split layer output "
                                 "private__split_head_model/dense_1/BiasAdd:0 "
                                 "but trains nothing"),
    ("moe_not_dividing_refused", "reads the variable "
                                 "private__mo_e_model/experts/inner:0 of "
                                 "shape (4, 8, 16): dimension 0 (its "
                                 "experts) must be known and divide by the "
                                 "3 shards"),
    ("tf1_dense_in_traced_split_refused",
     "tf.compat.v1.layers.dense inside epl.split(device_count=2, "
     "name='head') with eager execution on"),
    ("grouped_apply_refused", "optimizer.num_apply_group 2 asked, but EPL "
                              "groups an update only while a "
                              "tf.compat.v1.train.Optimizer's "
                              "apply_gradients builds it"),
    ("functional_layer_in_two_stages_refused",
     "Keras layer 'dense' is called in epl.replicate(device_count=1, "
     "name='stage_0') and in epl.replicate(device_count=1, "
     "name='stage_1')"),
    ("fit_undecided_merge_refused", "'Mul_1' (Mul), outside the part EPL "
                                    "divides over replicas and "
                                    "micro-batches, reads 'Mean:0'"),
    ("fit_undecided_prediction_merge_refused",
     "'Sum_2' (Sum), outside the part EPL divides over replicas and "
     "micro-batches, reads 'Max:0' (shape ())"),
    ("uneven_batch_refused", "The batch fed to placeholder 'x' has 30 "
                             "rows: EPL splits it into 4 equal parts"),
    ("iterator_step_refused", "takes an iterator or a dataset and draws "
                              "its batch inside"),
    ("init_after_model_refused", "Call epl.init() at the top of the script, "
                                 "before anything runs"),
])
def test_unsupported_tf2_steps_raise_naming_the_fix(scenario, says):
  printed = _run(scenario)
  assert "TF2_ERROR" in printed and says in printed, printed
