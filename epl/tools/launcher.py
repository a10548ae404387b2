"""`epl-launch`: start the workers of a multi-worker EPL job.

    epl-launch --num_workers 2 --gpu_per_worker 1 train.sh
    epl-launch --num_workers 2 --gpu_per_worker 2 train.py --steps 100
    epl-launch --num_workers 4 --gpu_per_worker 8 \\
        --machine_list 10.0.0.1,10.0.0.2 --machine_rank 0 train.sh
    epl-launch --num_workers 1 --gpu_per_worker 8 --processes_per_worker 8 \\
        train.py

Starts this machine's workers, each with `TF_CONFIG` (one `worker` job,
worker 0 first) and its devices: `--gpu_per_worker` GPUs through
`CUDA_VISIBLE_DEVICES` or, on a machine without GPUs (or with `--cpu`),
that many logical CPU devices through `EPL_CLUSTER_NUM_CPU_DEVICES`. A
command ending in `.sh` runs with bash, one ending in `.py` with this
Python, anything else as it is (`epl-launch ... -- python -m pkg.train`).

Each line a worker prints comes out prefixed with `[worker i]` (and goes to
`<log_dir>/worker_<i>.log` with `--log_dir`). When a worker fails, the
others get `--grace_period` seconds to finish or fail on their own (EPL
workers stop within `cluster.collective_timeout_seconds` of losing a peer),
then they are stopped; Ctrl-C or SIGTERM stops them all at once. Workers are
stopped by process group (each runs in its own), by pid. The exit status is
0 when every worker succeeded, else the first failed worker's status.

`--debug` (the original's flag) runs worker 0 in the foreground: it reads
this terminal (for pdb) and writes to it unprefixed. `--task_label LABEL`
(also the original's) writes the workers' output under
`experiments/<date>_<W>w<G>g_<script>_<LABEL>/` when `--log_dir` is not
given.

`--processes_per_worker N` runs each worker as N processes, each owning
`gpu_per_worker / N` of its devices (N must divide `--gpu_per_worker`):
TF_CONFIG then lists num_workers x N tasks, task w * N + p being process p
of worker w, and every process is an EPL worker of its own (output prefixed
`[worker <task>]`, EPL's `worker_index`). Each process builds only its own
replicas and joins the others through EPL's multi-worker path (collectives
over gRPC, NCCL on GPUs), so for data parallelism each process's graph and
time to its first step do not grow with the number of devices. A pipeline
replica or split group that needs more devices than one process owns spans
processes: a pipeline then runs in-graph from the process holding its first
stage (activations and gradients cross processes through gRPC, the others
only serve their devices), a split group's collectives go between
processes; ZeRO partitions within a process only. The launcher says so when
it starts (docs/multi_worker.md).

`--backend horovod` runs the job with horovodrun instead
(`epl.tools.horovod_launch`).

Network (docs/security.md). TensorFlow's gRPC servers listen on every
interface and run any graph a client sends, without authentication. A
one-machine job (no `--machine_list`) therefore runs in a private network
namespace of its own (`epl.tools.private_network`): the launcher re-runs
itself inside one, with the same pid, before it starts anything, so every
process of the job (horovodrun's too) shares a loopback that nothing
outside the job reaches. `--network host` (for a job that reads data over
the network), or a machine where no such namespace can be made, runs the
job on this machine's network instead, with a warning naming the ports.
`--host` of a one-machine job must be an IPv4 loopback address.
"""
import argparse
import datetime
import ipaddress
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from epl.runtime import network_namespace
from epl.tools import horovod_launch
from epl.tools import private_network
from epl.tools import shadowing

_PREFIX = "[epl-launch] "


