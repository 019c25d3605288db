"""failoverctl's named contexts (controlplane/cli/contexts.py) and its errors as JSON
under --json: precedence flag > env > context > default, the token file, bad files
(exit 2, the file named, nothing called), ``config view``/``use-context``, and a JSON
error object on stderr for an unreachable control plane. No network: what the
invocation would connect with is read off the Ctx that ``main`` builds."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from controlplane.cli import common, failoverctl
from controlplane.cli.client import DEFAULT_SERVER, EXIT_BAD_INPUT, EXIT_UNREACHABLE
from controlplane.cli.common import Ctx
from controlplane.cli.contexts import rewrite_current

TOKEN = "s3cret-token-value"
CONFIG = """\
# the on-call contexts
current-context: prod-eu  # where the pager points
contexts:
  prod-eu:
    server: cp-0.eu:50051,cp-1.eu:50051
    ca: certs/eu-ca.pem
    token-file: eu-token
    actor: alice
    timeout: 12.5
  staging:
    server: cp.staging:50051
    actor: bob
"""
ENV = (
    "TECTONIC_SERVER",
    "TECTONIC_ACTOR",
    "TECTONIC_CA",
    "TECTONIC_CERT",
    "TECTONIC_KEY",
    "TECTONIC_TOKEN",
    "TECTONIC_CONTEXT",
    "TECTONIC_CONFIG",
    "XDG_CONFIG_HOME",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no real ~/.config read
    monkeypatch.setenv("COLUMNS", "400")  # rich wraps messages at the terminal width
    # ...and a console made while another test had set COLUMNS keeps that width
    for console in (common.out, common.err):
        monkeypatch.setattr(console, "_width", 400)
    yield


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "failoverctl.yaml"
    path.write_text(CONFIG)
    (tmp_path / "eu-token").write_text(f"  {TOKEN}\n")
    monkeypatch.setenv("TECTONIC_CONFIG", str(path))
    return path


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[Ctx]:
    """The Ctx each invocation's ``main`` builds; the command itself never runs."""
    got: list[Ctx] = []

    def record(c: Ctx) -> Ctx:
        got.append(c)
        raise typer.Exit(0)

    monkeypatch.setattr(failoverctl, "_start", record)
    return got


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    r = CliRunner().invoke(failoverctl.app, list(args), env=env)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r.exit_code, r.stdout, r.stderr


def ctx_of(seen: list[Ctx], *args: str, env: dict[str, str] | None = None) -> Ctx:
    code, _, stderr = invoke(*args, "status", env=env)
    assert code == 0, stderr
    assert len(seen) == 1
    return seen.pop()


# ---- precedence -----------------------------------------------------------------------


def test_the_current_context_gives_what_no_flag_or_env_does(config: Path, seen: list[Ctx]) -> None:
    c = ctx_of(seen)
    assert c.client.servers == ["cp-0.eu:50051", "cp-1.eu:50051"]
    assert c.actor == "alice"
    assert c.client.timeout_s == 12.5
    assert c.client.credentials.ca == str(config.parent / "certs" / "eu-ca.pem")  # relative
    assert c.client.credentials.token == TOKEN  # read from token-file and stripped


def test_flags_beat_env_beat_the_context_beats_the_defaults(config: Path, seen: list[Ctx]) -> None:
    env = {"TECTONIC_SERVER": "env:1", "TECTONIC_ACTOR": "env-actor"}
    c = ctx_of(seen, env=env)
    assert (c.client.servers, c.actor, c.client.timeout_s) == (["env:1"], "env-actor", 12.5)
    c = ctx_of(seen, "--server", "flag:1", "--actor", "flag-actor", "--timeout", "3", env=env)
    assert (c.client.servers, c.actor, c.client.timeout_s) == (["flag:1"], "flag-actor", 3.0)
    # staging sets no timeout, ca or token: the defaults stay
    c = ctx_of(seen, "--context", "staging")
    assert (c.client.servers, c.actor, c.client.timeout_s) == (["cp.staging:50051"], "bob", 5.0)
    assert c.client.credentials.ca is None and c.client.credentials.token is None


