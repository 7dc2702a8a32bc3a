"""Specs compiled into an execution graph and split into independently recoverable pipelines."""

from pipeline_lib.graph.execution_graph import ExecutionGraph, Pipeline, Vertex, build_graph

__all__ = ["ExecutionGraph", "Pipeline", "Vertex", "build_graph"]
