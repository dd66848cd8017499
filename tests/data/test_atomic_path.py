"""`atomic_path` on a link: the link's target is replaced, the link stays a link."""

from __future__ import annotations

from pathlib import Path

from libra_core.data.atomic import atomic_path


def test_writing_through_a_link_replaces_its_target_and_keeps_the_link(tmp_path: Path) -> None:
    target = tmp_path / "data" / "file.txt"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    chain = tmp_path / "chain.txt"
    chain.symlink_to(link)  # a link to a link: the file at the end is the one written
    with atomic_path(chain) as tmp:
        tmp.write_text("new")
    assert target.read_text() == "new"
    assert chain.is_symlink() and link.is_symlink() and chain.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chain.txt", "data", "link.txt"]
    assert [p.name for p in target.parent.iterdir()] == ["file.txt"]  # no temp file left


def test_writing_a_plain_path_is_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "f.txt"
    with atomic_path(path) as tmp:
        tmp.write_text("x")
    assert path.read_text() == "x" and not path.is_symlink()
