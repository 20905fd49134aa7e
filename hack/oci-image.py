#!/usr/bin/env python3
"""A daemonless builder for the subset of Dockerfile this repository uses, writing docker-archive tars.

    hack/oci-image.py --target spearlet --context base=DIR --context bin=DIR \\
        --tag spear.local/spearlet:e2e --output spearlet.tar [--file Dockerfile]
    hack/oci-image.py --verify spearlet.tar...

It reads the same Dockerfile that `docker build` reads (so the Dockerfile stays the one recipe) and
builds one `--target` stage. The subset, anything else failing loudly:

    FROM scratch [AS name]
    COPY [--from=name] [--chown=uid:gid] [--chmod=octal] src... dest   (no wildcards, no $VAR)
    USER, ENTRYPOINT ["exec", "form"], CMD ["exec", "form"], ENV k=v..., WORKDIR, LABEL k=v...

`--from=name` resolves as BuildKit does: a `--context name=DIR` first (it replaces a stage of the
same name), then an earlier stage; a COPY without `--from` reads the main context (`--main-context`,
default: the Dockerfile's directory), filtered by its `.dockerignore`. COPY follows Docker's rules:
a directory source copies its contents into dest; a file goes to dest, or into it when dest ends
in `/` or is a directory; missing parents of dest are created (0755, owned as --chown); symlinks
are copied as symlinks except a source path itself, which is followed. WORKDIR must name a
directory that exists in the stage (BuildKit would create it: we refuse rather than guess its
owner). A FROM scratch stage starts with BuildKit's default `PATH` in its config.

Output: with `--oci-layout DIR --platform linux/amd64|linux/arm64`, the platform's image added to a
multi-platform OCI image layout (hack/oci_layout.py; what hack/release.sh writes and pushes);
otherwise a docker-archive (what `docker save` writes and `ctr images import` and `docker load`
read): one uncompressed layer tar per COPY, `<sha256>.json` config, `manifest.json`. Layers are
deterministic: entries sorted, mtime 0, uid/gid 0 unless --chown, no user or group names, modes from
--chmod or the source files, hard links within a layer kept as links. The config has no dates, so the
same inputs give the same image ID (printed on stdout). Python 3.11 standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shlex
import stat
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field, replace

import oci_layout  # hack/oci_layout.py, beside this file

DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # BuildKit's
SUPPORTED = {"FROM", "COPY", "USER", "ENTRYPOINT", "CMD", "ENV", "WORKDIR", "LABEL"}


class BuildError(Exception):
    pass


# --- Dockerfile parsing ---------------------------------------------------------------------------


@dataclass
class Instruction:
    line: int
    keyword: str
    rest: str
    original: str


def parse_dockerfile(text: str, path: str) -> list[Instruction]:
    out: list[Instruction] = []
    buf: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        # Comment lines (including parser directives such as `# syntax=`) are dropped, also in the
        # middle of a continued instruction, as Docker does.
        if stripped.startswith("#") or (not stripped and not buf):
            continue
        if not buf:
            start = number
        if stripped.endswith("\\"):
            buf.append(stripped[:-1].strip())
            continue
        buf.append(stripped)
        joined = " ".join(part for part in buf if part)
        buf = []
        keyword, _, rest = joined.partition(" ")
        out.append(Instruction(start, keyword.upper(), rest.strip(), joined))
    if buf:
        raise BuildError(f"{path}: the file ends inside a continued instruction (line {start})")
    return out


def exec_form(ins: Instruction) -> list[str]:
    try:
        value = json.loads(ins.rest)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BuildError(
            f"line {ins.line}: {ins.keyword} must use the exec (JSON array) form: shell form needs a "
            f"shell, which these images do not have: {ins.original}"
        )
    return value


def key_values(ins: Instruction) -> list[tuple[str, str]]:
    if "$" in ins.rest:
        raise BuildError(f"line {ins.line}: variable substitution is not supported: {ins.original}")
    words = shlex.split(ins.rest, posix=True)
    if not words:
        raise BuildError(f"line {ins.line}: {ins.keyword} without arguments")
    if "=" not in words[0]:
        if ins.keyword != "ENV" or len(words) < 2:
            raise BuildError(f"line {ins.line}: expected key=value pairs: {ins.original}")
        # Legacy `ENV key value with spaces`.
        return [(words[0], ins.rest.split(None, 1)[1].strip())]
    pairs = []
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key:
            raise BuildError(f"line {ins.line}: expected key=value, got {word!r}: {ins.original}")
        pairs.append((key, value))
    return pairs


# --- the file system model ------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    kind: str  # "dir", "file", "symlink"
    mode: int  # permission bits, including setuid/setgid/sticky
    uid: int = 0
    gid: int = 0
    source: str | None = None  # host path of a file's content
    link: str | None = None  # symlink target
    inode: tuple[int, int] | None = None  # (st_dev, st_ino) of the source, to keep hard links


def norm(path: str) -> str:
    """An absolute, normalized path inside the image; "/" for the root."""
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        parts.append(part)
    return "/" + "/".join(parts)


def parent(path: str) -> str:
    return norm(path.rsplit("/", 1)[0] or "/")


def join(base: str, rel: str) -> str:
    return norm(base + "/" + rel)


class DockerIgnore:
    """The subset of .dockerignore this repository needs: globs (`*`, `?`, `**`), `!` exceptions,
    the last matching pattern wins, and a pattern that matches a directory matches what is under it."""

    def __init__(self, directory: str):
        self.rules: list[tuple[bool, re.Pattern[str]]] = []
        self.exceptions: list[list[str]] = []  # the `!` patterns, split into components
        path = os.path.join(directory, ".dockerignore")
        if not os.path.exists(path):
            return
        with open(path, encoding="utf-8") as f:
            for raw in f:
                line = raw.strip()
                if not line or line.startswith("#"):
                    continue
                negate = line.startswith("!")
                pattern = norm(line[1:] if negate else line).lstrip("/")
                self.rules.append((negate, re.compile(self._regex(pattern))))
                if negate:
                    self.exceptions.append(pattern.split("/"))

    @staticmethod
    def _regex(pattern: str) -> str:
        out, i = [], 0
        while i < len(pattern):
            c = pattern[i]
            if pattern.startswith("**", i):
                out.append(".*")
                i += 2
                continue
            if c == "*":
                out.append("[^/]*")
            elif c == "?":
                out.append("[^/]")
            elif c == "[":
                raise BuildError(f".dockerignore: character classes are not supported: {pattern}")
            else:
                out.append(re.escape(c))
            i += 1
        return "^" + "".join(out) + "$"

    def ignored(self, rel: str) -> bool:
        rel = rel.strip("/")
        if not rel:
            return False
        prefixes = []
        parts = rel.split("/")
        for n in range(1, len(parts) + 1):
            prefixes.append("/".join(parts[:n]))
        verdict = False
        for negate, regex in self.rules:
            if any(regex.match(p) for p in prefixes):
                verdict = not negate
        return verdict

    def may_contain_included(self, rel: str) -> bool:
        """Whether a walk must descend into ignored directory `rel`: an exception may name a path
        below it (so `*` plus `!target/.../spearlet` walks only down to the binary, not all target/)."""
        parts = rel.strip("/").split("/")
        for pattern in self.exceptions:
            for i, d in enumerate(parts):
                if i >= len(pattern) or pattern[i] == "**":
                    break
                if not re.match(self._regex(pattern[i]), d):
                    break
            else:
                if len(pattern) > len(parts) or "**" in pattern:
                    return True
                continue
            if i < len(pattern) and pattern[i] == "**":
                return True
        return False


class Source:
    """Where COPY reads from: a host directory (a context) or an earlier stage's file system."""

    def lookup(self, path: str) -> tuple[str, dict[str, Node]]:
        """The entries of `path` (followed if a symlink) keyed relative to it ("" for itself)."""
        raise NotImplementedError


