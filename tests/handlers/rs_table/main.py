"""Returns the content of the table case named by the query (?case=NAME), or a raw result."""

import http

from cases import CASES


def handler(request, context):
    factory, content_type, _ = CASES[request.query["case"]]
    result = {"status_code": http.HTTPStatus.OK, "content": factory()}
    if content_type:
        result["content_type"] = content_type
    return result


BAD_RESULTS = {
    "not_a_dict": lambda: "hello",
    "none": lambda: None,
    "list": lambda: [{"content": 1}],
    "status_str": lambda: {"status_code": "200"},
    "status_float": lambda: {"status_code": 200.0},
    "status_low": lambda: {"status_code": 99},
    "status_high": lambda: {"status_code": 600},
    "status_bool": lambda: {"status_code": True},
    "content_type_none": lambda: {"content_type": None, "content": "x"},
    "content_type_blank": lambda: {"content_type": "  ", "content": "x"},
    "content_type_newline": lambda: {"content_type": "text/plain\r\nX-Injected: 1", "content": "x"},
    "metadata_list": lambda: {"metadata": ["x"]},
    "metadata_value_list": lambda: {"metadata": {"x-a": [1]}},
    "metadata_newline": lambda: {"metadata": {"x-a": "a\r\nSet-Cookie: x=1"}},
    "unserialisable": lambda: {"content": {"a": object()}},
    "csv_extra_key": lambda: {"content_type": "text/csv", "content": [{"a": 1}, {"b": 2}]},
    "raises": lambda: 1 / 0,
}


def bad(request, context):
    return BAD_RESULTS[request.query["case"]]()


#: Headers the handler process lets through, for the front to check before it writes them.
ODD_HEADERS = {
    "metadata_control": lambda: {"metadata": {"x-a": "a\x01b"}},
    "metadata_tab": lambda: {"metadata": {"x-a": "a\tb"}},
}


def odd_headers(request, context):
    return ODD_HEADERS[request.query["case"]]()


def with_metadata(request, context):
    return {
        "status_code": 201,
        "content_type": "application/json",
        "content": {"ok": True},
        "metadata": {
            "x-custom": "v",
            "X-Number": 42,
            "Content-Type": "text/evil",
            "Content-Length": "999",
            "Connection": "close",
            "x-abeja-sys-meta-runtime-version": "fake",
        },
    }


def status_only(request, context):
    return {"status_code": int(request.query["status"])}


def stream_file(request, context):
    """A file object is streamed, not read whole (closed by the runtime afterwards)."""
    return {"content_type": "application/octet-stream", "content": open(__file__, "rb")}
