"""`epl-launch --backend horovod`: a Horovod job started by horovodrun.

    epl-launch --backend horovod --num_workers 2 --gpu_per_worker 2 train.py
    epl-launch --backend horovod --num_workers 8 --gpu_per_worker 4 \\
        --machine_list 10.0.0.1,10.0.0.2 train.sh

Runs `horovodrun -np <num_workers> -H <hosts> --gloo <command>` (from this
Python's Horovod) with `EPL_COMMUNICATION_BACKEND=horovod`, so every process
is one EPL worker. On a machine without GPUs (or with `--cpu`) each process
gets `--gpu_per_worker` logical CPU devices; with GPUs, EPL gives each
process of a machine an equal share of its GPUs by local rank. horovodrun
starts the other machines' processes itself (over ssh), so with
`--machine_list` this runs on the first machine only. horovodrun prefixes
each line with the rank and stops every process when one fails; Ctrl-C or
SIGTERM here stops horovodrun and its processes (by process group).
"""
import os
import shlex
import signal
import subprocess
import sys

from epl.tools import private_network

_PREFIX = "[epl-launch] "


def horovodrun_command(args, command):
  """The horovodrun command line for `args` (epl-launch's) and `command`."""
  if args.num_workers < 1:
    raise ValueError("--num_workers must be at least 1, got %d" %
                     args.num_workers)
  if args.machine_list:
    if args.machine_rank not in (None, 0):
      raise ValueError(
          "--backend horovod: run epl-launch on the first machine of "
          "--machine_list only (without --machine_rank); horovodrun starts "
          "the other machines' processes over ssh.")
    machines = [m.strip().rsplit(":", 1)[0]
                for m in args.machine_list.split(",") if m.strip()]
    if args.num_workers % len(machines):
      raise ValueError("--num_workers %d is not a multiple of the %d "
                       "machines in --machine_list" % (args.num_workers,
                                                       len(machines)))
    per_machine = args.num_workers // len(machines)
    hosts = ",".join("%s:%d" % (m, per_machine) for m in machines)
  else:
    hosts = "localhost:%d" % args.num_workers
  line = [sys.executable, "-m", "horovod.runner.launch", "-np",
          str(args.num_workers), "-H", hosts, "--gloo"]
  if args.log_dir:
    line += ["--output-filename", args.log_dir]
  return line + command


def process_env(args, gpus):
  """The environment horovodrun passes to every process."""
  env = dict(os.environ)
  env.pop("TF_CONFIG", None)
  env["EPL_COMMUNICATION_BACKEND"] = "horovod"
  env["PYTHONUNBUFFERED"] = "1"
  if not gpus:
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["EPL_CLUSTER_NUM_CPU_DEVICES"] = str(args.gpu_per_worker)
  return env


def run(args, command, gpus, exposure=None):
  """Runs horovodrun until it ends; returns its exit status. `exposure`:
  why a one-machine job runs on this machine's network (None: in the
  launcher's private network namespace, or over several machines)."""
  line = horovodrun_command(args, command)
  sys.stdout.write(_PREFIX + "%s; command: %s\n" % (
      "%d GPU(s) per process" % args.gpu_per_worker if gpus else
      "%d logical CPU device(s) per process" % args.gpu_per_worker,
      shlex.join(line)))
  if not args.machine_list:
    sys.stdout.write(_PREFIX + private_network.exposure_text(
        exposure, "horovodrun's rendezvous server (HTTP, a port it picks)",
        "read or rewrite the job's rendezvous, disrupting or joining the "
        "job") + "\n")
  sys.stdout.flush()
  process = subprocess.Popen(  # pylint: disable=consider-using-with
      line, env=process_env(args, gpus), stdin=subprocess.DEVNULL,
      start_new_session=True)

  def stop(signum, _frame):
    try:
      os.killpg(process.pid, signum)
    except ProcessLookupError:
      pass

  previous = {s: signal.signal(s, stop) for s in (signal.SIGINT,
                                                   signal.SIGTERM)}
  try:
    code = process.wait()
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)
    if process.poll() is None:
      os.killpg(process.pid, signal.SIGKILL)
      process.wait()
  return code if code >= 0 else 128 - code
