"""The deploy files (deploy/): each is parsed or validated as its tool would, and the commands it
runs are run here, on loopback, with its own environment (paths and ports rewritten): the
Dockerfile's CMD and HEALTHCHECK, the compose file's Valkey Cluster, 3 masters with a replica
each (its node options
and its init command), serve and two workers, the Kubernetes containers and their probe paths,
and the systemd units' ExecStart. No Docker daemon, kubelet or systemd is needed; what only they
would do (build the image, mount the Secret) is checked by structure. docs/deploy.md."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import httpx
import kubernetes_validate
import pytest
import valkey
import yaml
from dockerfile_parse import DockerfileParser

from prompt_outbox.cli import main
from prompt_outbox.embedded import free_port
from prompt_outbox.outbox import Outbox
from prompt_outbox.storage.compat import valkey_server_binary
from prompt_outbox.storage.connect import connect
from tests.replication import halt, wait_until
from tests.support.agent import SECRET, Agent
from tests.support.processes import process_group
from tests.support.serve import wait_healthy
from tests.support.tools import tool

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
VENV_BIN = str(Path(sys.executable).parent)
TOKEN = "deploy-test-token-0123456789"
PASSWORD = "compose-test-password"


# --- running what the files run -------------------------------------------------------------


@contextmanager
def running(
    argv: list[str], env: dict[str, str], log: Path, bin_dir: str = VENV_BIN
) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` as the file gives it, found on the image's PATH (the venv's bin here), with
    ``env`` over a minimal environment (as a container starts), its output in ``log``. The
    image's PATH leads to its venv: here, to ``bin_dir`` (ours unless said)."""
    path = bin_dir + os.pathsep + os.environ["PATH"]
    env = {"HOME": str(log.parent), **env, "PATH": path}
    with log.open("ab") as out, process_group(argv, env, stdout=out, stderr=out) as proc:
        yield proc


def stop(proc: subprocess.Popen[bytes], log: Path) -> None:
    """SIGTERM, the stop every file configures: a clean exit 0."""
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, log.read_text()[-2000:]


def localise(env: dict[str, str], swaps: dict[str, str], port: int | None = None) -> dict[str, str]:
    """The file's environment on loopback: each ``swaps`` key replaced in every value (service
    names, mounted paths, 0.0.0.0), PROMPT_OUTBOX_PORT a free port."""
    out = {}
    for key, value in env.items():
        for old, new in swaps.items():
            value = value.replace(old, new)
        out[key] = value
    if port is not None:
        out["PROMPT_OUTBOX_PORT"] = str(port)
    return out


