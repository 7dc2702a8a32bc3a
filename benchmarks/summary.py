"""The benchmark's verdicts: throughput rows, ratios, each engine's start-up, the targets marked
PASS / FAIL / NOT MEASURED, and the correctness of every result table; and the summary text printed at the end
(which report.md repeats). Targets are measurements, not assertions: only a wrong table fails."""

from __future__ import annotations

from typing import Any

from benchmarks.config import BenchConfig


def summarize(r: dict[str, Any], cfg: BenchConfig) -> dict[str, Any]:
    """The headline numbers of a report (rates and ratios per core), so runs on different machines compare."""
    ours, sss, raw = r["ours"], r["structured_streaming"], r["raw_kafka"]
    raw_eps = raw["no_decode"]["records_per_s"]
    cores = cfg.parallelism
    e2e_ratio = ours["events_per_s"] / sss["events_per_s"] if sss["events_per_s"] else None
    ours_steady, sss_steady = ours["steady"]["events_per_s"], sss["steady"]["events_per_s"]
    per_core_steady = (ours_steady / cores) / raw_eps if ours_steady else None
    per_core_e2e = (ours["events_per_s"] / cores) / raw_eps
    inc = r["snapshots"]["incremental"].get("key_groups", {})
    inc_share = max((e["written_share"] for e in inc.get("epochs", []) if e["written_share"] is not None), default=None)
    kafka = r.get("structured_streaming_kafka")  # Spark's Kafka connector, S3A checkpoint
    kafka_e2e = ours["events_per_s"] / kafka["events_per_s"] if kafka and kafka["events_per_s"] else None
    kafka_steady = kafka["steady"]["events_per_s"] if kafka else None
    kafka_steady_ratio = ours_steady / kafka_steady if ours_steady and kafka_steady else None
    local = r.get("structured_streaming_kafka_local")  # Spark's Kafka connector, local checkpoint
    local_e2e = ours["events_per_s"] / local["events_per_s"] if local and local["events_per_s"] else None
    local_steady = local["steady"]["events_per_s"] if local else None
    confluent = r.get("raw_confluent")
    confluent_eps = confluent["no_decode"]["records_per_s"] if confluent else None
    short = r.get("short_runs")
    short_speedup = short["ours_speedup"] if short else None
    short_first = short["ours"]["first_epoch_after_session_s"] if short else None
    million = next((x for x in r["restore"] if x["keys"] == 1_000_000), None)
    biggest = max(r["restore"], key=lambda x: x["keys"], default=None)

    def verdict(ok: bool | None) -> str:
        return "NOT MEASURED" if ok is None else ("PASS" if ok else "FAIL")

    targets = [
        {
            "target": "end-to-end events/s, ours / Structured Streaming (whole process, snapshot every epoch)",
            "goal": ">= 1.5x",
            "measured": e2e_ratio,
            "unit": "x",
            "status": verdict(None if e2e_ratio is None else e2e_ratio >= 1.5),
        },
        {
            "target": f"steady-state events/s per core (ours / {cores} cores) / raw kafka-python "
            "(1 thread, no decoding)",
            "goal": ">= 50%",
            "measured": per_core_steady,
            "unit": "%",
            "status": verdict(None if per_core_steady is None else per_core_steady >= 0.5),
        },
        {
            "target": f"incremental snapshot: bytes written by an epoch touching {inc.get('key_groups_share', 0):.1%} "
            "of the key groups / full snapshot bytes",
            "goal": "<= 10%",
            "measured": inc_share,
            "unit": "%",
            "status": verdict(None if inc_share is None else inc_share <= 0.10),
        },
        {
            "target": "restore of a 1M-key state (PipelineRunner.restore)",
            "goal": "<= 5 s",
            "measured": million["restore_s"] if million else None,
            "unit": "s",
            "status": verdict(None if million is None else million["restore_s"] <= 5.0),
            "note": None
            if million
            else (
                f"largest size measured: {biggest['keys']:,} keys in {biggest['restore_s']:.2f} s"
                if biggest
                else "no restore sizes measured"
            ),
        },
        {
            "target": "end-to-end events/s, ours / Structured Streaming (Kafka connector, S3A checkpoint)",
            "goal": ">= 1.5x",
            "measured": kafka_e2e,
            "unit": "x",
            "status": verdict(None if kafka_e2e is None else kafka_e2e >= 1.5),
        },
        {
            "target": "steady events/s, ours / Structured Streaming (Kafka connector, S3A checkpoint)",
            "goal": ">= 2x",
            "measured": kafka_steady_ratio,
            "unit": "x",
            "status": verdict(None if kafka_steady_ratio is None else kafka_steady_ratio >= 2.0),
        },
        {
            "target": f"short scheduled run ({short['events']:,}-event backlog): whole process, Structured Streaming "
            "(Kafka connector, S3A checkpoint) / ours --until-caught-up"
            if short
            else "short scheduled run: whole process, Structured Streaming (Kafka connector) / ours",
            "goal": ">= 1.5x",
            "measured": short_speedup,
            "unit": "x",
            "status": verdict(None if short_speedup is None else short_speedup >= 1.5),
        },
        {
            "target": "short scheduled run: ours, epoch 1 committed after the Spark session was up",
            "goal": "<= 1.5 s",
            "measured": short_first,
            "unit": "s",
            "status": verdict(None if short_first is None else short_first <= 1.5),
        },
    ]
    correct = all(c["verified"] for _, c in checks(r))
    return {
        "throughput": [
            {
                "what": "ours, end to end (whole `pipeline-lib run` process)",
                "events_per_s": ours["events_per_s"],
                "seconds": ours["wall_s"],
            },
            {
                "what": "ours, steady epochs (2..n, inside the run)",
                "events_per_s": ours_steady,
                "seconds": ours["steady"]["seconds"],
            },
            {
                "what": "Structured Streaming, end to end (whole process)",
                "events_per_s": sss["events_per_s"],
                "seconds": sss["wall_s"],
            },
            {
                "what": "Structured Streaming, steady batches (2..n, triggerExecution)",
                "events_per_s": sss_steady,
                "seconds": sss["steady"]["seconds"],
            },
            *(
                [
                    {
                        "what": "Structured Streaming + Kafka connector + S3A checkpoint, end to end (whole process)",
                        "events_per_s": kafka["events_per_s"],
                        "seconds": kafka["wall_s"],
                    },
                    {
                        "what": "Structured Streaming + Kafka connector + S3A checkpoint, steady batches (2..n)",
                        "events_per_s": kafka_steady,
                        "seconds": kafka["steady"]["seconds"],
                    },
                ]
                if kafka
                else []
            ),
            *(
                [
                    {
                        "what": "Structured Streaming + Kafka connector + local checkpoint, end to end (whole process)",
                        "events_per_s": local["events_per_s"],
                        "seconds": local["wall_s"],
                    },
                    {
                        "what": "Structured Streaming + Kafka connector + local checkpoint, steady batches (2..n)",
                        "events_per_s": local_steady,
                        "seconds": local["steady"]["seconds"],
                    },
                ]
                if local
                else []
            ),
            {
                "what": "raw kafka-python, 1 thread, no decoding",
                "events_per_s": raw_eps,
                "seconds": raw["no_decode"]["seconds"],
            },
            {
                "what": "raw kafka-python, 1 thread, json.loads",
                "events_per_s": raw["json_decode"]["records_per_s"],
                "seconds": raw["json_decode"]["seconds"],
            },
            *(
                [
                    {
                        "what": "raw confluent-kafka/librdkafka, 1 thread, no decoding",
                        "events_per_s": confluent_eps,
                        "seconds": confluent["no_decode"]["seconds"],
                    },
                    {
                        "what": "raw confluent-kafka/librdkafka, 1 thread, json.loads",
                        "events_per_s": confluent["json_decode"]["records_per_s"],
                        "seconds": confluent["json_decode"]["seconds"],
                    },
                ]
                if confluent
                else []
            ),
        ],
        "startup_s": startup(r),
        "checkpoint_per_steady_epoch_s": {
            "ours (state files + manifest/head + GC, to the S3 server)": ours["steady_checkpoint_mean_s"],
            "Structured Streaming (offset log + commit log + state store commit, local disk)": sss[
                "steady_checkpoint_mean_s"
            ],
            **(
                {
                    "Structured Streaming, Kafka connector (offset log + commit log + state store commit, S3A)": kafka[
                        "steady_checkpoint_mean_s"
                    ]
                }
                if kafka
                else {}
            ),
        },
        "ratios": {
            "ours_vs_sss_end_to_end": e2e_ratio,
            "ours_vs_sss_steady": ours_steady / sss_steady if ours_steady and sss_steady else None,
            "ours_vs_sss_kafka_end_to_end": kafka_e2e,
            "ours_vs_sss_kafka_steady": kafka_steady_ratio,
            "ours_per_core_vs_raw_steady": per_core_steady,
            "ours_per_core_vs_raw_end_to_end": per_core_e2e,
            "ours_vs_sss_kafka_local_end_to_end": local_e2e,
            "ours_vs_sss_kafka_local_steady": ours_steady / local_steady if ours_steady and local_steady else None,
            "ours_per_core_vs_confluent_steady": (ours_steady / cores) / confluent_eps
            if ours_steady and confluent_eps
            else None,
            "ours_per_core_vs_confluent_end_to_end": (ours["events_per_s"] / cores) / confluent_eps
            if ours["events_per_s"] and confluent_eps
            else None,
            "short_run_ours_speedup": short_speedup,
            "cores": cores,
        },
        "targets": targets,
        "correct": correct,
    }


