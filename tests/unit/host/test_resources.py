"""otel_ebpf.host.processes: process/host/container attributes, redaction, cgroup parsing, the cache."""
from __future__ import annotations

import os
import platform
import pwd
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_ebpf.core.version import __version__
from otel_ebpf.host import cgroups, identity, processes as r
DATA = Path(__file__).parent / "data" / "cgroup"
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")

# --- redaction ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "expected"), [
    (["--password=hunter2"], ["--password=<redacted>"]),
    (["--password", "hunter2", "--epochs", "3"], ["--password", "<redacted>", "--epochs", "3"]),
    (["--PASSWORD", "x"], ["--PASSWORD", "<redacted>"]),
    (["--api-key", "sk-abc"], ["--api-key", "<redacted>"]),
    (["--api_key=sk-abc"], ["--api_key=<redacted>"]),
    (["--apiKey", "sk-abc"], ["--apiKey", "<redacted>"]),
    (["--openai-api-key", "sk-abc"], ["--openai-api-key", "<redacted>"]),
    (["--token", "t"], ["--token", "<redacted>"]),
    (["--hf-token=hf_x"], ["--hf-token=<redacted>"]),
    (["--secret", "s"], ["--secret", "<redacted>"]),
    (["--client-secret", "s"], ["--client-secret", "<redacted>"]),
    (["--access-key", "AKIA"], ["--access-key", "<redacted>"]),
    (["--auth", "u:p"], ["--auth", "<redacted>"]),
    (["-password", "x"], ["-password", "<redacted>"]),
    (["PASSWORD=x", "python"], ["PASSWORD=<redacted>", "python"]),
    (["DB_PASSWORD=x"], ["DB_PASSWORD=<redacted>"]),
    (["HF_TOKEN=hf_abc"], ["HF_TOKEN=<redacted>"]),
    (["AWS_SECRET_ACCESS_KEY=abc"], ["AWS_SECRET_ACCESS_KEY=<redacted>"]),
    (["wandb.api_key=abc"], ["wandb.api_key=<redacted>"]),
    (["--db", "postgres://bob:s3cr3t@db:5432/x"], ["--db", "postgres://bob:<redacted>@db:5432/x"]),
    (["--db=redis://:pw@cache:6379"], ["--db=redis://:<redacted>@cache:6379"]),
    (["mysql://u:p@ss@h/db"], ["mysql://u:<redacted>@h/db"]),
    (["https://x-access-token:ghp_1@github.com/o/r"], ["https://x-access-token:<redacted>@github.com/o/r"]),
    (["-H", "Authorization: Bearer abc.def"], ["-H", "Authorization: Bearer <redacted>"]),
    (["-H", "authorization: basic dXNlcg=="], ["-H", "authorization: basic <redacted>"]),
    (["--header=X-Api-Key: abc"], ["--header=X-Api-Key: <redacted>"]),
    (["--header", "Bearer abc"], ["--header", "Bearer <redacted>"]),
    # a script in one argument (sh -c, bash -lc, su -c): its words too, as the lifecycle spans' argv
    (["sh", "-c", "tool --token t1 && HF_TOKEN=x run"],
     ["sh", "-c", "tool --token <redacted> && HF_TOKEN=<redacted> run"]),
    (["bash", "-lc", "curl -u a https://u:pw@h/x  --api-key=k"],
     ["bash", "-lc", "curl -u a https://u:<redacted>@h/x  --api-key=<redacted>"]),
])
def test_redact_secret_values_keep_key(argv: list[str], expected: list[str]) -> None:
    assert r.redact_command_line(argv) == expected


@pytest.mark.parametrize("argv", [
    ["--tokenizer", "gpt2"],
    ["--tokenizer=gpt2"],
    ["--max-tokens", "5"],
    ["--max_new_tokens=128"],
    ["--token-budget", "100"],
    ["--password-file", "/run/secrets/pw"],
    ["--author", "me"],
    ["-p", "8080"],
    ["mkdir", "-p", "/tmp/x"],
    ["PWD=/home/me"],
    ["model.tokenizer=gpt2"],
    ["--url", "https://github.com/o/r"],
    ["ssh://git@github.com/o/r"],
    ["http://host:8080/path@foo"],
    ["--token-type", "bearer"],
    ["--key", "layers.0"],
    ["12:30", "note: hello"],
])
def test_redact_leaves_lookalikes_alone(argv: list[str]) -> None:
    assert r.redact_command_line(argv) == argv


