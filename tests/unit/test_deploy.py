"""The recipes in deploy/ kept working without a container runtime: the variables they set are
settings, the commands they run are `pressroom` commands, their probes are routes the app
serves, and the image installs the browser, fonts and LibreOffice scripts/install-browser.sh
does."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shlex
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

# PyYAML comes with the server itself (swagger-ui-py requires it); an ImportError here fails
# the module loudly rather than skipping it.
import yaml

from server.cli.admin import build_parser
from server.render import office
from server.settings import Settings, env_name, new_webhook_secret, unread_variables
from server.web import app as web_app
from server.web import reference
from tests.unit.test_settings import is_sdk_variable

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CONTAINERFILE = DEPLOY / "Containerfile"
COMPOSE = DEPLOY / "compose.yaml"
UNIT = DEPLOY / "pressroom.service"
KUBERNETES = DEPLOY / "kubernetes"
MANIFESTS = sorted(p for p in KUBERNETES.glob("*.yaml") if p.name != "kustomization.yaml")
RECIPES = [CONTAINERFILE, COMPOSE, UNIT, *sorted(KUBERNETES.glob("*.yaml"))]
#: Where `pip install .` puts the package in the image (Debian's Python 3.11, a virtualenv).
SITE_PACKAGES = "/opt/pressroom/lib/python3.11/site-packages"
#: Compose's services built from deploy/Containerfile; the others are PostgreSQL and MinIO's.
PRESSROOM_SERVICES = ("migrate", "web", "worker")
#: Values for the variables compose.yaml requires from deploy/.env.
COMPOSE_DOT_ENV = {
    "POSTGRES_PASSWORD": "postgres-password",
    "MINIO_ROOT_PASSWORD": "minio-password",
    "PRESSROOM_SECRET": "a-secret",
    "PRESSROOM_WEBHOOK_SECRET": new_webhook_secret(),
}


def instructions(path: Path) -> Iterator[tuple[str, str]]:
    """A Containerfile's instructions, continuation lines joined, comments left out."""
    logical = ""
    for line in path.read_text().splitlines():
        if not logical and (not line.strip() or line.lstrip().startswith("#")):
            continue
        logical += line.rstrip()
        if logical.endswith("\\"):
            logical = logical[:-1] + " "
            continue
        keyword, _, rest = logical.strip().partition(" ")
        yield keyword.upper(), rest.strip()
        logical = ""


def final_stage() -> list[tuple[str, str]]:
    """The instructions of the image that ships (after the last FROM)."""
    found = list(instructions(CONTAINERFILE))
    last = max(i for i, (keyword, _) in enumerate(found) if keyword == "FROM")
    return found[last + 1 :]


def image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, rest in final_stage():
        if keyword == "ENV":
            env.update(pair.partition("=")[::2] for pair in shlex.split(rest))
    return env


def apt_packages(command: str) -> set[str]:
    """The packages of every `apt-get install` in a shell command."""
    found: set[str] = set()
    for part in re.split(r"&&|;|\|\|", command):
        words = shlex.split(part)
        if words[:2] == ["apt-get", "install"]:
            found |= {word for word in words[2:] if not word.startswith("-")}
    return found


@cache
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE.read_text())  # merge keys (<<) resolved, as Compose does
    assert isinstance(loaded, dict)
    return loaded


def interpolate(value: str) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?message}, from COMPOSE_DOT_ENV; $$ is $."""

    def one(match: re.Match[str]) -> str:
        name, operator, word = match.group(1), match.group(2), match.group(3)
        if operator == ":-":
            return COMPOSE_DOT_ENV.get(name, word)
        assert name in COMPOSE_DOT_ENV, f"compose.yaml needs {name}: add it to COMPOSE_DOT_ENV"
        return COMPOSE_DOT_ENV[name]

    value = re.sub(r"\$\{([A-Z0-9_]+)(?:(:-|:\?)([^}]*))?\}", one, value)
    return value.replace("$$", "$")


def compose_env(service: str) -> dict[str, str]:
    """What a Pressroom service's process sees: the image's ENV under the service's own."""
    own = compose()["services"][service].get("environment", {})
    return {**image_env(), **{name: interpolate(str(value)) for name, value in own.items()}}


