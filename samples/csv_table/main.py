"""Summarise a CSV table: row count and, per numeric column, count, mean, min and max.

CSV in (``text/csv``), JSON out. Columns with a value that is not a number are listed as
text columns with their number of distinct values.
"""

import csv
import http
import io


def _number(value):
    try:
        return float(value)
    except ValueError:
        return None


def handler(request, context):
    text = request.read().decode("utf-8-sig")
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows:
        return {
            "status_code": http.HTTPStatus.BAD_REQUEST,
            "content_type": "application/json",
            "content": {"message": "send a CSV file with a header row and at least one row"},
        }
    columns = {}
    for name in rows[0]:
        values = [row[name] for row in rows if row.get(name) not in (None, "")]
        numbers = [_number(v) for v in values]
        if values and all(n is not None for n in numbers):
            columns[name] = {
                "type": "number",
                "count": len(numbers),
                "mean": round(sum(numbers) / len(numbers), 6),
                "min": min(numbers),
                "max": max(numbers),
            }
        else:
            columns[name] = {"type": "text", "count": len(values), "distinct": len(set(values))}
    return {
        "status_code": http.HTTPStatus.OK,
        "content_type": "application/json",
        "content": {"rows": len(rows), "columns": columns},
    }
