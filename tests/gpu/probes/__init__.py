"""The one prepared GPU run of issue 37: probes that need nothing but the standard library.

``tests/gpu/run_on_gpu.sh`` drives them (``run.py`` orders the steps and times each out);
``steps.py`` holds the steps, ``children.py`` the programs each step starts under the
interposer, ``setting.py`` where everything lives and ``figures.py`` the JSON they fill in. The
GPU machine has its own python3 with PyTorch, CuPy and JAX but none of gpushare's dependencies,
so nothing here imports a third-party module at the top: a probe that needs one imports it
inside and is skipped, with the reason, where it is missing.
"""
