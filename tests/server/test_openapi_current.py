"""Issue #11: openapi.yaml is what ``server.http.openapi`` generates from the schema
declarations and the route table, so a change to either that is not regenerated fails
here, naming where the two differ."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

import server.http.openapi
from server.http.app import ROUTES
from server.http.openapi import openapi_document

OPENAPI = Path(__file__).resolve().parents[2] / "openapi.yaml"


def differences(want: Any, have: Any, at: str = "") -> Iterator[str]:
    """The paths at which two parsed documents differ, outermost first."""
    if isinstance(want, dict) and isinstance(have, dict):
        for key in [*want, *(k for k in have if k not in want)]:
            where = f"{at}/{key}"
            if key not in have:
                yield f"{where}: missing from openapi.yaml"
            elif key not in want:
                yield f"{where}: in openapi.yaml, no longer generated"
            else:
                yield from differences(want[key], have[key], where)
    elif isinstance(want, list) and isinstance(have, list) and len(want) == len(have):
        for i, (w, h) in enumerate(zip(want, have, strict=True)):
            yield from differences(w, h, f"{at}/{i}")
    elif want != have:
        yield f"{at or '/'}: generated {want!r}, openapi.yaml has {have!r}"


def check_current(generated: dict[str, Any], stored: dict[str, Any]) -> None:
    found = list(differences(generated, stored))
    assert not found, (
        "openapi.yaml is stale: run `make openapi` and commit the result. Differences:\n  "
        + "\n  ".join(found[:20])
        + (f"\n  ... and {len(found) - 20} more" if len(found) > 20 else "")
    )


def test_openapi_yaml_is_what_the_declarations_generate():
    check_current(openapi_document(), yaml.safe_load(OPENAPI.read_text()))


def test_a_changed_field_makes_it_stale(monkeypatch):
    class FindCoordinatorRequest(msgspec.Struct):
        keys: list[str]
        limit: int  # a field the stored document has never heard of

    routes = tuple(
        replace(r, body=FindCoordinatorRequest) if r.path == "/v1/find-coordinator" else r
        for r in ROUTES
    )
    monkeypatch.setattr(server.http.openapi, "ROUTES", routes)
    with pytest.raises(AssertionError, match="run `make openapi`") as failed:
        check_current(openapi_document(), yaml.safe_load(OPENAPI.read_text()))
    message = str(failed.value)
    assert "/components/schemas/FindCoordinatorRequest/properties/limit" in message
    assert "/components/schemas/FindCoordinatorRequest/required" in message


def test_a_changed_route_makes_it_stale(monkeypatch):
    routes = tuple(
        replace(r, refusals=(*r.refusals, 408)) if r.path == "/v1/admin/state" else r
        for r in ROUTES
    )
    monkeypatch.setattr(server.http.openapi, "ROUTES", routes)
    with pytest.raises(AssertionError, match="run `make openapi`") as failed:
        check_current(openapi_document(), yaml.safe_load(OPENAPI.read_text()))
    assert "/paths//v1/admin/state/get/responses/408" in str(failed.value)


def test_the_generic_instantiations_have_readable_names():
    schemas = openapi_document()["components"]["schemas"]
    assert {"WriteRequest", "WriteRequestTopic", "ReadResponse", "PartitionResultsResponse"} <= set(
        schemas
    )
    assert not [name for name in schemas if "_" in name or "[" in name]
