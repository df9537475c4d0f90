"""The config table: precedence, validators, the file, the checks across settings."""

from __future__ import annotations

import argparse
import dataclasses
import socket
import textwrap
from pathlib import Path

import pytest

from server.cluster import ClusterMap, Node
from server.config import (
    SERVE_SETTINGS,
    ConfigError,
    ServeConfig,
    add_arguments,
    describe_settings,
    load_serve_config,
    parse_bool,
    parse_listen,
    parse_spark_master,
    parse_url,
    resolve,
)

SETTINGS = {s.name: s for s in SERVE_SETTINGS}


def parse_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser, SERVE_SETTINGS)
    return parser.parse_args(list(argv))


def config_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "sharecoord.toml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def resolved(*argv: str, env: dict[str, str] | None = None, file: str | None = None) -> dict:
    return resolve(SERVE_SETTINGS, parse_args(*argv), env or {}, file)


# --- precedence: flags > env > file > defaults -------------------------------------------


def test_flag_wins_over_env(tmp_path):
    values = resolved("--partitions", "7", env={"SHARECOORD_PARTITIONS": "8"})
    assert values["partitions"] == 7


def test_env_wins_over_file(tmp_path):
    file = config_file(tmp_path, "partitions = 9")
    assert resolved(env={"SHARECOORD_PARTITIONS": "8"}, file=file)["partitions"] == 8


def test_file_wins_over_default(tmp_path):
    file = config_file(tmp_path, "partitions = 9")
    assert resolved(file=file)["partitions"] == 9


def test_flag_wins_over_file(tmp_path):
    file = config_file(tmp_path, 'data_dir = "/from/file"')
    assert resolved("--data-dir", "/from/flag", file=file)["data_dir"] == "/from/flag"


def test_default_when_nothing_is_given():
    values = resolved()
    assert values == {s.name: s.default for s in SERVE_SETTINGS}
    assert values["partitions"] == 50
    assert values["listen"] == "127.0.0.1:9095"
    assert values["data_dir"] == "./data"


def test_env_var_name_is_prefix_plus_flag_upper_case_with_underscores():
    assert SETTINGS["data_dir"].env_var == "SHARECOORD_DATA_DIR"
    assert SETTINGS["snapshot_update_records_per_snapshot"].env_var == (
        "SHARECOORD_SNAPSHOT_UPDATE_RECORDS_PER_SNAPSHOT"
    )
    assert resolved(env={"SHARECOORD_DATA_DIR": "/d"})["data_dir"] == "/d"


def test_flag_not_given_leaves_no_attribute():
    args = parse_args("--partitions", "3")
    assert args.partitions == "3"
    assert not hasattr(args, "data_dir")
    assert not hasattr(args, "topic_catalog")
    assert not hasattr(args, "config")


def test_config_file_comes_from_config_flag_or_env(tmp_path):
    file = config_file(tmp_path, "partitions = 9")
    assert load_serve_config(parse_args("--config", file), {}).partitions == 9
    assert load_serve_config(parse_args(), {"SHARECOORD_CONFIG": file}).partitions == 9


# --- validators: every boundary ---------------------------------------------------------

ACCEPTED = [
    ("partitions", "1", 1),
    ("partitions", "10000", 10000),
    ("max_body_bytes", "1024", 1024),
    ("max_entries_per_request", "1", 1),
    ("max_state_batches_per_entry", "1", 1),
    ("max_group_id_bytes", "1", 1),
    ("segment_bytes", "1024", 1024),
    ("snapshot_update_records_per_snapshot", "0", 0),
    ("snapshot_update_records_per_snapshot", "500", 500),
    ("state_retention_ms", "-1", -1),
    ("state_retention_ms", "1", 1),
    ("node_id", "0", 0),
    ("node_id", "2147483647", 2147483647),
    ("prune_interval_ms", "1", 1),
    ("cold_partition_snapshot_interval_ms", "1", 1),
    ("compaction_commit_interval_ms", "1", 1),
    ("write_timeout_ms", "1", 1),
    ("append_linger_ms", "0", 0),
    ("journal_segment_bytes", "65536", 65536),
    ("journal_checkpoint_interval_ms", "1", 1),
    ("journal_checkpoint_bytes", "1", 1),
    ("journal_max_bytes", "1048576", 1048576),
    ("request_timeout_s", "0.001", 0.001),
    ("shutdown_timeout_s", "0", 0.0),
    ("log_level", "DEBUG", "debug"),
    ("log_level", "error", "error"),
    ("log_format", "json", "json"),
    ("data_dir", "/var/lib/sharecoord", "/var/lib/sharecoord"),
    ("listen", "0.0.0.0:0", "0.0.0.0:0"),
    ("listen", "[::1]:65535", "[::1]:65535"),
]

