"""Measuring instruments shared by the step-timer callback and the benchmarks: the machine
(environment.py), GPU timing (timing.py), the training-step split (step.py), the JSON (results.py), the names
profiled kernels are shown by (kernel_names.py)."""
