"""BERT pre-training driver: plain TensorFlow or EPL data / pipeline parallel.

All EPL annotations of the example live in this file (``build_graph``); the
model, optimizer and input code never import epl.  With ``--parallel none``
epl is not imported at all (a plain TF baseline).

Examples::

  # plain TF, tiny model, synthetic data, on CPU
  python examples/bert_large/train.py --config tiny --steps 50

  # 2-stage pipeline x 2 replicas on 4 logical CPU devices
  python examples/bert_large/train.py --config tiny --parallel pipeline_data \\
      --num_stages 2 --num_micro_batch 4 --num_cpu_devices 4

Library use::

  from examples.bert_large import train
  result = train.run(train.make_flags(config="tiny", steps=20))
  result["losses"], result["examples_per_sec"]
"""

from __future__ import absolute_import, division, print_function

import math
import os
import sys
import time
import types

import tensorflow.compat.v1 as tf

try:  # package import (tests, benchmarks)
  from . import input_pipeline
  from . import modeling
  from . import optimization
except ImportError:  # run as a script
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import input_pipeline  # pylint: disable=g-import-not-at-top
  import modeling  # pylint: disable=g-import-not-at-top
  import optimization  # pylint: disable=g-import-not-at-top

PARALLEL_MODES = ("none", "data", "pipeline", "pipeline_data", "auto")
DEFAULT_STAGES = 2
# EPL's pipeline.strategy values (and their aliases 1F1B and GPipe).
SCHEDULES = ("PreferBackward", "PreferForward", "ZeroBubble",
             "PreferBackwardOptimizer", "1F1B", "GPipe")

# Every option of the driver with its default.  0 means "derive it" for
# seq_length, max_predictions_per_seq, num_layers and vocab_size.
DEFAULTS = dict(
    config="tiny",             # tiny | base | large
    steps=100,                 # train until global_step == steps
    batch_size=8,              # micro batch per replica
    seq_length=0,              # 0: 64 for tiny, 128 for base/large
    max_predictions_per_seq=0,  # 0: ceil(0.15 * seq_length)
    learning_rate=1e-4,
    warmup_steps=10,
    weight_decay=0.01,
    clip_norm=0.0,             # > 0: clip gradients by global norm
    input_files="",            # TFRecord files/globs, comma separated; "" = synthetic
    log_every=10,
    model_dir="",              # checkpoints + summaries; "" = none
    save_checkpoints_steps=1000,
    dropout=True,
    parallel="none",           # none | data | pipeline | pipeline_data
    num_stages=0,              # 0: EPL config (pipeline.num_stages), else 2
    num_micro_batch=0,         # 0: EPL config (pipeline.num_micro_batch), else 1
    schedule="",               # "": EPL config (pipeline.strategy); PreferBackward | PreferForward | ZeroBubble
    virtual_stages=0,          # 0: EPL config (pipeline.virtual_stages), else 1
    num_cpu_devices=0,         # > 0: EPL runs on that many logical CPU devices
    seed=12345,
    num_layers=0,              # > 0: override the preset's layer count
    vocab_size=0,              # > 0: override the preset's vocabulary size
    timing_skip_steps=1,       # steps left out of the mean examples/s
)

_FLAG_HELP = dict(
    config="model size preset: tiny, base or large",
    steps="train until the global step reaches this value",
    batch_size="micro-batch size per model replica",
    seq_length="sequence length (0: 64 for tiny, 128 otherwise)",
    max_predictions_per_seq="masked positions per sequence "
                            "(0: ceil(0.15 * seq_length))",
    learning_rate="peak learning rate",
    warmup_steps="linear warm-up steps",
    weight_decay="decoupled weight decay rate",
    clip_norm="clip gradients to this global norm (0: no clipping)",
    input_files="comma separated TFRecord files or globs (empty: synthetic)",
    log_every="print (and save summaries) every K steps",
    model_dir="checkpoint and TensorBoard directory (empty: none)",
    save_checkpoints_steps="checkpoint every N steps (with --model_dir)",
    dropout="dropout on (use --nodropout for deterministic equivalence runs)",
    parallel="none (plain TF), data, pipeline, pipeline_data, or auto (no "
             "annotation: EPL cuts num_stages stages itself)",
    num_stages="pipeline stages (pipeline modes; 0: take pipeline.num_stages "
               "from the EPL config, e.g. EPL_PIPELINE_NUM_STAGES, else 2)",
    num_micro_batch="micro-batches per step (EPL modes; 0: take "
                    "pipeline.num_micro_batch from the EPL config, e.g. "
                    "EPL_PIPELINE_NUM_MICRO_BATCH, default 1)",
    schedule="pipeline schedule: PreferBackward (1F1B), PreferForward "
             "(GPipe) or ZeroBubble (ZB-H1); empty: take pipeline.strategy "
             "from the EPL config",
    virtual_stages="stages per pipeline device, interleaved 1F1B (pipeline "
                   "mode: num_stages stages on num_stages / virtual_stages "
                   "devices; auto: num_stages x virtual_stages stages on "
                   "num_stages devices); 0: take pipeline.virtual_stages "
                   "from the EPL config, default 1",
    num_cpu_devices="number of logical CPU devices for EPL (0: GPUs, or the "
                    "EPL config's cluster.num_cpu_devices)",
    seed="random seed (initialisation and synthetic data)",
    num_layers="override the preset's number of encoder layers (0: keep)",
    vocab_size="override the preset's vocabulary size (0: keep)",
    timing_skip_steps="first steps left out of the mean examples/s",
)


