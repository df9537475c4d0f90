"""The cluster map and find-coordinator (docs/api.md#the-cluster-file,
docs/api.md#find-coordinator)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from protocol.routing import partition_for
from server.cluster import (
    ClusterError,
    ClusterMap,
    Node,
    check_partition_count,
    find_coordinator,
    format_partitions,
    load_cluster,
)

TWO_NODES = """
num_partitions = 50
[[node]]
id = 0
host = "10.0.0.1"
port = 9095
partitions = ["0-24"]
[[node]]
id = 1
host = "10.0.0.2"
port = 9096
partitions = ["25-48", 49]
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "cluster.toml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def cluster_with(tmp_path: Path, num_partitions: int, *nodes: str) -> str:
    body = f"num_partitions = {num_partitions}\n"
    for i, node in enumerate(nodes):
        body += f'[[node]]\nid = {i}\nhost = "h{i}"\nport = 9095\n{node}\n'
    return write(tmp_path, body)


def test_valid_file_maps_every_partition_to_its_node(tmp_path):
    cluster = load_cluster(write(tmp_path, TWO_NODES))
    assert cluster.num_partitions == 50
    assert cluster.nodes == (
        Node(0, "10.0.0.1", 9095, frozenset(range(25))),
        Node(1, "10.0.0.2", 9096, frozenset(range(25, 50))),
    )
    assert cluster.owner(0).id == 0
    assert cluster.owner(24).id == 0
    assert cluster.owner(25).id == 1
    assert cluster.owner(49) == cluster.node(1)
    assert cluster.owned_by(1) == frozenset(range(25, 50))


def test_owner_of_a_partition_outside_the_map_is_refused(tmp_path):
    cluster = load_cluster(write(tmp_path, TWO_NODES))
    with pytest.raises(ValueError, match=r"50 is outside 0\.\.49"):
        cluster.owner(50)
    with pytest.raises(ValueError, match="outside"):
        cluster.owner(-1)


def test_unknown_node_id_is_a_key_error_naming_the_known_ids(tmp_path):
    cluster = load_cluster(write(tmp_path, TWO_NODES))
    with pytest.raises(KeyError, match=r"no node with id 7 .*ids: 0, 1"):
        cluster.node(7)
    with pytest.raises(KeyError):
        cluster.owned_by(7)


def test_missing_partition_is_refused_with_the_missing_list(tmp_path):
    path = cluster_with(tmp_path, 10, 'partitions = ["0-3"]', "partitions = [5, 6, 8]")
    with pytest.raises(ClusterError) as info:
        load_cluster(path)
    message = str(info.value)
    assert path in message
    assert "partition(s) 4, 7, 9 owned by no node" in message


def test_double_ownership_is_refused_naming_both_nodes(tmp_path):
    path = cluster_with(tmp_path, 10, 'partitions = ["0-5"]', 'partitions = ["4-9"]')
    with pytest.raises(ClusterError, match=r"partition\(s\) 4-5 owned by nodes 0 and 1"):
        load_cluster(path)


def test_missing_and_double_are_reported_together(tmp_path):
    path = cluster_with(tmp_path, 10, 'partitions = ["0-5"]', 'partitions = ["5-8"]')
    with pytest.raises(ClusterError) as info:
        load_cluster(path)
    assert "partition(s) 9 owned by no node" in str(info.value)
    assert "partition(s) 5 owned by nodes 0 and 1" in str(info.value)


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ('"5-3"', "reversed"),
        ('"0-10"', "goes past the last partition 9"),
        ('"a-b"', "not a range"),
        ('"0-"', "not a range"),
        ('"5"', "not a range"),
        ("10", "partition 10 is outside 0..9"),
        ("-1", "partition -1 is outside 0..9"),
        ("1.5", "neither an integer nor"),
        ("true", "neither an integer nor"),
    ],
)
def test_bad_range_is_refused(tmp_path, entry, problem):
    path = cluster_with(tmp_path, 10, f"partitions = [{entry}]")
    with pytest.raises(ClusterError, match=problem):
        load_cluster(path)


def test_range_with_spaces_and_single_partition_range_are_accepted(tmp_path):
    path = cluster_with(tmp_path, 3, 'partitions = [" 0 - 1 ", "2-2"]')
    assert load_cluster(path).owned_by(0) == frozenset({0, 1, 2})


def test_partition_listed_twice_by_one_node_is_refused(tmp_path):
    path = cluster_with(tmp_path, 4, 'partitions = ["0-3", 2]')
    with pytest.raises(ClusterError, match=r"node 0 lists partition\(s\) 2 more than once"):
        load_cluster(path)


def test_duplicate_node_id_is_refused(tmp_path):
    path = write(
        tmp_path,
        """
        num_partitions = 2
        [[node]]
        id = 3
        host = "a"
        port = 1
        partitions = [0]
        [[node]]
        id = 3
        host = "b"
        port = 1
        partitions = [1]
        """,
    )
    with pytest.raises(ClusterError, match="node id 3 is used by more than one node"):
        load_cluster(path)


