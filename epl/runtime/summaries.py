"""Event and graph files in a multi-worker job: worker 0 alone writes them.

Every worker of a job runs the same script, and TensorFlow makes every one
of them a writer: `MonitoredTrainingSession` (each worker is its own
chief under EPL) adds summary, step-counter and checkpoint hooks that write
events and `graph.pbtxt`, and the Estimator writes its evaluation results
as events. The workers train the same model in step, so their events
would repeat worker 0's; on a shared file system they would also race for
the same directory.

A dry run (`epl-plan`, EPL_DRY_RUN=1) writes no file either: the hooks'
writers are made before the graph is finalized and EPL prints the plan,
so without this the script's checkpoint_dir would get an events file from
a run that ran nothing.

On workers other than 0, and in a dry run:
- `tf.compat.v1.summary.FileWriter` (and so `FileWriterCache`, the
  hooks' and the Estimator's writers) gets an event writer that drops
  events and creates no file or directory;
- `training_util.write_graph` (CheckpointSaverHook's `graph.pbtxt`)
  returns the path it would write, without writing.
"""
import logging
import os

logger = logging.getLogger("epl")

_told = set()


def _why_not_written(env, dry_run):
  """Why this process writes no event or graph file (`dry_run`: whether it
  is a dry run), or None when it writes them."""
  if dry_run:
    return "in a dry run: no event or graph file is written"
  cluster = env.cluster
  if cluster.is_distributed and cluster.worker_index != 0:
    return ("on worker %d: only worker 0 writes event and graph files in a "
            "multi-worker job" % cluster.worker_index)
  return None


def _tell_once(what, why):
  if what not in _told:
    _told.add(what)
    logger.info("%s %s.", what, why)


class DroppedEventWriter:
  """An EventFileWriter that writes nothing (for workers other than 0)."""

  def __init__(self, logdir):
    self._logdir = logdir

  def get_logdir(self):
    return self._logdir

  def add_event(self, event):
    del event

  def flush(self):
    pass

  def close(self):
    pass

  def reopen(self):
    pass


def event_file_writer(env, dry_run, original, logdir, *args, **kwargs):
  """The event writer of a new FileWriter: a real one on worker 0 outside
  a dry run."""
  why = _why_not_written(env, dry_run)
  if why is None:
    return original(logdir, *args, **kwargs)
  _tell_once("FileWriter", why)
  return DroppedEventWriter(logdir)


def write_graph(env, dry_run, original, graph_or_graph_def, logdir, name,
                as_text=True):
  """training_util.write_graph: worker 0 writes outside a dry run; otherwise
  it returns the path."""
  why = _why_not_written(env, dry_run)
  if why is None:
    return original(graph_or_graph_def, logdir, name, as_text)
  _tell_once("write_graph", why)
  return os.path.join(logdir, name)
