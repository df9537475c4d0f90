"""`make kafka-peer`: fetch Kafka's broker, or run one.

    python -m kafka_peer fetch        # copy the jars into the cache (once), print where
    python -m kafka_peer run [--state-partitions N] [--records-per-snapshot N]
                                      # a broker on loopback until Ctrl-C

Exit status 0, or 1 with one line on stderr saying what is missing (Java 17, Maven, a
repository that answers) or why the broker did not start.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading

from kafka_peer.broker import BrokerSettings, PeerUnavailable, fetch, running_broker


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kafka_peer", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("fetch", help="copy the broker's jars into the cache, once")
    run = commands.add_parser("run", help="run a broker on loopback until interrupted")
    run.add_argument("--state-partitions", type=int, default=50)
    run.add_argument("--records-per-snapshot", type=int, default=500)
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            print(f"kafka peer: jars in {fetch()}")
            return 0
        settings = BrokerSettings(args.state_partitions, args.records_per_snapshot)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        with running_broker(settings) as broker:
            print(f"kafka peer: broker on {broker.host}:{broker.port}, log {broker.log_path}")
            sys.stdout.flush()
            with contextlib.suppress(KeyboardInterrupt):
                stop.wait()
        return 0
    except PeerUnavailable as exc:
        print(exc, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