@cache
def manifests() -> list[dict[str, Any]]:
    found = []
    for path in MANIFESTS:
        found += [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    return found


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for doc in manifests() if doc["kind"] == kind]


def pod_specs() -> list[dict[str, Any]]:
    return [doc["spec"]["template"]["spec"] for doc in of_kind("Deployment") + of_kind("Job")]


def containers() -> list[dict[str, Any]]:
    return [container for spec in pod_specs() for container in spec["containers"]]


def deployment(component: str) -> dict[str, Any]:
    [found] = [
        doc
        for doc in of_kind("Deployment")
        if doc["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    return found


def unit_lines() -> list[tuple[str, str]]:
    """The unit's Key=Value lines in order (systemd allows a key more than once)."""
    lines = []
    for line in UNIT.read_text().splitlines():
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            lines.append((key, value))
    return lines


def unit_values(key: str) -> list[str]:
    return [value for found, value in unit_lines() if found == key]


def seconds(value: str) -> float:
    """A duration as Compose (30s, 1m30s) or systemd (40s, 2min) writes it."""
    units = {"ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*(ms|min|s|m|h)?", value)
    assert parts, value
    return sum(float(number) * units[unit or "s"] for number, unit in parts)


def settings_variables() -> set[str]:
    return {env_name(name, field) for name, field in Settings.model_fields.items()} - {""}


def test_every_variable_the_recipes_name_is_a_setting() -> None:
    # Comments included, as in the docs' check: a name a reader copies must be read.
    named: dict[str, set[str]] = {}
    for path in RECIPES:
        for name in re.findall(
            r"\b(?:PRESSROOM_[A-Z0-9_]+|AWS_[A-Z0-9_]+|DATABASE_URL)\b", path.read_text()
        ):
            named.setdefault(name, set()).add(path.name)
    # AWS_* names are the SDK's (credentials, region, endpoint), which botocore reads itself.
    unknown = {
        name: where
        for name, where in named.items()
        if name not in settings_variables() and not is_sdk_variable(name)
    }
    assert not unknown
    assert {"DATABASE_URL", "PRESSROOM_STORAGE", "AWS_ENDPOINT_URL_S3"} <= set(named)


@pytest.mark.parametrize("service", PRESSROOM_SERVICES)
def test_compose_services_start_with_the_settings_they_are_given(
    service: str, tmp_path: Path
) -> None:
    env = compose_env(service)
    assert not unread_variables(env)
    settings = Settings.from_env({**env, "PRESSROOM_DATA_DIR": str(tmp_path)})
    assert str(settings.storage) == env["PRESSROOM_STORAGE"]
    assert settings.secret == COMPOSE_DOT_ENV["PRESSROOM_SECRET"]
    assert settings.webhook_secret == COMPOSE_DOT_ENV["PRESSROOM_WEBHOOK_SECRET"]
    assert settings.database_url is not None and "@postgres:5432/" in settings.database_url


def test_compose_gives_web_and_worker_the_same_settings() -> None:
    assert compose_env("web") == compose_env("worker") == compose_env("migrate")


@pytest.mark.parametrize("component", ["web", "worker"])
def test_kubernetes_pods_start_with_the_settings_they_are_given(
    component: str, tmp_path: Path
) -> None:
    [config] = of_kind("ConfigMap")
    [container] = deployment(component)["spec"]["template"]["spec"]["containers"]
    env = {
        **image_env(),
        **config["data"],
        **{item["name"]: item["value"] for item in container.get("env", [])},
    }
    assert not unread_variables(env)
    Settings.from_env({**env, "PRESSROOM_DATA_DIR": str(tmp_path)})  # raises on a bad value


def test_the_image_starts_with_its_own_settings(tmp_path: Path) -> None:
    env = image_env()
    assert not unread_variables(env)
    settings = Settings.from_env({**env, "PRESSROOM_DATA_DIR": str(tmp_path)})
    assert settings.listens_everywhere and settings.chromium == "/usr/bin/chromium-headless-shell"


def parses(words: list[str]) -> str | None:
    """Why `pressroom WORDS` is not a command line the CLI takes, or None when it is."""
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            build_parser().parse_args(words)
    except SystemExit:
        return errors.getvalue().strip().splitlines()[-1]
    return None


def pressroom_commands() -> Iterator[tuple[str, list[str]]]:
    """Every `pressroom …` command line in the recipes: where it is, and its words."""
    for keyword, rest in final_stage():
        if keyword in ("CMD", "ENTRYPOINT") and rest.startswith("["):
            words = json.loads(rest)
            if "pressroom" in words:
                yield f"Containerfile {keyword}", words[words.index("pressroom") + 1 :]
    for name, service in compose()["services"].items():
        command = service.get("command")
        if isinstance(command, list) and command[:1] == ["pressroom"]:
            yield f"compose.yaml {name}", command[1:]
    for container in containers():
        args = container.get("args", [])
        assert args[:1] == ["pressroom"], container["name"]
        yield f"kubernetes {container['name']}", args[1:]
    for key in ("ExecStartPre", "ExecStart"):
        for value in unit_values(key):
            program, *words = shlex.split(value)
            assert program == "/opt/pressroom/bin/pressroom", value
            yield f"pressroom.service {key}", words
    # Commands in comments, which a reader copies: `pressroom` then a subcommand, up to the end
    # of the line or a quote, backtick, `;` or `)`.
    for path in RECIPES:
        for line in path.read_text().splitlines():
            if line.lstrip().startswith("#"):
                for match in re.finditer(
                    r"(?:^|(?<=[\s/`'\"\[]))pressroom ([a-z][^`'\";)\\]*)", line
                ):
                    yield f"{path.name} comment", shlex.split(match.group(1))


def subcommands() -> set[str]:
    [action] = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return set(action.choices)


def test_the_commands_the_recipes_run_are_pressroom_commands() -> None:
    found = list(pressroom_commands())
    assert {words[0] for _, words in found} >= {"serve", "web", "worker", "migrate", "keys"}
    refused = {
        f"{where}: pressroom {shlex.join(words)}": why
        for where, words in found
        if (why := parses(words)) is not None and words[0] != "doctor"
    }
    assert not refused
    if "doctor" not in subcommands():
        # Issue 35 adds `pressroom doctor` (server/cli/doctor.py), which the unit runs before
        # every start; until the CLI has it, that ExecStartPre fails and so would the unit.
        pytest.xfail("pressroom.service runs `pressroom doctor`, which the CLI does not have yet")
    assert not [words for _, words in found if words[0] == "doctor" and parses(words)]


def test_web_and_worker_run_what_the_procfile_names() -> None:
    procfile = dict(
        line.split(": ", 1) for line in (ROOT / "Procfile").read_text().splitlines() if line
    )
    for role in ("web", "worker"):
        expected = shlex.split(procfile[role])
        assert compose()["services"][role]["command"] == expected
        [container] = deployment(role)["spec"]["template"]["spec"]["containers"]
        assert container["args"] == expected


def test_the_yaml_parses_into_what_compose_and_kubernetes_expect() -> None:
    services = compose()["services"]
    assert {"postgres", "minio", "bucket", *PRESSROOM_SERVICES} <= set(services)
    for name in PRESSROOM_SERVICES:
        assert services[name]["build"]["dockerfile"] == "deploy/Containerfile"
        assert (DEPLOY / services[name]["build"]["context"] / "pyproject.toml").exists()
    for name in ("web", "worker"):
        after = services[name]["depends_on"]
        assert after["postgres"] == {"condition": "service_healthy"}
        assert (
            after["migrate"] == after["bucket"] == {"condition": "service_completed_successfully"}
        )
    for doc in manifests():
        assert {"apiVersion", "kind", "metadata"} <= set(doc) and doc["metadata"]["name"]
    assert {doc["kind"] for doc in manifests()} == {
        "ConfigMap",
        "Secret",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "Job",
    }
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (KUBERNETES / resource).exists()


def test_every_deployment_has_a_disruption_budget_and_bounded_resources() -> None:
    budgets = [doc["spec"]["selector"]["matchLabels"] for doc in of_kind("PodDisruptionBudget")]
    for doc in of_kind("Deployment"):
        assert doc["spec"]["selector"]["matchLabels"] in budgets, doc["metadata"]["name"]
    for container in containers():
        resources = container["resources"]
        assert resources["requests"]["memory"] and resources["limits"]["memory"]


def test_the_manifests_match_the_kubernetes_schema() -> None:
    import kubernetes_validate as validate  # the API's schemas, a test extra

    for doc in manifests():
        validate.validate(doc, validate.latest_version(), strict=True)


def test_compose_yaml_matches_the_compose_specification() -> None:
    import compose_spec  # the Compose Specification's Python bindings, a test extra

    compose_spec.PyCompose.from_json(json.dumps(compose())).validate()


def probe_paths() -> set[str]:
    found = set()
    for container in containers():
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            if probe in container:
                found.add(container[probe]["httpGet"]["path"])
    for doc in of_kind("Deployment"):
        annotations = doc["spec"]["template"]["metadata"].get("annotations", {})
        if "prometheus.io/path" in annotations:
            found.add(annotations["prometheus.io/path"])
    [healthcheck] = [rest for keyword, rest in final_stage() if keyword == "HEALTHCHECK"]
    found |= set(re.findall(r"http://127\.0\.0\.1:%s(/\w+)", healthcheck))
    return found


@pytest.mark.parametrize("run_web", [True, False], ids=["web", "worker"])
def test_probe_paths_are_routes_web_and_worker_serve(run_web: bool, tmp_path: Path) -> None:
    settings = Settings.from_env({"PRESSROOM_DATA_DIR": str(tmp_path)}, run_web=run_web)
    app = web_app.create_app(settings)
    served = {
        resource.canonical
        for resource in app.router.resources()
        if any(route.method == "GET" for route in resource)
    }
    paths = probe_paths()
    assert {"/healthz", "/readyz", "/metrics"} <= paths
    assert paths <= served


def test_probes_and_the_service_reach_the_port_the_image_listens_on() -> None:
    port = int(image_env()["PRESSROOM_PORT"])
    exposed = [rest for keyword, rest in final_stage() if keyword == "EXPOSE"]
    assert exposed == [str(port)]
    assert int(image_env()["PRESSROOM_HEALTH_PORT"]) == port  # a worker's probes
    [web] = deployment("web")["spec"]["template"]["spec"]["containers"]
    assert web["ports"] == [{"name": "http", "containerPort": port}]
    [worker] = deployment("worker")["spec"]["template"]["spec"]["containers"]
    assert worker["ports"] == [{"name": "health", "containerPort": port}]
    for pod in ("web", "worker"):
        annotations = deployment(pod)["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == str(port)
    [service] = of_kind("Service")
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    published = compose()["services"]["web"]["ports"]
    assert all(entry.endswith(f":{port}") for entry in published)


def test_stopping_waits_longer_than_the_shutdown_grace() -> None:
    [config] = of_kind("ConfigMap")
    default = Settings.model_fields["shutdown_grace_s"].default
    grace_s = float(config["data"].get("PRESSROOM_SHUTDOWN_GRACE_S", default))
    assert grace_s >= default
    for spec in pod_specs():
        if spec.get("restartPolicy") == "Never":
            continue  # the migrate Job renders nothing
        pause_s = sum(
            seconds(container["lifecycle"]["preStop"]["exec"]["command"][1])
            for container in spec["containers"]
            if "lifecycle" in container
        )
        assert spec["terminationGracePeriodSeconds"] > pause_s + grace_s
    for name in ("web", "worker"):
        assert seconds(compose()["services"][name]["stop_grace_period"]) > default
    [timeout] = unit_values("TimeoutStopSec")
    assert seconds(timeout) > default
    # Only the main process gets SIGTERM; Chromium and the embedded PostgreSQL stop after it.
    assert unit_values("KillMode") == ["mixed"]


def browser_packages_of_install_script() -> tuple[set[str], set[str]]:
    """scripts/install-browser.sh's fonts and the browsers it installs beside them."""
    script = (ROOT / "scripts" / "install-browser.sh").read_text()
    [fonts] = re.findall(r'^fonts="([^"]+)"', script, re.MULTILINE)
    [browsers] = re.findall(r"apt_install (chromium[^$]*)\$fonts", script)
    return set(fonts.split()), set(browsers.split())


def test_the_image_installs_the_browser_and_fonts_install_browser_does() -> None:
    fonts, browsers = browser_packages_of_install_script()
    image = set().union(
        *(apt_packages(rest) for keyword, rest in final_stage() if keyword == "RUN")
    )
    # The headless shell is the engine Pressroom prefers; the script's full `chromium` is the
    # fallback and what the dashboard tests drive, which the image has no use for.
    assert browsers - image == {"chromium"}
    assert fonts <= image and "chromium-headless-shell" in image
    assert image_env()["PRESSROOM_CHROMIUM"] == "/usr/bin/chromium-headless-shell"
    # The unit's install line names the same packages.
    header = UNIT.read_text().replace("\\\n#", " ")
    [line] = [line for line in header.splitlines() if "apt-get install" in line]
    assert fonts | (browsers - {"chromium"}) <= apt_packages(line.lstrip("# "))


def office_packages_of_install_script() -> set[str]:
    """The LibreOffice packages scripts/install-browser.sh installs (`make install` runs it)."""
    script = (ROOT / "scripts" / "install-browser.sh").read_text()
    [line] = re.findall(r"apt_install (libreoffice-[^|]*)\|\|", script)
    return set(line.split())


def test_the_image_and_the_unit_install_the_libreoffice_packages_install_browser_does() -> None:
    packages = office_packages_of_install_script()
    # The packages an Office job's error tells a server without them to install.
    assert packages == set(office.PACKAGES.split())
    nogui = {f"libreoffice-{part}-nogui" for part in ("writer", "calc", "impress")}
    assert nogui | {"python3-uno"} <= packages
    image = set().union(
        *(apt_packages(rest) for keyword, rest in final_stage() if keyword == "RUN")
    )
    assert packages <= image, packages - image
    header = UNIT.read_text().replace("\\\n#", " ")
    [line] = [line for line in header.splitlines() if "apt-get install" in line]
    listed = apt_packages(line.lstrip("# "))
    assert packages <= listed, packages - listed


def test_the_image_ships_the_files_the_app_serves_from_beside_its_package() -> None:
    # server/web/app.py and reference.py find them two folders above themselves, which
    # `pip install .` does not fill; the Containerfile copies them there.
    copies = {
        tuple(rest.split()) for keyword, rest in instructions(CONTAINERFILE) if keyword == "COPY"
    }
    for path in (web_app.STATIC_DIR, web_app.CLIENT_JS, reference.STATIC_DIR):
        relative = path.relative_to(ROOT).as_posix()
        assert (relative, f"{SITE_PACKAGES}/{relative}") in copies, relative


def test_the_build_context_keeps_every_file_the_containerfile_copies() -> None:
    # Containerfile.dockerignore leaves everything out but what is named back in with `!`.
    ignore = (DEPLOY / "Containerfile.dockerignore").read_text().splitlines()
    kept = {line[1:] for line in ignore if line.startswith("!")}
    sources = {
        source
        for keyword, rest in instructions(CONTAINERFILE)
        if keyword == "COPY" and not rest.startswith("--from")
        for source in rest.split()[:-1]
    }
    assert sources == kept
