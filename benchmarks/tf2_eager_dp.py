"""The eager TF2 data-parallel script under EPL against the same script
under tf.distribute.MirroredStrategy (its TF2 anchor), side by side in one
run: time to the first step and steps/s.

Each mode runs in a fresh process (a process's eager devices are fixed
when its runtime starts) on `--devices` logical CPU devices, alternating
`--rounds` times: an MLP trained by an eager loop over a `@tf.function`
step (GradientTape, Keras Adam) on a global batch of `--batch` rows. The
time to the first step runs from building the model to the first step's
loss; steps/s is over `--steps` steps after it. Each is also given in
the process's CPU time (all its threads), steadier than wall time on a
shared machine.

    PYTHONPATH=. python benchmarks/tf2_eager_dp.py [--steps 50]
"""
import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MODES = ("epl", "mirrored", "plain")


def _child(args):
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  devices = ["/device:CPU:%d" % i for i in range(args.devices)]
  if args.mode == "epl":
    import epl  # pylint: disable=import-outside-toplevel
    epl.init(epl.Config({"cluster.num_cpu_devices": args.devices}))
    epl.set_default_strategy(epl.replicate(device_count=1))
  else:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * args.devices)
  rng = np.random.RandomState(0)
  rows = args.batch * (args.steps + 1)
  data = tf.data.Dataset.from_tensor_slices((
      rng.normal(size=(rows, args.width)).astype(np.float32),
      rng.randint(0, 10, size=(rows,)).astype(np.int64))).batch(args.batch)

  def make():
    model = tf.keras.Sequential([
        tf.keras.layers.Dense(args.width, activation="relu"),
        tf.keras.layers.Dense(args.width, activation="relu"),
        tf.keras.layers.Dense(10)])
    return model, tf.keras.optimizers.Adam(1e-3)

  def replica_loss(model, x, y, scale):
    return scale * tf.reduce_mean(
        tf.keras.losses.sparse_categorical_crossentropy(
            y, model(x, training=True), from_logits=True))

  start, start_cpu = time.perf_counter(), time.process_time()
  if args.mode == "mirrored":
    strategy = tf.distribute.MirroredStrategy(devices)
    with strategy.scope():
      model, optimizer = make()

    def replica_step(x, y):
      with tf.GradientTape() as tape:
        loss = replica_loss(model, x, y, 1.0 / args.devices)
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
      return loss

    @tf.function
    def train_step(x, y):
      per_replica = strategy.run(replica_step, args=(x, y))
      return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica,
                             axis=None)
    batches = iter(strategy.experimental_distribute_dataset(data))
  else:
    model, optimizer = make()

    @tf.function
    def train_step(x, y):
      with tf.GradientTape() as tape:
        loss = replica_loss(model, x, y, 1.0)
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
      return loss
    batches = iter(data)
  float(train_step(*next(batches)))
  first = time.perf_counter() - start
  first_cpu = time.process_time() - start_cpu
  start, start_cpu = time.perf_counter(), time.process_time()
  for _ in range(args.steps):
    loss = train_step(*next(batches))
  float(loss)
  print(json.dumps({
      "mode": args.mode, "first_step_s": first,
      "steps_per_s": args.steps / (time.perf_counter() - start),
      "first_step_cpu_s": first_cpu,
      "cpu_ms_per_step": 1e3 * (time.process_time() - start_cpu) / args.steps
  }))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--mode", choices=MODES)
  parser.add_argument("--devices", type=int, default=4)
  parser.add_argument("--batch", type=int, default=512)
  parser.add_argument("--width", type=int, default=512)
  parser.add_argument("--steps", type=int, default=50)
  parser.add_argument("--rounds", type=int, default=2)
  args = parser.parse_args(argv)
  if args.mode:
    _child(args)
    return
  results = {mode: [] for mode in MODES}
  for _ in range(args.rounds):
    for mode in MODES:
      out = subprocess.run(
          [sys.executable, __file__, "--mode", mode] + [
              "--%s=%s" % (k, getattr(args, k))
              for k in ("devices", "batch", "width", "steps")],
          check=True, capture_output=True, text=True, timeout=600).stdout
      results[mode].append(json.loads(out.strip().splitlines()[-1]))
  for mode, runs in results.items():
    print("%-9s first step %s s (CPU %s s)   steps/s %s (CPU ms/step %s)" % (
        mode, " ".join("%.2f" % r["first_step_s"] for r in runs),
        " ".join("%.2f" % r["first_step_cpu_s"] for r in runs),
        " ".join("%.1f" % r["steps_per_s"] for r in runs),
        " ".join("%.1f" % r["cpu_ms_per_step"] for r in runs)))


if __name__ == "__main__":
  main()
