"""The shell commands of README.md and docs/*.md are true as printed on a fresh clone (issue 35).

Every fenced block tagged ``sh``, ``bash``, ``shell`` or ``console`` is a command block, and the HTML comment on the
line before its fence says what this test does with it:

- ``<!-- docs-test: run demo -->`` / ``<!-- docs-test: run fixture -->``: each command is run (bash, pipefail) in a
  directory that mirrors the repository's top level, against a server this test starts on ``models/demo`` (with
  ``models/demo/recserve.toml``, as ``scripts/run-demo.sh`` serves it) or on the test repository
  (``RECSERVE_TEST_FIXTURE``); ``localhost:8000`` / ``127.0.0.1:8000`` in the block become that server's address,
  ``curl`` fails on an HTTP error status, ``recserve`` and ``recload`` are the binaries under test, and a
  ``# {...}`` line after a command is the output it must print (JSON, numbers to 1e-6 relative).
- ``<!-- docs-test: run -->``: the same, with no server.
- no comment (or ``<!-- docs-test: check -->``, ``<!-- docs-test: check fixture -->``): checked without running.
  Each command's program must be one this test knows: ``recserve``/``recload`` (every ``--flag`` is in that
  subcommand's ``--help``), ``python -m recserve_models CMD`` (likewise), ``python3 scripts/X.py`` (likewise),
  ``scripts/X.sh`` (exists; every ``--flag`` appears in the script), ``cargo`` (flags in ``cargo SUB --help``;
  ``-p``, ``--bench``, ``--example``, ``--features`` name what the workspace has), ``curl``, ``python -c`` (the code
  compiles) or ``grep``, behind ``nice``/``taskset`` if any. Every path whose first component is a top-level entry of
  the repository must exist (``target/`` is build output and exempt); a path outside the repository (``../x``,
  ``/x``) fails unless it is a placeholder (``/path/to/...``, ``<...>``, ``$VAR``, an upper-case component such as
  ``DIR``); a ``--repository`` of ``recserve`` must be a model repository; a model or pipeline named for the default
  server (``localhost:8000``, recload's default URL) must be served by the demo (by the test repository with
  ``fixture``), and a ``--model`` beside an existing ``--repository`` must be one of its models.
- ``<!-- docs-test: skip (REASON) -->``: not checked; the reason is required (a GPU, Docker, a cluster, minutes of
  benchmark, data the repository does not ship).

A block whose program is unknown to the static check fails, so every block is run, checked or exempted with a
reason. Also checked: the README's settings table lists every flag of ``recserve serve --help`` with its
environment variable, and each document has one title and no paragraph twice.

Binaries: ``RECSERVE_BIN`` and ``RECLOAD_BIN`` (default ``target/debug/recserve`` and ``target/debug/recload``, which
``cargo test`` in scripts/test.sh builds). Run: ``source scripts/env.sh && python -m pytest -q
scripts/test_docs_commands.py``.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_LANGS = {"sh", "bash", "shell", "console"}
DEFAULT_SERVERS = ("localhost:8000", "127.0.0.1:8000")
MARKER = re.compile(r"<!--\s*docs-test:\s*(.*?)\s*-->")
# Options whose value is a file the command writes: it need not exist.
OUTPUT_OPTIONS = {"--out", "--json", "--svg", "--save", "--report", "--work", "-o"}


def _bin(env: str, name: str) -> Path:
    path = Path(os.environ.get(env, ROOT / "target" / "debug" / name))
    if not path.is_file():
        pytest.fail(f"{path} does not exist: build it (cargo build, or cargo test --workspace) or set {env}")
    return path


def _fixture() -> Path:
    path = Path(os.environ.get("RECSERVE_TEST_FIXTURE", ROOT / "target" / "test-fixture"))
    if not (path / "repo").is_dir():
        pytest.fail(f"no test repository at {path}/repo: python -m recserve_models fixture --out {path}")
    return path


@dataclass
class Block:
    doc: str  # path relative to the repository
    line: int  # line of the opening fence
    marker: str | None  # the docs-test comment's text, if any
    text: str

    @property
    def name(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The command blocks of a Markdown file, with the docs-test comment that precedes each."""
    out, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(\S*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2)
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if lang in SHELL_LANGS:
            before = lines[i - 1].strip() if i > 0 else ""
            marker = MARKER.fullmatch(before)
            body = "\n".join(line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : end])
            out.append(Block(str(path.relative_to(ROOT)), i + 1, marker.group(1) if marker else None, body))
        i = end + 1
    return out


