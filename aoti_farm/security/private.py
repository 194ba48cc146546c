"""The one rule for everything outside the shared cache: private, or refused.

The shared cache has its own checks (:mod:`aoti_farm.security.safeio`, :mod:`aoti_farm.cache.manifest`:
owner, mode, links, signatures).  Everything *else* the farm creates, reads, loads or
trusts on a host -- Inductor's cache (the split build's common object and its digest,
precompiled headers), memos (ISA, loader probe, op list), the native hit path's library,
bytecode caches, worker logs, locks -- is a file another local user must not be able to
write, because a process of ours runs or trusts what is in it.  The rule, in one place:

* a directory the farm uses is created by it with mode 0700 (each missing component), or,
  when it exists, **checked**: not a symbolic link, owned by this user, writable by no
  one else; every directory above it is owned by root or this user and is not writable
  by others unless sticky (the ssh StrictModes rule, :func:`safeio.check_ancestors`);
* a file the farm trusts lies in such a directory, is a regular file (no link), owned by
  this user and writable by no one else;
* nothing lives at a predictable name in a shared directory: new files are created with
  ``O_CREAT | O_EXCL | O_NOFOLLOW`` (:func:`open_new`, or ``mkstemp``/``mkdtemp``).

An unsafe directory is refused with :class:`safeio.UnsafeFile` (``kind="insecure"``), a
one-line message naming the path and why; the command layer turns it into a one-line
error.  It is never "repaired": a directory another user could write may already hold
their files.

Where the private files live: :func:`root` is ``$XDG_CACHE_HOME/aoti-farm-private``
(else ``~/.cache/aoti-farm-private``), apart from the shared kernel cache
(``~/.cache/aoti-farm``), which other users and hosts may be allowed to write.

Inductor's cache (:func:`use_inductor_cache`): torch's default is
``$TMPDIR/torchinductor_<user>``, a predictable name in a shared directory that anyone may
create first.  Every farm process that compiles sets ``TORCHINDUCTOR_CACHE_DIR`` to
``<root>/inductor`` (or checks the one the user set) before its first compile.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import threading
from pathlib import Path

from aoti_farm.security.safeio import UnsafeFile, check_ancestors

_lock = threading.Lock()
_fallback_root: str | None = None


def _insecure(msg: str) -> UnsafeFile:
    return UnsafeFile("insecure", msg)


#: What a refusal tells the user to do about a directory (owner, mode); a file's refusal
#: names the file only (its directory is the farm's own).
_DIR_FIXES = ("; remove it or point the farm elsewhere", "; chmod 700 it or point the farm elsewhere")


def _check_stat(st: os.stat_result, what: str, *, directory: bool) -> None:
    """The rule for one path, from its ``lstat`` (or the ``fstat`` of an ``O_NOFOLLOW``
    descriptor): not a link, a directory (``directory``) or a regular file, owned by this
    user, writable by no one else.  The one place it is checked (:func:`check_dir`,
    :func:`check_file`, :func:`open_append`), so the three cannot drift apart."""
    owner_fix, mode_fix = _DIR_FIXES if directory else ("", "")
    if stat.S_ISLNK(st.st_mode):
        raise _insecure(f"{what}: is a symbolic link" + ("; a private directory must not be one" if directory else ""))
    if directory and not stat.S_ISDIR(st.st_mode):
        raise UnsafeFile("not_regular", f"{what}: not a directory")
    if not directory and not stat.S_ISREG(st.st_mode):
        raise UnsafeFile("not_regular", f"{what}: not a regular file")
    if st.st_uid != os.getuid():
        raise _insecure(f"{what}: owned by uid {st.st_uid}, not this user ({os.getuid()}){owner_fix}")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise _insecure(f"{what}: writable by group or others (mode {stat.S_IMODE(st.st_mode):o}){mode_fix}")


def check_dir(path: str | os.PathLike, *, what: str | None = None) -> str:
    """Check an existing directory against the rule; returns its absolute path.  Raises
    :class:`UnsafeFile` (``insecure``, or ``missing``)."""
    p = os.path.abspath(os.fspath(path))
    what = what or p
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        raise UnsafeFile("missing", f"{what}: missing") from None
    except OSError as e:
        raise UnsafeFile("unreadable", f"{what}: {e.strerror or e}") from None
    _check_stat(st, what, directory=True)
    check_ancestors(p)
    return p


def ensure_dir(path: str | os.PathLike, *, what: str | None = None) -> str:
    """Create ``path`` (each missing component 0700, never following a link) or check the
    existing one (:func:`check_dir`); returns its absolute path."""
    p = os.path.abspath(os.fspath(path))
    missing = []
    q = p
    while not os.path.lexists(q):
        missing.append(q)
        parent = os.path.dirname(q)
        if parent == q:
            break
        q = parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass            # a racing process of ours, or someone else's: checked below
    return check_dir(p, what=what)


def check_file(path: str | os.PathLike, *, what: str | None = None) -> os.stat_result:
    """A file the farm is about to trust (load, run, believe): a regular file, no link,
    owned by this user, writable by no one else, in a directory that passes
    :func:`check_dir`.  Returns its ``lstat``."""
    p = os.path.abspath(os.fspath(path))
    what = what or p
    check_dir(os.path.dirname(p))
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        raise UnsafeFile("missing", f"{what}: missing") from None
    _check_stat(st, what, directory=False)
    return st


def check_tree(path: str | os.PathLike, base: str | os.PathLike) -> None:
    """Every directory from ``base`` down to ``path`` (a file or directory under it)
    passes :func:`check_dir`; a file at the end passes :func:`check_file`."""
    base_p = Path(os.path.abspath(os.fspath(base)))
    p = Path(os.path.abspath(os.fspath(path)))
    check_dir(base_p)
    rel = p.relative_to(base_p)
    cur = base_p
    for part in rel.parts[:-1] if rel.parts else ():
        cur = cur / part
        check_dir(cur)
    if rel.parts:
        if os.path.isdir(p) and not os.path.islink(p):
            check_dir(p)
        else:
            check_file(p)


def root() -> str:
    """This user's private directory (0700, checked on every call):
    ``$XDG_CACHE_HOME/aoti-farm-private``, else ``~/.cache/aoti-farm-private``.  Where no
    such directory can be made (no writable home), a ``mkdtemp`` directory of this
    process's own (memos are then not kept across processes)."""
    global _fallback_root
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    d = os.path.join(base, "aoti-farm-private")
    try:
        return ensure_dir(d)
    except UnsafeFile as e:
        if e.kind != "unreadable":
            raise
    except OSError:
        pass
    with _lock:
        if _fallback_root is None or not os.path.isdir(_fallback_root):
            _fallback_root = tempfile.mkdtemp(prefix="aoti-farm-private-")
        return check_dir(_fallback_root)


