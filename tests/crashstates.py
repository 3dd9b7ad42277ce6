"""Crash states from an operation log (rq/fsrecord.py): the model of issue 13's power-loss test.

A copy of the root taken before the run plus the log of every primitive the run's processes
applied give the disk after a power loss at any log position k, under a pessimistic model of
what a crash keeps (in the spirit of ALICE, Pillai et al., OSDI 2014):

* a name change (mkdir, file creation, rename, link, unlink) is *certain* once its directory
  was fsynced before k; for a rename, the destination's directory.  A rename is atomic (both
  entries change together or neither: ext4 and XFS journal them in one transaction);
* a file's content is certain once that file was fsynced before k; until then the file may
  hold its previous content (a new file: nothing, the zero-length file of delayed allocation);
* an operation that a certain one needs (the creation, or the last move, of the directory a
  certain rename moves or puts something into) is certain too;
* every other operation before k may or may not have reached the disk, in any combination
  (a reordering of unsynced writes is just another subset), except that an operation whose
  object was not where it acted in that state (a rename of a directory whose creation was
  lost), or that needs a lost one (a rename into a directory whose mkdir was lost), is lost
  too;
* a syncfs makes every earlier operation certain (the create journal's settle);
* the event log is never fsynced (S13.1): each file keeps a prefix of its appends, possibly
  with a torn last line.

The model works on nodes (inodes), not names: a write into `que/ID/status` after the rename
`prep/ID -> que/ID` was lost lands in `prep/ID/status`, as it would on a disk.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import Any

from rq.fsrecord import read_log

MODES = ("all", "certain", "random", "ordered")
SYNCS = ("fsync", "fsyncdir", "syncfs")


@dataclass
class Effect:
    pos: int                  # index of its record in the log
    kind: str                 # link, rename, unlink, content, fsync, fsyncdir
    node: int
    parent: int = -1          # link/unlink: the directory; rename: the source directory
    name: str = ""
    dparent: int = -1         # rename: the destination directory and name
    dname: str = ""
    data: bytes = b""
    cover: int = 1 << 62      # position of the first fsync that makes it certain
    deps: list[int] = field(default_factory=list)  # effects (indices) it needs


class Tree:
    """Directories as {name: node}, files as content, node 0 the root."""

    def __init__(self) -> None:
        self.dirs: dict[int, dict[str, int]] = {0: {}}
        self.files: dict[int, bytes] = {}
        self.modes: dict[int, int] = {}
        self.next = 1

    def new(self, is_dir: bool) -> int:
        nid, self.next = self.next, self.next + 1
        if is_dir:
            self.dirs[nid] = {}
        else:
            self.files[nid] = b""
        return nid

    def copy(self) -> Tree:
        out = Tree()
        out.dirs = {k: dict(v) for k, v in self.dirs.items()}
        out.files = dict(self.files)
        out.modes = self.modes
        out.next = self.next
        return out

    def load(self, top: str, nid: int = 0) -> None:
        for entry in os.scandir(top):
            st = entry.stat(follow_symlinks=False)
            if entry.is_dir(follow_symlinks=False):
                child = self.new(True)
                self.load(entry.path, child)
            elif entry.is_file(follow_symlinks=False):
                child = self.new(False)
                with open(entry.path, "rb") as fh:
                    self.files[child] = fh.read()
            else:
                continue  # sockets and symlinks: none in a stopped test root
            self.modes[child] = st.st_mode & 0o7777
            self.dirs[nid][entry.name] = child

    def write_to(self, top: str, nid: int = 0) -> None:
        for name, child in self.dirs[nid].items():
            path = os.path.join(top, name)
            if child in self.dirs:
                os.mkdir(path, self.modes.get(child, 0o755))
                self.write_to(path, child)
            else:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                             self.modes.get(child, 0o644))
                os.write(fd, self.files[child])
                os.close(fd)


class Recording:
    """A recorded run: the effects of its log resolved to nodes, ready to build states."""

    def __init__(self, snapshot: str, root: str, log_path: str) -> None:
        self.root = root
        self.base = Tree()
        self.base.load(snapshot)
        self.records = read_log(log_path)
        self.effects: list[Effect] = []
        self.appends: dict[str, list[tuple[int, bytes]]] = {}  # event file -> (pos, data)
        self.acks: list[tuple[int, dict[str, Any]]] = []
        self.gaps: list[str] = []  # operations on names the log never created
        self.final = self.base.copy()
        self._placed: dict[int, int] = {}  # node -> effect that last put it where it is
        for pos, rec in enumerate(self.records):
            self._compile(pos, rec)
        for nid in self.final.dirs.keys() - self.base.dirs.keys():  # made by the run: empty
            self.base.dirs[nid] = {}                                 # until its effects apply
        for nid in self.final.files.keys() - self.base.files.keys():
            self.base.files[nid] = b""
        self._cover()

    # ------------------------------------------------------------ compiling the log
    def _rel(self, path: str) -> list[str] | None:
        rel = os.path.relpath(path, self.root)
        return None if rel.startswith("..") else [p for p in rel.split(os.sep) if p != "."]

    def _lookup(self, parts: list[str]) -> int | None:
        nid: int | None = 0
        for part in parts:
            if nid not in self.final.dirs:
                return None
            nid = self.final.dirs[nid].get(part)
            if nid is None:
                return None
        return nid

    def _parent(self, path: str) -> tuple[int, str] | None:
        parts = self._rel(path)
        if not parts:
            return None
        parent = self._lookup(parts[:-1])
        if parent is None or parent not in self.final.dirs:
            self.gaps.append(path)
            return None
        return parent, parts[-1]

    def _add(self, eff: Effect) -> None:
        self.effects.append(eff)
        idx = len(self.effects) - 1
        if eff.kind in ("link", "rename", "unlink"):
            eff.deps += [self._placed[p] for p in (eff.parent, eff.dparent) if p in self._placed]
            if eff.kind != "link" and eff.node in self._placed:
                eff.deps.append(self._placed[eff.node])
        if eff.kind in ("link", "rename"):
            self._placed[eff.node] = idx
        self._apply(self.final, eff)

    def _compile(self, pos: int, rec: dict[str, Any]) -> None:
        op = rec["op"]
        if op == "ack":
            self.acks.append((pos, rec))
        elif op == "append":
            self.appends.setdefault(rec["path"], []).append((pos, rec["data"]))
        elif op in ("mkdir", "write"):
            where = self._parent(rec["path"])
            if where is None:
                return
            parent, name = where
            node = self.final.dirs[parent].get(name)
            if node is None:
                node = self.final.new(op == "mkdir")
                self._add(Effect(pos, "link", node, parent, name))
            if op == "write":
                self._add(Effect(pos, "content", node, data=rec["data"]))
        elif op == "syncfs":  # every earlier write of the filesystem (rq.queue.journal)
            self._add(Effect(pos, "syncfs", 0))
        elif op in ("fsync", "fsyncdir"):
            parts = self._rel(rec["path"])
            node = None if parts is None else self._lookup(parts)
            if node is None:
                self.gaps.append(rec["path"])
                return
            self._add(Effect(pos, op, node))
        elif op in ("rename", "link"):
            src, dst = self._parent(rec["src"]), self._parent(rec["dst"])
            if src is None or dst is None:
                return
            node = self.final.dirs[src[0]].get(src[1])
            if node is None:
                self.gaps.append(rec["src"])
                return
            if op == "link":
                self._add(Effect(pos, "link", node, dst[0], dst[1]))
            else:
                self._add(Effect(pos, "rename", node, src[0], src[1], dst[0], dst[1]))
        elif op in ("unlink", "rmtree"):
            where = self._parent(rec["path"])
            if where is None:
                return
            node = self.final.dirs[where[0]].get(where[1])
            if node is None:
                self.gaps.append(rec["path"])
                return
            self._add(Effect(pos, "unlink", node, where[0], where[1]))
        else:
            raise ValueError(f"unknown operation in the log: {op}")

    def _cover(self) -> None:
        """Each effect's first covering fsync: of its directory (the destination's for a
        rename) for a name change, of the file for content."""
        pending: dict[tuple[str, int], list[Effect]] = {}
        for eff in self.effects:
            if eff.kind == "syncfs":
                for waiting in (w for ws in pending.values() for w in ws):
                    waiting.cover = eff.pos
                pending.clear()
            elif eff.kind in ("fsync", "fsyncdir"):
                key = ("content" if eff.kind == "fsync" else "names", eff.node)
                for waiting in pending.pop(key, []):
                    waiting.cover = eff.pos
            elif eff.kind == "content":
                pending.setdefault(("content", eff.node), []).append(eff)
            else:
                target = eff.dparent if eff.kind == "rename" else eff.parent
                pending.setdefault(("names", target), []).append(eff)

    # ------------------------------------------------------------ building states
    @staticmethod
    def _apply(tree: Tree, eff: Effect) -> bool:
        """Apply one effect; False when its object is not where it acted in this state
        (the operation is lost too)."""
        if eff.kind == "link":
            tree.dirs[eff.parent][eff.name] = eff.node
        elif eff.kind == "content":
            tree.files[eff.node] = eff.data
        elif eff.kind in ("rename", "unlink"):
            if tree.dirs[eff.parent].get(eff.name) != eff.node:
                return False
            del tree.dirs[eff.parent][eff.name]
            if eff.kind == "rename":
                tree.dirs[eff.dparent][eff.dname] = eff.node
        return True

    def certain(self, k: int) -> set[int]:
        """The effects (indices) that a crash at log position k certainly kept."""
        keep = {i for i, e in enumerate(self.effects) if e.pos < k and e.cover < k
                and e.kind not in SYNCS}
        todo = list(keep)
        while todo:
            for dep in self.effects[todo.pop()].deps:
                if dep not in keep:
                    keep.add(dep)
                    todo.append(dep)
        return keep

    def choose(self, k: int, mode: str, rng: random.Random) -> set[int]:
        before = [i for i, e in enumerate(self.effects)
                  if e.pos < k and e.kind not in SYNCS]
        if mode == "all":
            return set(before)
        keep = self.certain(k)
        maybe = [i for i in before if i not in keep]
        if mode == "random":
            p = rng.uniform(0.1, 0.9)
            keep.update(i for i in maybe if rng.random() < p)
        elif mode == "ordered":  # names in journal order up to a cut, contents at random
            names = [i for i in maybe if self.effects[i].kind != "content"]
            keep.update(names[:rng.randint(0, len(names))])
            keep.update(i for i in maybe if self.effects[i].kind == "content"
                        and rng.random() < 0.5)
        return keep

    def build(self, k: int, mode: str, rng: random.Random, target: str) -> list[dict[str, Any]]:
        """Write the state after a crash at log position k into the new directory `target`;
        return the acknowledgements logged before k."""
        tree = self.base.copy()
        applied: set[int] = set()
        for i in sorted(self.choose(k, mode, rng)):
            # lost with what it needs: a rename into a directory whose mkdir was lost
            if all(dep in applied for dep in self.effects[i].deps) \
                    and self._apply(tree, self.effects[i]):
                applied.add(i)
        os.mkdir(target)
        tree.write_to(target)
        self._write_events(k, mode, rng, target)
        return [rec for pos, rec in self.acks if pos < k]

    def _write_events(self, k: int, mode: str, rng: random.Random, target: str) -> None:
        for path, appends in self.appends.items():
            parts = self._rel(path)
            if not parts:
                continue
            chunks = [data for pos, data in appends if pos < k]
            n = len(chunks) if mode == "all" else rng.randint(0, len(chunks))
            data = b"".join(chunks[:n])
            if n < len(chunks) and mode != "all" and rng.random() < 0.5:
                data += chunks[n][:rng.randint(1, len(chunks[n]) - 1)]  # a torn last line
            full = os.path.join(target, *parts)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "ab") as fh:
                fh.write(data)

    def crash_points(self) -> list[int]:
        """Positions worth a crash: just before and just after each fsync, ack and name
        change (between two of them nothing new can become certain or visible)."""
        points = {0, len(self.records)}
        for eff in self.effects:
            points.update((eff.pos, eff.pos + 1))
        for pos, _ in self.acks:
            points.update((pos, pos + 1))
        return sorted(points)