class DirSource(Source):
    def __init__(self, name: str, directory: str, ignore: DockerIgnore | None = None):
        if not os.path.isdir(directory):
            raise BuildError(f"context {name}: {directory} is not a directory")
        self.name = name
        self.root = os.path.realpath(directory)
        self.ignore = ignore

    def _node(self, host: str, st: os.stat_result) -> Node:
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISDIR(st.st_mode):
            return Node("dir", mode)
        if stat.S_ISREG(st.st_mode):
            return Node("file", mode, source=host, inode=(st.st_dev, st.st_ino))
        if stat.S_ISLNK(st.st_mode):
            return Node("symlink", 0o777, link=os.readlink(host))
        raise BuildError(f"context {self.name}: {host} is neither a file, a directory nor a symlink")

    def lookup(self, path: str) -> tuple[str, dict[str, Node]]:
        rel = norm(path).lstrip("/")
        host = os.path.join(self.root, rel) if rel else self.root
        real = os.path.realpath(host)
        if real != self.root and not real.startswith(self.root + "/"):
            raise BuildError(f"context {self.name}: {path} leads outside the context")
        if self.ignore and self.ignore.ignored(rel) and not os.path.isdir(real):
            raise BuildError(f"context {self.name}: {path} is excluded by .dockerignore")
        try:
            st = os.stat(real)
        except FileNotFoundError:
            raise BuildError(f"context {self.name}: {path} does not exist ({host})") from None
        entries = {"": self._node(real, st)}
        if entries[""].kind == "dir":
            self._walk(real, rel, "", entries)
            if self.ignore and self.ignore.ignored(rel) and len(entries) == 1:
                raise BuildError(f"context {self.name}: {path} is excluded by .dockerignore")
        return real, entries

    def _walk(self, host_dir: str, ctx_rel: str, rel: str, entries: dict[str, Node]) -> None:
        with os.scandir(host_dir) as it:
            children = sorted(it, key=lambda e: e.name)
        for child in children:
            child_rel = f"{rel}/{child.name}" if rel else child.name
            child_ctx = f"{ctx_rel}/{child.name}" if ctx_rel else child.name
            st = child.stat(follow_symlinks=False)
            ignored = self.ignore is not None and self.ignore.ignored(child_ctx)
            if stat.S_ISDIR(st.st_mode):
                if ignored and not self.ignore.may_contain_included(child_ctx):
                    continue
                before = len(entries)
                entries[child_rel] = self._node(child.path, st)
                self._walk(child.path, child_ctx, child_rel, entries)
                if ignored and len(entries) == before + 1:
                    del entries[child_rel]  # an ignored directory with nothing included below
                continue
            if ignored:
                continue
            entries[child_rel] = self._node(child.path, st)


