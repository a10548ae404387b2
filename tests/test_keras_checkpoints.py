"""Keras checkpoints of TF2 scripts trained under EPL with eager execution
on (issue 34 item 1): `model.save_weights`/`load_weights` after an eager
`tf.function` loop, and `ModelCheckpoint` during `Model.fit`, restore into
a model built without EPL with the trained weights. Each scenario runs in
a subprocess (tests/clients/keras_checkpoints.py): this process runs in
graph mode. Keras checkpoints in graph mode: tests/test_keras_graph_fit.py."""
import pytest

from tests import training


@pytest.mark.timeout(300)
@pytest.mark.parametrize("scenario, says", [
    ("loop_save_weights_h5", "save_weights.h5"),
    ("loop_save_weights_tf", "save_weights.ckpt"),
    ("fit_model_checkpoint", "ModelCheckpoint"),
])
def test_keras_checkpoints_restore_into_a_model_without_epl(scenario, says):
  printed = training.run_client("tests/clients/keras_checkpoints.py",
                                scenario)
  assert "KERAS_CHECKPOINT_OK " + says in printed, printed