def _parser():
  parser = argparse.ArgumentParser(
      prog="epl-launch",
      description="Start the workers of a multi-worker EPL job (TF_CONFIG, "
                  "devices, prefixed output, stop all when one fails).")
  parser.add_argument("--num_workers", type=int, required=True,
                      help="workers of the whole job (over all machines)")
  parser.add_argument("--gpu_per_worker", type=int, default=1,
                      help="GPUs per worker; logical CPU devices per worker "
                           "on a machine without GPUs (default 1)")
  parser.add_argument("--processes_per_worker", type=int, default=1,
                      help="processes per worker, each owning gpu_per_worker "
                           "/ N of its devices and building only its own "
                           "replicas (one process per device with N = "
                           "gpu_per_worker); TF_CONFIG lists num_workers x N "
                           "tasks (default 1)")
  parser.add_argument("--base_port", type=int, default=None,
                      help="process i of a machine listens on base_port + i "
                           "(default: free ports on one machine, 23456 with "
                           "--machine_list)")
  parser.add_argument("--host", default="127.0.0.1",
                      help="loopback address the workers of a one-machine "
                           "job reach each other on (default 127.0.0.1)")
  parser.add_argument("--network", choices=("private", "host"),
                      default=None,
                      help="private (default on one machine): the job runs "
                           "in a network namespace of its own, which no "
                           "other host or process reaches, and reaches no "
                           "other host; host (always with --machine_list): "
                           "this machine's network, the workers' ports open "
                           "to every host that reaches it (docs/security.md)")
  parser.add_argument("--in_private_network", action="store_true",
                      help=argparse.SUPPRESS)
  _add_machine_and_output_arguments(parser)
  return parser


def _add_machine_and_output_arguments(parser):
  """epl-launch's arguments for several machines, the workers' output, and
  how they run."""
  parser.add_argument("--machine_list", default=None,
                      help="comma-separated machines of a multi-machine job, "
                           "each 'host' or 'host:base_port'; every machine "
                           "runs num_workers / len(machine_list) workers")
  parser.add_argument("--machine_rank", type=int, default=None,
                      help="this machine's position in --machine_list")
  parser.add_argument("--log_dir", default=None,
                      help="also write worker i's output to "
                           "LOG_DIR/worker_<i>.log")
  parser.add_argument("--task_label", default=None,
                      help="label of the job: without --log_dir, output "
                           "goes to experiments/<date>_<W>w<G>g_<script>_"
                           "<label>/worker_<i>.log")
  parser.add_argument("--debug", default=False, type=_flag,
                      help="True: run worker 0 in the foreground, on this "
                           "terminal (for pdb): --debug=True, as the "
                           "original EPL's launcher took it")
  parser.add_argument("--cpu", action="store_true",
                      help="use logical CPU devices even if GPUs exist")
  parser.add_argument("--grace_period", type=float, default=5.0,
                      help="seconds the other workers get to finish after "
                           "one fails, before they are stopped (default 5)")
  parser.add_argument("--backend", choices=("collective", "horovod"),
                      default="collective",
                      help="collective (default): one process per worker "
                           "with TF_CONFIG; horovod: run horovodrun, each "
                           "process one worker (see "
                           "epl/tools/horovod_launch.py)")
  parser.add_argument("command", nargs=argparse.REMAINDER,
                      help="script.sh, script.py or a command, with its "
                           "arguments")


def _flag(value):
  """A boolean flag's value: true/false, yes/no, 1/0 (any case)."""
  text = str(value).strip().lower()
  if text in ("true", "yes", "1"):
    return True
  if text in ("false", "no", "0"):
    return False
  raise argparse.ArgumentTypeError("expected True or False, got %r" % value)


def log_dir(args):
  """Where the workers' output is written: --log_dir, else with
  --task_label the original's experiments/ directory, else None."""
  if args.log_dir or not args.task_label:
    return args.log_dir
  script = os.path.basename(args.command[-1] if args.command else "job")
  return os.path.join("experiments", "%s_%dw%dg_%s_%s" % (
      datetime.date.today(), args.num_workers, args.gpu_per_worker,
      os.path.splitext(script)[0], args.task_label))


