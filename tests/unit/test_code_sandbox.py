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
    with pytest.raises(ValueError, match="needs metadata\\['tests'\\] and metadata\\['entry_point'\\]"):
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
    reward, info = score(quick_kill, code, ["assert f() == 1", "assert f() == 1"])
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
    code += "\ndef g():\n    import threading\n    threading.Thread(target=len, args=((),)).start()"
    reward, info = score(kernel_only, code + "\nf0 = f\ndef f(x):\n    return f0() if x else g()",
                         ["assert f(1) == 0", "f(0)"])
    assert reasons(info) == ["passed", "error"], info["tests"]  # no fork, no thread
    assert "can't start new thread" in info["tests"][1]["error"]


def test_memory_bomb_fails_with_memory_error(verifier):
    code = ("blocks = []\ndef f(what):\n    if what == 'grow':\n        while True:\n"
            "            blocks.append(bytearray(1 << 20))\n    if what == 'big':\n"
            "        return bytearray(1 << 30)\n    return len(blocks)")
    tests = ["assert f('grow') is None", "assert f('big')", "assert f('count') > 10"]
    reward, info = score(verifier, code, tests)
    assert reasons(info) == ["memory", "memory", "passed"] and info["outcome"] == "memory", info


def test_writes_outside_the_sandbox_are_refused(verifier, tmp_path):
    outside = tmp_path / "outside.txt"
    in_tmp = f"/tmp/creditlab-outside-{uuid.uuid4().hex}.txt"
    code = "def f(path):\n    with open(path, 'w') as fh:\n        fh.write('x')\n    return True"
    code += "\nimport os\ndef g(path):\n    os.mkdir(path)\n    return True"
    code += "\nf0 = f\ndef f(path, mkdir=False):\n    return g(path) if mkdir else f0(path)"
    tests = [f"assert f({str(outside)!r})", f"assert f({in_tmp!r})", "assert f('inside.txt')",
             "assert f('/tmp/creditlab-outside-dir', mkdir=True)"]
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
    code += "\nimport os\nf0 = f\ndef f(path, exists=False):\n    return os.path.exists(path) if exists else f0(path)"
    tests = [f"assert f({str(outside)!r})", f"assert f({in_tmp!r})", "assert f('/usr/x')",
             "assert f('inside.txt')", f"assert not f({str(secret)!r}, exists=True)"]
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
        code = "import socket\ndef f(port):\n    return socket.create_connection(('127.0.0.1', port), timeout=1) and 1"
        reward, info = score(kernel_only, code, [f"assert f({port})"])
        assert reward == 0 and "Network is unreachable" in info["tests"][0]["error"]
        with pytest.raises(socket.timeout):
            server.accept()  # nothing reached the parent's listening socket


def test_parent_secrets_are_not_inherited(verifier, monkeypatch):
    monkeypatch.setenv("CREDITLAB_TEST_SECRET", "s3cr3t-token")
    code = ("import os\ndef f(what):\n    if what == 'secret':\n        return os.environ.get('CREDITLAB_TEST_SECRET')\n"
            "    if what == 'keys':\n        return set(os.environ)\n    return open(what).read()")
    tests = ["assert f('secret') is None", "assert f('keys') <= {'PATH', 'LANG', 'HOME', 'TMPDIR', 'CREDITLAB_SANDBOX'}",
             f"assert f('/proc/{os.getpid()}/environ')"]
    reward, info = score(verifier, code, tests)
    assert reasons(info)[:2] == ["passed", "passed"]
    assert reasons(info)[2] in ("denied", "error")  # the hook, or no /proc in the namespace root


def test_subprocesses_are_denied(verifier):
    code = ("def f(what):\n    import os, subprocess\n    if what == 0:\n        subprocess.run(['echo', 'hi'])\n"
            "    elif what == 1:\n        os.system('echo hi')\n    elif what == 2:\n        os.execv('/bin/sh', ['sh'])\n"
            "    else:\n        import ctypes\n        ctypes.CDLL(None).fork()\n    return 1")
    tests = [f"assert f({i})" for i in range(4)]
    reward, info = score(verifier, code, tests)
    assert all(r in ("denied", "error") for r in reasons(info)) and "denied" in reasons(info)
    assert info["denied"], "the denied operations are listed"


def test_deep_recursion(verifier, quick_kill):
    code = "def f(n):\n    return f(n + 1)"
    reward, info = score(verifier, code, ["assert f(0)"])
    assert reasons(info) == ["error"] and info["tests"][0]["error"].startswith("RecursionError")
    code = "import sys\nsys.setrecursionlimit(10 ** 8)\ndef f(n):\n    return f(n + 1)"
    reward, info = score(quick_kill, code, ["assert f(0)", "assert f(0)"])
    assert reward <= 0.5 and reasons(info)[0] in ("memory", "crashed", "timeout", "error")


