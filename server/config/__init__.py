"""The configuration of every ``sharecoord`` command: one declaration per setting.

- engine.py: what a setting is (``Setting``, declared as a ``ServeConfig`` field with
  ``setting(...)`` or in a command's table), its flags, and its resolution from flag >
  environment > ``--config`` TOML file > default, with one-line ``ConfigError``\\ s;
- parsers.py: the parsers and checks of the values;
- serve.py: ``ServeConfig``, whose fields are serve's settings, and ``load_serve_config``;
- commands.py: the tables of the other commands (compact, audit, log, state, partition);
- docs.py: the documentation's settings tables, generated (``make docs``).

Importing the package imports every table, so each command's settings are known to the
config file's reader (one file may hold the keys of every command) and to the docs.
"""

from server.config.commands import (
    AUDIT_SETTINGS,
    CLUSTER_STATUS_SETTINGS,
    COMPACT_SETTINGS,
    DATA_DIR,
    LOG_DUMP_SETTINGS,
    LOG_VERIFY_SETTINGS,
    MASTER,
    PARTITION_ADOPT_SETTINGS,
    PARTITION_EXPORT_SETTINGS,
    PARTITION_IMPORT_SETTINGS,
    STATE_GET_SETTINGS,
)
from server.config.docs import describe_settings
from server.config.engine import (
    CONFIG_ENV_VAR,
    ENV_PREFIX,
    ConfigError,
    Kafka,
    Setting,
    add_arguments,
    commands,
    load_settings,
    resolve,
    setting,
    settings_of,
)
from server.config.parsers import (
    WILDCARD_HOSTS,
    advertised_host,
    at_least,
    between,
    one_of,
    parse_bool,
    parse_float,
    parse_int,
    parse_listen,
    parse_optional_path,
    parse_partition_list,
    parse_path,
    parse_spark_master,
    parse_url,
    parse_word,
)
from server.config.serve import (
    LOG_FORMATS,
    LOG_LEVELS,
    SERVE_SETTINGS,
    ServeConfig,
    load_serve_config,
)

__all__ = [
    "AUDIT_SETTINGS",
    "CLUSTER_STATUS_SETTINGS",
    "COMPACT_SETTINGS",
    "CONFIG_ENV_VAR",
    "DATA_DIR",
    "ENV_PREFIX",
    "LOG_DUMP_SETTINGS",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "LOG_VERIFY_SETTINGS",
    "MASTER",
    "PARTITION_ADOPT_SETTINGS",
    "PARTITION_EXPORT_SETTINGS",
    "PARTITION_IMPORT_SETTINGS",
    "SERVE_SETTINGS",
    "STATE_GET_SETTINGS",
    "WILDCARD_HOSTS",
    "ConfigError",
    "Kafka",
    "ServeConfig",
    "Setting",
    "add_arguments",
    "advertised_host",
    "at_least",
    "between",
    "commands",
    "describe_settings",
    "load_serve_config",
    "load_settings",
    "one_of",
    "parse_bool",
    "parse_float",
    "parse_int",
    "parse_listen",
    "parse_optional_path",
    "parse_partition_list",
    "parse_path",
    "parse_spark_master",
    "parse_url",
    "parse_word",
    "resolve",
    "setting",
    "settings_of",
]