def _log(message):
  sys.stdout.write(_PREFIX + message + "\n")
  sys.stdout.flush()


def _free_ports(host, count):
  sockets, ports = [], []
  try:
    for _ in range(count):
      sock = socket.socket()
      sock.bind((host, 0))
      sockets.append(sock)
      ports.append(sock.getsockname()[1])
  finally:
    for sock in sockets:
      sock.close()
  return ports


def devices_per_process(args):
  """GPUs (or logical CPU devices) each process owns: gpu_per_worker /
  processes_per_worker."""
  processes = args.processes_per_worker
  if processes < 1:
    raise ValueError("--processes_per_worker must be at least 1, got %d" %
                     processes)
  if args.gpu_per_worker % processes:
    raise ValueError(
        "--gpu_per_worker %d is not a multiple of --processes_per_worker %d: "
        "each process owns gpu_per_worker / processes_per_worker devices "
        "(--processes_per_worker %d gives one process per device)" % (
            args.gpu_per_worker, processes, args.gpu_per_worker))
  return args.gpu_per_worker // processes


def worker_addresses(args):
  """(every process's host:port in TF_CONFIG order, indices of the
  processes of this machine): num_workers x processes_per_worker tasks,
  process p of worker w being task w * processes_per_worker + p."""
  if args.num_workers < 1:
    raise ValueError("--num_workers must be at least 1, got %d" %
                     args.num_workers)
  devices_per_process(args)
  tasks = args.num_workers * args.processes_per_worker
  if not args.machine_list:
    if args.machine_rank not in (None, 0):
      raise ValueError("--machine_rank needs --machine_list")
    check_host(args.host)
    if args.base_port is None:
      ports = _free_ports(args.host, tasks)
    else:
      ports = [args.base_port + i for i in range(tasks)]
    return ["%s:%d" % (args.host, p) for p in ports], list(range(tasks))
  machines = [m.strip() for m in args.machine_list.split(",") if m.strip()]
  if args.machine_rank is None or not 0 <= args.machine_rank < len(machines):
    raise ValueError("--machine_rank must be in [0, %d) for a --machine_list "
                     "of %d machine(s)" % (len(machines), len(machines)))
  if args.num_workers % len(machines):
    raise ValueError("--num_workers %d is not a multiple of the %d machines "
                     "in --machine_list" % (args.num_workers, len(machines)))
  per_machine = tasks // len(machines)
  addresses, entries = [], {}
  for entry, machine in enumerate(machines):
    host, base = _machine(machine, args.base_port)
    for i in range(per_machine):
      address = "%s:%d" % (host, base + i)
      if address in entries:
        raise ValueError(
            "--machine_list names %s twice (%r and %r): both would run a "
            "worker listening on %s. Name each machine once, or give the "
            "second its own ports ('%s:<base_port>' at least %d apart)." % (
                host, machines[entries[address]], machine, address, host,
                per_machine))
      entries[address] = entry
      addresses.append(address)
  first = args.machine_rank * per_machine
  return addresses, list(range(first, first + per_machine))


def _machine(machine, base_port):
  """(host, base port) of a --machine_list entry 'host' or 'host:port'."""
  host, _, port = machine.rpartition(":") if ":" in machine else (
      machine, "", "")
  if not port:
    return machine, base_port or 23456
  if not port.isdigit() or not 0 < int(port) < 65536 or not host:
    raise ValueError("--machine_list entry %r is not 'host' or "
                     "'host:base_port' (a port in 1-65535)" % machine)
  return host, int(port)


def check_host(host):
  """--host of a one-machine job must be an IPv4 loopback address (TF_CONFIG
  writes it host:port)."""
  if host == "localhost":
    return
  try:
    if ipaddress.IPv4Address(host).is_loopback:
      return
  except ValueError:
    pass
  raise ValueError(
      "--host %s: the workers of a one-machine job reach each other over "
      "loopback (127.0.0.1, the default); any other address would only "
      "help other hosts reach their gRPC servers, which accept connections "
      "without authentication and run the graphs they are sent "
      "(docs/security.md). For a job over several machines give "
      "--machine_list." % host)