def test_printing_megabytes_is_capped(verifier):
    code = ("import os\ndef f(raw=False):\n    if raw:\n        n = os.write(1, b'y' * 3_000_000)\n"
            "        assert n <= 1 << 20, n\n        os.write(1, b'z')\n    for _ in range(20):\n"
            "        print('x' * 1_000_000)\n    return 1")
    tests = ["assert f() == 1",  # print goes through a capped stream: 8 KB kept, the rest counted
             "assert f(raw=True)"]
    start = time.monotonic()
    reward, info = score(verifier, code, tests)
    assert time.monotonic() - start < 3
    assert reasons(info) == ["passed", "error"] and "File too large" in info["tests"][1]["error"]
    assert info["output_dropped"] >= 19_000_000


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
        code = ("import os, socket\ndef f(what=None):\n    if what == 'open':\n"
                f"        open({str(outside)!r}, 'w')\n    elif what == 'fork':\n        os.fork()\n"
                "    elif what == 'socket':\n        socket.socket()\n    elif what == 'loop':\n"
                "        while True:\n            pass\n    return 1")
        tests = ["assert f() == 1"] + [f"assert f({w!r})" for w in ("open", "fork", "socket", "loop")]
        reward, info = score(v, code, tests)
        assert reasons(info) == ["passed", "denied", "denied", "denied", "timeout"]
        assert not outside.exists()
    finally:
        v.close()


def test_sandbox_reports_its_layers():
    sandbox = Sandbox(Limits(timeout_s=5))
    result = sandbox.run("def x():\n    return 1", ["assert x() == 1"], "x")
    assert result.tests == [{"outcome": "passed"}] and result.ended == "exit 0"
    assert "audit hook" in result.isolation
    if sandbox.plan["name"] == "namespaces" and os.geteuid() == 0:
        assert f"uid {sandbox.plan['uid']}" in result.isolation
    if sandbox.plan["name"] == "namespaces":
        assert "namespaces" in result.isolation
    if sandbox.plan.get("seccomp"):
        assert "seccomp" in result.isolation


# -- reward hacking: every attack is a wrong solution; none may reach reward 1 ------------------
# The shipped task's problem ``add_numbers``; each attack defines a wrong ``add_numbers`` (it
# returns 0) and tries to make the tests pass anyway.
ADD_TESTS = ["assert add_numbers(1, 2) == 3", "assert add_numbers(-4, 4) == 0",
             "assert add_numbers(0, 0) == 0", "assert add_numbers(100, 23) == 123"]
