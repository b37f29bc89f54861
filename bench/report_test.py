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


# Side by side with the peers: zookeeper, ours and two peers, with figures
# chosen so that the best peer differs from cell to cell. A run's factor
# scales the figures that vary across runs.
FACTORS = {1: 1.0, 2: 1.2, 3: 0.9}


def contended(mode: str, c: int, ops: float, least: int | None = None) -> dict:
    """A contended row over one second: count = ops; least defaults to fair."""
    count = int(ops)
    row = latency("contended", f"{c} processes: wait for the hot key", 1000.0, mode=mode,
                  contenders=c, count=count, least=least if least is not None else count // c,
                  most=count // c + 1)
    row["ops_per_s"] = ops
    return row


def our_zookeeper_rows(f: float) -> list[dict]:
    rows = [
        latency("floor", "exists /", 400.0),
        latency("uncontended", "mutex: acquire_or_renew + release (SPI)", 1000.0 * f, 2.5, 2),
        latency("uncontended", "keyed: try_acquire + release", 2000.0, 5.0, 2, mechanism="lease"),
        latency("handoff", "mutex: stop() -> waiter's on_acquired", 900.0 * f, 2.0, 2, push=True),
        latency("handoff", "keyed: release() -> waiter's try_acquire returns", 3000.0, 7.0, 2,
                push=True),
    ]
    for c in (1, 4, 16):
        # Threads: not compared (the peers contend as processes).
        rows.append(contended("threads", c, 99_999.0))
        rows[-1]["case"] = f"{c} threads: wait for the hot key"
    rows += [contended("processes", 1, 500.0), contended("processes", 4, 350.0),
             contended("processes", 16, 1600.0, least=90)]
    rows[-1]["ops_per_s"] = 250.0  # 1,600 acquisitions, a mean of 100 a process: 0.90
    for c, ops in ((1, 600.0 * f), (4, 400.0 * f)):
        rows.append(contended("locker processes", c, ops))
        rows[-1]["case"] = f"{c} processes, Locker: wait for the hot mutex"
    rows.append(contended("locker processes", 16, 1600.0, least=10))  # 0.10 of the mean
    rows[-1].update(ops_per_s=300.0, case="16 processes, Locker: wait for the hot mutex")
    for row in rows:
        row["store"] = "zookeeper"
    return rows


def peer_rows(peer: str, f: float) -> list[dict]:
    """What bench/peers/run.py prints: null where a figure does not apply."""
    kazoo = peer == "kazoo"
    uncontended = 1500.0 if kazoo else 800.0 * f
    ops = {1: 550.0, 4: 320.0, 16: 280.0} if kazoo else {1: 650.0, 4: 300.0, 16: 200.0}
    least16 = 40 if kazoo else 100  # of a mean 100: 0.40, 1.00
    base = {"store": "zookeeper", "peer": peer, "package": f"python3-{peer} 1.0",
            "api": "kazoo.recipe.lock.Lock" if kazoo else "InterProcessMutex", "p999_us": None,
            "mode": None, "count": None, "least": None, "most": None, "violations": None,
            "overlaps": None, "lost_updates": None, "errors": 0}
    rows = [dict(base, scenario="uncontended", case="acquire + release of a free lock", n=1000,
                 p50_us=uncontended, p99_us=uncontended * 3, max_us=uncontended * 9,
                 ops_per_s=1e6 / uncontended, contenders=1)]
    for c, rate in ops.items():
        count = 1600 if c == 16 else int(rate)
        rows.append(dict(base, scenario="contended", case=f"{c} processes: wait for the hot key",
                         n=count, p50_us=800.0 * c, p99_us=2000.0 * c, max_us=9000.0 * c,
                         ops_per_s=rate, mode="processes", contenders=c, count=count,
                         least=least16 if c == 16 else count // c, most=count // c + 5,
                         violations=0, overlaps=0, lost_updates=0))
    handoff = 2000.0 if kazoo else 5000.0
    rows.append(dict(base, scenario="handoff", case="release() -> waiter's acquire returns", n=50,
                     p50_us=handoff, p99_us=handoff * 4, max_us=handoff * 5, ops_per_s=None,
                     contenders=2))
    return rows


def add_peer_results(directory: Path) -> None:
    """zookeeper (ours, 3 runs) and its peers kazoo and curator (3 runs)."""
    for run, f in FACTORS.items():
        lines = ["cpus: 2"] + [json.dumps(r) for r in our_zookeeper_rows(f)]
        (directory / f"zookeeper-{run}.jsonl").write_text("\n".join(lines) + "\n")
        (directory / f"zookeeper-{run}.log").write_text("built\n")
        lines = [json.dumps(r, separators=(",", ":")) for r in peer_rows("kazoo", f) + peer_rows("curator", f)]
        (directory / f"zookeeper-peers-{run}.jsonl").write_text("\n".join(lines) + "\n")
        (directory / f"zookeeper-peers-{run}.log").write_text("server: zookeeper://127.0.0.1:1\n")
    machine = json.loads((directory / "machine.json").read_text())
    machine["kinds"].insert(-1, "zookeeper")
    machine["peers"] = {"redis": "not installed: redis-py needs python3-redis", "postgres": "run",
                        "mysql": "run", "zookeeper": "run", "etcd": "run"}
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

    def side_by_side(self) -> str:
        body = self.between(self.run_report())
        self.assertIn("#### Side by side with the peers (same run, same servers)", body)
        return body.split("#### Side by side with the peers", 1)[1].split("#### Targets missed", 1)[0]

    def line(self, section: str, figure: str) -> str:
        lines = [l for l in section.splitlines() if l.startswith(f"| zookeeper | {figure} |")]
        self.assertEqual(len(lines), 1, (figure, section))
        return lines[0]

    def test_peer_rows_are_loaded_apart_from_ours(self) -> None:
        add_peer_results(self.results)
        results = report.load_results(self.results)
        self.assertFalse(any(row.peer for row in results.rows))
        self.assertEqual(sorted({row.peer for row in results.peer_rows}), ["curator", "kazoo"])
        kazoo16 = next(r for r in results.peer_rows if r.peer == "kazoo" and r.contenders == 16)
        self.assertEqual((kazoo16.store, kazoo16.scenario, kazoo16.mode), ("zookeeper", "contended", "processes"))
        self.assertEqual(sorted(kazoo16.runs), [1, 2, 3])
        # The peers' contended case is spelled as our keyed one: still two rows.
        ours16 = [r for r in results.rows if r.store == "zookeeper" and r.contenders == 16
                  and r.mode == "processes"]
        self.assertEqual(len(ours16), 1)
        self.assertEqual(ours16[0].median("least"), 90)
        self.assertEqual(results.peer_rows_per_run["zookeeper"], {1: 10, 2: 10, 3: 10})
        # Peer rows appear in no table or chart of ours.
        body = self.between(self.run_report())
        before = body.split("#### Side by side with the peers", 1)[0]
        self.assertNotIn("kazoo", before)
        self.assertNotIn("curator", before)
        for chart in self.charts.iterdir():
            self.assertNotIn("kazoo", chart.read_text())

    def test_side_by_side_with_the_peers(self) -> None:
        add_peer_results(self.results)
        section = self.side_by_side()
        self.assertIn("| store | figure | ours | best peer | ours ÷ peer | target |", section)
        # Uncontended: curator is the best peer (800 µs × the run's factor);
        # every run's ratio is 1.25.
        self.assertEqual(self.line(section, "uncontended p50: mutex (SPI pair)"),
                         "| zookeeper | uncontended p50: mutex (SPI pair) | 1.00 ms <small>(0.90–1.20)</small> "
                         "| curator: 800 µs <small>(720–960)</small> | 1.25× | ≤ 1×: **missed** |")
        # The ratio is the median of the runs' ratios: 2000 ÷ {800, 960, 720}.
        self.assertIn("| 2.00 ms | curator: 800 µs <small>(720–960)</small> | 2.50× <small>(2.08–2.78)</small> "
                      "| ≤ 1×: **missed** |", self.line(section, "uncontended p50: keyed"))
        # Throughput: the best peer differs by contenders (curator at 1, kazoo at 4 and 16).
        self.assertEqual(self.line(section, "ops/s, 1 process: `Locker`"),
                         "| zookeeper | ops/s, 1 process: `Locker` | 600 <small>(540–720)</small> | curator: 650 "
                         "| 0.92× <small>(0.83–1.11)</small> | ≥ 1×: **missed** |")
        self.assertIn("| kazoo: 320 | 1.25× <small>(1.12–1.50)</small> | ≥ 1×: met |",
                      self.line(section, "ops/s, 4 processes: `Locker`"))
        self.assertIn("| 300 | kazoo: 280 | 1.07× | ≥ 1×: met |", self.line(section, "ops/s, 16 processes: `Locker`"))
        self.assertIn("| 500 | curator: 650 | 0.77× | ≥ 1×: **missed** |",
                      self.line(section, "ops/s, 1 process: keyed"))
        self.assertIn("| 350 | kazoo: 320 | 1.09× | ≥ 1×: met |", self.line(section, "ops/s, 4 processes: keyed"))
        self.assertIn("| 250 | kazoo: 280 | 0.89× | ≥ 1×: **missed** |",
                      self.line(section, "ops/s, 16 processes: keyed"))
        # Our threads rows (99,999 ops/s) are not compared.
        self.assertNotIn("99,999", section)
        # Fairness at 16: least ÷ mean (1,600 ÷ 16 = 100); curator is the fairer peer.
        self.assertEqual(self.line(section, "least-served of 16 processes: `Locker`"),
                         "| zookeeper | least-served of 16 processes: `Locker` | 10 of a mean 100: 0.10 "
                         "| curator: 100 of a mean 100: 1.00 | – | ≥ ¼ mean: **missed** <small>(peer: met)</small> |")
        self.assertIn("| 90 of a mean 100: 0.90 | curator: 100 of a mean 100: 1.00 | – "
                      "| ≥ ¼ mean: met <small>(peer: met)</small> |",
                      self.line(section, "least-served of 16 processes: keyed"))
        # Hand-off: kazoo (2 ms) beats curator (5 ms).
        self.assertIn("| kazoo: 2.00 ms | 0.45×", self.line(section, "hand-off p50: mutex"))
        self.assertIn("≤ 1×: met |", self.line(section, "hand-off p50: mutex"))
        self.assertIn("| 3.00 ms | kazoo: 2.00 ms | 1.50× | ≤ 1×: **missed** |",
                      self.line(section, "hand-off p50: keyed"))
        # The peers and their packages; the stores without a peer run, and why.
        self.assertIn("* zookeeper: curator (python3-curator 1.0: InterProcessMutex), "
                      "kazoo (python3-kazoo 1.0: kazoo.recipe.lock.Lock)", section)
        self.assertIn("* redis: no peer run (not installed: redis-py needs python3-redis)", section)
        self.assertIn("* postgresql: no peer run\n", section)
        self.assertIn("* etcd: no peer run\n", section)
        self.assertNotIn("| redis |", section)
        # The misses join the report's list.
        body = self.between(self.markdown.read_text())
        missed = body.split("#### Targets missed", 1)[1]
        self.assertIn("* zookeeper, against the peers, uncontended p50: mutex (SPI pair): "
                      "1.25× curator's p50, target ≤ 1×", missed)
        self.assertIn("* zookeeper, against the peers, ops/s, 16 processes: keyed: 0.89× kazoo's ops/s, "
                      "target ≥ 1×", missed)
        self.assertIn("* zookeeper, against the peers, least-served of 16 processes: `Locker`: "
                      "least-served process 0.10 of the mean, target ≥ 0.25", missed)
        self.assertNotIn("ops/s, 4 processes: `Locker`", missed)

    def test_a_durable_token_floor_is_a_table_of_its_own_never_the_best_peer(self) -> None:
        add_peer_results(self.results)
        for run, f in FACTORS.items():
            rows = peer_rows("kazoo", f)
            for row in rows:
                row["peer"] = "kazoo+token"
                if row["scenario"] == "uncontended":
                    row["p50_us"] = 200.0 * f  # faster than every peer: still not the best peer
            path = self.results / f"zookeeper-peers-{run}.jsonl"
            path.write_text(path.read_text() + "\n".join(json.dumps(r) for r in rows) + "\n")
        section = self.side_by_side()
        peers, floor = section.split("Against a lock with a durable fencing token", 1)
        self.assertIn("| curator: 800 µs <small>(720–960)</small> | 1.25× | ≤ 1×: **missed** |",
                      self.line(peers, "uncontended p50: mutex (SPI pair)"))
        self.assertNotIn("+token", peers.split("* zookeeper:", 1)[0])
        self.assertIn("| store | figure | ours | floor | ours ÷ floor |", floor)
        self.assertEqual(self.line(floor, "uncontended p50: mutex (SPI pair)"),
                         "| zookeeper | uncontended p50: mutex (SPI pair) | 1.00 ms <small>(0.90–1.20)</small> "
                         "| kazoo+token: 200 µs <small>(180–240)</small> | 5.00× |")
        self.assertIn("| 300 | kazoo+token: 280 | 1.07× |", self.line(floor, "ops/s, 16 processes: `Locker`"))
        self.assertIn("| kazoo+token: 2.00 ms |", self.line(floor, "hand-off p50: mutex"))
        # Mutex figures only, and no target.
        self.assertNotIn("keyed", floor.split("* zookeeper:", 1)[0])
        self.assertNotIn("least-served", floor)
        missed = self.between(self.markdown.read_text()).split("#### Targets missed", 1)[1]
        self.assertNotIn("+token", missed)

    def test_a_failed_peer_run_and_a_violation_are_said(self) -> None:
        add_peer_results(self.results)
        (self.results / "zookeeper-peers-2.jsonl").write_text("")
        machine = json.loads((self.results / "machine.json").read_text())
        machine["failed"].append("zookeeper-peers-2")
        (self.results / "machine.json").write_text(json.dumps(machine))
        path = self.results / "zookeeper-peers-3.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        for row in rows:
            if row["peer"] == "kazoo" and row["contenders"] == 16:
                row.update(violations=2, overlaps=1, lost_updates=1)
        rows.append({"store": "zookeeper", "scenario": "uncontended", "case": "no peer field"})
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        body = self.between(self.run_report())
        section = self.side_by_side()
        # Our zookeeper runs are not the failed ones.
        self.assertIn("| zookeeper | – | 3 of 3 |  |", body)
        self.assertIn("* zookeeper: peer run 2 failed or empty (see "
                      "[zookeeper-peers-2.log](../bench/results/latest/zookeeper-peers-2.log))", section)
        self.assertIn("* zookeeper: **kazoo violated exclusion** in run 3 with 16 processes "
                      "(1 overlaps, 1 increments lost)", section)
        # Ratios pair the runs both sides have: 2000 ÷ {800, 720}.
        self.assertIn("| 2.00 ms | curator: 760 µs <small>(720–800)</small> <small>(2 of 3 runs)</small> "
                      "| 2.64× <small>(2.50–2.78)</small> |", self.line(section, "uncontended p50: keyed"))
        # The row without a peer field is not taken for one (nor for ours);
        # the other unreadable line is etcd-1's.
        self.assertIn("* 2 unreadable JSON line(s) skipped", body)

    def test_results_without_peers_say_so(self) -> None:
        section = self.side_by_side()
        self.assertIn("No peer run in these results", section)
        self.assertNotIn("| store | figure |", section)
        self.assertNotIn("* redis", section)  # no reason recorded: nothing more to say
        machine = json.loads((self.results / "machine.json").read_text())
        machine["peers"] = {kind: "skipped: --no-peers" for kind in ("redis", "postgres", "mysql", "etcd")}
        (self.results / "machine.json").write_text(json.dumps(machine))
        section = self.side_by_side()
        self.assertIn("* redis: no peer run (skipped: --no-peers)", section)
        self.assertIn("* etcd: no peer run (skipped: --no-peers)", section)
        # A peer run that failed without a row: said with its log.
        machine["peers"]["redis"] = "run"
        machine["failed"].append("redis-peers-1")
        (self.results / "machine.json").write_text(json.dumps(machine))
        (self.results / "redis-peers-1.jsonl").write_text("")
        (self.results / "redis-peers-1.log").write_text("bench-peers.sh: failed: redis-py\n")
        section = self.side_by_side()
        self.assertIn("* redis: no peer run (run 1 failed or empty: see "
                      "[redis-peers-1.log](../bench/results/latest/redis-peers-1.log))", section)
        # Stores without peers get no section at all.
        for path in self.results.iterdir():
            if not path.name.startswith(("memory-", "machine")):
                path.unlink()
        machine.update(kinds=["memory"], peers={}, failed=[])
        (self.results / "machine.json").write_text(json.dumps(machine))
        self.assertNotIn("Side by side", self.run_report())

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