# --------------------------------------------------------------------------
# options


def make_flags(**overrides):
  """A flags object (namespace) with DEFAULTS updated by overrides."""
  unknown = set(overrides) - set(DEFAULTS)
  if unknown:
    raise ValueError("unknown options: %s" % sorted(unknown))
  values = dict(DEFAULTS)
  values.update(overrides)
  return types.SimpleNamespace(**values)


def resolve_flags(flags_like):
  """Namespace, absl FlagValues or dict -> namespace with every option set
  and the derived values (seq_length, max_predictions_per_seq) filled in."""
  if isinstance(flags_like, dict):
    src = dict(flags_like)
  else:
    src = {}
    for name in DEFAULTS:
      try:
        src[name] = getattr(flags_like, name)
      except AttributeError:
        pass
  src = {k: v for k, v in src.items() if k in DEFAULTS}
  f = make_flags(**src)
  if f.config not in ("tiny", "base", "large"):
    raise ValueError("--config must be tiny, base or large, got %r" % f.config)
  if f.parallel not in PARALLEL_MODES:
    raise ValueError("--parallel must be one of %s, got %r"
                     % (PARALLEL_MODES, f.parallel))
  if f.schedule and f.schedule not in SCHEDULES:
    raise ValueError("--schedule must be one of %s (or empty), got %r"
                     % (SCHEDULES, f.schedule))
  for name in ("num_micro_batch", "num_stages", "virtual_stages"):
    if getattr(f, name) < 0:
      raise ValueError("--%s must be >= 0, got %d" % (name, getattr(f, name)))
  if isinstance(f.input_files, (list, tuple)):
    f.input_files = ",".join(f.input_files)
  if not f.seq_length:
    f.seq_length = 64 if f.config == "tiny" else 128
  if not f.max_predictions_per_seq:
    f.max_predictions_per_seq = int(math.ceil(0.15 * f.seq_length))
  if f.parallel == "none":
    f.num_micro_batch = 1
    f.schedule = f.schedule or SCHEDULES[0]
  return f


def bert_config_from_flags(f):
  overrides = {}
  if f.num_layers:
    overrides["num_hidden_layers"] = int(f.num_layers)
  if f.vocab_size:
    overrides["vocab_size"] = int(f.vocab_size)
  config = modeling.BertConfig.from_name(f.config, **overrides)
  if f.seq_length > config.max_position_embeddings:
    raise ValueError("seq_length %d > max_position_embeddings %d"
                     % (f.seq_length, config.max_position_embeddings))
  return config


# --------------------------------------------------------------------------
# pipeline stages


def layers_per_stage(num_layers, num_stages):
  """Encoder layers per stage, as even as possible, extra ones first."""
  if num_stages < 1:
    raise ValueError("num_stages must be >= 1")
  if num_stages > num_layers:
    raise ValueError("cannot split %d encoder layers over %d stages"
                     % (num_layers, num_stages))
  base, extra = divmod(num_layers, num_stages)
  return [base + (1 if s < extra else 0) for s in range(num_stages)]


def layer_stages(num_layers, num_stages):
  """Stage index of every encoder layer."""
  out = []
  for stage, count in enumerate(layers_per_stage(num_layers, num_stages)):
    out.extend([stage] * count)
  return out