class StageSource(Source):
    def __init__(self, name: str, fs: dict[str, Node]):
        self.name = name
        self.fs = fs

    def resolve(self, path: str, depth: int = 0) -> str:
        if depth > 40:
            raise BuildError(f"stage {self.name}: too many levels of symlinks at {path}")
        path = norm(path)
        node = self.fs.get(path)
        if node is None:
            raise BuildError(f"stage {self.name}: {path} does not exist")
        if node.kind == "symlink":
            target = node.link if node.link.startswith("/") else join(parent(path), node.link)
            return self.resolve(target, depth + 1)
        return path

    def lookup(self, path: str) -> tuple[str, dict[str, Node]]:
        root = self.resolve(path)
        entries = {"": self.fs[root]}
        if entries[""].kind == "dir":
            prefix = "" if root == "/" else root
            for p, node in self.fs.items():
                if p.startswith(prefix + "/") and p != "/":
                    entries[p[len(prefix) + 1 :]] = node
        return root, entries


# --- building a stage -----------------------------------------------------------------------------


@dataclass
class Layer:
    entries: dict[str, Node]  # image path -> node, everything this layer writes
    created_by: str


@dataclass
class Stage:
    name: str | None
    index: int
    fs: dict[str, Node] = field(default_factory=lambda: {"/": Node("dir", 0o755)})
    layers: list[Layer] = field(default_factory=list)
    config: dict = field(default_factory=lambda: {"Env": [DEFAULT_PATH]})
    history: list[dict] = field(default_factory=list)


def parse_owner(value: str, line: int) -> tuple[int, int]:
    user, _, group = value.partition(":")
    if not user.isdigit() or (group and not group.isdigit()):
        raise BuildError(f"line {line}: --chown must be numeric uid[:gid] (no /etc/passwd lookups): {value}")
    return int(user), int(group or user)


