"""BERT-Large pre-training on one GPU: plain TensorFlow against EPL with
automatic mixed precision (and with gradient checkpointing), examples/s
and MFU, anchored against NVIDIA's published TF2 figure.

Rows, each built, warmed up and timed in a process of its own (so that
each has the whole GPU memory):

  TF                  plain TensorFlow, float32 (TF32 matmuls on Ampere
                      and later)
  EPL AMP             EPL on the one GPU, amp.level O1 (float16, dynamic
                      loss scale)
  EPL AMP + GC        the same with gradient_checkpoint.type "auto"

The model is examples/bert_large (BERT-Large: 24 layers, hidden 1024,
sequence 128, AdamW with warm-up, synthetic input, dropout on).
examples/s = batch / median step time after the warm-up (spread: the
fastest and slowest step). MFU = the one-device step's model FLOPs (static
count of the plain TF graph, epl.parallel.cost.flops) per second over the
GPU's dense half-precision tensor peak (machine.HALF_PEAK_FLOPS), the
peak NVIDIA's MFU is against.

Anchor: NVIDIA's TensorFlow 2 BERT-Large pre-training (DeepLearningExamples),
AMP on one A100-80GB, sequence 128: 485.6 sequences/s, about 40% MFU. "vs
anchor" is examples/s over 485.6 (higher is better; another GPU than an
A100 moves it by its speed), and MFU can be compared directly.

    benchmarks/gpu_check.sh           # the check, about 8 minutes
    EPL_GPU_CHECK_SMOKE=1 benchmarks/gpu_check.sh   # tiny BERT on CPU, seconds
    python benchmarks/gpu_check.py [--batch 32] [--steps 20] [--smoke]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from benchmarks import machine  # noqa: E402  pylint: disable=wrong-import-position
from benchmarks import smoke  # noqa: E402  pylint: disable=wrong-import-position
from benchmarks import verdict  # noqa: E402  pylint: disable=wrong-import-position

ANCHOR_EXAMPLES_PER_S = 485.6
ANCHOR_MFU = 0.40
ANCHOR = ("NVIDIA TF2 BERT-Large pre-training, AMP, 1 x A100-80GB, "
          "sequence 128: 485.6 sequences/s, ~40% MFU")
# Row -> EPL settings (environment; None: plain TF without EPL).
ROWS = {
    "TF": None,
    "EPL AMP": {"EPL_AMP_LEVEL": "O1"},
    "EPL AMP + GC": {"EPL_AMP_LEVEL": "O1",
                     "EPL_GRADIENT_CHECKPOINT_TYPE": "auto"},
}
# --smoke: tiny BERT on CPU, sequence 16, two timed steps.
SMOKE = ["--config", "tiny", "--seq_length", "16", "--batch", "2",
         "--steps", "2", "--warmup", "1", "--vocab_size", "100"]


def _flags(args, parallel):
  from examples.bert_large import train  # pylint: disable=import-outside-toplevel
  return train.make_flags(
      config=args.config, seq_length=args.seq_length, batch_size=args.batch,
      parallel=parallel, vocab_size=args.vocab_size, steps=100000,
      warmup_steps=10, learning_rate=1e-4, seed=1)


def measure(args, row):
  """In the row's own process: build, warm up, time; returns its figures."""
  import tensorflow.compat.v1 as tf  # pylint: disable=import-outside-toplevel
  from examples.bert_large import train  # pylint: disable=import-outside-toplevel
  tf.disable_eager_execution()
  os.environ.update(ROWS[row] or {})
  start = time.perf_counter()
  graph = tf.Graph()
  with graph.as_default():
    handles = train.build_graph(_flags(args, "none" if ROWS[row] is None
                                       else "data"))
    fetches = [handles["train_op"], handles["loss"]]
    step_flops = 0
    if ROWS[row] is None:
      from epl.ir import graph_editor  # pylint: disable=import-outside-toplevel
      from epl.parallel.cost import flops  # pylint: disable=import-outside-toplevel
      step_flops = sum(flops.profile_flops(
          graph, graph_editor.ancestors([f.op if hasattr(f, "op") else f
                                         for f in fetches])).values())
    init = tf.global_variables_initializer()
    config = tf.ConfigProto(allow_soft_placement=True)
    config.gpu_options.allow_growth = True
    with tf.Session(config=config) as session:
      session.run(init)
      for _ in range(args.warmup):
        session.run(fetches)
      built = time.perf_counter() - start
      times, losses = [], []
      for _ in range(args.steps):
        begin = time.perf_counter()
        losses.append(float(session.run(fetches)[1]))
        times.append(time.perf_counter() - begin)
  return {"step_s": times, "step_flops": step_flops, "build_s": built,
          "last_loss": losses[-1]}


