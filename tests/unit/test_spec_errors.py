"""Spec errors a new user meets: each names the file and the line, an empty file says so, a check
across fields names the fields; and a schema Spark accepts is accepted."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from pipeline_lib.errors import SpecError
from pipeline_lib.spec import load_spec, parse_spec
from pipeline_lib.spec.schema_ddl import parse_schema_ddl

GOOD_YAML = """\
name: spend-per-user
source:
  kafka:
    topic: payments
    format: json
    schema: "user string, amount long"
state:
  aggregate:
    key: [user]
    values:
      total: sum(amount)
sink:
  files:
    path: s3://results/spend-per-user
checkpoint:
  store: s3://checkpoints/spend-per-user
parallelism: 2
"""
GOOD = yaml.safe_load(GOOD_YAML)


def load_text(tmp_path: Path, text: str) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    return str(info.value)


def replaced(old: str, new: str) -> str:
    assert old in GOOD_YAML
    return GOOD_YAML.replace(old, new)


def test_the_good_spec_loads(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(GOOD_YAML)
    assert load_spec(path).name == "spend-per-user"


# -- YAML errors and empty files ---------------------------------------------------------
def test_a_yaml_error_names_the_file_and_the_line(tmp_path):
    message = load_text(tmp_path, replaced("    format: json\n", "    format: json\n   bad: indent\n"))
    assert message.startswith(f"{tmp_path / 'job.yaml'}:6:")
    assert "not valid YAML" in message and "<unicode string>" not in message


@pytest.mark.parametrize("text", ["", "\n  \n", "# nothing yet\n"])
def test_an_empty_file_says_it_is_empty(tmp_path, text):
    message = load_text(tmp_path, text)
    assert message.startswith(f"{tmp_path / 'job.yaml'}: the ")
    assert "is empty" in message and "NoneType" not in message


def test_a_list_is_not_a_spec(tmp_path):
    assert "a job spec is a YAML mapping, got list" in load_text(tmp_path, "- name: x\n")


# -- field errors name their line ---------------------------------------------------------
@pytest.mark.parametrize(
    "old,new,expected",
    [
        ("    format: json\n", "    format: avro\n", "job.yaml:5: source.kafka.format: Input should be"),
        ("parallelism: 2\n", "parallelism: 2\nsurprise: 1\n", "job.yaml:18: surprise: unknown field"),
        ("      total: sum(amount)\n", "      total: median(amount)\n", "job.yaml:10: state.aggregate.values:"),
        (
            "    path: s3://results/spend-per-user\n",
            "    format: csv\n",
            "job.yaml:13: sink.files.path: Field required",
        ),
    ],
)
def test_a_field_error_names_the_line_of_the_field(tmp_path, old, new, expected):
    assert expected in load_text(tmp_path, replaced(old, new))


# -- checks across fields name the fields ----------------------------------------------------
@pytest.mark.parametrize(
    "old,new,expected",
    [
        (
            "parallelism: 2\n",
            "parallelism: 200\n",
            "job.yaml:17: parallelism, checkpoint.max_parallelism: parallelism 200 exceeds "
            "checkpoint.max_parallelism 128",
        ),
        (
            "parallelism: 2\n",
            "parallelism: 2\non_error: dead_letter\n",
            "job.yaml:18: on_error, dead_letter: on_error: dead_letter needs dead_letter.path",
        ),
        ('    schema: "user string, amount long"\n', "", "job.yaml:3: source.kafka: format json needs a schema"),
        (
            "    format: json\n",
            "    format: string\n",
            "job.yaml:6: source.kafka: format string yields columns key and value",
        ),
        (
            "      total: sum(amount)\n",
            "      user: sum(amount)\n",
            "job.yaml:10: state.aggregate: output names clash with key columns",
        ),
        (
            "    key: [user]\n",
            "    key: [nope]\n",
            "job.yaml:8: state.aggregate: state.aggregate uses columns ['nope']",
        ),
        (
            "  store: s3://checkpoints/spend-per-user\n",
            "  store: s3://results/spend-per-user\n",
            "job.yaml:14: sink.files.path, checkpoint.store: sink.files.path is also used by checkpoint.store",
        ),
        (
            "  store: s3://checkpoints/spend-per-user\n",
            "  store: s3://checkpoints/spend-per-user\n  key_groups_per_state_file: 129\n",
            "job.yaml:17: checkpoint: key_groups_per_state_file 129 exceeds max_parallelism 128",
        ),
    ],
)
def test_a_check_across_fields_names_its_section_or_fields_and_their_line(tmp_path, old, new, expected):
    message = load_text(tmp_path, replaced(old, new))
    assert expected in message
    assert "(top level)" not in message


def multi_flow(**changes) -> dict:
    spec = {k: v for k, v in copy.deepcopy(GOOD).items() if k not in ("source", "state", "sink")}
    spec["sources"] = {"payments": GOOD["source"], "refunds": GOOD["source"]}
    spec["flows"] = [
        {"name": "paid", "source": "payments", "sink": {"files": {"path": "s3://results/paid"}}},
        {"name": "refunded", "source": "refunds", "sink": {"files": {"path": "s3://results/refunded"}}},
    ]
    spec.update(changes)
    return spec


@pytest.mark.parametrize(
    "change,expected",
    [
        (lambda s: s["flows"][1].update(source="nowhere"), "flows.1.source: source 'nowhere' is not defined"),
        (lambda s: s["flows"][1].update(name="paid"), "flows.0.name, flows.1.name: flow names repeat: ['paid']"),
        (lambda s: s["sources"].update(extra=GOOD["source"]), "sources.extra: sources ['extra'] feed no flow"),
        (
            lambda s: s["flows"][1]["sink"]["files"].update(path="s3://results/paid"),
            "flows.1.sink.files.path, flows.0.sink.files.path: flow refunded: sink.files.path is also used by "
            "flow paid",
        ),
        (lambda s: s.update(sink=GOOD["sink"]), "sink, sources, flows: use either source/transforms/state/sink or"),
        (lambda s: s.pop("flows"), "sources, flows: the multi-flow form needs both sources and flows"),
        (lambda s: s["flows"][0].update(transforms=[{}]), "flows.0.transforms.0: a transform has exactly one of"),
    ],
)
def test_checks_across_flows_name_the_flow_fields(change, expected):
    spec = multi_flow()
    change(spec)
    with pytest.raises(SpecError) as info:
        parse_spec(spec, "job.yaml")
    assert expected in str(info.value)
    assert "(top level)" not in str(info.value)


def test_a_job_without_source_and_sink_names_them():
    spec = {k: v for k, v in GOOD.items() if k not in ("source", "state", "sink")}
    with pytest.raises(SpecError, match=r"source, sink: a job needs a source and a sink"):
        parse_spec(spec, "job.yaml")


# -- Spark DDL schemas ----------------------------------------------------------------------
# Each string was given to Spark (pyspark 4.3.0, local[1]) as the job gives it,
# spark.createDataFrame([], f"{schema}, _topic string, _partition int, _offset long, _timestamp_ms long"),
# and Spark accepted it with these column names, or refused it.
ACCEPTED_BY_SPARK = {
    "user string, amount long": ["user", "amount"],
    "ts timestamp_ltz": ["ts"],
    "ts TIMESTAMP_LTZ, b timestamp_ntz, c timestamp": ["ts", "b", "c"],
    "`my col` string": ["my col"],
    "`a``b` int": ["a`b"],
    "`a.b` int": ["a.b"],
    "a: int": ["a"],
    "a: int, b: string": ["a", "b"],
    "a:int,b:string": ["a", "b"],
    "a int, b: string": ["a", "b"],
    "`a b`: int": ["a b"],
    "a int not null": ["a"],
    "a: int not null": ["a"],
    "a int NOT  NULL COMMENT 'x'": ["a"],
    "a string comment 'hello, world'": ["a"],
    'a string COMMENT "dq, x"': ["a"],
    "a int comment 'it''s'": ["a"],
    "a int comment 'it\\'s'": ["a"],
    "a int comment 'x',b string": ["a", "b"],
    "a decimal(10, 2)": ["a"],
    "a decimal": ["a"],
    "a decimal(5)": ["a"],
    "a dec(5)": ["a"],
    "a numeric(10,2)": ["a"],
    "a decimal(38,0)": ["a"],
    "a decimal( 10 , 2 )": ["a"],
    "a decimal(0,0)": ["a"],
    "a array<int>": ["a"],
    "a ARRAY<INT>": ["a"],
    "a array< int >": ["a"],
    "a array<array<string>>": ["a"],
    "a Map<String,Int>": ["a"],
    "a map<string , int >": ["a"],
    "a map<string, array<struct<x: int, y string>>>": ["a"],
    "a struct<x:int,`y z`:string>": ["a"],
    "a struct<x int NOT NULL COMMENT 'c'>": ["a"],
    "a struct<x int, x string>": ["a"],
    "a struct<>": ["a"],
    "a struct<a: int, b: array<map<string, struct<c: decimal(10,2)>>>>": ["a"],
    "a interval": ["a"],
    "a interval day to second": ["a"],
    "a interval year to month": ["a"],
    "a interval day": ["a"],
    "a interval year": ["a"],
    "a interval month": ["a"],
    "a interval hour to minute": ["a"],
    "a interval minute to second": ["a"],
    "a interval day to hour": ["a"],
    "a void, b variant, c binary, d date": ["a", "b", "c", "d"],
    "a tinyint, b byte, c short, d smallint, e integer, f bigint, g float, h real, i double, j boolean": list(
        "abcdefghij"
    ),
    "a string collate UTF8_LCASE": ["a"],
    "a string collate unicode_ci not null": ["a"],
    "a map<string collate utf8_lcase, int>": ["a"],
    "a time": ["a"],
    "a time(6)": ["a"],
    "a time(0)": ["a"],
    "a timestamp with local time zone": ["a"],
    "a timestamp without time zone": ["a"],
    "A INT": ["A"],
    "1a int": ["1a"],
    "_a int": ["_a"],
    "select int, from string, not int, comment string, struct int, int int": [
        "select",
        "from",
        "not",
        "comment",
        "struct",
        "int",
    ],
    "a int\n, b string": ["a", "b"],
    "a\tint": ["a"],
    " a   int  ,  b  string ": ["a", "b"],
}
REFUSED_BY_SPARK = [
    "a",
    "int",
    "a strng",
    "a bool",
    "a text",
    "a uuid",
    "a int b",
    "my col string",
    "a-b int",
    "a.b int",
    "a$ int",
    "ä int",
    "a int,",
    ", a int",
    "a double, ",
    "a int;",
    "a array<int",
    "a array<>",
    "a array<int,>",
    "a array<int not null>",
    "a map<int>",
    "a map<string,int,int>",
    "a map<string not null,int>",
    "a struct<x>",
    "a struct<x:int,>",
    "a struct<x: int, y>",
    "a decimal(39,0)",
    "a decimal(5,6)",
    "a decimal(10,2,3)",
    "a decimal()",
    "a decimal(10,)",
    "a decimal(10,-1)",
    "a int(5)",
    "a string(5)",
    "a interval day to year",
    "a interval month to year",
    "a interval years",
    "a interval day to day",
    "a timestamp with time zone",
    "a double precision",
    "a long long",
    "a int NULL",
    "a int not",
    "a int not null not null",
    "a int comment",
    "a int comment 'x' not null",
    "a int default 5",
    "a string DEFAULT 'x'",
    "a int generated always as (1)",
    "a string collate 'utf8_lcase'",
    # Spark parses these but cannot make a DataFrame of them: char/varchar belong in table schemas.
    "a char(5)",
    "a character(3)",
    "a varchar(10)",
    "a char",
    "a varchar",
    "a varchar(10) collate utf8_lcase",
]
# Accepted by Spark, refused here: neither names one JSON field, or a comment hides the metadata columns.
STRICTER = ["a long, a string", "`` int", "a int -- comment", "a int /* c */"]


@pytest.mark.parametrize("ddl", list(ACCEPTED_BY_SPARK))
def test_a_schema_spark_accepts_is_accepted_with_spark_s_names(ddl):
    assert [name for name, _ in parse_schema_ddl(ddl)] == ACCEPTED_BY_SPARK[ddl]


@pytest.mark.parametrize("ddl", REFUSED_BY_SPARK + STRICTER)
def test_a_schema_spark_refuses_is_refused(ddl):
    with pytest.raises(ValueError):
        parse_schema_ddl(ddl)


@pytest.mark.parametrize(
    "ddl,expected",
    [
        ("user strng", "column 'user' has unknown type 'strng'"),
        ("user", "column 'user' needs a type"),
        ("a char(5)", "use string"),
        ("a long, a string", "column 'a' appears twice"),
        ("a array<int", "expected '>' to close ARRAY<"),
        ("a-b int", "backquoted"),
    ],
)
def test_a_refused_schema_says_why(ddl, expected):
    with pytest.raises(ValueError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        parse_schema_ddl(ddl)


def test_the_spec_takes_the_forms_spark_takes():
    spec = copy.deepcopy(GOOD)
    spec["source"]["kafka"]["schema"] = "user: string, amount: long, `paid at` timestamp_ltz"
    assert parse_spec(spec).source.kafka.columns()[:3] == ["user", "amount", "paid at"]