@pytest.mark.parametrize(("code", "expected"), [
    ("import os; token = 'abc123'; print(1)", "import os; token = '<redacted>'; print(1)"),
    ("f(api_key='xyz', model='gpt2')", "f(api_key='<redacted>', model='gpt2')"),
    ('cfg = {"password": "hunter2", "user": "me"}', 'cfg = {"password": "<redacted>", "user": "me"}'),
    ('import os; os.environ["HF_TOKEN"] = "hf_abc"; run()', 'import os; os.environ["HF_TOKEN"] = "<redacted>"; run()'),
    ('const secret="s3"; go()', 'const secret="<redacted>"; go()'),
    ("auth_token = r'raw\\'x'; y=1", "auth_token = r'<redacted>'; y=1"),
    # not literals given to a secret name: code, left alone
    ("x = tokenizer('a b'); max_tokens = '5'", "x = tokenizer('a b'); max_tokens = '5'"),
    ("password = read(); print('password: ok')", "password = read(); print('password: ok')"),
])
def test_redact_string_literals_given_to_secret_names_in_code(code: str, expected: str) -> None:
    """python -c / node -e: the literal's value goes, its quotes and the code around it stay; idempotent."""
    once = r.redact_command_line(["python", "-c", code])
    assert once == ["python", "-c", expected]
    assert r.redact_command_line(once) == once


def test_redact_boolean_flag_does_not_eat_next_option() -> None:
    argv = ["--use_auth_token", "--model", "gpt2"]
    assert r.redact_command_line(argv) == argv


def test_redact_trailing_key_and_empty_value() -> None:
    assert r.redact_command_line(["--password"]) == ["--password"]
    assert r.redact_command_line(["--password="]) == ["--password="]


def test_redact_is_idempotent_and_custom_patterns() -> None:
    once = r.redact_command_line(["--token", "t", "-H", "Authorization: Bearer x"])
    assert r.redact_command_line(once) == once
    assert r.redact_command_line(["--pin", "1234", "--token", "t"], patterns=["pin"]) == [
        "--pin", "<redacted>", "--token", "t"]


# --- cgroup ------------------------------------------------------------------------------------

D1 = "3f4b2a9c1e8d7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a"
D2 = "9a1b2c3d4e5f60718293a4b5c6d7e8f90123456789abcdef0123456789abcdef"
C1 = "d2c7e1f8a9b0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6"
C2 = "4e6f8a0b2c4d6e8f0a2b4c6d8e0f2a4b6c8d0e2f4a6b8c0d2e4f6a8b0c2d4e6f"
O1 = "b5a4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4"
P1 = "71c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2"
U1 = "8f2c4e6a-1b3d-4f5a-9c7e-0d2b4f6a8c1e"
U2 = "c0ffee00-1234-4abc-8def-0123456789ab"
U3 = "5e1a7b3c-9d2f-4e8a-b6c4-1f3d5a7b9c2e"

