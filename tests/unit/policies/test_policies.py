"""The paper's policies against hand-computed values (arithmetic in the comments).

Queueing numbers use c_a^2 = c_s^2 = 1, so (c_a^2 + c_s^2) / 2k = 1/k and
T(k) = 1/mu + (1/k) * P_k / (mu (1 - rho)), rho = lambda / (k mu).
"""

from __future__ import annotations

import math

import pytest

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.graph import AppGraph, FunctionNode
from pulsar_autoscale.policies.ds2 import DS2Config, DS2Policy
from pulsar_autoscale.policies.queueing import QueueingConfig, QueueingPolicy, p_wait, response_time
from pulsar_autoscale.policies.threshold import ThresholdConfig, ThresholdPolicy
from pulsar_autoscale.snapshot import FunctionSnapshot, Snapshot


def snap(*functions: FunctionSnapshot) -> Snapshot:
    return Snapshot(time=0.0, window_s=30.0, functions={f.name: f for f in functions})


def fs(name, k=1, **figures) -> FunctionSnapshot:
    return FunctionSnapshot(name=name, parallelism=k, **figures)


def chain(*names) -> AppGraph:
    topics = ["src"] + [f"t{i}" for i in range(len(names))]
    return AppGraph.build(FunctionNode(n, (topics[i],), topics[i + 1]) for i, n in enumerate(names))


def paper_app() -> AppGraph:
    """Fig. 3: images -> resize1 -> store; images -> resize2 -> recognize (two paths)."""
    return AppGraph.build(
        [
            FunctionNode("resize1", ("images",), "small"),
            FunctionNode("store", ("small",)),
            FunctionNode("resize2", ("images",), "medium"),
            FunctionNode("recognize", ("medium",)),
        ]
    )


PATH = QueueingConfig(level="path")


# ---- threshold (T_in 50, T_out 150, step 1) -------------------------------------------------------


@pytest.mark.parametrize(
    "backlog, k, expected",
    [
        (151, 3, 4),  # overload: Q > T_out -> +1
        (150, 3, 3),  # T_out itself is in range
        (51, 3, 3),  # just above T_in: in range
        (50, 3, 2),  # low load: Q <= T_in -> -1
        (0, 3, 2),
        (10, 1, 1),  # never below one instance
        (None, 3, 3),  # unknown: keep (not "0 messages, scale in")
    ],
)
def test_threshold(backlog, k, expected):
    p = ThresholdPolicy().decide(chain("f"), snap(fs("f", k, backlog=backlog)), {"f": k}, None)
    assert p.targets == {"f": expected}
    if backlog is None:
        assert "unknown" in p.reasons["f"]


def test_threshold_custom_step_and_missing_snapshot():
    p = ThresholdPolicy(ThresholdConfig(t_in=5, t_out=10, step=2)).decide(
        chain("f", "g"), snap(fs("f", 2, backlog=11)), {"f": 2, "g": 4}, "kept"
    )
    assert p.targets == {"f": 4, "g": 4}  # 11 > 10: +2; g has no figures at all: keep
    assert p.state == "kept"  # state is handed back untouched


# ---- queueing: Allen-Cunneen GI/G/k ---------------------------------------------------------------


def test_p_k_switches_formula_at_rho_0_7():
    # rho = 0.7 belongs to the upper branch (rho^k + rho)/2: k=1 -> 0.7; k=2 -> (0.49 + 0.7)/2 = 0.595
    assert p_wait(0.7, 1) == pytest.approx(0.7)
    assert p_wait(0.7, 2) == pytest.approx(0.595)
    # just below uses rho^sqrt(k+1): 0.6999^sqrt(3) = exp(1.73205 * ln 0.6999) = 0.53901
    assert p_wait(0.6999, 2) == pytest.approx(0.53901, abs=1e-5)
    # 0.69^sqrt(2) = exp(1.41421 * -0.37106) = 0.59170
    assert p_wait(0.69, 1) == pytest.approx(0.59170, abs=1e-5)
    # k = 3, rho = 0.8: (0.512 + 0.8)/2 = 0.656
    assert p_wait(0.8, 3) == pytest.approx(0.656)