REJECTED = [
    ("partitions", "0", "must be between 1 and 10000"),
    ("partitions", "10001", "must be between 1 and 10000"),
    ("partitions", "many", "expected an integer"),
    ("partitions", "1.5", "expected an integer"),
    ("max_body_bytes", "1023", "must be >= 1024"),
    ("max_entries_per_request", "0", "must be >= 1"),
    ("max_state_batches_per_entry", "0", "must be >= 1"),
    ("max_group_id_bytes", "0", "must be >= 1"),
    ("segment_bytes", "1023", "must be >= 1024"),
    ("snapshot_update_records_per_snapshot", "501", "must be between 0 and 500"),
    ("snapshot_update_records_per_snapshot", "-1", "must be between 0 and 500"),
    ("state_retention_ms", "0", "must be -1 (never) or >= 1"),
    ("state_retention_ms", "-2", "must be -1 (never) or >= 1"),
    ("node_id", "-1", "must be between 0 and 2147483647"),
    ("node_id", "2147483648", "must be between 0 and 2147483647"),
    ("prune_interval_ms", "0", "must be >= 1"),
    ("cold_partition_snapshot_interval_ms", "0", "must be >= 1"),
    ("compaction_commit_interval_ms", "0", "must be >= 1"),
    ("write_timeout_ms", "0", "must be >= 1"),
    ("append_linger_ms", "-1", "must be >= 0"),
    ("journal_segment_bytes", "65535", "must be >= 65536"),
    ("journal_checkpoint_interval_ms", "0", "must be >= 1"),
    ("journal_max_bytes", "1", "must be >= 1048576"),
    ("request_timeout_s", "0", "must be > 0"),
    ("request_timeout_s", "inf", "expected a finite number"),
    ("request_timeout_s", "nan", "expected a finite number"),
    ("request_timeout_s", "soon", "expected a number"),
    ("shutdown_timeout_s", "-0.5", "must be >= 0"),
    ("log_level", "trace", "must be one of debug, info, warning, error"),
    ("log_format", "xml", "must be one of text, json"),
    ("journal_flush", "fast", "must be one of kernel, thread"),
    ("data_dir", "", "must not be empty"),
    ("listen", "9095", "expected HOST:PORT"),
    ("listen", "localhost:65536", "the port must be an integer 0..65535"),
]


@pytest.mark.parametrize(("name", "text", "value"), ACCEPTED)
def test_validator_accepts_its_boundary(name, text, value):
    assert resolved(env={SETTINGS[name].env_var: text})[name] == value


@pytest.mark.parametrize(("name", "text", "allowed"), REJECTED)
def test_validator_rejects_past_its_boundary_naming_setting_and_source(name, text, allowed):
    env_var = SETTINGS[name].env_var
    with pytest.raises(ConfigError) as info:
        resolved(env={env_var: text})
    message = str(info.value)
    assert message.startswith(f"{name}: ")
    assert allowed in message
    assert f"env var {env_var}" in message
    assert repr(text) in message


def test_rejected_flag_names_the_flag():
    with pytest.raises(
        ConfigError,
        match=r"partitions: must be between 1 and 10000; got '0' from flag --partitions",
    ):
        resolved("--partitions", "0")


def test_rejected_file_key_names_the_key_and_the_file(tmp_path):
    file = config_file(tmp_path, "partitions = 0")
    with pytest.raises(ConfigError) as info:
        resolved(file=file)
    assert str(info.value) == (
        f"partitions: must be between 1 and 10000; got 0 from key partitions in config file {file}"
    )


def test_every_default_passes_its_own_validator():
    for setting in SERVE_SETTINGS:
        if setting.default is not None:
            setting.validate(setting.default)


# --- the file -----------------------------------------------------------------------------


def test_unknown_file_key_is_rejected_naming_it_with_a_suggestion(tmp_path):
    file = config_file(tmp_path, "partitions = 5\npartitons = 6\ncolour = 'red'")
    with pytest.raises(ConfigError) as info:
        resolved(file=file)
    message = str(info.value)
    assert file in message
    assert "partitons (did you mean partitions?)" in message
    assert "colour" in message


