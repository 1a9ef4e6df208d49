"""One namespace, no bare top-level packages, a cheap import."""

import ast
import pathlib
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
FOLDERS = {"models", "optim", "samplers", "pallas_kernels"}


def _sources():
    for folder in [*FOLDERS, "jaxlib_ext", "benchmarks", "notebooks", "tests", "tools"]:
        yield from (ROOT / folder).rglob("*.py")


def test_no_module_imports_a_bare_family_name():
    bad = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            bad += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in FOLDERS]
    assert not bad, bad


def test_every_package_folder_is_declared_under_the_namespace():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    declared = set(cfg["packages"])
    mapping = {v: k for k, v in cfg["package-dir"].items()}
    found = set()
    for folder, dotted in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join([dotted, *rel]))
    assert found <= declared, sorted(found - declared)


def test_installed_layout_has_no_bare_packages():
    code = (
        "import importlib.util, jaxlib_ext.models, jaxlib_ext.optim, jaxlib_ext.samplers, "
        "jaxlib_ext.pallas_kernels;"
        "print([n for n in ('models','optim','samplers','pallas_kernels') "
        "if importlib.util.find_spec(n) is not None])"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_import_does_no_heavy_work():
    # `import jaxlib_ext` must not pull in JAX or any method family; they load on use.
    code = (
        "import sys, jaxlib_ext;"
        "print(sorted(m for m in ('jax','flax','optax','orbax','numpyro') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_wheel_installs_one_namespace_with_its_data(tmp_path):
    import zipfile

    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(ROOT), "-w", str(tmp_path)],
        capture_output=True, text=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    (wheel,) = tmp_path.glob("jaxlib_ext-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"jaxlib_ext"}
    for module in ("jaxlib_ext/models/mdn.py", "jaxlib_ext/optim/foam.py",
                   "jaxlib_ext/pallas_kernels/mdn/reference.py",
                   "jaxlib_ext/samplers/data/potato_visual.csv",
                   "jaxlib_ext/samplers/data/miplib3/p0033.mps",
                   "jaxlib_ext/data_files/mnist.npz",
                   "jaxlib_ext/pallas_kernels/mlstm/reference.py"):
        assert module in names, module


def test_every_public_name_of_the_runtime_resolves():
    import jaxlib_ext

    missing = [name for name in jaxlib_ext.__all__ if getattr(jaxlib_ext, name, None) is None]
    assert not missing, missing
    assert jaxlib_ext.fit is jaxlib_ext.core.train.fit
    assert set(jaxlib_ext.__all__) <= set(dir(jaxlib_ext))
    assert set(jaxlib_ext.__all__) == {"__version__", *jaxlib_ext._EXPORTS, *jaxlib_ext._SUBMODULES}
