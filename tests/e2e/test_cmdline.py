"""The command line as a user meets it (issue 17): --version and --help for every
subcommand, GNU `--opt=value` for every option, exit statuses, a closed or gone
standard output, man pages, shell completions, configuration files."""

import json
import os
import re
import signal
import subprocess

import pytest

import e2e_util
from canal_harness import clean_env, short_tmpdir


def _run(argv, **kw):
    kw.setdefault("env", clean_env({}))
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, **kw)


def _subcommands(canal_bin, path):
    """The subcommand names `canal PATH --help` lists (clap's "Commands:" block)."""
    out = _run([canal_bin, *path, "--help"]).stdout
    if "Commands:" not in out:
        return []
    block = out.split("Commands:", 1)[1].split("\n\n", 1)[0]
    return [m.group(1) for m in re.finditer(r"^  (\S+)", block, re.M) if m.group(1) != "help"]


def _all_commands(canal_bin):
    todo, seen = [[]], []
    while todo:
        path = todo.pop()
        seen.append(path)
        todo += [path + [s] for s in _subcommands(canal_bin, path)]
    return seen


def _long_options(help_text):
    """(--name, takes_value) for every long option a help text lists."""
    out = []
    for m in re.finditer(r"^\s+(?:-\w, )?(--[a-z0-9-]+)(?: <[^>]+>)?", help_text, re.M):
        if m.group(1) not in ("--help", "--version"):
            out.append((m.group(1), "<" in m.group(0)))
    return out


def test_every_command_has_help_and_version(canal_bin):
    cmds = _all_commands(canal_bin)
    assert len(cmds) >= 15, f"too few subcommands found: {cmds}"
    for path in cmds:
        r = _run([canal_bin, *path, "--help"])
        assert r.returncode == 0, (path, r.stderr)
        assert f"Usage: canal {' '.join(path)}".rstrip() in r.stdout, (path, r.stdout[:300])
        r = _run([canal_bin, *path, "--version"])
        assert r.returncode == 0 and re.match(r"canal\S* \d+\.\d+\.\d+", r.stdout), (path, r.stdout, r.stderr)


def test_daemon_version_and_help(canald_bin):
    r = _run([canald_bin, "--version"])
    assert r.returncode == 0 and re.match(r"canald \d+\.\d+\.\d+\n", r.stdout), r
    r = _run([canald_bin, "--help"])
    assert r.returncode == 0 and "--print-config" in r.stdout and "--config <FILE>" in r.stdout, r


def test_every_option_takes_the_gnu_equals_form(canal_bin, canald_bin):
    """`--opt=value` is parsed as `--opt value` by every command: a value may be
    refused as invalid, never the option as unknown."""
    checked = 0
    for path in _all_commands(canal_bin):
        for opt, takes_value in _long_options(_run([canal_bin, *path, "--help"]).stdout):
            if not takes_value:
                continue
            r = _run([canal_bin, *path, f"{opt}=1", "--help"])
            assert "unexpected argument" not in r.stderr, (path, opt, r.stderr)
            checked += 1
    for opt, takes_value in _long_options(_run([canald_bin, "--help"]).stdout):
        if takes_value:
            r = _run([canald_bin, f"{opt}=1", "--help"])
            assert "unexpected argument" not in r.stderr, (opt, r.stderr)
            checked += 1
    assert checked >= 40, f"only {checked} options with values found"
    # and the value arrives: canald reports what --socket=PATH set
    r = _run([canald_bin, "--socket=/tmp/x/y.sock", "--slots=64", "--print-config"])
    assert r.returncode == 0, r.stderr
    assert re.search(r'^socket = "/tmp/x/y.sock" +# command line$', r.stdout, re.M), r.stdout
    assert re.search(r"^slots = 64 +# command line$", r.stdout, re.M), r.stdout


