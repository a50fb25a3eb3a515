"""Add 8 % consumption tax to ``total_without_tax`` (the ABEJA docs' first example).

JSON in, JSON out; a request without the field gets 400 with a message, as in the docs'
"invalid JSON input" example (whose ``HTTPStaus`` typo is fixed here).
"""

import http
import json


def handler(request, context):
    req_data = json.load(request)
    if "total_without_tax" not in req_data:
        return {
            "status_code": http.HTTPStatus.BAD_REQUEST,
            "content_type": "application/json; charset=utf8",
            "content": {"message": "total_without_tax is need"},
        }
    total_without_tax = int(req_data["total_without_tax"])
    total = total_without_tax * 1.08
    return {
        "status_code": http.HTTPStatus.OK,
        "content_type": "application/json; charset=utf8",
        "content": {"total": total},
    }