def copy(stage: Stage, ins: Instruction, contexts: dict[str, Source], stages: dict[str, Stage],
         main: Source) -> None:
    if "$" in ins.rest:
        raise BuildError(f"line {ins.line}: variable substitution is not supported: {ins.original}")
    words = shlex.split(ins.rest, posix=True)
    flags: dict[str, str] = {}
    while words and words[0].startswith("--"):
        key, sep, value = words.pop(0)[2:].partition("=")
        if key not in ("from", "chown", "chmod") or not sep or key in flags:
            raise BuildError(f"line {ins.line}: unsupported COPY flag --{key}: {ins.original}")
        flags[key] = value
    if words and words[0].startswith("["):
        raise BuildError(f"line {ins.line}: the JSON form of COPY is not supported: {ins.original}")
    if len(words) < 2:
        raise BuildError(f"line {ins.line}: COPY needs a source and a destination: {ins.original}")
    *sources, dest = words
    for s in sources:
        if any(c in s for c in "*?["):
            raise BuildError(f"line {ins.line}: wildcards are not supported: {s}")

    name = flags.get("from")
    if name is None:
        source = main
    elif name in contexts:
        source = contexts[name]
    elif name in stages:
        source = StageSource(name, stages[name].fs)
    else:
        raise BuildError(f"line {ins.line}: no context or earlier stage named {name!r} "
                         f"(pass --context {name}=DIR)")
    uid, gid = parse_owner(flags["chown"], ins.line) if "chown" in flags else (0, 0)
    chmod = None
    if "chmod" in flags:
        if not re.fullmatch(r"[0-7]{3,4}", flags["chmod"]):
            raise BuildError(f"line {ins.line}: --chmod must be octal: {flags['chmod']}")
        chmod = int(flags["chmod"], 8)

    into_dir = dest.endswith("/") or len(sources) > 1
    dest = norm(dest if dest.startswith("/") else join(stage.config.get("WorkingDir", "/"), dest))
    if dest in stage.fs and stage.fs[dest].kind == "dir":
        into_dir = True
    written: dict[str, Node] = {}

    def put(path: str, node: Node) -> None:
        old = stage.fs.get(path)
        if old is not None and (old.kind == "dir") != (node.kind == "dir"):
            raise BuildError(f"line {ins.line}: COPY would replace {old.kind} {path} by a {node.kind}")
        written[path] = node

    def ensure_parents(path: str) -> None:
        chain = []
        p = parent(path)
        while p != "/":
            chain.append(p)
            p = parent(p)
        for p in reversed(chain):
            existing = written.get(p) or stage.fs.get(p)
            if existing is None:
                written[p] = Node("dir", 0o755, uid, gid)
            elif existing.kind != "dir":
                raise BuildError(f"line {ins.line}: {p} is a {existing.kind}, not a directory")
            else:
                written[p] = existing  # a diff carries the (unchanged) parent too

    for src in sources:
        _, entries = source.lookup(src)
        top = entries[""]
        if top.kind == "dir":
            base = dest
        else:
            base = join(dest, os.path.basename(norm(src))) if into_dir else dest
        for rel, node in sorted(entries.items()):
            target = join(base, rel) if rel else base
            if target == "/":
                continue  # the root's own metadata is not copied
            mode = node.mode if chmod is None or node.kind == "symlink" else chmod
            put(target, replace(node, mode=mode, uid=uid, gid=gid))
    for path in list(written):
        ensure_parents(path)
    if not written:
        raise BuildError(f"line {ins.line}: COPY copies nothing: {ins.original}")
    stage.fs.update(written)
    stage.layers.append(Layer(written, ins.original))
    stage.history.append({"created_by": ins.original})


