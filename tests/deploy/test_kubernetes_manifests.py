"""deploy/kubernetes: the manifests hang together and the daemons accept every command they run. The replica pod
shares /dev/shm, a PID namespace and memd's socket between memd and modeld; modeld's probes are gRPC health on the
port it listens on; the headless Service selects the replicas on that port and is the name the gateway resolves;
Prometheus scrapes modeld's metrics port; each command parses with the daemon's own parser. Where kubectl is
installed, each overlay builds with kustomize and the GPU one gives both daemons the one GPU claim."""

import pathlib
import shlex
import shutil
import subprocess

import pytest
import yaml

from gateway.config import config_from_args as gateway_config
from memd.config import build_parser as memd_parser
from modeld.config import build_parser as modeld_parser

ROOT = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


def documents(path: pathlib.Path) -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(path.read_text()) if d}


@pytest.fixture(scope="module")
def base() -> dict[tuple[str, str], dict]:
    found = {}
    for path in (ROOT / "base").glob("*.yaml"):
        if path.name != "kustomization.yaml":
            found |= documents(path)
    return found


def containers(deployment: dict) -> dict[str, dict]:
    return {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}


def argv(container: dict, program: str) -> list[str]:
    """The container's command line after `exec PROGRAM` (or the command itself), with its env values in."""
    command = container["command"]
    line = command[-1] if command[0] == "sh" else shlex.join(command)
    env = {e["name"]: e.get("value", "") for e in container.get("env", [])}
    for name, value in env.items():
        line = line.replace(f"${name}", value)
    words = shlex.split(line)
    return words[words.index(program) + 1 :]


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_memd_and_modeld_share_what_their_pools_need(base):
    pod = base[("Deployment", "dflash-replica")]["spec"]["template"]["spec"]
    assert pod["shareProcessNamespace"] is True  # CUDA IPC: distinct pids in one namespace
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["shm"]["emptyDir"]["medium"] == "Memory"
    mounts = {
        name: {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        for name, c in containers(base[("Deployment", "dflash-replica")]).items()
    }
    assert mounts["memd"]["/dev/shm"] == mounts["modeld"]["/dev/shm"] == "shm"
    memd = argv(containers(base[("Deployment", "dflash-replica")])["memd"], "memd")
    modeld = argv(containers(base[("Deployment", "dflash-replica")])["modeld"], "modeld")
    socket = flag(memd, "--listen")
    assert socket.startswith("unix://") and flag(modeld, "--memd") == socket
    folder = str(pathlib.PurePosixPath(socket[len("unix://") :]).parent)
    assert mounts["memd"][folder] == mounts["modeld"][folder] == "sockets"
    assert pod["terminationGracePeriodSeconds"] >= 30  # the daemons drain on SIGTERM


def test_modeld_is_probed_by_grpc_health_on_the_port_it_listens_on(base):
    modeld = containers(base[("Deployment", "dflash-replica")])["modeld"]
    port = int(flag(argv(modeld, "modeld"), "--listen").rpartition(":")[2])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert modeld[probe]["grpc"]["port"] == port, probe
    annotations = base[("Deployment", "dflash-replica")]["spec"]["template"]["metadata"]["annotations"]
    metrics_port = int(flag(argv(modeld, "modeld"), "--metrics-port").rpartition(":")[2])
    assert int(annotations["prometheus.io/port"]) == metrics_port


def test_the_gateway_resolves_the_headless_service_of_the_replicas(base):
    service = base[("Service", "dflash-replicas")]
    replica = base[("Deployment", "dflash-replica")]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= replica["spec"]["template"]["metadata"]["labels"].items()
    gateway = argv(containers(base[("Deployment", "dflash-gateway")])["gateway"], "gateway")
    assert flag(gateway, "--modeld") == f"dns:///{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    pdb = base[("PodDisruptionBudget", "dflash-replica")]
    assert pdb["spec"]["selector"]["matchLabels"] == replica["spec"]["selector"]["matchLabels"]


def test_every_command_parses_with_the_daemons_own_parser(base):
    pod = containers(base[("Deployment", "dflash-replica")])
    memd_parser().parse_args(argv(pod["memd"], "memd"))
    modeld_parser().parse_args(argv(pod["modeld"], "modeld"))
    gateway_config(argv(containers(base[("Deployment", "dflash-gateway")])["gateway"], "gateway"))


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with kustomize) is not installed")
@pytest.mark.parametrize("overlay", ["overlays/cpu", "overlays/gpu", "inference-pool"])
def test_each_overlay_builds(overlay):
    built = yaml.safe_load_all(
        subprocess.run(["kubectl", "kustomize", str(ROOT / overlay)], capture_output=True, text=True, check=True).stdout
    )
    docs = {(d["kind"], d["metadata"]["name"]): d for d in built if d}
    pod = docs[("Deployment", "dflash-replica")]["spec"]["template"]["spec"]
    if overlay != "overlays/cpu":
        claims = {c["name"]: c["resources"].get("claims", []) for c in pod["containers"]}
        assert claims["memd"] == claims["modeld"] == [{"name": "gpu"}]  # one GPU, both daemons
        assert ("ResourceClaimTemplate", "dflash-gpu") in docs
    else:
        assert {c["image"] for c in pod["containers"]} == {"localhost/dflash-serve:cpu"}


KUBERNETES_VERSION = "1.34.0"  # the first release with DRA's resource.k8s.io/v1 (the GPU overlay's claim)
CUSTOM_KINDS = {"InferencePool"}  # the Gateway API Inference Extension's CRD: not in Kubernetes' own schemas


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with kustomize) is not installed")
@pytest.mark.parametrize("overlay", ["overlays/cpu", "overlays/gpu", "inference-pool"])
def test_each_overlay_validates_strictly_against_the_kubernetes_schemas(overlay):
    """Offline, with the schemas kubernetes-validate carries: every field known (strict), every required one there."""
    import kubernetes_validate

    built = subprocess.run(["kubectl", "kustomize", str(ROOT / overlay)], capture_output=True, text=True, check=True)
    checked = []
    for doc in yaml.safe_load_all(built.stdout):
        if doc and doc["kind"] not in CUSTOM_KINDS:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)  # raises ValidationError with the path
            checked.append(doc["kind"])
    assert {"Deployment", "Service", "PodDisruptionBudget"} <= set(checked)
    assert ("ResourceClaimTemplate" in checked) == (overlay != "overlays/cpu")
