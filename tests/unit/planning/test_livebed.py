"""The live testbed's pure parts: the pacer, the measurement from readings, app specs, the search's
bracketing, and the CLI's checks (no broker: bench/capacity_live.py measures it live, against the analytic answer)."""

from __future__ import annotations

import argparse

import pytest

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.planning import cli
from pulsar_autoscale.planning.liveapps import load_live_app, sleepy_app
from pulsar_autoscale.planning.livebed import (
    FnReading,
    LiveTestbed,
    Reading,
    saturated_rate,
    summarize,
    trend,
)
from pulsar_autoscale.planning.mst import MstSettings, judge, next_rate
from pulsar_autoscale.planning.producer import TokenBucket


def test_token_bucket_paces_and_does_not_catch_up_after_a_stall():
    b = TokenBucket(100.0, burst_s=0.2)
    sent = sum(b.take(t / 1000) for t in range(0, 1001))  # 1 s in 1 ms ticks
    assert 99 <= sent <= 100
    b.take(1.0)
    assert b.take(3.0) == 20  # a 2 s stall: only burst_s worth, the producer falls short (invalid run)
    assert 0 < TokenBucket(100.0).wait_s() <= 0.01
    assert TokenBucket(0.0).wait_s() == 0.05


def _readings(rate_in: float, rate_out: float, backlog_growth: float, seconds: int = 10) -> list[Reading]:
    return [
        Reading(
            t,
            rate_in * t,
            {
                "f": FnReading(
                    rate_in * t,
                    rate_out * t,
                    rate_out * t,
                    0.02 * rate_out * t,
                    100 + backlog_growth * t,
                    {0: (rate_in * t, rate_out * t, 0.02 * rate_out * t)},
                )
            },
        )
        for t in range(seconds + 1)
    ]


def test_summarize_a_sustained_run():
    r = summarize(50.0, _readings(50, 50, 0.0), [0.02] * 99 + [0.5], {"f": 1}, 20.0)
    assert r.valid and r.injected_rate == pytest.approx(50) and r.processed_rate == pytest.approx(50)
    fm = r.functions["f"]
    assert fm.backlog_end - fm.backlog_start == pytest.approx(0.0, abs=1e-6)
    assert fm.true_rate == pytest.approx(50.0) and fm.instances[0].arrived == pytest.approx(500)
    assert r.p99_s == pytest.approx(0.02 + 0.01 * 0.48)  # numpy linear: index 98.01 of 100
    assert judge(r, MstSettings())[0]


def test_summarize_an_overloaded_run_fails_on_processed_and_backlog():
    r = summarize(60.0, _readings(60, 50, 10.0), [], {"f": 1}, 20.0)
    assert r.processed_rate == pytest.approx(50.0) and r.p99_s is None
    fm = r.functions["f"]
    assert fm.backlog_end - fm.backlog_start == pytest.approx(100.0)
    ok, reason = judge(r, MstSettings())
    assert not ok and "83.33%" in reason


def test_trend_is_least_squares_with_the_noise_about_it():
    assert trend([0, 1, 2, 3], [0, 2, 4, 6]) == pytest.approx((2.0, 0.0))
    k, noise = trend([0, 1, 2, 3], [5, 9, 5, 9])
    assert k == pytest.approx(0.8) and noise == pytest.approx(0.8 * 5**0.5)  # mostly noise, little growth
    assert trend([1.0], [3.0]) == (0.0, 0.0)


def _fluctuating(deficit: float, swing: float, seconds: int = 30) -> list[Reading]:
    """20 msg/s in; the backlog (arrived - processed) swings by +-swing about a line that rises by `deficit`."""
    out = []
    for t in range(seconds + 1):
        wait = 5 + (swing if t % 2 else -swing) + deficit * t / seconds
        out.append(Reading(t, 20.0 * t, {"f": FnReading(20.0 * t, 20.0 * t - wait, 0.0, 0.0, wait, {})}))
    return out


def test_a_deficit_within_the_backlogs_noise_passes_and_one_beyond_it_fails():
    # 600 arrived, 8 short (1.3%): a backlog swinging by 4 messages explains it, a flat one does not.
    noisy = summarize(20.0, _fluctuating(8, 4), [], {"f": 1}, 40.0)
    assert noisy.processed_rate / noisy.injected_rate < 0.99
    ok, reason = judge(noisy, MstSettings())
    assert ok and "within the backlogs' noise" in reason, reason
    flat = summarize(20.0, _fluctuating(8, 0), [], {"f": 1}, 40.0)
    ok, reason = judge(flat, MstSettings())
    assert not ok and "98.67%" in reason
    # A backlog that keeps growing fails whatever its noise: its deficit is many standard deviations.
    growing = summarize(
        20.0,
        [
            Reading(t, 20.0 * t, {"f": FnReading(20.0 * t, 18.0 * t - (t % 2), 0.0, 0.0, 2.0 * t + (t % 2), {})})
            for t in range(31)
        ],
        [],
        {"f": 1},
        40.0,
    )
    assert not judge(growing, MstSettings())[0]


def test_messages_in_service_at_the_last_reading_are_not_a_shortfall():
    # A two-stage chain at 20/s read every 0.5 s: the second stage has 3 messages in hand at the last
    # reading (a slow moment), none before. From the end points it processed 98.5% of what arrived (3 of
    # 200 short); its rate is the source's, and the run kept up.
    def at(i: int) -> Reading:
        t = i / 2
        held = 3.0 if i == 20 else 0.0
        return Reading(
            t,
            20.0 * t,
            {"a": FnReading(20.0 * t, 20.0 * t, 20.0 * t, 0.0, 0.0), "b": FnReading(20.0 * t, 20.0 * t - held, 0.0, 0.0, held)},
        )

    r = summarize(20.0, [at(i) for i in range(21)], [], {"a": 1, "b": 1}, 14.0)
    assert r.processed_rate / r.injected_rate > 0.995
    assert judge(r, MstSettings())[0]