def test_file_key_with_dashes_is_unknown_and_suggests_underscores(tmp_path):
    file = config_file(tmp_path, 'data-dir = "/d"')
    with pytest.raises(ConfigError, match=r"data-dir \(did you mean data_dir\?\)"):
        resolved(file=file)


def test_file_table_is_an_unknown_key(tmp_path):
    file = config_file(tmp_path, "[serve]\npartitions = 5")
    with pytest.raises(ConfigError, match=r"unknown key.*serve"):
        resolved(file=file)


def test_file_keys_of_other_serve_settings_are_allowed_for_a_subset(tmp_path):
    file = config_file(tmp_path, 'data_dir = "/d"\npartitions = 5')
    subset = [SETTINGS["data_dir"]]
    assert resolve(subset, argparse.Namespace(), {}, file) == {"data_dir": "/d"}


def test_file_with_bad_toml_is_rejected_naming_it(tmp_path):
    file = config_file(tmp_path, "partitions = = 5")
    with pytest.raises(ConfigError, match=r"sharecoord\.toml: not valid TOML"):
        resolved(file=file)


def test_file_that_is_not_utf8_is_rejected_naming_it(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes("data_dir = 'caf\xe9'\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1\.toml: not valid TOML: not UTF-8"):
        resolved(file=str(path))


def test_missing_file_is_rejected_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.toml: cannot read it"):
        resolved(file=str(tmp_path / "nope.toml"))


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("partitions = 1.5", "expected an integer"),
        ("partitions = true", "expected an integer"),
        ("partitions = [1]", "expected a string, number or boolean"),
        ("topic_catalog = 2", "expected a boolean"),
        ("listen = 9095", "expected HOST:PORT"),
    ],
)
def test_file_value_of_the_wrong_type_is_rejected(tmp_path, line, problem):
    with pytest.raises(ConfigError, match=problem):
        resolved(file=config_file(tmp_path, line))


def test_file_values_may_be_native_toml_or_strings(tmp_path):
    file = config_file(
        tmp_path,
        'partitions = "12"\nrequest_timeout_s = 5\nshutdown_timeout_s = 2.5\ntopic_catalog = true',
    )
    values = resolved(file=file)
    assert values["partitions"] == 12
    assert values["request_timeout_s"] == 5.0
    assert values["shutdown_timeout_s"] == 2.5
    assert values["topic_catalog"] is True


# --- booleans ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("true", True),
        ("TRUE", True),
        ("1", True),
        ("yes", True),
        (" Yes ", True),
        ("false", False),
        ("False", False),
        ("0", False),
        ("no", False),
        ("NO", False),
    ],
)
def test_bool_parsing_accepts_true_false_1_0_yes_no(text, value):
    assert parse_bool(text) is value
    assert resolved(env={"SHARECOORD_TOPIC_CATALOG": text})["topic_catalog"] is value


@pytest.mark.parametrize("text", ["", "2", "on", "y", "truthy"])
def test_bool_parsing_rejects_anything_else(text):
    with pytest.raises(ConfigError, match="topic_catalog: expected a boolean"):
        resolved(env={"SHARECOORD_TOPIC_CATALOG": text})


@pytest.mark.parametrize(("line", "value"), [("true", True), ('"yes"', True), ("0", False)])
def test_bool_from_file(tmp_path, line, value):
    file = config_file(tmp_path, f"topic_catalog = {line}")
    assert resolved(file=file)["topic_catalog"] is value


def test_bool_flag_and_its_negation_override_env():
    assert resolved("--topic-catalog")["topic_catalog"] is True
    env = {"SHARECOORD_TOPIC_CATALOG": "true"}
    assert resolved("--no-topic-catalog", env=env)["topic_catalog"] is False