CGROUP_CASES = {  # fixture file -> (container id, pod uid)
    "docker_v1.txt": (D1, None),
    "docker_v2.txt": (D2, None),
    "docker_systemd_v1.txt": (D2, None),
    "docker_nested_v1.txt": (D2, None),
    "docker_k8s_besteffort_cgroupfs_v1.txt": (D1, U2),
    "containerd_k8s_burstable_systemd_v2.txt": (C1, U1),
    "containerd_k8s_besteffort_systemd_v1.txt": (C2, U2),
    "containerd_k8s_guaranteed_systemd_v2.txt": (C1, U3),
    "containerd_k8s_burstable_cgroupfs_v1.txt": (C1, U1),
    "containerd_k8s_guaranteed_cgroupfs_v2.txt": (C2, U3),
    "containerd_kind_besteffort_systemd_v2.txt": (C2, U2),
    "containerd_k8s_static_pod_cgroupfs_v1.txt": (C1, "a3f1e2d4c5b6a7980f1e2d3c4b5a6978"),
    "crio_k8s_burstable_systemd_v2.txt": (O1, U1),
    "crio_k8s_besteffort_systemd_v1.txt": (O1, U2),
    "crio_conmon_k8s_burstable_systemd_v2.txt": (None, U1),
    "podman_rootful_v2.txt": (P1, None),
    "podman_rootful_v1.txt": (P1, None),
    "podman_rootless_v2.txt": (P1, None),
    "podman_conmon_v2.txt": (None, None),
    "host_user_session_v2.txt": (None, None),
    "host_user_session_v1.txt": (None, None),
    "host_ssh_service_v2.txt": (None, None),
    "host_init_v2.txt": (None, None),
    "host_slurm_step_v2.txt": (None, None),
}


def test_every_fixture_has_a_case() -> None:
    assert {p.name for p in DATA.iterdir()} == set(CGROUP_CASES)


@pytest.mark.parametrize("name", sorted(CGROUP_CASES))
def test_cgroup_fixture_container_and_pod(name: str) -> None:
    text = (DATA / name).read_text()
    container, pod = CGROUP_CASES[name]
    assert cgroups.container_id_from_cgroup(text) == container
    assert cgroups.pod_uid_from_cgroup(text) == pod


@pytest.mark.parametrize("text", ["", "garbage", "0::", "\x00\x01::/docker/zz", "0::/docker/" + "a" * 63,
                                  "0::/docker/" + "A" * 64, "0::/" + "a" * 65])
def test_cgroup_junk_is_none(text: str) -> None:
    assert cgroups.container_id_from_cgroup(text) is None
    assert cgroups.pod_uid_from_cgroup(text) is None


# --- fake /proc --------------------------------------------------------------------------------

def _stat_line(pid: int, comm: str, ppid: int, start: int) -> str:
    return f"{pid} ({comm}) S {ppid} " + " ".join(["0"] * 17) + f" {start} " + " ".join(["0"] * 30)


def make_proc(root: Path, pid: int, *, comm: str = "trainer", ppid: int = 1, start: int = 1000,
              cmdline: bytes | None = b"python\0train.py\0", environ: bytes | None = b"",
              status: str | None = "Name:\ttrainer\nUid:\t0\t0\t0\t0\n",
              cgroup: str | None = "0::/init.scope\n", exe: str | None = None) -> Path:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "stat").write_text(_stat_line(pid, comm, ppid, start))
    for name, content in (("cmdline", cmdline), ("environ", environ)):
        if content is not None:
            (d / name).write_bytes(content)
    for name, text in (("status", status), ("cgroup", cgroup)):
        if text is not None:
            (d / name).write_text(text)
    if exe is not None:
        (d / "exe").symlink_to(exe)
    return d


def _env(**kv: str) -> bytes:
    return b"".join(f"{k}={v}".encode() + b"\0" for k, v in kv.items())


def _assert_clean_and_capped(attrs: r.Attributes) -> None:
    for key, value in attrs.items():
        values = value if isinstance(value, tuple) else (value,)
        for v in values:
            if isinstance(v, str):
                assert not CONTROL.search(v), key
                cap = r.MAX_COMMAND_LINE_CHARS if key == "process.command_line" else r.MAX_VALUE_CHARS
                assert len(v) <= cap, key