def _run_row(args, row):
  command = [sys.executable, os.path.abspath(__file__), "--row", row] + [
      "--%s=%s" % (k, v) for k, v in sorted(vars(args).items())
      if k not in ("row", "smoke")]
  env = dict(os.environ, PYTHONPATH=ROOT,
             TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
  done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True,
                        text=True, timeout=args.row_timeout, check=False)
  lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
  if done.returncode or not lines:
    raise SystemExit("%s failed (exit %d):\n%s" % (
        row, done.returncode, (done.stdout + done.stderr)[-4000:]))
  return json.loads(lines[-1])


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="large")
  parser.add_argument("--seq_length", type=int, default=128)
  parser.add_argument("--batch", type=int, default=32,
                      help="sequences per step (one GPU)")
  parser.add_argument("--vocab_size", type=int, default=0)
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--warmup", type=int, default=5)
  parser.add_argument("--rows", default=",".join(ROWS))
  parser.add_argument("--row_timeout", type=int, default=200,
                      help="seconds a row may take")
  parser.add_argument("--peak_tflops", type=float, default=0.0,
                      help="dense half-precision peak of the GPU, TFLOP/s "
                      "(default: machine.HALF_PEAK_FLOPS by name)")
  parser.add_argument("--row", default=None, help=argparse.SUPPRESS)
  args = smoke.parse_args(parser, argv, SMOKE)
  if args.row:
    print(json.dumps(measure(args, args.row)), flush=True)
    return 0
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  names = machine.gpus()
  peak = machine.half_peak_flops(names[0] if names else "",
                                 args.peak_tflops)
  print("BERT %s, sequence %d, batch %d, %d timed steps after %d warm-up; "
        "%s" % (args.config, args.seq_length, args.batch, args.steps,
                args.warmup, machine.describe(tf.__version__)))
  print("anchor: %s" % ANCHOR)
  print("examples/s and MFU: higher is better; vs = examples/s over the "
        "row's anchor")
  print("%-14s %10s %11s %8s %8s %9s %10s %9s %9s" % (
      "run", "examples/s", "spread ms", "MFU", "vs TF", "", "vs anchor", "",
      "build s"))
  figures = {row: _run_row(args, row) for row in args.rows.split(",")}
  step_flops = next((f["step_flops"] for f in figures.values()
                     if f["step_flops"]), 0)
  rates = {row: args.batch / statistics.median(f["step_s"])
           for row, f in figures.items()}
  for row, figure in figures.items():
    rate = rates[row]
    utilisation = machine.mfu(step_flops, args.batch / rate, peak, 1)
    versus_tf = verdict.ratio(rate, rates.get("TF", 0))
    versus_anchor = rate / ANCHOR_EXAMPLES_PER_S
    print("%-14s %10.1f %11s %8s %7.2fx %9s %9.3fx %9s %9.0f" % (
        row, rate, "%.0f-%.0f" % (1e3 * min(figure["step_s"]),
                                   1e3 * max(figure["step_s"])),
        "%.3f" % utilisation if utilisation is not None else "-",
        versus_tf, verdict.verdict(versus_tf) if row != "TF" else "",
        versus_anchor, verdict.verdict(versus_anchor) if row != "TF" else "",
        figure["build_s"]), flush=True)
  print("model FLOPs per step (static, plain TF graph): %.3g; MFU peak: %s" %
        (step_flops, "%.0f TFLOP/s" % (peak / 1e12) if peak else
         "unknown (no GPU, or not in machine.HALF_PEAK_FLOPS: --peak_tflops)"))
  return 0


if __name__ == "__main__":
  sys.exit(main())
