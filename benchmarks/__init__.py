"""The benchmarks: one script per method and measurement, each run as
``python -m benchmarks.<name>`` from the repository root, printing the markdown tables recorded
in BENCHMARKS.md. :mod:`benchmarks._harness` holds what they share (timing, compiled memory,
tables, common arguments), :mod:`benchmarks._comparison` the method-versus-baseline rule, and
:mod:`benchmarks.registry` maps each method to its scripts."""
