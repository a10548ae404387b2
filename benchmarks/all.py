"""Runs every benchmark and writes docs/benchmarks.md: one command
regenerates every figure the documentation shows.

    python -m benchmarks.all                   # the standard sizes
    python -m benchmarks.all --smoke           # every benchmark, seconds each (CI)
    python -m benchmarks.all --only split_head,moe_throughput
    python -m benchmarks.all --resume run.json # keeps what run.json has done
    make benchmarks                            # both TensorFlow versions

The standard size of each benchmark (`args`) is chosen to say something
about speed and memory on this kind of machine (2 shared cores): real
layer widths, fewer layers or a shorter sequence where needed, at least 5
timed steps after warm-up with their spread, the anchors timed side by
side with EPL; `make benchmarks` (both TensorFlow versions) is sized to
finish in under 45 minutes there, and the page says how long each
benchmark took. The smoke size (`smoke_args`) is for CI only.

Each benchmark of SECTIONS runs as `python benchmarks/<name>.py <args>`
in a process of its own (with `--in_process`, all in this one, which
tests/test_benchmarks.py uses: TensorFlow is imported once). Those marked
`both_versions` run once per `--python` interpreter (the Makefile passes
.venv's, TensorFlow 2.15, and .venv-latest's, 2.21), so that their figures
stand side by side; the others run with the first. The page gets the
date, the machine (cores, memory, GPUs, TensorFlow versions), each exact
command with its output, and the text of SECTIONS around it: what is
measured, what each ratio means and which way is better. A benchmark that
fails is written as failed, with the end of its error output, and the
command exits non-zero; one that needs Horovod where Horovod is not
installed is written as skipped, saying why. On a GPU machine the
benchmarks marked `uses_gpus` (data_parallel: examples/s and MFU) run on
its GPUs; the others are written for logical CPU devices and run with the
GPUs hidden.
"""
import argparse
import collections
import contextlib
import datetime
import importlib
import io
import json
import os
import resource
import shlex
import subprocess
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(ROOT, "benchmarks")
for _path in (ROOT, BENCHMARKS):
  if _path not in sys.path:
    sys.path.insert(0, _path)

from benchmarks import machine  # noqa: E402  pylint: disable=wrong-import-position

Section = collections.namedtuple(
    "Section", "name heading args marker text both_versions needs_horovod "
    "uses_gpus smoke_args")


def _section(name, heading, args, marker, text, both_versions=False,
             needs_horovod=False, uses_gpus=False, smoke_args=("--smoke",)):
  return Section(name, heading, args, marker, text, both_versions,
                 needs_horovod, uses_gpus, list(smoke_args))


