"""The warm parent of a grading worker's kernels: runs *inside* the bubblewrap sandbox (see
:mod:`grader.warm` for the grader's side and ``docs/design.md`` for the threat model).

It starts as a cold kernel would (same sandbox, same environment, the student edition of
``course_utils``), imports once what every kernel imports (:data:`PRELOAD`), and then only forks.
For each kernel the grader asks for, over the one socket it inherited (file descriptor ``argv[1]``):

* ``A`` (a fork of this parent) moves into new user, mount, PID, IPC, UTS and network namespaces
  (``unshare(2)`` through ctypes: Python 3.11 has no ``os.unshare``) and forks
* ``B``, PID 1 of the new PID namespace: it lays out the notebook's file system as a cold sandbox
  has it (a fresh in-memory ``/tmp`` with ``work`` and ``home``; the notebook's hand-off folder,
  hidden inputs and cut-down reference bound where a cold kernel sees them; the grader's staging
  folder hidden), drops every capability (and the bounding set: no ``execve`` gets them back), and
  forks
* ``C``, the kernel (PID 2, as under bubblewrap): every inherited file descriptor closed, signal
  handlers at their defaults, the kernel's environment, random generators seeded as a cold kernel's,
  ``ipykernel`` started in-process. ``B`` reaps orphans and leaves with ``C``; when ``B`` dies the
  kernel (the grader ``SIGKILL``-s it) every process of the namespace dies with it.

Nothing here imports from a place a kernel can write after :func:`serve` has preloaded, and this
module imports nothing of ``grader`` (the sandbox does not show it; the grader binds this one file).

Run as ``zygote.py FD plain-fork`` (the tests' kernels, ``tests/support/warm_kernel.py``: the course's own
notebooks, no sandbox), the parent forks each kernel straight away, in a session of its own, with the
working folder and umask the kernel manager asks for; it ends when the process that started it closes its
channel (or ends), and each kernel dies with it.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
import traceback

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 28, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
#: SECBIT_NOROOT, SECBIT_NO_SETUID_FIXUP and SECBIT_KEEP_CAPS off, each with its lock: uid 0 gains nothing on execve.
SECUREBITS = 0x01 | 0x02 | 0x04 | 0x08 | 0x20
#: What every kernel imports (the notebooks' first cells, ipykernel, the checks): imported once, here.
PRELOAD = ["numpy", "torch", "matplotlib", "matplotlib.pyplot", "IPython", "ipykernel.kernelapp",
           "ipykernel.ipkernel", "ipykernel.zmqshell", "zmq", "tornado.ioloop", "course_utils"]
#: Never imported here: the kernel sees its own (the stub or the first try's cut-down reference).
NEVER = ("course_utils.reference", "course_utils.instructor")
#: The backend ipykernel gives matplotlib where the environment names none (``IPKernelApp.init_gui_pylab``):
#: matplotlib reads it once, at its import, which here comes before the kernel's.
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"

_libc = ctypes.CDLL(None, use_errno=True)
_IMPORTED_ENV: dict[str, str] = {}


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _bind(source: str, target: str, read_only: bool) -> None:
    _mount(source, target, None, MS_BIND | MS_REC)
    if read_only:
        _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _preload(meta: bool, plain: bool = False) -> dict:
    """Import what every kernel imports, as a kernel started in this environment would (matplotlib with the
    backend the environment or ipykernel names). Any warning shown meanwhile is listed in ``warned``: a
    kernel forked from here would not show it again (Python and PyTorch warn once). ``plain``: the tests'
    parent, of the instructor edition, whose kernels import the reference anyway."""
    import importlib
    import pkgutil
    import warnings

    started = time.perf_counter()
    if not os.environ.get("MPLBACKEND"):
        os.environ["MPLBACKEND"] = INLINE_BACKEND
    before = dict(os.environ)
    # Warnings shown are recorded, not printed; the filters the imports add stay (catch_warnings would drop them).
    shown: list = []
    show = warnings.showwarning
    warnings.showwarning = lambda message, category, *_, **__: shown.append(f"{category.__name__}: {message}")
    try:
        skipped = _imports(meta, importlib, pkgutil)
    finally:
        warnings.showwarning = show
    # What the imports set in the environment (torch._dynamo: TORCHINDUCTOR_CACHE_DIR): set in each kernel
    # too, as in a kernel that imported them itself.
    _IMPORTED_ENV.update({k: v for k, v in os.environ.items() if before.get(k) != v})
    leaked = [m for m in sys.modules if m.startswith(NEVER)]
    if leaked and not plain:
        raise RuntimeError(f"the warm parent imported {leaked}: a kernel must import its own reference")
    tasks = len(os.listdir("/proc/self/task"))
    if tasks != 1:
        raise RuntimeError(f"the warm parent runs {tasks} threads after its imports: forking it is unsafe")
    # Where each top-level package imported here was found: a kernel whose working folder (first on its
    # path) would find another must not be forked from here.
    origins = {name: getattr(module, "__file__", None) for name, module in sys.modules.items()
               if "." not in name and getattr(module, "__file__", None)}
    return {"ready": True, "seconds": round(time.perf_counter() - started, 2), "modules": len(sys.modules),
            "skipped": skipped, "warned": shown,
            "origins": origins}


def _imports(meta: bool, importlib, pkgutil) -> list[str]:
    for name in PRELOAD:
        importlib.import_module(name)
    import course_utils

    skipped = []
    for info in pkgutil.walk_packages(course_utils.__path__, "course_utils."):
        if info.name.startswith(NEVER) or ".bench" in info.name:
            continue
        try:
            importlib.import_module(info.name)
        except Exception as exc:  # noqa: BLE001 - a module a kernel cannot import is imported by none
            skipped.append(f"{info.name}: {type(exc).__name__}")
    import torch

    # What the checks load lazily on their first meta-device operation (torch._dynamo, sympy): about 1 CPU-s,
    # for notebooks 04 to 10 only.
    try:
        if not meta:
            raise StopIteration
        a = torch.empty(2, 3, 4, device="meta")
        (torch.nn.functional.scaled_dot_product_attention(a, a, a) + a.softmax(-1)).sum()
        torch.nn.Linear(4, 4, device="meta")(a)
        import torch._dynamo  # noqa: F401
    except StopIteration:
        pass
    except Exception as exc:  # noqa: BLE001
        skipped.append(f"meta warm-up: {type(exc).__name__}")
    return skipped


def serve(fd: int, meta: bool = True, plain: bool = False) -> None:
    """Preload (with ``meta``, the meta device's lazy imports too), then answer the grader's requests on
    ``fd`` (one JSON line each) until it closes. ``plain``: fork each kernel as it is, no namespaces
    (:func:`_fork`)."""
    import socket

    _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")  # no kernel reads or traces us
    # Its own folder off the path, as ipykernel_launcher takes the working folder off a cold kernel's before
    # it imports (IPython puts '' back, after the standard library, when the kernel starts).
    del sys.path[0]
    channel = socket.socket(fileno=fd)
    reader = channel.makefile("r", encoding="utf-8")
    try:
        hello = _preload(meta, plain)
    except Exception as exc:  # noqa: BLE001 - the grader falls back to cold kernels and says why
        hello = {"ready": False, "error": f"{type(exc).__name__}: {exc}"}
    channel.sendall((json.dumps(hello) + "\n").encode())
    if not hello["ready"]:
        return
    for line in reader:
        _reap()
        try:
            reply = {"pid": _fork(json.loads(line)) if plain else _spawn(json.loads(line), fd)}
        except Exception as exc:  # noqa: BLE001 - one request's failure: the grader uses a cold kernel
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        channel.sendall((json.dumps(reply) + "\n").encode())


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _forked(child, *close: int) -> tuple[int, bool]:
    """Fork a child that dies with this process (``PR_SET_PDEATHSIG``), closes ``close`` and runs
    ``child(ready_w)``, which writes ``b"ok"`` to the pipe ``ready_w`` once it is ready and never returns (the
    child leaves through ``os._exit``, whatever happens). ``(its PID, whether it said ok)``, once it has
    said so or ended. The one fork-and-handshake of this module: ``plain-fork`` kernels, and A's fork of B."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            for fd in close:
                os.close(fd)
            _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
            child(ready_w)
        except BaseException:  # noqa: BLE001
            traceback.print_exc()
        os._exit(1)
    os.close(ready_w)
    word = os.read(ready_r, 8)
    os.close(ready_r)
    return pid, word == b"ok"


def _fork(request: dict) -> int:
    """A kernel forked as it is (``plain-fork``): the leader of a session of its own (the kernel manager
    signals its process group, as a cold kernel's), dying with this parent. Its PID once it leads."""
    def kernel(ready_w: int) -> None:
        os.setsid()
        os.write(ready_w, b"ok")
        _kernel(request)

    pid, ok = _forked(kernel)
    if not ok:
        raise RuntimeError("the forked kernel did not start")
    return pid


def _spawn(request: dict, channel_fd: int) -> int:
    """Fork ``A`` (which forks ``B`` and ``C``, see the module docstring); B's PID here, once B says the
    kernel's file system is ready. This parent writes A's user and group maps itself (it owns A's new
    user namespace), so no fork of it is ever dumpable."""
    import select

    report_r, report_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # A
        try:
            os.close(report_r)
            os.close(go_w)
            os.close(channel_fd)
            _a(request, report_w, go_r)
        except BaseException:  # noqa: BLE001
            traceback.print_exc()
        os._exit(1)
    os.close(report_w)
    os.close(go_r)

    def read(timeout: float) -> bytes:
        ready, _, _ = select.select([report_r], [], [], timeout)
        return os.read(report_r, 64) if ready else b""

    try:
        if read(30) != b"u":
            raise RuntimeError("the fork could not make its namespaces")
        uid, gid = os.getuid(), os.getgid()
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/{pid}/{name}", "w") as f:
                f.write(text)
        os.write(go_w, b"m")
        data = read(60)
    finally:
        os.close(report_r)
        os.close(go_w)
    if not data.strip().isdigit():
        raise RuntimeError("the forked kernel did not start" + (f": {data.decode(errors='replace')}" if data else ""))
    return int(data)


def _a(request: dict, report_w: int, go_r: int) -> None:
    _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET),
           "unshare")
    os.write(report_w, b"u")
    if os.read(go_r, 1) != b"m":  # the parent has written this namespace's maps
        os._exit(1)
    os.close(go_r)
    # B: if A goes, B goes, and with it every process of the kernel's namespaces.
    pid, ok = _forked(lambda ready_w: _b(request, ready_w), report_w)
    os.write(report_w, str(pid).encode() if ok else b"B failed")
    os.close(report_w)
    _, status = os.waitpid(pid, 0)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def _layout(request: dict) -> None:
    """The kernel's file system, as a cold sandbox has it (``grader/sandbox.py``): a fresh /tmp (with the
    read-only folders the sandbox shows under /tmp, ``keep``, bound again from the old one, which is then
    unmounted), and this notebook's folders (``sources``, relative to the staging folder) bound where a cold
    kernel has them.
    The staging folder itself is then out of reach: hidden under a tmpfs (or the fresh /tmp), and its
    one bind (the stash) undone."""
    stash, sources, warm_root = request["stash"], request["sources"], request["warm_root"]
    keep, old_tmp = request.get("keep", []), request.get("old_tmp", "")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _bind(warm_root, stash, read_only=False)  # before /tmp hides it
    if keep:  # the course's own files live under /tmp (a CI checkout, say): keep them in sight, as a cold sandbox does
        _bind("/tmp", old_tmp, read_only=False)
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={request['tmp_size']},mode=0755")
    for path in keep:  # parents first; each bound with what is mounted below it (the student edition's masks)
        os.makedirs(path, exist_ok=True)
        _bind(old_tmp + path[len("/tmp"):], path, read_only=True)
    if keep:
        _check(_libc.umount2(old_tmp.encode(), MNT_DETACH), "umount the old /tmp")
    if os.path.isdir(warm_root):  # the staging folder, where it is not under /tmp
        _mount("tmpfs", warm_root, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
    for folder in ("/tmp/work", "/tmp/home/.matplotlib"):
        os.makedirs(folder, exist_ok=True)
    for name in request["fonts"]:
        target = f"/tmp/home/.matplotlib/{name}"
        open(target, "w").close()
        _bind(f"{request['fonts_dir']}/{name}", target, read_only=True)
    os.makedirs(request["socket_dir"], exist_ok=True)
    _bind(f"{stash}/{sources['sockets']}", request["socket_dir"], read_only=False)
    if request.get("probe_dir"):
        for key, target, read_only in (("probe", request["probe_dir"], False),
                                       ("inputs", request["probe_inputs_dir"], True)):
            os.makedirs(target, exist_ok=True)
            _bind(f"{stash}/{sources[key]}", target, read_only=read_only)
    if request.get("reference"):
        _bind(f"{stash}/{sources['reference']}", request["reference"], read_only=True)
    _check(_libc.umount2(stash.encode(), MNT_DETACH), "umount stash")


def _drop_capabilities() -> None:
    """No capability left, none to gain: the kernel cannot undo the layout (unmount what hides the
    parent's /tmp and the staging folder)."""
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() not in (22,):  # EINVAL: no such cap
            raise OSError(ctypes.get_errno(), f"PR_CAPBSET_DROP {cap}")
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    _check(_libc.prctl(PR_SET_SECUREBITS, SECUREBITS, 0, 0, 0), "prctl(PR_SET_SECUREBITS)")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    header, data = Header(0x20080522, 0), (Data * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")


def _loopback_up() -> None:
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH", b"lo", 0)))[1]  # SIOCGIFFLAGS
        fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 1))  # SIOCSIFFLAGS, IFF_UP