ALL_BLOCKS = [b for doc in DOCS for b in blocks(doc)]


def commands(text: str) -> list[tuple[str, str | None]]:
    """The block's commands (continuation lines joined, comment lines dropped; bash and the tokenizer ignore a trailing
    comment), each with the JSON output shown after it in a ``# {...}`` line, if any."""
    out: list[tuple[str, str | None]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.rstrip()
        stripped = line.strip()
        if not pending and stripped.startswith("#"):
            shown = stripped[1:].strip()
            if out and out[-1][1] is None and shown[:1] in "{[" and shown:
                out[-1] = (out[-1][0], shown)
            continue
        if not stripped:
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append(((pending + line).strip(), None))
        pending = ""
    assert not pending, f"a continued line ends the block: {pending!r}"
    return [(c, shown) for c, shown in out if c]


# --- Static checks ---------------------------------------------------------------------------------------------


@functools.cache
def help_flags(argv: tuple[str, ...]) -> frozenset[str]:
    """The options a program's --help lists (at the start of a line, as clap and argparse print them)."""
    done = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, f"{' '.join(argv)} --help failed: {done.stderr[-2000:]}"
    flags = set()
    for line in done.stdout.splitlines():
        m = re.match(r"^\s{1,10}((?:-[A-Za-z0-9](?:[ =][A-Z_<>.\[\]-]+)?,\s*)*--?[A-Za-z0-9][\w-]*.*)$", line)
        if not m:
            continue
        for flag in re.findall(r"(?<![\w-])(--?[A-Za-z0-9][\w-]*)", m.group(1).split("  ")[0]):
            flags.add(flag)
    return frozenset(flags)


@functools.cache
def cargo_metadata() -> dict:
    done = subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def models_of(repository: Path) -> set[str]:
    return {p.parent.parent.name for p in repository.glob("*/*/model.toml")}


def pipelines_of(config: Path) -> set[str]:
    return set(tomllib.loads(config.read_text()).get("pipelines", {})) if config.is_file() else set()


def is_placeholder(token: str) -> bool:
    return (
        token.startswith("/path/to/")
        or "PLACEHOLDER" in token
        or "$" in token
        or any(re.fullmatch(r"[A-Z][A-Z0-9_]*", part) for part in token.split("/"))
    )


TOP_LEVEL = {p.name for p in ROOT.iterdir() if not p.name.startswith(".")} - {"target"}


def check_path(token: str, problems: list[str]) -> None:
    value = token.split("=", 1)[1] if token.startswith("-") and "=" in token else token
    value = value.lstrip("@")
    if "://" in value or "/" not in value or value.startswith("-") or is_placeholder(value):
        return
    if value.startswith(("../", "/", "~")):
        problems.append(f"{value}: a path outside the repository (a fresh clone does not have it)")
        return
    first = value.split("/", 1)[0]
    if first in TOP_LEVEL and not (ROOT / value).exists():
        problems.append(f"{value}: no such path in the repository")


def split_pipeline(tokens: list[str]) -> list[list[str]]:
    """Simple commands of a tokenized line (split at |, &&, ||, ;, &), redirections dropped."""
    out, cur, skip = [], [], False
    for tok in tokens:
        if skip:
            skip = False
            continue
        if tok in {"|", "&&", "||", ";", "&"}:
            out.append(cur)
            cur = []
        elif tok in {">", ">>", "2>", "<"}:
            skip = True
        elif re.fullmatch(r"\d?>>?\S+", tok):
            continue
        else:
            cur.append(tok)
    out.append(cur)
    return [c for c in out if c]


def tokenize(command: str) -> list[str]:
    # `<repo with models/demo/deepfm>`-style placeholders are one token; `a|b` and `x &` are split.
    command = re.sub(r"<[A-Za-z][^<>]*>", "PLACEHOLDER", command)
    lexer = shlex.shlex(command, posix=True, punctuation_chars="|&;<>")
    lexer.whitespace_split = True
    return list(lexer)


def option_values(args: list[str]) -> list[tuple[str, str | None]]:
    """(option, value) pairs: `--x=v`, or `--x v` when the next token is not an option."""
    out = []
    for i, arg in enumerate(args):
        if arg.startswith("-") and arg != "-":
            if "=" in arg:
                name, value = arg.split("=", 1)
                out.append((name, value))
            else:
                nxt = args[i + 1] if i + 1 < len(args) else None
                out.append((arg, nxt if nxt is not None and not nxt.startswith("-") else None))
    return out


def check_flags(args: list[str], known: frozenset[str], who: str, problems: list[str]) -> None:
    for arg in args:
        if arg == "--":
            break
        if re.match(r"^--?[A-Za-z]", arg):
            flag = arg.split("=", 1)[0]
            if flag not in known:
                problems.append(f"{who}: {flag} is not an option of `{who}` (its --help)")


def check_command(argv: list[str], server_repo: Path, server_config: Path, problems: list[str]) -> None:
    while argv and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", argv[0]):  # VAR=value prefix or assignment
        check_path(argv[0].split("=", 1)[1], problems)
        argv = argv[1:]
    if not argv:
        return
    # Wrappers that run the rest.
    if argv[0] == "nice":
        argv = argv[3:] if argv[1:2] == ["-n"] else argv[1:]
    if argv[0] == "taskset":
        argv = argv[3:] if argv[1:2] == ["-c"] else argv[2:]
    prog, args = argv[0], argv[1:]
    for i, arg in enumerate(args):
        if not (i > 0 and args[i - 1] in OUTPUT_OPTIONS):  # a file the command writes need not exist
            check_path(arg, problems)
    base = Path(prog).name

    if base in {"recserve", "recload"} and prog in {base, f"target/release/{base}", f"target/debug/{base}"}:
        binary = str(_bin("RECSERVE_BIN", "recserve") if base == "recserve" else _bin("RECLOAD_BIN", "recload"))
        sub = args[0] if args and not args[0].startswith("-") else None
        who = f"{base} {sub}" if sub else base
        check_flags(args[1:] if sub else args, help_flags((binary, sub) if sub else (binary,)), who, problems)
        opts = dict(option_values(args))
        repo = opts.get("--repository")
        if base == "recserve" and repo and not is_placeholder(repo) and not repo.startswith("target/"):
            if not models_of(ROOT / repo):
                problems.append(f"{who}: --repository {repo} is not a model repository (no */*/model.toml)")
        model = opts.get("--model")
        if base == "recload" and model and not is_placeholder(model):
            url = opts.get("--url", "http://127.0.0.1:8000")
            if repo and not is_placeholder(repo) and not repo.startswith("target/") and (ROOT / repo).is_dir():
                if model not in models_of(ROOT / repo):
                    problems.append(f"{who}: --model {model} is not a model of --repository {repo}")
            elif sub != "ceiling" and any(url.endswith(s) or f"{s}/" in url for s in DEFAULT_SERVERS):
                if model not in models_of(server_repo):
                    served = server_repo.relative_to(ROOT) if server_repo.is_relative_to(ROOT) else server_repo
                    problems.append(
                        f"{who}: --model {model} is not served by {served}"
                        f" (models: {', '.join(sorted(models_of(served if served.is_absolute() else ROOT / served)))})"
                    )
        pipeline = opts.get("--pipeline")
        if base == "recload" and pipeline and "--url" not in opts and pipeline not in pipelines_of(server_config):
            problems.append(f"{who}: --pipeline {pipeline} is not a pipeline of {server_config.name}")
    elif base in {"python", "python3"} and args[:2] == ["-m", "recserve_models"]:
        sub = args[2] if len(args) > 2 else None
        toolchain = (sys.executable, "-m", "recserve_models")
        check_flags(args[3:], help_flags((*toolchain, sub) if sub else toolchain), f"recserve_models {sub}", problems)
    elif base in {"python", "python3"} and args[:1] == ["-c"]:
        try:
            compile(args[1], "<python -c>", "exec")
        except SyntaxError as e:
            problems.append(f"python -c: does not compile: {e}")
    elif base in {"python", "python3"} and args and args[0].startswith("scripts/") and args[0].endswith(".py"):
        if not (ROOT / args[0]).is_file():
            problems.append(f"{args[0]}: no such script")
        else:
            check_flags(args[1:], help_flags((sys.executable, str(ROOT / args[0]))), args[0], problems)
    elif prog.startswith("scripts/") and prog.endswith(".sh"):
        script = ROOT / prog
        if not script.is_file():
            problems.append(f"{prog}: no such script")
            return
        text = script.read_text()
        for arg in args:
            flag = arg.split("=", 1)[0]
            if flag.startswith("--") and flag not in text:
                problems.append(f"{prog}: {flag} is not an option it reads")
    elif prog == "cargo":
        sub = args[0] if args else None
        check_flags(args[1:], help_flags(("cargo", sub)), f"cargo {sub}", problems)
        meta = cargo_metadata()
        packages = {p["name"]: p for p in meta["packages"]}
        targets = {(t["kind"][0], t["name"]) for p in meta["packages"] for t in p["targets"]}
        features = {f for p in meta["packages"] for f in p["features"]} | {
            f"{p['name']}/{f}" for p in meta["packages"] for f in p["features"]
        }
        for opt, value in option_values(args[1 : args.index("--") if "--" in args else len(args)]):
            if opt == "-p" and value not in packages:
                problems.append(f"cargo: -p {value}: no such package in the workspace")
            if opt == "--bench" and ("bench", value) not in targets:
                problems.append(f"cargo: --bench {value}: no such benchmark")
            if opt == "--example" and ("example", value) not in targets:
                problems.append(f"cargo: --example {value}: no such example")
            if opt == "--features" and value:
                for feature in value.split(","):
                    if feature not in features:
                        problems.append(f"cargo: --features {feature}: no such feature")
    elif prog == "curl":
        for arg in args:
            m = re.match(r"^(?:https?://)?(localhost|127\.0\.0\.1):8000(/\S*)?$", arg)
            if not m:
                continue
            path = m.group(2) or "/"
            model = re.match(r"^/v[12]/models/([^/]+)/", path)
            if model and model.group(1) not in models_of(server_repo):
                problems.append(f"curl {arg}: model {model.group(1)} is not served by {server_repo.name}")
            pipeline = re.match(r"^/v1/recommend/([^/]+)$", path)
            if pipeline and pipeline.group(1) not in pipelines_of(server_config):
                problems.append(f"curl {arg}: no pipeline {pipeline.group(1)}")
    elif prog in {"grep", "sort", "head", "tail", "jq"}:
        pass
    else:
        problems.append(f"{prog}: a program this test cannot check: run the block, or exempt it with a reason")


def servers(marker: str | None) -> tuple[Path, Path]:
    """The repository and config a block's commands address at localhost:8000."""
    if marker and marker.split()[-1] == "fixture":
        fixture = _fixture()
        return fixture / "repo", fixture / "recserve.toml"
    return ROOT / "models" / "demo", ROOT / "models" / "demo" / "recserve.toml"


def static_problems(block: Block) -> list[str]:
    repo, config = servers(block.marker)
    problems: list[str] = []
    for command, _ in commands(block.text):
        try:
            tokens = tokenize(command)
        except ValueError as e:
            problems.append(f"{command}: does not parse as a shell command: {e}")
            continue
        for argv in split_pipeline(tokens):
            check_command(argv, repo, config, problems)
    return problems


# --- Running ---------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, repository: Path, config: Path) -> None:
        self.http = f"127.0.0.1:{_free_port()}"
        grpc = f"127.0.0.1:{_free_port()}"
        self.log = tempfile.TemporaryFile()
        argv = [str(_bin("RECSERVE_BIN", "recserve")), "serve", "--repository", str(repository)]
        argv += ["--config", str(config)] if config.is_file() else []
        argv += ["--http-addr", self.http, "--grpc-addr", grpc]
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)
        deadline = time.monotonic() + 90
        while True:
            if self.proc.poll() is not None:
                self.log.seek(0)
                pytest.fail(f"recserve exited with {self.proc.returncode}:\n{self.log.read().decode()[-4000:]}")
            try:
                with urllib.request.urlopen(f"http://{self.http}/health/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"recserve on {repository} not ready within 90 s")
            time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def started():
    """Servers by name, started on first use, stopped at the end."""
    running: dict[str, Server] = {}

    def get(name: str) -> Server:
        if name not in running:
            repo, config = servers(name)
            running[name] = Server(repo, config)
        return running[name]

    yield get
    for server in running.values():
        server.stop()


def same(got, want) -> bool:
    if isinstance(want, float) or isinstance(got, float):
        return (
            isinstance(got, (int, float))
            and isinstance(want, (int, float))
            and math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9)
        )
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(same(a, b) for a, b in zip(got, want))
    if isinstance(want, dict):
        return isinstance(got, dict) and got.keys() == want.keys() and all(same(got[k], want[k]) for k in want)
    return got == want