def network(args):
  """Where the job's processes run: 'private' (a network namespace of
  their own) or 'host' (this machine's network)."""
  if not args.machine_list:
    return args.network or "private"
  if args.network == "private":
    raise ValueError(
        "--network private is for a one-machine job: the workers on the "
        "other machines of --machine_list could not reach a private "
        "network namespace on this one")
  return "host"


def gpu_count():
  """GPUs on this machine (nvidia-smi), 0 without a driver."""
  smi = shutil.which("nvidia-smi")
  if not smi:
    return 0
  try:
    out = subprocess.run([smi, "-L"], capture_output=True, text=True,
                         timeout=30, check=False).stdout
  except (OSError, subprocess.SubprocessError):
    return 0
  return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def command_line(command):
  if not command:
    raise ValueError("give the script or command to run")
  if command[0] == "--":
    command = command[1:]
  if command and command[0].endswith(".sh"):
    return ["bash"] + command
  if command and command[0].endswith(".py"):
    _refuse_shadowed_epl(os.path.dirname(os.path.abspath(command[0])),
                         command)
    return [sys.executable] + command
  if not command:
    raise ValueError("give the script or command to run")
  if "-m" in command:
    _refuse_shadowed_epl(os.getcwd(), command)
  return command


def _refuse_shadowed_epl(directory, command):
  """Raises ValueError when the workers' Python, with `directory` first on
  its path, would import something else as `epl`
  (`epl.tools.shadowing`)."""
  path = shadowing.shadowing_path(directory)
  if path is not None:
    raise ValueError(shadowing.error(path, "epl-launch " +
                                     shlex.join(command)))


def worker_env(addresses, index, local, args, gpus):
  """The environment of task `index`, the `local`-th process of this
  machine: TF_CONFIG and its share of the devices."""
  env = dict(os.environ)
  env["TF_CONFIG"] = json.dumps({
      "cluster": {"worker": addresses},
      "task": {"type": "worker", "index": index}})
  env["PYTHONUNBUFFERED"] = "1"
  devices = devices_per_process(args)
  if gpus:
    env["CUDA_VISIBLE_DEVICES"] = ",".join(
        str(local * devices + i) for i in range(devices))
  else:
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["EPL_CLUSTER_NUM_CPU_DEVICES"] = str(devices)
  return env


class _Worker:
  """One worker process, in its own process group, and its output pump;
  or, in the foreground, on this terminal (--debug)."""

  def __init__(self, index, command, env, directory, lock, foreground=False):
    self.index = index
    self._foreground = foreground
    self._log = None
    self._pump = None
    if foreground:
      self.process = subprocess.Popen(  # pylint: disable=consider-using-with
          command, env=env)
      return
    log_path = (os.path.join(directory, "worker_%d.log" % index)
                if directory else None)
    self._log = open(log_path, "ab") if log_path else None  # pylint: disable=consider-using-with
    self.process = subprocess.Popen(  # pylint: disable=consider-using-with
        command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True)
    self._lock = lock
    self._pump = threading.Thread(target=self._copy_output, daemon=True)
    self._pump.start()

  def _copy_output(self):
    prefix = ("[worker %d] " % self.index).encode()
    out = sys.stdout.buffer
    for line in iter(self.process.stdout.readline, b""):
      if self._log is not None:
        self._log.write(line)
        self._log.flush()
      with self._lock:
        out.write(prefix + line if line.endswith(b"\n") else
                  prefix + line + b"\n")
        out.flush()

  def signal(self, signum):
    if self.process.poll() is None:
      try:
        if self._foreground:
          self.process.send_signal(signum)
        else:
          os.killpg(self.process.pid, signum)
      except ProcessLookupError:
        pass

  def finish(self):
    if self._pump is not None:
      self._pump.join(timeout=5)
    if self._log is not None:
      self._log.close()


