"""Host-time probes of the SSD call: host_path (where an eager call's host time goes; --mock on a CPU) and
host_python_cpu (the host functions' own Python per stage, on a CPU)."""
