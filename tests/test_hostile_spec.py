"""Hostile specs (issue 14): every one ends in ONE line "file[:line]: [field: ]problem (fix)" and a refusal,
or in an EnvSpec that keeps the spec's invariants; never a traceback, a hang or unbounded memory.

Three parts: crafted cases that broke the parser (tracebacks, hangs, 11 GB of memory), crafted cases that
were accepted and wrong (an empty archs list built an sm_75-only wheel; a newline in a pip version reached
requirements.in), and property-based fuzzing with hypothesis over mutations of the real envs/*.yaml,
random YAML documents and random text. In-process calls run under `bounded()`, which turns a hang into
an exception (SIGALRM) and runaway memory into MemoryError (RLIMIT_AS); a subset goes through the real
`python -m toolkit check` in a subprocess with the same limits.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from packaging.requirements import Requirement
from packaging.version import Version

from toolkit.base.errors import ToolkitError
from toolkit.spec.envspec import PLATFORMS, EnvSpec, load_spec
from toolkit.spec.rules import violations

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
REAL = {p.name: p.read_text() for p in sorted((ROOT / "envs").glob("*.yaml"))}
GOOD = REAL["cu126.yaml"]
# "file[:line]: message": a path without newlines, an optional line, then the message on the same line.
ONE_LINE = re.compile(r"[^\n:]+(:[0-9]+)?: [^\n\r]+")
SECONDS, MEMORY = 10.0, 1 << 30  # per in-process case: far above what a 64 KiB spec needs


class Hang(Exception):
    """Raised by SIGALRM inside a case that ran past its time."""


@contextmanager
def bounded(seconds: float = SECONDS, memory: int = MEMORY) -> Iterator[None]:
    """Run the body with a time limit (SIGALRM raises Hang) and at most `memory` more address space
    (RLIMIT_AS: an allocation past it raises MemoryError), so a regression fails instead of taking the
    machine down or blocking the suite."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = psutil.Process().memory_info().vms + memory
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))

    def hang(signum, frame):
        raise Hang(f"ran past {seconds} s")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def limit_child() -> None:
    """preexec_fn of CLI subprocesses: 2 GiB of address space (the alias bomb took 11 GB)."""
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


# ---------------------------------------------------------------- crafted cases


Content = str | bytes | Callable[[Path], None]  # the text of envs/cu126.yaml, or a maker of that path


@dataclass(frozen=True)
class Case:
    id: str
    kind: str  # "parser": broke the loader before (traceback, hang, memory); "accepted": passed and was wrong
    content: Content
    expect: str  # a fragment the one line must contain (the field or the problem)
    others: dict[str, Content] = field(default_factory=dict)  # more files in envs/


def spec_with(extra: str = "", **replace: str) -> str:
    """The real cu126 spec with some lines replaced (old=new as keyword pairs in order) and lines added."""
    text = GOOD
    for old, new in zip(list(replace.values())[::2], list(replace.values())[1::2]):
        assert old in text, old
        text = text.replace(old, new)
    return text + extra


def alias_bomb() -> str:
    """Billion laughs over mappings, the shape whose line numbers were collected: 9 levels of 9 aliases
    (9**9 = 387 million key paths when walked)."""
    lines = ["extends: base", "l0: &l0 {" + ", ".join(f"k{i}: x" for i in range(9)) + "}"]
    lines += [f"l{n}: &l{n} {{" + ", ".join(f"k{i}: *l{n - 1}" for i in range(9)) + "}" for n in range(1, 9)]
    return "\n".join(lines + ["build: *l8", ""])


