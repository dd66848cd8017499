"""Prefect tasks: each wraps exactly one libra_core call and passes small serialisable values.

No task holds tensors or engine handles; state lives in the run folder. Every task disables
Prefect's input-hash cache: identical inputs across iterations (same URLs, same policy folder) must
still run.
"""