def build_stage(instructions: list[Instruction], target: str, contexts: dict[str, Source],
                main: Source) -> Stage:
    """Builds `target` and, as BuildKit does, only the stages it copies from (a stage that a
    `--context` of the same name replaces is never built)."""
    blocks: list[tuple[Instruction, list[Instruction]]] = []
    for ins in instructions:
        if ins.keyword not in SUPPORTED:
            raise BuildError(f"line {ins.line}: {ins.keyword} is not supported by this builder "
                             f"(see hack/oci-image.py): {ins.original}")
        if ins.keyword == "FROM":
            words = ins.rest.split()
            if not words or words[0] != "scratch" or not (
                len(words) == 1 or (len(words) == 3 and words[1].upper() == "AS")
            ):
                raise BuildError(f"line {ins.line}: only `FROM scratch [AS name]` is supported: {ins.original}")
            blocks.append((ins, []))
        elif not blocks:
            raise BuildError(f"line {ins.line}: {ins.keyword} before the first FROM")
        else:
            blocks[-1][1].append(ins)
    names: dict[str, int] = {}
    for index, (ins, _) in enumerate(blocks):
        words = ins.rest.split()
        if len(words) == 3:
            if words[2] in names:
                raise BuildError(f"line {ins.line}: a second stage named {words[2]}")
            names[words[2]] = index
    if target not in names:
        raise BuildError(f"no stage named {target!r}")
    built: dict[str, Stage] = {}

    def build(name: str, chain: tuple[str, ...]) -> Stage:
        if name in built:
            return built[name]
        index = names[name]
        stage = Stage(name, index)
        for ins in blocks[index][1]:
            apply(stage, ins, chain + (name,))
        built[name] = stage
        return stage

    def apply(stage: Stage, ins: Instruction, chain: tuple[str, ...]) -> None:
        if ins.keyword == "COPY":
            source_name = re.search(r"--from=(\S+)", ins.rest)
            if source_name and source_name.group(1) not in contexts and source_name.group(1) in names:
                dep = source_name.group(1)
                if dep in chain or names[dep] >= stage.index:
                    raise BuildError(f"line {ins.line}: --from={dep} must name an earlier stage")
                build(dep, chain)
            copy(stage, ins, contexts, built, main)
            return
        if ins.keyword in ("ENTRYPOINT", "CMD"):
            stage.config["Entrypoint" if ins.keyword == "ENTRYPOINT" else "Cmd"] = exec_form(ins)
        elif ins.keyword == "USER":
            if "$" in ins.rest or not ins.rest or " " in ins.rest:
                raise BuildError(f"line {ins.line}: USER takes one literal user[:group]: {ins.original}")
            stage.config["User"] = ins.rest
        elif ins.keyword == "ENV":
            env = stage.config.setdefault("Env", [])
            for key, value in key_values(ins):
                env[:] = [e for e in env if e.split("=", 1)[0] != key] + [f"{key}={value}"]
        elif ins.keyword == "LABEL":
            stage.config.setdefault("Labels", {}).update(dict(key_values(ins)))
        elif ins.keyword == "WORKDIR":
            if "$" in ins.rest:
                raise BuildError(f"line {ins.line}: variable substitution is not supported: {ins.original}")
            path = norm(ins.rest if ins.rest.startswith("/") else
                        join(stage.config.get("WorkingDir", "/"), ins.rest))
            node = stage.fs.get(path)
            if node is None or node.kind != "dir":
                raise BuildError(f"line {ins.line}: WORKDIR {path} must be a directory the stage already "
                                 f"has (COPY it first; this builder does not create it)")
            stage.config["WorkingDir"] = path
        stage.history.append({"created_by": ins.original, "empty_layer": True})

    return build(target, ())


# --- writing the archive --------------------------------------------------------------------------


def tarinfo(path: str, node: Node) -> tarfile.TarInfo:
    info = tarfile.TarInfo(path.lstrip("/"))
    info.mode = node.mode
    info.uid, info.gid = node.uid, node.gid
    info.uname = info.gname = ""
    info.mtime = 0
    if node.kind == "dir":
        info.type = tarfile.DIRTYPE
    elif node.kind == "symlink":
        info.type = tarfile.SYMTYPE
        info.linkname = node.link
    else:
        info.type = tarfile.REGTYPE
    return info


def write_layer(layer: Layer, out: str) -> str:
    """Writes the layer tar to `out`; returns its sha256 (the diff ID)."""
    seen: dict[tuple[int, int], str] = {}
    with open(out, "wb") as raw:
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(layer.entries):
                node = layer.entries[path]
                info = tarinfo(path, node)
                if node.kind != "file":
                    tar.addfile(info)
                    continue
                first = seen.get(node.inode) if node.inode else None
                if first is not None:
                    info.type = tarfile.LNKTYPE
                    info.linkname = first
                    tar.addfile(info)
                    continue
                if node.inode:
                    seen[node.inode] = info.name
                with open(node.source, "rb") as f:
                    info.size = os.fstat(f.fileno()).st_size
                    tar.addfile(info, f)
    return oci_layout.sha256_file(out)