# Every benchmark, in the order of the page. `args`: the standard size;
# `smoke_args`: the smoke size; `marker`: a word of the table's header,
# which a run must print.
SECTIONS = (
    _section(
        "data_parallel", "Data parallelism and communication",
        ["--models", "bert_base_2l:16,resnet18:64", "--steps", "15",
         "--warmup", "2", "--rows",
         "TF 1 device;TF MirroredStrategy;EPL DP;EPL DP, one pool"],
        "examples/s", """
The anchors of data parallelism, side by side: the same model, optimizer
and global batch (16 for BERT, 64 for ResNet-18: the model column says)
as plain TensorFlow on one device,
`tf.distribute.MirroredStrategy`, EPL data parallel as configured by
default (on one host's CPUs: local sums and one shared copy of the
weights, updated once per step), EPL with a copy of the weights per
replica (EPL before issue 35), EPL with the collective ring (what runs
across workers), EPL with TensorFlow's one intra-op pool shared by the
logical CPU devices ("EPL DP, one pool": `cluster.cpu_device_threads` 0,
EPL before its per-device pools), EPL over Horovod/Gloo, and Horovod
alone over Gloo. The models have real widths: BERT-Base's (hidden 768,
vocabulary 30522) with 2 layers at sequence 128, and ResNet-18 on 32x32
images. Each local row runs in a process of its own, as its users run
it: plain TF and Mirrored with TensorFlow's defaults, EPL's rows with
what `epl.init` decides for their process (TensorFlow reads some thread
settings once per process, so rows sharing one could not each have
theirs). The rows are built one after another, then all timed in turn,
one step of each a round (each round starting one row later, each step
timed in its row's process), so that load from other jobs hits them
alike; the table "Timed in turn" gives each row's examples/s over plain
TF's in the same round (median over the rounds, and over the quiet
rounds, in which other processes kept under 0.1 cores busy) and its CPU
time a step over plain TF's, and whether EPL DP meets issue 35's goals
(at least 0.95x plain TF's examples/s, 1.0x Mirrored's); **others** is
the cores other processes (not the row processes) kept busy meanwhile
(`host_load`). The standard run times plain TF, Mirrored, EPL DP and EPL
DP with one pool (`--rows`; the per-replica-weights and ring rows run
with the default `--rows`). On logical CPU devices that share the cores,
plain TF on one device is the limit data parallelism can reach at a
fixed global batch. **vs TF 1dev**, **vs Mirrored** and **vs Horovod**
are examples/s over the anchor's: **higher is better**, and the column
beside says whether EPL wins, loses or is level (within 5%); the spread
is the fastest and slowest step; **CPU ms** is the row process's CPU
time a step (median, **lower is better**), which other jobs' load moves
far less than the wall time. The second table splits one traced step of
each row into forward, backward, gradient sums, updates and copies (busy
ms, **lower is better**); the last lines give the row processes' peak
memory. MFU needs a known peak (a GPU of `benchmarks/machine.py`'s table
or `--peak_tflops`); on CPUs it is "-". On a GPU machine the rows use
its GPUs (the Horovod rows stay on CPUs over Gloo).""",
        both_versions=True, uses_gpus=True),
    _section(
        "allreduce", "All-reduce alone: fusion and communicators",
        ["--config", "base", "--steps", "5"], "all-reduces", """
The all-reduce of BERT-Base's gradients (110M floats per replica) alone on
4 logical CPU devices, every configuration timed in turn in one session:
collective ring all-reduce fused into buckets or one per gradient, 1 to 4
communicators, and the local sums EPL uses on one host's CPUs. **vs fused
5, 1 comm** is the reference's step time over the row's: **higher is
better**."""),
    _section(
        "allreduce_overlap", "All-reduce overlapping backward",
        ["--png", os.path.join("docs", "allreduce_overlap.png")], "overlap",
        """
One traced data-parallel step of tiny BERT (4 replicas, ring all-reduce,
2 communicators): how much of the all-reduce time lies before backward
ends (**higher is better**: communication hidden behind computation).

![all-reduce overlapping backward](allreduce_overlap.png)"""),
    _section(
        "horovod_data_parallel", "Horovod",
        ["--models", "resnet18", "--global_batch", "16", "--steps", "5"],
        "vs Horovod", """
EPL's Horovod backend (2 processes x 2 logical devices, and 4 x 1)
against Horovod alone (plain TF + `hvd.DistributedOptimizer`, 4
processes), all over Gloo on this machine, on ResNet-18 (BERT's Horovod
rows are in the data-parallelism table). **vs Horovod** is examples/s
over Horovod alone's: **higher is better**. Horovod 0.28.1 builds against
TensorFlow 2.15 only.""", needs_horovod=True),
    _section(
        "split_head", "Split and MoE",
        ["--feature_dim", "512", "--steps", "5"], "state/dev", """
A 100k-class dense + softmax cross-entropy head on 4 logical CPU devices
(features 512 wide here, to fit a shared machine's memory; the script's
default is 2048): data parallel with local sums, data parallel with the
ring, and split. The ratios are split's figure over DP's for state per
device, bytes device 0 sends per step and step time: **lower is better**
for all three (state: 1/N is the goal)."""),
    _section(
        "moe_throughput", "Mixture of experts", [], "tokens/s", """
Two MoE layers of 8 experts on 4 logical CPU devices: experts split over
the devices (all-to-all) against replicated (data parallel). **tokens/s
split / replicated: higher is better**; expert bytes per device: lower is
better (1/4 is the goal)."""),
    # Six runs of BERT-Base's widths (4 layers) in one process, timed in
    # turn: about 17 GiB peak RSS (measured); data_parallel's BERT rows
    # hold about 14 GiB in their process.
    _section(
        "bert_throughput", "BERT",
        ["--configs", "base", "--base_layers", "4", "--seq_length", "128",
         "--global_batch", "8", "--micro_batch", "2", "--steps", "5",
         "--warmup", "2", "--interleaved"], "examples/s", """
BERT-Base's widths with 4 of its layers (one per pipeline stage),
sequence 128, global batch 8, six ways on the same 4 logical CPU
devices, timed step by step in turn in one process: plain TF on one
device, MirroredStrategy, EPL data parallel (local sums, and the ring), a
4-stage EPL pipeline and 2 stages x 2 replicas. **vs TF 1 dev** and **vs
Mirrored** are examples/s over that run's: **higher is better**, with
whether EPL wins."""),
    _section(
        "bert_rewrite", "BERT rewrite time",
        ["--config", "base", "--num_micro_batch", "4"], "seconds", """
EPL's rewrite of BERT-Base's training graph for 8 replicas x 4
micro-batches, against building the single-device graph: the rewrite
time over the build time (**lower is better**) and the op count."""),
    _section(
        "pipeline_throughput", "Pipeline", ["--micro_batches", "1,2,4,8"],
        "bubble", """
A 2-stage pipeline of dense layers on 2 logical CPU devices, one thread
each, against one device accumulating the same micro-batches: 1F1B/1dev
and GPipe/1dev are the speed-ups (**higher is better**), next to the bound
the pipeline bubble allows. Then the BERT example under GPipe, 1F1B,
interleaved 1F1B and ZB-H1 on 2 devices: measured step time, the
simulator's step time and bubble from each schedule's traced costs
(**lower is better**), and the activations each device holds at its peak
by EPL's estimate. The logical devices share the machine's cores: the
measured times cannot show a pipeline's speed-up."""),
    _section(
        "pipeline_memory", "Pipeline memory", [], "GPipe/1F1B", """
Peak activation memory per stage under GPipe and 1F1B for growing
micro-batch counts: **GPipe/1F1B above 1** is what 1F1B saves."""),
    _section(
        "pipeline_pictures", "Pipeline pictures", [], "wrote", """
Redraws docs/pipeline_gpipe.png, docs/pipeline_1f1b.png,
docs/pipeline_interleaved.png and docs/pipeline_zb_h1.png (one traced step
of the BERT example as a pipeline on 4 devices under each schedule)."""),
    _section(
        "memory_savers", "Memory savers",
        ["--config", "base", "--num_layers", "2", "--batch_size", "4",
         "--timed", "5"], "peak x", """
BERT-Base's widths (2 layers, sequence 128, 4 examples per replica) data
parallel on 4 logical CPU devices with each memory saver
(recomputation, bfloat16 AMP, ZeRO, together) against none: **peak x,
persist x: lower is better**; step x: lower is faster; loss x should stay
1.000 (the savers do not change the arithmetic beyond bfloat16's
rounding). Every row keeps a copy of the weights per replica, the layout
of GPUs and workers the savers are for (on one host's CPUs EPL's default
shares one copy: see the data-parallelism table)."""),
    _section(
        "memory_savers_zero", "ZeRO, offload, grouped apply", [], "peak/dev",
        """
Tiny BERT, 4 data-parallel replicas, each with its copy of the weights
(the layout of GPUs and workers): ZeRO, offload and grouped apply alone
and together against none. Every **(x none)** ratio: **lower is
better** (loss: 1.00 expected).""",
        # Its smoke size trains every saver; one is enough for the check.
        smoke_args=("--smoke", "--runs", "zero v1")),
    _section(
        "zero_mlp", "ZeRO-3 step against ZeRO-2", [
            "--in_turn", "--batch_size", "32", "--steps", "60", "--runs",
            "zero v2,zero v3"],
        "step / v2", """
ZeRO-3 (`zero.level` "v3": weights partitioned too, each gathered before
its use) against ZeRO-2 on the MLP of issue 35: 8 blocks of dense 1024 x
1024, Adam, 4 replicas on 4 logical CPU devices, 32 examples a replica.
Both are built in one process and timed step by step in turn, so that
load from other jobs hits them alike; **step / v2: lower is better**,
the goal is at most 1.15x. "other processes kept ... cores busy" says
how much of the 2 cores other jobs took meanwhile (with about one, a
step takes its CPU time; with none, about half). Peak memory needs a
fresh process a level: `python benchmarks/memory_savers_zero.py --model
mlp --repeats 3` ([zero.md](zero.md#measured-the-mlp-of-8-blocks-of-1024-x-1024)).""",
        both_versions=True, smoke_args=("--smoke", "--in_turn")),
    _section(
        "plan_estimate", "Estimated against measured memory", [], "est/meas",
        """
EPL's memory estimate (what `epl-plan` prints) against each device's
measured peak of a traced step: **est/meas near 1 is better** (within
25% is the target)."""),
    _section(
        "traffic", "Traffic and memory against their formulas",
        [], "measured/formula", """
What each device sends per step by kind (all-reduce, all-gather,
reduce-scatter, all-to-all, pipeline, host, input) and the bytes of
weights, gradients and optimizer state it holds, counted from the
rewritten graph (what `epl-plan` prints), against each layout's formula
(docs/traffic.md): ring all-reduce 2(N-1)/N G, ZeRO's reduce-scatter and
all-gather, the pipeline's boundary, the split and expert collectives
and their adjoints. Nothing runs. **measured/formula: 1.000 is the
formula, above it is traffic to remove**; the goal is at most 1.05 for
traffic and 1.000 for memory. The worst device's ratio is beside it
(local sums root each gradient on one device).""", both_versions=True),
    _section(
        "auto_parallel", "Auto parallel", [], "auto/hand", """
BERT pipelines cut by hand and by auto parallel: **auto/hand is
examples/s over the hand-annotated run's, higher is better**."""),
    _section(
        "startup", "Start-up time",
        ["--runs", "tiny:1x1,tiny:8x1:mirrored,tiny:8x1,tiny:8x1:processes,"
         "tiny:8x4,tiny:8x4:accumulation=copies,tiny:8x4:grappler=off,"
         "large:8x4:build"], "to step 1", """
Time from an empty graph to the end of the first training step, each row
a fresh process: plain TF, MirroredStrategy with 8 replicas, EPL with 8
replicas (and 8 x 4 micro-batches as a loop, the default, as copies, and
without grappler), EPL as 8
processes of one device each (`epl-launch --processes_per_worker 8`: the
slowest process's phases and graph, CPU time and RSS summed over the
processes; on fewer than 8 cores they compete for them, so what stays
flat is each process's graph, not its seconds), and BERT-Large 8 x 4
built and rewritten only. **to step 1 ... x plain** and **x Mirrored:
lower is better**.""", both_versions=True),
    _section(
        "tf2_eager_dp", "TF2 eager loop: EPL against MirroredStrategy",
        ["--steps", "50", "--rounds", "3"], "to step 1", """
The TF2 script as people write it: an eager loop over a `@tf.function`
step (GradientTape, a Keras MLP, Keras Adam), the same script under plain
TF on one device, under `tf.distribute.MirroredStrategy` (its TF2
anchor) and under EPL data parallel (`epl.init` and
`epl.set_default_strategy(epl.replicate(1))` added), over 4 logical CPU
devices, each run a fresh process, rounds alternating. **to step 1: lower
is better; steps/s, examples/s and the ratios: higher is better**.""",
        both_versions=True),
    _section(
        "copies_as_functions", "Copies as function calls", [], "first step",
        """
Plain TF, no EPL: tiny BERT's forward and backward built once as a
`tf.function` and called once per copy, against a copy of every op (the
design EPL did not take). Ratios of seconds and ops: **lower is
better**."""),
)

