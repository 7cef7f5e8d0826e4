"""The CPU overlay of deploy/kubernetes under podman's Kubernetes runner (`podman kube play`), when
DFLASH_CONTAINER_TESTS=1 (.ci/run sets it): the replica pod (memd + modeld) and the gateway come up from the rendered
manifests, memd's exec probe and modeld's gRPC health pass, a chat completion is answered through the gateway, which
found the replica by name, and the pods go down cleanly (both daemons drain and exit 0, memd's segments and socket
are gone, `podman kube down` leaves no pod and no container).

podman 4.3.1 (the CI machines') is not a kubelet, and the rendered manifests are changed where it differs; nothing
else of them is (commands, probes, security context, shared PID namespace, volumes' mount points):
- the pods use the host's network (these machines' podman must: tests/integration/containers.conf), where podman
  refuses containerPorts, so the ports are dropped and each listening port is moved to a free one;
- podman removes an init container while it still runs, so the model's conversion (the init container's own
  command) runs first with `podman run` into a named volume, which the pod mounts as its PersistentVolumeClaim;
- podman makes an emptyDir owned by root, where the pod's user cannot write (a kubelet's is writable), so /dev/shm
  and memd's socket folder are host folders made writable to all, as an emptyDir is;
- the gateway's --modeld name is the replica's address (no cluster DNS), still through its dns:/// discovery;
- podman stops a pod's infrastructure container with its others, which kills every process of a shared PID
  namespace at once, so the containers are stopped first, modeld then memd (a kubelet stops the sandbox last)."""

import json
import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.daemons import REPO
from tests.integration.stacks import free_port, podman, probe, wait_until

OVERLAY = REPO / "deploy" / "kubernetes" / "overlays" / "cpu"
MODELS_VOLUME = "dflash-kube-play-models"
POD = "dflash-replica-pod-0"


def rendered() -> dict[str, dict]:
    """The CPU overlay as kustomize renders it: its Deployments by name."""
    out = subprocess.run(["kubectl", "kustomize", str(OVERLAY)], capture_output=True, text=True, check=True)
    return {d["metadata"]["name"]: d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "Deployment"}


def moved(word: str, ports: dict[int, int]) -> str:
    """A command word with each listening port moved: a port alone, or after a colon (an address)."""
    for old, new in ports.items():
        word = str(new) if word == str(old) else word.replace(f":{old}", f":{new}")
    return word


def for_podman(deployment: dict, image: str, ports: dict[int, int], folders: dict[str, Path]) -> dict:
    """The module docstring's changes, and the built image."""
    spec = deployment["spec"]["template"]["spec"]
    spec.pop("initContainers", None)
    for container in spec["containers"]:
        container["image"] = image
        container.pop("ports", None)
        container["command"] = [moved(word, ports) for word in container["command"]]
        for probe_kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            grpc_probe = container.get(probe_kind, {}).get("grpc")
            if grpc_probe is not None:
                grpc_probe["port"] = ports[grpc_probe["port"]]
            if "httpGet" in container.get(probe_kind, {}):
                container[probe_kind]["httpGet"]["port"] = ports[8000]
    for volume in spec.get("volumes", []):
        if volume["name"] == "models":
            volume.pop("emptyDir")
            volume["persistentVolumeClaim"] = {"claimName": MODELS_VOLUME}
        elif "emptyDir" in volume:
            volume.pop("emptyDir")
            volume["hostPath"] = {"path": str(folders[volume["name"]]), "type": "Directory"}
    return deployment


@pytest.fixture(scope="module")
def played(container_image):
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl renders the overlay (kustomize): not installed")
    deployments = rendered()
    init = deployments["dflash-replica"]["spec"]["template"]["spec"]["initContainers"][0]
    podman("volume", "rm", "-f", MODELS_VOLUME, check=False)
    podman("volume", "create", MODELS_VOLUME)
    podman("run", "--rm", "-v", f"{MODELS_VOLUME}:/models", container_image, *init["command"], timeout=900)
    ports = {port: free_port() for port in (50052, 9100, 9101, 8000)}
    work = Path(tempfile.mkdtemp(prefix="kube-play-"))
    folders = {name: work / name for name in ("shm", "sockets")}
    for folder in folders.values():
        folder.mkdir()
        folder.chmod(0o1777)
    gateway = deployments["dflash-gateway"]
    command = gateway["spec"]["template"]["spec"]["containers"][0]["command"]
    command[command.index("--modeld") + 1] = "dns:///127.0.0.1:50052"
    files = []
    for name, deployment in (("replica", deployments["dflash-replica"]), ("gateway", gateway)):
        files.append(work / f"{name}.yaml")
        files[-1].write_text(yaml.safe_dump(for_podman(deployment, container_image, ports, folders)))
    try:
        for path in files:
            podman("kube", "play", "--network", "host", str(path), timeout=300)
        yield ports, folders, files
    finally:
        for path in files:
            podman("kube", "down", str(path), check=False, timeout=120)
        podman("volume", "rm", "-f", MODELS_VOLUME, check=False)
        shutil.rmtree(work, ignore_errors=True)


def logs() -> str:
    return "\n".join(podman("logs", f"{POD}-{name}", check=False).stderr[-3000:] for name in ("memd", "modeld"))


def test_the_replica_serves_through_the_gateway_and_goes_down_cleanly(played):
    ports, folders, played_files = played
    modeld = f"127.0.0.1:{ports[50052]}"
    try:
        wait_until(lambda: probe(modeld)[0] == 0, 300, "modeld SERVING (its gRPC health: the pod's probe)")
    except TimeoutError:
        print(logs())
        raise
    memd_probe = podman("healthcheck", "run", f"{POD}-memd", check=False)
    assert memd_probe.returncode == 0, f"memd's exec probe failed: {memd_probe.stdout} {memd_probe.stderr}"
    gateway = f"http://127.0.0.1:{ports[8000]}"

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"{gateway}/health", timeout=5) as answer:
                return answer.status == 200
        except OSError:
            return False

    wait_until(ready, 120, "the gateway ready (a replica found by name and SERVING)", interval=1)
    with urllib.request.urlopen(f"{gateway}/v1/models", timeout=10) as answer:
        model = json.load(answer)["data"][0]["id"]
    body = {"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8, "temperature": 0}
    request = urllib.request.Request(
        f"{gateway}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        reply = json.load(answer)
    assert reply["choices"][0]["message"]["content"] and reply["usage"]["completion_tokens"] > 0
    for name in ("modeld", "memd"):  # as a kubelet stops them: SIGTERM, then the grace period
        podman("stop", "-t", "60", f"{POD}-{name}", timeout=90)
    codes = {
        name: podman("inspect", f"{POD}-{name}", "--format", "{{.State.ExitCode}}").stdout.strip()
        for name in ("modeld", "memd")
    }
    assert codes == {"modeld": "0", "memd": "0"}, f"{codes}\n{logs()}"
    assert not any(folders["shm"].iterdir()) and not any(folders["sockets"].iterdir()), "memd left its files"
    for path in played_files:
        podman("kube", "down", str(path), timeout=120)
    assert podman("pod", "ps", "-q", "--filter", "name=dflash-").stdout.strip() == "", "a pod is left"
    assert podman("ps", "-aq", "--filter", "name=dflash-").stdout.strip() == "", "a container is left"
