"""Stage functions of one RL iteration; each is what exactly one Prefect task wraps.

They take and return small serialisable values (run folder, iteration, paths, URLs, dataclasses of
numbers). State that must outlive a stage lives on disk in the run folder (`run_dir.RunLayout`).
"""