ANCHORS = """
| Anchor | Section | Ratio (which way is better) |
|---|---|---|
| plain single-device TF | [Data parallelism](#data-parallelism-and-communication), [BERT](#bert) | EPL examples/s over TF 1 device's (higher) |
| `tf.distribute.MirroredStrategy` | [Data parallelism](#data-parallelism-and-communication), [BERT](#bert) | examples/s over Mirrored's (higher) |
| Horovod over Gloo | [Data parallelism](#data-parallelism-and-communication), [Horovod](#horovod) | examples/s over Horovod alone's (higher) |
| EPL data parallel | [Data parallelism](#data-parallelism-and-communication) | rows "EPL DP" (as configured by default), "EPL DP, one pool" (TensorFlow's one intra-op pool), and with the default `--rows` "EPL DP, per-replica wts" and "EPL DP, ring" |
| EPL pipeline | [BERT](#bert), [Pipeline](#pipeline) | examples/s over one device's (higher) |
| EPL split head (100k classes) vs DP | [Split and MoE](#split-and-moe) | split over DP: state, bytes, step time (lower) |
| MoE split vs replicated | [Mixture of experts](#mixture-of-experts) | tokens/s (higher), expert bytes (lower) |
| each memory saver vs none | [Memory savers](#memory-savers), [ZeRO](#zero-offload-grouped-apply) | peak x none (lower) |
| ZeRO-2's step (issue 35's goal for ZeRO-3: at most 1.15x) | [ZeRO-3 step](#zero-3-step-against-zero-2) | v3's step over v2's, timed in turn (lower) |
| time to first step vs MirroredStrategy (8 replicas) and plain TF | [Start-up time](#start-up-time) | to step 1 x plain, x Mirrored (lower) |
| TF2 eager loop under MirroredStrategy and plain TF | [TF2 eager loop](#tf2-eager-loop-epl-against-mirroredstrategy) | steps/s over Mirrored's, plain's (higher); to step 1 (lower) |
| NVIDIA's TF2 BERT-Large pre-training, AMP, one A100-80GB: 485.6 sequences/s at sequence 128, ~40% MFU | `benchmarks/gpu_check.sh` on one GPU (not on this page's CPUs; about 8 minutes) | examples/s over 485.6, and MFU (higher) |
"""