SPARK_CHILDREN = (
    ("structured_streaming", "Structured Streaming (Python source, local checkpoint)"),
    ("structured_streaming_kafka", "Structured Streaming (Kafka connector, S3A checkpoint)"),
    ("structured_streaming_kafka_local", "Structured Streaming (Kafka connector, local checkpoint)"),
)


def startup(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Each engine's start-up, seconds after its process was spawned: when its Spark session was
    up and when it was ready to process (ours: epoch 1 begun, after Kafka positions, every
    subtask's on_start and the warm-up; Structured Streaming starts its query right after the
    session, so the session being up is its readiness). Ours come from the main run's log lines,
    the others from the clock reading each child reports."""
    st = r["ours"]["startup"]
    rows = [
        {
            "engine": "ours (pipeline-lib run)",
            "spark_session_up_s": st["restored_and_spark_started_s"],
            "ready_s": st["first_epoch_began_s"],
        }
    ]
    for key, name in SPARK_CHILDREN:
        if key in r and r[key].get("startup_s") is not None:
            rows.append({"engine": name, "spark_session_up_s": r[key]["startup_s"], "ready_s": r[key]["startup_s"]})
    return rows


def checks(r: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every result table's comparison with the plain-Python reference, named."""
    out = [("ours", r["ours"]["check"]), ("Structured Streaming", r["structured_streaming"]["check"])]
    for key, name in SPARK_CHILDREN[1:]:
        if key in r:
            out.append((f"{name}, over the events it saw", r[key]["check"]))
    if "short_runs" in r:
        out.append(("ours, short scheduled run", r["short_runs"]["ours"]["check"]))
        out.append(
            (
                "Structured Streaming (Kafka connector, S3A), short scheduled run, over the events it saw",
                r["short_runs"]["structured_streaming_kafka"]["check"],
            )
        )
    if "check_after_all_runs" in r["recovery"]:
        out.append(("ours after incremental + SIGKILL/restore runs", r["recovery"]["check_after_all_runs"]))
    return out


def _s(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f} s"


def _fmt(v: float | None, unit: str = "x") -> str:
    if v is None:
        return "n/a"
    return f"{v:.1%}" if unit == "%" else (f"{v:.2f} s" if unit == "s" else f"{v:.2f}x")


def format_summary(report: dict[str, Any]) -> str:
    """The summary as the Markdown table printed at the end of `pipeline-lib bench`."""
    s = report["summary"]
    lines = ["", "| run | events/s | seconds |", "|---|---:|---:|"]
    for row in s["throughput"]:
        eps = f"{row['events_per_s']:,.0f}" if row["events_per_s"] else "n/a"
        lines.append(f"| {row['what']} | {eps} | {row['seconds']:.2f} |")
    ratios = s["ratios"]
    lines += [
        "",
        f"ours / Structured Streaming: end to end {_fmt(ratios['ours_vs_sss_end_to_end'])}, "
        f"steady {_fmt(ratios['ours_vs_sss_steady'])}",
        *(
            [
                f"ours / Structured Streaming (Kafka connector, S3A checkpoint): end to end "
                f"{_fmt(ratios['ours_vs_sss_kafka_end_to_end'])}, steady {_fmt(ratios['ours_vs_sss_kafka_steady'])}"
            ]
            if "structured_streaming_kafka" in report
            else []
        ),
        *(
            [
                f"ours / Structured Streaming (Kafka connector, local checkpoint): end to end "
                f"{_fmt(ratios.get('ours_vs_sss_kafka_local_end_to_end'))}, steady "
                f"{_fmt(ratios.get('ours_vs_sss_kafka_local_steady'))}"
            ]
            if "structured_streaming_kafka_local" in report
            else []
        ),
        f"ours per core ({ratios['cores']} cores) / raw kafka-python: steady "
        f"{_fmt(ratios['ours_per_core_vs_raw_steady'], '%')}, end to end "
        f"{_fmt(ratios['ours_per_core_vs_raw_end_to_end'], '%')}",
        *(
            [
                f"ours per core ({ratios['cores']} cores) / raw confluent-kafka: steady "
                f"{_fmt(ratios.get('ours_per_core_vs_confluent_steady'), '%')}, end to end "
                f"{_fmt(ratios.get('ours_per_core_vs_confluent_end_to_end'), '%')}"
            ]
            if "raw_confluent" in report
            else []
        ),
        "checkpoint per steady epoch: "
        + "; ".join(f"{who} {_s(v)}" for who, v in s["checkpoint_per_steady_epoch_s"].items()),
        "",
        "| start-up, seconds after spawn | Spark session up | ready to process |",
        "|---|---:|---:|",
        *[f"| {x['engine']} | {_s(x['spark_session_up_s'])} | {_s(x['ready_s'])} |" for x in s.get("startup_s", [])],
        *_short_lines(report.get("short_runs")),
        "",
        "| target | goal | measured | verdict |",
        "|---|---|---|---|",
    ]
    for t in s["targets"]:
        note = f" ({t['note']})" if t.get("note") else ""
        lines.append(f"| {t['target']}{note} | {t['goal']} | {_fmt(t['measured'], t['unit'])} | **{t['status']}** |")
    lines.append("")
    for who, c in checks(report):
        lines.append(
            f"result check, {who}: {'equal to spend_per_user(events)' if c['verified'] else 'MISMATCH'} "
            f"({c['keys_found']:,} keys, {c['keys_wrong_or_missing']} wrong/missing, "
            f"{c['keys_unexpected']} unexpected)"
        )
    return "\n".join(lines)


def _short_lines(short: dict[str, Any] | None) -> list[str]:
    """The short scheduled runs in two lines (none when they were not measured)."""
    if not short:
        return []
    ours, sss = short["ours"], short["structured_streaming_kafka"]
    return [
        "",
        f"short scheduled run ({short['events']:,}-event backlog, whole processes): ours --until-caught-up "
        f"{_s(ours['wall_s'])} ({ours['epochs']} epochs), Structured Streaming (Kafka connector, S3A) "
        f"{_s(sss['wall_s'])}: ours {_fmt(short['ours_speedup'])} as fast",
        f"ours: Spark session up at {_s(ours['spark_session_up_s'])} after spawn, epoch 1 committed at "
        f"{_s(ours['first_epoch_committed_s'])} ({_s(ours['first_epoch_after_session_s'])} after the session)",
    ]
