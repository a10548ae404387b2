"""Benchmark rows in processes of their own (benchmarks/row_process.py),
stepped in turn from this one: their steps are timed where they run,
their CPU is not counted as other processes' load, and no row process
outlives its benchmark, also when one fails or stops answering.

The rows here are fake (no TensorFlow): a step burns CPU for a while, so
that the tests take seconds."""
import os
import sys
import textwrap
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from benchmarks import host_load  # noqa: E402  pylint: disable=wrong-import-position
from benchmarks import in_turn  # noqa: E402  pylint: disable=wrong-import-position
from benchmarks import row_process  # noqa: E402  pylint: disable=wrong-import-position

TIMEOUT = 120
# CPU seconds a fake row's step burns.
BURN_S = 0.5

# argv: [mode, "--serve", channel]; mode "burn" steps by burning BURN_S of
# CPU, "hang" prints a line and never finishes its step, "fail" fails to
# build.
FAKE_ROW = textwrap.dedent("""
    import sys, time
    from benchmarks import row_process

    class FakeRow:
      facts = {"step_flops": 7}

      def step(self):
        if sys.argv[1] == "hang":
          print("hanging in its step", flush=True)
          time.sleep(3600)
        end = time.process_time() + %r
        while time.process_time() < end:
          pass

      def parts(self):
        return {"step": 1.0}

    def build():
      if sys.argv[1] == "fail":
        raise ValueError("no model named fake")
      return FakeRow()

    row_process.serve(sys.argv[-1], build)
""" % BURN_S)


def _start(mode, name="fake"):
  return row_process.RowProcess(
      name, [sys.executable, "-c", FAKE_ROW, mode],
      dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT, build_timeout=TIMEOUT)


def _alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  return True


@pytest.mark.timeout(TIMEOUT)
def test_rows_step_in_turn_in_their_processes_and_are_gone_afterwards():
  rows = []
  try:
    rows = [_start("burn", name) for name in ("a", "b")]
    assert rows[0].ready == {"step_flops": 7}
    timed, quiet, _ = in_turn.rounds(
        [(row.name, row.step) for row in rows], 2, quiet_cores=2.0 ** 10,
        self_timed=True, child_pids=[row.pid for row in rows])
    # The CPU time is the row process's own (this one only waited).
    assert {name: len(pairs) for name, pairs in timed.items()} == {
        "a": 2, "b": 2}
    for pairs in timed.values():
      for wall, cpu in pairs:
        assert cpu >= BURN_S and wall >= 0.9 * cpu, pairs
    assert len(quiet) == 2
    assert rows[1].parts() == {"step": 1.0}
    assert all(row.stop() > 0 for row in rows)  # peak RSS, bytes
  finally:
    row_process.stop_all(rows)
  assert rows and not any(_alive(row.pid) for row in rows)


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs /proc")
@pytest.mark.timeout(TIMEOUT)
def test_other_processes_load_leaves_out_the_row_processes_cpu():
  row = _start("burn")
  try:
    counting_row = host_load.OtherProcesses()
    without_row = host_load.OtherProcesses(child_pids=[row.pid])
    start = time.perf_counter()
    _, cpu = row.step()  # this process waits meanwhile
    elapsed = time.perf_counter() - start
    with_row_cores, others_cores = counting_row.cores(), without_row.cores()
    row.stop()
  finally:
    row.kill()
  row_cores = cpu / elapsed
  # The row's CPU is what separates the two figures (within clock ticks);
  # what is left is other jobs' load on this shared host.
  assert with_row_cores - others_cores == pytest.approx(row_cores, abs=0.15), (
      with_row_cores, others_cores, row_cores)
  assert not _alive(row.pid)


@pytest.mark.timeout(TIMEOUT)
def test_a_row_that_does_not_answer_is_killed_and_quoted(monkeypatch):
  monkeypatch.setattr(row_process, "STEP_TIMEOUT", 2)
  row = _start("hang", "slow row")
  try:
    with pytest.raises(row_process.RowFailed) as failed:
      row.step()
  finally:
    row.kill()
  message = str(failed.value)
  assert "'slow row' (pid %d) did not step within 2 s" % row.pid in message
  assert "hanging in its step" in message
  assert not _alive(row.pid)


@pytest.mark.timeout(TIMEOUT)
def test_a_row_that_fails_to_build_says_why():
  with pytest.raises(row_process.RowFailed) as failed:
    _start("fail", "broken row")
  message = str(failed.value)
  assert "'broken row'" in message and "build and warm up" in message
  assert "ValueError: no model named fake" in message
  pid = int(message.split("(pid ", 1)[1].split(")", 1)[0])
  assert not _alive(pid)


@pytest.mark.timeout(TIMEOUT)
def test_no_row_starts_where_memory_would_not_hold_it(monkeypatch):
  row = _start("burn", "big row")
  try:
    gib = 2 ** 20  # in KiB
    # A host with 1 GiB left and a row process of 4 GiB: refused.
    monkeypatch.setattr(row_process, "_proc_kib", lambda path, field: (
        4 * gib if field == "VmRSS" else 1 * gib))
    with pytest.raises(row_process.RowFailed) as refused:
      row_process.check_memory([row], "next row", "time fewer rows")
    assert ("not enough memory to start row 'next row': 1.0 GiB available, "
            "the largest row process so far holds 4.0 GiB" in
            str(refused.value))
    assert str(refused.value).endswith("; time fewer rows")
    # 5 GiB left: it fits.
    monkeypatch.setattr(row_process, "_proc_kib", lambda path, field: (
        4 * gib if field == "VmRSS" else 5 * gib))
    row_process.check_memory([row], "next row", "time fewer rows")
  finally:
    row.kill()


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"),
                    reason="needs /proc")
@pytest.mark.timeout(TIMEOUT)
def test_process_cpu_is_read_from_proc_and_none_once_gone():
  # pylint: disable=protected-access
  assert host_load._process_seconds(os.getpid()) >= 0.0
  with open("/proc/sys/kernel/pid_max") as pid_max:
    never_a_pid = int(pid_max.read()) + 1
  assert host_load._process_seconds(never_a_pid) is None
