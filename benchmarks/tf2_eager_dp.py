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

    python benchmarks/tf2_eager_dp.py [--steps 50] [--smoke]
"""
import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

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


def _table(args, results):
  """One row per mode: medians over the rounds (with their range),
  examples/s, and EPL's ratios against plain TF and MirroredStrategy."""
  import statistics  # pylint: disable=import-outside-toplevel
  from benchmarks import verdict  # pylint: disable=import-outside-toplevel
  median = {mode: {key: statistics.median(r[key] for r in runs)
                   for key in ("first_step_s", "steps_per_s",
                               "cpu_ms_per_step")}
            for mode, runs in results.items()}
  lines = ["MLP %d-%d-10, Keras Adam, global batch %d, %d logical CPU "
           "devices, %d timed steps after the first, %d rounds (each mode "
           "a fresh process per round; medians, range in brackets; CPU "
           "ms/step: the process's CPU time, all threads)" % (
               args.width, args.width, args.batch, args.devices, args.steps,
               args.rounds),
           "%-30s %22s %22s %11s %11s %9s %9s  %s" % (
               "run", "to step 1 (s)", "steps/s", "CPU ms/step", "examples/s",
               "vs plain", "vs Mirr.", "EPL against Mirrored")]
  names = {"plain": "TF 1 device", "mirrored": "TF MirroredStrategy",
           "epl": "EPL DP, %d replicas" % args.devices}
  for mode in ("plain", "mirrored", "epl"):
    runs, row = results[mode], median[mode]
    spans = ["%.2f [%.2f-%.2f]" % (row[key], min(r[key] for r in runs),
                                   max(r[key] for r in runs))
             for key in ("first_step_s", "steps_per_s")]
    speed = row["steps_per_s"]
    against = verdict.ratio(speed, median["mirrored"]["steps_per_s"])
    lines.append("%-30s %22s %22s %11.1f %11.1f %8.2fx %8.2fx  %s" % (
        names[mode], spans[0], spans[1], row["cpu_ms_per_step"],
        speed * args.batch,
        verdict.ratio(speed, median["plain"]["steps_per_s"]), against,
        verdict.verdict(against) if mode == "epl" else "-"))
  first = verdict.ratio(median["epl"]["first_step_s"],
                        median["mirrored"]["first_step_s"])
  lines.append("EPL's time to step 1 is %.2fx Mirrored's (lower is better: "
               "%s)" % (first, verdict.verdict(first, higher_is_better=False)))
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--mode", choices=MODES)
  parser.add_argument("--devices", type=int, default=4)
  parser.add_argument("--batch", type=int, default=512)
  parser.add_argument("--width", type=int, default=512)
  parser.add_argument("--steps", type=int, default=50)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--smoke", action="store_true",
                      help="2 steps of a 32-wide MLP, one round (seconds)")
  args = parser.parse_args(argv)
  if args.smoke:
    args.batch, args.width, args.steps, args.rounds = 32, 32, 2, 1
  if args.mode:
    _child(args)
    return
  results = {mode: [] for mode in MODES}
  for _ in range(args.rounds):
    for mode in MODES:
      out = subprocess.run(
          [sys.executable, os.path.abspath(__file__), "--mode", mode] + [
              "--%s=%s" % (k, getattr(args, k))
              for k in ("devices", "batch", "width", "steps")],
          check=True, capture_output=True, text=True, timeout=600,
          env=dict(os.environ, PYTHONPATH=ROOT)).stdout
      results[mode].append(json.loads(out.strip().splitlines()[-1]))
  print(_table(args, results))


if __name__ == "__main__":
  main()