def test_response_time_hand_computed():
    # lambda 7, mu 10, k 1: rho 0.7, P 0.7, Tq = 0.7 / (10 * 0.3) = 0.23333; T = 0.1 + Tq = 0.33333
    assert response_time(7, 10, 1, 1, 1) == pytest.approx(0.333333, abs=1e-6)
    # boundary with k = 2: lambda 7, mu 5: rho 0.7, P 0.595, Tq = 0.5 * 0.595 / (5 * 0.3) = 0.198333; T 0.398333
    assert response_time(7, 5, 2, 1, 1) == pytest.approx(0.398333, abs=1e-6)
    # lambda 8, mu 5, k 2: rho 0.8, P 0.72, Tq = 0.5 * 0.72 / (5 * 0.2) = 0.36; T = 0.56
    assert response_time(8, 5, 2, 1, 1) == pytest.approx(0.56)
    # variability scales the queueing part: ca2 = 0.5, cs2 = 0.25 -> (0.75/4) * 0.72 / 1 = 0.135; T = 0.335
    assert response_time(8, 5, 2, 0.5, 0.25) == pytest.approx(0.335)
    # unstable: rho >= 1 (exactly 1 included)
    assert math.isinf(response_time(8, 5, 1, 1, 1))
    assert math.isinf(response_time(10, 5, 2, 1, 1))


def test_queueing_function_level_picks_the_smallest_k():
    s = snap(fs("f", 1, arrival_rate=8.0, service_rate=5.0, ca2=1.0, cs2=1.0))
    # k=1 unstable (rho 1.6); k=2: T = 0.56 <= 1
    p = QueueingPolicy().decide(chain("f"), s, {"f": 1}, None)
    assert p.targets == {"f": 2} and "T(2) 0.560s" in p.reasons["f"]
    # R_max 0.5: k=2 gives 0.56 > 0.5; k=3: rho 0.5333 < 0.7, P = 0.5333^2 = 0.28444,
    # Tq = (1/3) * 0.28444 / (5 * 0.46667) = 0.04063, T = 0.24063 <= 0.5
    strict = QueueingPolicy(QueueingConfig(r_max_s=0.5))
    assert strict.decide(chain("f"), s, {"f": 1}, None).targets == {"f": 3}
    # and it scales in: from 9 instances back to the smallest k meeting R_max, 2
    assert QueueingPolicy().decide(chain("f"), s, {"f": 9}, None).targets == {"f": 2}


def test_queueing_function_level_respects_min_parallelism():
    # lambda 1, mu 10: k = 1 meets R_max easily, but min_parallelism 2 is the starting point
    s = snap(fs("f", 4, arrival_rate=1.0, service_rate=10.0))
    assert QueueingPolicy(QueueingConfig(min_parallelism=2)).decide(chain("f"), s, {"f": 4}, None).targets == {"f": 2}


def test_queueing_unstable_function_scales_out_to_the_cap():
    # lambda 100, mu 5: even k = 15 gives rho 1.33 >= 1 -> max parallelism
    s = snap(fs("f", 2, arrival_rate=100.0, service_rate=5.0))
    p = QueueingPolicy().decide(chain("f"), s, {"f": 2}, None)
    assert p.targets == {"f": 15} and "unstable" in p.reasons["f"]


def test_queueing_unknown_figures():
    s = snap(fs("f", 3, arrival_rate=None, service_rate=5.0), fs("g", 2, arrival_rate=8.0, service_rate=5.0))
    for level in ("function", "path"):
        p = QueueingPolicy(QueueingConfig(level=level)).decide(chain("f", "g"), s, {"f": 3, "g": 2}, None)
        assert p.targets["f"] == 3 and "unknown" in p.reasons["f"]
        # g: no ca2/cs2 measured -> 1.0 each, so T(2) = 0.56 as above, shown in the reason
        assert p.targets["g"] == 2 and "ca2 1.00 cs2 1.00" in p.reasons["g"]