def test_hostile_proc_content_is_cleaned_and_capped(tmp_path: Path) -> None:
    big = b"\0".join([b"--x\x1b[31m" + b"A" * 1000] * 1100) + b"\0"  # ~1.1 MB
    environ = _env(RANK="2\x07", CUDA_VISIBLE_DEVICES="0,1\n\x1b]0;pwn\x07" + "9" * 5000,
                   OTEL_SERVICE_NAME="svc\r\n" + "s" * 1000)
    make_proc(tmp_path, 77, comm="evil) (x\x1b", cmdline=big, environ=environ, status=None, cgroup=None,
              exe="/opt/" + "e" * 300 + "/bin\x01ary")
    attrs = r.process_attributes(77, proc_root=str(tmp_path))
    _assert_clean_and_capped(attrs)
    assert len(str(attrs["process.command_line"])) == r.MAX_COMMAND_LINE_CHARS
    assert len("".join(attrs["process.command_args"])) <= r.MAX_COMMAND_LINE_CHARS  # type: ignore[arg-type]
    assert attrs["ml.rank"] == 2
    assert str(attrs["cuda.visible_devices"]).startswith("0,1]0;pwn999")
    assert attrs["service.name"] == "svc" + "s" * (r.MAX_VALUE_CHARS - 3)
    assert "process.owner" not in attrs and "container.id" not in attrs
    assert attrs["process.executable.name"] == "binary"  # base name of the whole path, not the capped one


@pytest.mark.parametrize("cmdline", [b"a" * 1_000_000, b"a " * 500_000, b"--token\0" + b"x:" * 500_000,
                                     b"pg://u:" + b"a" * 1_000_000, b"kubepods-pod" * 90_000])
def test_megabyte_single_argument_is_linear_and_capped(tmp_path: Path, cmdline: bytes) -> None:
    make_proc(tmp_path, 76, cmdline=cmdline, cgroup="0::/" + cmdline.decode().replace("\0", "/") + "\n")
    start = time.monotonic()
    attrs = r.process_attributes(76, proc_root=str(tmp_path))
    assert time.monotonic() - start < 3  # quadratic regexes took ~10 s here
    _assert_clean_and_capped(attrs)


def test_hostile_comm_with_parens_is_parsed(tmp_path: Path) -> None:
    make_proc(tmp_path, 78, comm="a) S 99 (b", ppid=42, exe=None)
    attrs = r.process_attributes(78, proc_root=str(tmp_path))
    assert attrs["process.parent_pid"] == 42
    assert attrs["process.executable.name"] == "a) S 99 (b"


def test_missing_files_give_what_can_be_read(tmp_path: Path) -> None:
    d = make_proc(tmp_path, 79, cmdline=None, environ=None, status=None, cgroup=None)
    attrs = r.process_attributes(79, proc_root=str(tmp_path), fallback_comm="fb")
    assert attrs["process.executable.name"] == "trainer"  # comm beats the fallback
    assert "process.command_line" not in attrs and "ml.rank" not in attrs
    (d / "stat").write_text("garbage")
    attrs = r.process_attributes(79, proc_root=str(tmp_path), fallback_comm="fb")
    assert attrs["process.executable.name"] == "fb" and "process.parent_pid" not in attrs


def test_vanished_pid_returns_fallback(tmp_path: Path) -> None:
    attrs = r.process_attributes(12345, proc_root=str(tmp_path), fallback_comm="python3\x00")
    assert attrs == {"process.pid": 12345, "host.name": socket.gethostname(),
                     "process.executable.name": "python3", "service.name": "python3"}
    assert r.process_attributes(12345, proc_root=str(tmp_path))["service.name"] == "unknown_service"


def test_real_exited_process_returns_fallback() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    attrs = r.process_attributes(child.pid, fallback_comm="python")
    assert attrs["process.pid"] == child.pid
    assert attrs["process.executable.name"] == "python"
    assert "process.command_line" not in attrs


@pytest.mark.parametrize(("env", "expected"), [
    ({"RANK": "1", "OMPI_COMM_WORLD_RANK": "2", "PMI_RANK": "3", "SLURM_PROCID": "4"}, 1),
    ({"OMPI_COMM_WORLD_RANK": "2", "PMI_RANK": "3", "SLURM_PROCID": "4"}, 2),
    ({"PMI_RANK": "3", "SLURM_PROCID": "4"}, 3),
    ({"SLURM_PROCID": "4"}, 4),
    ({"RANK": "abc", "SLURM_PROCID": "4"}, 4),
    ({"RANK": "-1"}, None),
    ({}, None),
])
def test_rank_precedence_torchrun_mpi_slurm(tmp_path: Path, env: dict[str, str],
                                            expected: int | None) -> None:
    make_proc(tmp_path, 80, environ=_env(**env))
    assert r.process_attributes(80, proc_root=str(tmp_path)).get("ml.rank") == expected


