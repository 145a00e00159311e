"""The program the python tool's sandbox runs before the user's ``main.py`` (:data:`PRELUDE`): the sandbox's
init as pid 1 (out of the program's reach), the resource limits, the network guard, then the user's code as
``__main__``. Its text only: :mod:`reinforge.sandbox` starts it."""

from __future__ import annotations

NETWORK_DENIED = "network access is disabled in this sandbox"
MSGQUEUE_BYTES = 131072  # RLIMIT_MSGQUEUE of each process: POSIX message queues (one queue of the default size fits)
SIGPENDING = 1024  # RLIMIT_SIGPENDING of each process: signals queued to its uid

# Runs before the user's code (the user's program is main.py in the working directory). Its first line writes
# START_MARK to stderr: the host takes the mark's arrival for the program's start (the start latency; a run whose
# program never started is the sandbox's failure) and removes it from the output.
# The interpreter starts with -S (no site module: the .pth files of a large environment cost 25-50 ms of
# every start); the site-packages folders come as arguments and are put on sys.path as they are.
PRELUDE = (
    r"""
import os
if os.getpid() == 1:  # the sandbox's init (bwrap --as-pid-1): out of the program's reach, the program is its child
    import _ctypes, signal  # libc's prctl through _ctypes alone: `import ctypes` costs 14 ms of each start

    class _Int(_ctypes._SimpleCData):
        _type_ = "i"

    class _Func(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL
        _restype_ = _Int

    class _Libc:
        _handle = _ctypes.dlopen(None, 2)

    _prctl = _Func(("prctl", _Libc()))
    if _prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE 0: no /proc/1/mem, ptrace or pidfd_getfd on it
        os.write(2, b"reinforge sandbox init: prctl(PR_SET_DUMPABLE, 0) failed\n")
        os._exit(125)
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # no handler: pid 1 ignores every signal sent from inside
    _child = os.fork()
    if _child:
        while True:  # reap every orphan; end with the program (the kernel then kills what is left)
            _pid, _status = os.wait()
            if _pid == _child:
                os._exit(os.WEXITSTATUS(_status) if os.WIFEXITED(_status) else 128 + os.WTERMSIG(_status))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _prctl(4, 1, 0, 0, 0)  # the program is an ordinary process (its own memory is its own)
    del _ctypes, signal, _Int, _Func, _Libc, _prctl, _child
os.write(2, b"\x00reinforge:started\x00")
import resource, sys
_mem, _fsize, _cpu, _nproc, _nofile = (int(a) for a in sys.argv[1:6])
sys.path.extend(sys.argv[6].split(os.pathsep) if sys.argv[6] else [])
resource.setrlimit(resource.RLIMIT_AS, (_mem, _mem))
resource.setrlimit(resource.RLIMIT_FSIZE, (_fsize, _fsize))
resource.setrlimit(resource.RLIMIT_CPU, (_cpu, _cpu + 1))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
resource.setrlimit(resource.RLIMIT_NOFILE, (_nofile, _nofile))
resource.setrlimit(resource.RLIMIT_MSGQUEUE, (MSGQ_LIMIT, MSGQ_LIMIT))
resource.setrlimit(resource.RLIMIT_SIGPENDING, (SIGQ_LIMIT, SIGQ_LIMIT))
if _nproc > 0:
    resource.setrlimit(resource.RLIMIT_NPROC, (_nproc, _nproc))

def _deny(*args, **kwargs):
    raise PermissionError(1, "%s")

def _guard(module):  # the network guard, put on socket and _socket as the program imports them
    for name in ("create_connection", "create_server", "getaddrinfo", "gethostbyname", "gethostbyname_ex",
                 "gethostbyaddr", "getnameinfo", "fromfd"):
        if hasattr(module, name):
            setattr(module, name, _deny)
    if module.__name__ == "socket":
        inet = (module.AF_INET, module.AF_INET6)

        class _NoInternetSocket(module.socket):
            def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
                if fileno is None and (family == -1 or family in inet):
                    _deny()
                super().__init__(family, type, proto, fileno)

        module.socket = _NoInternetSocket  # not _socket.socket: socket.socket.__init__ calls it (AF_UNIX would recurse)

class _GuardLoader:
    def __init__(self, loader):
        self.loader = loader
    def __getattr__(self, name):
        return getattr(self.loader, name)
    def create_module(self, spec):
        return self.loader.create_module(spec)
    def exec_module(self, module):
        self.loader.exec_module(module)
        _guard(module)

class _GuardFinder:  # imports socket (12 ms of CPU: enum classes) only for the programs that use it
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name not in ("socket", "_socket"):
            return None
        for finder in sys.meta_path:
            if finder is not _GuardFinder and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    spec.loader = _GuardLoader(spec.loader)
                    return spec
        return None

sys.meta_path.insert(0, _GuardFinder)

sys.argv = ["main.py"]
_path = os.path.abspath("main.py")
_main = type(sys)("__main__")  # as runpy.run_path would (its imports cost 7 ms of each start), kept as __main__
_main.__file__ = _path
sys.modules["__main__"] = _main
try:
    with open(_path, "rb") as _f:
        _code = compile(_f.read(), _path, "exec")
    exec(_code, _main.__dict__)
except SystemExit:
    raise
except BaseException as _e:  # show the user's frames only
    import traceback
    _tb = _e.__traceback__
    while _tb is not None and _tb.tb_frame.f_code.co_filename != _path:
        _tb = _tb.tb_next
    traceback.print_exception(type(_e), _e, _tb)
    for _s in (sys.stdout, sys.stderr):  # os._exit flushes nothing
        try:
            _s.flush()
        except Exception:
            pass
    os._exit(1)
""".replace('"%s"', repr(NETWORK_DENIED))
    .replace("MSGQ_LIMIT", str(MSGQUEUE_BYTES))
    .replace("SIGQ_LIMIT", str(SIGPENDING))
)
