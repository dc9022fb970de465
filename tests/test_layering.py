"""The package layering of DESIGN.md: kernels <- experiments, kernels <- analysis; experiments and analysis never
import each other; no import cycles (function-level imports count too); no benchmark or peer library in kernels/."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kernels", "experiments", "analysis")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module this file imports (absolute names), at any depth of the file."""
    mod = module_name(path)
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}  # `from pkg import submodule`
    return out


def graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if "notebooks" not in p.parts]
    mods = {module_name(p): p for p in files}
    return {m: {i for i in imports(p) if i in mods and i != m} for m, p in mods.items()}


def test_experiments_and_analysis_never_import_each_other_and_kernels_imports_neither():
    bad = [(m, i) for m, deps in graph().items() for i in deps
           if (m.startswith("analysis") and i.startswith("experiments"))
           or (m.startswith("experiments") and i.startswith("analysis"))
           or (m.startswith("kernels") and i.split(".")[0] in ("experiments", "analysis"))]
    assert not bad


def test_no_import_cycles():
    g = graph()
    state, cycles = {}, []

    def visit(m, stack):
        state[m] = 1
        for d in sorted(g[m]):
            if state.get(d) == 1 and not m.startswith(d + "."):  # a module importing its own package is no cycle
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d, stack + [d])
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [m])
    assert not cycles


def test_kernels_holds_no_benchmark_or_peer_library():
    for p in (ROOT / "kernels").rglob("*.py"):
        assert not any(i.split(".")[0] in ("flash_attn", "triton") for i in imports(p)), p
        assert "bench" not in p.name, p
