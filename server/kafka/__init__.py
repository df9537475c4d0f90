"""The Kafka transport (docs/api.md#the-kafka-listener): Kafka's binary protocol over a
``server.node.Node``."""
