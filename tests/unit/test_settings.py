"""A setting's kind validates its value (issue 32): each kind's validator, as ``Config`` runs it
on every declared setting, however the value came (typed, or the text of a flag or variable)."""

from __future__ import annotations

import pytest

from abeja_runtime.config import VALIDATORS, Config, parse_size, setting_problems
from abeja_runtime.settings import KINDS
from abeja_runtime.styles.cortex import CortexOptions


def problem(**settings: object) -> str:
    with pytest.raises(ValueError) as raised:
        Config(**settings)  # type: ignore[arg-type]
    return str(raised.value)


def test_every_kind_has_a_validator():
    assert set(VALIDATORS) == KINDS


@pytest.mark.parametrize(
    ("text", "size"),
    [("0", 0), ("1048576", 1048576), ("512KiB", 512 * 1024), ("150MiB", 150 * 1024**2),
     ("1 GiB", 1024**3), ("10mb", 10 * 1024**2), ("2k", 2048)],
)  # fmt: skip
def test_sizes_are_read_in_1024_based_units(text, size):
    assert parse_size(text) == size
    assert Config(max_body_size=text).max_body_size == size  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["100XB", "-1", "MiB", "1.5MiB", -1])
def test_a_bad_size_says_what_a_size_is(bad):
    message = problem(spool_threshold=bad)
    assert message.startswith("--spool-threshold (ABEJA_RUNTIME_SPOOL_THRESHOLD) must be a size")
    assert "100MiB" in message  # an example of what to write
    assert message.endswith(f"got {bad!r}")


@pytest.mark.parametrize(("value", "kept"), [(5000, 5000), ("5000", 5000), (0, 0)])
def test_a_port_is_kept_as_a_number(value, kept):
    assert Config(port=value, healthcheck_port=5001).port == kept  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [70000, -1, "http", True, 1.5])
def test_a_bad_port_says_the_range_and_what_0_means(bad):
    assert problem(port=bad) == (
        f"--port (PORT) must be a port number from 0 to 65535 (0: any free port), got {bad!r}"
    )


def test_the_grpc_port_is_off_or_a_port_every_worker_can_bind():
    assert Config().grpc_port is None
    assert Config(grpc_port="8081").grpc_port == 8081  # type: ignore[arg-type]
    assert "from 1 to 65535" in problem(grpc_port=0)


def test_positive_and_count_differ_at_zero():
    assert Config(max_queue=0).max_queue == 0
    assert problem(workers=0) == (
        "--workers (ABEJA_RUNTIME_WORKERS) must be a whole number, 1 or more, got 0"
    )
    assert "must be a whole number, 0 or more" in problem(max_queue=-1)


def test_seconds_take_fractions_and_zero_where_zero_means_no_limit():
    assert Config(timeout="2.5").timeout == 2.5  # type: ignore[arg-type]
    assert Config(timeout=0).timeout == 0
    assert "0: no limit" in problem(timeout=-5)
    assert "must be a number of seconds" in problem(grace_period="forever")
    assert "above 0" in problem(keepalive_timeout=0)
    assert "got nan" in problem(timeout=float("nan"))


def test_a_choice_is_matched_without_case_and_kept_as_declared():
    assert Config(log_format="JSON").log_format == "json"
    assert problem(loop="fast") == (
        "--loop (ABEJA_RUNTIME_LOOP) must be one of auto, asyncio, uvloop, got 'fast'"
    )
    assert problem(style="flask").startswith(
        "--style (ABEJA_RUNTIME_STYLE) must be one of auto, abeja-v1, cortex, kserve, seldon, "
        "openai, abeja"
    )


def test_a_switch_reads_the_words_other_platforms_use():
    assert Config(cancel_raises="yes").cancel_raises is True  # type: ignore[arg-type]
    assert Config(cancel_raises="off").cancel_raises is False  # type: ignore[arg-type]
    assert "must be on or off" in problem(cancel_raises="maybe")


def test_a_json_object_says_where_its_text_is_wrong():
    assert Config(context='{"a": 1}').context == {"a": 1}  # type: ignore[arg-type]
    broken = problem(context="{broken")
    assert broken.startswith("--context (CONTEXT) must be a JSON object")
    assert "this is not JSON (Expecting" in broken
    assert "this is a JSON list" in problem(context="[1]")


def test_every_bad_value_is_reported_at_once():
    message = problem(workers=0, port="http")
    assert "--workers" in message
    assert "--port" in message


def test_settings_that_go_together_are_checked_once_each_is_valid():
    assert problem(port=6000, healthcheck_port=6000) == (
        "--port and --healthcheck-port must differ, both are 6000; give each its own port"
    )
    assert "--grpc-port must differ" in problem(grpc_port=5000)


def test_a_styles_options_are_checked_by_their_kinds_too():
    assert setting_problems(CortexOptions(cortex_metadata={"k": "v"})) == []
    bad = CortexOptions(cortex_metadata="[1]")  # type: ignore[arg-type]
    assert setting_problems(bad) == [
        '--cortex-metadata (ABEJA_RUNTIME_CORTEX_METADATA) must be a JSON object (e.g. {"key": '
        "\"value\"}); this is a JSON list, got '[1]'"
    ]
    with pytest.raises(ValueError, match="--cortex-metadata"):
        Config(style_options={"cortex": bad})
