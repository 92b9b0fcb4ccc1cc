"""Readable answers for request bodies FastAPI cannot read or that are not a JSON object.

FastAPI's own words for these name no cause a client can act on: a body that is not UTF-8, nests
too deep for Python's parser or holds an integer of over 4,300 digits got 400 `http_error` "There
was an error parsing the body"; malformed JSON got `field` "12" (a character offset) and "JSON
decode error"; and a JSON object sent without `Content-Type: application/json` (FastAPI reads
bodies strictly by content type) got "Input should be a valid dictionary or object to extract
fields from" about what is a valid object. Each is answered here as 422 `validation_error` with
`field` "body" and a detail that says what to change (`bench/fuzz_api.py` found them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

BODY_PARSE_FAILURE = "There was an error parsing the body"
"""The detail of FastAPI's 400 for a body its JSON parser raised on (other than a syntax error)."""
_NOT_AN_OBJECT = frozenset({"model_attributes_type", "model_type", "dict_type"})
JSON_TYPES: Mapping[type, str] = {
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
}


def unreadable_body(cause: BaseException | None) -> str:
    """Why a body the JSON parser raised on cannot be read (FastAPI's 400 `cause`)."""
    if isinstance(cause, UnicodeDecodeError):
        byte = cause.object[cause.start : cause.start + 1].hex()
        return f"not UTF-8 text (byte 0x{byte} at {cause.start}); send JSON encoded as UTF-8"
    if isinstance(cause, RecursionError):
        return "JSON nested too deep to read"
    if isinstance(cause, ValueError) and "digits" in str(cause):
        return "holds a number of more digits than the JSON reader takes (4300)"
    return "cannot be read as JSON"


def clearer_errors(
    errors: Sequence[Mapping[str, Any]], content_type: str | None
) -> list[Mapping[str, Any]]:
    """FastAPI's validation errors, with the body-level ones restated (module docstring)."""
    return [_clearer(error, content_type) for error in errors]


def _clearer(error: Mapping[str, Any], content_type: str | None) -> Mapping[str, Any]:
    location = tuple(error.get("loc", ()))
    if error.get("type") == "json_invalid" and location[:1] == ("body",):
        reason = (error.get("ctx") or {}).get("error", "malformed")
        where = f" at character {location[1]}" if len(location) > 1 else ""
        return {"loc": ("body",), "msg": f"not valid JSON: {reason}{where}"}
    if error.get("type") == "missing" and location == ("body",):
        return {"loc": ("body",), "msg": "a JSON object is required"}
    if error.get("type") in _NOT_AN_OBJECT and location == ("body",):
        given = error.get("input")
        if isinstance(given, bytes | bytearray):
            sent = f"{content_type!r}" if content_type else "none"
            message = f"send a JSON object as Content-Type: application/json (content type: {sent})"
        else:
            kind = "null" if given is None else JSON_TYPES.get(type(given), type(given).__name__)
            message = f"must be a JSON object, got {kind}"
        return {"loc": ("body",), "msg": message}
    return error
