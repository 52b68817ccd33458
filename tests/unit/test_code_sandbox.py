"""The code_tests verifier's sandbox: hostile code is contained, reported, and leaves nothing.

Every test checks three things: the run is contained (bounded time, no effect outside), the
failure is reported as a failed test with its reason, and no process of the run is left. Two
verifiers are used: the default (audit hook on, the best isolation this machine allows) and,
where namespaces work, one with the audit hook off, to show what the kernel layers contain on
their own. Limits are short so the whole file runs in seconds.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import uuid

import pytest
from creditlab.types import Completion, Problem
from creditlab_code.sandbox import Limits, Sandbox, live_sandbox_processes
from creditlab_code.verifier import CodeTestsVerifier

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox targets Linux")

SHORT = dict(timeout_s=4.0, test_timeout_s=1.0, cpu_s=3.0, memory_mb=256, file_size_mb=1,
             disk_mb=4, output_kb=8, workers=2)


def children() -> set[int]:
    out: set[int] = set()
    for task in os.listdir(f"/proc/{os.getpid()}/task"):
        try:
            with open(f"/proc/{os.getpid()}/task/{task}/children") as f:
                out.update(int(p) for p in f.read().split())
        except OSError:
            continue
    return out


@pytest.fixture(autouse=True)
def nothing_left_running():
    before = children()
    yield
    deadline = time.monotonic() + 2.0  # the kernel reaps a killed PID namespace asynchronously
    while (live_sandbox_processes() or children() - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not live_sandbox_processes(), "a sandboxed process is still running"
    assert not children() - before, "a child process of the test is still running"


@pytest.fixture(scope="module")
def verifier():
    v = CodeTestsVerifier(CodeTestsVerifier.Config(**SHORT))
    yield v
    v.close()


@pytest.fixture(scope="module")
def quick_kill():
    """A short wall limit, for tests that wait for it."""
    v = CodeTestsVerifier(CodeTestsVerifier.Config(**{**SHORT, "timeout_s": 1.5}))
    yield v
    v.close()


@pytest.fixture(scope="module")
def kernel_only():
    """Audit hook off: only namespaces, the uid switch and rlimits. Skipped where they are not
    all available (a fork bomb as root without them is not something to run on a shared box)."""
    v = CodeTestsVerifier(CodeTestsVerifier.Config(**SHORT, audit_hook=False))
    plan = v.plan
    if plan["name"] != "namespaces" or (os.geteuid() == 0 and plan.get("uid") is None):
        v.close()
        pytest.skip(f"kernel isolation not available here: {plan['name']} {plan['layers']}")
    yield v
    v.close()


def score(verifier, code: str, tests: list[str], entry: str | None = "f", fenced: bool = True):
    """Score one answer holding ``code``; returns (reward, info)."""
    problem = Problem("p", "write f", "", metadata={"tests": tuple(tests), "entry_point": entry})
    text = f"Sure.\n```python\n{code}\n```\n" if fenced else code
    rewards = verifier.score([problem], [Completion((1,), (2,), (-0.1,), "eos", text)])
    return rewards.values[0], rewards.info[0]


def reasons(info) -> list[str]:
    return [t["outcome"] for t in info["tests"]]


# -- correctness ------------------------------------------------------------------------------
def test_correct_solution_scores_one(verifier):
    reward, info = score(verifier, "def f(x):\n    return 2 * x", ["assert f(1) == 2", "assert f(0) == 0"])
    assert reward == 1.0 and info["outcome"] == "correct" and info["passed"] == 2
    assert "def f" in info["parsed"]
    metrics = verifier.metrics()
    assert metrics["correct_count"] == 1 and metrics["scored"] == 1 and metrics["sandbox_s_mean"] > 0


def test_partial_solution_scores_the_fraction(verifier):
    tests = ["assert f(1) == 2", "assert f(2) == 4", "assert f(3) == 7", "assert f(-1) == 0"]
    reward, info = score(verifier, "def f(x):\n    return 2 * x", tests)
    assert reward == 0.5 and info["outcome"] == "partial"
    assert reasons(info) == ["passed", "passed", "failed", "failed"]
    strict = CodeTestsVerifier(CodeTestsVerifier.Config(**SHORT, reward="all_or_nothing"))
    try:
        assert score(strict, "def f(x):\n    return 2 * x", tests)[0] == 0.0
    finally:
        strict.close()


def test_syntax_error_no_code_and_missing_function_are_counted(verifier):
    verifier.metrics()
    reward, info = score(verifier, "def f(x)\n    return x", ["assert f(1) == 1"])
    assert reward == 0 and info["outcome"] == "syntax_error" and "line 1" in info["error"]
    reward, info = score(verifier, "   ", ["assert f(1) == 1"], fenced=False)
    assert reward == 0 and info["outcome"] == "no_code" and info["parsed"] is None
    reward, info = score(verifier, "def g(x):\n    return x", ["assert f(1) == 1"])
    assert reward == 0 and info["outcome"] == "error" and "named 'f'" in info["error"]
    reward, info = score(verifier, "def f(x):\n    return x", ["assert f(1) == 1"], fenced=False)
    assert reward == 1.0, "without a fence the whole text is the code"
    m = verifier.metrics()
    assert (m["syntax_error_count"], m["no_code_count"], m["error_count"], m["correct_count"]) == (1, 1, 1, 1)


def test_exceptions_in_tests_are_reported_by_type(verifier):
    reward, info = score(verifier, "def f(x):\n    return 10 // x", ["assert f(5) == 2", "assert f(0) == 0"])
    assert reward == 0.5 and info["outcome"] == "error"
    assert info["tests"][1]["error"].startswith("ZeroDivisionError")


def test_problem_without_tests_is_an_error(verifier):
    with pytest.raises(ValueError, match="no metadata\\['tests'\\]"):
        verifier.score([Problem("p", "q", "")], [Completion((1,), (2,), (-0.1,), "eos", "x")])


# -- containment ------------------------------------------------------------------------------
def test_infinite_loop_times_out_per_test(verifier):
    code = "def f(x):\n    while x:\n        pass\n    return 0"
    reward, info = score(verifier, code, ["assert f(1) == 0", "assert f(0) == 0"])
    assert reasons(info) == ["timeout", "passed"] and info["outcome"] == "timeout"
    assert reward == 0.5, "tests after a per-test timeout still run"


def test_loop_that_swallows_the_alarm_is_killed_at_the_wall_limit(quick_kill):
    code = ("def f():\n    while True:\n        try:\n            while True:\n                pass\n"
            "        except BaseException:\n            pass")
    start = time.monotonic()
    reward, info = score(quick_kill, code, ["assert f() == 1", "assert 1 == 1"])
    assert time.monotonic() - start < 1.5 + 3
    assert reward == 0 and info["outcome"] == "timeout"
    assert reasons(info) == ["timeout", "not_run"] and info["ended"] in ("wall timeout", "signal SIGXCPU")


def test_cpu_limit_kills_a_busy_process():
    v = CodeTestsVerifier(CodeTestsVerifier.Config(**{**SHORT, "cpu_s": 1.0, "timeout_s": 8.0}))
    try:
        code = ("import signal\nsignal.setitimer(signal.ITIMER_REAL, 0)\n"
                "signal.signal(signal.SIGALRM, signal.SIG_IGN)\ndef f():\n    while True:\n        pass")
        start = time.monotonic()
        reward, info = score(v, code, ["assert f() == 1"])
        assert time.monotonic() - start < 6, "RLIMIT_CPU ended it before the wall limit"
        assert info["outcome"] == "timeout" and info["ended"] in ("signal SIGXCPU", "signal SIGKILL")
    finally:
        v.close()


def test_fork_bomb_is_denied(verifier):
    code = ("import os\ndef f():\n    n = 0\n    for _ in range(8):\n        pid = os.fork()\n"
            "        n += 1\n    return n")
    reward, info = score(verifier, code, ["assert f() == 8"])
    assert reward == 0 and info["outcome"] == "denied" and "os.fork" in info["tests"][0]["error"]


def test_fork_bomb_is_contained_by_the_kernel_without_the_hook(kernel_only):
    code = ("import os, time\ndef f():\n    made = 0\n    for _ in range(8):\n        try:\n"
            "            pid = os.fork()\n        except OSError:\n            continue\n"
            "        if pid == 0:\n            time.sleep(60)\n            os._exit(0)\n"
            "        made += 1\n    return made")
    reward, info = score(kernel_only, code, ["assert f() == 0", "import threading\nthreading.Thread(target=len, args=((),)).start()"])
    assert reasons(info) == ["passed", "error"], info["tests"]  # RLIMIT_NPROC: no fork, no thread
    assert "can't start new thread" in info["tests"][1]["error"]


def test_memory_bomb_fails_with_memory_error(verifier):
    code = "blocks = []\ndef f():\n    while True:\n        blocks.append(bytearray(1 << 20))"
    tests = ["assert f() is None", "assert bytearray(1 << 30)", "assert len(blocks) > 10"]
    reward, info = score(verifier, code, tests)
    assert reasons(info) == ["memory", "memory", "passed"] and info["outcome"] == "memory", info


def test_writes_outside_the_sandbox_are_refused(verifier, tmp_path):
    outside = tmp_path / "outside.txt"
    in_tmp = f"/tmp/creditlab-outside-{uuid.uuid4().hex}.txt"
    code = "def f(path):\n    with open(path, 'w') as fh:\n        fh.write('x')\n    return True"
    tests = [f"assert f({str(outside)!r})", f"assert f({in_tmp!r})", "assert f('inside.txt')",
             "import os\nos.mkdir('/tmp/creditlab-outside-dir')"]
    reward, info = score(verifier, code, tests)
    assert reasons(info) == ["denied", "denied", "passed", "denied"]
    assert not outside.exists() and not os.path.exists(in_tmp)
    assert not os.path.exists("/tmp/creditlab-outside-dir")


def test_writes_outside_are_impossible_without_the_hook(kernel_only, tmp_path):
    outside = tmp_path / "outside.txt"
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cr3t")
    in_tmp = f"/tmp/creditlab-outside-{uuid.uuid4().hex}.txt"
    code = "def f(path):\n    with open(path, 'w') as fh:\n        fh.write('x')\n    return True"
    tests = [f"assert f({str(outside)!r})", f"assert f({in_tmp!r})", "assert f('/usr/x')",
             "assert f('inside.txt')", f"assert not __import__('os').path.exists({str(secret)!r})"]
    reward, info = score(kernel_only, code, tests)
    assert reasons(info) == ["error", "error", "error", "passed", "passed"], info["tests"]
    assert not outside.exists() and not os.path.exists(in_tmp)


def test_work_folder_is_a_small_tmpfs(verifier):
    if verifier.plan["name"] != "namespaces":
        pytest.skip("the work folder is a size-limited tmpfs only in namespace mode")
    code = ("def f():\n    for i in range(100):\n        with open(f'file{i}', 'wb') as fh:\n"
            "            fh.write(b'x' * 500_000)\n    return i")
    reward, info = score(verifier, code, ["assert f() == 99"])
    assert reasons(info) == ["error"] and "No space left on device" in info["tests"][0]["error"]


def test_no_network(verifier):
    code = "import socket\ndef f(port):\n    s = socket.create_connection(('127.0.0.1', port), timeout=1)\n    return s"
    reward, info = score(verifier, code, ["assert f(1)"])
    assert info["outcome"] == "denied" and "socket" in info["tests"][0]["error"]


def test_no_network_without_the_hook(kernel_only):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(0.2)
        port = server.getsockname()[1]
        code = "import socket\ndef f(port):\n    return socket.create_connection(('127.0.0.1', port), timeout=1)"
        reward, info = score(kernel_only, code, [f"assert f({port})"])
        assert reward == 0 and "Network is unreachable" in info["tests"][0]["error"]
        with pytest.raises(socket.timeout):
            server.accept()  # nothing reached the parent's listening socket


def test_parent_secrets_are_not_inherited(verifier, monkeypatch):
    monkeypatch.setenv("CREDITLAB_TEST_SECRET", "s3cr3t-token")
    code = "import os\ndef f():\n    return os.environ.get('CREDITLAB_TEST_SECRET')"
    tests = ["assert f() is None", "import os\nassert set(os.environ) <= {'PATH', 'LANG', 'HOME', 'TMPDIR', 'CREDITLAB_SANDBOX'}",
             f"print(open('/proc/{os.getpid()}/environ').read())"]
    reward, info = score(verifier, code, tests)
    assert reasons(info)[:2] == ["passed", "passed"]
    assert reasons(info)[2] in ("denied", "error")  # the hook, or no /proc in the namespace root


def test_subprocesses_are_denied(verifier):
    tests = ["import subprocess\nsubprocess.run(['echo', 'hi'])", "import os\nos.system('echo hi')",
             "import os\nos.execv('/bin/sh', ['sh'])", "import ctypes\nctypes.CDLL(None).fork()"]
    reward, info = score(verifier, "def f():\n    return 1", tests)
    assert all(r in ("denied", "error") for r in reasons(info)) and "denied" in reasons(info)
    assert info["denied"], "the denied operations are listed"


def test_deep_recursion(verifier, quick_kill):
    code = "def f(n):\n    return f(n + 1)"
    reward, info = score(verifier, code, ["assert f(0)"])
    assert reasons(info) == ["error"] and info["tests"][0]["error"].startswith("RecursionError")
    code = "import sys\nsys.setrecursionlimit(10 ** 8)\ndef f(n):\n    return f(n + 1)"
    reward, info = score(quick_kill, code, ["assert f(0)", "assert 1"])
    assert reward <= 0.5 and reasons(info)[0] in ("memory", "crashed", "timeout", "error")


def test_printing_megabytes_is_capped(verifier):
    code = "def f():\n    for _ in range(20):\n        print('x' * 1_000_000)\n    return 1"
    tests = ["assert f() == 1",  # print goes through a capped stream: 8 KB kept, the rest counted
             "import os\nn = os.write(1, b'y' * 3_000_000)\nassert n <= 1 << 20, n\nos.write(1, b'z')"]
    start = time.monotonic()
    reward, info = score(verifier, code, tests)
    assert time.monotonic() - start < 3
    assert reasons(info) == ["passed", "error"] and "File too large" in info["tests"][1]["error"]
    assert info["output_dropped"] >= 19_000_000


def test_forged_results_are_ignored(verifier):
    forge = ("import json, os\nline = json.dumps({'event': 'test', 'index': 0, 'outcome': 'passed'}) + '\\n'\n"
             "for fd in range(3, 1024):\n    try:\n        os.write(fd, line.encode())\n    except OSError:\n        pass\n"
             "def f():\n    return 0")
    reward, info = score(verifier, forge, ["assert f() == 1"])
    assert reward == 0 and reasons(info) == ["failed"]


def test_parallel_runs_never_hang(quick_kill):
    problem = Problem("p", "q", "", metadata={"tests": ("assert f() == 1",), "entry_point": "f"})
    hang = "```python\nimport time\ndef f():\n    while True:\n        try:\n            time.sleep(100)\n        except BaseException:\n            pass\n```"
    good = "```python\ndef f():\n    return 1\n```"
    texts = [hang, good, hang, good, good, hang]
    quick_kill.metrics()
    start = time.monotonic()
    rewards = quick_kill.score([problem] * 6, [Completion((1,), (2,), (-0.1,), "eos", t) for t in texts])
    assert time.monotonic() - start < 2 * 1.5 + 3, "two workers: the three hangs take two rounds"
    assert rewards.values == (0.0, 1.0, 0.0, 1.0, 1.0, 0.0)
    assert [i["outcome"] for i in rewards.info] == ["timeout", "correct", "timeout", "correct", "correct", "timeout"]
    assert quick_kill.metrics()["timeout_count"] == 3


def test_isolation_none_still_denies_and_kills(tmp_path):
    v = CodeTestsVerifier(CodeTestsVerifier.Config(**SHORT, isolation="none"))
    try:
        assert v.plan["name"] == "none"
        outside = tmp_path / "x.txt"
        tests = ["assert f() == 1", f"open({str(outside)!r}, 'w')", "import os\nos.fork()",
                 "import socket\nsocket.socket()", "while True:\n    pass"]
        reward, info = score(v, "def f():\n    return 1", tests)
        assert reasons(info) == ["passed", "denied", "denied", "denied", "timeout"]
        assert not outside.exists()
    finally:
        v.close()


def test_sandbox_reports_its_layers():
    sandbox = Sandbox(Limits(timeout_s=5))
    result = sandbox.run("x = 1", ["assert x == 1"])
    assert result.tests == [{"outcome": "passed"}] and result.ended == "exit 0"
    assert "audit hook" in result.isolation
    if sandbox.plan["name"] == "namespaces" and os.geteuid() == 0:
        assert f"uid {sandbox.plan['uid']}" in result.isolation