def run_block(block: Block, server: Server | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work, bindir = Path(tmp) / "work", Path(tmp) / "bin"
        work.mkdir()
        bindir.mkdir()
        # The repository's top level, so relative paths resolve and what the commands write stays out of it.
        for entry in ROOT.iterdir():
            (work / entry.name).symlink_to(entry)
        (bindir / "recserve").symlink_to(_bin("RECSERVE_BIN", "recserve"))
        (bindir / "recload").symlink_to(_bin("RECLOAD_BIN", "recload"))
        env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
        prelude = 'set -o pipefail\ncurl() { command curl --fail-with-body "$@"; }\n'
        for command, shown in commands(block.text):
            if server is not None:
                for default in DEFAULT_SERVERS:
                    command = command.replace(default, server.http)
            done = subprocess.run(
                ["bash", "-c", prelude + command], capture_output=True, text=True, cwd=work, env=env, timeout=120
            )
            assert done.returncode == 0, (
                f"{block.name}: `{command}` exited with {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
            )
            if shown is not None:
                got = json.loads(done.stdout)
                assert same(got, json.loads(shown)), f"{block.name}: `{command}` printed\n{done.stdout}\nnot\n{shown}"


# --- Tests -----------------------------------------------------------------------------------------------------


def test_there_are_command_blocks():
    assert len(ALL_BLOCKS) >= 20, [b.name for b in ALL_BLOCKS]


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=lambda b: b.name)
def test_command_block(block: Block, started):
    marker = block.marker or "check"
    if marker.startswith("skip"):
        assert re.fullmatch(r"skip \(.{8,}\)", marker), (
            f"{block.name}: `docs-test: {marker}`: an exemption says why, `skip (reason)`"
        )
        return
    if marker in {"check", "check fixture"}:
        problems = static_problems(block)
        assert not problems, f"{block.name}:\n" + "\n".join(f"  {p}" for p in problems)
        return
    assert marker in {"run", "run demo", "run fixture"}, f"{block.name}: unknown `docs-test: {marker}`"
    # A block that runs is checked first too, so that a mistake is named before it fails obscurely.
    problems = static_problems(block)
    assert not problems, f"{block.name}:\n" + "\n".join(f"  {p}" for p in problems)
    run_block(block, started(marker.split()[1]) if marker != "run" else None)


