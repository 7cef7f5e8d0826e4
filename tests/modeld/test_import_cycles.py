"""No import cycle among modeld's modules, counting imports inside functions too (a cycle there only moves the
failure to the first call), and only the server entry point imports the gRPC servicer."""

import ast
import pathlib

MODELD = pathlib.Path(__file__).parents[2] / "modeld"


def import_graph() -> dict[str, set[str]]:
    modules = {}
    for path in MODELD.rglob("*.py"):
        parts = path.relative_to(MODELD.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def owner(name: str) -> str | None:  # the modeld module a dotted name lives in
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets |= {base} | {f"{base}.{alias.name}" for alias in node.names}
        graph[name] = {owner(t) for t in targets if owner(t) not in (None, name)}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := walk(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    return next((found for node in sorted(graph) if node not in state and (found := walk(node))), None)


def test_modeld_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 20 and "modeld.engine.loop" in graph["modeld.engine.build"]  # the walk sees the package
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_only_the_server_imports_the_servicer():
    graph = import_graph()
    assert sorted(name for name, targets in graph.items() if "modeld.front.service" in targets) == [
        "modeld.front.server"
    ]


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