def accept(port: int, ws: str, ses: str = "s1") -> str:
    """One prompt accepted over HTTP with the test token; its ID."""
    r = httpx.post(
        f"http://127.0.0.1:{port}/v1/workspaces/{ws}/sessions/{ses}/prompts",
        json={"clientMessageID": f"{ws}-1", "text": f"hello from {ws}"},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def delivered(agent: Agent, entry_id: str) -> None:
    wait_until(lambda: entry_id in agent.ids(), 30, f"delivery of {entry_id}")


def accept_directly(url: str, ws: str) -> str:
    """An accept through the library (no serve running): only a worker can deliver it."""

    async def main() -> str:
        client = connect(url)
        try:
            entry = await Outbox(client).accept(ws, "s1", "ops", f"{ws}-1", f"hello from {ws}")
            return entry.id
        finally:
            await client.aclose()

    return asyncio.run(main())


@pytest.fixture(scope="module")
def agent() -> Iterator[Agent]:
    with Agent() as rec:
        yield rec


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("secrets") / "tokens.json"
    path.write_text(json.dumps({"tokens": [{"token": TOKEN, "user": "ops", "admin": True}]}))
    path.chmod(0o600)
    return path


# --- configuration by environment --------------------------------------------------------------

# Not from the environment, on purpose: turning authentication off must be seen on the command
# line, and --webhook-secret-env names a variable itself.
FLAGS_ONLY = {"no_auth", "webhook_secret_env"}


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_every_option_has_an_environment_variable(command: str) -> None:
    """The files configure serve and worker by PROMPT_OUTBOX_* variables only: each option
    (but FLAGS_ONLY) must have one."""
    cli = main.commands[command]
    for param in cli.params:
        if not isinstance(param, click.Option) or param.name in FLAGS_ONLY:
            continue
        assert isinstance(param.envvar, str), f"{command} {param.opts[0]} has no variable"
        assert param.envvar.startswith("PROMPT_OUTBOX_"), param.envvar


# --- Dockerfile -------------------------------------------------------------------------------


@dataclass
class Image:
    parser: DockerfileParser

    @property
    def env(self) -> dict[str, str]:
        return dict(self.parser.envs)

    def instruction(self, name: str) -> list[str]:
        """The values of ``name`` in the final stage."""
        stages = [i for i in self.parser.structure if i["instruction"] == "FROM"]
        last = stages[-1]["startline"]
        return [
            i["value"]
            for i in self.parser.structure
            if i["instruction"] == name and i["startline"] > last
        ]

    def healthcheck(self) -> tuple[dict[str, str], list[str]]:
        """HEALTHCHECK's options and its exec-form command."""
        (value,) = self.instruction("HEALTHCHECK")
        options, command = value.split(" CMD ", 1)
        flags = dict(re.findall(r"--([a-z-]+)=(\S+)", options))
        return flags, json.loads(command)


@pytest.fixture(scope="module")
def image() -> Image:
    return Image(DockerfileParser(path=str(DEPLOY / "Dockerfile")))


def test_dockerfile_is_slim_non_root_with_a_health_check(image: Image) -> None:
    assert image.parser.is_multistage
    assert image.parser.baseimage == "python:3.11-slim"  # the final stage's base
    (user,) = image.instruction("USER")
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # numeric: runAsNonRoot can check it
    assert image.instruction("EXPOSE") == [image.env["PROMPT_OUTBOX_PORT"]]
    flags, command = image.healthcheck()
    assert {"interval", "timeout", "retries"} <= flags.keys()
    assert "/healthz" in " ".join(command)
    assert json.loads(image.parser.cmd) == ["prompt-outbox", "serve"]
    assert image.instruction("STOPSIGNAL") == ["SIGTERM"]
    # The build stage installs the wheel it builds from the source tree: no source in the image.
    copies = image.instruction("COPY")
    assert copies and all(c.startswith("--from=build ") for c in copies)
    ignored = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    assert {"*", "!pyproject.toml", "!README.md", "!src/"} <= set(ignored)


def run_image(image: Image, tokens: Path, tmp_path: Path, bin_dir: str) -> None:
    """The CMD with the image's ENV alone (the token file where the image expects it mounted,
    /data a fresh dir), its venv's bin first on PATH: it serves, embedded Valkey and all; the
    HEALTHCHECK command passes while it runs and fails once it is gone."""
    port = free_port()
    env = localise(
        image.env,
        {
            "/run/secrets/prompt-outbox-tokens": str(tokens),
            "/data": str(tmp_path / "data"),
            "0.0.0.0": "127.0.0.1",
        },
        port,
    )
    _, check = image.healthcheck()
    log = tmp_path / "serve.log"
    with running(json.loads(image.parser.cmd), env, log, bin_dir) as serve:
        wait_healthy(port)
        accept(port, "docker")
        assert subprocess.run(check, env={**env, "PATH": bin_dir}, timeout=30).returncode == 0
        stop(serve, log)
    failed = subprocess.run(check, env={**env, "PATH": bin_dir}, capture_output=True, timeout=30)
    assert failed.returncode != 0


def test_dockerfile_cmd_serves_and_its_health_check_tells(
    image: Image, tokens: Path, tmp_path: Path
) -> None:
    run_image(image, tokens, tmp_path, VENV_BIN)


def build_run(image: Image) -> str:
    """The build stage's RUN (the file's first), its lines joined."""
    (run, *_) = [r["value"] for r in image.parser.structure if r["instruction"] == "RUN"]
    return str(run)


def build_stage(image: Image) -> list[list[str]]:
    """The build stage's RUN, command by command (its lines are joined with &&)."""
    return [shlex.split(part) for part in build_run(image).split("&&")]


def test_dockerfile_build_stage_makes_a_whole_wheel(image: Image, tmp_path: Path) -> None:
    """The build stage's `pip wheel` of the source tree packs the Lua scripts and the queue
    page's bundle, without which the image would start and fail at its first accept."""
    wheel = build_stage(image)[0]
    assert wheel[:3] == ["python", "-m", "pip"] and wheel[-1] == "."
    wheel = [sys.executable, *wheel[1:]]
    wheel[wheel.index("--wheel-dir") + 1] = str(tmp_path)
    built = subprocess.run(wheel, cwd=DEPLOY.parent, capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr[-2000:]
    (whl,) = tmp_path.glob("prompt_outbox-*.whl")
    names = subprocess.run(
        [sys.executable, "-m", "zipfile", "-l", str(whl)], capture_output=True, text=True
    ).stdout
    assert "prompt_outbox/storage/lua/accept.lua" in names
    assert "prompt_outbox/ui/static/" in names


@pytest.mark.slow  # pip downloads every dependency: minutes; make test-all runs it
@pytest.mark.timeout(900)
def test_dockerfile_build_stage_venv_runs_the_cmd(
    image: Image, tokens: Path, tmp_path: Path
) -> None:
    """The build stage's RUN as written, through sh as the build runs it (/wheels and
    /opt/prompt-outbox in a temporary dir, `python` this one), with the build argument
    EXTRAS=otel: it makes the venv the image copies, the traces' packages in it; the CMD and
    the HEALTHCHECK then run from that venv alone."""
    (arg,) = [i["value"] for i in image.parser.structure if i["instruction"] == "ARG"]
    assert arg == 'EXTRAS=""'  # none unless asked for
    run = build_run(image)
    venv = tmp_path / "venv"
    for old, new in {"/wheels": str(tmp_path / "wheels"), "/opt/prompt-outbox": str(venv)}.items():
        run = run.replace(old, new)
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "python").symlink_to(sys.executable)
    env = {**os.environ, "EXTRAS": "otel", "PATH": f"{shim}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["sh", "-c", run], cwd=DEPLOY.parent, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    traced = [str(venv / "bin" / "python"), "-c", "import opentelemetry.sdk.trace"]
    assert subprocess.run(traced, capture_output=True).returncode == 0
    run_image(image, tokens, tmp_path, str(venv / "bin"))


# --- compose ----------------------------------------------------------------------------------

_VAR = re.compile(r"\$(?:(\$)|\{([A-Z_][A-Z0-9_]*)(?::([?-])([^}]*))?\}|([A-Z_][A-Z0-9_]*))")


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's ``${VAR}``, ``${VAR:?error}``, ``${VAR:-default}`` and ``$$``, in every string."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        if m.group(1):
            return "$"
        name = m.group(2) or m.group(5)
        if env.get(name):
            return env[name]
        if m.group(3) == "?":
            raise KeyError(f"{name}: {m.group(4)}")
        return m.group(4) or ""

    return _VAR.sub(one, value)


COMPOSE_ENV = {"VALKEY_PASSWORD": PASSWORD, "WEBHOOK_SECRET": SECRET.decode()}


@dataclass
class ComposeCluster:
    """The compose file (interpolated) and its three Valkey nodes running here."""

    doc: dict[str, Any]
    ports: dict[str, int]  # service name -> loopback port
    swaps: dict[str, str]  # valkey-N:6379 -> 127.0.0.1:port, for every value
    pids: list[int]  # the nodes' (sh execs valkey-server in place)

    def init(self, root: Path) -> subprocess.CompletedProcess[str]:
        """valkey-init's command, with its environment, valkey-cli being Debian's redis-cli."""
        service = self.doc["services"]["valkey-init"]
        first = self.ports["valkey-1"]
        argv = [
            a.replace("valkey-cli", f"{tool('redis-cli')} -p {first}") for a in service["command"]
        ]
        env = {"PATH": os.environ["PATH"], **localise(service["environment"], self.swaps)}
        return subprocess.run(argv, env=env, cwd=root, capture_output=True, text=True, timeout=60)


IMAGE_START = "docker-entrypoint.sh valkey-server"


def _node_argv(service: dict[str, Any], port: int, root: Path) -> list[str]:
    """A node's entrypoint and command here: the bundled binary where the script starts the
    image's entrypoint (which only drops to the valkey user), our port, the hostname it
    announces ours, and what a container gives by itself (its own bind address, bus port and
    /data). ``--set-proc-title no`` keeps /proc/<pid>/cmdline as it was started (valkey-server
    rewrites it to its title after start: a password on it is in ``ps`` until then)."""
    sh, flag, script, name = service["entrypoint"]
    assert script.count(IMAGE_START) == 1, script
    script = script.replace(IMAGE_START, shlex.quote(str(valkey_server_binary())))
    options = list(service["command"])
    options[options.index("--port") + 1] = str(port)
    options[options.index("--cluster-announce-hostname") + 1] = "127.0.0.1"
    here = ["--bind", "127.0.0.1", "--cluster-port", str(free_port()), "--dir", str(root)]
    root.mkdir()
    return [sh, flag, script, name, *options, *here, "--set-proc-title", "no"]


def _passes(shell: str, env: dict[str, str]) -> bool:
    done = subprocess.run(["sh", "-c", shell], env=env, capture_output=True, timeout=10)
    return done.returncode == 0


def _cluster_ok(port: int) -> bool:
    with valkey.Valkey(host="127.0.0.1", port=port, password=PASSWORD, socket_timeout=5) as node:
        return bool(node.cluster("info")["cluster_state"] == "ok")


@contextmanager
def compose_nodes(root: Path, webhook_url: str) -> Iterator[ComposeCluster]:
    """The compose file's Valkey nodes (interpolated), running here and healthy, as compose
    starts them for valkey-init: no cluster formed yet."""
    raw = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    doc = interpolate(raw, {**COMPOSE_ENV, "WEBHOOK_URL": webhook_url})
    nodes = [n for n in doc["services"] if n.startswith("valkey-") and n != "valkey-init"]
    ports = {n: free_port() for n in nodes}
    swaps = {f"{n}:6379": f"127.0.0.1:{p}" for n, p in ports.items()}
    procs = []
    try:
        for name in nodes:
            argv = _node_argv(doc["services"][name], ports[name], root / name)
            env = {"PATH": os.environ["PATH"], **doc["services"][name]["environment"]}
            procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL))
        for name in nodes:  # each node's own healthcheck, as depends_on waits for it
            test = doc["services"][name]["healthcheck"]["test"]
            assert test[0] == "CMD-SHELL"
            check = test[1].replace("valkey-cli", f"{tool('redis-cli')} -p {ports[name]}")
            env = {"PATH": os.environ["PATH"], **doc["services"][name]["environment"]}
            wait_until(lambda: _passes(check, env), 20, f"{name} healthy")  # noqa: B023
        yield ComposeCluster(doc, ports, swaps, [proc.pid for proc in procs])
    finally:
        for proc in procs:
            halt(proc)