def test_queueing_path_level_on_the_papers_two_path_dag():
    s = snap(
        # path 1: resize1 (lambda 8, mu 20, k 1): rho 0.4, P = 0.4^sqrt2 = 0.27367, Tq = 0.27367 / 12 = 0.02281,
        #   T = 0.07281; store (lambda 8, mu 40, k 3): rho 0.0667, P = 0.0667^2 = 0.00444,
        #   Tq = (1/3) * 0.00444 / 37.33 = 0.00004, T = 0.02504. Path 0.0978 < alpha * R_max = 0.5:
        #   the fastest function with more than one instance, store, gives one back (one per period):
        #   T_store(2) = 0.025 + 0.5 * 0.1^sqrt3 / 36 = 0.02526, path 0.0981 <= R_max, so it stands.
        fs("resize1", arrival_rate=8.0, service_rate=20.0),
        fs("store", 3, arrival_rate=8.0, service_rate=40.0),
        # path 2: resize2 (lambda 9, mu 20, k 1): rho 0.45, P = 0.45^sqrt2 = 0.32327, Tq = 0.32327 / 11 = 0.02939,
        #   T = 0.07939; recognize (lambda 9, mu 5, k 2): rho 0.9, P = (0.81 + 0.9)/2 = 0.855,
        #   Tq = 0.5 * 0.855 / (5 * 0.1) = 0.855, T = 1.055. Path 1.1344 > R_max = 1: the slowest on it,
        #   recognize, to 3: rho 0.6, P = 0.6^2 = 0.36, Tq = (1/3) * 0.36 / 2 = 0.06, T = 0.26; path 0.3394.
        #   0.3394 < 0.5 asks for a scale-in of recognize, but back at 2 its path is 1.1344 > 1: undone.
        fs("resize2", arrival_rate=9.0, service_rate=20.0),
        fs("recognize", 2, arrival_rate=9.0, service_rate=5.0),
    )
    current = {"resize1": 1, "store": 3, "resize2": 1, "recognize": 2}
    p = QueueingPolicy(PATH).decide(paper_app(), s, current, None)
    assert p.targets == {"resize1": 1, "store": 2, "resize2": 1, "recognize": 3}
    assert p.reasons["recognize"].startswith("scale out") and "T(3) 0.260s" in p.reasons["recognize"]
    assert p.reasons["store"].startswith("scale in") and "slowest path through it 0.098s" in p.reasons["store"]
    # function level on the same figures: each function alone within 1 s -> the smallest such k
    # (recognize: k=2 gives 1.055 > 1, k=3 gives 0.26); store and the resizers need only 1
    f = QueueingPolicy().decide(paper_app(), s, current, None)
    assert f.targets == {"resize1": 1, "store": 1, "resize2": 1, "recognize": 3}


def test_queueing_path_level_unstable_function_jumps_to_stable():
    # b: lambda 12, mu 5, k 1 -> rho 2.4, unstable; the smallest stable k is floor(12/5) + 1 = 3:
    # rho 0.8, P = (0.512 + 0.8)/2 = 0.656, Tq = (1/3) * 0.656 / (5 * 0.2) = 0.21867, T = 0.41867
    # a: lambda 12, mu 100: rho 0.12, P = 0.12^sqrt2 = 0.04986, T = 0.01 + 0.04986 / 88 = 0.01057
    # path 0.42923 <= 1: done; it is below 0.5, but b at 2 would be unstable again, so b stays at 3
    s = snap(fs("a", arrival_rate=12.0, service_rate=100.0), fs("b", arrival_rate=12.0, service_rate=5.0))
    assert QueueingPolicy(PATH).decide(chain("a", "b"), s, {"a": 1, "b": 1}, None).targets == {"a": 1, "b": 3}


def test_queueing_path_level_does_not_drag_others_to_the_cap():
    # b: lambda 100, mu 5 is unstable even at 15 (rho 1.33): it goes to 15 and the path stays infinite;
    # the paper's rule picks the slowest function on the path, b, which cannot grow, so a stays at 1
    s = snap(fs("a", arrival_rate=100.0, service_rate=120.0), fs("b", 4, arrival_rate=100.0, service_rate=5.0))
    p = QueueingPolicy(PATH).decide(chain("a", "b"), s, {"a": 1, "b": 4}, None)
    assert p.targets == {"a": 1, "b": 15}
    assert "slowest path through it unstable" in p.reasons["a"]


def test_queueing_path_level_keeps_a_scale_in_that_would_violate():
    # lambda 9.5, b at 2: T_a(1) = 0.05 + 0.475^sqrt2/(20 * 0.525) = 0.0827; T_b(2): rho 0.475,
    # P = 0.475^sqrt3 = 0.27537, Tq = 0.5 * 0.27537 / 5.25 = 0.02623, T = 0.12623; path 0.209 < 0.5,
    # but T_b(1) at rho 0.95: P 0.95, Tq 0.95 / 0.5 = 1.9, T = 2.0 > R_max: the scale-in is undone
    s = snap(fs("a", arrival_rate=9.5, service_rate=20.0), fs("b", 2, arrival_rate=9.5, service_rate=10.0))
    p = QueueingPolicy(PATH).decide(chain("a", "b"), s, {"a": 1, "b": 2}, None)
    assert p.targets == {"a": 1, "b": 2} and not p.reasons["b"].startswith("scale in")