def test_mpi_and_slurm_normalisation(tmp_path: Path) -> None:
    make_proc(tmp_path, 81, environ=_env(
        OMPI_COMM_WORLD_SIZE="16", OMPI_COMM_WORLD_LOCAL_RANK="3", OMPI_COMM_WORLD_LOCAL_SIZE="8",
        SLURM_NTASKS="32", SLURM_LOCALID="7", SLURM_NODEID="1", SLURM_JOB_ID="4242", SLURM_STEP_ID="0",
        MASTER_ADDR="node001", AWS_SECRET_ACCESS_KEY="leak", HOME="/root"))
    attrs = r.process_attributes(81, proc_root=str(tmp_path))
    assert (attrs["ml.world_size"], attrs["ml.local_rank"], attrs["ml.local_world_size"]) == (16, 3, 8)
    assert attrs["ml.node_rank"] == 1
    assert (attrs["slurm.job.id"], attrs["slurm.step.id"]) == ("4242", "0")
    assert attrs["ml.master_addr"] == "node001"
    assert "leak" not in repr(attrs) and "/root" not in repr(attrs)


def test_service_name_precedence(tmp_path: Path) -> None:
    make_proc(tmp_path, 82, exe="/usr/bin/python3.11")
    base = {"proc_root": str(tmp_path)}
    assert r.process_attributes(82, **base)["service.name"] == "python3.11"
    assert r.process_attributes(82, service_name="job", **base)["service.name"] == "job"
    (tmp_path / "82" / "environ").write_bytes(_env(OTEL_SERVICE_NAME="llama-train"))
    assert r.process_attributes(82, service_name="job", **base)["service.name"] == "llama-train"


def test_setproctitle_and_hidden_control_chars_are_redacted(tmp_path: Path) -> None:
    make_proc(tmp_path, 83, cmdline=b"python train.py --password hunter2 --token=abc")
    assert "hunter2" not in str(r.process_attributes(83, proc_root=str(tmp_path))["process.command_line"])
    make_proc(tmp_path, 84, cmdline=b"python\0--pass\x01word=hunter2\0")
    assert r.process_attributes(84, proc_root=str(tmp_path))["process.command_args"] == (
        "python", "--password=<redacted>")


def test_deleted_executable_and_container_from_proc(tmp_path: Path) -> None:
    make_proc(tmp_path, 85, exe="/usr/bin/python3 (deleted)",
              cgroup=(DATA / "containerd_k8s_burstable_systemd_v2.txt").read_text())
    attrs = r.process_attributes(85, proc_root=str(tmp_path))
    assert attrs["process.executable.path"] == "/usr/bin/python3"
    assert (attrs["container.id"], attrs["k8s.pod.uid"]) == (C1, U1)
    assert attrs["process.owner"] == pwd.getpwuid(0).pw_name


def test_pid_reused_while_reading_drops_the_mixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_proc(tmp_path, 87, exe="/usr/bin/python3", environ=_env(RANK="5"))
    real, calls = r._stat, []

    def flaky(root: str, pid: int) -> tuple[str, int, int] | None:
        calls.append(pid)
        got = real(root, pid)
        return None if got is None else (got[0] + str(len(calls)), got[1], got[2] + len(calls) - 1)

    monkeypatch.setattr(r, "_stat", flaky)
    attrs = r.process_attributes(87, proc_root=str(tmp_path), fallback_comm="fb")
    assert attrs == {"process.pid": 87, "host.name": socket.gethostname(),
                     "process.executable.name": "fb", "service.name": "fb"}


def test_comm_change_while_reading_keeps_attributes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_proc(tmp_path, 88, environ=_env(RANK="5"))
    real, names = r._stat, iter(["python", "pt_main_thread"])

    def renamed(root: str, pid: int) -> tuple[str, int, int] | None:
        got = real(root, pid)
        return None if got is None else (next(names), got[1], got[2])

    monkeypatch.setattr(r, "_stat", renamed)
    assert r.process_attributes(88, proc_root=str(tmp_path))["ml.rank"] == 5