def stage_of_part(part, num_layers, num_stages):
  """Stage of a model part: "embeddings" -> 0, ("encoder", i) -> the stage
  of layer i, "heads" -> num_stages - 1."""
  if part == "embeddings":
    return 0
  if part == "heads":
    return num_stages - 1
  if isinstance(part, tuple) and len(part) == 2 and part[0] == "encoder":
    return layer_stages(num_layers, num_stages)[part[1]]
  raise ValueError("unknown model part %r" % (part,))


def make_stage_scope(num_layers, num_stages, scope_for_stage):
  """The model's stage_scope callback: part -> scope_for_stage(stage)."""
  stages = layer_stages(num_layers, num_stages)

  def stage_scope(part):
    if isinstance(part, tuple):
      return scope_for_stage(stages[part[1]])
    return scope_for_stage(stage_of_part(part, num_layers, num_stages))
  return stage_scope


def _staged(f):
  """Whether the mode has pipeline stages (written here, or auto)."""
  return f.parallel.startswith("pipeline") or f.parallel == "auto"


def _total_devices(f):
  """Devices the job trains on (for the replica count in examples/s), from
  the flags, GPUs and TF_CONFIG (build_graph uses EPL's own count)."""
  if f.num_cpu_devices and f.num_cpu_devices > 0:
    return int(f.num_cpu_devices)
  gpus = len(tf.config.list_physical_devices("GPU")) or 1
  workers = 1
  tf_config = os.environ.get("TF_CONFIG")
  if tf_config:
    import json  # pylint: disable=g-import-not-at-top
    try:
      cluster = json.loads(tf_config).get("cluster", {})
      workers = max(1, len(cluster.get("worker", [])) +
                    len(cluster.get("chief", [])))
    except ValueError:
      workers = 1
  return gpus * workers


