"""The OpenAPI 3.1 document of the JSON API, generated (issue #11).

Its schemas are msgspec's JSON Schema of the declarations the decoders use
(``protocol.messages``, ``protocol.widths``), its operations the route table
``create_app`` registers (``server.http.app.ROUTES``): it describes what the daemon decodes
and serves, not a copy of it.
``python -m server.http.openapi`` prints it as YAML; ``make openapi`` writes ``openapi.yaml``,
and ``tests/server/test_openapi_current.py`` fails while that file is stale.

msgspec's output is changed only where it falls short of the document: generic
instantiations get readable names, docstrings written for the code's readers stay out,
and the fields msgspec types too loosely (error codes, status words) get their values.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from protocol import errors
from protocol.messages import ErrorBody
from server.config import SERVE_SETTINGS
from server.http.app import ROUTES
from server.http.routes import Route
from server.runtime import Status

SCHEMAS = "#/components/schemas/"
RESPONSES = "#/components/responses/"
JSON = "application/json"

# auth_middleware checks the token on exactly these paths.
GUARDED_PREFIX = "/v1/"

DESCRIPTION = """\
The JSON form of sharecoord's HTTP API. The contract itself is docs/api.md; this
document restates it for tools, generated from the daemon's own declarations by
`make openapi`.

Every body shown here may also be sent as msgpack (`Content-Type: application/msgpack`);
the answer comes in the request's format unless `Accept` asks for the other one.

Every answer other than 200 carries `{"error_code", "error_message"}`. A body is refused
whole, with nothing applied, when it cannot be used: 400 when it does not parse, has a
field of the wrong type or an integer outside its field's width, lacks a required field
or exceeds a limit; 413 when it is larger than --max-body-bytes; 415 when its
Content-Type is neither JSON nor msgpack, or it comes with a Content-Encoding; 501,
unread, when it comes with a Transfer-Encoding other than chunked alone. A body
that is well-formed but holds one bad partition entry fails that entry alone: its
result carries code 42, and the other entries run. Fields the API does not know are
ignored.

An integer is written as an integer: `2.0` where one belongs is a 400. JSON Schema's
`integer` is looser and admits it.

