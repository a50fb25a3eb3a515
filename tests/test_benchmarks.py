"""The benchmark harness's own logic: parsing wrk's output, medians, and the verdicts.

The measurements need wrk, taskset and a quiet machine, so they are not run here; what decides
a reported number and its PASS or FAIL is, with wrk outputs written as wrk 4.1 prints them.
"""

from __future__ import annotations

import pytest

from benchmarks.load import WrkResult, parse_wrk
from benchmarks.report import Options, ratio_checks, render, start_check, upload_check
from benchmarks.scenarios import WORKLOADS, Row, UploadRow, check_answer, median_row
from benchmarks.servers import ServerError

WRK_OUTPUT = """\
Running 4s test @ http://127.0.0.1:18190/
  1 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     5.22ms    1.01ms  21.40ms   91.02%
    Req/Sec     3.10k   120.33     3.33k    80.00%
  Latency Distribution
     50%    5.10ms
     75%    5.40ms
     90%    6.02ms
     99%    {p99}
  12345 requests in 4.00s, 1.90MB read
{errors}Requests/sec:   3085.91
Transfer/sec:    486.21KB
"""


def wrk_output(p99: str = "9.01ms", errors: str = "") -> str:
    return WRK_OUTPUT.format(p99=p99, errors=errors)


def test_parse_wrk_reads_rate_percentiles_and_total():
    result = parse_wrk(wrk_output())
    assert result == WrkResult(rps=3085.91, p50_ms=5.10, p99_ms=9.01, requests=12345, errors=0)


@pytest.mark.parametrize(
    ("printed", "ms"), [("850.00us", 0.85), ("9.01ms", 9.01), ("1.20s", 1200.0), ("1.00m", 60e3)]
)
def test_parse_wrk_converts_every_latency_unit_to_ms(printed, ms):
    assert parse_wrk(wrk_output(p99=printed)).p99_ms == pytest.approx(ms)


def test_parse_wrk_counts_non_2xx_answers_and_socket_errors():
    errors = (
        "  Socket errors: connect 0, read 2, write 1, timeout 3\n  Non-2xx or 3xx responses: 7\n"
    )
    assert parse_wrk(wrk_output(errors=errors)).errors == 13


def test_parse_wrk_refuses_output_without_the_latency_table():
    without_percentiles = "\n".join(
        line for line in wrk_output().splitlines() if "%" not in line or "Stdev" in line
    )
    with pytest.raises(ValueError, match="cannot parse wrk output"):
        parse_wrk(without_percentiles)


def row(target="runtime", rps=1000.0, p99=10.0, pss=50.0, workload="small_json", **kw) -> Row:
    wrk = WrkResult(rps=rps, p50_ms=p99 / 2, p99_ms=p99, requests=int(rps * 10), errors=0)
    return Row(target, 1, workload, wrk=wrk, peak_pss_mib=pss, peak_sum_mib=2 * pss, **kw)


def test_median_row_keeps_the_middle_run_and_every_rate():
    runs = [row(rps=300.0), row(rps=100.0), row(rps=200.0)]
    kept = median_row(runs)
    assert kept.wrk is not None and kept.wrk.rps == 200.0
    assert sorted(kept.rps_runs) == [100.0, 200.0, 300.0]


def test_median_row_of_an_even_count_is_the_lower_middle_and_failures_are_reported():
    failed = Row("runtime", 1, "small_json", error="wrk failed (1)\nmore")
    kept = median_row([row(rps=400.0), failed, row(rps=100.0), row(rps=300.0), row(rps=200.0)])
    assert kept.wrk is not None and kept.wrk.rps == 200.0
    assert kept.error == "1 of 5 runs failed: wrk failed (1)"


def test_median_row_of_failed_runs_only_is_the_first_failure():
    failed = [Row("runtime", 1, "small_json", error=f"run {i}") for i in range(3)]
    assert median_row(failed).error == "run 0"


def verdicts(bare: Row, runtime: Row) -> dict[str, bool]:
    return {check.target: check.ok for check in ratio_checks(bare, runtime)}


def test_small_json_is_held_to_rate_p99_and_memory_ratios():
    bare = row("bare", rps=10_000.0, p99=2.0, pss=50.0)
    assert verdicts(bare, row(rps=8_000.0, p99=3.0, pss=75.0)) == {
        "req/s ≥ 0.8x": True,
        "p99 ≤ 1.5x": True,
        "memory (PSS) ≤ 1.5x": True,
    }
    assert verdicts(bare, row(rps=7_999.0, p99=3.1, pss=75.1)) == {
        "req/s ≥ 0.8x": False,
        "p99 ≤ 1.5x": False,
        "memory (PSS) ≤ 1.5x": False,
    }


