"""A benchmark row in a process of its own, built once and then stepped on
command from the process that times the rows in turn (`in_turn.rounds`).

Some TensorFlow settings are per process and read once (for instance
TF_OVERRIDE_GLOBAL_THREADPOOL, which `epl.init` may set for logical CPU
devices): rows that must each run as their users run them cannot share
one process. Each row's process builds it, runs its warm-up steps, says
it is ready, then answers commands one at a time:

  step    runs one step; answers its (wall s, CPU s), measured in the
          row's process around the step (`in_turn.timed_step`)
  parts   answers `parts()` of the row (one traced step split in parts)
  stop    answers the process's peak RSS, then it exits at once

Commands and answers are JSON lines over a pair of pipes of their own, not
stdin/stdout, so that what TensorFlow and EPL print cannot corrupt them;
the row's stdout and stderr go to a file whose end the errors quote. The
parent starts the child (`RowProcess`) with a command line that ends with
`--serve <commands fd>,<answers fd>`; the child passes that value and a
function that builds its row to `serve`.

A row that fails, exits or does not answer within its timeout is killed
by pid and the parent raises, naming the row and quoting the end of its
output; `stop_all` in a `finally` kills what is left, so that no row
process outlives the benchmark. Each row process holds its own copy of
TensorFlow and of its model: `check_memory` refuses to start one more
where the memory left would not hold another as large as the largest so
far (on a shared host the kernel's OOM killer would pick any process).
"""
import json
import os
import resource
import select
import subprocess
import sys
import tempfile
import time
import traceback

from benchmarks import in_turn

# Seconds a row may take to build and warm up, to run one step (or one
# traced step), and to close and exit.
BUILD_TIMEOUT = 1200
STEP_TIMEOUT = 600
STOP_TIMEOUT = 60
# The end of a failed row's output quoted in the error.
OUTPUT_TAIL = 4000


class RowFailed(RuntimeError):
  """A row process failed, exited or did not answer in time."""


def _proc_kib(path, field):
  """The `field` line's KiB of a /proc file ("VmRSS", "MemAvailable"),
  or None without it."""
  try:
    with open(path) as lines:
      for line in lines:
        if line.startswith(field + ":"):
          return int(line.split()[1])
  except OSError:
    pass
  return None


def check_memory(rows, name, fix):
  """Raises RowFailed when the host's available memory is below the
  resident memory of the largest of `rows` (the row processes started so
  far): starting row `name` might then exhaust it. `fix` says what the
  user can do. Does nothing without /proc."""
  resident = [_proc_kib("/proc/%d/status" % row.pid, "VmRSS") for row in rows]
  largest = max([kib for kib in resident if kib is not None], default=0)
  available = _proc_kib("/proc/meminfo", "MemAvailable")
  if available is not None and available < largest:
    raise RowFailed(
        "not enough memory to start row %r: %.1f GiB available, the "
        "largest row process so far holds %.1f GiB (the %d started hold "
        "%.1f GiB); %s" % (name, available / 2 ** 20, largest / 2 ** 20,
                           len(rows), sum(k or 0 for k in resident) / 2 ** 20,
                           fix))