def test_exit_statuses(canal_bin, canald_bin):
    r = _run([canal_bin, "stta"])
    assert r.returncode == 2 and "similar subcommand exists: 'stat'" in r.stderr, r
    assert _run([canal_bin, "stat", "--bogus"]).returncode == 2
    assert _run([canald_bin, "--slots", "x"]).returncode == 2
    r = _run([canal_bin, "run", "--", "/nonexistent/prog"])
    assert r.returncode == 127 and "/nonexistent/prog" in r.stderr, r
    sock = os.path.join(short_tmpdir(), "none.sock")
    r = _run([canal_bin, "stat", f"--socket={sock}"])
    assert r.returncode == 1 and sock in r.stderr, r


def test_output_to_a_gone_reader_ends_quietly(canald, canald_bin):
    """`canal stat | head -1` and friends: the reader leaves first; no panic, no noise."""
    for argv in ([canald.canal_bin, "stat", "--socket", canald.socket],
                 [canald.canal_bin, "stat", "--json", "--socket", canald.socket],
                 [canald.canal_bin, "--help"],
                 [canald.canal_bin, "completions", "bash"],
                 [canald_bin, "--print-config"]):
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env({}))
        p.stdout.close()
        err = p.stderr.read().decode()
        # Quietly: status 0 (EPIPE seen), or SIGPIPE's default end as for cat(1).
        assert p.wait(30) in (0, -signal.SIGPIPE), (argv, err)
        assert err == "", (argv, err)


def test_closed_standard_output_is_an_error(canald):
    """`canal stat >&-`: the result cannot be written — said, and the status is 1."""
    for argv in ([canald.canal_bin, "stat", "--socket", canald.socket],
                 [canald.canal_bin, "--version"],
                 [canald.canal_bin, "vm", "probe"]):
        r = subprocess.run(argv, stdout=None, stderr=subprocess.PIPE, text=True, timeout=30,
                           env=clean_env({}), close_fds=True,
                           preexec_fn=lambda: os.close(1))
        assert r.returncode == 1, (argv, r.stderr)
        assert "cannot write to standard output" in r.stderr, (argv, r.stderr)


def test_man_pages_and_completions(canal_bin, tmp_path):
    r = _run([canal_bin, "man", str(tmp_path / "man")])
    assert r.returncode == 0, r.stderr
    pages = sorted(os.listdir(tmp_path / "man"))
    for want in ("canal.1", "canal-run.1", "canal-stat.1", "canal-vm.1", "canald.8"):
        assert want in pages, pages
    text = (tmp_path / "man" / "canald.8").read_text()
    assert text.startswith(".ie") or ".TH CANALD 8" in text, text[:200]
    assert "print\\-config" in text, "canald.8 lacks --print-config"
    comp = _run([canal_bin, "completions", "bash"])
    assert comp.returncode == 0, comp.stderr
    script = tmp_path / "canal.bash"
    script.write_text(comp.stdout)
    r = _run(["bash", "-c", f"source {script} && complete -p canal && complete -p canald"])
    assert r.returncode == 0 and "_canal" in r.stdout, (r.stdout, r.stderr)
    # the completion offers the subcommands
    r = _run(["bash", "-c", f"source {script}; COMP_WORDS=(canal st); COMP_CWORD=1; _canal canal st canal; "
              "echo ${COMPREPLY[@]}"])
    assert "stat" in r.stdout.split(), r


EVERY_KEY = """\
idle-exit = 7
slots = 64
sockets = 4000
data-mib = 32
ring-kib = 256
spin = 11
budget = 5
notify = "sleep"
coalesce = true
t-worst-us = 80
split-us = 20
no-batch = true
rx-quantum-kib = 128
tx-quantum-kib = 512
workers = 2
pin = [0]
loopback-only = true
no-shortcut = true
shortcut-ring-kib = 256
zones = "on"
arenas = "off"
bells = "off"
direct = "off"
dns = "127.0.0.1:5353"
verbose = true
"""