def test_other_workloads_need_nine_tenths_of_the_bare_rate_and_no_p99_bound():
    bare = row("bare", rps=1000.0, p99=2.0, workload="numpy_1ms")
    found = verdicts(bare, row(rps=900.0, p99=20.0, workload="numpy_1ms"))
    assert found == {"req/s ≥ 0.9x": True, "memory (PSS) ≤ 1.5x": True}


def test_rows_with_errors_fail():
    bare = row("bare", rps=1000.0)
    erring = row(rps=2000.0)
    assert erring.wrk is not None
    erring.wrk.errors = 3
    assert verdicts(bare, erring)["3 errors"] is False


def test_two_worker_rows_are_held_to_the_rate_only_four_worker_rows_to_nothing():
    """Against as many bare processes: small JSON 0.7, numpy 0.9 (issue 19); no p99 or RSS
    bound, and none for 1 MiB bodies or 4 workers."""
    bare = row("bare", rps=1000.0, p99=2.0, pss=100.0)
    two = row(rps=700.0, p99=20.0, pss=500.0)
    two.workers = 2
    assert verdicts(bare, two) == {"req/s ≥ 0.7x": True}
    two = row(rps=899.0, workload="numpy_1ms")
    two.workers = 2
    assert verdicts(bare, two) == {"req/s ≥ 0.9x": False}
    for workers, workload in ((2, "binary_1mib"), (4, "small_json")):
        other = row(rps=1.0, workload=workload)
        other.workers = workers
        assert ratio_checks(bare, other) == []


def test_the_runtime_is_held_to_the_bare_uvloop_rate_on_small_json_served_unpinned():
    """Issue 31's target, as the issue measured it: small JSON, servers and wrk on both cores.
    A pinned row gives the front and its worker the bare app's one core: no verdict."""
    rows = [
        row(target, rps, workload=workload)
        for workload in ("small_json", "numpy_1ms")
        for target, rps in (("bare", 900.0), ("bare-uvloop", 1000.0), ("runtime", 990.0))
    ]

    def against_uvloop(pin: str) -> list[str]:
        options = Options(("python", "-m", "benchmarks"), 1, 16, 10.0, 2.0, 1, pin, 0)
        text = render(options, rows, [], [("date", "2026-11-26")])
        return [line for line in text.splitlines() if line.startswith("| runtime | bare-uvloop")]

    assert against_uvloop("none") == [
        "| runtime | bare-uvloop | 1 | small_json | 0.99 | 1.00 | at least 1.00: FAIL |",
        "| runtime | bare-uvloop | 1 | numpy_1ms | 0.99 | 1.00 |  |",
    ]
    pinned = against_uvloop("auto")
    assert len(pinned) == 2
    assert all(
        line.endswith("| pinned: front and worker on the bare app's one core |") for line in pinned
    )
    faster = rows[2].wrk
    assert faster is not None
    faster.rps = 1000.0
    assert against_uvloop("none")[0].endswith("| at least 1.00: PASS |")


def test_a_change_is_held_against_the_baseline_runtime_of_the_same_run():
    """``--baseline-ref``: the runtime beside itself as of another commit, row by row."""
    rows = [row("bare", 900.0), row("runtime", 970.0), row("runtime-baseline", 1000.0)]
    options = Options(("python", "-m", "benchmarks"), 1, 16, 10.0, 2.0, 1, "auto", 0)
    text = render(options, rows, [], [("date", "2026-11-28")])
    change = [line for line in text.splitlines() if line.startswith("| runtime | runtime-base")]
    assert change == [
        "| runtime | runtime-baseline | 1 | small_json | 0.97 | 1.00 "
        "| the change (RSS ratio 1.00) |"
    ]


def test_start_and_upload_bounds():
    assert start_check(row(ready_s=0.45)).ok
    assert not start_check(row(ready_s=0.55)).ok
    assert not start_check(row(ready_s=0.0)).ok  # never measured is not a pass
    assert upload_check(UploadRow("runtime", "chunked", worker_growth_mib=63.0)).ok
    assert not upload_check(UploadRow("runtime", "chunked", worker_growth_mib=64.0)).ok
    failed = UploadRow("runtime", "chunked", worker_growth_mib=1.0, error="returned size 1")
    assert not upload_check(failed).ok