def _python_version(python):
  """TensorFlow version `python` imports (a child process unless it is
  this interpreter)."""
  if python == sys.executable:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return tf.__version__
  found = subprocess.run(
      [python, "-c", "import tensorflow as tf; print(tf.__version__)"],
      capture_output=True, text=True, env=_child_env(), check=False)
  if found.returncode:
    raise SystemExit("%s cannot import TensorFlow:\n%s" % (
        python, found.stderr[-2000:]))
  return found.stdout.strip().splitlines()[-1]


def _has_horovod(python, tf_version):
  if python == sys.executable:
    try:
      import horovod.tensorflow  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
      return False
    return True
  found = subprocess.run(
      [python, "-c", "import horovod.tensorflow"], capture_output=True,
      env=_child_env(tf_version), check=False)
  return found.returncode == 0


def _child_env(tf_version=None, uses_gpus=True):
  """The environment of a benchmark's process on TensorFlow `tf_version`:
  benchmarks written for logical CPU devices (not `uses_gpus`) see no
  GPU."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
  if tf_version is not None:
    major, minor = (int(x) for x in tf_version.split(".")[:2])
    # From 2.16 tf.compat.v1.layers needs Keras 2 (tf-keras); on 2.15 the
    # variable would make tf.keras look for tf-keras, which is not there.
    if (major, minor) >= (2, 16):
      env["TF_USE_LEGACY_KERAS"] = "1"
    else:
      env.pop("TF_USE_LEGACY_KERAS", None)
  if not uses_gpus:
    env["CUDA_VISIBLE_DEVICES"] = ""
  return env


def _command(section, smoke):
  return ["benchmarks/%s.py" % section.name] + (
      section.smoke_args if smoke else section.args)


def _run_child(python, tf_version, section, smoke, timeout):
  """(status, output) of one benchmark in a process of its own."""
  done = subprocess.run([python] + _command(section, smoke), cwd=ROOT,
                        env=_child_env(tf_version, section.uses_gpus),
                        capture_output=True, text=True,
                        timeout=timeout, check=False)
  if done.returncode:
    return "failed", done.stdout + "\n" + done.stderr[-4000:]
  return "ok", done.stdout


def _run_here(section, smoke):
  """(status, output) of one benchmark's main() in this process, its
  environment variables and EPL's state restored afterwards."""
  saved = dict(os.environ)
  output = io.StringIO()
  status = "ok"
  try:
    module = importlib.import_module("benchmarks." + section.name)
    with contextlib.redirect_stdout(output):
      code = module.main(_command(section, smoke)[1:])
    if code:
      status = "failed"
  except (Exception, SystemExit):  # pylint: disable=broad-except
    status = "failed"
    output.write("\n" + traceback.format_exc()[-4000:])
  finally:
    os.environ.clear()
    os.environ.update(saved)
    import epl  # pylint: disable=import-outside-toplevel
    epl.shutdown()
  return status, output.getvalue()