def add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.uname, info.gname = len(data), 0o644, 0, "", ""
    tar.addfile(info, io.BytesIO(data))


def write_layers(stage: Stage, tmp: str) -> list[tuple[str, str]]:
    """Writes each layer's tar under `tmp`; returns (path, diff_id) pairs."""
    out = []
    for i, layer in enumerate(stage.layers):
        path = os.path.join(tmp, f"{i}.tar")
        print(f"oci-image: layer {i + 1}/{len(stage.layers)}: {layer.created_by}", file=sys.stderr)
        out.append((path, f"sha256:{write_layer(layer, path)}"))
    return out


def image_config(stage: Stage, labels: dict[str, str]) -> dict:
    """The image config without platform and rootfs; no dates, so the same inputs give the same ID."""
    config = dict(stage.config)
    if labels:
        config["Labels"] = {**config.get("Labels", {}), **labels}
    return {"config": config, "history": stage.history}


def write_archive(stage: Stage, tag: str, output: str, labels: dict[str, str]) -> str:
    out_dir = os.path.dirname(os.path.abspath(output))
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".oci-image-") as tmp:
        layers = write_layers(stage, tmp)
        paths = [path for path, _ in layers]
        digests = [diff_id.split(":", 1)[1] for _, diff_id in layers]
        config = {
            "architecture": "amd64",
            "os": "linux",
            **image_config(stage, labels),
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{d}" for d in digests]},
        }
        config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
        image_id = hashlib.sha256(config_bytes).hexdigest()
        manifest = [{"Config": f"{image_id}.json", "RepoTags": [tag],
                     "Layers": [f"{d}/layer.tar" for d in digests]}]
        partial = os.path.join(tmp, "image.tar")
        with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
            done = set()
            for digest, path in zip(digests, paths):
                if digest in done:
                    continue
                done.add(digest)
                info = tarfile.TarInfo(digest)
                info.type, info.mode, info.mtime, info.uname, info.gname = tarfile.DIRTYPE, 0o755, 0, "", ""
                tar.addfile(info)
                info = tarfile.TarInfo(f"{digest}/layer.tar")
                info.size, info.mode, info.mtime, info.uname, info.gname = os.path.getsize(path), 0o644, 0, "", ""
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            add_bytes(tar, f"{image_id}.json", config_bytes)
            add_bytes(tar, "manifest.json", json.dumps(manifest, separators=(",", ":")).encode())
        os.replace(partial, output)
    return f"sha256:{image_id}"


# --- verification ---------------------------------------------------------------------------------