def _formed(cluster: ComposeCluster, root: Path) -> None:
    """valkey-init, as compose runs it once the nodes are healthy; the cluster then works."""
    made = cluster.init(root)
    assert made.returncode == 0, made.stdout + made.stderr
    _working(cluster.ports.values())


def _working(ports: Iterable[int]) -> None:
    """Until each of these nodes says cluster_state:ok."""
    for port in ports:
        wait_until(lambda: _cluster_ok(port), 20, "cluster_state:ok")  # noqa: B023


def _roles(cluster: ComposeCluster) -> list[tuple[str, object]]:
    """Each node's role, with a master's linked replicas or a replica's link, sorted."""
    roles = []
    for port in cluster.ports.values():
        with valkey.Valkey(host="127.0.0.1", port=port, password=PASSWORD) as node:
            info = node.info("replication")
        master = info["role"] == "master"
        roles.append(
            (info["role"], info["connected_slaves"] if master else info["master_link_status"])
        )
    return sorted(roles, key=str)


ONE_REPLICA_EACH = [("master", 1)] * 3 + [("slave", "up")] * 3


@pytest.fixture(scope="module")
def compose_cluster(
    tmp_path_factory: pytest.TempPathFactory, agent: Agent
) -> Iterator[ComposeCluster]:
    root = tmp_path_factory.mktemp("compose")
    with compose_nodes(root, agent.url) as cluster:
        _formed(cluster, root)
        yield cluster


