#!/usr/bin/env python3
"""Tests bench/report.py on synthetic `simba-bench --json` output.

    python3 bench/report_test.py        (or: python3 -m unittest bench/report_test.py)

Standard library only; runs report.py as a program, the way
scripts/bench-report.sh does, into a temporary directory.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET
from pathlib import Path

REPORT = Path(__file__).resolve().parent / "report.py"
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, str(REPORT.parent))
import report  # noqa: E402

QS = [0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0]


def quantiles(p50: float) -> list[list[float]]:
    # A plausible shape around p50: min at 0.6×, max at 20×.
    factors = [0.6, 0.7, 0.8, 0.85, 0.93, 1.0, 1.1, 1.3, 1.5, 2.5, 5.0, 20.0]
    return [[q, round(p50 * f, 1)] for q, f in zip(QS, factors)]


def latency(scenario: str, case: str, p50: float, ratio: float = 0.0, trips: int = 0, **extra) -> dict:
    row = {
        "scenario": scenario, "case": case, "n": 1000, "p50_us": p50, "p99_us": round(p50 * 2.5, 1),
        "p999_us": p50 * 5, "max_us": p50 * 20, "ops_per_s": round(1e6 / p50, 1) if p50 else 0,
        "floor_ratio": ratio, "round_trips": trips, "quantiles_us": quantiles(p50),
    }
    row.update(extra)
    return row


def store_rows(store: str, floor: float, scale: float) -> list[dict]:
    """All scenarios of one store; `scale` varies the figures per run."""
    push = store != "memory" and store != "sqlite"
    rows = [
        latency("floor", "PING" if store == "redis" else "one call", floor),
        latency("uncontended", "mutex: acquire_or_renew + release (SPI)", floor * 2.5 * scale,
                2.5 * scale, 2),
        latency("uncontended", "keyed: try_acquire + release", floor * 7 * scale, 3.5 * scale, 2,
                mechanism="lease"),
        latency("handoff", "mutex: stop() -> waiter's on_acquired", floor * 8 * scale, 4.0 * scale, 2,
                push=push),
        latency("handoff", "keyed: release() -> waiter's try_acquire returns", floor * 12 * scale,
                6.0 * scale, 2, push=push),
    ]
    for mode in ("threads", "processes"):
        for c in (1, 4, 16):
            row = latency("contended", f"{c} {mode}: wait for the hot key", floor * c * scale)
            ops = 250_000 / floor * (0.7 if mode == "processes" else 1.0) / c**0.5
            row.update(mode=mode, contenders=c, count=int(1000 * scale), least=50 * c,
                       most=60 * c + (1 if scale > 1 else 0), ops_per_s=round(ops * scale, 1))
            rows.append(row)
    takeover = (2.0e6 if store == "redis" else 1.5e6) * scale
    rows.append(latency("failover", "mutex: holder SIGKILLed -> waiter acquires", takeover,
                        ttl_ms=2000, transition_ms=1000, bound_ms=4000,
                        max_us=takeover * (2.2 if store == "redis" else 1.3)))
    rows.append(latency("failover", "keyed: holder SIGKILLed -> waiter's try_acquire returns",
                        takeover * 0.8, ttl_ms=2000, transition_ms=1000, bound_ms=4000,
                        max_us=takeover * 0.9))
    rows.append(latency("scale", "10000 keys held by one provider", 0, n=0, keys=10000, threads=5,
                        sockets=1, rss_mib=30.0, store_ops_per_s=5000, renewal_lag_p99_ms=0,
                        renewals=20000, lost=0, quantiles_us=[], mechanism="lease"))
    rows.append(latency("scale", "10000 mutexes held by one factory", 0, n=0, mutexes=10000,
                        threads=6 if store != "redis" else 12, sockets=2, rss_mib=41.5 * scale,
                        store_ops_per_s=9900 * scale, renewal_lag_p99_ms=12.0 * scale, renewals=30000,
                        lost=0, quantiles_us=[]))
    for row in rows:
        row["store"] = store
        if row["n"] == 0:
            row.update(p50_us=0, p99_us=0, p999_us=0, max_us=0, ops_per_s=0)
    return rows


def make_results(directory: Path) -> None:
    """memory and redis and postgres (3 runs each), mysql empty, etcd run 1 only noise."""
    directory.mkdir(parents=True, exist_ok=True)
    scales = {1: 1.0, 2: 1.2, 3: 0.9}
    floors = {"memory": 0.5, "redis": 50.0, "postgresql": 120.0}
    for kind, store in (("memory", "memory"), ("redis", "redis"), ("postgres", "postgresql")):
        for run, scale in scales.items():
            lines = ["cpus: 2, AMD EPYC", "kernel: Linux 6.1"]
            lines += [json.dumps(r) for r in store_rows(store, floors[store], scale)]
            lines.append("load average after: 1.0 1.0 1.0")
            (directory / f"{kind}-{run}.jsonl").write_text("\n".join(lines) + "\n")
            (directory / f"{kind}-{run}.log").write_text("built\n")
    for run in (1, 2, 3):
        (directory / f"mysql-{run}.jsonl").write_text("")
        (directory / f"mysql-{run}.log").write_text("simba-bench: cannot connect\n")
    (directory / "etcd-1.jsonl").write_text("cpus: 2\n{not json\n")
    machine = {
        "command": "scripts/bench-report.sh --runs 3", "cpus": 2, "cpu_model": "AMD EPYC",
        "kernel": "Linux 6.1", "date": "2024-01-02T03:04:05Z", "load_before": "1.00 0.90 0.80",
        "load_after": "1.10 0.95 0.85", "runs": 3,
        "kinds": ["memory", "redis", "postgres", "mysql", "etcd"],
        "failed": ["mysql-1", "mysql-2", "mysql-3", "etcd-1"],
        "versions": {"redis": "Redis server v=7.0.15", "postgres": "postgres (PostgreSQL) 15.5"},
    }
    (directory / "machine.json").write_text(json.dumps(machine))


BEFORE = "# Title\n\nHand-written text before.\n\n"
AFTER = "\n## Where the time goes\n\nHand-written text after.\n"


class ReportTest(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        self.root = Path(self.tmp.name)
        self.results = self.root / "bench" / "results" / "latest"
        self.docs = self.root / "docs"
        self.docs.mkdir()
        self.markdown = self.docs / "benchmarks.md"
        self.charts = self.docs / "bench"
        make_results(self.results)

    def tearDown(self) -> None:
        self.tmp.cleanup()

    def run_report(self, *extra: str) -> str:
        proc = subprocess.run(
            [sys.executable, str(REPORT), "--results", str(self.results), "--markdown",
             str(self.markdown), "--charts", str(self.charts), *extra],
            capture_output=True, text=True,
        )
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return self.markdown.read_text(encoding="utf-8")

    def between(self, text: str) -> str:
        return text.split(report.BEGIN, 1)[1].split(report.END, 1)[0]

    def test_text_outside_the_markers_is_untouched_and_rerun_is_identical(self) -> None:
        self.markdown.write_text(BEFORE + report.BEGIN + "\nold report\n" + report.END + AFTER)
        first = self.run_report()
        self.assertTrue(first.startswith(BEFORE + report.BEGIN + "\n"))
        self.assertTrue(first.endswith(report.END + AFTER))
        self.assertNotIn("old report", first)
        charts = {p.name: p.read_bytes() for p in self.charts.iterdir()}
        second = self.run_report()
        self.assertEqual(first, second)
        self.assertEqual(charts, {p.name: p.read_bytes() for p in self.charts.iterdir()})

    def test_markers_are_appended_when_absent(self) -> None:
        self.markdown.write_text(BEFORE.rstrip("\n"))  # no final newline either
        text = self.run_report()
        self.assertTrue(text.startswith(BEFORE.rstrip("\n") + "\n\n" + report.BEGIN + "\n"))
        self.assertTrue(text.endswith(report.END + "\n"))
        self.assertEqual(text, self.run_report())

    def test_medians_and_spreads(self) -> None:
        self.markdown.write_text(BEFORE + report.BEGIN + "\n" + report.END + AFTER)
        body = self.between(self.run_report())
        # redis mutex acquire + release: p50 = 125 × {1, 1.2, 0.9} -> median 125,
        # range 112.5–150; floor ratio 2.5 × ... -> 2.50× (2.25–3.00).
        self.assertIn("| redis | mutex: acquire_or_renew + release (SPI) | 125 µs <small>(112–150)</small> |",
                      body)
        self.assertIn("2.50× <small>(2.25–3.00)</small> | met |", body)
        # Keyed: ratio 3.5 × {1, 1.2, 0.9} -> median 3.5 > 3: missed, and listed.
        self.assertIn("| redis | keyed: try_acquire + release <small>(lease)</small> | 350 µs", body)
        self.assertIn("3.50× <small>(3.15–4.20)</small> | **missed** |", body)
        self.assertIn("* redis, uncontended, keyed: try_acquire + release: 3.50× floor, target ≤ 3×",
                      body)
        # Latency units: memory is sub-µs, postgresql hand-off in ms.
        self.assertIn("| memory | one call | 0.50 µs", body)
        self.assertIn("| postgresql | mutex: stop() -> waiter's on_acquired | 960 µs", body)
        self.assertIn("| postgresql | keyed: release() -> waiter's try_acquire returns | 1.44 ms "
                      "<small>(1.30–1.73)</small>", body)
        # Hand-off targets: memory does not push.
        self.assertIn("| no | polls (no target) |", body)
        # Contended: median ops/s 250000 / 50 / √4 = 2500, fairness 200 / 240.
        self.assertIn("| redis | threads | 4 | 2,500 <small>(2,250–3,000)</small> |", body)
        self.assertIn("| 200 / 240 (1.20×) | exact |", body)
        # Failover: the worst run of redis is 2.4 s × 2.2 = 5.28 s > bound 4 s.
        self.assertIn("| redis | mutex: holder SIGKILLed -> waiter acquires | 2.00 s "
                      "<small>(1.80–2.40)</small> | 5.28 s | 4 s "
                      "<small>(ttl 2 s + transition 1 s + 1 s)</small> | **no** |", body)
        self.assertIn("<small>(ttl 2 s + transition 1 s + 1 s)</small> | yes |", body)
        self.assertIn("* redis, failover, mutex: holder SIGKILLed -> waiter acquires: "
                      "worst takeover 5.28 s, bound 4 s", body)
        # Scale: redis uses 12 threads: missed.
        self.assertIn("| redis | 10000 mutexes held by one factory | 10,000 mutexes | 12 | 2 |", body)
        self.assertIn("* redis, scale, 10000 mutexes held by one factory: 12 threads, 2 sockets", body)
        self.assertNotIn("lease(s) lost", body)
        self.assertIn("| redis | 10000 keys held by one provider <small>(lease)</small> | 10,000 keys | 5 | 1 |",
                      body)
        # Machine, versions, command.
        self.assertIn("scripts/bench-report.sh --runs 3", body)
        self.assertIn("Redis server v=7.0.15", body)
        self.assertIn("load average before: 1.00 0.90 0.80; after: 1.10 0.95 0.85", body)
        # Stores in the fixed order.
        self.assertLess(body.index("| memory | one call"), body.index("| redis | PING"))
        self.assertLess(body.index("| redis | PING"), body.index("| postgresql | one call"))
        # Charts are embedded relative to the markdown file.
        for name in report.CHART_FILES:
            self.assertIn(f"](bench/{name})", body)

    def test_median_function_of_the_rows(self) -> None:
        results = report.load_results(self.results)
        row = next(r for r in results.rows if r.store == "redis" and r.scenario == "uncontended"
                   and r.case.startswith("mutex"))
        self.assertEqual(row.values("p50_us"), [125.0, 150.0, 112.5])
        self.assertEqual(row.median("p50_us"), 125.0)
        self.assertEqual(row.median_run()["p50_us"], 125.0)
        two = report.Row("x", "uncontended", "c", runs={1: {"p50_us": 10}, 2: {"p50_us": 20}})
        self.assertEqual(two.median("p50_us"), 15.0)
        self.assertEqual(two.median_run()["p50_us"], 10)  # the lower middle run

    def test_svgs_are_well_formed(self) -> None:
        self.run_report("--command", "custom command")
        names = sorted(p.name for p in self.charts.iterdir())
        self.assertEqual(names, sorted(report.CHART_FILES))
        for name in names:
            root = ET.parse(self.charts / name).getroot()
            self.assertEqual(root.tag, "{http://www.w3.org/2000/svg}svg", name)
            self.assertTrue(root.findall(".//{http://www.w3.org/2000/svg}polyline")
                            or root.findall(".//{http://www.w3.org/2000/svg}rect"), name)
        self.assertIn("custom command", self.markdown.read_text())

    def test_failed_and_empty_kinds_are_reported_not_fatal(self) -> None:
        body = self.between(self.run_report())
        self.assertIn("| mysql | – | 0 of 3 | no result (see [mysql-1.log](../bench/results/latest/mysql-1.log)",
                      body)
        self.assertIn("| etcd | – | 0 of 3 | no result (see the logs) |", body)
        # A store that failed one run: the row says how many runs it has.
        (self.results / "redis-2.jsonl").write_text("")
        body = self.between(self.run_report())
        self.assertIn("| redis | Redis server v=7.0.15 | 2 of 3 | run 2 failed or empty", body)
        self.assertIn("<small>(2 of 3 runs)</small>", body)

    def test_a_lost_lease_is_listed(self) -> None:
        path = self.results / "postgres-2.jsonl"
        lines = []
        for line in path.read_text().splitlines():
            if line.startswith("{") and '"scenario": "scale"' in line:
                row = json.loads(line)
                row["lost"] = 3
                line = json.dumps(row)
            lines.append(line)
        path.write_text("\n".join(lines) + "\n")
        body = self.between(self.run_report())
        self.assertIn("* postgresql, scale, 10000 mutexes held by one factory: 3 lease(s) lost in a run",
                      body)

    def test_no_results_at_all(self) -> None:
        for path in self.results.iterdir():
            path.unlink()
        body = self.between(self.run_report())
        self.assertIn("not recorded", body)
        self.assertIn("* none", body)
        self.assertFalse(any(self.charts.iterdir()))

    def test_an_override_replaces_its_scenarios_only(self) -> None:
        # A rerun of the scale scenario alone (with its floor, as every run
        # measures one) in a directory of its own.
        scale_dir = self.root / "bench" / "results" / "scale"
        scale_dir.mkdir(parents=True)
        for run in (1, 2, 3):
            rows = [latency("floor", "PING", 999.0),
                    latency("scale", "10000 mutexes held by one factory", 0, n=0, mutexes=10000,
                            threads=7, sockets=2, rss_mib=77.0, store_ops_per_s=1234,
                            renewal_lag_p99_ms=5.0, renewals=20000, lost=0, quantiles_us=[])]
            for row in rows:
                row["store"] = "redis"
            (scale_dir / f"redis-{run}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        (scale_dir / "machine.json").write_text(json.dumps(
            {"command": "scripts/bench-report.sh -- --scenario scale", "runs": 3, "kinds": ["redis"]}))
        self.markdown.write_text(BEFORE + report.BEGIN + "\n" + report.END + "\n" + AFTER)
        section = self.between(self.run_report("--override", str(scale_dir)))
        self.assertIn("`scripts/bench-report.sh -- --scenario scale`", section)
        scale_table = section.split("Scale", 1)[1]
        # Redis's scale rows are the override's: its mutex row, and no keyed row.
        redis_rows = [line for line in scale_table.splitlines() if line.startswith("| redis |")]
        self.assertEqual(len(redis_rows), 1, redis_rows)
        self.assertIn("77.0", redis_rows[0])
        # The main directory's other scenarios and its floor stay.
        self.assertNotIn("999", section.split("Uncontended", 1)[0])
        self.assertIn("| redis | PING |", section)
        self.assertIn("Hand-off", section)

    def test_mismatched_markers_are_refused(self) -> None:
        original = BEFORE + report.END + "\n" + report.BEGIN + "\n" + AFTER
        self.markdown.write_text(original)
        proc = subprocess.run(
            [sys.executable, str(REPORT), "--results", str(self.results), "--markdown",
             str(self.markdown), "--charts", str(self.charts)],
            capture_output=True, text=True,
        )
        self.assertNotEqual(proc.returncode, 0)
        self.assertEqual(self.markdown.read_text(), original)


if __name__ == "__main__":
    unittest.main()