def subdir(*parts: str) -> str:
    """``<root>/<parts...>``, created 0700 or checked."""
    return ensure_dir(os.path.join(root(), *parts))


# --- files ------------------------------------------------------------------------------

_NEW = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def open_new(path: str | os.PathLike, flags: int = os.O_WRONLY, mode: int = 0o600) -> int:
    """A new file at ``path``: ``O_CREAT | O_EXCL | O_NOFOLLOW`` (an existing name, a link
    included, fails with ``FileExistsError``)."""
    return os.open(path, flags | _NEW, mode)


def open_append(path: str | os.PathLike) -> int:
    """A log the user named: appended to, created 0600 if missing, never through a link,
    and only if it is this user's regular file (else :class:`UnsafeFile`)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                 | getattr(os, "O_NOCTTY", 0) | os.O_NONBLOCK, 0o600)
    try:
        _check_stat(os.fstat(fd), str(path), directory=False)
    except BaseException:
        os.close(fd)
        raise
    return fd


def new_log(prefix: str) -> str:
    """A new, empty log file of this process (0600, ``mkstemp``) in ``<root>/logs``; its
    name is unpredictable and its directory private."""
    fd, path = tempfile.mkstemp(prefix=f"{prefix}-{os.getpid()}-", suffix=".log", dir=subdir("logs"))
    os.close(fd)
    return path


def new_log_or_devnull(prefix: str) -> str:
    """:func:`new_log`, or ``os.devnull`` where no private directory can be had (a serving
    process never fails for its log: the refusal is logged once)."""
    try:
        return new_log(prefix)
    except OSError as e:
        import logging

        logging.getLogger("aoti_farm.hook").warning("no private log (%s): worker output is discarded", e)
        return os.devnull


def atomic_write(path: str | os.PathLike, data: bytes, *, tmp_dir: str | os.PathLike | None = None) -> None:
    """``data`` to ``path`` through a ``mkstemp`` file (``O_EXCL | O_NOFOLLOW``, 0600, an
    unpredictable name) in the same directory, fsync'ed and renamed over ``path``: a reader
    sees the old file or the whole new one, and no link planted in a shared directory is
    ever followed (a link at ``path`` itself is replaced, not written through)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(tmp_dir or path.parent))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)   # what open("w") gave before: reports and cache files are read by others
        os.replace(tmp, path)
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


# --- Inductor's cache -------------------------------------------------------------------


def inductor_default_dir() -> str:
    """Inductor's own default cache directory, ``$TMPDIR/torchinductor_<user>``, computed as
    ``torch._inductor.runtime.cache_dir_utils.default_cache_dir`` does (torch 2.6-2.13),
    without importing torch."""
    import getpass
    import re

    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def inductor_cache_dir() -> str:
    """The Inductor cache a farm process compiles in: ``$TORCHINDUCTOR_CACHE_DIR`` if set
    (created 0700 or checked), else ``<root>/inductor``.

    Never Inductor's default ``$TMPDIR/torchinductor_<user>``, even when the variable names
    it: Inductor's ``cache_dir()`` writes its default into the variable the first time any
    of its code asks (importing the compile path does), so a value equal to the default
    says only that Inductor ran first, not that anyone chose a shared directory."""
    env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if env and os.path.abspath(env) != os.path.abspath(inductor_default_dir()):
        return ensure_dir(env, what=f"TORCHINDUCTOR_CACHE_DIR={env}")
    return subdir("inductor")