def num_replicas(f, total_devices=None):
  """Model replicas = devices / devices per replica (1 for --parallel none)."""
  if f.parallel == "none":
    return 1
  if total_devices is None:
    total_devices = _total_devices(f)
  per_replica = 1
  if _staged(f):
    per_replica = f.num_stages or DEFAULT_STAGES
    if f.parallel != "auto":
      # Stage scopes share devices under interleaved 1F1B; auto parallel
      # cuts num_stages x virtual_stages stages onto num_stages devices.
      per_replica //= max(1, f.virtual_stages)
  return max(1, total_devices // per_replica)


def global_batch_size(f, total_devices=None):
  """Examples per training step over all replicas and micro-batches."""
  return (f.batch_size * max(1, f.num_micro_batch) *
          num_replicas(f, total_devices))


# --------------------------------------------------------------------------
# graph


def _epl_config(f):
  """The EPL config dict from the flags; flags left at 0 / "" are not
  passed, so EPL takes them from EPL_* environment variables or defaults."""
  values = {}
  if f.num_micro_batch:
    values["pipeline.num_micro_batch"] = f.num_micro_batch
  if f.schedule:
    values["pipeline.strategy"] = f.schedule
  if f.virtual_stages:
    values["pipeline.virtual_stages"] = f.virtual_stages
  if f.parallel == "auto":
    values["auto.auto_parallel"] = True
  if f.num_stages and _staged(f):
    # EPL checks that the model has this many stage scopes.
    values["pipeline.num_stages"] = f.num_stages
  if f.num_cpu_devices and f.num_cpu_devices > 0:
    values["cluster.num_cpu_devices"] = f.num_cpu_devices
  return values


def _start_epl(f):
  """epl.init from the flags; fills f.num_micro_batch, f.schedule,
  f.virtual_stages and f.num_stages with the values EPL settled on. Returns (epl module, EPL's
  cluster or None)."""
  import epl  # pylint: disable=g-import-not-at-top
  config = epl.Config(_epl_config(f))
  env = epl.init(config)
  pipeline_config = getattr(config, "pipeline", None)
  if pipeline_config is not None:
    f.num_micro_batch = f.num_micro_batch or pipeline_config.num_micro_batch
    f.schedule = f.schedule or pipeline_config.strategy
    f.virtual_stages = f.virtual_stages or pipeline_config.virtual_stages
    if _staged(f) and pipeline_config.num_stages > 0:
      f.num_stages = f.num_stages or pipeline_config.num_stages
  return epl, getattr(env, "cluster", None)


def build_graph(flags_like):
  """Builds the whole training graph into the current default graph.

  For EPL modes this also calls epl.init and places the annotations:
    data:      epl.set_default_strategy(epl.replicate(device_count=1))
    auto:      no annotation; auto.auto_parallel cuts num_stages stages
    pipeline*: input pipeline and embeddings in "stage_0", encoder layers
               split evenly over the stages, heads + loss in the last one;
               each model part enters epl.replicate(device_count=1,
               name="stage_<s>") afresh, so parts of one stage enter a scope
               of the same name several times.
  The loss is added to epl.GraphKeys.GLOBAL_MEAN_OBJECTS.  The optimizer is
  built outside any stage scope.

  Returns a dict: train_op, loss, masked_lm_loss, next_sentence_loss,
  global_step, features, outputs, bert_config, flags, num_replicas,
  global_batch_size, graph.
  """
  f = resolve_flags(flags_like)
  epl, cluster = None, None
  if f.parallel != "none":
    epl, cluster = _start_epl(f)
  total_devices = cluster.total_devices if cluster is not None else None
  # Each worker of a multi-worker job reads its own shard of the input.
  shards = (cluster.worker_num, cluster.worker_index) if cluster is not None \
      else (1, 0)
  f.num_micro_batch = f.num_micro_batch or 1
  f.num_stages = f.num_stages or DEFAULT_STAGES
  tf.set_random_seed(f.seed)
  config = bert_config_from_flags(f)
  pipeline = f.parallel in ("pipeline", "pipeline_data")
  if pipeline:
    # Validates the split before anything is built.
    layers_per_stage(config.num_hidden_layers, f.num_stages)

  def make_features():
    ds = input_pipeline.pretraining_dataset(
        f.input_files, f.batch_size, f.seq_length, f.max_predictions_per_seq,
        vocab_size=config.vocab_size, seed=f.seed, num_shards=shards[0],
        shard_index=shards[1])
    return input_pipeline.get_next(ds)

  stage_scope = None
  if f.parallel == "data":
    epl.set_default_strategy(epl.replicate(device_count=1))
    features = make_features()
  elif pipeline:
    def scope_for_stage(s):
      return epl.replicate(device_count=1, name="stage_%d" % s)
    with scope_for_stage(0):
      features = make_features()
    stage_scope = make_stage_scope(config.num_hidden_layers, f.num_stages,
                                   scope_for_stage)
  else:
    features = make_features()

  outputs = modeling.build_pretraining_model(
      config, features, is_training=bool(f.dropout), stage_scope=stage_scope)
  total_loss = outputs["total_loss"]
  if epl is not None:
    epl.add_to_collection(total_loss, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)

  tf.summary.scalar("loss", total_loss)
  tf.summary.scalar("masked_lm_loss", outputs["masked_lm_loss"])
  tf.summary.scalar("next_sentence_loss", outputs["next_sentence_loss"])

  global_step = tf.train.get_or_create_global_step()
  train_op = optimization.create_optimizer(
      total_loss, f.learning_rate, f.steps, f.warmup_steps,
      weight_decay_rate=f.weight_decay,
      clip_gradients=f.clip_norm > 0, clip_norm=f.clip_norm or 1.0,
      global_step=global_step)

  return dict(train_op=train_op, loss=total_loss,
              masked_lm_loss=outputs["masked_lm_loss"],
              next_sentence_loss=outputs["next_sentence_loss"],
              global_step=global_step, features=features, outputs=outputs,
              bert_config=config, flags=f,
              num_replicas=num_replicas(f, total_devices),
              global_batch_size=global_batch_size(f, total_devices),
              graph=tf.get_default_graph())


# --------------------------------------------------------------------------
# training loop


def _log(msg):
  print("[bert] " + msg, flush=True)


def run(flags_like):
  """Builds the graph in a fresh tf.Graph and trains.

  Prints a line every log_every steps (step, loss, mean loss of the steps
  since the last line, examples/s) and a summary at the end.

  Returns a dict: losses (one per step run; the loss is the mean over
  replicas and micro-batches), examples_per_sec (mean over the steps after
  timing_skip_steps), steps, final_loss, global_batch_size, num_replicas,
  num_micro_batch, step_times, build_seconds, train_seconds.
  """
  graph = tf.Graph()
  with graph.as_default():
    t0 = time.time()
    handles = build_graph(flags_like)
    build_seconds = time.time() - t0
    f = handles["flags"]
    batch = handles["global_batch_size"]
    _log("config=%s layers=%d params=%d parallel=%s stages=%s micro_batches=%d"
         " schedule=%s replicas=%d global_batch=%d seq_length=%d (graph built"
         " in %.1fs)"
         % (f.config, handles["bert_config"].num_hidden_layers,
            modeling.count_parameters(), f.parallel,
            f.num_stages if _staged(f) else "-",
            f.num_micro_batch,
            f.schedule if _staged(f) else "-",
            handles["num_replicas"], batch, f.seq_length, build_seconds))

    model_dir = f.model_dir or None
    hooks = [tf.train.StopAtStepHook(last_step=f.steps)]
    session_kwargs = dict(checkpoint_dir=model_dir, hooks=hooks,
                          log_step_count_steps=f.log_every if model_dir else 0)
    if model_dir:
      session_kwargs.update(save_summaries_steps=f.log_every,
                            save_checkpoint_steps=f.save_checkpoints_steps)
    else:
      session_kwargs.update(save_summaries_steps=None,
                            save_summaries_secs=None,
                            save_checkpoint_secs=None)

    losses, step_times = [], []
    fetches = [handles["train_op"], handles["loss"]]
    global_step = handles["global_step"]
    train_start = time.time()
    with tf.train.MonitoredTrainingSession(**session_kwargs) as sess:
      # Start from the restored global step (raw session: no hooks run).
      step = int(sess.run_step_fn(
          lambda step_context: step_context.session.run(global_step)))
      window_start, window_losses = time.time(), []
      while not sess.should_stop():
        t = time.time()
        _, loss = sess.run(fetches)
        step_times.append(time.time() - t)
        losses.append(float(loss))
        window_losses.append(float(loss))
        step += 1
        if f.log_every and (step % f.log_every == 0 or step == f.steps):
          elapsed = time.time() - window_start
          _log("step %d loss %.4f (mean of %d steps %.4f) examples/s %.1f"
               % (step, loss, len(window_losses),
                  sum(window_losses) / len(window_losses),
                  len(window_losses) * batch / max(elapsed, 1e-9)))
          window_start, window_losses = time.time(), []
    train_seconds = time.time() - train_start

  timed = step_times[f.timing_skip_steps:] or step_times
  examples_per_sec = (len(timed) * batch / sum(timed)) if timed else 0.0
  final_loss = losses[-1] if losses else float("nan")
  if losses:
    k = max(1, min(f.log_every or 10, len(losses) // 2 or 1))
    _log("done: %d steps in %.1fs (graph built in %.1fs); loss %.4f -> %.4f "
         "(mean of first/last %d steps %.4f -> %.4f); mean examples/s %.1f "
         "(global batch %d = %d replica(s) x %d micro-batch(es) x %d)%s"
         % (len(losses), train_seconds, build_seconds, losses[0], final_loss,
            k, sum(losses[:k]) / k, sum(losses[-k:]) / k, examples_per_sec,
            batch, handles["num_replicas"], f.num_micro_batch, f.batch_size,
            "; checkpoints and summaries in %s" % model_dir if model_dir
            else ""))
  else:
    _log("done: no step to run (global step already at %d)" % f.steps)
  return dict(losses=losses, examples_per_sec=examples_per_sec,
              steps=len(losses), final_loss=final_loss,
              global_batch_size=batch, num_replicas=handles["num_replicas"],
              num_micro_batch=f.num_micro_batch, step_times=step_times,
              build_seconds=build_seconds, train_seconds=train_seconds)


# --------------------------------------------------------------------------
# command line


def define_flags():
  from absl import flags  # pylint: disable=g-import-not-at-top
  for name, default in DEFAULTS.items():
    help_text = _FLAG_HELP.get(name, name)
    if name in ("config", "parallel"):
      # (--schedule may be empty, so resolve_flags checks it.)
      choices = {"config": ["tiny", "base", "large"],
                 "parallel": list(PARALLEL_MODES)}[name]
      flags.DEFINE_enum(name, default, choices, help_text)
    elif isinstance(default, bool):
      flags.DEFINE_bool(name, default, help_text)
    elif isinstance(default, int):
      flags.DEFINE_integer(name, default, help_text)
    elif isinstance(default, float):
      flags.DEFINE_float(name, default, help_text)
    else:
      flags.DEFINE_string(name, default, help_text)
  return flags.FLAGS


def main(argv):
  del argv
  from absl import flags  # pylint: disable=g-import-not-at-top
  tf.disable_eager_execution()
  # The driver prints its own progress; keep TensorFlow's INFO lines
  # (session start-up, checkpoint saving) out of it.
  tf.logging.set_verbosity(tf.logging.WARN)
  run(flags.FLAGS)


if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top
  define_flags()
  app.run(main)
