"""The device the audit compiles for: an NVIDIA H200 (sm_90a), described without one.

``SHARED_LIMIT`` and ``MAX_REGISTERS`` are the limits a kernel must respect to launch (XLA
refuses a Triton kernel over the shared memory a block may opt in to) and to keep its values in
registers (past 255 per thread ptxas spills to local memory). ``H200_TARGET_CONFIG`` is what
XLA needs to know of the target to compile for it ahead of time (``xla.GpuTargetConfigProto``
in text format), from the public H200 SXM figures: 132 SMs, 1.98 GHz boost, 50 MiB L2,
4.8 TB/s HBM3e, 141 GB; per SM 228 KiB of shared memory (227 KiB = 232448 B grantable to one
block), 64 K registers, 2048 threads. Code generation depends on the compute capability and
these limits, not on the memory size.
"""

SHARED_LIMIT = 232448  # bytes of shared memory per block, the opt-in maximum (227 KiB)
MAX_REGISTERS = 255  # per thread

H200_TARGET_CONFIG = """
gpu_device_info {
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_block_optin: 232448
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: 4800000000000
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: 141000000000
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
  cuda_compute_capability { major: 9 minor: 0 }
}
platform_name: "CUDA"
device_description_str: "NVIDIA H200"
"""