def test_two_nodes_at_one_address_are_refused(tmp_path):
    path = cluster_with(tmp_path, 2, "partitions = [0]", "partitions = [1]")
    Path(path).write_text(Path(path).read_text().replace('"h1"', '"h0"'))
    with pytest.raises(ClusterError, match="nodes 0 and 1 have the same address h0:9095"):
        load_cluster(path)


@pytest.mark.parametrize("port", ["0", "65536", "-1", '"9095"', "true"])
def test_invalid_port_is_refused(tmp_path, port):
    path = write(
        tmp_path,
        f'num_partitions = 1\n[[node]]\nid = 0\nhost = "h"\nport = {port}\npartitions = [0]\n',
    )
    with pytest.raises(ClusterError, match=r"port must be an integer 1\.\.65535"):
        load_cluster(path)


def test_port_boundaries_1_and_65535_are_accepted(tmp_path):
    path = cluster_with(tmp_path, 2, "partitions = [0]", "partitions = [1]")
    text = Path(path).read_text().replace("port = 9095", "port = 1", 1)
    Path(path).write_text(text.replace("port = 9095", "port = 65535"))
    assert [n.port for n in load_cluster(path).nodes] == [1, 65535]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("num_partitions = 0\n[[node]]\nid=0\nhost='h'\nport=1\npartitions=[]", "num_partitions"),
        ('num_partitions = "5"', "num_partitions must be an integer"),
        # Refused before anything is sized by it (the owners of 10^8 partitions).
        (
            "num_partitions = 100000000\n[[node]]\nid=0\nhost='h'\nport=1\n"
            "partitions=['0-99999999']",
            r"num_partitions must be an integer 1\.\.10000",
        ),
        ("[[node]]\nid=0\nhost='h'\nport=1\npartitions=[0]", "num_partitions is missing"),
        ("num_partitions = 1", r"no \[\[node\]\] tables"),
        ("num_partitions = 1\nnode = 5", r"no \[\[node\]\] tables"),
        ("num_partitions = 1\nnodes = []", "unknown top-level key"),
        ("num_partitions = 1\n[[node]]\nid=0\nhost='h'\nport=1", "missing key.*partitions"),
        ("num_partitions = 1\n[[node]]\nid=0\nhost='h'\nport=1\npartitions=[0]\nrack=1", "rack"),
        ("num_partitions = 1\n[[node]]\nid=-1\nhost='h'\nport=1\npartitions=[0]", "id must be"),
        ("num_partitions = 1\n[[node]]\nid=0\nhost=''\nport=1\npartitions=[0]", "host must"),
        ("num_partitions = 1\n[[node]]\nid=0\nhost='h'\nport=1\npartitions='0'", "a list"),
        ("num_partitions = = 1", "not valid TOML"),
    ],
)
def test_malformed_file_is_refused_naming_the_problem(tmp_path, text, problem):
    path = write(tmp_path, text)
    with pytest.raises(ClusterError, match=problem) as info:
        load_cluster(path)
    assert path in str(info.value)


def test_a_file_that_is_not_utf8_is_refused_naming_it(tmp_path):
    path = tmp_path / "cluster.toml"
    path.write_bytes("num_partitions = 1 # caf\xe9\n".encode("latin-1"))
    with pytest.raises(ClusterError, match=r"cluster\.toml: not valid TOML: not UTF-8"):
        load_cluster(str(path))


def test_unreadable_file_is_refused_naming_it(tmp_path):
    with pytest.raises(ClusterError, match=r"nope\.toml: cannot read it"):
        load_cluster(str(tmp_path / "nope.toml"))


def test_a_node_may_own_no_partitions(tmp_path):
    path = cluster_with(tmp_path, 2, 'partitions = ["0-1"]', "partitions = []")
    assert load_cluster(path).owned_by(1) == frozenset()


def test_cluster_map_checks_ownership_when_built_directly():
    with pytest.raises(ClusterError, match="exactly one node"):
        ClusterMap(3, (Node(0, "h", 1, frozenset({0, 1})),))
    with pytest.raises(ClusterError, match=r"outside 0\.\.2"):
        ClusterMap(3, (Node(0, "h", 1, frozenset({0, 1, 2, 3})),))


def test_single_node_default_owns_every_partition_at_the_listen_address():
    cluster = ClusterMap.single(4, "127.0.0.1", 9095, 50)
    assert cluster.nodes == (Node(4, "127.0.0.1", 9095, frozenset(range(50))),)
    assert {cluster.owner(p).id for p in range(50)} == {4}


