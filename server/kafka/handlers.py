"""What the Kafka listener answers to each request (docs/api.md#the-kafka-listener).

``KafkaApi.handle`` takes one request frame of a connection and returns either the whole
answer frame at once (ApiVersions, FindCoordinator, SASL, empty share-group requests) or
an awaitable of it (the five RPCs, which wait for durability). It raises ``CloseConnection``
where Kafka closes the connection instead of answering: an unknown apiKey, an unsupported
version of any API but ApiVersions, a malformed body, a body over the limits, a request
other than ApiVersions and SASL before authentication, a failed authentication.

The five RPCs run exactly as over HTTP: decoded into ``protocol.messages`` Structs,
``protocol.codec.prepare_request``, then ``service.handle``, which answers once what the
answer shows is durable.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from protocol import errors
from protocol import kafka_control as control
from protocol import kafka_messages as km
from protocol import kafka_wire as wire
from protocol.codec import BodyError, Limits, check_coordinator_keys, prepare_request
from protocol.kafka_wire import Reader, WireError
from protocol.messages import FindCoordinatorRequest, Rpc, ShareGroupStateResponse
from protocol.sasl import SaslFailed
from server.cluster import ClusterMap
from server.kafka.auth import KafkaAuth, SaslSession
from server.metric_families import CounterChild, HistogramChild
from server.metrics import ShareCoordinatorMetrics
from server.offload import OFFLOAD_BODY_BYTES, Offload
from server.service import CoordinatorService
from server.turns import InOrder, Place

_log = logging.getLogger("sharecoord.kafka")

API_NAMES = {
    km.FIND_COORDINATOR: "FindCoordinator",
    km.SASL_HANDSHAKE: "SaslHandshake",
    km.API_VERSIONS: "ApiVersions",
    km.SASL_AUTHENTICATE: "SaslAuthenticate",
    83: "InitializeShareGroupState",
    84: "ReadShareGroupState",
    85: "WriteShareGroupState",
    86: "DeleteShareGroupState",
    87: "ReadShareGroupStateSummary",
}
_BEFORE_AUTHENTICATION = frozenset({km.API_VERSIONS, km.SASL_HANDSHAKE, km.SASL_AUTHENTICATE})
_NO_NODE = (-1, "", -1)


class CloseConnection(Exception):
    """Kafka closes the connection here; ``reason`` labels the metric, the message is
    logged at info with the peer, throttled (``server.kafka.connection``): it is the
    client's doing, not a bug. ``answer``, when set, is sent before closing (a failed
    authentication says why)."""

    def __init__(self, reason: str, message: str, answer: bytes | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.answer = answer


Answer = bytes | Coroutine[Any, Any, bytes]


class KafkaApi:
    """The request handlers, shared by every connection of one listener."""

    def __init__(
        self,
        service: Callable[[], CoordinatorService],
        cluster: Callable[[], ClusterMap],
        metrics: ShareCoordinatorMetrics,
        limits: Limits,
        auth: KafkaAuth,
        node_id: int,
        single_node: bool,
        offload: Offload | None = None,
    ) -> None:
        self._service = service
        self._offload = offload or Offload()
        self._cluster = cluster
        self._metrics = metrics
        self._limits = limits
        self.auth = auth
        self._node_id = node_id
        self._single_node = single_node
        self.advertised: tuple[str, int] = ("", -1)  # the bound address, once listening
        self._counters: dict[tuple[int, int, str], CounterChild] = {}
        self._latencies: dict[int, HistogramChild] = {}

    # --- metrics: label children looked up once each ----------------------------------

    def count(self, api_key: int, version: int, outcome: str) -> None:
        """Count a request. Its labels are never what the client chose: an apiKey we do
        not serve is ``unknown``, a version outside the API's range ``unsupported``, so
        the series are at most the served (api, version) pairs, plus one of each kind,
        times the outcomes, whatever a client sends, authenticated or not."""
        key = (api_key, version, outcome)
        child = self._counters.get(key)
        if child is None:
            supported = km.SUPPORTED.get(api_key)
            if supported is None:
                self._metrics.kafka_requests.labels("unknown", "unknown", outcome).inc()
                return
            name = API_NAMES[api_key]
            if not supported[0] <= version <= supported[1]:
                self._metrics.kafka_requests.labels(name, "unsupported", outcome).inc()
                return
            # Only served versions are cached: a client's choice must not grow this.
            child = self._counters[key] = self._metrics.kafka_requests.labels(
                name, str(version), outcome
            )
        child.inc()

    def latency(self, api_key: int) -> HistogramChild:
        child = self._latencies.get(api_key)
        if child is None:
            child = self._latencies[api_key] = self._metrics.kafka_latency.labels(
                API_NAMES[api_key]
            )
        return child

    # --- dispatch ---------------------------------------------------------------------

    def handle(self, frame: bytes, session: SaslSession, order: InOrder | None = None) -> Answer:
        api_key, version = wire.peek_api(frame)
        supported = km.SUPPORTED.get(api_key)
        if supported is None:
            self.count(api_key, version, "closed")
            raise CloseConnection("unsupported", f"unknown apiKey {api_key}")
        if api_key == km.API_VERSIONS:
            return self._api_versions(frame, version)
        if not supported[0] <= version <= supported[1]:
            self.count(api_key, version, "closed")
            raise CloseConnection(
                "unsupported", f"{API_NAMES[api_key]} v{version} is not supported"
            )
        if not session.authenticated and api_key not in _BEFORE_AUTHENTICATION:
            self.count(api_key, version, "closed")
            raise CloseConnection(
                "unauthenticated", f"{API_NAMES[api_key]} before SASL authentication"
            )
        reader = Reader(frame)
        try:
            header_version = km.request_header_version(api_key, version)
            correlation_id = wire.skip_request_header(reader, header_version)
            rpc = km.RPCS.get(api_key)
            if rpc is not None and len(frame) > OFFLOAD_BODY_BYTES:
                # Decoding it would hold the loop: the request decodes off it, and counts
                # itself once it knows whether it was well-formed.
                return self._serve_large(rpc, version, correlation_id, reader, order)
            if rpc is not None:
                request = self._decode_state_request(rpc, version, reader)
                if request is None:
                    answer: Answer = self._empty_answer(rpc, version, correlation_id)
                else:
                    answer = self._serve(rpc, version, correlation_id, request, order)
            elif api_key == km.FIND_COORDINATOR:
                answer = self._find_coordinator(version, correlation_id, reader)
            elif api_key == km.SASL_HANDSHAKE:
                answer = self._sasl_handshake(correlation_id, reader, session)
            else:
                answer = self._sasl_authenticate(version, correlation_id, reader, session)
        except WireError as exc:
            self.count(api_key, version, "closed")
            raise CloseConnection("malformed", f"{API_NAMES[api_key]} v{version}: {exc}") from None
        self.count(api_key, version, "ok")
        return answer

    def _reply(self, api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
        header = wire.response_header(correlation_id, km.response_header_version(api_key, version))
        return wire.frame(header, body)

    # --- ApiVersions --------------------------------------------------------------------

    def _api_versions(self, frame: bytes, version: int) -> bytes:
        reader = Reader(frame)
        low, high = km.SUPPORTED[km.API_VERSIONS]
        try:
            header = wire.read_request_header(
                reader, km.request_header_version(km.API_VERSIONS, min(version, high))
            )
            if not low <= version <= high:
                # Kafka answers a version it does not know with a v0 body naming its range
                # (the body is not read: its layout is unknown).
                self.count(km.API_VERSIONS, version, "unsupported_version")
                return self._reply(
                    km.API_VERSIONS, 0, header.correlation_id, control.unsupported_api_versions()
                )
            valid = control.decode_api_versions(version, reader)
        except WireError as exc:
            self.count(km.API_VERSIONS, version, "closed")
            raise CloseConnection("malformed", f"ApiVersions v{version}: {exc}") from None
        code = errors.NONE if valid else errors.INVALID_REQUEST
        self.count(km.API_VERSIONS, version, "ok")
        body = control.encode_api_versions(version, code, None if valid else [])
        return self._reply(km.API_VERSIONS, version, header.correlation_id, body)

    # --- FindCoordinator ----------------------------------------------------------------

    def _find_coordinator(self, version: int, correlation_id: int, reader: Reader) -> Answer:
        query = control.decode_find_coordinator(version, reader)
        reader.expect_end()
        try:
            check_coordinator_keys(query.keys, self._limits)
        except BodyError as exc:
            raise WireError(str(exc)) from None
        if query.key_type == control.SHARE_KEY and version >= control.MIN_SHARE_KEY_VERSION:
            return self._share_coordinators(version, correlation_id, query.keys)
        answers = [self._coordinator(version, query.key_type, key) for key in query.keys]
        body = control.encode_find_coordinator(version, answers)
        return self._reply(km.FIND_COORDINATOR, version, correlation_id, body)

    async def _share_coordinators(
        self, version: int, correlation_id: int, keys: list[str]
    ) -> bytes:
        service = self._service()
        found = await service.find_coordinator(FindCoordinatorRequest(keys), kafka=True)
        if service.leased:
            # The leaders table named each leader's Kafka listener already.
            answers = [
                control.Coordinator(r.key, r.node_id, r.host, r.port, r.error_code, r.error_message)
                for r in found.coordinators
            ]
        else:
            answers = [self._share_coordinator(r) for r in found.coordinators]
        body = control.encode_find_coordinator(version, answers)
        return self._reply(km.FIND_COORDINATOR, version, correlation_id, body)

    def _coordinator(self, version: int, key_type: int, key: str) -> control.Coordinator:
        """The answer to a key that is not a share key we can look up."""
        if key_type == control.SHARE_KEY:
            # Kafka: a share key needs v6 (KIP-932).
            code, message = errors.INVALID_REQUEST, "Share coordinator keys need version 6"
        elif key_type in (control.GROUP_KEY, control.TRANSACTION_KEY):
            code = errors.COORDINATOR_NOT_AVAILABLE
            message = "sharecoord coordinates share-group state only (key type 2)"
        else:
            code, message = errors.INVALID_REQUEST, f"Unknown coordinator type {key_type}"
        return control.Coordinator(key, *_NO_NODE, code, message)

    def _share_coordinator(self, result: Any) -> control.Coordinator:
        if result.error_code:
            return control.Coordinator(
                result.key, *_NO_NODE, result.error_code, result.error_message
            )
        if self._single_node:
            host, port = self.advertised
            return control.Coordinator(result.key, self._node_id, host, port, 0, None)
        node = self._cluster().node(result.node_id)
        if node.kafka_port is None:
            return control.Coordinator(
                result.key,
                *_NO_NODE,
                errors.COORDINATOR_NOT_AVAILABLE,
                f"node {node.id} has no kafka_port in the cluster file",
            )
        return control.Coordinator(result.key, node.id, node.host, node.kafka_port, 0, None)

    # --- SASL ---------------------------------------------------------------------------

    def _sasl_handshake(self, correlation_id: int, reader: Reader, session: SaslSession) -> bytes:
        mechanism = control.decode_sasl_handshake(1, reader)
        reader.expect_end()
        mechanisms = self.auth.mechanisms
        if session.authenticated or session.mechanism is not None:
            # Kafka: SASL outside the handshake phase is an illegal state.
            code = control.ILLEGAL_SASL_STATE
            body = control.encode_sasl_handshake(code, mechanisms)
            if session.mechanism is not None and not session.authenticated:
                raise CloseConnection(
                    "authentication_failed",
                    "a second SaslHandshake",
                    self._reply(km.SASL_HANDSHAKE, 1, correlation_id, body),
                )
            return self._reply(km.SASL_HANDSHAKE, 1, correlation_id, body)
        if not session.handshake(mechanism):
            body = control.encode_sasl_handshake(control.UNSUPPORTED_SASL_MECHANISM, mechanisms)
            raise CloseConnection(
                "authentication_failed",
                f"SASL mechanism {mechanism!r} is not enabled",
                self._reply(km.SASL_HANDSHAKE, 1, correlation_id, body),
            )
        body = control.encode_sasl_handshake(errors.NONE, mechanisms)
        return self._reply(km.SASL_HANDSHAKE, 1, correlation_id, body)

    def _sasl_authenticate(
        self, version: int, correlation_id: int, reader: Reader, session: SaslSession
    ) -> bytes:
        token = control.decode_sasl_authenticate(version, reader)
        reader.expect_end()

        def reply(code: int, message: str | None, answer: bytes = b"") -> bytes:
            body = control.encode_sasl_authenticate(version, code, message, answer)
            return self._reply(km.SASL_AUTHENTICATE, version, correlation_id, body)

        if session.authenticated:
            return reply(control.ILLEGAL_SASL_STATE, "SaslAuthenticate after authentication")
        if session.mechanism is None:
            raise CloseConnection(
                "authentication_failed",
                "SaslAuthenticate before SaslHandshake",
                reply(control.ILLEGAL_SASL_STATE, "SaslAuthenticate before SaslHandshake"),
            )
        try:
            answer = session.authenticate(token)
        except SaslFailed as exc:
            raise CloseConnection(
                "authentication_failed",
                f"{session.mechanism}: {exc}",
                reply(control.SASL_AUTHENTICATION_FAILED, str(exc)),
            ) from None
        if session.authenticated:
            _log.debug("authenticated %s with %s", session.user, session.mechanism)
        return reply(errors.NONE, None, answer)

    # --- the five RPCs ------------------------------------------------------------------

    def _decode_state_request(self, rpc: Rpc, version: int, reader: Reader) -> Any:
        """The request, checked at the edge; None for one with nothing in it. Raises
        WireError."""
        limits = self._limits
        budget = km.Budget(limits.max_entries_per_request, limits.max_state_batches_per_entry)
        request = km.decode_state_request(rpc, version, reader, budget)
        try:
            # Before the empty check: a group id over the limit closes the connection
            # whatever else the request holds, as on HTTP it refuses the body.
            prepare_request(rpc, request, limits)
        except BodyError as exc:  # topic ids are always well-formed here; entries were counted
            raise WireError(str(exc)) from None
        if km.is_empty_request(request):
            return None
        return request

    def _empty_answer(self, rpc: Rpc, version: int, correlation_id: int) -> bytes:
        # Kafka's share coordinator answers these with an empty response, doing nothing.
        return km.encode_state_response(rpc, version, correlation_id, ShareGroupStateResponse([]))

    async def _serve_large(
        self,
        rpc: Rpc,
        version: int,
        correlation_id: int,
        reader: Reader,
        order: InOrder | None,
    ) -> bytes:
        started = time.perf_counter()
        place = order.enter() if order is not None else None
        try:
            try:
                request = await self._offload(
                    functools.partial(self._decode_state_request, rpc, version, reader)
                )
            except WireError as exc:
                self.count(rpc.api_key, version, "closed")
                raise CloseConnection(
                    "malformed", f"{API_NAMES[rpc.api_key]} v{version}: {exc}"
                ) from None
            self.count(rpc.api_key, version, "ok")
            if request is None:
                return self._empty_answer(rpc, version, correlation_id)
            return await self._answer(rpc, version, correlation_id, request, started, place)
        finally:
            if place is not None:
                place.leave()

    async def _serve(
        self, rpc: Rpc, version: int, correlation_id: int, request: Any, order: InOrder | None
    ) -> bytes:
        started = time.perf_counter()
        place = order.enter() if order is not None else None
        try:
            return await self._answer(rpc, version, correlation_id, request, started, place)
        finally:
            if place is not None:
                place.leave()

    async def _answer(
        self,
        rpc: Rpc,
        version: int,
        correlation_id: int,
        request: Any,
        started: float,
        place: Place | None,
    ) -> bytes:
        try:
            response = await self._service().handle(rpc, request, place)
            answer = km.encode_state_response(rpc, version, correlation_id, response)
        except Exception:
            # A bug: logged with its trace; the connection closes (Kafka has no per-request
            # error answer for the unexpected).
            _log.exception("Kafka listener: %s failed", API_NAMES[rpc.api_key])
            raise
        self.latency(rpc.api_key).observe(time.perf_counter() - started)
        return answer