def test_queueing_config_is_checked():
    with pytest.raises(ConfigError, match="level 'galaxy' is unknown"):
        QueueingConfig(level="galaxy")
    with pytest.raises(ConfigError, match=r"alpha must be in \(0, 1\)"):
        QueueingConfig(alpha=1.0)
    with pytest.raises(ConfigError, match="min_parallelism <= max_parallelism"):
        QueueingConfig(min_parallelism=5, max_parallelism=3)


# ---- DS2 -----------------------------------------------------------------------------------------


def test_ds2_three_stage_dag():
    s = snap(
        # a: source 100/s, true rate 50/s per instance, selectivity 100/50 = 2 -> ceil(100/50) = 2
        fs("a", arrival_rate=100.0, true_processing_rate=50.0, true_output_rate=100.0),
        # b: target 100 * 2 = 200/s (observed arrivals, 60/s, are ignored: a is lagging),
        #    true rate 40/s -> ceil(200/40) = 5; selectivity 20/40 = 0.5
        fs("b", arrival_rate=60.0, true_processing_rate=40.0, true_output_rate=20.0),
        # c: target 200 * 0.5 = 100/s, true rate 30/s -> ceil(3.33) = 4
        fs("c", true_processing_rate=30.0, true_output_rate=30.0),
    )
    p = DS2Policy().decide(chain("a", "b", "c"), s, {"a": 1, "b": 1, "c": 1}, None)
    assert p.targets == {"a": 2, "b": 5, "c": 4}
    assert "target rate 200.00/s / true rate 40.00/s" in p.reasons["b"]
    # 20% headroom: b = ceil(200 / (40 * 0.8)) = ceil(6.25) = 7; c = ceil(100 / 24) = 5
    head = DS2Policy(DS2Config(target_utilization=0.8)).decide(chain("a", "b", "c"), s, {"a": 1, "b": 1, "c": 1}, None)
    assert head.targets == {"a": 3, "b": 7, "c": 5}  # a: ceil(100 / 40) = 3


def test_ds2_fan_in_sums_upstream_outputs():
    g = AppGraph.build([FunctionNode("a", ("s1",), "x"), FunctionNode("b", ("s2",), "x"), FunctionNode("c", ("x",), None)])
    s = snap(
        fs("a", arrival_rate=30.0, true_processing_rate=30.0, true_output_rate=30.0),
        fs("b", arrival_rate=10.0, true_processing_rate=10.0, true_output_rate=20.0),
        fs("c", true_processing_rate=25.0),
    )
    # c: 30 * 1 + 10 * 2 = 50/s at 25/s per instance -> 2
    assert DS2Policy().decide(g, s, {"a": 1, "b": 1, "c": 1}, None).targets["c"] == 2


def test_ds2_function_fed_by_a_source_topic_and_a_function():
    g = AppGraph.build([FunctionNode("a", ("s1",), "x"), FunctionNode("c", ("x", "s2"), None)])
    # a: 60/s, selectivity 1 -> sends 60/s at target; it was observed to emit only 40/s (lagging)
    # c: observed 70/s arrive = 40 from a + 30 from s2, so target = 60 + (70 - 40) = 90/s at 20/s -> 5
    s = snap(
        fs("a", arrival_rate=60.0, true_processing_rate=30.0, true_output_rate=30.0, output_rate=40.0),
        fs("c", arrival_rate=70.0, true_processing_rate=20.0),
    )
    p = DS2Policy().decide(g, s, {"a": 1, "c": 1}, None)
    assert p.targets == {"a": 2, "c": 5}


def test_ds2_unknown_figures_keep_current_and_propagate():
    # a's arrival rate is unknown: a and everything downstream of it keep their parallelism
    s = snap(fs("a", 3, true_processing_rate=10.0), fs("b", 2, true_processing_rate=10.0))
    p = DS2Policy().decide(chain("a", "b"), s, {"a": 3, "b": 2}, None)
    assert p.targets == {"a": 3, "b": 2} and "unknown" in p.reasons["b"]
    # a known arrival rate of 0 is not unknown: one instance is enough
    s = snap(fs("a", 3, arrival_rate=0.0, true_processing_rate=10.0))
    assert DS2Policy().decide(chain("a"), s, {"a": 3}, None).targets == {"a": 1}