def _processes_text(args, local_processes, devices, kind):
  """What the launcher says when it starts a worker as several processes:
  the layout, and what it means for pipelines, split and ZeRO."""
  processes = args.processes_per_worker
  return (
      "%d worker(s) x %d processes on this machine, %d %s(s) per process "
      "(%s): %d EPL workers in TF_CONFIG, each building only its own "
      "replicas.\n"
      "%sWARNING --processes_per_worker %d: a pipeline replica or split "
      "group needing more than %d device(s) spans processes. Such a pipeline "
      "replica is built and run in-graph by the process of its first stage "
      "(no start-up gain; the processes of its other stages only serve "
      "their devices; activations and gradients cross processes through "
      "gRPC); a split group's collectives run between processes (gRPC, "
      "NCCL on GPUs); ZeRO partitions only within a process (nothing with "
      "one device per process). Keep a replica's stages and each split "
      "group within %d device(s) per process, or lower "
      "--processes_per_worker (docs/multi_worker.md)." % (
          local_processes // processes, processes, devices, kind,
          "CUDA_VISIBLE_DEVICES" if kind == "GPU" else
          "CUDA_VISIBLE_DEVICES='', EPL_CLUSTER_NUM_CPU_DEVICES=%d" % devices,
          args.num_workers * processes, _PREFIX, processes, devices,
          devices))


def _status_text(code):
  return "signal %d" % -code if code < 0 else "status %d" % code


class Launcher:
  """Runs the workers of this machine until all end or one fails."""

  def __init__(self, args, exposure=None):
    """`exposure`: why a one-machine job runs on this machine's network
    (None: in a private network namespace, or over several machines)."""
    self.args = args
    self.exposure = exposure
    self.addresses, self.indices = worker_addresses(args)
    self.command = command_line(args.command)
    gpus = 0 if args.cpu else gpu_count()
    workers = len(self.indices) // args.processes_per_worker
    need = workers * args.gpu_per_worker
    if gpus and gpus < need:
      raise ValueError("%d worker(s) x %d GPU(s) need %d GPUs; this machine "
                       "has %d (use --cpu for logical CPU devices)" % (
                           workers, args.gpu_per_worker, need, gpus))
    self.gpus = gpus
    self.workers = []
    self._stop_reason = None

  def _on_signal(self, signum, _frame):
    self._stop_reason = signum

  def stop_all(self, signum=signal.SIGTERM, wait=5.0):
    """Stops every worker still running: signum, then SIGKILL after wait."""
    for worker in self.workers:
      worker.signal(signum)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and any(
        w.process.poll() is None for w in self.workers):
      time.sleep(0.05)
    for worker in self.workers:
      worker.signal(signal.SIGKILL)
    for worker in self.workers:
      worker.process.wait()

  def run(self):
    args = self.args
    directory = log_dir(args)
    if directory:
      os.makedirs(directory, exist_ok=True)
    devices = devices_per_process(args)
    if args.processes_per_worker > 1:
      _log(_processes_text(args, len(self.indices), devices,
                           "GPU" if self.gpus else "logical CPU device"))
    elif self.gpus:
      _log("%d worker(s) on this machine, %d GPU(s) each (CUDA_VISIBLE_"
           "DEVICES)" % (len(self.indices), args.gpu_per_worker))
    else:
      _log("no GPU used: each of the %d worker(s) on this machine gets %d "
           "logical CPU device(s) (EPL_CLUSTER_NUM_CPU_DEVICES=%d)" % (
               len(self.indices), args.gpu_per_worker, args.gpu_per_worker))
    _log("cluster: %s; command: %s" % (", ".join(self.addresses),
                                        shlex.join(self.command)))
    if not args.machine_list:
      ports = "ports " + ", ".join(a.rsplit(":", 1)[1] for a in self.addresses)
      _log(private_network.exposure_text(
          self.exposure, "the workers' gRPC servers (%s)" % ports,
          "run any graph it sends (reading and writing this user's files)"))
    previous = {s: signal.signal(s, self._on_signal)
                for s in (signal.SIGINT, signal.SIGTERM)}
    lock = threading.Lock()
    try:
      for local, index in enumerate(self.indices):
        env = worker_env(self.addresses, index, local, args, self.gpus)
        self.workers.append(_Worker(index, self.command, env, directory,
                                    lock, foreground=args.debug and index == 0))
        _log("worker %d started (pid %d, %s)" % (
            index, self.workers[-1].process.pid, self.addresses[index]))
      return self._wait()
    finally:
      self.stop_all()
      for worker in self.workers:
        worker.finish()
      for signum, handler in previous.items():
        signal.signal(signum, handler)

  def _wait(self):
    failed = None
    deadline = None
    reported = set()
    while True:
      if self._stop_reason is not None:
        _log("got signal %d: stopping every worker" % self._stop_reason)
        self.stop_all()
        return 128 + self._stop_reason
      running = 0
      for worker in self.workers:
        code = worker.process.poll()
        if code is None:
          running += 1
          continue
        if worker.index in reported:
          continue
        reported.add(worker.index)
        _log("worker %d exited with %s" % (worker.index, _status_text(code)))
        if code != 0 and failed is None:
          failed = code
          deadline = time.monotonic() + self.args.grace_period
          _log("worker %d failed: the others get %gs to finish, then are "
               "stopped" % (worker.index, self.args.grace_period))
      if not running:
        break
      if deadline is not None and time.monotonic() >= deadline:
        _log("stopping the workers still running after worker failure")
        self.stop_all()
        break
      time.sleep(0.05)
    if failed is None:
      _log("all %d worker(s) succeeded" % len(self.workers))
      return 0
    return failed if failed > 0 else 128 - failed


