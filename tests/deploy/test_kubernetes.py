"""``deploy/kubernetes``: the kustomize base and overlay render (``kubectl kustomize``, offline), the operator's
custom resources validate against the schemas ``dask-kubernetes`` ships (unknown fields are errors, as
``kubectl apply --validate=strict`` has them), the overlay sets what it says, and the DaskJob's pod, built by the
operator's own code, runs its `dufs select` against a local cluster."""

from __future__ import annotations

import copy
import re
import shlex
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

import dufs
from dufs.testing import patience
from tests.deploy._support import DEPLOY, ROOT, readme_line, tool_env, which

KUBE = DEPLOY / "kubernetes"
HEADING = "Kubernetes"


def _kustomize(directory: str) -> list[dict]:
    kubectl = which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (kubectl kustomize renders the manifests offline)")
    res = subprocess.run([kubectl, "kustomize", directory], cwd=ROOT, capture_output=True, text=True,
                         timeout=patience(120))
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    line = readme_line(HEADING, "kubectl kustomize")
    overlay = shlex.split(line)[2]
    return {"base": _kustomize(str(KUBE.relative_to(ROOT) / "base")), "overlay": _kustomize(overlay)}


def _crd_schemas() -> dict[str, dict]:
    dk = pytest.importorskip("dask_kubernetes", reason="the operator's schemas come with dask-kubernetes")
    crds = Path(dk.__file__).parent / "operator" / "deployment" / "helm" / "dask-kubernetes-operator" / "crds"
    out = {}
    for f in crds.glob("*.yaml"):
        crd = yaml.safe_load(f.read_text())
        version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
        out[crd["spec"]["names"]["kind"]] = {"group": crd["spec"]["group"], "version": version["name"],
                                             "schema": _strict(version["schema"]["openAPIV3Schema"])}
    assert {"DaskCluster", "DaskJob"} <= set(out), sorted(out)
    return out


def _strict(schema: dict) -> dict:
    """The schema with unknown fields refused where it lists an object's fields (what the API server prunes, or
    refuses under strict field validation), and OpenAPI's ``int-or-string`` taken as it is meant."""
    schema = copy.deepcopy(schema)

    def walk(s: dict) -> None:
        if s.get("format") == "int-or-string" or s.get("x-kubernetes-int-or-string"):
            s.pop("type", None)
            s["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        if "properties" in s and not s.get("x-kubernetes-preserve-unknown-fields"):
            s.setdefault("additionalProperties", False)
        for v in s.get("properties", {}).values():
            walk(v)
        for key in ("items", "additionalProperties"):
            if isinstance(s.get(key), dict):
                walk(s[key])
    walk(schema)
    return schema


def _errors(doc: dict, schemas: dict) -> list[str]:
    import jsonschema

    crd = schemas[doc["kind"]]
    assert doc["apiVersion"] == f"{crd['group']}/{crd['version']}"
    body = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind", "metadata")}
    v = jsonschema.Draft7Validator(crd["schema"])
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(body)]


def _one(docs: list[dict], kind: str) -> dict:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, (kind, [d["kind"] for d in docs])
    return found[0]


def test_custom_resources_validate_against_the_operators_schemas(rendered):
    schemas = _crd_schemas()
    for which_, docs in rendered.items():
        kinds = sorted(d["kind"] for d in docs)
        assert kinds == ["ConfigMap", "DaskCluster", "DaskJob", "PersistentVolumeClaim"], (which_, kinds)
        for doc in docs:
            if doc["kind"] in schemas:
                assert not _errors(doc, schemas), (which_, doc["kind"], _errors(doc, schemas))
    # the check is real: a misspelt field and a wrong type are refused
    job = copy.deepcopy(_one(rendered["base"], "DaskJob"))
    job["spec"]["cluster"]["spec"]["worker"]["replica"] = 3
    job["spec"]["job"]["spec"]["containers"][0]["args"] = "dufs select"
    errs = _errors(job, schemas)
    assert any("replica" in e for e in errs) and any("args" in e for e in errs), errs