A daemon started with --auth-token-file wants `Authorization: Bearer <token>` on every
`/v1/` path and answers 401 (code 31) without it; /healthz, /readyz and /metrics need
no token.
"""

# Answers whose body is the shared error body: the component's name, what it means.
REFUSALS: dict[int, tuple[str, str]] = {
    400: (
        "BadRequest",
        f"The body or a query parameter is malformed (code {errors.INVALID_REQUEST}); "
        "nothing was applied.",
    ),
    401: (
        "Unauthorized",
        f"The bearer token is missing or wrong (code {errors.CLUSTER_AUTHORIZATION_FAILED}).",
    ),
    404: (
        "NotFound",
        f"No state for this key, or no such topic (code {errors.UNKNOWN_TOPIC_OR_PARTITION}).",
    ),
    408: (
        "Timeout",
        f"The body did not arrive within --request-timeout-s (code {errors.INVALID_REQUEST}).",
    ),
    413: (
        "TooLarge",
        f"The body is larger than --max-body-bytes (code {errors.INVALID_REQUEST}).",
    ),
    415: (
        "UnsupportedMediaType",
        "The Content-Type is neither JSON nor msgpack, or the body is compressed "
        f"(code {errors.INVALID_REQUEST}).",
    ),
    417: (
        "ExpectationFailed",
        f"An Expect header other than 100-continue (code {errors.INVALID_REQUEST}).",
    ),
    409: (
        "NotOnThisStore",
        "What this node's state store does not keep: the cluster's leases on a node of the "
        "data directory, the topic catalog on the PostgreSQL store "
        f"(code {errors.INVALID_REQUEST}).",
    ),
    421: (
        "NotCoordinator",
        f"Another node owns the key's state partition (code {errors.NOT_COORDINATOR}).",
    ),
    501: (
        "NotImplemented",
        "A Transfer-Encoding other than chunked alone; the body is not read "
        f"(code {errors.INVALID_REQUEST}).",
    ),
    503: (
        "Unavailable",
        f"The state partition is loading (code {errors.COORDINATOR_LOAD_IN_PROGRESS}) "
        f"or failed, or the PostgreSQL store cannot be reached "
        f"(code {errors.COORDINATOR_NOT_AVAILABLE}).",
    ),
}

# The generic instantiations, by msgspec's title ("TopicRequest[WritePartition]"): the
# suffix after the stem of the entry type ("Write").
GENERIC_NAMES = {
    "ShareGroupStateRequest": "Request",
    "TopicRequest": "RequestTopic",
    "ShareGroupStateResponse": "Response",
    "TopicResult": "ResponseTopic",
}
# Initialize, write and delete answer with the same results.
SHARED_RESULTS_STEM = "PartitionResults"

ERROR_CODE = "ErrorCode"

# Fields whose declaration says less than the daemon sends: the values it can hold.
FIELD_VALUES: dict[tuple[str, str], dict[str, Any]] = {
    ("Acknowledged", "error_code"): {"const": errors.NONE},
    ("TopicDeleted", "error_code"): {"const": errors.NONE},
    ("PartitionStatus", "status"): {"enum": [status.value for status in Status]},
    # handle_readyz and handle_healthz answer with these words.
    ("ReadinessReport", "status"): {"enum": ["loading", "ready"]},
    ("Health", "status"): {"const": "ok"},
}


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the daemon's JSON API, as plain data."""
    declared = list(dict.fromkeys(_declarations(ROUTES)))
    inline, schemas = msgspec.json.schema_components(
        [ErrorBody, *declared], ref_template=SCHEMAS + "{name}"
    )
    renamed = _readable_names(schemas)
    schemas = {renamed.get(name, name): schema for name, schema in schemas.items()}
    schemas = _rewrite_refs(schemas, renamed)
    inline = _rewrite_refs(list(inline), renamed)
    of = dict(zip(declared, inline[1:], strict=True))
    _tidy(schemas)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "sharecoord",
            "version": importlib.metadata.version("sharecoord"),
            "summary": "A standalone share coordinator for Kafka KIP-932 share groups.",
            "description": DESCRIPTION,
        },
        "servers": [{"url": f"http://{_default('listen')}"}],
        "security": [{"bearer": []}],
        "paths": _paths(ROUTES, of.__getitem__),
        "components": {
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The token of --auth-token-file, when the daemon has one.",
                }
            },
            "responses": {
                name: {
                    "description": description,
                    "content": {JSON: {"schema": inline[0]}},
                }
                for name, description in REFUSALS.values()
            },
            "schemas": dict(sorted(schemas.items())),
        },
    }


def _declarations(routes: Iterable[Route]) -> Iterable[Any]:
    for route in routes:
        if route.body is not None:
            yield route.body
        for param in route.params:
            yield param.declared
        for answer in route.answers:
            yield answer.body


def _readable_names(schemas: dict[str, Any]) -> dict[str, str]:
    """msgspec's component names of the generic instantiations, and ours."""
    renamed = {}
    for name, schema in schemas.items():
        title = re.fullmatch(r"(\w+)\[(\w+)\]", schema.get("title", ""))
        if title is None:
            continue
        generic, entry = title.groups()
        if generic not in GENERIC_NAMES:
            raise ValueError(f"server.http.openapi: no readable name for {title[0]}: add one")
        stem = entry.removesuffix("PartitionResult").removesuffix("Partition")
        renamed[name] = (stem or SHARED_RESULTS_STEM) + GENERIC_NAMES[generic]
    return renamed


def _rewrite_refs(node: Any, renamed: dict[str, str]) -> Any:
    if isinstance(node, list):
        return [_rewrite_refs(item, renamed) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _rewrite_refs(value, renamed) for key, value in node.items()}
    ref = out.get("$ref")
    if isinstance(ref, str) and ref.startswith(SCHEMAS):
        name = ref.removeprefix(SCHEMAS)
        out["$ref"] = SCHEMAS + renamed.get(name, name)
    return out


def _tidy(schemas: dict[str, Any]) -> None:
    fields = {
        (name, field) for name, schema in schemas.items() for field in schema.get("properties", {})
    }
    unused = set(FIELD_VALUES) - fields
    if unused:
        raise ValueError(
            f"server.http.openapi: FIELD_VALUES names no such fields: {sorted(unused)}"
        )
    for name, schema in schemas.items():
        # The component's name is its title; a Struct's docstring speaks to the code's
        # readers (and its edits should not make this document stale).
        schema.pop("title", None)
        schema.pop("description", None)
        properties = schema.get("properties", {})
        if "error_code" in properties:
            properties["error_code"] = {"$ref": SCHEMAS + ERROR_CODE}
        for field, values in properties.items():
            properties[field] = FIELD_VALUES.get((name, field), values)
    schemas[ERROR_CODE] = {
        "description": "Kafka's error code (docs/api.md#error-codes): "
        + ", ".join(f"{code} {error.name}" for code, error in sorted(errors.ERRORS.items()))
        + ".",
        "type": "integer",
        "enum": sorted(errors.ERRORS),
    }


