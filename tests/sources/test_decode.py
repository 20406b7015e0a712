"""JSON decoding with msgspec: the values and the error messages ``json`` gives, through the
decoder alone and through the spool source, and the brokers' ``decode`` option."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from offbroadway.stages.sources.base import FailedItem, SourceOptionError, failure_of
from offbroadway.stages.sources.decode import (
    DECODE_ERRORS,
    decode_bodies,
    json_value,
    option_decode,
    why_not,
)

from tests.sources.conftest import SpoolDirs, drain

# what json takes and a strict parser might not, or takes differently
CORNERS = ["NaN", "-Infinity", "1e400", "123456789012345678901234567890",
           "-9223372036854775809", "18446744073709551616", '"\\ud800"', '{"a": 1, "a": 2}',
           '  {"padded": true}  ', "[1]\n", "1.0000000000000002", "-0", "0.1e-400",
           '"\\u00e9"', '{"nested": [[[[[]]]]]}']
BAD = ["", "{not json", '{"a": 1} {"b": 2}', "[1, 2", "'single'", '{"a": 1,}', "tru",
       "\ufeff{}", "[" * 100_000]


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return type(a) is type(b) and a == b


def test_values_are_what_json_gives_in_every_corner() -> None:
    for text in CORNERS:
        for raw in (text, text.encode("utf-8", "surrogatepass")):
            assert same(json_value(raw), json.loads(raw)), text
    big = json_value("123456789012345678901234567890")
    assert big == 123456789012345678901234567890 and isinstance(big, int)  # no float


def error_of(fn, raw) -> str:
    try:
        fn(raw)
    except DECODE_ERRORS as exc:
        return f"{type(exc).__name__}: {exc}"
    raise AssertionError(f"{raw[:40]!r} decoded")


def test_bad_payloads_fail_with_json_s_own_message() -> None:
    for text in BAD:
        assert error_of(json_value, text) == error_of(json.loads, text), text[:40]
    assert error_of(json_value, b"\xff\xfe{") == error_of(json.loads, b"\xff\xfe{")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20)


@given(json_values, st.integers(min_value=0, max_value=60), st.sampled_from(["", "x", "}", " "]))
def test_any_json_and_any_cut_of_it_decodes_as_json_decodes(value, cut, junk) -> None:
    text = json.dumps(value)
    assert json_value(text) == json.loads(text)
    mangled = text[:cut] + junk
    try:
        expected = json.loads(mangled)
    except DECODE_ERRORS:
        assert error_of(json_value, mangled) == error_of(json.loads, mangled)
    else:
        assert json_value(mangled) == expected


def test_spool_lines_keep_json_s_values_and_reasons(spool: SpoolDirs) -> None:
    lines = ['{"big": 123456789012345678901234567890}', "NaN", '{"ok": 1}', "{not json",
             '{"a": 1} {"b": 2}', '{"deep": ' + "[" * 5000 + "]" * 5000 + "}"]
    spool.write("c.jsonl", lines, raw=True)
    items = {it[2]["line"]: it for it in drain(spool.source())}
    assert items[1][1] == {"big": 123456789012345678901234567890}
    assert math.isnan(items[2][1]) and failure_of(items[2]) is None
    assert items[3][1] == {"ok": 1}
    for line in (4, 5, 6):
        try:
            json.loads(lines[line - 1])
        except DECODE_ERRORS as exc:
            assert failure_of(items[line]) == f"line is not valid JSON: {exc}"
            assert items[line][2] == {"file": "c.jsonl", "line": line}
        else:
            raise AssertionError(f"line {line} is JSON")


def test_decode_bodies_marks_what_does_not_decode_and_keeps_the_payload() -> None:
    items = [("a", b'{"x": 1}', {}, 1), ("b", b"{oops", {}, 2),
             FailedItem("c", None, {}, 3, "big"), ("d", b"\xff", {}, 4)]
    assert decode_bodies(items, json_value) == 2
    assert items[0] == ("a", {"x": 1}, {}, 1)
    assert items[1][1] == b"{oops"
    assert items[1][2] == {} and failure_of(items[1]) == why_not(json.JSONDecodeError(
        "Expecting property name enclosed in double quotes", "{oops", 1), "body")
    assert items[2] == ("c", None, {}, 3) and failure_of(items[2]) == "big"
    assert failure_of(items[3]).startswith("body is not valid UTF-8: ")


def test_decode_option_is_checked_by_name() -> None:
    assert option_decode("rabbitmq", {}) == "none"
    assert option_decode("rabbitmq", {"decode": "json"}) == "json"
    with pytest.raises(SourceOptionError) as err:
        option_decode("rabbitmq", {"decode": "yaml"})
    assert err.value.option == "decode" and "'json'" in str(err.value)