def _b(request: dict, ready_w: int) -> None:
    """PID 1 of the kernel's namespaces: lay out, drop capabilities, fork the kernel, reap until it ends."""
    _layout(request)
    try:
        _loopback_up()
    except OSError:
        pass  # as good as a cold sandbox's network: none
    _drop_capabilities()
    pid = os.fork()
    if pid == 0:  # C
        try:
            os.close(ready_w)
            _kernel(request)
        except BaseException:  # noqa: BLE001
            traceback.print_exc()
        os._exit(1)
    os.write(ready_w, b"ok")
    os.close(ready_w)
    os.closerange(3, _max_fd())
    while True:  # init: reap every orphan; leave with the kernel
        try:
            done, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(0)
        except InterruptedError:
            continue
        if done == pid:
            os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def _max_fd() -> int:
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (ValueError, OSError):
        return 65536


def _kernel(request: dict) -> None:
    """C: the kernel, in-process, as ``python -m ipykernel_launcher -f CONNECTION_FILE`` would be, in
    ``request``'s ``cwd`` (the sandbox's /tmp/work by default), under its ``umask``, with the signals the
    kernel manager's process ignores (``ignored``) ignored."""
    os.closerange(3, _max_fd())
    # Signals: as a program the kernel manager starts has them (those it ignores stay ignored through exec),
    # then as Python sets them at start.
    ignored = set(request.get("ignored", []))
    for sig in range(1, signal.NSIG):
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(sig, signal.SIG_IGN if sig in ignored else signal.SIG_DFL)
        except (OSError, ValueError, RuntimeError):
            pass
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # as Python sets them at start (a write past the file size
        signal.signal(sig, signal.SIG_IGN)      # limit raises OSError, it does not kill the kernel)
    _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # its own processes may trace it, as in a cold kernel
    os.environ.clear()
    os.environ.update({**_IMPORTED_ENV, **request["env"]})
    cwd = request.get("cwd", "/tmp/work")
    os.chdir(cwd)
    os.umask(request.get("umask", 0o022))
    import random

    import numpy
    import torch

    # Seeded afresh from the system's entropy, as a fresh interpreter seeds each (torch too, since 2.0).
    random.seed()
    numpy.random.seed()
    torch.seed()
    import importlib.util

    import ipykernel.kernelapp

    launcher = importlib.util.find_spec("ipykernel_launcher")
    sys.argv = [launcher.origin if launcher else "ipykernel_launcher", "-f", request["connection_file"]]
    # Traits whose defaults ipykernel reads from the environment when it is imported (here: the parent's).
    app = ipykernel.kernelapp.IPKernelApp.instance(parent_handle=int(os.environ.get("JPY_PARENT_PID") or 0),
                                                   interrupt=int(os.environ.get("JPY_INTERRUPT_EVENT") or 0))
    app.initialize(["-f", request["connection_file"]])
    app.start()
    os._exit(0)


if __name__ == "__main__":
    serve(int(sys.argv[1]), meta=sys.argv[2:] != ["plain"], plain=sys.argv[2:] == ["plain-fork"])