def _default(setting: str) -> Any:
    return next(s.default for s in SERVE_SETTINGS if s.name == setting)


# --- paths ----------------------------------------------------------------------------


def _paths(routes: Iterable[Route], schema_of: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for route in routes:
        item = paths.setdefault(route.path, {})
        item[route.method.lower()] = _operation(route, schema_of)
        if route.method == "GET":
            item["head"] = _head(route, schema_of)
    return paths


def _statuses(route: Route) -> list[int]:
    # Refused before any handler: an Expect aiohttp does not know, a transfer coding
    # other than chunked (server.http.connection).
    shared = {417, 501}
    if route.path.startswith(GUARDED_PREFIX):
        shared.add(401)
    if route.body is not None:
        shared |= {400, 408, 413, 415}  # what reading and decoding a body may refuse
    answered = {answer.status for answer in route.answers}
    return sorted(answered | shared | set(route.refusals))


def _common(route: Route, schema_of: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    operation: dict[str, Any] = {}
    if not route.path.startswith(GUARDED_PREFIX):
        operation["security"] = []
    if route.params:
        operation["parameters"] = [
            {
                "name": param.name,
                "in": param.where,
                "required": True,
                "schema": schema_of(param.declared),
            }
            for param in route.params
        ]
    return operation


def _operation(route: Route, schema_of: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "operationId": route.operation_id,
        "summary": route.summary,
        **_common(route, schema_of),
    }
    if route.body is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {JSON: {"schema": schema_of(route.body)}},
        }
    answers = {answer.status: answer for answer in route.answers}
    responses: dict[str, Any] = {}
    for status in _statuses(route):
        answer = answers.get(status)
        if answer is None:
            responses[str(status)] = {"$ref": RESPONSES + REFUSALS[status][0]}
        else:
            responses[str(status)] = {
                "description": answer.description,
                "content": {answer.media_type: {"schema": schema_of(answer.body)}},
            }
    operation["responses"] = responses
    return operation


def _head(route: Route, schema_of: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """The HEAD aiohttp adds to a GET: the same answers without their bodies."""
    answers = {answer.status: answer.description for answer in route.answers}
    return {
        "operationId": _head_operation_id(route.operation_id),
        "summary": f"GET {route.path} without the body (aiohttp answers HEAD on every GET).",
        **_common(route, schema_of),
        "responses": {
            str(status): {"description": answers.get(status) or REFUSALS[status][1]}
            for status in _statuses(route)
        },
    }


def _head_operation_id(get: str) -> str:
    """The GET's id with its verb, if it has one, replaced: getAdminState, headAdminState."""
    noun = re.sub(r"^[a-z]+(?=[A-Z])", "", get)
    return "head" + noun[0].upper() + noun[1:]


# --- YAML -----------------------------------------------------------------------------


def main() -> None:
    """Print the document as YAML (PyYAML is a dev dependency: the daemon never needs it)."""
    import yaml  # noqa: PLC0415

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True  # a schema used twice is written twice: no anchors to chase

        def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
            super().increase_indent(flow, False)  # list items indented under their key

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    def sequence(dumper: yaml.SafeDumper, value: list[Any]) -> yaml.SequenceNode:
        # Lists of plain values (required fields, enums) read best on one line.
        flow = all(not isinstance(item, (dict, list)) for item in value)
        return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=flow)

    Dumper.add_representer(str, text)
    Dumper.add_representer(list, sequence)
    sys.stdout.write(
        "# Generated by `make openapi` (python -m server.http.openapi) from the schema\n"
        "# declarations (protocol/messages.py) and the route table (server/http/app.py):\n"
        "# change those, then regenerate; do not edit this file by hand.\n"
    )
    yaml.dump(
        openapi_document(),
        sys.stdout,
        Dumper=Dumper,
        sort_keys=False,
        allow_unicode=True,
        width=100,
    )


if __name__ == "__main__":
    main()