def test_a_configuration_file_sets_every_option(canal_bin, canald_bin, procs, tmp_path):
    """Every key of the file reaches the daemon: --print-config shows each from the
    file's line, and the running daemon reports the same through canal stat --json."""
    sockdir = short_tmpdir()
    sock = os.path.join(sockdir, "canald.sock")
    conf = tmp_path / "canald.toml"
    extra = 'metrics = "127.0.0.1:0"\n' + ("serve-users = true\n" if os.geteuid() == 0 else "")
    conf.write_text(f'socket = "{sock}"\n' + EVERY_KEY + extra)
    conf.chmod(0o644)
    r = _run([canald_bin, f"--config={conf}", "--print-config"])
    assert r.returncode == 0, r.stderr
    printed = {m.group(1): (m.group(2), m.group(3)) for m in
               re.finditer(r"^([a-z-]+) = (.*?) +# (.*)$", r.stdout, re.M)}
    lines = conf.read_text().splitlines()
    for n, line in enumerate(lines, 1):
        key, value = [x.strip() for x in line.split("=", 1)]
        if key == "zones":
            value = "true"
        if key in ("arenas", "bells", "direct"):
            value = "false"
        if key == "metrics":
            continue  # port 0: the printed address is the one asked for, bound later

        assert key in printed, (key, r.stdout)
        assert printed[key] == (value, f"{conf}:{n}"), (key, printed[key], r.stdout)
    # The daemon started with the file says the same of itself.
    d = procs.spawn([canald_bin, "--config", str(conf), "--idle-exit=0"], env=clean_env({}), name="canald-conf")
    try:
        e2e_util.wait_for(lambda: os.path.exists(sock), 20, what="canald with a config file to listen")
        st = json.loads(_run([canal_bin, "stat", "--json", "--socket", sock]).stdout)
        settings = {s["key"]: s for s in st["daemon"]["config"]["settings"]}
        assert settings["slots"]["value"] == 64 and settings["slots"]["origin"] == f"{conf}:3", settings["slots"]
        assert settings["idle-exit"] == {"key": "idle-exit", "value": 0, "origin": "command line"}
        assert st["daemon"]["config"]["notify"] == "sleep" and st["daemon"]["config"]["workers"] == 2, st
        assert st["daemon"]["config"]["coalesce"] == "fixed" and not st["daemon"]["config"]["batch"], st
        for key in printed:
            if key != "idle-exit":
                assert settings[key]["origin"].startswith(str(conf)), (key, settings[key])
    finally:
        d.stop()


@pytest.mark.parametrize("text,where,why", [
    ("slots = 64\nbogus = 1\n", ":2", "unknown field `bogus`"),
    ("slots = 64\nnotify = \"spin\"\n", ":2", "not poll, sleep or hybrid"),
    ("budget = \"x\"\n", ":1", "invalid type"),
    ("[quota\n", ":1", ""),
    ("slots = 3\n", ":1", "power of two"),
])
def test_an_invalid_file_fails_at_start_with_line_and_reason(canald_bin, tmp_path, text, where, why):
    conf = tmp_path / "bad.toml"
    conf.write_text(text)
    conf.chmod(0o644)
    sock = os.path.join(short_tmpdir(), "c.sock")
    r = _run([canald_bin, "--config", str(conf), "--socket", sock])
    assert r.returncode == 2, r
    assert f"{conf}{where}" in r.stderr and why in r.stderr, r.stderr
    assert not os.path.exists(sock), "a daemon with a bad configuration served"


def test_a_file_others_can_write_is_refused(canald_bin, tmp_path):
    conf = tmp_path / "open.toml"
    conf.write_text("slots = 64\n")
    conf.chmod(0o666)
    r = _run([canald_bin, "--config", str(conf), "--print-config"])
    assert r.returncode == 2 and "writable by other users" in r.stderr, r


def test_user_file_over_system_defaults(canald_bin, tmp_path):
    """Without --config, the user's ~/.config/canal/canald.toml is read."""
    home = tmp_path / "home"
    (home / ".config" / "canal").mkdir(parents=True)
    f = home / ".config" / "canal" / "canald.toml"
    f.write_text("budget = 3\n")
    f.chmod(0o644)
    r = _run([canald_bin, "--print-config"], env=clean_env({"HOME": str(home), "XDG_CONFIG_HOME": ""}))
    assert r.returncode == 0, r.stderr
    assert re.search(rf"^budget = 3 +# {re.escape(str(f))}:1$", r.stdout, re.M), r.stdout
