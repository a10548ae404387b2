"""One worker of a multi-worker TF2 job (tests/test_multi_worker_tf2.py,
started by epl-launch): eager execution stays on, and the script is the
eager loop over a `@tf.function` step of tests/clients/tf2_scripts.py
(a Keras model, a Keras optimizer), data parallel over every device of
every worker.

Each worker calls the step with its share of every global batch of 32
rows (worker k: rows 16k to 16k + 15), as a TF1 worker feeds its own
batch. Worker 1 initialises its model with other random weights: EPL's
first call gives it worker 0's. Writes OUT/worker_<i>.json: the losses the
step returned and the weights after --steps steps under EPL; then, after
epl.shutdown(), the same loop without EPL on the whole global batch from
worker 0's initial weights (the plain single-device reference).

--scenario refused calls a step whose model opens two stage scopes,
then a step whose model has a split head, and writes the errors they
raised; --kill_at_step K
makes worker 1 exit before step K.
"""
import argparse
import json
import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import epl  # noqa: E402
from tests.clients import tf2_scripts  # noqa: E402


def _args():
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", required=True)
  parser.add_argument("--scenario", default="dp",
                      choices=("dp", "pipeline", "fit", "fit_mae", "refused"))
  parser.add_argument("--optimizer", default="adam",
                      choices=("adam", "legacy"))
  parser.add_argument("--micro_batches", type=int, default=1)
  parser.add_argument("--collective_timeout", type=float, default=30.0)
  parser.add_argument("--config", default="{}",
                      help="more EPL config, as JSON")
  parser.add_argument("--kill_at_step", type=int, default=None)
  return parser.parse_args()


def _share(worker, workers):
  """This worker's rows of a global batch."""
  def feed(x, y):
    rows = x.shape[0] // workers
    return (x[worker * rows:(worker + 1) * rows],
            y[worker * rows:(worker + 1) * rows])
  return feed


def _model(worker, scenario):
  if scenario == "pipeline":
    # Built lazily in the step, seeded: the same weights on every worker.
    return tf2_scripts._TwoStageModel([  # pylint: disable=protected-access
        epl.replicate(device_count=1, name="stage_0"),
        epl.replicate(device_count=1, name="stage_1")])
  model = tf2_scripts._model()  # pylint: disable=protected-access
  if worker:
    rng = np.random.RandomState(100 + worker)
    model.set_weights([rng.normal(size=w.shape).astype(np.float32)
                       for w in model.get_weights()])
  return model


def _plain_model(scenario):
  """The model of `scenario` without EPL, from worker 0's weights."""
  if scenario == "pipeline":
    return tf2_scripts._TwoStageModel()  # pylint: disable=protected-access
  return tf2_scripts._model()  # pylint: disable=protected-access


def _kill_between(worker, at_step):
  def between(model, step, optimizer):
    del model, optimizer
    if worker == 1 and step + 1 == at_step:
      print("worker 1 exits before step %d" % at_step, flush=True)
      os._exit(3)  # pylint: disable=protected-access
  return between


def _refused(result):
  model = tf2_scripts._TwoStageModel([  # pylint: disable=protected-access
      epl.replicate(device_count=1, name="stage_0"),
      epl.replicate(device_count=1, name="stage_1")])
  result["errors"] = []
  try:
    tf2_scripts._train("adam", model)  # pylint: disable=protected-access
  except NotImplementedError as error:
    result["errors"].append("%s: %s" % (type(error).__name__, error))
  try:
    tf2_scripts._train_classifier(  # pylint: disable=protected-access
        tf2_scripts._SplitHeadModel(  # pylint: disable=protected-access
            epl.replicate(1, name="body"), epl.split(name="head")))
  except NotImplementedError as error:
    result["errors"].append("%s: %s" % (type(error).__name__, error))


def _fit(worker, workers, result, metrics):
  """Keras fit (2 epochs, Adam, mse, `metrics`) on this worker's rows of
  every global batch, then plain fit on the whole batches; an error
  raised is written instead."""
  epl.set_default_strategy(epl.replicate(device_count=1))
  try:
    weights, history = tf2_scripts._fit(  # pylint: disable=protected-access
        _model(worker, "fit"), workers, worker, metrics)
  except NotImplementedError as error:
    result["errors"] = ["%s: %s" % (type(error).__name__, error)]
    return
  result["variables"] = [w.tolist() for w in weights]
  result["history"] = history
  epl.shutdown()
  weights, history = tf2_scripts._fit(  # pylint: disable=protected-access
      tf2_scripts._model(), metrics=metrics)  # pylint: disable=protected-access
  result["plain_variables"] = [w.tolist() for w in weights]
  result["plain_history"] = history


def main():
  args = _args()
  epl.init(epl.Config(dict(json.loads(args.config), **{
      "cluster.collective_timeout_seconds": args.collective_timeout,
      "pipeline.num_micro_batch": args.micro_batches,
      "cluster.colocate_split_and_replicate": args.scenario == "refused"})))
  assert tf.executing_eagerly()
  cluster = epl.Env.get().cluster
  worker = cluster.worker_index
  result = {"worker": worker, "losses": []}
  if args.scenario == "refused":
    _refused(result)
  elif args.scenario.startswith("fit"):
    _fit(worker, cluster.worker_num, result,
         ["mae"] if args.scenario == "fit_mae" else [])
  else:
    if args.scenario == "dp":
      epl.set_default_strategy(epl.replicate(device_count=1))
    between = (_kill_between(worker, args.kill_at_step)
               if args.kill_at_step else None)
    model, _ = tf2_scripts._train(  # pylint: disable=protected-access
        args.optimizer, _model(worker, args.scenario), feed=_share(worker, cluster.worker_num),
        losses=result["losses"], between=between)
    result["variables"] = [w.tolist() for w in model.get_weights()]
    result["device"] = model.trainable_variables[0].device
    epl.shutdown()
    plain_losses = []
    plain, _ = tf2_scripts._train(  # pylint: disable=protected-access
        args.optimizer, _plain_model(args.scenario), losses=plain_losses)
    result["plain_variables"] = [w.tolist() for w in plain.get_weights()]
    result["plain_losses"] = plain_losses
  with open(os.path.join(args.out, "worker_%d.json" % worker), "w") as f:
    json.dump(result, f)
  print("worker %d done" % worker, flush=True)


if __name__ == "__main__":
  main()