# --- listen ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("127.0.0.1:9095", ("127.0.0.1", 9095)),
        ("localhost:0", ("localhost", 0)),
        ("0.0.0.0:65535", ("0.0.0.0", 65535)),
        ("[::1]:9095", ("::1", 9095)),
        ("[::]:80", ("::", 80)),
        ("[fe80::1%eth0]:9095", ("fe80::1%eth0", 9095)),
        (" host.example:1 ", ("host.example", 1)),
    ],
)
def test_listen_parses_host_and_port_including_ipv6(text, address):
    assert parse_listen(text) == address


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("127.0.0.1", "expected HOST:PORT"),
        (":9095", "the host is empty"),
        ("::1:9095", "an IPv6 address goes in brackets"),
        ("[::1]9095", r"expected \[IPV6\]:PORT"),
        ("[::1:9095", r"expected \[IPV6\]:PORT"),
        ("[nothost]:9095", "is not an IPv6 address"),
        ("h:65536", "0..65535"),
        ("h:-1", "0..65535"),
        ("h:", "0..65535"),
        ("h:http", "0..65535"),
        ("my host:1", "has spaces"),
    ],
)
def test_listen_rejects_malformed_addresses(text, problem):
    with pytest.raises(ValueError, match=problem):
        parse_listen(text)


def test_serve_config_derives_host_and_port_from_listen():
    config = load_serve_config(parse_args("--listen", "[::1]:9096"), {})
    assert (config.listen, config.host, config.port) == ("[::1]:9096", "::1", 9096)


# --- settings that go together -------------------------------------------------------------


def test_tls_cert_without_tls_key_is_rejected():
    with pytest.raises(ConfigError, match=r"tls_cert \(from flag --tls-cert\) is set without"):
        load_serve_config(parse_args("--tls-cert", "c.pem"), {})


def test_tls_key_without_tls_cert_is_rejected():
    env = {"SHARECOORD_TLS_KEY": "k.pem"}
    with pytest.raises(ConfigError, match=r"tls_key \(from env var SHARECOORD_TLS_KEY\)"):
        load_serve_config(parse_args(), env)


def test_tls_client_ca_needs_cert_and_key():
    with pytest.raises(ConfigError, match=r"tls_client_ca .* needs --tls-cert and --tls-key"):
        load_serve_config(parse_args("--tls-client-ca", "ca.pem"), {})
    config = load_serve_config(
        parse_args("--tls-cert", "c", "--tls-key", "k", "--tls-client-ca", "ca"), {}
    )
    assert (config.tls_cert, config.tls_key, config.tls_client_ca) == ("c", "k", "ca")


def test_empty_optional_path_means_not_set(tmp_path):
    file = config_file(tmp_path, 'auth_token_file = "/etc/token"')
    config = load_serve_config(parse_args("--config", file), {"SHARECOORD_AUTH_TOKEN_FILE": ""})
    assert config.auth_token_file is None


CLUSTER = """
num_partitions = 4
[[node]]
id = 1
host = "a"
port = 9095
partitions = ["0-1"]
[[node]]
id = 2
host = "b"
port = 9095
partitions = ["2-3"]
"""


def test_node_id_must_be_a_node_of_the_cluster_file(tmp_path):
    cluster = config_file(tmp_path, CLUSTER)
    args = parse_args("--cluster", cluster, "--partitions", "4", "--node-id", "3")
    with pytest.raises(ConfigError) as info:
        load_serve_config(args, {})
    assert "node_id (from flag --node-id) = 3 is not a node of cluster file" in str(info.value)
    assert "ids: 1, 2" in str(info.value)


def test_default_node_id_missing_from_the_cluster_file_is_rejected(tmp_path):
    cluster = config_file(tmp_path, CLUSTER)
    with pytest.raises(ConfigError, match=r"node_id \(from default\) = 0 is not a node"):
        load_serve_config(parse_args("--cluster", cluster, "--partitions", "4"), {})


def test_cluster_file_is_loaded_for_its_node(tmp_path):
    cluster = config_file(tmp_path, CLUSTER)
    config = load_serve_config(
        parse_args("--cluster", cluster, "--partitions", "4", "--node-id", "2"), {}
    )
    assert config.cluster_map.owned_by(config.node_id) == frozenset({2, 3})


def test_cluster_partition_count_must_equal_partitions(tmp_path):
    cluster = config_file(tmp_path, CLUSTER)
    args = parse_args("--cluster", cluster, "--node-id", "1")
    with pytest.raises(
        ConfigError, match=r"cluster \(from flag --cluster\).*num_partitions = 4 but"
    ):
        load_serve_config(args, {})


def test_broken_cluster_file_is_a_config_error_naming_it(tmp_path):
    cluster = config_file(tmp_path, "num_partitions = 4")
    with pytest.raises(ConfigError, match=r"cluster \(from flag --cluster\): cluster file .*toml"):
        load_serve_config(parse_args("--cluster", cluster), {})


