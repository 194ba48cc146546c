"""The embedded Ray's private temp tree (workers/raysetup.py): private, and short enough
for Ray's Unix sockets wherever $TMPDIR is."""

import os
import stat

from aoti_farm.workers import raysetup


def _longest_socket(tree: str) -> str:
    # Ray's longest socket under its temp tree, with the longest pid Linux gives
    return os.path.join(tree, "session_2026-11-27_20-54-20_721243_4194304", "sockets", "plasma_store")


def test_a_deep_tmpdir_moves_the_tree_to_tmp_so_rays_sockets_fit(tmp_path):
    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    tree = raysetup.private_ray_tmp(str(deep))
    try:
        assert len(_longest_socket(tree)) <= raysetup.SOCKET_PATH_MAX
        assert os.path.dirname(os.path.dirname(tree)) == "/tmp"
        st = os.stat(os.path.dirname(tree))
        assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
    finally:
        os.rmdir(os.path.dirname(tree))


def test_a_short_tmpdir_keeps_the_tree_there(tmp_path):
    base = "/tmp/x" if len(str(tmp_path)) + raysetup.RAY_SOCKET_TAIL > raysetup.SOCKET_PATH_MAX else str(tmp_path)
    os.makedirs(base, exist_ok=True)
    tree = raysetup.private_ray_tmp(base)
    try:
        assert os.path.dirname(os.path.dirname(tree)) == base
        assert len(_longest_socket(tree)) <= raysetup.SOCKET_PATH_MAX
        assert stat.S_IMODE(os.stat(os.path.dirname(tree)).st_mode) == 0o700
    finally:
        os.rmdir(os.path.dirname(tree))


def test_the_actors_get_the_key_files_absolute_path(tmp_path, monkeypatch):
    """The embedded Ray's workers run in the farm's private directory (spawn.private_cwd),
    so a key file named relative to the driver's working directory is handed on absolute."""
    from types import SimpleNamespace

    monkeypatch.chdir(tmp_path)
    cfg = SimpleNamespace(signing_key_file="fleet.key")
    cache = SimpleNamespace(signing_key=b"k")
    assert raysetup._key_file(cfg, cache) == str(tmp_path / "fleet.key")
    assert raysetup._key_file(cfg, SimpleNamespace(signing_key=None)) is None


def test_ray_init_runs_in_the_private_directory_and_the_driver_returns(tmp_path, monkeypatch):
    from aoti_farm.startup import spawn

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    with spawn.private_cwd() as d:
        assert os.getcwd() == d and d.startswith(str(tmp_path / "xdg"))
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert os.getcwd() == str(tmp_path)