def verify(path: str) -> str:
    """Checks a docker-archive: manifest, config and layer digests agree. Returns a summary."""
    with tarfile.open(path) as tar:
        names = set(tar.getnames())

        def read(name: str) -> bytes:
            if name not in names:
                raise BuildError(f"{path}: {name} is missing")
            return tar.extractfile(name).read()

        manifest = json.loads(read("manifest.json"))
        if not isinstance(manifest, list) or len(manifest) != 1:
            raise BuildError(f"{path}: manifest.json must list one image")
        entry = manifest[0]
        config_bytes = read(entry["Config"])
        config = json.loads(config_bytes)
        image_id = hashlib.sha256(config_bytes).hexdigest()
        if entry["Config"] != f"{image_id}.json":
            raise BuildError(f"{path}: config name {entry['Config']} is not its sha256 {image_id}")
        if (config.get("architecture"), config.get("os")) != ("amd64", "linux"):
            raise BuildError(f"{path}: not linux/amd64")
        diff_ids = config["rootfs"]["diff_ids"]
        if config["rootfs"].get("type") != "layers" or len(diff_ids) != len(entry["Layers"]):
            raise BuildError(f"{path}: {len(entry['Layers'])} layers but {len(diff_ids)} diff_ids")
        non_empty = [h for h in config.get("history", []) if not h.get("empty_layer")]
        if len(non_empty) != len(diff_ids):
            raise BuildError(f"{path}: history names {len(non_empty)} layers, rootfs {len(diff_ids)}")
        files = 0
        for layer, diff_id in zip(entry["Layers"], diff_ids):
            h = hashlib.sha256()
            member = tar.extractfile(layer)
            data = member.read()
            h.update(data)
            if f"sha256:{h.hexdigest()}" != diff_id:
                raise BuildError(f"{path}: {layer} has sha256 {h.hexdigest()}, config says {diff_id}")
            with tarfile.open(fileobj=io.BytesIO(data)) as inner:
                members = inner.getmembers()
                order = [m.name for m in members]
                if order != sorted(order):
                    raise BuildError(f"{path}: {layer} entries are not sorted")
                for m in members:
                    if m.mtime != 0 or m.name.startswith(("/", "./")) or ".." in m.name.split("/"):
                        raise BuildError(f"{path}: {layer}: bad entry {m.name}")
                files += len(members)
        c = config["config"]
        return (f"{path}: OK {entry['RepoTags']} id sha256:{image_id[:12]} layers {len(diff_ids)} "
                f"entries {files} user {c.get('User')!r} entrypoint {c.get('Entrypoint')} cmd {c.get('Cmd')}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", "-f", default=None, help="the Dockerfile (default: ../Dockerfile from here)")
    ap.add_argument("--target", help="the stage to build")
    ap.add_argument("--context", action="append", default=[], metavar="NAME=DIR",
                    help="a named build context, as docker build --build-context NAME=DIR")
    ap.add_argument("--main-context", help="the context of COPY without --from (default: the Dockerfile's directory)")
    ap.add_argument("--tag", help="the image's name:tag in the archive")
    ap.add_argument("--output", "-o", help="the docker-archive tar to write (linux/amd64)")
    ap.add_argument("--oci-layout", metavar="DIR",
                    help="add the image to this OCI image layout instead, for --platform (see hack/oci_layout.py)")
    ap.add_argument("--oci-archive", metavar="TAR",
                    help="with --oci-layout: also write the layout as one tar (for `ctr images import`)")
    ap.add_argument("--platform", default="linux/amd64", help="with --oci-layout: linux/amd64 or linux/arm64")
    ap.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                    help="an image config label (and, with --oci-layout, a manifest annotation)")
    ap.add_argument("--verify", nargs="+", metavar="PATH",
                    help="check docker-archive tars or OCI layout directories instead of building")
    args = ap.parse_args()
    try:
        if args.verify:
            for path in args.verify:
                print(oci_layout.verify(path) if os.path.isdir(path) else verify(path))
            return 0
        if not (args.target and args.tag and (args.output or args.oci_layout)):
            ap.error("--target, --tag and --output or --oci-layout are required to build")
        if args.oci_archive and not args.oci_layout:
            ap.error("--oci-archive needs --oci-layout")
        if args.output and args.oci_layout:
            ap.error("--output and --oci-layout exclude each other")
        if args.output and args.platform != "linux/amd64":
            ap.error("a docker-archive (--output) is linux/amd64; use --oci-layout for other platforms")
        oci_layout.platform(args.platform)
        labels = {}
        for spec in args.label:
            key, sep, value = spec.partition("=")
            if not sep or not key:
                ap.error(f"--label wants KEY=VALUE, got {spec!r}")
            labels[key] = value
        dockerfile = args.file or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "Dockerfile")
        with open(dockerfile, encoding="utf-8") as f:
            instructions = parse_dockerfile(f.read(), dockerfile)
        contexts: dict[str, Source] = {}
        for spec in args.context:
            name, sep, directory = spec.partition("=")
            if not sep or not name or not directory:
                ap.error(f"--context wants NAME=DIR, got {spec!r}")
            contexts[name] = DirSource(name, directory)
        main_dir = args.main_context or os.path.dirname(os.path.abspath(dockerfile))
        main_source = DirSource("(main)", main_dir, DockerIgnore(main_dir))
        stage = build_stage(instructions, args.target, contexts, main_source)
        if args.oci_layout:
            os.makedirs(args.oci_layout, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=args.oci_layout, prefix=".oci-image-") as tmp:
                layers = write_layers(stage, tmp)
                print(oci_layout.write_platform(args.oci_layout, args.tag, args.platform,
                                                image_config(stage, labels), layers, labels))
            if args.oci_archive:
                oci_layout.write_tar(args.oci_layout, args.oci_archive)
        else:
            print(write_archive(stage, args.tag, args.output, labels))
        return 0
    except (BuildError, oci_layout.LayoutError) as e:
        print(f"oci-image: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