def test_the_pieces_fit_together(rendered):
    for which_, docs in rendered.items():
        cluster, job = _one(docs, "DaskCluster"), _one(docs, "DaskJob")
        config = _one(docs, "ConfigMap")
        claim = _one(docs, "PersistentVolumeClaim")
        assert "ReadWriteMany" in claim["spec"]["accessModes"]
        for res, spec in ((cluster, cluster["spec"]), (job, job["spec"]["cluster"]["spec"])):
            # the scheduler's service selects this cluster's scheduler pod (the cluster is named after the resource)
            assert spec["scheduler"]["service"]["selector"]["dask.org/cluster-name"] == res["metadata"]["name"]
            worker = spec["worker"]["spec"]["containers"][0]
            args = worker["args"]
            assert args[:3] == ["dask", "worker", "$(DASK_SCHEDULER_ADDRESS)"]
            assert args[args.index("--nthreads") + 1] == "1"
            assert args[args.index("--memory-limit") + 1] == "$(DUFS_WORKER_MEMORY)"
            ref = next(e for e in worker["env"] if e["name"] == "DUFS_WORKER_MEMORY")["valueFrom"]["resourceFieldRef"]
            assert ref == {"containerName": worker["name"], "resource": "limits.memory"}
            assert worker["resources"]["requests"]["memory"] == worker["resources"]["limits"]["memory"]
            assert spec["worker"]["spec"]["securityContext"]["runAsNonRoot"] is True
            vols = {v["name"]: v for v in spec["worker"]["spec"]["volumes"]}
            assert vols["stores"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
        # the job's cluster is the long-running cluster's, but for the names
        a, b = copy.deepcopy(cluster["spec"]), copy.deepcopy(job["spec"]["cluster"]["spec"])
        for s in (a, b):
            del s["scheduler"]["service"]["selector"]["dask.org/cluster-name"]
        assert a == b, which_
        jc = job["spec"]["job"]["spec"]["containers"][0]
        assert {"configMapRef": {"name": config["metadata"]["name"]}} in jc["envFrom"]
        used = set(re.findall(r"\$\((\w+)\)", " ".join(jc["args"])))
        assert used - {"DASK_SCHEDULER_ADDRESS"} <= set(config["data"]), used
    base, overlay = (_one(rendered[k], "DaskCluster") for k in ("base", "overlay"))
    assert (base["spec"]["worker"]["replicas"], overlay["spec"]["worker"]["replicas"]) == (2, 4)
    ojob = _one(rendered["overlay"], "DaskJob")
    assert ojob["spec"]["cluster"]["spec"]["worker"]["replicas"] == 4
    mem = ojob["spec"]["cluster"]["spec"]["worker"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
    assert mem == overlay["spec"]["worker"]["spec"]["containers"][0]["resources"]["limits"]["memory"] == "6Gi"
    assert _one(rendered["overlay"], "ConfigMap")["data"]["DUFS_METHOD"] == "mmfs"


def _expand(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of ``$(VAR)`` in a container's args (``$$(VAR)`` stays literal; unknown stays)."""
    return re.sub(r"\$\$|\$\((\w+)\)", lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
                  arg)


@pytest.mark.slow
def test_the_job_pod_runs_its_selection(rendered, cluster, train_store, tmp_path):
    """The DaskJob's pod as the operator builds it (DASK_SCHEDULER_ADDRESS added), its environment from the
    ConfigMap, its args expanded as Kubernetes does; the scheduler's service name mapped to the local cluster and
    the stores volume's mount path to the folder holding train.zarr. The selection is the ConfigMap's."""
    pytest.importorskip("dask_kubernetes")
    from dask_kubernetes.operator.controller.controller import build_job_pod_spec

    docs = rendered["base"]
    job, config = _one(docs, "DaskJob"), _one(docs, "ConfigMap")
    name = job["metadata"]["name"]
    pod = build_job_pod_spec(job_name=name, cluster_name=name, namespace="default", spec=job["spec"]["job"]["spec"],
                             annotations={}, labels={})
    container = pod["spec"]["containers"][0]
    env = {**config["data"]}
    env.update({e["name"]: e["value"] for e in container["env"] if "value" in e})
    assert env["DASK_SCHEDULER_ADDRESS"] == f"tcp://{name}-scheduler.default.svc.cluster.local:8786"
    env["DASK_SCHEDULER_ADDRESS"] = cluster.address  # the service's name, on this machine
    mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "stores")
    argv = []
    for a in (_expand(a, env) for a in container.get("command", []) + container["args"]):
        argv.append(str(train_store.parent) + a[len(mount):] if a.startswith(mount + "/") else a)
    out = Path(argv[argv.index("-o") + 1])
    assert out.parent == train_store.parent and Path(argv[2]) == train_store
    res = subprocess.run(argv, env=tool_env(**{k: v for k, v in env.items() if not k.startswith("DASK_")}),
                         capture_output=True, text=True, timeout=patience(300))
    assert res.returncode == 0, res.stderr
    sel = dufs.Selection.from_json(out)
    assert sel.diagnostics["n_workers"] == 2
    want = dufs.fit(str(train_store), method=env["DUFS_METHOD"], n_features=int(env["DUFS_K"]), client=False)
    assert sel.method == env["DUFS_METHOD"] and sel.indices.size == want.indices.size == int(env["DUFS_K"])
    # the same scores, so the same selection up to features of equal score (the k-th best scores agree)
    assert np.allclose(sel.scores, want.scores, rtol=1e-5, atol=1e-12)
    assert np.allclose(want.scores[sel.indices], want.scores[want.indices], rtol=1e-5, atol=1e-12)