def test_owner_without_passwd_entry_is_numeric(tmp_path: Path) -> None:
    make_proc(tmp_path, 86, status="Uid:\t4000000123\t0\t0\t0\n")
    assert r.process_attributes(86, proc_root=str(tmp_path))["process.owner"] == "4000000123"


# --- a real child process ----------------------------------------------------------------------

@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "0",
           "SLURM_PROCID": "7", "SLURM_JOB_ID": "991", "CUDA_VISIBLE_DEVICES": "2,3",
           "MASTER_ADDR": "10.0.0.1", "MY_API_KEY": "never-exported"}
    argv = [sys.executable, "-c", "import time; time.sleep(30)", "--password=hunter2", "--tokenizer", "gpt2"]
    proc = subprocess.Popen(argv, env=env)
    deadline = time.monotonic() + 10
    while b"time.sleep" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes():  # wait for exec
        assert time.monotonic() < deadline
        time.sleep(0.01)
    yield proc
    proc.kill()
    proc.wait()


def test_real_child_every_attribute(child: subprocess.Popen[bytes]) -> None:
    attrs = r.process_attributes(child.pid)
    exe = os.path.realpath(sys.executable)
    try:
        owner = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        owner = str(os.getuid())
    expected: dict[str, object] = {
        "process.pid": child.pid, "process.parent_pid": os.getpid(),
        "process.executable.path": exe, "process.executable.name": os.path.basename(exe),
        "process.command_line": f"{sys.executable} -c import time; time.sleep(30) --password=<redacted> "
                                "--tokenizer gpt2",
        "process.command_args": (sys.executable, "-c", "import time; time.sleep(30)",
                                 "--password=<redacted>", "--tokenizer", "gpt2"),
        "process.owner": owner, "host.name": socket.gethostname(), "service.name": os.path.basename(exe),
        "ml.rank": 3, "ml.world_size": 8, "ml.local_rank": 1, "ml.local_world_size": 4, "ml.node_rank": 0,
        "slurm.job.id": "991", "cuda.visible_devices": "2,3", "ml.master_addr": "10.0.0.1",
    }
    cgroup = Path("/proc/self/cgroup").read_text()
    for key, value in (("container.id", cgroups.container_id_from_cgroup(cgroup)),
                       ("k8s.pod.uid", cgroups.pod_uid_from_cgroup(cgroup))):
        if value:
            expected[key] = value
    assert attrs == expected
    assert "hunter2" not in repr(attrs) and "never-exported" not in repr(attrs)


# --- host and agent ----------------------------------------------------------------------------

def test_host_and_agent_attributes() -> None:
    host = identity.host_attributes()
    assert host["host.name"] == socket.gethostname()
    assert host["os.type"] == "linux" and host["os.description"] == platform.release()
    assert host["host.arch"] in {"amd64", "arm64", "arm32", "ppc64", "s390x", "x86", platform.machine()}
    host["host.name"] = "mutated"
    assert identity.host_attributes()["host.name"] == socket.gethostname()
    agent = identity.agent_resource_attributes()
    assert agent["service.name"] == "otel-ebpf" and agent["service.version"] == __version__
    assert not [k for k in agent if k.startswith("telemetry.sdk")]


# --- cache -------------------------------------------------------------------------------------

def test_cache_hits_misses_and_pid_reuse(tmp_path: Path) -> None:
    make_proc(tmp_path, 90, exe="/usr/bin/first")
    cache = r.ResourceCache(proc_root=str(tmp_path))
    first = cache.get(90)
    assert cache.get(90) is first
    assert (cache.hits, cache.misses, cache.evictions) == (1, 1, 0)
    (tmp_path / "90" / "exe").unlink()
    make_proc(tmp_path, 90, start=2000, exe="/usr/bin/second")  # same pid, new process
    assert cache.get(90)["process.executable.name"] == "second"
    assert (cache.hits, cache.misses, cache.evictions) == (1, 2, 1)