def test_a_token_by_flag_or_env_wins_and_the_token_file_is_not_read(
    config: Path, seen: list[Ctx]
) -> None:
    (config.parent / "eu-token").unlink()  # would be an error if it were read
    c = ctx_of(seen, env={"TECTONIC_TOKEN": "from-env"})
    assert c.client.credentials.token == "from-env"
    c = ctx_of(seen, "--token", "from-flag")
    assert c.client.credentials.token == "from-flag"


def test_the_context_is_chosen_by_flag_then_env_then_current_context(
    config: Path, seen: list[Ctx]
) -> None:
    assert ctx_of(seen).actor == "alice"
    assert ctx_of(seen, env={"TECTONIC_CONTEXT": "staging"}).actor == "bob"
    c = ctx_of(seen, "--context", "prod-eu", env={"TECTONIC_CONTEXT": "staging"})
    assert c.actor == "alice"


def test_no_file_no_context_is_todays_behaviour(seen: list[Ctx], tmp_path: Path) -> None:
    c = ctx_of(seen, env={"XDG_CONFIG_HOME": str(tmp_path / "nothing-here")})
    assert c.client.servers == [DEFAULT_SERVER] and c.client.timeout_s == 5.0
    assert c.client.credentials.token is None


def test_the_default_file_is_under_xdg_config_home(tmp_path: Path, seen: list[Ctx]) -> None:
    xdg = tmp_path / "xdg"
    (xdg / "tectonic").mkdir(parents=True)
    (xdg / "tectonic" / "failoverctl.yaml").write_text(
        "current-context: a\ncontexts: {a: {server: 'xdg:1'}}\n"
    )
    assert ctx_of(seen, env={"XDG_CONFIG_HOME": str(xdg)}).client.servers == ["xdg:1"]


# ---- bad files: exit 2, the file named, nothing called ----------------------------------


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("contexts: {a: {server: 'x:1', sever: 'y'}}\n", "sever: unknown field"),
        ("contexts: {a: {server: 'x:1', token: 'abc'}}\n", "never stored in the file"),
        ("contexts: {a: {ca: 'ca.pem'}}\n", "contexts.a.server"),
        ("contexts: [unclosed\n", "not valid YAML"),
        ("current-context: nope\ncontexts: {a: {server: 'x:1'}}\n", "no context 'nope'"),
        ("- a list\n", "must be a mapping"),
        ("current-context: a\ncontexts: {a: {server: 'x:1', token-file: gone}}\n", "token-file"),
    ],
)
def test_a_bad_file_is_exit_2_naming_the_file(
    config: Path, seen: list[Ctx], text: str, says: str
) -> None:
    config.write_text(text)
    code, _, stderr = invoke("status")
    assert code == EXIT_BAD_INPUT
    assert says in stderr and str(config) in stderr
    assert seen == []  # main never got as far as a Ctx: nothing was called


def test_an_unknown_context_name_is_exit_2(config: Path, seen: list[Ctx]) -> None:
    code, _, stderr = invoke("--context", "prod-us", "status")
    assert code == EXIT_BAD_INPUT
    assert "no context 'prod-us'" in stderr and "prod-eu, staging" in stderr
    assert seen == []


def test_a_context_without_a_file_is_exit_2(seen: list[Ctx], tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "TECTONIC_CONTEXT": "prod-eu"}
    code, _, stderr = invoke("status", env=env)
    assert code == EXIT_BAD_INPUT
    assert "no config file at" in stderr and str(tmp_path / "xdg") in stderr
    missing = tmp_path / "missing.yaml"
    code, _, stderr = invoke("status", env={"TECTONIC_CONFIG": str(missing)})
    assert code == EXIT_BAD_INPUT and str(missing) in stderr
    assert seen == []


def test_an_unreadable_file_is_exit_2(config: Path, seen: list[Ctx]) -> None:
    config.unlink()
    config.mkdir()  # a folder: exists, cannot be read
    code, _, stderr = invoke("status")
    assert code == EXIT_BAD_INPUT and "cannot read config file" in stderr
    assert str(config) in stderr and seen == []


# ---- failoverctl config -----------------------------------------------------------------


