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

from epl.tools import dry_run

logger = logging.getLogger("epl")

_told = set()


def writes_files(env):
  """Whether this process writes event and graph files."""
  cluster = env.cluster
  return not dry_run.enabled() and (not cluster.is_distributed or
                                    cluster.worker_index == 0)


def _tell_once(env, what):
  if what in _told:
    return
  _told.add(what)
  if dry_run.enabled():
    logger.info("%s in a dry run: no event or graph file is written.", what)
  else:
    logger.info("%s on worker %d: only worker 0 writes event and graph "
                "files in a multi-worker job.", what,
                env.cluster.worker_index)


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


def event_file_writer(env, original, logdir, *args, **kwargs):
  """The event writer of a new FileWriter: a real one on worker 0."""
  if writes_files(env):
    return original(logdir, *args, **kwargs)
  _tell_once(env, "FileWriter")
  return DroppedEventWriter(logdir)


def write_graph(env, original, graph_or_graph_def, logdir, name,
                as_text=True):
  """training_util.write_graph: worker 0 writes; the others return the
  path."""
  if writes_files(env):
    return original(graph_or_graph_def, logdir, name, as_text)
  _tell_once(env, "write_graph")
  return os.path.join(logdir, name)