def use_inductor_cache(*, patch_torch: bool = True) -> str:
    """Make this process compile in a private Inductor cache: set
    ``TORCHINDUCTOR_CACHE_DIR`` (children inherit it) and point the places where torch
    ignores it at the same directory.  Idempotent; returns the directory.  Raises
    :class:`UnsafeFile` for an unsafe one.

    ``patch_torch=False`` (a command's start, before it has imported torch): only the
    variable and the directory's check, and the patch of whatever part of Inductor is
    already imported; torch is not imported for it.  Every place that builds calls this
    again with the default before it builds (:class:`aoti_farm.compile.compiler.AOTICompiler`,
    the split build's common object, the compile worker), so the patch is in force
    wherever a header can be built; a command that imported torch here would pay that
    import (seconds) ahead of its bytecode cache and of Ray's start.

    The places torch ignores the variable (torch 2.6-2.13): Inductor's ``default_cache_dir``
    (``$TMPDIR/torchinductor_<user>``) in ``torch._inductor.runtime.cache_dir_utils`` /
    ``runtime_utils`` is used for precompiled headers (``codecache._HEADER_DIR``, computed
    when ``codecache`` is imported) and some on-disk caches; a ``.gch`` there is used by
    every compile.  They are patched here, the one place (:func:`_patch_torch_cache_dirs`:
    versions, upstream issues, removal condition and its differential test).
    ``tests/e2e/test_drills_env_attacks.py`` drills the squatted-cache attack it closes."""
    d = inductor_cache_dir()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = d
    _patch_torch_cache_dirs(d, import_missing=patch_torch)
    return d


@contextlib.contextmanager
def inductor_cache_scope():
    """For the length of the block, Inductor builds in this user's private cache, in a
    process that is not the farm's own (a serving process probing its CPU's ISA at
    install): ``TORCHINDUCTOR_CACHE_DIR`` is set, then restored exactly, so the program's
    own setting is left as it was.  Yields the directory."""
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    d = inductor_cache_dir()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = d
    try:
        yield d
    finally:
        if before is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = before


def _patch_torch_cache_dirs(d: str, import_missing: bool = True) -> None:
    """The one patch of a torch internal here: Inductor's ``default_cache_dir`` (in
    ``torch._inductor.runtime.cache_dir_utils``, ``runtime_utils`` and ``codecache``) returns
    ``$TORCHINDUCTOR_CACHE_DIR`` (else ``d``) instead of ``$TMPDIR/torchinductor_<user>``,
    and ``codecache._HEADER_DIR`` / ``_HEADER_LOCK_DIR`` (precompiled headers, computed at
    import) move under ``d``.  Each is patched only when present; ``import_missing=False``
    patches only the modules already imported (:func:`use_inductor_cache`).

    * Versions: the names above are those of torch 2.6 to 2.13; the differential test below
      runs on the installed torch (2.13.0 when written).  Other callers of
      ``default_cache_dir`` (``torch._inductor.cache``, ``runtime/caching``) import it from
      ``runtime_utils`` when called, so they see the patch too.
    * Upstream: pytorch/pytorch#121122 (open: the default under the shared temp directory)
      and the deliberate choice in pytorch/pytorch#144002 to keep precompiled headers in
      ``default_cache_dir``, outside ``TORCHINDUCTOR_CACHE_DIR``.
    * It can go when torch's default is a per-user private directory (#121122) and the
      precompiled headers follow ``cache_dir()``.
    * Differential test: ``tests/e2e/test_private_patch_differential.py`` compiles the same
      signatures through the farm's compile path with and without it: bitwise-identical
      kernel outputs; only these directories differ."""
    import sys

    def private_cache_dir() -> str:
        return os.environ.get("TORCHINDUCTOR_CACHE_DIR") or d

    private_cache_dir.aoti_farm_private = True  # type: ignore[attr-defined]
    for name in ("torch._inductor.runtime.cache_dir_utils", "torch._inductor.runtime.runtime_utils",
                 "torch._inductor.codecache"):
        mod = sys.modules.get(name)
        if mod is None and import_missing and name != "torch._inductor.codecache":
            try:
                __import__(name)
            except Exception:  # noqa: BLE001 -- a torch without it: nothing to patch
                continue
            mod = sys.modules.get(name)
        if mod is not None and callable(getattr(mod, "default_cache_dir", None)):
            mod.default_cache_dir = private_cache_dir
    cc = sys.modules.get("torch._inductor.codecache")
    if cc is not None and isinstance(getattr(cc, "_HEADER_DIR", None), str):
        cc._HEADER_DIR = os.path.join(d, "precompiled_headers")
        cc._HEADER_LOCK_DIR = os.path.join(cc._HEADER_DIR, "locks")