def test_a_listen_port_other_than_the_cluster_files_is_refused(tmp_path):
    cluster = config_file(tmp_path, CLUSTER)
    args = parse_args("--cluster", cluster, "--partitions", "4", "--node-id", "2")
    args.listen = "0.0.0.0:9096"
    with pytest.raises(ConfigError) as refused:
        load_serve_config(args, {})
    message = str(refused.value)
    assert "listen (from flag --listen) has port 9096" in message
    assert "node 2 is reached at b:9095" in message
    assert "--listen HOST:9095" in message


def test_behind_a_port_mapping_the_advertised_listener_names_the_cluster_entry(tmp_path):
    cluster = config_file(tmp_path, CLUSTER)
    args = parse_args("--cluster", cluster, "--partitions", "4", "--node-id", "2")
    args.listen = "0.0.0.0:8000"
    args.advertised_listener = "b:9095"
    assert load_serve_config(args, {}).cluster_map.node(2).port == 9095
    args.advertised_listener = "c:9095"
    with pytest.raises(ConfigError, match=r"c:9095 disagrees with node 2's entry b:9095"):
        load_serve_config(args, {})


def test_a_wildcard_listen_host_is_advertised_by_this_machines_name():
    config = load_serve_config(parse_args("--listen", "0.0.0.0:9000"), {})
    assert config.cluster_map.nodes[0].host == socket.gethostname()
    assert config.cluster_map.nodes[0].port == 9000
    config = load_serve_config(parse_args("--listen", "[::]:9000"), {})
    assert config.cluster_map.nodes[0].host == socket.gethostname()


def test_the_advertised_listener_is_what_a_single_node_advertises():
    args = parse_args("--listen", "0.0.0.0:9000", "--advertised-listener", "coord.example:19095")
    config = load_serve_config(args, {})
    assert (config.cluster_map.nodes[0].host, config.cluster_map.nodes[0].port) == (
        "coord.example",
        19095,
    )


@pytest.mark.parametrize("bad", ["0.0.0.0:9095", "[::]:9095", "coord:0", "nope"])
def test_an_advertised_listener_must_be_connectable(bad):
    with pytest.raises(ConfigError, match="advertised_listener"):
        load_serve_config(parse_args("--advertised-listener", bad), {})


def test_no_cluster_file_means_this_node_alone_at_the_listen_address():
    config = load_serve_config(parse_args("--node-id", "3", "--listen", "10.1.2.3:9000"), {})
    assert config.cluster_map == ClusterMap.single(3, "10.1.2.3", 9000, 50)
    assert config.cluster_map.nodes == (Node(3, "10.1.2.3", 9000, frozenset(range(50))),)


# --- the table itself ----------------------------------------------------------------------


def test_serve_config_has_one_attribute_per_setting_plus_derived():
    names = [f.name for f in dataclasses.fields(ServeConfig)]
    assert names == [s.name for s in SERVE_SETTINGS] + ["host", "port", "cluster_map"]


def test_settings_with_a_kafka_counterpart_carry_kafka_names():
    kafka = {s.name: s.kafka_name for s in SERVE_SETTINGS if s.kafka_name}
    assert kafka == {
        "partitions": "share.coordinator.state.topic.num.partitions",
        "segment_bytes": "share.coordinator.state.topic.segment.bytes",
        "snapshot_update_records_per_snapshot": (
            "share.coordinator.snapshot.update.records.per.snapshot"
        ),
        "prune_interval_ms": "share.coordinator.state.topic.prune.interval.ms",
        "cold_partition_snapshot_interval_ms": (
            "share.coordinator.cold.partition.snapshot.interval.ms"
        ),
        "write_timeout_ms": "share.coordinator.write.timeout.ms",
        "append_linger_ms": "share.coordinator.append.linger.ms",
        # Kafka's "persistent record of the last flush", its log recovery point.
        "journal_checkpoint_interval_ms": "log.flush.offset.checkpoint.interval.ms",
    }


def test_help_shows_doc_default_env_and_kafka_name():
    parser = argparse.ArgumentParser(
        formatter_class=lambda prog: argparse.HelpFormatter(prog, width=500)
    )
    add_arguments(parser, SERVE_SETTINGS)
    text = " ".join(parser.format_help().split())
    expected = "Updates of a key between two snapshots of it (docs/semantics.md §6). (default: 500;"
    assert expected in text
    assert "env SHARECOORD_SNAPSHOT_UPDATE_RECORDS_PER_SNAPSHOT;" in text
    assert "Kafka: share.coordinator.snapshot.update.records.per.snapshot)" in text
    assert "--no-topic-catalog" in text