def alias_bomb_in_a_value() -> str:
    """Billion laughs over lists inside one known field, so that a message showing the value would expand it."""
    levels = ['&a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    levels += [f"&a{n} [" + ", ".join([f"*a{n - 1}"] * 9) + "]" for n in range(1, 9)]
    return "extends: base\ndescription: [" + ", ".join(levels) + "]\n"


def fifo(path: Path) -> None:
    os.mkfifo(path)


def directory(path: Path) -> None:
    path.mkdir()


def symlink_loop(path: Path) -> None:
    path.symlink_to(path.name)


def device(path: Path) -> None:
    path.symlink_to("/dev/zero")


def sparse(path: Path) -> None:
    """An 8 GiB file that takes no disk (a hole): reading it whole would take 8 GiB of memory."""
    with path.open("wb") as handle:
        handle.truncate(8 << 30)


def extends_chain(path: Path) -> None:
    """cu126 -> l1 -> ... -> l1500 -> base: a 1500-level chain."""
    path.write_text(GOOD.replace("extends: base", "extends: l1"))
    for level in range(1, 1501):
        (path.parent / f"l{level}.yaml").write_text(f"extends: {'base' if level == 1500 else f'l{level + 1}'}\n")


def with_index(url: str) -> str:
    return spec_with(a="index: https://download.pytorch.org/whl/cu126", b=f"index: {url}")


def pip(version: str, name: str = "einops") -> str:
    return f"pip_packages:\n  {name}: {version}\n"


def conda(version: str, name: str = "ninja") -> str:
    return f"conda_packages:\n  {name}: {version}\n"


# str.format ran attribute and index access, conversions and format specs; each must be refused.
PLACEHOLDERS = {
    "attribute": conda('"{cuda.real}"'),
    "index": conda('"{cuda[x]}"'),
    "positional": conda('"{0}"'),
    "empty": pip('"=={}"'),
    "dunder": conda('"{python.__class__.__init__.__globals__}"'),
    "conversion": conda('"{cuda!r}"'),
    "format-spec": conda('"{cuda:>30}"'),
    "escaped-braces": conda('"{{cuda}}"'),
    "unbalanced": conda('"{cuda"'),
    "unknown-name": pip('">={torch}"'),
}
# Each of these reached requirements.in as written; pip-compile read the options and contacted the index.
PIP_VERSIONS = {
    "boolean": pip("true"),
    "integer": pip("1"),
    "arabic-indic": pip('">=\u0661.0"'),
    "newline-index": pip('">=0.8\\n--index-url https://evil.example/simple"'),
    "extra-index": pip('"--extra-index-url=https://evil.example/simple"'),
    "marker": pip("'>=0.8; python_version < \"4\"'"),
    "direct-url": pip('"@ https://evil.example/e.whl"'),
    "hash-option": pip('"==0.8.1 --hash=sha256:00"'),
    "bare": pip('"0.8.1"'),
    "trailing-space": pip('">=0.8 "'),
    "comment": pip('">=0.8#x"'),
    "tab": pip('">=0.8\\t"'),
    "cr": pip('">=0.8\\r--pre"'),
    "extras": pip('"[cuda]>=1"'),
}

# Accepted as torch.index before, and passed to pip as its index.
INDEX_URLS = {
    "not-a-url": "download.pytorch.org/whl/cu126",
    "no-host": "https:///whl/cu126",
    "scheme-ftp": "ftp://download.pytorch.org/whl/cu126",
    "space": "'https://download.pytorch.org/whl/cu126 --trusted-host x'",
    "newline-escape": '"https://x.org/simple\\n--index-url https://evil"',
    "option": "--index-url=https://evil.example/simple",
    "bad-port": "https://download.pytorch.org:99999/whl/cu126",
    "file-relative": "file://relative/simple",
    "javascript": "'javascript:alert(1)'",
}

PARSER = [
    Case("alias-bomb", "parser", alias_bomb(), "anchors and aliases"),
    Case("alias-bomb-in-a-value", "parser", alias_bomb_in_a_value(), "anchors and aliases"),
    Case("recursive-alias", "parser", "extends: base\ndescription: &a [*a]\n", "anchors and aliases"),
    Case("alias-to-a-version", "parser", spec_with("python2: &v '3.12'\nx: *v\n"), "anchors and aliases"),
    Case("merge-key", "parser", spec_with("build:\n  <<: {jobs: 4}\n"), "'<<'"),
    Case("complex-key-block", "parser", spec_with("? [a, b]\n: 1\n"), "must be a name"),
    Case("complex-key-flow", "parser", spec_with("conda_packages: {[1, 2]: x}\n"), "must be a name"),
    Case("mapping-key", "parser", spec_with("pip_packages:\n  ? {a: 1}\n  : '*'\n"), "must be a name"),
    Case("nesting-900-flow-lists", "parser", "extends: base\narchs: " + "[" * 900 + "]" * 900 + "\n", "nesting"),
    Case("nesting-900-flow-maps", "parser", "extends: base\nbuild: " + "{a: " * 900 + "1" + "}" * 900 + "\n",
         "nesting"),
    Case("digits-5000-gcc", "parser", spec_with(a="gcc: 13", b="gcc: " + "1" * 5000), "number"),
    Case("digits-5000-jobs", "parser", spec_with("build:\n  jobs: " + "9" * 5000 + "\n"), "number"),
    Case("quoted-digits-5000-jobs", "parser", spec_with("build:\n  jobs: '" + "9" * 5000 + "'\n"),
         "build.jobs: '99"),
    Case("quoted-digits-5000-nvcc-threads", "parser", spec_with("build:\n  nvcc_threads: '" + "9" * 5000 + "'\n"),
         "is out of range (1 to 64)"),
    Case("jobs-null-in-base", "parser", spec_with(), "base.yaml:31: build.jobs: null",
         {"base.yaml": REAL["base.yaml"].replace("jobs: auto", "jobs: null")}),
    Case("gb-per-thread-null-in-base", "parser", spec_with(), "build.gb_per_nvcc_thread: null",
         {"base.yaml": REAL["base.yaml"].replace("gb_per_nvcc_thread: 4.5", "gb_per_nvcc_thread:")}),
    Case("hex-20000-digits", "parser", spec_with(a="gcc: 13", b="gcc: 0x" + "f" * 20000), "number"),
    Case("sexagesimal-int", "parser", spec_with(a="gcc: 13", b="gcc: " + ":".join(["59"] * 3000)), "number"),
    Case("python-object-tag", "parser", spec_with("description: !!python/object/apply:os.system ['true']\n",
                                                  a="description: CUDA 12.6 line\n", b=""), "tag"),
    Case("int-tag-on-text", "parser", spec_with(a="gcc: 13", b="gcc: !!int 'thirteen'"), "tag"),
    Case("float-tag-on-text", "parser", spec_with("build:\n  gb_per_nvcc_thread: !!float 'x'\n"), "tag"),
    Case("binary-tag", "parser", spec_with(a='cuda: "12.6"', b="cuda: !!binary aGVsbG8="), "tag"),
    Case("set-tag", "parser", spec_with("archs: !!set {'80', '90'}\n"), "tag"),
    Case("local-tag", "parser", spec_with(a='cuda: "12.6"', b='cuda: !cuda "12.6"'), "tag"),
    Case("torch-version-major-only", "parser", spec_with(a='version: "2.9.1"', b='version: "2"'), "torch.version"),
    Case("flash-attn-version-major-only", "parser", spec_with('flash_attn_2:\n  version: "2"\n'),
         "flash_attn_2.version"),
    Case("torch-version-not-pep440", "parser", spec_with(a='version: "2.9.1"', b='version: "2.9.1abc1"'),
         "torch.version"),
    *[Case(f"placeholder-{k}", "parser", spec_with(v), "bad placeholder") for k, v in PLACEHOLDERS.items()],
    Case("nul-byte", "parser", spec_with("description: a\x00b\n", a="description: CUDA 12.6 line\n", b=""),
         "U+0000"),
    Case("escape-byte", "parser", spec_with("# \x1b[2J\n"), "U+001B"),
    Case("bell-in-key", "parser", spec_with("cu\x07da2: 1\n"), "U+0007"),
    Case("del-byte", "parser", spec_with("# \x7f\n"), "U+007F"),
    Case("c1-next-line", "parser", spec_with("# a\x85b\n"), "U+0085"),
    Case("line-separator", "parser", spec_with("# a\u2028b\n"), "U+2028"),
    Case("bidi-override", "parser", spec_with('description: "evil \u202e lanigiro"\n',
                                              a="description: CUDA 12.6 line\n", b=""), "U+202E"),
    Case("bom-in-the-middle", "parser", spec_with("# \ufeff\n"), "U+FEFF"),
    Case("latin-1-bytes", "parser", spec_with(a="CUDA 12.6 line", b="caf\xe9").encode("latin-1"), "not UTF-8"),
    Case("utf-16-file", "parser", spec_with().encode("utf-16"), "not UTF-8"),
    Case("random-binary", "parser", bytes(range(256)) * 4, "not UTF-8"),
    Case("symlink-loop", "parser", symlink_loop, "cu126.yaml"),
    Case("parent-symlink-loop", "parser", spec_with(), "base.yaml", {"base.yaml": symlink_loop}),
    Case("fifo", "parser", fifo, "not a regular file"),
    Case("parent-fifo", "parser", spec_with(), "not a regular file", {"base.yaml": fifo}),
    Case("directory", "parser", directory, "not a regular file"),
    Case("char-device", "parser", device, "not a regular file"),
    Case("sparse-8-gib", "parser", sparse, "larger than"),
    Case("huge-2-mib", "parser", spec_with(("# " + "x" * 78 + "\n") * 27000),
         "larger than"),
    Case("extends-chain-1500", "parser", extends_chain, "extends"),
    Case("extends-self-cycle", "parser", spec_with(a="extends: base", b="extends: cu126"), "cyclic extends"),
    Case("extends-3-cycle", "parser", spec_with(a="extends: base", b="extends: a"), "cyclic extends",
         {"a.yaml": "extends: b\n", "b.yaml": "extends: cu126\n"}),
    Case("extends-parent-path", "parser", spec_with(a="extends: base", b="extends: ../../etc/passwd"), "extends"),
    Case("extends-absolute-path", "parser", spec_with(a="extends: base", b="extends: /etc/passwd"), "extends"),
    Case("extends-subdir", "parser", spec_with(a="extends: base", b="extends: sub/base"), "extends"),
    Case("extends-dotdot-suffix", "parser", spec_with(a="extends: base", b="extends: base/.."), "extends"),
    Case("extends-very-long-name", "parser", spec_with(a="extends: base", b="extends: " + "a" * 300), "extends"),
    Case("extends-unicode-name", "parser", spec_with(a="extends: base", b="extends: base\u0661"), "extends"),
    Case("extends-a-list", "parser", spec_with(a="extends: base", b="extends: [base]"), "extends"),
    Case("two-documents", "parser", spec_with("---\nextends: base\n"), "malformed YAML"),
    Case("yaml-directive", "parser", "%YAML 2.0\n---\n" + spec_with(), "malformed YAML"),
    Case("unterminated-flow", "parser", spec_with("archs: [" + "'90', " * 10 + "\n"), "malformed YAML"),
]

ACCEPTED = [
    Case("archs-empty", "accepted", spec_with("archs: []\n"), "archs: empty"),
    Case("platforms-empty", "accepted", spec_with("platforms: []\n"), "platforms: empty"),
    Case("channels-empty", "accepted", spec_with("channels: []\n"), "channels: empty"),
    Case("modules-duplicate", "accepted", spec_with("toolchain:\n  modules: [cuda/12.6, cuda/12.6]\n"),
         "toolchain.modules[1]: duplicate"),
    Case("platforms-duplicate", "accepted", spec_with("platforms: [linux-64, linux-64]\n"), "platforms[1]: duplicate"),
    Case("archs-duplicate", "accepted", spec_with('archs: ["90", "80", "90"]\n'), "archs[2]: duplicate"),
    Case("archs-duplicate-int-and-str", "accepted", spec_with('archs: ["90", 90]\n'), "archs[1]: duplicate"),
    Case("channels-duplicate", "accepted", spec_with("channels: [conda-forge, conda-forge]\n"),
         "channels[1]: duplicate"),
    Case("pip-name-case-duplicate", "accepted", spec_with(pip('"*"', "Einops")), "duplicate"),
    Case("conda-name-null", "accepted", spec_with(conda('"*"', "null")), "conda_packages"),
    Case("conda-name-tilde", "accepted", spec_with(conda('"*"', "~")), "conda_packages"),
    Case("pip-name-null", "accepted", spec_with(pip('"*"', "null")), "pip_packages"),
    Case("pip-name-boolean", "accepted", spec_with(pip('"*"', "yes")), "pip_packages"),
    Case("conda-name-boolean", "accepted", spec_with(conda('"*"', "true")), "conda_packages"),
    Case("pip-name-integer", "accepted", spec_with(pip('"*"', "123")), "pip_packages"),
    Case("top-key-null", "accepted", spec_with("null: 1\n"), "must be a name"),
    *[Case(f"pip-version-{k}", "accepted", spec_with(v), "pip_packages.einops") for k, v in PIP_VERSIONS.items()],
    Case("cuda-arabic-indic-digits", "accepted", spec_with(a='cuda: "12.6"', b='cuda: "\u0661\u0662.\u0666"'),
         "cuda"),
    Case("python-fullwidth-digits", "accepted", spec_with(a='python: "3.12"', b='python: "\uff13.\uff11\uff12"'),
         "python"),
    Case("gcc-arabic-indic-digits", "accepted", spec_with(a="gcc: 13", b='gcc: "\u0661\u0663"'), "gcc"),
    Case("arch-arabic-indic-digits", "accepted", spec_with('archs: ["\u0669\u0660"]\n'), "archs[0]"),
    Case("torch-version-arabic-indic", "accepted", spec_with(a='version: "2.9.1"', b='version: "\u0662.\u0669.1"'),
         "torch.version"),
    Case("torch-local-tag-unicode", "accepted", spec_with(a='version: "2.9.1"', b='version: "2.9.1+cu\u0661\u0662"'),
         "torch.version"),
    Case("conda-version-arabic-indic", "accepted", spec_with(conda('">=\u0661.0"')), "conda_packages.ninja"),
    Case("jobs-10-to-the-30", "accepted", spec_with("build:\n  jobs: 1" + "0" * 30 + "\n"), "build.jobs"),
    Case("jobs-5000", "accepted", spec_with("build:\n  jobs: 5000\n"), "build.jobs"),
    Case("jobs-string-huge", "accepted", spec_with("build:\n  jobs: '99999999'\n"), "build.jobs"),
    Case("nvcc-threads-1000", "accepted", spec_with("build:\n  nvcc_threads: 1000\n"), "build.nvcc_threads"),
    Case("jobs-null-in-child", "accepted", spec_with("build:\n  jobs: null\n"), "build.jobs: null"),
    Case("nvcc-threads-null-in-child", "accepted", spec_with("build:\n  nvcc_threads: ~\n"),
         "build.nvcc_threads: null"),
    Case("threads-per-cpu-null-in-child", "accepted", spec_with("build:\n  threads_per_cpu:\n"),
         "build.threads_per_cpu: null"),
    Case("gb-per-thread-huge", "accepted", spec_with("build:\n  gb_per_nvcc_thread: 100000000\n"),
         "build.gb_per_nvcc_thread"),
    Case("threads-per-cpu-tiny", "accepted", spec_with("build:\n  threads_per_cpu: 0.000001\n"),
         "build.threads_per_cpu"),
    *[Case(f"index-{k}", "accepted", with_index(v), "torch.index") for k, v in INDEX_URLS.items()],
    Case("channel-semicolon", "accepted", spec_with("channels: ['conda-forge; touch /tmp/x']\n"), "channels[0]"),
    Case("channel-option", "accepted", spec_with("channels: [--override-channels]\n"), "channels[0]"),
    Case("channel-newline-escape", "accepted", spec_with('channels: ["conda-forge\\n-c evil"]\n'), "channels[0]"),
    Case("channel-dotdot-name", "accepted", spec_with("channels: [nvidia/../evil]\n"), "channels[0]"),
    Case("channel-url-no-host", "accepted", spec_with("channels: ['https://']\n"), "channels[0]"),
    Case("pip-name-newline", "accepted", spec_with(pip('"*"', '"einops\\n--index-url https://evil.example"')),
         "pip_packages"),
    Case("pip-name-option", "accepted", spec_with(pip('"*"', '"-e"')), "pip_packages"),
    Case("pip-name-url", "accepted", spec_with(pip('"*"', '"https://evil.example/x.whl"')), "pip_packages"),
    Case("pip-name-trailing-dot", "accepted", spec_with(pip('"*"', "einops.")), "pip_packages"),
    Case("pip-name-unicode", "accepted", spec_with(pip('"*"', "ein\u00f6ps")), "pip_packages"),
    Case("conda-version-newline", "accepted", spec_with(conda('"1.11.*\\n--channel evil"')), "conda_packages.ninja"),
    Case("conda-version-semicolon", "accepted", spec_with(conda('"1.11.*; touch /tmp/x"')), "conda_packages.ninja"),
    Case("conda-version-bracket", "accepted", spec_with(conda('"1.11.*[channel=evil]"')), "conda_packages.ninja"),
    Case("conda-version-bare", "accepted", spec_with(conda('"1.11"')), "conda_packages.ninja"),
    Case("conda-version-channel-prefix", "accepted", spec_with(conda('"evil::ninja"')), "conda_packages.ninja"),
    Case("conda-name-channel-prefix", "accepted", spec_with(conda('"*"', '"evil::ninja"')), "conda_packages"),
    Case("description-newline-escape", "accepted", spec_with('description: "one\\ntwo"\n',
                                                             a="description: CUDA 12.6 line\n", b=""), "description"),
    Case("description-ansi-escape", "accepted", spec_with('description: "\\e[31mred"\n',
                                                          a="description: CUDA 12.6 line\n", b=""), "description"),
    Case("description-nul-escape", "accepted", spec_with('description: "a\\0b"\n',
                                                         a="description: CUDA 12.6 line\n", b=""), "description"),
    Case("description-literal-block", "accepted", spec_with("description: |\n  one\n  two\n",
                                                            a="description: CUDA 12.6 line\n", b=""), "description"),
    Case("module-shell", "accepted", spec_with("toolchain:\n  modules: ['cuda/12.6; rm -rf ~']\n"),
         "toolchain.modules[0]"),
    Case("cuda-home-relative", "accepted",
         spec_with("toolchain:\n  kind: external\n  cuda_home: usr/local/cuda\n  python_executable: /usr/bin/python3\n"
                   "  nvcc: '12.6'\n  gcc: 13\n  python: '3.12'\n  torch: '2.9.1'\n  cxx11_abi: true\n"),
         "toolchain.cuda_home"),
]

CASES = PARSER + ACCEPTED


def materialize(envs: Path, case: Case) -> Path:
    """Write the case's files into a copy of the real envs/ (base.yaml and cu126.yaml); return the spec."""
    for name in ("base.yaml", "cu126.yaml"):
        (envs / name).write_text(REAL[name])
    for name, content in {"cu126.yaml": case.content, **case.others}.items():
        path = envs / name
        path.unlink(missing_ok=True)
        if callable(content):
            content(path)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return envs / "cu126.yaml"


@pytest.fixture
def envs(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "envs").mkdir()
    return tmp_path / "envs"


def assert_one_line(message: str) -> None:
    assert ONE_LINE.fullmatch(message), repr(message)
    assert len(message) < 600 and message.isprintable(), repr(message)
    assert "Traceback" not in message


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_spec_is_one_line(envs, case):
    path = materialize(envs, case)
    with bounded():
        with pytest.raises(ToolkitError) as caught:
            load_spec(path)
    message = str(caught.value)
    assert_one_line(message)
    assert message.startswith("envs/"), message
    assert case.expect in message, message


CLI_SUBSET = ["alias-bomb", "recursive-alias", "nesting-900-flow-lists", "digits-5000-gcc", "placeholder-attribute",
              "nul-byte", "latin-1-bytes", "fifo", "char-device", "extends-chain-1500", "torch-version-major-only",
              "archs-empty", "pip-version-newline-index", "jobs-10-to-the-30", "index-no-host"]


@pytest.mark.parametrize("case", [c for c in CASES if c.id in CLI_SUBSET], ids=CLI_SUBSET)
def test_hostile_spec_through_the_cli(envs, case):
    """The real verb in a subprocess, limited to 2 GiB and 60 s: one line, exit 1, nothing else."""
    materialize(envs, case)
    done = subprocess.run([sys.executable, "-m", "toolkit", "check", "cu126"], capture_output=True, text=True,
                          timeout=60, preexec_fn=limit_child, cwd=envs.parent,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    output = (done.stdout + done.stderr).strip()
    assert done.returncode == 1, output
    assert len(output.splitlines()) == 1, output
    assert_one_line(output.removeprefix("error: "))
    assert case.expect in output


def test_every_crafted_case_is_counted():
    """The report gives counts per class; the ids are unique and each case names its class."""
    assert len({c.id for c in CASES}) == len(CASES)
    assert {c.kind for c in CASES} == {"parser", "accepted"}
    assert set(CLI_SUBSET) <= {c.id for c in CASES}


# ---------------------------------------------------------------- what must stay accepted

VALID = [
    ("conda-range", spec_with(conda('">=1.11,<2"'))),
    ("conda-wildcard", spec_with(conda('"1.11.*"'))),
    ("conda-exact", spec_with(conda('"==1.11.1"'))),
    ("conda-placeholder", spec_with(conda('"{gcc}.*"', "gxx"))),
    ("pip-range", spec_with(pip('">=0.8,<1"'))),
    ("pip-compatible", spec_with(pip('"~=0.8.1"'))),
    ("pip-wildcard", spec_with(pip('"==0.8.*"'))),
    ("pip-exclusion", spec_with(pip('"!=0.7,>=0.6"'))),
    ("pip-any-empty", spec_with(pip('""'))),
    ("pip-dotted-name", spec_with(pip('"*"', "zope.interface"))),
    ("pip-removed", spec_with(pip("null", "psutil"))),
    ("channel-label", spec_with("channels: [nvidia/label/cuda-12.6.3, conda-forge]\n")),
    ("channel-file-url", spec_with("channels: ['file:///srv/conda/channel']\n")),
    ("channel-relative-path", spec_with("channels: [../../channel]\n")),
    ("channel-home-path", spec_with("channels: [~/channel]\n")),
    ("channel-http-loopback", spec_with("channels: ['http://127.0.0.1:8000/conda-forge']\n")),
    ("index-loopback-port", with_index("http://127.0.0.1:41234/simple")),
    ("index-ipv6", with_index("'http://[::1]:8080/simple'")),
    ("index-file", with_index("file:///srv/pypi/simple")),
    ("index-credentials", with_index("https://user:token@mirror.example.org/simple/")),
    ("description-unicode", spec_with(a="CUDA 12.6 line", b="CUDA 12.6 line \u2014 caf\u00e9")),
    ("bom-at-start", "\ufeff" + spec_with()),
    ("crlf-line-ends", spec_with().replace("\n", "\r\n")),
    ("archs-int-and-suffix", spec_with("archs: [80, '90a']\n")),
    ("jobs-bounds", spec_with("build:\n  jobs: 4096\n  nvcc_threads: 64\n  gb_per_nvcc_thread: 0.5\n")),
    ("jobs-string", spec_with("build:\n  jobs: '8'\n  nvcc_threads: '2'\n")),
    ("modules", spec_with("toolchain:\n  modules: [cuda/12.6.2, gcc/13.2.0]\n")),
    ("torch-local-tag", spec_with(a='version: "2.9.1"', b='version: "2.9.1+cu126"')),
    ("comment-with-anchor-text", spec_with("# &anchor *alias !!tag {cuda.real}\n")),
]


@pytest.mark.parametrize("text", [v[1] for v in VALID], ids=[v[0] for v in VALID])
def test_legitimate_forms_stay_accepted(envs, text):
    (envs / "base.yaml").write_text(REAL["base.yaml"])
    (envs / "cu126.yaml").write_text(text)
    with bounded():
        spec = load_spec(envs / "cu126.yaml")
    assert_invariants(spec)


def test_date_like_values_are_text(envs):
    """No field is a date: "2024-13-45" raised ValueError from YAML's timestamp constructor; now it is text."""
    (envs / "base.yaml").write_text(REAL["base.yaml"])
    (envs / "cu126.yaml").write_text(spec_with(a="description: CUDA 12.6 line", b="description: 2024-13-45"))
    with bounded():
        assert load_spec(envs / "cu126.yaml").description == "2024-13-45"


def test_placeholders_render_exactly(envs):
    (envs / "base.yaml").write_text(REAL["base.yaml"])
    (envs / "cu126.yaml").write_text(spec_with(pip('">={python},<{cuda}.{gcc}"')))
    spec = load_spec(envs / "cu126.yaml")
    assert spec.conda_packages["cuda-version"] == "12.6.*" and spec.conda_packages["gxx"] == "13.*"
    assert spec.pip_packages["einops"] == ">=3.12,<12.6.13"


# ---------------------------------------------------------------- invariants of an accepted spec

ASCII_VERSION = re.compile(r"[0-9]+(\.[0-9]+)+[0-9a-z.+]*", re.ASCII)


def assert_invariants(spec: EnvSpec) -> None:
    """What every later stage may rely on once load_spec returned."""
    assert spec.archs and len(set(spec.archs)) == len(spec.archs)
    assert all(re.fullmatch(r"[0-9]{2,3}[af]?", arch, re.ASCII) for arch in spec.archs), spec.archs
    assert spec.platforms and len(set(spec.platforms)) == len(spec.platforms) and set(spec.platforms) <= set(PLATFORMS)
    assert (spec.channels or spec.toolchain.kind == "pypi") and len(set(spec.channels)) == len(spec.channels)
    for version in (spec.cuda, spec.python, spec.torch_version, spec.flash_attn_version):
        assert ASCII_VERSION.fullmatch(version), version
        assert len(Version(version).release) >= 2
    assert re.fullmatch(r"[0-9]{1,2}", spec.gcc, re.ASCII)
    assert spec.build.jobs is None or 1 <= spec.build.jobs <= 4096
    assert spec.build.nvcc_threads is None or 1 <= spec.build.nvcc_threads <= 64
    assert 0 < spec.build.gb_per_nvcc_thread <= 1024 and 0 < spec.build.threads_per_cpu <= 64
    assert re.fullmatch(r"(https?://[^\s/]+|file:///)\S*", spec.torch_index), spec.torch_index
    for requirement in spec.pip_requirements():
        assert requirement.isascii() and not re.search(r"[\s;@#\[]", requirement), requirement
        assert not Requirement(requirement).marker and not Requirement(requirement).url, requirement
    for match_spec in spec.conda_specs():
        assert match_spec.isascii() and re.fullmatch(r"[a-z0-9_.-]+( [0-9A-Za-z.*<>=!~,|_+]+)?", match_spec), match_spec
    text = [spec.description, spec.torch_index, *spec.channels, *spec.toolchain.modules]
    assert all(value.isprintable() for value in text), text


# ---------------------------------------------------------------- property-based fuzzing

FUZZ = settings(max_examples=90, derandomize=True, database=None, deadline=3000,
                suppress_health_check=[HealthCheck.too_slow])
NAMES = ["extends", "description", "cuda", "python", "gcc", "platforms", "channels", "conda_packages", "pip_packages",
         "torch", "flash_attn", "archs", "build", "toolchain", "version", "index", "jobs", "nvcc_threads", "kind",
         "modules", "cuda_home", "einops", "ninja", "python_executable", "<<", "=", "?", "null", "1"]
NASTY = ["", "*", "2", "2.9.1", "12.6", "90", "90a", "auto", "linux-64", "base", "cu126", "{cuda}", "{cuda.real}",
         "{cuda[0]}", "{0}", "{}", "{{cuda}}", "\u0662.\u0669", "https://", "file://x", "--index-url=x",
         ">=1\n--pre", "a;b", "\x00", "\x1b[2J", "\u202e", "9" * 50, "../../etc/passwd", "external", "locked"]
scalars = (st.none() | st.booleans() | st.integers() | st.integers(min_value=-(10 ** 80), max_value=10 ** 80)
           | st.floats() | st.text(max_size=24) | st.sampled_from(NASTY))
keys = st.sampled_from(NAMES) | st.text(max_size=12) | st.integers() | st.booleans() | st.none()
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
                      max_leaves=16)


class Sandbox:
    """One envs/ folder per fuzz test holding the real specs; each example writes envs/fuzz.yaml."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="hostile-spec-")
        self.envs = Path(self._dir.name) / "envs"
        self.envs.mkdir()
        for name, text in REAL.items():
            (self.envs / name).write_text(text)

    def outcome(self, content: str | bytes) -> EnvSpec | None:
        """Load envs/fuzz.yaml and run every rule: a valid spec (returned) or one ToolkitError line (None)."""
        path = self.envs / "fuzz.yaml"
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass"))
        with bounded(seconds=5):
            try:
                spec = load_spec(path)
                violations(spec)
            except ToolkitError as exc:
                assert_one_line(str(exc))
                event("refused")
                return None
        assert_invariants(spec)
        event("accepted")
        return spec


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    box = Sandbox()
    yield box
    box._dir.cleanup()


def dump(data: object) -> str:
    return yaml.safe_dump(data, allow_unicode=True, sort_keys=False)


@FUZZ
@given(st.sampled_from(sorted(REAL)), st.lists(st.tuples(st.lists(st.sampled_from(NAMES), min_size=1, max_size=2),
                                                         values | st.just("<delete>")), min_size=1, max_size=3))
def test_fuzz_mutations_of_the_real_specs(sandbox, name, edits):
    data = yaml.safe_load(REAL[name])
    for path, value in edits:
        parent = data
        for part in path[:-1]:
            parent = parent.setdefault(part, {}) if isinstance(parent.get(part, {}), dict) else {}
        if value == "<delete>":
            parent.pop(path[-1], None)
        else:
            parent[path[-1]] = value
    sandbox.outcome(dump(data))


@FUZZ
@given(st.dictionaries(keys, values, max_size=8), st.sampled_from(["base", "cu126", "cu130", None]))
def test_fuzz_random_documents(sandbox, data, parent):
    if parent:
        data = {"extends": parent, **data}
    sandbox.outcome(dump(data))


@FUZZ
@given(st.sampled_from(sorted(REAL)), st.integers(min_value=0), st.text(max_size=20) | st.binary(max_size=12),
       st.integers(min_value=0, max_value=8))
def test_fuzz_text_edits_of_the_real_specs(sandbox, name, at, insert, cut):
    text = REAL[name].encode()
    at %= len(text) + 1
    piece = insert if isinstance(insert, bytes) else insert.encode("utf-8", "surrogatepass")
    sandbox.outcome(text[:at] + piece + text[at + cut:])


YAML_ALPHABET = "&*!|>[]{}:,-?#%@`'\" \n\t.<=~0123456789abcdefxyz_/\\\x00\x85\u2028\ufeff\u0661"


@FUZZ
@given(st.text(alphabet=YAML_ALPHABET, max_size=120), st.sampled_from(["", "extends: base\n", GOOD]))
def test_fuzz_yaml_syntax(sandbox, noise, prefix):
    sandbox.outcome(prefix + noise)
