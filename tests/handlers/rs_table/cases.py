"""The serialisation table of contract Part B 5.1 with the A3 fixes: (name, result, body).

Imported by the handler (to build the result) and by the test (to know the expected bytes).
"""

import datetime
import decimal
import io

import numpy as np


def _generator():
    yield {"a": 1}
    yield b"raw"
    yield "txt"


CASES = {
    # name: (factory of the handler's content, content_type or None, expected body)
    "dict": (lambda: {"a": 1}, None, b'{"a": 1}'),
    "list_of_dicts": (lambda: [{"a": 1}, {"b": 2}], None, b'{"a": 1}\n{"b": 2}'),
    "list_of_ints": (lambda: [1, 2, 3], None, b"1\n2\n3"),
    "list_of_lists": (lambda: [[1, 2], [3, 4]], None, b"[1, 2]\n[3, 4]"),
    "list_of_tuples": (lambda: [("apple", 1), ("orange", 2)], None, b'["apple", 1]\n["orange", 2]'),
    "lists_of_pairs": (
        lambda: [[("apple", 1), ("orange", 2)], [("apple", 3), ("orange", 4)]],
        None,
        b'{"apple": 1, "orange": 2}\n{"apple": 3, "orange": 4}',
    ),
    "str": (lambda: "hello", None, b"hello"),
    "list_of_str": (lambda: ["a", "b"], None, b"a\nb"),
    "bytes_raw": (lambda: b"AB", None, b"AB"),
    "bytearray_raw": (lambda: bytearray(b"AB"), None, b"AB"),
    "memoryview_raw": (lambda: memoryview(b"AB"), None, b"AB"),
    "list_of_bytes": (lambda: [b"AB", b"CD"], None, b"ABCD"),
    "bytesio": (lambda: io.BytesIO(b"l1\nl2\n\x00\xff"), None, b"l1\nl2\n\x00\xff"),
    "stringio_no_doubled_newlines": (lambda: io.StringIO("l1\nl2\n"), None, b"l1\nl2\n"),
    "generator_mixed": (_generator, None, b'{"a": 1}\nrawtxt\n'),  # streamed lines end
    "int": (lambda: 5, None, b"5"),
    "float": (lambda: 1.5, None, b"1.5"),
    "bool": (lambda: True, None, b"true"),
    "none": (lambda: None, None, b""),
    "empty_list": (lambda: [], None, b""),
    "empty_str": (lambda: "", None, b""),
    "empty_dict": (lambda: {}, None, b"{}"),
    "np_int64": (lambda: np.int64(7), None, b"7"),
    "np_float32": (lambda: np.float32(0.5), None, b"0.5"),
    "np_array_top_level": (lambda: np.array([1, 2, 3]), None, b"1\n2\n3"),
    "np_in_dict": (
        lambda: {"a": np.array([1.5, 2]), "b": np.int32(3)},
        None,
        b'{"a": [1.5, 2.0], "b": 3}',
    ),
    "np_bool": (lambda: {"ok": np.bool_(True)}, None, b'{"ok": true}'),
    "datetime": (lambda: datetime.datetime(2020, 1, 2, 3, 4, 5), None, b'"2020-01-02T03:04:05"'),
    "date": (lambda: {"d": datetime.date(2020, 1, 2)}, None, b'{"d": "2020-01-02"}'),
    "decimal": (lambda: {"price": decimal.Decimal("1.25")}, None, b'{"price": 1.25}'),
    "non_ascii_escaped": (lambda: {"x": "é"}, None, b'{"x": "\\u00e9"}'),
    "csv_rows": (
        lambda: [{"a": 1, "b": 2}, {"a": 3, "b": 4}],
        "text/csv",
        b"a,b\r\n1,2\r\n3,4\r\n",
    ),
    "csv_dict": (lambda: {"a": 1, "b": 2}, "text/csv", b"a,b\r\n1,2\r\n"),
    "csv_str": (lambda: "a,b\n1,2", "text/csv", b"a,b\n1,2"),
    "charset_honoured": (lambda: "é", "text/plain; charset=latin-1", b"\xe9"),
}