def test_partition_count_mismatch_is_refused_with_both_numbers():
    cluster = ClusterMap.single(0, "h", 1, 60)
    check_partition_count(cluster, 60)
    with pytest.raises(ClusterError, match="num_partitions = 60 but --partitions is 50"):
        check_partition_count(cluster, 50)


def test_find_coordinator_spec_example_key_is_state_partition_20_of_50(tmp_path):
    cluster = load_cluster(write(tmp_path, TWO_NODES))
    [result] = find_coordinator(cluster, ["group1:AAAAAAAAAAAAAAAAAAAAAQ:0"])
    assert result.key == "group1:AAAAAAAAAAAAAAAAAAAAAQ:0"
    assert result.state_partition == 20
    assert (result.node_id, result.host, result.port) == (0, "10.0.0.1", 9095)
    assert (result.error_code, result.error_message) == (0, None)


def test_find_coordinator_routes_to_the_owner_of_the_hashed_partition(tmp_path):
    cluster = load_cluster(write(tmp_path, TWO_NODES))
    keys = [f"g{i}:AAAAAAAAAAAAAAAAAAAAAQ:{i}" for i in range(40)]
    for i, result in enumerate(find_coordinator(cluster, keys)):
        expected = partition_for(f"g{i}", "AAAAAAAAAAAAAAAAAAAAAQ", i, 50)
        assert result.state_partition == expected
        assert result.node_id == (0 if expected < 25 else 1)
        assert result.port == (9095 if expected < 25 else 9096)


def test_find_coordinator_reformats_the_topic_id_and_partition_before_hashing():
    # A padded topic id and a '+'-signed partition hash as the canonical key; the group
    # id is hashed as given, padding and all, as the RPCs route it (docs/semantics.md §1.2).
    cluster = ClusterMap.single(0, "h", 1, 50)
    keys = ["group1:AAAAAAAAAAAAAAAAAAAAAQ==:+0", " group1 :AAAAAAAAAAAAAAAAAAAAAQ:0"]
    reformatted, padded = find_coordinator(cluster, keys)
    assert (reformatted.key, reformatted.state_partition) == (keys[0], 20)
    assert padded.key == keys[1]
    assert padded.state_partition == partition_for(" group1 ", "AAAAAAAAAAAAAAAAAAAAAQ", 0, 50)
    assert padded.state_partition != 20


@pytest.mark.parametrize(
    "key",
    [
        "",
        "group1",
        "group1:AAAAAAAAAAAAAAAAAAAAAQ",
        " :AAAAAAAAAAAAAAAAAAAAAQ:0",
        "g:short:0",
        "g:AAAAAAAAAAAAAAAAAAAAAQ:x",
        "g:AAAAAAAAAAAAAAAAAAAAAQ:0:extra",
        "g:AAAAAAAAAAAAAAAAAAAAAQ:2147483648",
    ],
)
def test_find_coordinator_bad_key_gets_42_with_minus_one_and_empty_host(key):
    cluster = ClusterMap.single(0, "h", 1, 50)
    [result] = find_coordinator(cluster, [key])
    assert result.key == key
    assert result.error_code == 42
    assert result.error_message
    assert repr(key) in result.error_message
    assert (result.state_partition, result.node_id, result.host, result.port) == (-1, -1, "", -1)


def test_find_coordinator_answers_one_result_per_key_in_order():
    cluster = ClusterMap.single(0, "h", 1, 50)
    keys = ["bad", "group1:AAAAAAAAAAAAAAAAAAAAAQ:0", "bad", "group1:AAAAAAAAAAAAAAAAAAAAAQ:0"]
    results = find_coordinator(cluster, keys)
    assert [r.key for r in results] == keys
    assert [r.error_code for r in results] == [42, 0, 42, 0]
    assert find_coordinator(cluster, []) == []


def test_format_partitions_collapses_runs():
    assert format_partitions([7, 0, 1, 2, 5, 8]) == "0-2, 5, 7-8"
    assert format_partitions([]) == ""


# --- kafka_port: the Kafka listener of a node (docs/api.md#the-cluster-file) ---------------


def test_kafka_port_is_optional_and_read_per_node(tmp_path):
    path = cluster_with(tmp_path, 2, "partitions = [0]\nkafka_port = 9092", "partitions = [1]")
    cluster = load_cluster(path)
    assert [n.kafka_port for n in cluster.nodes] == [9092, None]


@pytest.mark.parametrize(
    ("value", "problem"),
    [("0", "kafka_port must be an integer 1..65535"), ('"9092"', "kafka_port must be"),
     ("65536", "kafka_port must be"), ("9095", "kafka_port and port are both 9095")],
)  # fmt: skip
def test_bad_kafka_port_is_refused(tmp_path, value, problem):
    path = cluster_with(tmp_path, 1, f"partitions = [0]\nkafka_port = {value}")
    with pytest.raises(ClusterError, match=problem):
        load_cluster(path)
