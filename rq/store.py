"""Message directories of one queue (SPEC S3.2, S4): the only code that renames them.

Owns: id allocation (S4.1: `mkdir prep/ID`, or the no-clobber rename of a
spare directory (rq.spares) to it, is the atomic claim), the msg and
status files (S4.4, S4.6), state moves (one rename of the whole directory,
refusing to clobber, S0.3.2), the done/relayed hashdir (S3.2), attachments
(S4.8), lookup of a message by id in any state, and the message "as read"
(S4.5).  All file operations go through `fsops`, so the durability rules live
in one place: a caller that gets a return value without an exception has its
data on stable storage (when it asked for `sync`).

Readers (web, CLI, fsck) may use the read-only functions from any process;
only the owning queue process calls the mutating ones.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import threading
import time
from collections.abc import Container, Iterator
from typing import Any

from rq import jsonwire, message, protocol, spares
from rq.errors import Fail
from rq.fsops import FsOps, is_regular, md5_file, read_small, unlink_quiet

STATES = ("prep", "que", "run", "done", "relayed", "err")
HASHED = ("done", "relayed")
HIDDEN_PREFIX = ".deleting."  # a deleted message on its way out (Store.hide)
BAD_ATTACH_CHARS = set("/~?[]%|$&<>")


def new_msg_id(now: float, n: int) -> str:
    t = time.gmtime(now)
    ms = int((now - int(now)) * 1000)
    return time.strftime("%Y%m%d.%H%M.%S", t) + f".{ms:03d}.{n}"


class Store:
    def __init__(self, root: str, name: str, fs: FsOps | None = None) -> None:
        self.root = root
        self.name = name
        self.qdir = os.path.join(root, "queue", name)
        self.fs = fs or FsOps()
        self._counter = itertools.count(random.randrange(1_000_000, 9_000_000))
        self._id_lock = threading.Lock()
        self._started = time.time() + 0.001  # ids up to this ms may be an earlier process's
        self.spares: spares.Spares | None = None  # set by the owning queue process
        self.journal: Any = None  # rq.queue.journal.Journal, set by the owning queue process

    # ------------------------------------------------------------ paths
    def state_dir(self, state: str) -> str:
        return os.path.join(self.qdir, state)

    def msg_path(self, state: str, msg_id: str) -> str:
        if state in HASHED:
            return os.path.join(self.qdir, state, message.bucket(msg_id), msg_id)
        return os.path.join(self.qdir, state, msg_id)

    def relpath(self, path: str) -> str:
        return os.path.relpath(path, self.root)

    def locate(self, msg_id: str) -> tuple[str, str] | None:
        """(state, path) of `msg_id`, or None.  Tolerates a concurrent move by
        looking twice."""
        if not protocol.valid_msg_id(msg_id):
            return None
        for _ in range(2):
            for state in STATES:
                path = self.msg_path(state, msg_id)
                if os.path.isdir(path):
                    return state, path
        return None

    # ------------------------------------------------------------ reading
    @staticmethod
    def read_msg(path: str, dir_fd: int | None = None) -> dict[str, Any]:
        """The msg fields of the message directory `path` (relative to `dir_fd` when
        given: a short path lookup when a caller reads many, as start-up reads que/).
        Raises OSError, or ValueError when it is not a JSON object."""
        raw = read_small(os.path.join(path, "msg"), dir_fd, regular=True)  # RQ writes it
        try:
            data = jsonwire.loads(raw)  # the stdlib's C scanner, without json.loads' detour
        except ValueError:  # not UTF-8 (json.loads also reads UTF-16 and -32) or no JSON
            data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("msg is not a JSON object")
        return data

    @staticmethod
    def read_status_text(path: str) -> str | None:
        try:
            data = json.loads(read_small(os.path.join(path, "status")))
        except (OSError, ValueError):
            return None
        text = data.get("job_status") if isinstance(data, dict) else None
        return text if isinstance(text, str) else None

    def message_as_read(self, state: str, path: str) -> dict[str, Any]:
        """S4.5: stored fields + path, state, computed status, _attachments."""
        data = self.read_msg(path)
        data["path"] = self.relpath(path)
        data["state"] = state
        data["status"] = message.computed_status(state, self.read_status_text(path))
        attachments = self.attachments(path)
        if attachments:
            data["_attachments"] = attachments
        return data

    @staticmethod
    def attachments(path: str) -> dict[str, dict[str, Any]]:
        adir = os.path.join(path, "attach")
        out: dict[str, dict[str, Any]] = {}
        try:
            names = sorted(os.listdir(adir))
        except OSError:
            return out
        for name in names:
            full = os.path.join(adir, name)
            if name.startswith(".") or name.endswith(".tmp") or not is_regular(full):
                continue  # never follow a symlink planted in attach/ out of the message
            try:
                md5, size = md5_file(full)
            except OSError:
                continue
            out[name] = {"md5": md5, "size": size, "path": os.path.abspath(full)}
        return out

    def list_flat(self, state: str) -> list[str]:
        try:
            names = os.listdir(self.state_dir(state))
        except OSError:
            return []
        return sorted(n for n in names if protocol.valid_msg_id(n))

    def iter_hashed(self, state: str, newest_first: bool = True) -> Iterator[str]:
        """Ids under a hashdir, newest first (S3.2) or oldest first."""
        base = self.state_dir(state)
        for day in _sorted_dirs(base, newest_first):
            for hour in _sorted_dirs(os.path.join(base, day), newest_first):
                for minute in _sorted_dirs(os.path.join(base, day, hour), newest_first):
                    ids = _sorted_dirs(os.path.join(base, day, hour, minute), newest_first)
                    yield from (i for i in ids if protocol.valid_msg_id(i))

    def count_hashed(self, state: str) -> int:
        return sum(1 for _ in self.iter_hashed(state, newest_first=False))

    # ------------------------------------------------------------ writing
    def allocate(self, fields: dict[str, Any], now: float, base_url: str, *,
                 sync_prep: bool = True, msg_id: str | None = None,
                 exact: bool = False, journaled: list[bytes] | None = None
                 ) -> tuple[str, str]:
        """Create `prep/ID/` with its msg file (S4.1) and return (id, path).
        `fields` gains `msg_id` and the default `orig_msg_id`.  A `msg_id` from
        new_ids() is tried first (should it be taken meanwhile, a new one is made);
        with `exact` (a fan-out copy, rq.queue.fanoutprep) a taken one is Fail("msg id taken").

        The msg file and the ID directory are durable on return; with
        `sync_prep` the prep/ entry is too (a later commit, its rename and its
        create-journal record, makes it durable otherwise).  With a spare at hand
        (rq.spares) the msg is written and fsynced inside the spare, the spare's
        directory fsynced, and the spare renamed to prep/ID: the directory
        appears complete, with no mkdir on the request path.

        With `journaled` (a list; the msg bytes are appended to it) nothing is fsynced:
        the caller's create journal record stands for the message until the journal
        settles (rq.queue.journal)."""
        prep = self.state_dir("prep")
        durable = journaled is None
        own_orig = "orig_msg_id" not in fields
        given = msg_id
        while True:
            msg_id, given = given or self.new_ids(now, 1)[0], None
            path = os.path.join(prep, msg_id)
            fields["msg_id"] = msg_id  # the caller's dict becomes the stored fields
            if own_orig:
                fields["orig_msg_id"] = protocol.full_id(base_url, self.name, msg_id)
            data = msg_bytes(fields)
            spare = self.spares.take("msg") if self.spares is not None else None
            if spare is not None and self._publish_spare(spare, path, data, durable):
                break
            try:
                self.fs.mkdir(path)
            except FileExistsError:
                if exact:
                    raise Fail("msg id taken") from None
                continue
            try:
                self.write_file(os.path.join(path, "msg"), data, sync=durable,
                                sync_data=durable)
            except BaseException:
                _rmtree_quiet(path)
                raise
            break
        if journaled is not None:
            journaled.append(data)
        try:
            if sync_prep and durable:
                self.fs.fsync_dir_shared(prep)
        except BaseException:
            _rmtree_quiet(path)
            raise
        return msg_id, path

    def new_ids(self, now: float, n: int) -> list[str]:
        """`n` new ids in increasing order, none held by a message of the queue in
        a state after prep (S4.1; prep/ID itself is claimed by its mkdir or rename)."""
        out: list[str] = []
        while len(out) < n:
            with self._id_lock:
                msg_id = new_msg_id(now, next(self._counter))
            # An id of this process is unique by its counter; one of an earlier
            # process (flock: they never overlap) is older than this process's
            # start.  Only an id not later than that start is looked for in every
            # state (a clock set back); the no-clobber renames guard the rest.
            if now > self._started or not any(os.path.lexists(self.msg_path(s, msg_id))
                                              for s in STATES[1:]):
                out.append(msg_id)
        return out

    def _publish_spare(self, spare: str, path: str, data: bytes, durable: bool) -> bool:
        """Write (and with `durable` fsync) the msg inside `spare`, then rename it to
        `path` without clobbering.  False when the rename fails (the spare is dropped
        and the caller makes `path` itself); a failed write or fsync raises."""
        try:
            self.fs.write_file_private(os.path.join(spare, "msg"), data, sync=durable)
            if durable:
                self.fs.fsync_dir(spare)  # its `msg` entry: rq.spares fsyncs nothing
        except BaseException:
            _rmtree_quiet(spare)
            raise
        return self._rename_spare(spare, path)

    def claim_spare(self, kind: str, path: str) -> bool:
        """Rename a spare of `kind` (rq.spares) to `path`, never clobbering;
        False when there is none or the rename fails (the caller then makes
        `path` itself: a taken id, for instance, fails its mkdir too)."""
        spare = self.spares.take(kind) if self.spares is not None else None
        return spare is not None and self._rename_spare(spare, path)

    def _rename_spare(self, spare: str, path: str) -> bool:
        """No-clobber rename of `spare` to `path`; a spare that fails is dropped."""
        try:
            self.fs.rename_noreplace(spare, path)
        except OSError:
            _rmtree_quiet(spare)
            return False
        return True

    def write_msg(self, path: str, fields: dict[str, Any], *, sync: bool = True) -> None:
        """Write the msg file.  Its data is fsynced before the rename over the
        old msg even without `sync` (which adds the fsync of the directory): a
        power loss may keep the old msg, never an empty one, which would lose
        the message (found by tests/test_power_loss.py: a resent message, a
        coalesced dup and its parent rewrite their msg)."""
        self.write_file(os.path.join(path, "msg"), msg_bytes(fields), sync=sync, sync_data=True)

    def write_status(self, path: str, text: str, *, sync: bool = False,
                     fresh: bool = False) -> None:
        self.write_file(os.path.join(path, "status"),
                        protocol.dumps({"job_status": text}).encode(), sync=sync, fresh=fresh)

    def write_file(self, path: str, data: bytes, *, sync: bool = False,
                   sync_data: bool = False, fresh: bool = False) -> None:
        """fs.write_file_atomic through a spare temp file (rq.spares) when one
        is ready, else through a temp file beside `path` (also when the spare
        fails: rewriting the same content is harmless).  `fresh`: the caller
        knows `path` does not exist, so no exchange is tried (it would fail;
        a file there after all is replaced, and its inode freed)."""
        tmp = self.spares.take("file") if self.spares is not None else None
        if tmp is not None:
            try:
                if self.fs.write_file_atomic(path, data, sync=sync, sync_data=sync_data,
                                             tmp=tmp, keep_old=not fresh):
                    self.discard_file(tmp)  # the replaced file, now at tmp
                return
            except OSError:
                unlink_quiet(tmp)
        self.fs.write_file_atomic(path, data, sync=sync, sync_data=sync_data)

    def discard_file(self, path: str) -> None:
        """Remove the plain file `path` (gone already is fine); its inode is
        kept as a spare when spares are on (rq.spares.recycle)."""
        if self.spares is not None and self.spares.recycle(path):
            return
        try:
            self.fs.unlink(path)
        except FileNotFoundError:
            pass

    def move(self, msg_id: str, src: str, dst: str, *, sync: bool = True) -> str:
        """Rename the message directory from state `src` to `dst` (one rename,
        never clobbering); with `sync` the new name is durable on return."""
        new, dirs = self.move_unsynced(msg_id, src, dst)
        if sync:
            self.sync_dirs(dirs)
        return new

    def move_unsynced(self, msg_id: str, src: str, dst: str,
                      made: Container[str] = ()) -> tuple[str, list[str]]:
        """The rename of `move`; returns (new path, directories to fsync to
        make it durable), so a caller can retry the fsyncs alone after an IO
        error without renaming twice.  A hashdir bucket in `made` (made ahead,
        durable) is not looked for first; should it be gone (the cleaner), it
        is made again when the rename says so."""
        new = self.msg_path(dst, msg_id)
        parent = os.path.dirname(new)
        known = dst in HASHED and parent in made
        changed = self.fs.makedirs(parent) if dst in HASHED and not known else []
        try:
            self.fs.rename_noreplace(self.msg_path(src, msg_id), new)
        except FileNotFoundError:
            if not known:
                raise
            changed = self.fs.makedirs(parent)
            self.fs.rename_noreplace(self.msg_path(src, msg_id), new)
        return new, [*changed, parent]

    def sync_dirs(self, dirs: list[str]) -> None:
        """fsync each directory, removing it from `dirs` once done (retryable)."""
        while dirs:
            self.fs.fsync_dir(dirs[0])
            dirs.pop(0)

    def remove(self, path: str) -> None:
        """Delete a message directory: first one rename out of the state
        directory (so no reader sees half a message), then the removal."""
        hidden = self.hide(path)
        self.fs.fsync_dir(os.path.dirname(path))
        self.fs.rmtree(hidden)

    def hide(self, path: str) -> str:
        """The rename of `remove` (not yet durable: fsync the state directory):
        the message leaves every state at once; returns the hidden name, a
        `.deleting.*` directory that `remove_hidden` clears at the next start.
        A message still pending in the create journal is settled first."""
        if self.journal is not None:
            self.journal.settle_for(os.path.basename(path))
        hidden = os.path.join(self.qdir, f"{HIDDEN_PREFIX}{os.path.basename(path)}.{os.getpid()}")
        self.fs.rename(path, hidden)
        return hidden

    def remove_hidden(self) -> int:
        """Remove what a killed deletion left hidden (hide without its rmtree)."""
        try:
            names = [n for n in os.listdir(self.qdir) if n.startswith(HIDDEN_PREFIX)]
        except OSError:
            return 0
        for name in names:
            self.fs.rmtree(os.path.join(self.qdir, name))
        return len(names)

    # ------------------------------------------------------------ attachments (S4.8)
    def attach(self, path: str, pathname: str, name: str | None, local_fs_only: bool) -> str:
        """Attach the file `pathname` to the prep message at `path`; return its MD5."""
        check_attachment_source(pathname)
        name = name if name else os.path.basename(pathname)
        check_attachment_name(name)
        adir = os.path.join(path, "attach")
        if not os.path.isdir(adir):
            self.fs.mkdir(adir)
        tmp = os.path.join(adir, name + ".tmp")
        unlink_quiet(tmp)
        try:
            self.fs.link_or_copy(pathname, tmp, allow_copy=not local_fs_only)
        except OSError as exc:
            if exc.errno == 18:  # EXDEV
                raise Fail(f"Attachment must be on same filesystem as que: {pathname}") from exc
            raise
        md5, _ = md5_file(tmp)
        self.fs.rename(tmp, os.path.join(adir, name))
        self.fs.fsync_dir(adir)
        return md5

    def link_attachments(self, src_path: str, dst_path: str) -> None:
        """Hard-link (or copy) every attachment of one message into another
        (dup and clone, S4.8)."""
        sdir = os.path.join(src_path, "attach")
        if not os.path.isdir(sdir):
            return
        ddir = os.path.join(dst_path, "attach")
        self.fs.mkdir(ddir)
        for name in sorted(os.listdir(sdir)):
            full = os.path.join(sdir, name)
            if not name.startswith(".") and not name.endswith(".tmp") and is_regular(full):
                self.fs.link_or_copy(full, os.path.join(ddir, name))
        self.fs.fsync_dir(ddir)


def msg_bytes(fields: dict[str, Any]) -> bytes:
    """The msg file's content: the stored fields only (S4.4), compact JSON."""
    return protocol.dumps({k: fields[k] for k in message.STORED_FIELDS if k in fields}).encode()


