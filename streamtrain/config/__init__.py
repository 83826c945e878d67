"""One typed configuration shared by every service (TOML < environment < flags)."""

from .acl import AclConfig
from .bridge import BridgeConfig, JsonMapping, RawLayout, SourceClusterConfig, SourceConfig
from .cluster import ClusterConfig
from .coordinator import CoordinatorConfig
from .core import BrokerConfig, KafkaConfig, MetricsConfig, StreamtrainConfig
from .loader import ENV_PREFIX, ConfigError, config_environment, load_config, parse_assignment
from .producer import ProducerConfig
from .serve import ServeConfig
from .trainer import TrainerConfig
from .versions import VersionsConfig

__all__ = [
    "ENV_PREFIX",
    "AclConfig",
    "BridgeConfig",
    "BrokerConfig",
    "ClusterConfig",
    "ConfigError",
    "CoordinatorConfig",
    "JsonMapping",
    "KafkaConfig",
    "MetricsConfig",
    "ProducerConfig",
    "RawLayout",
    "ServeConfig",
    "SourceClusterConfig",
    "SourceConfig",
    "StreamtrainConfig",
    "TrainerConfig",
    "VersionsConfig",
    "config_environment",
    "load_config",
    "parse_assignment",
]