def test_describe_settings_is_a_markdown_row_per_setting():
    lines = describe_settings().splitlines()
    assert lines[0] == "| name | flag | env var | default | Kafka name | doc |"
    assert len(lines) == 2 + len(SERVE_SETTINGS)
    row = next(line for line in lines if line.startswith("| `segment_bytes`"))
    assert row.startswith(
        "| `segment_bytes` | `--segment-bytes` | `SHARECOORD_SEGMENT_BYTES` | `104857600` | "
        "`share.coordinator.state.topic.segment.bytes` | "
    )
    assert all(line.count(" | ") == 5 for line in lines)


# --- the other commands' values ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "url"),
    [
        ("http://127.0.0.1:9095", "http://127.0.0.1:9095"),
        ("https://coord.example:443/", "https://coord.example:443"),
        ("HTTP://h", "HTTP://h"),
        ("localhost:9095", "http://localhost:9095"),
        ("[::1]:9095", "http://[::1]:9095"),
        (" 10.0.0.1:80 ", "http://10.0.0.1:80"),
    ],
)
def test_url_takes_http_urls_and_host_port(text, url):
    assert parse_url(text) == url


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("not-a-url", "expected http://HOST:PORT"),
        ("localhost", "expected http://HOST:PORT"),
        ("ftp://h:21", "scheme must be http or https, not ftp"),
        ("file:///etc/passwd", "scheme must be http or https"),
        ("http://h:99999", "not a URL"),
        ("http://[::1", "not a URL"),
        ("http://", "names no host"),
        ("http://h:0", "port 0"),
        ("http://h:1/?x=1", "no query"),
    ],
)
def test_url_refuses_what_cannot_reach_a_daemon(text, problem):
    with pytest.raises(ValueError, match=problem):
        parse_url(text)


@pytest.mark.parametrize(
    "master",
    ["local", "local[*]", "local[4]", "local[2,3]", "local-cluster[2,1,1024]",
     "spark://m:7077", "spark://m1:7077,m2:7077", "yarn", "k8s://https://k:6443"],
)  # fmt: skip
def test_spark_master_takes_what_spark_submit_takes(master):
    assert parse_spark_master(f" {master} ") == master


@pytest.mark.parametrize(
    "master", ["", "bogus://x", "spark://m", "m:7077", "local[0]", "local[]", "yarn cluster"]
)
def test_spark_master_refuses_the_rest(master):
    with pytest.raises(ValueError, match=r"expected local, local\[\*\]"):
        parse_spark_master(master)


def test_kafka_listener_is_off_by_default_and_read_from_flag_env_and_file(tmp_path):
    assert resolved()["kafka_listener"] is None
    assert resolved("--kafka-listener", "0.0.0.0:9092")["kafka_listener"] == "0.0.0.0:9092"
    env = {"SHARECOORD_KAFKA_LISTENER": "[::1]:9092"}
    assert resolved(env=env)["kafka_listener"] == "[::1]:9092"
    file = config_file(tmp_path, 'kafka_listener = "127.0.0.1:19092"\n')
    assert resolved(file=file)["kafka_listener"] == "127.0.0.1:19092"
    # An empty value unsets it, as for the file settings.
    assert resolved(env={"SHARECOORD_KAFKA_LISTENER": ""}, file=file)["kafka_listener"] is None


@pytest.mark.parametrize("text", ["9092", "host:", "::1:9092", "h:99999"])
def test_a_bad_kafka_listener_is_refused_naming_it(text):
    with pytest.raises(ConfigError, match="kafka_listener"):
        resolved("--kafka-listener", text)


def test_kafka_max_connections_is_1000_unless_set_and_at_least_one(tmp_path):
    assert resolved()["kafka_max_connections"] == 1000
    assert resolved("--kafka-max-connections", "5")["kafka_max_connections"] == 5
    env = {"SHARECOORD_KAFKA_MAX_CONNECTIONS": "7"}
    assert resolved(env=env)["kafka_max_connections"] == 7
    file = config_file(tmp_path, "kafka_max_connections = 9\n")
    assert resolved(file=file)["kafka_max_connections"] == 9
    with pytest.raises(ConfigError, match=r"kafka_max_connections.*must be >= 1"):
        resolved("--kafka-max-connections", "0")