def test_check_answer_accepts_the_expected_json_and_names_what_differs():
    small = WORKLOADS["small_json"]
    check_answer(small, {"total": 108.00000000000001})
    with pytest.raises(ServerError, match="expected"):
        check_answer(small, {"total": 100})
    with pytest.raises(ServerError, match="a float 'result'"):
        check_answer(WORKLOADS["numpy_1ms"], {"result": "1.0"})


def test_coldstart_reads_docker_s_times_and_the_runtime_s_to_the_microsecond():
    from benchmarks.coldstart import _epoch

    assert _epoch("2026-11-28T11:10:46.6112542Z") == pytest.approx(1795864246.6112542, abs=1e-6)
    assert _epoch("2026-11-28T11:10:46Z") == pytest.approx(1795864246.0)
    assert _epoch("2026-11-28T11:10:46.779Z") - _epoch("2026-11-28T11:10:46.6112542Z") == (
        pytest.approx(0.1677458, abs=1e-6)
    )


def test_coldstart_holds_the_runtime_s_own_share_of_every_runtime_image_to_0_3_s():
    from benchmarks.coldstart import Sample, Series, images, render

    tax, forest, kserve = (Series(image) for image in images("x"))
    tax.samples = [Sample(0.3, own, 0.001, 0.004) for own in (0.25, 0.28, 0.26)]
    forest.samples = [Sample(0.3, own, 1.5, 0.02) for own in (0.31, 0.29, 0.33)]
    kserve.samples = [Sample(0.3, 1.2, 1.3, 0.1)]  # KServe's imports are not held to it
    report = render([tax, forest, kserve], "base", 3)
    assert "| tax | 0.300 s | 0.260 s | 0.001 s | 0.004 s | 0.565 s |" in report
    assert "at most 0.310 s: FAIL" in report
    forest.samples = [Sample(0.3, 0.2, 1.5, 0.02)]
    assert "at most 0.260 s: PASS" in render([tax, forest, kserve], "base", 3)


def test_openai_streams_puts_the_bare_app_beside_each_time_to_first_token_verdict():
    """The streams/s verdict is against LitServe only; each time to first token verdict, closed
    loop with its streams begun staggered and open loop, is the runtime's against 1 ms, with the
    bare app's from the same runs; the closed loop begun in phase is reported, not judged."""
    from benchmarks.openai_streams import Row as StreamsRow
    from benchmarks.openai_streams import Run, parse_args, verdicts

    def row(target: str, **figures: float) -> StreamsRow:
        return StreamsRow(target, [Run(target, **figures)])

    rows = {
        "runtime": row(
            "runtime", streams_per_s=900, paced_p50_ms=5.0, staggered_p50_ms=1.2, open_p50_ms=0.9
        ),
        "bare": row(
            "bare", streams_per_s=3000, paced_p50_ms=1.7, staggered_p50_ms=0.6, open_p50_ms=0.7
        ),
        "litserve": row("litserve", streams_per_s=100),
    }
    speed, in_phase, closed, opened = verdicts(rows, parse_args([]))
    assert "9.00x LitServe's best (litserve)" in speed and speed.endswith("PASS.")
    assert "begun in phase" in in_phase and "not judged: runtime 5.000 ms" in in_phase
    assert in_phase.endswith("the bare app 1.700 ms.")
    assert "closed loop, first streams staggered: runtime 1.200 ms" in closed
    assert closed.endswith("FAIL; the bare app 0.600 ms in the same runs.")
    assert "open loop: runtime 0.900 ms" in opened
    assert opened.endswith("PASS; the bare app 0.700 ms in the same runs.")


def test_streams_judges_the_chunk_p99_by_5_ms_or_3x_the_bare_app_run_by_run_and_on_medians():
    from benchmarks.streams import verdict

    def runs(*p99s: float) -> list[dict[str, float]]:
        return [{"chunk_p99_ms": p99} for p99 in p99s]

    assert verdict(runs(1.0, 1.0, 1.0), runs(4.9, 2.0, 6.0)).endswith("PASS; met in 2 of 3 runs.")
    assert verdict(runs(3.0, 3.0, 3.0), runs(8.0, 8.9, 9.5)).endswith("PASS; met in 2 of 3 runs.")
    failed = verdict(runs(1.0, 1.0, 1.0), runs(6.0, 6.5, 2.0))
    assert "runtime 6.0 ms, the bare app 1.0 ms" in failed
    assert failed.endswith("FAIL; met in 1 of 3 runs.")