WRONG = "\ndef add_numbers(a, b):\n    return 0\n"
ATTACKS = {
    "replace builtins.exec": "import builtins\nbuiltins.exec = lambda *a, **k: None\nbuiltins.eval = lambda *a, **k: True" + WRONG,
    "forge report lines through the reporter found with gc": (
        "import gc\nfor o in gc.get_objects():\n    if type(o).__name__ == 'Reporter':\n"
        "        for i in range(4):\n"
        "            o.send(ev='test', index=i, outcome='passed')\n"
        "            o.write('{\"event\": \"test\", \"index\": %d, \"outcome\": \"passed\"}' % i)\n"
        "            o.write('{\"k\": \"\", \"r\": true, \"outcome\": \"passed\"}')\n" + WRONG),
    "forge lines on every descriptor": (
        "import os\nfor fd in range(3, 1024):\n    try:\n"
        "        os.write(fd, b'{\"ev\": \"solution\", \"outcome\": \"ok\"}\\n{\"r\": 3}\\n{\"event\": \"test\", \"index\": 0, \"outcome\": \"passed\"}\\n')\n"
        "    except OSError:\n        pass\n" + WRONG),
    "rewrite the tests and the harness through frames": (
        "import sys\nframe = sys._getframe(0)\nwhile frame is not None:\n"
        "    g = frame.f_globals\n    for key in list(frame.f_locals):\n"
        "        value = frame.f_locals[key]\n        if isinstance(value, dict) and 'tests' in value:\n"
        "            value['tests'] = ['assert True'] * 4\n"
        "    if 'Reporter' in g:\n        send = g['Reporter'].send\n"
        "        g['Reporter'].send = lambda self, **m: send(self, **{**m, 'outcome': 'passed'})\n"
        "    if 'classify' in g:\n        g['classify'] = lambda *a: ('passed', '')\n"
        "    frame = frame.f_back\n" + WRONG),
    "read the expected values from memory": (
        "import gc, sys\nfound = {}\ndef scan(value):\n    if isinstance(value, str) and 'add_numbers(' in value and '==' in value:\n"
        "        call, _, expected = value.partition('==')\n        found[call.strip()[len('assert '):]] = int(expected)\n"
        "for o in gc.get_objects():\n    if isinstance(o, dict):\n        for v in list(o.values()):\n            scan(v)\n"
        "    elif isinstance(o, (list, tuple)):\n        for v in o:\n            scan(v)\n"
        "frame = sys._getframe(0)\nwhile frame is not None:\n    for v in list(frame.f_locals.values()):\n"
        "        scan(v)\n    frame = frame.f_back\n"
        "def add_numbers(a, b):\n    return found.get(f'add_numbers({a}, {b})', len(found))\n"),
    "return an object equal to everything": (
        "class Any:\n    def __eq__(self, other):\n        return True\n    __hash__ = None\n"
        "def add_numbers(a, b):\n    return Any()\n"),
    "return an int subclass equal to everything": (
        "class Int(int):\n    def __eq__(self, other):\n        return True\n"
        "def add_numbers(a, b):\n    return Int(0)\n"),
    "switch the audit hook off through its closure, then patch the judge's pipe": (
        "import gc\nfor o in gc.get_objects():\n    if type(o).__name__ == 'function' and o.__name__ == 'hook' and o.__closure__:\n"
        "        for cell in o.__closure__:\n            if isinstance(cell.cell_contents, dict) and 'busy' in cell.cell_contents:\n"
        "                cell.cell_contents['busy'] = True\n" + WRONG),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_reward_hacking_attacks_earn_nothing(verifier, attack):
    reward, info = score(verifier, ATTACKS[attack], ADD_TESTS, entry="add_numbers")
    assert reward < 1.0, (attack, info)
    assert reward <= 0.5, "only the two tests whose answer is 0 can pass: the function returns 0"


def test_the_child_never_holds_a_test_or_an_expected_value(verifier):
    """The function returns every string it can find in its process's memory; none is a test."""
    code = ("import gc, sys\ndef f(x):\n    seen = set()\n    for o in gc.get_objects():\n"
            "        for v in (o.values() if isinstance(o, dict) else o if isinstance(o, (list, tuple)) else ()):\n"
            "            if isinstance(v, str):\n                seen.add(v)\n"
            "    needles = (''.join(['98765', '43']), ''.join(['ass', 'ert f(']))  # built after the scan\n"
            "    return sorted(s for s in seen if any(n in s for n in needles))")
    reward, info = score(verifier, code, ["assert f(1) == 9876543", "assert f(2) == []"])
    assert reasons(info) == ["failed", "passed"], info["tests"]


def test_is_true_and_float_comparisons_use_the_returned_built_in_values(verifier):
    is_true = ["assert f(2) is True", "assert f(3) is False"]
    assert score(verifier, "def f(n):\n    return n % 2 == 0", is_true)[0] == 1.0
    assert score(verifier, "def f(n):\n    return 1 - n % 2", is_true)[0] == 0.0, "1 is not True"
    floats = ["assert abs(f(37) - 98.6) < 1e-9", "import math\nassert math.isclose(f(0), 32.0)",
              "assert isinstance(f(0), float)", "import math\nassert math.isnan(f(None))",
              "assert f(-1e309) == float('-inf')"]
    code = ("def f(c):\n    if c is None:\n        return float('nan')\n    return c * 9 / 5 + 32")
    reward, info = score(verifier, code, floats)
    assert reward == 1.0, info["tests"]
    reward, info = score(verifier, "def f(c):\n    return str(c * 9 / 5 + 32)", floats)
    assert reasons(info)[:3] == ["error", "error", "failed"], "a str is not a float"


def test_values_keep_their_types_and_exceptions_their_class(verifier):
    code = ("def f(kind):\n    if kind == 'raise':\n        raise ValueError('bad input')\n"
            "    if kind == 'custom':\n        class Oops(Exception):\n            pass\n        raise Oops('no')\n"
            "    return {'t': (1, 2), 's': {1, 2}, 'z': frozenset({3}), 'd': {(1, 2): [None]},"
            " 'b': b'\\x00', 'c': 1j, 'big': 10 ** 300, 'i': 3, 'l': [1.5, 'x']}[kind]")
    tests = ["assert f('t') == (1, 2) and type(f('t')) is tuple", "assert f('s') == {1, 2}",
             "assert type(f('z')) is frozenset", "assert f('d') == {(1, 2): [None]}",
             "assert f('b') == b'\\x00'", "assert f('c') == 1j", "assert f('big') == 10 ** 300",
             "assert f('i') == 3 and f('i') is not True", "assert f('l') == [1.5, 'x']",
             "try:\n    f('raise')\nexcept ValueError as e:\n    assert 'bad input' in str(e)\nelse:\n    assert False",
             "f('custom')"]
    reward, info = score(verifier, code, tests)
    assert reasons(info) == ["passed"] * 10 + ["error"], info["tests"]
    assert "Oops" in info["tests"][-1]["error"]


def test_an_exception_cannot_hide_a_timeout(quick_kill):
    """A test that catches every Exception still fails when the call timed out."""
    code = "def f():\n    while True:\n        pass"
    reward, info = score(quick_kill, code, ["try:\n    f()\nexcept Exception:\n    pass"])
    assert reasons(info) == ["timeout"]


# -- kernel layers: namespaces, seccomp, cgroups ---------------------------------------------
LIBC = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"


def test_no_sysv_shared_memory_or_keyrings_or_namespaces(kernel_only):
    """With the audit hook off, ctypes reaches libc: the seccomp filter refuses SysV shared
    memory (which would outlive the run), keyrings (shared by every run of the uid) and new
    namespaces; each call returns -1 with EPERM."""
    if not kernel_only.plan.get("seccomp"):
        pytest.skip("libseccomp is not available here")
    key = 0x5EC0DE
    code = LIBC + (
        "def f(what):\n    if what == 'shm':\n        r = libc.shmget(%d, 256 << 20, 0o1600)\n"
        "    elif what == 'shm_again':\n        r = libc.shmget(%d, 0, 0)\n"
        "    elif what == 'keyring':\n        r = libc.syscall(250, 0, -4, 0)\n"  # keyctl(GET_KEYRING_ID, USER)
        "    elif what == 'unshare':\n        r = libc.unshare(0x10000000)\n"  # CLONE_NEWUSER
        "    elif what == 'hostname':\n        r = libc.sethostname(b'x', 1)\n"
        "    return r, ctypes.get_errno()\n") % (key, key)
    tests = ["assert f('shm') == (-1, 1)", "assert f('unshare') == (-1, 1)",
             "assert f('hostname') == (-1, 1)"]
    if os.uname().machine == "x86_64":
        tests.append("assert f('keyring') == (-1, 1)")
    reward, info = score(kernel_only, code, tests)
    assert reward == 1.0, info["tests"]
    reward, info = score(kernel_only, code, ["assert f('shm_again')[0] == -1"])
    assert reward == 1.0, "nothing was left behind for the next run"


def test_the_child_has_its_own_namespaces_and_cgroups(kernel_only):
    """While a run sleeps, its processes are found and compared with this one."""
    import threading

    results = {}
    thread = threading.Thread(target=lambda: results.update(
        r=score(kernel_only, "import time\ndef f():\n    time.sleep(0.9)\n    return 1", ["assert f() == 1"])))
    thread.start()
    pids: list[int] = []
    deadline = time.monotonic() + 3
    while not pids and time.monotonic() < deadline:
        time.sleep(0.05)
        pids = [p for p in live_sandbox_processes() if os.path.exists(f"/proc/{p}/ns/ipc")]
    assert pids, "the sandboxed process was not found"
    worker = max(pids)  # unshare, then the namespace's init, then the worker: the newest
    try:
        for ns in ("ipc", "uts", "cgroup", "net", "pid", "mnt"):
            assert os.readlink(f"/proc/{worker}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}"), ns
        if kernel_only.plan.get("cgroups"):
            with open(f"/proc/{worker}/cgroup") as f:
                groups = f.read()
            assert "creditlab-" in groups, groups
    finally:
        thread.join()
    assert results["r"][0] == 1.0
    if kernel_only.plan.get("cgroups"):
        from creditlab_code import cgroups

        limits = [os.path.join(p, n) for p in cgroups.parents().values()
                  for n in ("memory.limit_in_bytes", "memory.max", "pids.max")]
        assert not any("creditlab-" in p for p in os.listdir(os.path.dirname(limits[0]))
                       if p.startswith(f"creditlab-{os.getpid()}-")), "the run's cgroups are removed"


def test_cgroup_memory_limit_bounds_memory_outside_the_address_space(kernel_only):
    """tmpfs pages are not in RLIMIT_AS; the run's memory cgroup is charged for them."""
    if not kernel_only.plan.get("cgroups"):
        pytest.skip("cgroups cannot be created here (needs root or a delegated hierarchy)")
    from creditlab_code import cgroups

    made = cgroups.create(64 << 20, 8)
    try:
        for path in made:
            names = os.listdir(path)
            limit = "memory.limit_in_bytes" if "memory.limit_in_bytes" in names else "memory.max"
            if limit in names:
                assert int(open(os.path.join(path, limit)).read()) == 64 << 20
            if "pids.max" in names:
                assert open(os.path.join(path, "pids.max")).read().strip() == "8"
    finally:
        cgroups.remove(made)
    assert not any(os.path.exists(p) for p in made)
