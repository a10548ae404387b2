"""The machine a benchmark runs on, and what its accelerators can do.

- `describe()`: one line for a benchmark's header and docs/benchmarks.md:
  CPU cores, memory, GPUs (from `nvidia-smi`, so that it needs no
  TensorFlow), TensorFlow version.
- `gpus()`: the names of this machine's visible GPUs ([] without any).
- `peak_flops(name, override)`: the peak float32 FLOP/s of one GPU, from a
  small table of datasheet figures by GPU name, or `override` (the
  benchmarks' `--peak_tflops`); None when neither knows.
- `half_peak_flops(name, override)`: the same for dense float16/bfloat16
  tensor-core math, what mixed-precision MFU is measured against.
- `mfu(flops_per_step, step_seconds, peak, devices)`: model FLOPs
  utilisation, the model's FLOPs per second over the peak of the devices
  that ran it.
"""
import os
import shutil
import subprocess

# Peak float32 FLOP/s of one GPU, dense, as TensorFlow runs float32 matmuls
# and convolutions on Ampere and later (TF32 tensor cores, on by default),
# from the vendors' datasheets; matched as a substring of the name that
# nvidia-smi prints, the first match wins (H100 PCIe before H100 SXM).
PEAK_FLOPS = (
    ("H200", 494.7e12),
    ("H100 PCIe", 378.0e12),
    ("H100", 494.7e12),
    ("A100", 156.0e12),
    ("A10G", 31.2e12),
    ("L4", 60.0e12),
    ("V100", 15.7e12),
    ("T4", 8.1e12),
)


def gpus():
  """Names of the GPUs nvidia-smi lists (those CUDA_VISIBLE_DEVICES
  leaves visible); [] when there is none or no nvidia-smi."""
  if not shutil.which("nvidia-smi"):
    return []
  listed = subprocess.run(
      ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
      capture_output=True, text=True, check=False)
  if listed.returncode:
    return []
  names = [line.strip() for line in listed.stdout.splitlines() if line.strip()]
  visible = os.environ.get("CUDA_VISIBLE_DEVICES")
  if visible is None:
    return names
  indices = [int(i) for i in visible.split(",") if i.strip().isdigit()]
  return [names[i] for i in indices if i < len(names)]


# Dense float16/bfloat16 tensor-core peak FLOP/s of one GPU (datasheets,
# without sparsity), matched as PEAK_FLOPS is.
HALF_PEAK_FLOPS = (
    ("H200", 989.4e12),
    ("H100 PCIe", 756.0e12),
    ("H100", 989.4e12),
    ("A100", 312.0e12),
    ("V100", 125.0e12),
    ("T4", 65.0e12),
)


def _peak(table, name, override_tflops):
  if override_tflops:
    return override_tflops * 1e12
  for key, flops in table:
    if name and key in name:
      return flops
  return None


def _memory_gib():
  with open("/proc/meminfo") as meminfo:
    for line in meminfo:
      if line.startswith("MemTotal:"):
        return int(line.split()[1]) / 2.0 ** 20
  return float("nan")


def describe(tf_version):
  """'2 CPU cores, 23.4 GiB memory, no GPU, TensorFlow 2.15.1'."""
  names = gpus()
  gpu_text = "%d x %s" % (len(names), names[0]) if names else "no GPU"
  return "%d CPU cores, %.1f GiB memory, %s, TensorFlow %s" % (
      os.cpu_count(), _memory_gib(), gpu_text, tf_version)


def peak_flops(name, override_tflops=0.0):
  """Peak FLOP/s of one device named `name`: `override_tflops` x 1e12 when
  given, else the table's figure, else None (CPUs: no table entry)."""
  return _peak(PEAK_FLOPS, name, override_tflops)


def half_peak_flops(name, override_tflops=0.0):
  """peak_flops for half-precision tensor-core math (HALF_PEAK_FLOPS)."""
  return _peak(HALF_PEAK_FLOPS, name, override_tflops)


def mfu(flops_per_step, step_seconds, peak, devices):
  """Model FLOPs per second over the peak of `devices` devices of `peak`
  FLOP/s each; None when the peak is unknown."""
  if not peak or not flops_per_step:
    return None
  return flops_per_step / step_seconds / (peak * devices)
