"""Reports where it runs from: working directory, its own file, and the environment it got.

Tests copy this folder into directory trees built in tmp_path.
"""

import os


def handler(request, context):
    return {
        "content_type": "application/json",
        "content": {
            "cwd": os.getcwd(),
            "file": os.path.abspath(__file__),
            "training_result_dir": os.environ.get("ABEJA_TRAINING_RESULT_DIR"),
            "handler": os.environ.get("HANDLER"),
            "context": context,
        },
    }
