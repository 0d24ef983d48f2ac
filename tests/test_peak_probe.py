"""benchmarks/peak_probe.py's replay of allocator events (the GPU run itself needs CUDA)."""

from __future__ import annotations

from helpers import benchmark_script


def _module():
    return benchmark_script("peak_probe")


def test_live_at_peak_replays_allocations_and_frees():
    probe = _module()
    frame = [{"filename": "/x/site-packages/torch/nn/f.py", "line": 1, "name": "inner"},
             {"filename": "/w/src/ragdot/ops.py", "line": 262, "name": "vjp"}]
    events = [
        {"action": "alloc", "addr": 1, "size": 100, "frames": frame},
        {"action": "alloc", "addr": 2, "size": 50, "frames": []},
        {"action": "free_requested", "addr": 1, "size": 100},  # not yet free
        {"action": "free_completed", "addr": 1, "size": 100},
        {"action": "alloc", "addr": 3, "size": 120, "frames": frame},  # 170 alive: the peak
        {"action": "free_completed", "addr": 3, "size": 120},
        {"action": "free_completed", "addr": 99, "size": 7},  # allocated before the trace: ignored
    ]
    found = probe.live_at_peak(events, top=5)
    assert found["peak_bytes"] == 170
    assert [b["size"] for b in found["blocks"]] == [120, 50]
    assert found["blocks"][0]["where"] == "ops.py:262 vjp"  # torch's own frames skipped
    assert found["blocks"][1]["where"] == "(no Python frame)"


def test_timeline_lists_large_blocks_in_order_with_the_running_total():
    probe = _module()
    events = [
        {"action": "alloc", "addr": 1, "size": 100, "frames": []},
        {"action": "alloc", "addr": 2, "size": 5, "frames": []},  # small: counted, not listed
        {"action": "free_completed", "addr": 1, "size": 100},
        {"action": "free_completed", "addr": 99, "size": 300},  # allocated before the trace: ignored
    ]
    rows = probe.timeline(events, min_bytes=50)
    assert [(r["action"], r["mib"] * 2**20) for r in rows] == [("alloc", 100), ("free_completed", 100)]
    assert [round(r["now_gib"] * 2**30) for r in rows] == [100, 5]
