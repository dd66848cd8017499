"""Scheduling traces: one row per trajectory (prompt size, per-turn tokens, tool returns).

Exported from a run's trajectory lake (`export.py`) or generated (`synthetic.py`), replayed against
the schedulers of libra_core/scheduling by `evaluate.py`, and tabulated by `report.py`.
"""
