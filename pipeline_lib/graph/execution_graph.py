"""The execution graph of a job and its pipelines (after SeaTunnel's checkpoint proposal).

Vertices are the job's operators — a source, and per flow its transforms, state and sink — each
run as ``parallelism`` subtasks. Pipelines are the connected parts of the graph, each listed in
topological order. A pipeline checkpoints and restores on its own, so a failure in one does not
touch the others, and a pipeline that has completed is not deployed again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline_lib.spec.models import JobSpec


@dataclass(frozen=True)
class Vertex:
    """One operator of the job, run as ``parallelism`` subtasks."""

    id: str  # e.g. "source:payments", "flow:spend/state"
    kind: str  # source | transform | state | sink
    parallelism: int

    def subtasks(self) -> list[str]:
        """The subtask ids, ``<vertex>#<i>``, that start-up checks and reports."""
        return [f"{self.id}#{i}" for i in range(self.parallelism)]


@dataclass(frozen=True)
class Pipeline:
    """A source and every flow that reads it: the unit that checkpoints, restores and fails alone."""

    name: str  # the name of its source: one source with every flow that reads it
    source: str
    flows: tuple[str, ...]
    vertices: tuple[Vertex, ...]  # topological order


@dataclass
class ExecutionGraph:
    """The job's operators and their edges, from which the pipelines are cut."""

    vertices: dict[str, Vertex] = field(default_factory=dict)
    edges: list[tuple[str, str]] = field(default_factory=list)

    def add(self, vertex: Vertex, upstream: str | None = None) -> str:
        """Add ``vertex`` below ``upstream``; returns its id for the next vertex to hang below."""
        self.vertices[vertex.id] = vertex
        if upstream is not None:
            self.edges.append((upstream, vertex.id))
        return vertex.id

    def pipelines(self) -> list[Pipeline]:
        """Connected components, each in topological order (Kahn's algorithm, stable)."""
        parent = {v: v for v in self.vertices}

        def find(v: str) -> str:
            while parent[v] != v:
                parent[v] = parent[parent[v]]
                v = parent[v]
            return v

        for a, b in self.edges:
            parent[find(a)] = find(b)
        groups: dict[str, list[str]] = {}
        for v in self.vertices:  # insertion order = spec order
            groups.setdefault(find(v), []).append(v)
        out = []
        for members in groups.values():
            order = self._topological(members)
            sources = [v for v in order if self.vertices[v].kind == "source"]
            if len(sources) != 1:
                raise ValueError(f"a pipeline needs exactly one source, found {sources}")
            source = sources[0].split(":", 1)[1]
            flows = tuple(dict.fromkeys(v.split(":", 1)[1].split("/")[0] for v in order if v.startswith("flow:")))
            out.append(Pipeline(source, source, flows, tuple(self.vertices[v] for v in order)))
        return out

    def _topological(self, members: list[str]) -> list[str]:
        """Kahn's algorithm with a stack, so each flow's chain is listed in one piece."""
        inside = set(members)
        indegree = {v: 0 for v in members}
        for a, b in self.edges:
            if a in inside and b in inside:
                indegree[b] += 1
        ready = [v for v in reversed(members) if indegree[v] == 0]
        order: list[str] = []
        while ready:
            v = ready.pop()
            order.append(v)
            children = [b for a, b in self.edges if a == v and b in inside]
            for b in reversed(children):
                indegree[b] -= 1
                if indegree[b] == 0:
                    ready.append(b)
        if len(order) != len(members):
            raise ValueError("the job graph has a cycle")
        return order


def build_graph(spec: JobSpec, parallelism: int | None = None) -> ExecutionGraph:
    """The job's execution graph: per flow, source → transforms → state → sink, at ``parallelism``."""
    p = parallelism or spec.parallelism
    graph = ExecutionGraph()
    for name in spec.all_sources():
        graph.add(Vertex(f"source:{name}", "source", p))
    for flow in spec.all_flows():
        upstream = f"source:{flow.source}"
        for i, _ in enumerate(flow.transforms):
            upstream = graph.add(Vertex(f"flow:{flow.name}/transform{i}", "transform", p), upstream)
        if flow.state is not None:
            upstream = graph.add(Vertex(f"flow:{flow.name}/state", "state", p), upstream)
        graph.add(Vertex(f"flow:{flow.name}/sink", "sink", p), upstream)
    return graph
