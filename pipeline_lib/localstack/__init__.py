"""Embedded local stack for laptops, the demo and the tests: Tansu (Kafka protocol) + SeaweedFS (S3).

Both run as real processes on free 127.0.0.1 ports, recorded in DATA_DIR/stack.json and always
stopped by PID. ``start_stack`` / ``stop_stack`` / ``stack_status`` / ``load_stack`` back the
``pipeline-lib stack`` commands; ``restart_stack_broker`` and ``restart_stack_s3`` are for outage tests.
"""

from pipeline_lib.localstack.broker import BrokerConfig, restart_broker, start_broker
from pipeline_lib.localstack.ports import free_port, free_port_pairs, is_port_free
from pipeline_lib.localstack.processes import StackError, pid_alive, stop_pid
from pipeline_lib.localstack.s3server import S3Server, create_buckets, s3_client, start_s3_server
from pipeline_lib.localstack.stack import (
    BUCKETS,
    StackInfo,
    load_stack,
    restart_stack_broker,
    restart_stack_s3,
    stack_status,
    start_stack,
    stop_stack,
)

__all__ = [
    "BUCKETS",
    "BrokerConfig",
    "S3Server",
    "StackError",
    "StackInfo",
    "create_buckets",
    "free_port",
    "free_port_pairs",
    "is_port_free",
    "load_stack",
    "pid_alive",
    "restart_broker",
    "restart_stack_broker",
    "restart_stack_s3",
    "s3_client",
    "stack_status",
    "start_broker",
    "start_s3_server",
    "start_stack",
    "stop_pid",
    "stop_stack",
]
