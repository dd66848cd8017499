"""Experiment configuration: the typed model of `stages.yaml` and the one way to load it."""

from libra_core.config.errors import ConfigError, format_problems
from libra_core.config.loader import config_to_yaml, load_config, write_resolved_config
from libra_core.config.models import LibraConfig
from libra_core.config.overrides import parse_overrides

__all__ = [
    "ConfigError",
    "LibraConfig",
    "config_to_yaml",
    "format_problems",
    "load_config",
    "parse_overrides",
    "write_resolved_config",
]
