"""The throughput benchmark's outputs: report.json, report.md and PNG plots (bench_plots.py).

Files only: the figures and verdicts come in the report (see summary.py), so the report can be
written again from a saved report.json without running anything.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.bench_plots import PLOTS, write_plots
from benchmarks.config import INCREMENTAL_KINDS
from benchmarks.summary import format_summary


def _num(v, fmt: str = ",.0f") -> str:
    return "n/a" if v is None else format(v, fmt)


def _mb(b) -> str:
    return "n/a" if b is None else f"{b / 1e6:,.3f}"


def write_report(report: dict[str, Any], out: Path) -> None:
    """Write report.json, the plots and report.md to ``out``: the raw numbers kept beside their reading."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    write_plots(report, out)
    (out / "report.md").write_text(markdown(report))


def _batches(title: str, sss: dict[str, Any]) -> list[str]:
    """A Structured Streaming anchor's batches as a Markdown section."""
    lines = [
        f"## {title}\n",
        f"Spark session ready after {sss['spark_start_s']} s of its run ({_num(sss.get('startup_s'), '.2f')} s "
        f"after its spawn); whole process {sss['wall_s']} s; "
        f"checkpoint directory {sss['checkpoint_dir_bytes'] / 1e6:,.2f} MB at the end.\n",
        "| batch | records | seconds | addBatch ms | walCommit ms | commitOffsets ms | state commit ms | state rows |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for b in sss["batches"]:
        d = b["duration_ms"]
        st = b["state"][0] if b["state"] else {}
        lines.append(
            f"| {b['epoch']} | {b['records']:,} | {b['seconds']:.2f} | {d.get('addBatch', '')} | "
            f"{d.get('walCommit', '')} | {d.get('commitOffsets', '')} | {st.get('commitTimeMs', '')} | "
            f"{_num(st.get('numRowsTotal'))} |"
        )
    lines.append("")
    return lines


def _short_runs(short: dict[str, Any] | None) -> list[str]:
    """The short scheduled runs as a Markdown section (none when not measured)."""
    if not short:
        return []
    ours, sss = short["ours"], short["structured_streaming_kafka"]
    return [
        "## Short scheduled runs\n",
        f"A fresh topic of {short['events']:,} events, read by a new job of ours (`pipeline-lib run SPEC "
        "--until-caught-up --timings`) and by Structured Streaming with its Kafka connector and an S3A "
        "checkpoint (availableNow), each a whole process timed from spawn to exit: the start-up is most of "
        "such a run.\n",
        "| engine | whole process s | Spark session up s | epoch 1 / batch 1 committed s |",
        "|---|---:|---:|---:|",
        f"| ours | {ours['wall_s']:.2f} | {_num(ours['spark_session_up_s'], '.2f')} | "
        f"{_num(ours['first_epoch_committed_s'], '.2f')} |",
        f"| Structured Streaming (Kafka connector, S3A) | {sss['wall_s']:.2f} | {_num(sss['startup_s'], '.2f')} "
        "| n/a |",
        "",
        f"Ours {_num(short['ours_speedup'], '.2f')}x as fast; its epoch 1 committed "
        f"{_num(ours['first_epoch_after_session_s'], '.2f')} s after its Spark session was up.\n",
    ]


# -- markdown ---------------------------------------------------------------------------------------
def markdown(r: dict[str, Any]) -> str:
    """The report as Markdown for results/bench/report.md: setup, machine, then each comparison with its ratio."""
    cfg, m, ours, sss = r["config"], r["machine"], r["ours"], r["structured_streaming"]
    kafka = r.get("structured_streaming_kafka")
    local = r.get("structured_streaming_kafka_local")
    raw = r["raw_kafka"]
    L: list[str] = []
    add = L.append
    add("# Throughput benchmark: pipeline-lib vs Spark Structured Streaming vs raw Kafka consumers\n")
    broker = {"kafka": "Apache Kafka " + m.get("kafka", ""), "tansu": "Tansu (the embedded broker)"}.get(
        cfg.get("broker", "tansu"), cfg.get("broker", "?")
    )
    add(
        f"Run {m['started_at']} on {m['cpus']} CPUs, Python {m['python']}, pyspark {m.get('pyspark', '?')}, "
        f"broker {broker.strip()}. "
        f"{cfg['events']:,} JSON events over {cfg['keys']:,} users in one topic of {cfg['partitions']} partitions "
        f"(produced at {r['produce']['events_per_s']:,.0f} events/s); epochs / micro-batches of at most "
        f"{cfg['per_epoch']:,} records; every engine `local[{cfg['parallelism']}]`. One run: on a shared or busy "
        "machine these figures are noisy.\n"
    )
    incremental = (
        ""
        if tuple(cfg["incremental"]) == INCREMENTAL_KINDS
        else " --incremental " + (",".join(cfg["incremental"]) or "none")
    )
    add(
        "Command: `pipeline-lib bench "
        f"--events {cfg['events']} --keys {cfg['keys']} --per-epoch {cfg['per_epoch']} "
        f"--restore-keys {','.join(str(k) for k in cfg['restore_keys'])} --partitions {cfg['partitions']}"
        f"{'' if cfg['parallelism'] == 2 else ' --parallelism ' + str(cfg['parallelism'])}"
        f"{incremental}{'' if cfg['recovery'] else ' --no-recovery'}"
        f"{'' if cfg.get('short_events', 50_000) == 50_000 else ' --short-events ' + str(cfg['short_events'])}"
        f"{' --broker tansu' if cfg.get('broker') == 'tansu' else ''}`\n"
    )
    add("## Summary")
    add(format_summary(r))
    add("")
    add(f"![throughput]({PLOTS['throughput']})\n")

    add("## What ran, and what is fair about it\n")
    add(
        "* **ours**: `pipeline-lib run SPEC --timings` as a subprocess, timed from spawn to exit (Python imports, "
        "Spark JVM start, lifecycle records, every epoch, Spark stop). The job is the spend-per-user spec "
        "(keyed `sum(amount)`, `count(*)` per user), parquet sink, parallelism "
        f"{cfg['parallelism']}; every epoch writes its sink files and a snapshot (state files in one pack object, "
        "manifest, head compare-and-swap) **over HTTP to the S3 server**. Steady = the records of epochs 2..n over "
        "the wall time from epoch 1's commit to the last epoch's (their log lines). Epoch N+1's Spark jobs start while "
        "epoch N commits (read-ahead), so epoch 2's start inside epoch 1, which the steady figure leaves out, "
        "as it leaves out all of epoch 1."
    )
    add(
        "* **Structured Streaming**: `groupBy(user).agg(sum, count)`, update mode, the default (HDFS-backed) "
        f"state store, a **local-disk** `checkpointLocation`, `spark.sql.shuffle.partitions = {cfg['parallelism']}`, "
        "`Trigger.AvailableNow`, the same record cap per micro-batch (split over partitions like ours), "
        "foreachBatch writing each batch's changed rows as parquet to a **local directory**. Its source is a "
        "Python `DataSourceStreamReader` reading with kafka-python's own consumer in the executors (the project's "
        "`read_range`, which yields kafka-python's records) and the project's type-checking JSON decoder, yielding "
        "rows — what a user would write with kafka-python; one input partition per Kafka partition range per "
        "micro-batch (ours gives each Spark task, one per core, an equal share of the epoch's ranges). "
        "Ours decodes Kafka's record batches straight into columns and, as the job has no transforms, takes the "
        "Arrow path: each Python worker aggregates its task's records with pyarrow and hands the driver Arrow IPC "
        "bytes through Spark. That read path and the Arrow path are part of what is measured; Structured "
        "Streaming aggregates in Spark SQL's own engine. Timed as a whole subprocess. Steady = batches 2..n "
        "(`triggerExecution`). Its checkpoint and sink are on local disk while ours go to the S3 server: "
        "that favours Structured Streaming."
    )
    if kafka:
        add(
            "* **Structured Streaming (Kafka connector, S3A checkpoint)**: what Spark users run: the same query "
            "with Spark's own JVM source (`spark-sql-kafka-0-10` "
            + kafka.get("connector", {}).get("spark", "?")
            + ", `maxOffsetsPerTrigger` = the epoch cap, `startingOffsets=earliest`), `from_json` with the same "
            "schema, `checkpointLocation` **on the same S3 server** through `s3a://` (hadoop-aws "
            + kafka.get("connector", {}).get("hadoop", "?")
            + "), foreachBatch writing each batch's changed rows "
            "as parquet to the same S3 server through S3A. Timed as a whole subprocess (the jars are cached "
            "before)."
            + (
                " The connector trusts ListOffsets, which the local broker (Tansu) answers short of each "
                f"partition's end: it read {kafka['records']:,} events ({kafka.get('records_unseen', 0):,} "
                "unseen) and its table is checked against the reference of those."
                if kafka.get("records_unseen")
                else f" It read all {kafka['records']:,} events."
            )
        )
    if local:
        add(
            "* **Structured Streaming (Kafka connector, local checkpoint)**: the same query and module, with "
            "`checkpointLocation` and the foreachBatch parquet output on **local disk**: the difference from the "
            "row above is what S3A costs it."
        )
    add(
        "* **raw kafka-python**: one thread in the harness process, assign + seek + poll(max_records=5000) with "
        "the fetch sizes our reader uses; *no decoding* counts records, *json.loads* decodes every value. "
        f"Per core = our events/s divided by {r['summary']['ratios']['cores']} (the Spark cores we use)."
    )
    if "raw_confluent" in r:
        add(
            "* **raw confluent-kafka** (librdkafka): the same in one thread, assign at the start offsets + "
            "consume(num_messages=5000) with the same fetch sizes: the input path's limit with a C client."
        )
    add(
        "* **start-up**: seconds from an engine's spawn to its Spark session being up (ours: the \"pipeline ... "
        'attempt" log line; Structured Streaming: the child reads the system-wide monotonic clock when '
        "`getOrCreate()` returns) and to being ready to process (ours: epoch 1 begun; Structured Streaming "
        "starts its query at once)."
    )
    add("* Every result table is compared key by key with `spend_per_user(events)` computed in plain Python.\n")

    add("## Ours: where the time goes\n")
    wall = ours["wall_s"]
    before = ours["before_first_epoch_s"]
    epochs_total = sum(e["seconds"] for e in ours["epochs"])
    add(
        f"Whole process {wall:.2f} s = before epoch 1 {before} s + "
        f"{len(ours['epochs'])} epochs {epochs_total:.2f} s "
        f"(epoch 1: {ours['epochs'][0]['seconds'] if ours['epochs'] else 'n/a'} s) "
        f"+ between epochs/after the last {wall - (before or 0) - epochs_total:.2f} s.\n"
    )
    st = ours["startup"]
    add("Start-up milestones (seconds after the process was spawned, from its log lines):\n")
    add("| milestone | at s |")
    add("|---|---:|")
    add(
        f'| imports, restore, attempt claim, Spark session started ("pipeline main of job ..." line) | '
        f"{_num(st['restored_and_spark_started_s'], '.2f')} |"
    )
    add(
        f'| Kafka positions + end offsets, every subtask\'s on_start, beside a warm-up query ("N subtasks started") | '
        f"{_num(st['subtasks_started_s'], '.2f')} |"
    )
    add(f"| epoch 1 planned and begun | {_num(st['first_epoch_began_s'], '.2f')} |")
    first, mean = st["first_epoch_s"], st["steady_epoch_mean_s"]
    add(
        f"| epoch 1 committed ({_num(first, '.2f')} s long; a steady epoch takes {_num(mean, '.2f')} s, so "
        f"~{_num((first - mean) if first is not None and mean else None, '.1f')} s of it is warm-up) | "
        f"{_num(ours['epochs'][0]['at_s'] if ours['epochs'] else None, '.2f')} |"
    )
    add("")
    means = ours["steady_phase_means_s"]
    epoch_mean = ours["steady_epoch_mean_s"] or 0
    if means:
        add("Steady epochs (2..n), mean seconds per phase:\n")
        add("| phase | seconds | share of epoch |")
        add("|---|---:|---:|")
        for name, v in sorted(means.items(), key=lambda kv: -kv[1]):
            add(f"| {name} | {v:.3f} | {v / epoch_mean:.0%} |" if epoch_mean else f"| {name} | {v:.3f} | n/a |")
        other = max(0.0, epoch_mean - sum(means.values()))
        add(
            f"| other (planning inside the epoch timer, bookkeeping) | {other:.3f} | "
            f"{(other / epoch_mean if epoch_mean else 0):.0%} |"
        )
        add(f"| **epoch** | **{epoch_mean:.3f}** | |")
        add("")
        add(
            "*spark* = the time the epoch waited for its Spark jobs (Kafka read in Python workers, JSON decode, "
            "partial aggregate, in the workers on the Arrow path, results to the driver); from epoch 2 on they "
            "start while the epoch before commits (read-ahead), so this is what is left of them after that overlap; "
            "*merge* = keyed-state merge and sink rows in driver Python; *sink* = part files + `_SUCCESS`; "
            "*state* = state files; *commit* = head check, manifest, head compare-and-swap; "
            "*cleanup* = waiting for the previous epoch's garbage collection and stale-part removal, which run "
            "beside the next epoch. Checkpoint cost per epoch = state + commit + cleanup: "
            f"steady mean {ours['steady_checkpoint_mean_s']} s.\n"
        )
    add(f"![phases]({PLOTS['phases']})\n")

    add("### Epochs of the main run\n")
    snap_by_id = {s["snapshot"]: s for s in r["snapshots"]["main_run"]}
    names = list(ours["epochs"][0]["phases"]) if ours["epochs"] else []
    add("| epoch | records | keys | seconds | " + " | ".join(names) + " | checkpoint s | state MB written |")
    add("|---:|---:|---:|---:|" + "---:|" * len(names) + "---:|---:|")
    for e, ck in zip(ours["epochs"], ours["checkpoint_s_per_epoch"]):
        s = snap_by_id.get(e["snapshot"])
        add(
            f"| {e['epoch']} | {e['records']:,} | {e['keys']:,} | {e['seconds']:.2f} | "
            + " | ".join(f"{e['phases'].get(n, 0):.3f}" for n in names)
            + f" | {ck:.3f} | {_mb(s['written_bytes']) if s else 'n/a (not retained)'} |"
        )
    add("")

    L += _batches("Spark Structured Streaming batches (Python source, local checkpoint)", sss)
    if kafka:
        L += _batches("Spark Structured Streaming batches (Kafka connector, S3A checkpoint)", kafka)
    if local:
        L += _batches("Spark Structured Streaming batches (Kafka connector, local checkpoint)", local)

    add("## Raw consumers\n")
    add("| client | variant | records | seconds | records/s |")
    add("|---|---|---:|---:|---:|")
    for client, figures in (("kafka-python", raw), ("confluent-kafka", r.get("raw_confluent"))):
        for key, label in (("no_decode", "no decoding"), ("json_decode", "json.loads every value")):
            if figures:
                x = figures[key]
                add(f"| {client} | {label} | {x['records']:,} | {x['seconds']:.2f} | {x['records_per_s']:,.0f} |")
    add("")
    L += _short_runs(r.get("short_runs"))

    add("## Snapshot bytes vs key count\n")
    add(
        "Full = every state file the manifest references; written = the files that epoch wrote itself (the others "
        "are referenced from earlier snapshots). From the retained manifests of the main run, then two small "
        "incremental runs of the same job.\n"
    )
    add("| snapshot | keys | full MB | written MB | written / full | files written / referenced |")
    add("|---|---:|---:|---:|---:|---:|")
    for s in r["snapshots"]["main_run"]:
        add(
            f"| {s['snapshot']} | {s['keys']:,} | {_mb(s['full_bytes'])} | {_mb(s['written_bytes'])} | "
            f"{_num(s['written_share'], '.0%')} | {s['files_written']} / {s['files']} |"
        )
    for kind, inc in r["snapshots"]["incremental"].items():
        for s in inc["epochs"]:
            add(
                f"| {s['snapshot']}: {inc['events']:,} events, {inc['users']:,} users, {inc['key_groups_touched']} "
                f"of {inc['max_parallelism']} key groups ({kind.replace('_', ' ')}) | {s['keys']:,} | "
                f"{_mb(s['full_bytes'])} | {_mb(s['written_bytes'])} | {_num(s['written_share'], '.0%')} | "
                f"{s['files_written']} / {s['files']} |"
            )
    add("")
    add(f"![snapshot bytes]({PLOTS['snapshot_bytes']})\n")

    add("## Restore time vs state size\n")
    add(
        "A snapshot of N keys is written through the runner's own code (its keyed state and "
        "`DriverState.state_writer`, "
        "committed in the order every epoch commits: a sink commit, the state files, a sealed manifest, the head's "
        "compare-and-swap); then, in a fresh process, `PipelineRunner.restore()` is timed — "
        "the call `pipeline-lib run` makes before starting Spark: head + manifest + sink markers, every state file "
        "fetched and SHA-256-checked, Parquet decoded, then loaded into the keyed state. Read and load are wall-clock "
        "phases that add up to restore; fetch thread-s is the time inside the store's reads summed over the reading "
        "threads (they overlap, so it can exceed read). Process = the probe process including Python start-up and "
        "imports.\n"
    )
    add("| keys | state files | state MB | write state s | restore s | read s | load s | fetch thread-s | process s |")
    add("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for x in r["restore"]:
        add(
            f"| {x['keys']:,} | {x['state_files']} | {_mb(x['state_bytes'])} | {x['write_state_s']:.3f} | "
            f"{x['restore_s']:.3f} | {x['read_s']:.3f} | {x['load_s']:.3f} | {x['fetch_thread_s']:.3f} | "
            f"{x['process_s']:.2f} |"
        )
    add("")
    add(f"![restore]({PLOTS['restore']})\n")

    add("## Recovery: SIGKILL mid-run → first new epoch committed\n")
    rec = r["recovery"]
    if "recovery_s" in rec:
        add(
            f"{rec['events']:,} more events were produced and the job run again; its process group was SIGKILLed "
            f"{rec['kill_delay_after_epoch_s']} s after its first epoch committed (during the next one). The restart "
            f"was spawned {rec['restart_began_after_kill_s']} s after the kill, had restored the snapshot and started "
            f"Spark {rec['pipeline_started_at_s']} s after its spawn, all subtasks {rec['subtasks_started_at_s']} s "
            f"after it, and committed its first epoch (the replayed one, {rec['first_epoch_seconds']} s "
            f"long) at {rec['first_epoch_at_s']} s.\n"
        )
        add(f"**Recovery time: {rec['recovery_s']:.2f} s** from the SIGKILL to the first new epoch committed.\n")
    else:
        add(rec.get("note", "not measured") + "\n")
    if "check_after_all_runs" in rec:
        c = rec["check_after_all_runs"]
        add(
            f"After all runs (main, incremental, killed, restarted) the table "
            f"{'equals' if c['verified'] else 'DOES NOT equal'} the plain-Python result over every event produced.\n"
        )
    return "\n".join(L) + "\n"