def test_cache_serves_exited_pid_and_does_not_cache_vanished(tmp_path: Path) -> None:
    d = make_proc(tmp_path, 91)
    cache = r.ResourceCache(proc_root=str(tmp_path))
    known = cache.get(91)
    (d / "stat").unlink()
    assert cache.get(91, fallback_comm="x") is known
    assert cache.get(92, fallback_comm="gone")["process.executable.name"] == "gone"
    assert len(cache) == 1 and cache.misses == 2


def test_refresh_at_exec_rereads_a_live_process_and_keeps_what_was_read_when_it_is_gone(tmp_path: Path) -> None:
    # sh -c '... && CUDA_VISIBLE_DEVICES=0,1 prog': sh execs prog in place (same pid and start time)
    d = make_proc(tmp_path, 93, exe="/bin/sh", environ=_env(HOME="/root"))
    cache = r.ResourceCache(proc_root=str(tmp_path))
    assert cache.environment(93) == ({}, False)
    (d / "exe").unlink()
    make_proc(tmp_path, 93, exe="/opt/prog", environ=_env(CUDA_VISIBLE_DEVICES="0,1"))
    cache.refresh(93)  # one receiver's exec record, read while the process lives
    assert cache.environment(93) == ({"CUDA_VISIBLE_DEVICES": "0,1"}, False)
    assert cache.get(93)["process.executable.name"] == "prog"
    (d / "stat").unlink()  # exited
    cache.refresh(93)  # another receiver's copy of the same exec record, read after the exit
    assert cache.environment(93) == ({"CUDA_VISIBLE_DEVICES": "0,1"}, False)


def test_refresh_at_exec_reads_once_for_all_receivers(tmp_path: Path) -> None:
    """Every BPF receiver reports the same exec: the first refresh reads /proc, the others find an entry read
    after the exec and read nothing; a later exec is read again."""
    d = make_proc(tmp_path, 94, exe="/bin/sh")
    cache = r.ResourceCache(proc_root=str(tmp_path))
    cache.get(94)
    exec1 = time.monotonic_ns()
    (d / "exe").unlink()
    make_proc(tmp_path, 94, exe="/opt/first")
    cache.refresh(94, exec1)  # the first receiver's exec record
    assert cache.get(94)["process.executable.name"] == "first"
    (d / "exe").unlink()
    make_proc(tmp_path, 94, exe="/opt/changed-but-not-an-exec")
    for _ in range(4):  # the other receivers' copies of the same exec record
        cache.refresh(94, exec1)
    assert cache.get(94)["process.executable.name"] == "first" and cache.refreshes_skipped == 4
    cache.refresh(94, time.monotonic_ns())  # a later exec
    assert cache.get(94)["process.executable.name"] == "changed-but-not-an-exec"


def test_cache_lru_bound_and_evict(tmp_path: Path) -> None:
    for pid in range(100, 105):
        make_proc(tmp_path, pid)
    cache = r.ResourceCache(max_entries=3, proc_root=str(tmp_path))
    for pid in (100, 101, 102):
        cache.get(pid)
    cache.get(100)  # 101 is now least recent
    cache.get(103)
    assert len(cache) == 3 and cache.evictions == 1
    cache.get(101)
    assert cache.misses == 5  # 101 had been evicted
    cache.evict(103)
    cache.evict(103)
    assert len(cache) == 2 and cache.evictions == 3
    # of those, for room: 101 (then 102, pushed out when 101 came back); the exit's evict is not one
    assert cache.full_evictions() == {"resources": 2, "exec_hints": 0}


def test_cache_thread_safe_counters(tmp_path: Path) -> None:
    for pid in range(200, 210):
        make_proc(tmp_path, pid)
    cache = r.ResourceCache(max_entries=5, proc_root=str(tmp_path))

    def work() -> None:
        for i in range(200):
            cache.get(200 + i % 10)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.hits + cache.misses == 1600
    assert len(cache) <= 5 and isinstance(cache.evictions, int)