def test_compose_file_names_its_images_and_publishes_on_loopback() -> None:
    doc = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = doc["services"]
    for name, service in services.items():
        if service.get("image", "").startswith("valkey"):
            assert service["image"] == "valkey/valkey:9.1", name  # by name, no registry host
    assert services["serve"]["ports"] == ["127.0.0.1:8080:8080"]  # plain HTTP: not on the LAN
    assert services["serve"]["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
    assert services["worker"]["deploy"]["replicas"] == 2
    assert services["worker"]["healthcheck"] == {"disable": True}  # no HTTP in a worker
    assert doc["secrets"]["prompt-outbox-tokens"] == {"file": "./tokens.json"}
    with pytest.raises(KeyError, match="VALKEY_PASSWORD"):  # no cluster without a password
        interpolate(doc, {})


def test_compose_nodes_keep_the_password_off_their_command_line(
    compose_cluster: ComposeCluster,
) -> None:
    """Each node's argv, as the kernel holds it (what ``ps`` on the host shows), has no
    password, yet the node asks for it: it came in on stdin."""
    for pid in compose_cluster.pids:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert argv[1:3] == [b"-", b"--port"], argv  # valkey-server itself, config on stdin
        assert not any(PASSWORD.encode() in arg for arg in argv), argv
    for port in compose_cluster.ports.values():
        node = valkey.Valkey(host="127.0.0.1", port=port, socket_timeout=5)
        with node, pytest.raises(valkey.AuthenticationError, match="Authentication required"):
            node.ping()


def test_compose_cluster_gives_each_master_a_linked_replica(
    compose_cluster: ComposeCluster,
) -> None:
    """The init command made three masters, each with a replica, and returned once every
    replica was linked: serve's start, at the file's accept level (replica), checks for one."""
    assert _roles(compose_cluster) == ONE_REPLICA_EACH
    env = compose_cluster.doc["services"]["worker"]["environment"]
    assert env["PROMPT_OUTBOX_ACCEPT_DURABILITY"] == "replica"


def test_compose_init_joins_new_nodes_to_a_cluster_made_without_them(
    tmp_path: Path, agent: Agent
) -> None:
    """A cluster made by an earlier file, three masters and no replicas: the next start's
    init finds it working, joins the three nodes that know only themselves as replicas (one
    to each master: the one with the fewest), and waits for them to link."""
    (tmp_path / "nodes").mkdir()
    with compose_nodes(tmp_path / "nodes", agent.url) as cluster:
        masters = [f"127.0.0.1:{port}" for port in list(cluster.ports.values())[:3]]
        old = [tool("redis-cli"), "--cluster", "create", *masters, "--cluster-replicas", "0"]
        made = subprocess.run(
            [*old, "--cluster-yes"], env={**os.environ, "REDISCLI_AUTH": PASSWORD},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert made.returncode == 0, made.stdout + made.stderr
        _working(list(cluster.ports.values())[:3])  # it ran so
        _formed(cluster, tmp_path)
        assert _roles(cluster) == ONE_REPLICA_EACH


def test_compose_serve_and_two_workers_deliver_on_its_cluster(
    compose_cluster: ComposeCluster, image: Image, agent: Agent, tokens: Path, tmp_path: Path
) -> None:
    """serve and two workers with the compose file's command and environment over the image's,
    on the cluster its own node options and init command made: an HTTP accept is delivered;
    with serve gone, the workers deliver what is accepted; a second init changes nothing."""
    services = compose_cluster.doc["services"]
    (secret,) = services["serve"]["secrets"]
    swaps = {
        **compose_cluster.swaps,
        f"/run/secrets/{secret}": str(tokens),  # where compose mounts a secret
        "0.0.0.0": "127.0.0.1",
    }
    port = free_port()
    serve_env = localise({**image.env, **services["serve"]["environment"]}, swaps, port)
    assert serve_env["PROMPT_OUTBOX_TOKENS_FILE"] == str(tokens)
    worker_env = localise({**image.env, **services["worker"]["environment"]}, swaps)
    log = tmp_path / "compose.log"
    with ExitStack() as stack:
        serve = stack.enter_context(running(services["serve"]["command"], serve_env, log))
        workers = [
            stack.enter_context(running(services["worker"]["command"], worker_env, log))
            for _ in range(services["worker"]["deploy"]["replicas"])
        ]
        wait_healthy(port)
        delivered(agent, accept(port, "compose"))
        stop(serve, log)
        url = worker_env["PROMPT_OUTBOX_VALKEY_URL"]
        delivered(agent, accept_directly(url, "compose-workers"))
        for worker in workers:
            stop(worker, log)
    again = compose_cluster.init(tmp_path)
    assert again.returncode == 0 and "Performing hash slots" not in again.stdout
    assert "Adding node" not in again.stdout, again.stdout


# --- Kubernetes -------------------------------------------------------------------------------


def manifests() -> list[dict[str, Any]]:
    docs = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def one(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in manifests() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def test_k8s_manifests_validate_against_the_schemas() -> None:
    """Offline, against the Kubernetes JSON schemas kubernetes-validate ships, strictly (an
    unknown or misspelt field is an error, as `kubectl apply --validate=strict` would say)."""
    docs = manifests()
    kinds = sorted(d["kind"] for d in docs)
    assert kinds.count("Deployment") == 2 and "Service" in kinds
    assert kinds.count("PodDisruptionBudget") == 2 and "Secret" in kinds
    version = kubernetes_validate.latest_version()
    for doc in docs:
        for each in ("1.25.0", version):  # the oldest schemas the package ships, and the newest
            kubernetes_validate.validate(doc, each, strict=True)
    bad = one("Deployment", "prompt-outbox-serve")
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, version, strict=True)


def test_k8s_pods_are_locked_down_and_wired() -> None:
    deployments = [d for d in manifests() if d["kind"] == "Deployment"]
    for deployment in deployments:
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert pod["enableServiceLinks"] is False  # else PROMPT_OUTBOX_PORT=tcp://...
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"] == labels
        (pdb,) = [
            d
            for d in manifests()
            if d["kind"] == "PodDisruptionBudget" and d["spec"]["selector"]["matchLabels"] == labels
        ]
        assert pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"]["drop"] == ["ALL"]
            assert {"cpu", "memory"} <= container["resources"]["requests"].keys()
            assert "memory" in container["resources"]["limits"]
    serve = one("Deployment", "prompt-outbox-serve")["spec"]["template"]["spec"]
    (container,) = serve["containers"]
    (tokens_volume,) = [v for v in serve["volumes"] if "secret" in v]
    assert tokens_volume["secret"]["defaultMode"] == 0o400
    assert tokens_volume["secret"]["secretName"] == "prompt-outbox-tokens"
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == tokens_volume["name"]]
    assert mount["readOnly"] is True
    tokens_file = {e["name"]: e.get("value") for e in container["env"]}["PROMPT_OUTBOX_TOKENS_FILE"]
    assert tokens_file == mount["mountPath"] + "/tokens.json"
    assert "tokens.json" in one("Secret", "prompt-outbox-tokens")["stringData"]
    service = one("Service", "prompt-outbox")
    assert (
        service["spec"]["selector"]
        == one("Deployment", "prompt-outbox-serve")["spec"]["selector"]["matchLabels"]
    )
    port_names = {p["name"] for p in container["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


def container_env(container: dict[str, Any], secrets: dict[tuple[str, str], str]) -> dict[str, str]:
    """A container's env as the kubelet sets it, a secretKeyRef read from ``secrets``."""
    env = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = secrets[(ref["name"], ref["key"])]
    return env


def test_k8s_serve_and_worker_run_and_their_probes_answer(
    compose_cluster: ComposeCluster, image: Image, agent: Agent, tokens: Path, tmp_path: Path
) -> None:
    """The serve and worker containers' command and env (over the image's), the Secrets'
    values those of this test: serve answers 200 on every probe path, an accept is delivered,
    and the worker delivers once serve is gone."""
    first = compose_cluster.ports["valkey-1"]
    secrets = {
        ("prompt-outbox-valkey", "url"): f"valkey+cluster://:{PASSWORD}@127.0.0.1:{first}",
        ("prompt-outbox-webhook", "secret"): SECRET.decode(),
    }
    serve_pod = one("Deployment", "prompt-outbox-serve")["spec"]["template"]["spec"]
    worker_pod = one("Deployment", "prompt-outbox-worker")["spec"]["template"]["spec"]
    (serve_c,) = serve_pod["containers"]
    (worker_c,) = worker_pod["containers"]
    raw = container_env(serve_c, secrets)
    (http,) = serve_c["ports"]
    assert http["containerPort"] == int(raw["PROMPT_OUTBOX_PORT"])
    swaps = {
        raw["PROMPT_OUTBOX_TOKENS_FILE"]: str(tokens),  # the Secret's file
        raw["PROMPT_OUTBOX_WEBHOOK_URL"]: agent.url,
        "0.0.0.0": "127.0.0.1",
    }
    port = free_port()
    serve_env = localise({**image.env, **raw}, swaps, port)
    worker_env = localise({**image.env, **container_env(worker_c, secrets)}, swaps)
    log = tmp_path / "k8s.log"
    with running(serve_c["command"], serve_env, log) as serve:
        wait_healthy(port)
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            get = serve_c[probe]["httpGet"]
            assert get["port"] == http["name"]
            assert httpx.get(f"http://127.0.0.1:{port}{get['path']}").status_code == 200
        delivered(agent, accept(port, "k8s"))
        stop(serve, log)
    with running(worker_c["command"], worker_env, log) as worker:
        delivered(agent, accept_directly(worker_env["PROMPT_OUTBOX_VALKEY_URL"], "k8s-worker"))
        stop(worker, log)


# --- systemd ----------------------------------------------------------------------------------

UNIT_BIN = "/opt/prompt-outbox/bin/prompt-outbox"


def unit(name: str) -> list[tuple[str, str]]:
    """The unit's settings in order, (key, value), repeated keys kept (Environment=)."""
    settings = []
    for line in (DEPLOY / "systemd" / name).read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith(("#", "[")):
            settings.append((key.strip(), value.strip()))
    return settings


def unit_env(name: str, env_file: str, specifiers: dict[str, str]) -> dict[str, str]:
    """What the unit's process gets: Environment= lines, then the EnvironmentFile (which
    overrides them, as systemd does), the specifiers filled in."""
    env: dict[str, str] = {}
    for key, value in unit(name):
        if key == "Environment":
            var, _, val = value.partition("=")
            for spec, path in specifiers.items():
                val = val.replace(spec, path)
            env[var] = val
    for line in (DEPLOY / "systemd" / env_file).read_text().splitlines():
        if line and not line.startswith("#"):
            var, _, val = line.partition("=")
            env[var] = val
    return env


UNITS = ["prompt-outbox.service", "prompt-outbox-worker@.service"]


@pytest.mark.parametrize("name", UNITS)
def test_systemd_unit_verifies_and_is_hardened(name: str, tmp_path: Path) -> None:
    analyze = tool("systemd-analyze")
    # verify wants the ExecStart binary to exist: ours, where the unit expects /opt/...
    text = (
        (DEPLOY / "systemd" / name)
        .read_text()
        .replace(UNIT_BIN, str(Path(VENV_BIN, "prompt-outbox")))
    )
    (tmp_path / name).write_text(text)
    checked = subprocess.run(
        [analyze, "verify", str(tmp_path / name)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0 and not checked.stderr.strip(), checked.stderr  # no warnings
    settings = dict(unit(name))
    for key, value in {
        "DynamicUser": "yes",
        "ProtectSystem": "strict",
        "NoNewPrivileges": "yes",
        "Restart": "on-failure",
        "KillSignal": "SIGTERM",
    }.items():
        assert settings.get(key) == value, key
    assert settings["EnvironmentFile"].startswith("/etc/prompt-outbox/")
    assert settings["ExecStart"].startswith(UNIT_BIN + " ")


def test_systemd_serve_exec_start_runs(agent: Agent, tokens: Path, tmp_path: Path) -> None:
    """serve's ExecStart with the unit's environment and serve.env.example: the token file
    from the credentials directory (%d), the embedded Valkey in the state directory (%S)."""
    settings = dict(unit("prompt-outbox.service"))
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    name, _, source = settings["LoadCredential"].partition(":")
    assert source == "/etc/prompt-outbox/tokens.json"
    shutil.copy(tokens, credentials / name)
    (credentials / name).chmod(0o400)
    port = free_port()
    env = unit_env(
        "prompt-outbox.service", "serve.env.example", {"%d": str(credentials), "%S": str(tmp_path)}
    )
    assert env["PROMPT_OUTBOX_DATA_DIR"] == str(tmp_path / settings["StateDirectory"])
    env = localise(env, {"https://agent.example/hook": agent.url}, port)
    env["PROMPT_OUTBOX_WEBHOOK_SECRET"] = SECRET.decode()  # the receiver's
    argv = shlex.split(settings["ExecStart"].replace(UNIT_BIN, "prompt-outbox"))
    log = tmp_path / "serve.log"
    with running(argv, env, log) as serve:
        wait_healthy(port)
        delivered(agent, accept(port, "systemd"))
        stop(serve, log)


def test_systemd_worker_exec_start_runs_and_needs_a_valkey_url(
    compose_cluster: ComposeCluster, agent: Agent, tmp_path: Path
) -> None:
    settings = dict(unit("prompt-outbox-worker@.service"))
    pre = shlex.split(settings["ExecStartPre"])
    env = unit_env("prompt-outbox-worker@.service", "worker.env.example", {})
    first = compose_cluster.ports["valkey-1"]
    env = localise(env, {"https://agent.example/hook": agent.url})
    env["PROMPT_OUTBOX_VALKEY_URL"] = f"valkey+cluster://:{PASSWORD}@127.0.0.1:{first}"
    env["PROMPT_OUTBOX_WEBHOOK_SECRET"] = SECRET.decode()
    bare = {k: v for k, v in env.items() if k != "PROMPT_OUTBOX_VALKEY_URL"}
    refused = subprocess.run(pre, env=bare, capture_output=True, text=True, timeout=10)
    assert refused.returncode != 0 and "PROMPT_OUTBOX_VALKEY_URL" in refused.stderr
    assert subprocess.run(pre, env=env, timeout=10).returncode == 0
    argv = shlex.split(settings["ExecStart"].replace(UNIT_BIN, "prompt-outbox"))
    log = tmp_path / "worker.log"
    with running(argv, env, log) as worker:
        delivered(agent, accept_directly(env["PROMPT_OUTBOX_VALKEY_URL"], "systemd-worker"))
        stop(worker, log)