def test_the_observation_is_sized_by_the_function_that_received_fewest():
    def at(t: float, a: float, b: float) -> Reading:
        return Reading(t, 0.0, {"a": FnReading(a, 0, 0, 0, 0), "b": FnReading(b, 0, 0, 0, 0)})

    assert LiveTestbed._fewest_arrivals([at(0, 0, 100), at(15, 40, 400)]) == 40
    # b's input is not fed by this app: a does the sizing
    assert LiveTestbed._fewest_arrivals([at(0, 0, 100), at(15, 40, 100)]) == 40
    assert LiveTestbed._fewest_arrivals([at(0, 0, 0), at(15, 0, 0)]) == float("inf")


def test_the_warm_up_starts_from_the_saturated_function_not_a_starved_one():
    # resize gets what the paused producer lets through (3/s, nothing waiting); recognize, 2 instances, has
    # 150 waiting all along and processes 12/s: the start is recognize's 12, not resize's 3.
    readings = [
        Reading(
            t,
            3.0 * t,
            {"resize": FnReading(3.0 * t, 3.0 * t, 0, 0, 0.0), "recognize": FnReading(150 + 12.0 * t, 12.0 * t, 0, 0, 150.0)},
        )
        for t in range(6)
    ]
    res = summarize(200.0, readings, [], {"resize": 1, "recognize": 2}, 5.0)
    share = {"resize": 1.0, "recognize": 1.0}
    assert saturated_rate(res, readings, share, {"resize": 1, "recognize": 2}) == pytest.approx(12.0)
    # nothing saturated throughout: the lowest of all, as before
    assert saturated_rate(res, readings, share, {"resize": 1, "recognize": 200}) == pytest.approx(3.0)


def test_next_rate_brackets_then_bisects():
    inf = float("inf")
    assert next_rate(100, 0.0, inf) == 150 and next_rate(100, 0.0, 100) == 50  # StreamBed's moves
    assert next_rate(100, 0.0, inf, 0.1) == pytest.approx(110)
    assert next_rate(100, 0.0, 100, 0.1) == pytest.approx(90)
    assert next_rate(95, 90, 100, 0.1) == 95


def test_builtin_and_yaml_apps(tmp_path):
    one = sleepy_app(20.0, tag="x")
    assert [f.name for f in one.functions] == ["sleepy"] and one.source.endswith("plan-x-0")
    chain = sleepy_app(10.0, stages=2, tag="y")
    assert chain.upstream("sleepy1") == ("sleepy0",) and chain.upstream("sleepy0") == ()
    assert load_live_app("sleepy:5").functions[0].config["userConfig"]["service_ms"] == 5.0
    spec = tmp_path / "app.yaml"
    spec.write_text(
        "name: two\nsource: in\nsink: out\nfunctions:\n"
        "  - {name: a, className: sleepy.Sleepy, py: sleepy.py, inputs: [in], output: mid}\n"
        "  - {name: b, className: sleepy.Sleepy, inputs: [mid], output: out}\n"
    )
    app = load_live_app(str(spec))
    assert app.source == "persistent://public/default/in" and app.upstream("b") == ("a",)
    assert app.functions[0].subscription == "public/default/a" and app.functions[0].py.endswith("sleepy.py")
    with pytest.raises(ConfigError, match="not a built-in"):
        load_live_app("nope")
    spec.write_text("name: bad\nsource: elsewhere\nsink: out\nfunctions:\n  - {name: a, inputs: [in]}\n")
    with pytest.raises(ConfigError, match="source topic"):
        load_live_app(str(spec))


def test_a_yaml_app_declares_a_windowed_function(tmp_path):
    spec = tmp_path / "app.yaml"
    spec.write_text(
        "name: w\nsource: in\nsink: out\nfunctions:\n"
        "  - {name: agg, className: a.Agg, inputs: [in], output: mid, window_s: 10}\n"
        "  - {name: alert, className: a.Alert, inputs: [mid], output: out}\n"
    )
    app = load_live_app(str(spec))
    assert [f.window_s for f in app.functions] == [10.0, 0.0]
    assert "window_s" not in app.functions[0].config  # not a FunctionConfig field: the worker never sees it
    spec.write_text(spec.read_text().replace("window_s: 10", "window_s: ten"))
    with pytest.raises(ConfigError, match="agg.*window_s must be a number of seconds >= 0, got 'ten'"):
        load_live_app(str(spec))


def _args(*argv):
    p = argparse.ArgumentParser()
    cli.configure_parser(p)
    return p.parse_args(list(argv))


def test_cli_live_needs_urls_and_gets_live_phases(capsys):
    args = _args("mst", "--testbed", "live", "--app", "sleepy")
    assert cli.run(args) == 2
    assert "--admin-url, --service-url, --metrics-url" in capsys.readouterr().err
    urls = ("--admin-url", "http://w", "--service-url", "pulsar://b", "--metrics-url", "http://b/metrics")
    assert cli.run(_args("mst", "--testbed", "live", *urls, "--min-messages", "-1")) == 2
    assert "--min-messages must be >= 0 (got -1)" in capsys.readouterr().err
    s = cli.settings_of(_args("mst", "--testbed", "live", "--observe", "9"))
    assert s.phases.observe_s == 9 and s.warmup_s == 10 and s.bracket == 0.1 and s.step == 0.02
    s = cli.settings_of(_args("mst"))
    assert s.warmup_s == MstSettings.warmup_s and s.bracket is None