def test_readme_settings_table_lists_every_serve_flag():
    readme = (ROOT / "README.md").read_text()
    rows = {}
    for line in readme.splitlines():
        m = re.match(r"^\| `(--[a-z0-9-]+)[^`]*`(?:, `(--[a-z0-9-]+)`)? \| `(RECSERVE_[A-Z0-9_]+)`", line)
        if m:
            rows[m.group(1)] = m.group(3)
            if m.group(2):
                rows[m.group(2)] = None  # `…_INT8`: the env is abbreviated
    done = subprocess.run(
        [str(_bin("RECSERVE_BIN", "recserve")), "serve", "--help"], capture_output=True, text=True, check=True
    )
    missing, wrong = [], []
    for m in re.finditer(r"^\s+(--[a-z0-9-]+)[^\n]*\n(?:(?!^\s+--)[\s\S])*?\[env: (\w+)=", done.stdout, re.M):
        flag, env = m.group(1), m.group(2)
        if flag not in rows:
            missing.append(flag)
        elif rows[flag] is not None and rows[flag] != env:
            wrong.append(f"{flag}: README {rows[flag]}, --help {env}")
    assert not missing, f"README.md's settings table leaves out {missing}"
    assert not wrong, wrong


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_one_introduction(doc: Path):
    """A document opens with one title and one introduction: no second title before its first section, and no
    sentence of the opening said again further on."""
    text = re.sub(r"^\s*```.*?^\s*```", "", doc.read_text(), flags=re.S | re.M)
    opening = re.split(r"^## ", text, maxsplit=1, flags=re.M)[0]
    titles = [line for line in opening.splitlines() if line.startswith("# ")]
    assert len(titles) == 1, f"{doc.name} opens with {len(titles)} titles: {titles}"

    def sentences(part: str) -> list[str]:
        flat = [" ".join(p.split()) for p in re.split(r"\n\s*\n", part) if not p.lstrip().startswith(("|", "#"))]
        return [s for p in flat for s in re.split(r"(?<=[.:])\s+", p) if len(s) >= 60]

    said = sentences(opening)
    again = sorted({s for s in said if said.count(s) > 1 or s in sentences(text[len(opening) :])})
    assert not again, f"{doc.name}: its opening says twice: {again}"