def _cpu_seconds():
  """CPU time of this process and its finished children, all threads."""
  return sum(r.ru_utime + r.ru_stime for r in (
      resource.getrusage(resource.RUSAGE_SELF),
      resource.getrusage(resource.RUSAGE_CHILDREN)))


def run_sections(sections, pythons, smoke, in_process, timeout,
                 done=(), save=lambda results: None):
  """[{name, python, tf, status, seconds, cpu_seconds, load, command,
  output}] of every section on its interpreters. Results of `done` (an
  earlier run's) that succeeded are kept, not run again; `save` gets the
  results after each benchmark, so that a run cut short can resume."""
  versions = {python: _python_version(python) for python in pythons}
  horovod = {python: _has_horovod(python, versions[python])
             for python in pythons}
  kept = {(r["name"], r["tf"]): r for r in done
          if r["status"] in ("ok", "skipped")}
  selected = {s.name for s in sections}
  # An earlier run's results of other benchmarks stay in what is saved.
  others = [r for r in done if r["name"] not in selected]
  results = []
  for section in sections:
    for python in pythons if section.both_versions else pythons[:1]:
      if (section.name, versions[python]) in kept:
        results.append(kept[section.name, versions[python]])
        continue
      result = {"name": section.name, "python": python,
                "tf": versions[python], "load": os.getloadavg()[0],
                # Quoted as a shell needs it (data_parallel's --rows).
                "command": "python " + shlex.join(_command(section, smoke))}
      start, cpu_start = time.perf_counter(), _cpu_seconds()
      if section.needs_horovod and not horovod[python]:
        result["status"], result["output"] = "skipped", (
            "Horovod does not import with TensorFlow %s here (`make "
            "horovod` builds it for TensorFlow 2.15; Horovod 0.28.1 does "
            "not build against later versions)." % versions[python])
      elif in_process:
        result["status"], result["output"] = _run_here(section, smoke)
      else:
        result["status"], result["output"] = _run_child(
            python, versions[python], section, smoke, timeout)
      result["seconds"] = time.perf_counter() - start
      result["cpu_seconds"] = _cpu_seconds() - cpu_start
      print("%-22s TF %-8s %-7s %6.0f s, CPU %6.0f s" % (
          section.name, result["tf"], result["status"], result["seconds"],
          result["cpu_seconds"]), flush=True)
      results.append(result)
      save(others + results)
  return results