class RowProcess:
  """A row's process, started at construction and ready (built and warmed
  up) when the constructor returns; `ready` is its ready message (the
  facts the row reported, such as its step's FLOPs)."""

  def __init__(self, name, command, env, cwd=None,
               build_timeout=BUILD_TIMEOUT):
    self.name = name
    commands_read, commands_write = os.pipe()
    answers_read, answers_write = os.pipe()
    self._output = tempfile.TemporaryFile()
    try:
      self._process = subprocess.Popen(
          list(command) + ["--serve", "%d,%d" % (commands_read,
                                                 answers_write)],
          pass_fds=(commands_read, answers_write), stdin=subprocess.DEVNULL,
          stdout=self._output, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    finally:
      os.close(commands_read)
      os.close(answers_write)
    self._commands = commands_write
    self._answers = answers_read
    self._pending = b""
    self.pid = self._process.pid
    self.ready = self._answer(build_timeout, "build and warm up")

  def step(self):
    """(wall s, CPU s) of one step, measured in the row's process."""
    return tuple(self._ask("step", STEP_TIMEOUT))

  def parts(self):
    return self._ask("parts", STEP_TIMEOUT)

  def stop(self):
    """Stops the row's process and waits for it to exit; its peak RSS in
    bytes."""
    peak = self._ask("stop", STOP_TIMEOUT)
    try:
      self._process.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
      self._fail("did not exit within %d s of stop" % STOP_TIMEOUT)
    self._close()
    return peak

  def kill(self):
    """Kills the row's process by pid if it still runs and reaps it."""
    if self._process.poll() is None:
      self._process.kill()
      self._process.wait()
    self._close()

  def _close(self):
    # Once: a closed descriptor's number may already name another file.
    if self._answers is None:
      return
    os.close(self._commands)
    os.close(self._answers)
    self._commands = self._answers = None
    self._output.close()

  def _ask(self, command, timeout):
    try:
      os.write(self._commands, (json.dumps(command) + "\n").encode())
    except OSError as error:
      self._fail("could not be sent %r (%s)" % (command, error))
    return self._answer(timeout, command)

  def _answer(self, timeout, what):
    deadline = time.monotonic() + timeout
    while b"\n" not in self._pending:
      left = deadline - time.monotonic()
      readable = select.select([self._answers], [], [], max(left, 0))[0]
      if not readable:
        self._fail("did not %s within %d s" % (what, timeout))
      chunk = os.read(self._answers, 1 << 16)
      if not chunk:
        self._fail("exited (status %s) before it answered %s" % (
            self._process.wait(), what))
      self._pending += chunk
    line, self._pending = self._pending.split(b"\n", 1)
    answer = json.loads(line)
    if isinstance(answer, dict) and "error" in answer:
      self._fail("failed to %s:\n%s" % (what, answer["error"]))
    return answer

  def _fail(self, why):
    output = ""
    if not self._output.closed:
      self._output.seek(0)
      output = self._output.read().decode(errors="replace")[-OUTPUT_TAIL:]
    pid = self.pid
    self.kill()
    raise RowFailed("row %r (pid %d) %s\nIts output ends:\n%s" % (
        self.name, pid, why, output))


def stop_all(rows):
  """Kills every row of `rows` still running (for a `finally`)."""
  for row in rows:
    row.kill()


def serve(channel, build):
  """In the row's process: builds the row (`build()`: an object with
  `step()`, `parts()` and `facts`, a JSON dict sent with the
  ready message), then answers the parent's commands on the pipes of
  `channel` ("<commands fd>,<answers fd>") until it says stop. A failure
  is answered with its traceback, then the process exits with status 1."""
  commands_fd, answers_fd = (int(fd) for fd in channel.split(","))
  answers = os.fdopen(answers_fd, "w")

  def send(answer):
    answers.write(json.dumps(answer) + "\n")
    answers.flush()

  try:
    row = build()
    send(row.facts)
    with os.fdopen(commands_fd) as commands:
      for line in commands:
        command = json.loads(line)
        if command == "step":
          send(in_turn.timed_step(row.step))
        elif command == "parts":
          send(row.parts())
        elif command == "stop":
          # ru_maxrss is in KiB on Linux.
          send(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
          # Exits without closing the row: nothing is left to keep, and
          # closing MirroredStrategy's session took over STOP_TIMEOUT on
          # TensorFlow 2.15.
          os._exit(0)  # pylint: disable=protected-access
        else:
          raise ValueError("unknown command %r" % (command,))
  except Exception:  # pylint: disable=broad-except
    send({"error": traceback.format_exc()})
    sys.exit(1)
