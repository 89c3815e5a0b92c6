"""A fake GPU node on the CPU: the fake driver and NVML, the interposer built against them.

- ``built``: the interposer, the fake driver and NVML and the test programs, compiled (gcc).
- ``node``: the device plugin's cGPU side in-process, over fake host GPUs.
- ``policies``: the cGPU policies over three containers launching flat out on one fake GPU.
- ``activity``: a container joins two others and leaves again, under the plugin's schedules.

``fakes/`` holds the fake driver, NVML and MPS control; ``programs/`` the C programs the
isolation tests and ``benchmarks/cgpu_policies.py`` run under the interposer.
"""