def test_config_view_json_lists_the_contexts_and_never_a_token(config: Path) -> None:
    code, stdout, stderr = invoke("config", "view", "--json")
    assert code == 0, stderr
    data = json.loads(stdout)
    assert data["file"] == str(config) and data["current-context"] == "prod-eu"
    assert sorted(data["contexts"]) == ["prod-eu", "staging"]
    assert data["contexts"]["prod-eu"]["token-file"] == "eu-token"
    assert TOKEN not in stdout + stderr
    code, stdout, _ = invoke("--context", "staging", "config", "view", "--json")
    assert json.loads(stdout)["in-use"] == "staging"


def test_config_view_text_marks_the_current_context(config: Path) -> None:
    code, stdout, _ = invoke("config", "view")
    assert code == 0
    assert "current-context: prod-eu" in stdout and "cp.staging:50051" in stdout
    assert TOKEN not in stdout


def test_config_view_reports_a_bad_file_as_json_under_json(config: Path) -> None:
    config.write_text("contexts: {a: {server: 'x:1', typo: 1}}\n")
    code, _, stderr = invoke("config", "view", "--json")
    assert code == EXIT_BAD_INPUT
    error = json.loads(stderr)["error"]
    assert error["kind"] == "bad_input" and str(config) in error["message"]


def test_use_context_rewrites_only_current_context(config: Path) -> None:
    code, _, stderr = invoke("config", "use-context", "staging")
    assert code == 0, stderr
    after = config.read_text()
    assert after == CONFIG.replace("current-context: prod-eu", "current-context: staging")
    assert yaml.safe_load(after)["current-context"] == "staging"


def test_use_context_of_an_unknown_name_changes_nothing(config: Path) -> None:
    code, _, stderr = invoke("config", "use-context", "nope")
    assert code == EXIT_BAD_INPUT and "no context 'nope'" in stderr
    assert config.read_text() == CONFIG


def test_use_context_fixes_a_current_context_that_names_no_context(config: Path) -> None:
    config.write_text(CONFIG.replace("current-context: prod-eu", "current-context: gone"))
    code, _, stderr = invoke("config", "use-context", "staging")
    assert code == 0, stderr
    assert yaml.safe_load(config.read_text())["current-context"] == "staging"


def test_rewrite_current_adds_the_key_when_missing_and_quotes_odd_names() -> None:
    assert rewrite_current("contexts: {}\n", "a") == "current-context: a\ncontexts: {}\n"
    text = rewrite_current("current-context: a\n", "with space: x")
    assert yaml.safe_load(text) == {"current-context": "with space: x"}


# ---- errors as JSON under --json ----------------------------------------------------------


def test_json_error_for_an_unreachable_control_plane() -> None:
    code, stdout, stderr = invoke("--server", "127.0.0.1:1", "--timeout", "1", "status", "--json")
    assert code == EXIT_UNREACHABLE
    assert stdout == ""
    error = json.loads(stderr)["error"]
    assert error["code"] == EXIT_UNREACHABLE and error["kind"] == "unreachable"
    assert "127.0.0.1:1" in error["message"]


def test_the_context_server_is_the_one_called(config: Path) -> None:
    config.write_text("current-context: a\ncontexts: {a: {server: '127.0.0.1:1', timeout: 1}}\n")
    code, _, stderr = invoke("status", "--json")
    assert code == EXIT_UNREACHABLE
    assert "127.0.0.1:1" in json.loads(stderr)["error"]["message"]


def test_without_json_the_error_stays_text() -> None:
    code, _, stderr = invoke("--server", "127.0.0.1:1", "--timeout", "1", "status")
    assert code == EXIT_UNREACHABLE
    assert stderr.startswith("error: control plane unreachable")


def test_bad_input_after_the_ctx_is_json_too() -> None:
    code, _, stderr = invoke(
        "--server", "127.0.0.1:1", "pause", "-r", "x", "--for", "soon", "--json"
    )
    assert code == EXIT_BAD_INPUT
    assert json.loads(stderr) == {
        "error": {
            "code": EXIT_BAD_INPUT,
            "message": "--for 'soon' is not a duration: say 90s, 30m, 2h or 1d",
            "kind": "bad_input",
        }
    }