def _enter_private_network(args, argv):
  """Puts this process in the job's network: re-runs the launcher (same
  pid) in a private network namespace when the job runs in one and one can
  be made. Returns why the one-machine job runs on this machine's network
  instead, or None."""
  if args.in_private_network:
    network_namespace.bring_up_loopback()
    return None
  if args.machine_list:
    return None
  if network(args) == "host":
    return "--network host"
  problem = private_network.problem()
  if problem is not None:
    return "no private network namespace here (%s)" % problem
  line = private_network.command(
      [sys.executable, "-m", "epl.tools.launcher", "--in_private_network"] +
      list(argv))
  sys.stdout.flush()
  sys.stderr.flush()
  os.execv(line[0], line)
  return None  # not reached: execv replaces this process


def _check(args):
  """Raises ValueError for arguments that cannot make a job: before the
  launcher enters the job's network or starts anything."""
  network(args)
  command = command_line(args.command)
  if args.backend == "collective":
    worker_addresses(args)
    return
  if args.processes_per_worker != 1:
    raise ValueError(
        "--processes_per_worker is for the collective backend: under "
        "horovodrun each process is a worker of its own, so give "
        "--num_workers %d --gpu_per_worker %s instead" % (
            args.num_workers * args.processes_per_worker,
            devices_per_process(args)))
  horovod_launch.horovodrun_command(args, command)
  if not args.machine_list:
    check_host(args.host)


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  args = _parser().parse_args(argv)
  try:
    _check(args)
  except ValueError as error:
    _parser().error(str(error))
  exposure = _enter_private_network(args, argv)
  if args.backend == "horovod":
    sys.exit(horovod_launch.run(args, command_line(args.command),
                                0 if args.cpu else gpu_count(), exposure))
  try:
    launcher = Launcher(args, exposure)
  except ValueError as error:
    _parser().error(str(error))
  sys.exit(launcher.run())


if __name__ == "__main__":
  main()
