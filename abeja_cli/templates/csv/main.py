"""A table model: reads CSV (a header row, then rows), answers JSON (per-column sums here).

Replace the body of ``handler`` with your model; load models and weights at import time, once.
"""

import csv
import io


def number(text):
    """The number in a cell, or None for text."""
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def handler(request, context):
    rows = list(csv.DictReader(io.StringIO(request.read().decode("utf-8"))))
    sums = {}
    for row in rows:
        for column, value in row.items():
            if number(value) is not None:
                sums[column] = sums.get(column, 0.0) + number(value)
    return {
        "status_code": 200,
        "content_type": "application/json",
        "content": {"rows": len(rows), "sums": sums},
    }