def _machine_line(results):
  versions = sorted({r["tf"] for r in results})
  return machine.describe(" and ".join(versions))


def page(sections, results, smoke, load):
  """docs/benchmarks.md's text; `load`: the load average (1 minute) at
  the end of the run (each result has the one at its start)."""
  seconds = sum(r["seconds"] for r in results)
  starts = [r["load"] for r in results if "load" in r] or [load]
  lines = ["# Benchmarks", ""]
  if smoke:
    lines += ["**SMOKE SIZE: these outputs come from `python -m "
              "benchmarks.all --smoke`, every benchmark at its smallest "
              "size (seconds); they show that each runs and what it "
              "prints, and say nothing about speed or memory.**", ""]
  else:
    lines += ["Every benchmark at its standard size: real layer widths "
              "(fewer layers or a shorter sequence where needed), at least "
              "5 timed steps after warm-up with their spread, anchors "
              "timed beside EPL.", ""]
  lines += [
      "Generated by `python -m benchmarks.all%s` (`make benchmarks` runs "
      "it on both TensorFlow versions); do not edit by hand, run it again."
      % (" --smoke" if smoke else ""), "",
      "- date: %s" % datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
      "- machine: %s" % _machine_line(results),
      "- whole run: %.0f minutes (the benchmarks' times summed; a run "
      "finished with --resume adds up its parts); load average %.1f to "
      "%.1f at the benchmarks' starts (each section says its own) on %d "
      "cores: above the core count, other jobs shared the machine, and "
      "step times move between runs (by 10-50%% on 2 shared cores): "
      "compare the rows of one table, which ran together, more than "
      "tables." % (seconds / 60.0, min(starts), max(starts),
                   os.cpu_count()),
      "",
      "Logical CPU devices (`cluster.num_cpu_devices`) are devices of one "
      "process that share the machine's cores: on a CPU machine a ratio "
      "compares two ways of splitting the same work, not a speed-up over "
      "one device. Each table says which way its ratios are better; where "
      "EPL loses against an anchor, its row says \"EPL loses\". The "
      "original EPL's published GPU results (BERT-Large pipeline +57% "
      "over Horovod data parallel at 64 GPUs; a 100k-class split head "
      "14.8x faster than Horovod DP) need GPUs: the same command on a GPU "
      "machine uses its GPUs and reports MFU.", "",
      "## Anchors", "", ANCHORS.strip(), ""]
  by_name = collections.defaultdict(list)
  for result in results:
    by_name[result["name"]].append(result)
  for section in sections:
    lines += ["## %s" % section.heading, "", section.text.strip(), ""]
    for result in by_name[section.name]:
      load = result.get("load")
      lines += ["`%s` (TensorFlow %s, %.0f s%s): %s" % (
          result["command"], result["tf"], result["seconds"],
          "" if load is None else ", load average %.1f at its start" % load,
          result["status"]), "", "```", result["output"].rstrip(), "```",
                ""]
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--smoke", action="store_true",
                      help="every benchmark at its --smoke size")
  parser.add_argument("--only", default="",
                      help="comma-separated benchmark names (default: all)")
  parser.add_argument("--python", action="append", default=[],
                      help="an interpreter to run the both-version "
                      "benchmarks with (repeat; default: this one); the "
                      "first runs the others")
  parser.add_argument("--in_process", action="store_true",
                      help="run every benchmark in this process (only this "
                      "interpreter, on CPUs)")
  parser.add_argument("--out", default=os.path.join(ROOT, "docs",
                                                    "benchmarks.md"))
  parser.add_argument("--json", default="",
                      help="also write the results as JSON here")
  parser.add_argument("--resume", default="",
                      help="a --json file of an earlier run (cut short, or "
                      "with failures): its successful results are kept and "
                      "the rest run; implies --json to the same file")
  parser.add_argument("--timeout", type=int, default=4 * 3600,
                      help="seconds per benchmark")
  args = parser.parse_args(argv)
  pythons = args.python or [sys.executable]
  if args.in_process:
    if pythons != [sys.executable]:
      raise SystemExit("--in_process runs this interpreter only; leave out "
                       "--python")
    # One TensorFlow for every benchmark: the logical CPU devices' one,
    # with the allocator whose statistics plan_estimate reads (it sets
    # this itself when it starts TensorFlow).
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
  names = [n for n in args.only.split(",") if n]
  unknown = set(names) - {s.name for s in SECTIONS}
  if unknown:
    raise SystemExit("--only: unknown benchmarks %s (known: %s)" % (
        sorted(unknown), ", ".join(s.name for s in SECTIONS)))
  sections = [s for s in SECTIONS if not names or s.name in names]
  done = []
  if args.resume:
    args.json = args.resume
    if os.path.exists(args.resume):
      with open(args.resume) as f:
        done = json.load(f)

  def save(results):
    if args.json:
      with open(args.json, "w") as out:
        json.dump(results, out, indent=1)
  results = run_sections(sections, pythons, args.smoke, args.in_process,
                         args.timeout, done, save)
  with open(args.out, "w") as out:
    out.write(page(sections, results, args.smoke, os.getloadavg()[0]))
  print("wrote %s" % args.out)
  failed = [r["name"] for r in results if r["status"] == "failed"]
  if failed:
    print("failed: %s" % ", ".join(failed))
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
