"""The agent's configuration file: what is accepted, and what each mistake says."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from sn_agent.config import ConfigError, check, from_dict, load, warnings

GOOD = """\
url = "wss://console.example.com/ws/agent/v1/"
token_file = "token"
state_dir = "state"
policy_file = "policy.txt"

[attributes]
hostname = "web-00042"
software = "IIS"
cgi = true

[providers.load]
file = "/proc/loadavg"
field = 1
type = "float"
interval_s = 10

[providers.kernel]
command = ["uname", "-r"]
type = "string"
interval_s = 3600

[actions.disable-cgi]
command = ["/bin/true", "--cgi"]
timeout_s = 30
env = ["LANG"]

[actions.shutdown]
command = ["true"]
idempotent = true
"""


def write(folder: Path, text: str, *, token_mode: int = 0o600) -> Path:
    token = folder / "token"
    token.write_text("snt_secret\n")
    token.chmod(token_mode)
    (folder / "policy.txt").write_text('accept event.kind == "command"\n')
    path = folder / "agent.toml"
    path.write_text(text)
    return path


def sn_agent(command: str, config: Path) -> subprocess.CompletedProcess:
    """`sn-agent COMMAND --config CONFIG`, run as a process of its own."""
    argv = [sys.executable, "-m", "sn_agent", command, "--config", str(config)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def error_of(folder: Path, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as raised:
        load(write(folder, text))
    return raised.value


def test_a_complete_file_is_read_with_paths_taken_from_its_folder(tmp_path):
    config = load(write(tmp_path, GOOD))

    assert config.token() == "snt_secret" and config.state_dir == tmp_path / "state"
    assert config.providers["load"].field == 1 and config.providers["kernel"].command == (
        "uname",
        "-r",
    )
    assert config.actions["disable-cgi"].command == ("/bin/true", "--cgi")
    assert config.actions["shutdown"].timeout_s == 60 and config.actions["shutdown"].idempotent
    assert check(config) == []


@pytest.mark.parametrize(
    ("change", "where", "says"),
    [
        (("wss://console", "https://console"), "url", "ws://... or wss://"),
        (("timeout_s = 30", "timeout_s = -1"), "actions.disable-cgi.timeout_s", "more than 0"),
        (('["/bin/true", "--cgi"]', '"/bin/true --cgi"'), "actions.disable-cgi.command", "argv"),
        (("idempotent = true", "idempotent = 1"), "actions.shutdown.idempotent", "true or"),
        (('type = "float"', 'type = "number"'), "providers.load.type", "string, int, float"),
        (("field = 1", "field = 0"), "providers.load.field", "from 1"),
        (('file = "/proc/loadavg"', 'comand = ["x"]'), "providers.load.comand", "unknown key"),
        (("cgi = true", "cgi = [1]"), "attributes.cgi", "string, number or true/false"),
        (('env = ["LANG"]', 'env = "LANG"'), "actions.disable-cgi.env", "list of variable"),
        (('state_dir = "state"', ""), "state_dir", "is required"),
        (
            ("[actions.shutdown]", "tiemout = 3\n[actions.shutdown]"),
            "actions.disable-cgi.tiemout",
            "unknown key",
        ),
    ],
)
def test_each_mistake_names_its_key_and_what_is_expected(tmp_path, change, where, says):
    error = error_of(tmp_path, GOOD.replace(*change, 1))

    assert error.where == where and says in error.message


def test_a_provider_needs_exactly_one_source(tmp_path):
    text = GOOD.replace('file = "/proc/loadavg"', 'file = "/proc/loadavg"\ncommand = ["cat"]')

    assert "exactly one of command" in error_of(tmp_path, text).message


def test_a_toml_syntax_error_says_the_line(tmp_path):
    error = error_of(tmp_path, GOOD.replace("cgi = true", "cgi = "))

    assert error.where.endswith("agent.toml") and "line 9" in error.message


def test_a_token_others_can_read_is_refused_with_the_fix(tmp_path):
    config = load(write(tmp_path, GOOD, token_mode=0o644))

    [problem] = check(config)
    assert problem.startswith("token_file:") and "chmod 600" in problem


def test_check_config_exits_2_naming_a_missing_program(tmp_path):
    done = sn_agent(
        "check-config", write(tmp_path, GOOD.replace('["true"]', '["no-such-program-here"]'))
    )

    assert done.returncode == 2
    assert "actions.shutdown.command: 'no-such-program-here' is not an executable" in done.stderr


KEY = "ed25519:8P1ZfXcZ3Oq3cbm7n0vY6YbqgIhVb2m5wq8Lx6vY9zE="
TRUST = f'[trust]\nauthorities = {{ inventory = ["{KEY}"] }}\n'


def test_check_config_says_what_it_found_in_a_good_file(tmp_path):
    done = sn_agent("check-config", write(tmp_path, GOOD + TRUST))

    assert done.returncode == 0, done.stderr
    assert "ok (3 static attributes, 2 providers, 2 actions; acts only on signed events)" in (
        done.stdout
    )


def test_check_config_warns_that_an_agent_without_trust_will_refuse_every_action(tmp_path):
    done = sn_agent("check-config", write(tmp_path, GOOD))

    assert done.returncode == 0 and "runs no action: no [trust])" in done.stdout
    assert "warning: no [trust]: every action (disable-cgi, shutdown) will be refused" in (
        done.stderr
    )


def test_check_config_flags_an_agent_that_acts_on_unsigned_events(tmp_path):
    done = sn_agent("check-config", write(tmp_path, "insecure_accept_unsigned = true\n" + GOOD))

    assert done.returncode == 0 and "INSECURE: acts on unsigned events" in done.stdout
    assert "warning: insecure_accept_unsigned = true: this agent runs whatever" in done.stderr


def test_acting_on_unsigned_events_and_verifying_them_contradict_each_other(tmp_path):
    error = error_of(tmp_path, "insecure_accept_unsigned = true\n" + GOOD + TRUST)

    assert error.where == "insecure_accept_unsigned" and "contradicts [trust]" in error.message


def test_an_action_without_user_runs_as_nobody_when_the_agent_is_root(tmp_path):
    write(tmp_path, "")
    as_root = from_dict(tomllib.loads(GOOD), source=tmp_path / "agent.toml", euid=0)
    as_user = from_dict(tomllib.loads(GOOD), source=tmp_path / "agent.toml", euid=1000)
    chosen = from_dict(
        tomllib.loads('action_user = "www-data"\n' + GOOD), source=tmp_path / "a.toml", euid=0
    )

    assert {a.user for a in as_root.actions.values()} == {"nobody"}
    assert {a.user for a in as_user.actions.values()} == {None}  # itself: not root
    assert {a.user for a in chosen.actions.values()} == {"www-data"}


def test_check_config_names_every_action_that_runs_as_root(tmp_path):
    text = GOOD.replace("idempotent = true", 'idempotent = true\nuser = "root"') + TRUST
    done = sn_agent("check-config", write(tmp_path, text))

    assert done.returncode == 0
    assert done.stderr.count("runs as root") == 1
    assert "warning: actions.shutdown: runs as root" in done.stderr


def test_check_config_names_an_action_user_that_does_not_exist(tmp_path):
    config = load(write(tmp_path, GOOD.replace("idempotent = true", 'user = "no-such-user-x"')))

    assert check(config) == ["actions.shutdown.user: no such user here"]


def test_run_says_when_the_state_folder_cannot_be_made(tmp_path):
    path = write(tmp_path, GOOD.replace('state_dir = "state"', 'state_dir = "/dev/null/state"'))
    done = sn_agent("run", path)

    assert done.returncode == 2
    assert "state_dir: cannot create /dev/null/state: Not a directory" in done.stderr


def test_the_example_configuration_is_valid_and_gives_root_to_one_action_alone():
    example = load(Path(__file__).resolve().parents[2] / "agent" / "agent.example.toml")

    assert example.acts_on == "signed"
    assert [w for w in warnings(example) if "runs as root" in w] == [
        "actions.shutdown: runs as root"
    ]