def check_attachment_source(pathname: Any) -> None:
    """The S4.8 checks on the file to attach; raises Fail with the exact text."""
    if not isinstance(pathname, str) or not pathname.startswith("/"):
        raise Fail(f"Invalid pathname, must be normalized {pathname} (ie. must start with /")
    if not os.path.lexists(pathname) or not os.path.exists(pathname):
        raise Fail(f"No such file {pathname} to attach to message")
    if os.path.isdir(pathname):
        raise Fail(f"Attachment currently cannot be a directory {pathname}")
    if not os.access(pathname, os.R_OK):
        raise Fail(f"Attachment currently cannot be read: {pathname}")
    if not os.path.isfile(pathname):
        raise Fail(f"Attachment currently not of supported type: {pathname}")


def check_attachment_name(name: str) -> None:
    if name.startswith("."):
        raise Fail(f"Attachment name as a dot-file not allowed: {name}")
    if any(c in BAD_ATTACH_CHARS for c in name) or "\0" in name:
        raise Fail(f"Attachment name has invalid character. not allowed: {name}")


def _sorted_dirs(path: str, reverse: bool) -> list[str]:
    try:
        return sorted((n for n in os.listdir(path) if not n.startswith(".")), reverse=reverse)
    except OSError:
        return []


def _rmtree_quiet(path: str) -> None:
    import shutil
    shutil.rmtree(path, ignore_errors=True)
