"""``deploy/docker``: the Compose file is valid against the Compose specification's schema, docs/cluster.md's
``docker compose`` lines name its services and variables, and each service's command line runs for real as a
local process, with its environment, so that the file cannot drift from the command line.

Without a Docker daemon, :class:`LocalCompose` plays ``docker compose up -d`` / ``run --rm`` / ``down``: it
interpolates each service's ``command`` as Compose does (``${VAR}``, ``${VAR:-default}``, ``$$``) from the
variables docs/cluster.md sets, and maps what only exists inside Compose's network and containers to this machine:
a service's name as a host is 127.0.0.1, a published port is a free port, ``0.0.0.0`` is 127.0.0.1 (nothing
listens beyond this machine), and a volume's target folder is its source on the host (an anonymous volume: a fresh
folder). Nothing else of the command changes.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import dufs
from dufs.cli import app
from dufs.testing import patience
from tests.deploy._support import DEPLOY, ROOT, free_port, readme_blocks, stop_process, tool_env, which

COMPOSE = DEPLOY / "docker" / "compose.yaml"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
HEADING = "Docker Compose"

_VAR = re.compile(r"\$(?:\$|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
                  r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))")


def interpolate(text: str, variables: dict[str, str]) -> str:
    """Compose's interpolation of ``text`` (``$$`` is a literal ``$``; an unset variable without default is empty)."""
    def one(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group("braced") or m.group("bare")
        value, op, arg = variables.get(name), m.group("op"), m.group("arg")
        if op in (":-", "-"):
            return arg if (value is None or (op == ":-" and value == "")) else value
        if op in (":?", "?"):
            if value is None or (op == ":?" and value == ""):
                raise ValueError(f"required variable {name} is not set: {arg}")
            return value
        if op in (":+", "+"):
            return arg if value is not None and (op == "+" or value != "") else ""
        return value or ""
    return _VAR.sub(one, text)


class LocalCompose:
    """The services of a Compose file as local processes (see the module's docstring)."""

    def __init__(self, file: Path, variables: dict[str, str], scratch: Path):
        self.spec = yaml.safe_load(file.read_text())
        self.vars = variables
        self.scratch = scratch
        self.procs: list[subprocess.Popen] = []
        self.ports = {}  # published container port -> a free port of this machine
        for svc in self.spec["services"].values():
            for p in svc.get("ports", []):
                container = str(p).split(":")[-1]
                self.ports.setdefault(container, str(free_port()))
        self.logs: list[Path] = []

    def argv(self, name: str) -> list[str]:
        svc = self.spec["services"][name]
        cmd = svc["command"]
        args = [interpolate(str(a), self.vars) for a in (cmd if isinstance(cmd, list) else shlex.split(cmd))]
        mounts = {}
        for v in svc.get("volumes", []):
            parts = interpolate(str(v), self.vars).split(":")
            if len(parts) == 1:  # anonymous volume: a folder of its own
                source = self.scratch / f"{name}-{len(self.logs)}{parts[0].replace('/', '-')}"
                source.mkdir(parents=True, exist_ok=True)
                mounts[parts[0]] = str(source)
            else:
                mounts[parts[1]] = str(Path(parts[0]).resolve())
        out = []
        for a in args:
            for host in self.spec["services"]:
                a = a.replace(f"//{host}:", "//127.0.0.1:")
            a = a.replace("0.0.0.0", "127.0.0.1")
            head, sep, port = a.rpartition(":")
            if a in self.ports:
                a = self.ports[a]
            elif sep and port in self.ports and head.startswith(("127.0.0.1", "tcp://127.0.0.1")):
                a = f"{head}:{self.ports[port]}"
            for target in sorted(mounts, key=len, reverse=True):
                if a == target or a.startswith(target + "/"):
                    a = mounts[target] + a[len(target):]
                    break
            out.append(a)
        return out

    def env(self, name: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = tool_env()
        for item in self.spec["services"][name].get("environment", []):
            key, sep, value = str(item).partition("=")
            if sep:
                env[key] = interpolate(value, self.vars)
            elif key in self.vars:  # a bare name passes the caller's value, when it has one
                env[key] = self.vars[key]
            else:
                env.pop(key, None)
        env.update(extra or {})
        return env

    def up(self, services: list[str], scale: dict[str, int]) -> None:
        for name in services:
            n = scale.get(name, self.spec["services"][name].get("deploy", {}).get("replicas", 1))
            for _ in range(int(n)):
                log = self.scratch / f"{name}-{len(self.logs)}.log"
                self.logs.append(log)
                with open(log, "w") as f:
                    self.procs.append(subprocess.Popen(self.argv(name), env=self.env(name), stdout=f,
                                                       stderr=subprocess.STDOUT, cwd=self.scratch))

    def run(self, name: str, extra: dict[str, str]) -> subprocess.CompletedProcess:
        self.vars = {**self.vars, **extra}
        return subprocess.run(self.argv(name), env=self.env(name, extra), capture_output=True, text=True,
                              cwd=self.scratch, timeout=patience(300))

    def down(self) -> None:
        for p in reversed(self.procs):
            stop_process(p)
        self.procs = []


def _compose_lines() -> list[tuple[dict[str, str], list[str]]]:
    """docs/cluster.md's `docker compose` lines as (the variables set on the line, compose's arguments)."""
    out = []
    for line in (ln for b in readme_blocks(HEADING) for ln in b):
        words = shlex.split(line)
        assigns = {}
        while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
            k, _, v = words.pop(0).partition("=")
            assigns[k] = v
        if words[:2] == ["docker", "compose"]:
            out.append((assigns, words[2:]))
    return out


def _exported() -> dict[str, str]:
    line = next(ln for b in readme_blocks(HEADING) for ln in b if ln.startswith("export "))
    return dict(w.partition("=")[::2] for w in shlex.split(line)[1:])


def test_compose_file_is_valid_against_the_compose_specification(tmp_path):
    exe = which("check-jsonschema")
    if exe is None:
        pytest.skip("check-jsonschema is not installed (pip install -e '.[test]')")
    res = subprocess.run([exe, "--builtin-schema", "vendor.compose-spec", str(COMPOSE)], capture_output=True,
                         text=True, timeout=patience(120))
    assert res.returncode == 0, res.stdout + res.stderr
    # the check is real: a misspelt key of a service is refused
    bad = tmp_path / "compose.yaml"
    bad.write_text(COMPOSE.read_text().replace("    command:", "    comand:", 1))
    res = subprocess.run([exe, "--builtin-schema", "vendor.compose-spec", str(bad)], capture_output=True,
                         text=True, timeout=patience(120))
    assert res.returncode != 0 and "comand" in res.stdout + res.stderr


def test_readme_compose_lines_name_what_the_file_has():
    spec = yaml.safe_load(COMPOSE.read_text())
    text = COMPOSE.read_text()
    lines = _compose_lines()
    assert len(lines) >= 4
    for assigns, args in lines:
        assert args[:2] == ["-f", "deploy/docker/compose.yaml"], args
        assert (ROOT / args[1]).is_file()
        for name in assigns:
            assert f"${{{name}" in text, f"docs/cluster.md sets {name}, which compose.yaml never reads"
        verb, rest = args[2], args[3:]
        named = [w for w in rest if not w.startswith("-") and "=" not in w]
        assert all(s in spec["services"] for s in named), (verb, named)
    for name in _exported():
        assert f"${{{name}" in text, f"docs/cluster.md exports {name}, which compose.yaml never reads"
    assert spec["services"]["worker"]["deploy"]["resources"]["limits"]["memory"] == "${DUFS_WORKER_MEMORY:-4GiB}"


def test_dockerfile_installs_the_repository_as_a_non_root_user():
    text = DOCKERFILE.read_text()
    instructions = [ln.split(None, 1) for ln in re.sub(r"\\\n\s*", " ", text).splitlines()
                    if ln.strip() and not ln.lstrip().startswith("#")]
    kinds = [k.upper() for k, *_ in instructions]
    assert kinds[0] == "FROM"
    users = [(i, rest.strip()) for i, (k, rest) in enumerate(instructions) if k.upper() == "USER"]
    assert users and users[-1][1] not in ("root", "0") and users[-1][0] < kinds.index("CMD")
    installs = [i for i, (k, rest) in enumerate(instructions) if k.upper() == "RUN" and "pip install" in rest]
    assert installs and installs[-1] < users[-1][0]
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in re.findall(r"pip install \"?\.\[([\w,-]+)\]", text):
        assert set(extra.split(",")) <= set(extras), extra
    # every COPY source is in the repository and passes Dockerfile.dockerignore
    ignore = [ln.strip() for ln in (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().splitlines()
              if ln.strip() and not ln.startswith("#")]
    import fnmatch

    def ignored(path: str) -> bool:
        out = False
        for pat in ignore:
            neg = pat.startswith("!")
            p = pat.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(path, p) or path.startswith(p + "/") or fnmatch.fnmatch(path, p.replace("**/", "")):
                out = not neg
        return out

    for k, rest in instructions:
        if k.upper() == "COPY":
            *sources, _dest = rest.split()
            for src in sources:
                assert (ROOT / src).exists(), src
                assert not ignored(src), f"{src} is excluded by Dockerfile.dockerignore"
    spec = yaml.safe_load(COMPOSE.read_text())
    builds = [s["build"] for s in spec["services"].values() if "build" in s]
    assert len(builds) == 1, "one service builds the image, the others use it"
    assert (COMPOSE.parent / builds[0]["context"]).resolve() == ROOT
    assert (ROOT / builds[0]["dockerfile"]).resolve() == DOCKERFILE
    assert len({s["image"] for s in spec["services"].values()}) == 1
    # the image's own dufs commands (the kernels' warm-up) use options the command line has
    runner = CliRunner()
    for k, rest in instructions:
        for cmd in (c.strip() for c in rest.split("&&") if k.upper() == "RUN" and c.strip().startswith("dufs ")):
            words = shlex.split(cmd)
            res = runner.invoke(app, [words[1], "--help"], terminal_width=200)
            assert res.exit_code == 0, (cmd, res.output)
            for opt in (w for w in words[2:] if w.startswith("--")):
                assert opt in res.output, f"{cmd}: dufs {words[1]} has no option {opt}"


@pytest.mark.slow
def test_compose_services_run_as_local_processes(tmp_path, train_svm, train_store):
    """docs/cluster.md's lines, in order: `up` the scheduler and 2 workers, `run` convert, `run` select, `down`. The
    store is the local one converted by `dufs convert`, and the selection is Fisher's on it."""
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(train_svm, data / "train.svm")
    # what docs/cluster.md exports, with this test's folder and a small memory limit in place of its values
    variables = {**_exported(), "DUFS_DATA": str(data), "DUFS_WORKER_MEMORY": "1GiB"}
    compose = LocalCompose(COMPOSE, variables, tmp_path)
    assert compose.argv("worker")[2].startswith("tcp://127.0.0.1:")
    assert compose.argv("select")[2] == str(data / "train.zarr")
    for name in compose.spec["services"]:  # nothing of the containers' world is left in a command line
        left = [a for a in compose.argv(name) if a.startswith(("/data", "/scratch")) or "scheduler:" in a
                or "0.0.0.0" in a or a in ("8786", "8787")]
        assert not left, (name, left)
    lines = _compose_lines()
    try:
        for assigns, args in lines:
            verb, rest = args[2], args[3:]
            if verb == "up":
                scale = dict(w.split("=") for w in rest if "=" in w)
                compose.up([w for w in rest if not w.startswith("-") and "=" not in w],
                           {k: int(v) for k, v in scale.items()})
            elif verb == "run":
                service = rest[-1]
                res = compose.run(service, assigns)
                logs = "\n".join(p.read_text()[-2000:] for p in compose.logs)
                assert res.returncode == 0, f"{service}: {res.stderr}\n{logs}"
            elif verb == "down":
                compose.down()
    finally:
        compose.down()
    st, ref = dufs.open(data / "train.zarr"), dufs.open(train_store)
    assert (st.to_scipy("csc") != ref.to_scipy("csc")).nnz == 0
    sel = dufs.Selection.from_json(data / "selection.json")
    assert sel.diagnostics["n_workers"] == 2
    k = int(next(a["DUFS_K"] for a, args in lines if "DUFS_K" in a))
    want = dufs.fit(str(train_store), method="fisher", n_features=k, client=False)
    assert sel.method == "fisher" and sel.indices.tolist() == want.indices.tolist()
