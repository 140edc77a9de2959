"""The compiled parts built at first use (``agents.native``): the cache directory's rules, one
build per source and command, a rebuild when a source changes, one compile when processes race,
and errors that name the missing compiler, header or library and the Debian package."""
import os
import subprocess
import sys
import textwrap
from dataclasses import replace

import pytest

from agents import native
from agents.native import Native, NativeError, build, built, cache_dir
from lab import native as lab_native


@pytest.fixture
def part(tmp_path, monkeypatch):
    """A one-file part in a directory under ``tmp_path``, built into ``tmp_path/cache``."""
    src = tmp_path / "src" / "nslab_native_probe"
    src.mkdir(parents=True)
    (src / "answer.c").write_text("int answer(void) { return 42; }\n")
    monkeypatch.setenv("NSLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "_done", {})
    return Native("answer", "the answer library", "answers", str(src), ("answer.c",),
                  "libanswer.so")


def test_cache_dir_rules(monkeypatch):
    monkeypatch.setenv("NSLAB_CACHE", "/x/nslab")
    assert cache_dir() == "/x/nslab"
    monkeypatch.delenv("NSLAB_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", "/home/u/.cache")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert cache_dir() == "/home/u/.cache/nslab"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", "/home/u")
    assert cache_dir() == "/home/u/.cache/nslab"
    monkeypatch.setattr(os, "geteuid", lambda: 0)     # root: never a user's XDG dir (sudo -E)
    monkeypatch.setenv("XDG_CACHE_HOME", "/home/u/.cache")
    assert cache_dir() == "/var/cache/nslab"


def test_built_once_and_again_when_the_source_changes(part, tmp_path):
    assert built(part) is None
    path = build(part)
    assert path.startswith(str(tmp_path / "cache" / "answer-")) and built(part) == path
    mtime = os.path.getmtime(path)
    native._done.clear()
    assert build(part) == path and os.path.getmtime(path) == mtime      # cached
    (tmp_path / "src" / "nslab_native_probe" / "answer.c").write_text(
        "int answer(void) { return 43; }\n")
    native._done.clear()
    again = build(part)
    assert again != path and os.path.exists(path)     # a new key; the old build is left
    import ctypes
    assert ctypes.CDLL(again).answer() == 43


def test_processes_that_race_compile_it_once(part, tmp_path):
    """Eight processes build the part at once: one compiles, the others wait for its lock and
    take its file (its inode is the one every process reports)."""
    code = textwrap.dedent(f"""
        import os
        from agents.native import Native, build
        p = build(Native("answer", "x", "y", {str(tmp_path / "src" / "nslab_native_probe")!r},
                         ("answer.c",), "libanswer.so"))
        print(os.stat(p).st_ino)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
             for _ in range(8)]
    inodes = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs) and len(inodes) == 1
    assert [f for f in os.listdir(os.path.dirname(build(part))) if f != ".lock"] == [
        "libanswer.so"]                               # no temporary file left


def test_a_missing_compiler_is_named_with_its_package(part, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(NativeError, match="needs the compiler clang, which is not in PATH: "
                                          "apt-get install clang"):
        build(replace(part, compiler="clang"))


def test_a_missing_header_is_named_with_its_package(part, tmp_path):
    (tmp_path / "src" / "nslab_native_probe" / "answer.c").write_text(
        "#include <openssl/nslab-missing.h>\nint answer(void) { return 1; }\n")
    with pytest.raises(NativeError, match=r"the header openssl/nslab-missing.h is missing: "
                                          r"apt-get install libssl-dev"):
        build(part)
    (tmp_path / "src" / "nslab_native_probe" / "answer.c").write_text(
        "#include <nslab-missing.h>\nint answer(void) { return 1; }\n")
    with pytest.raises(NativeError, match="apt-get install libc6-dev"):
        build(part)
    with pytest.raises(NativeError, match="apt-get install libnslab-dev"):
        build(replace(part, packages={"nslab-missing.h": "libnslab-dev"}))


def test_a_missing_library_is_named_with_its_package(part):
    with pytest.raises(NativeError, match="the library -lnslabmissing is missing: apt-get "
                                          "install libnslab-dev"):
        build(replace(part, libs=("-lnslabmissing",),
                      packages={"-lnslabmissing": "libnslab-dev"}))
    assert native._package(part, "-lcrypto") == "libssl-dev"
    assert native._package(part, "bpf/bpf_helpers.h") == "libbpf-dev"


def test_other_compile_errors_show_the_compiler_output(part, tmp_path):
    (tmp_path / "src" / "nslab_native_probe" / "answer.c").write_text("int answer(void) {\n")
    with pytest.raises(NativeError, match=r"(?s)building the answer library failed \(gcc .*"
                                          r"answer\.c.*expected"):
        build(part)
    assert not [f for f in os.listdir(tmp_path / "cache" / os.listdir(tmp_path / "cache")[0])
                if f.startswith(".libanswer")]         # the temporary file removed


def test_every_part_compiles_without_warnings(tmp_path, monkeypatch):
    """The shipped sources compile clean with -Werror (a user's build does not use -Werror: a
    newer compiler's new warning must not stop a lab)."""
    monkeypatch.setenv("NSLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "_done", {})
    for part in lab_native.PARTS:
        assert build(replace(part, flags=(*part.flags, "-Werror")))
