"""Secrets in a fleet's files (controlplane.fleet.secrets; pure): references only, an
environment variable with the configured prefix, or a file of the secret store (a mounted
Kubernetes Secret's links followed, never out of it)."""

from __future__ import annotations

import os

import pytest

from controlplane.fleet.secrets import Store, Unresolved, check, fingerprint, read


def test_environment_references_need_the_prefix():
    store = Store(
        environ={"FLEET_SECRET_PG": "pw", "DATABASE_URL": "postgresql://x"}, prefix="FLEET_SECRET_"
    )
    assert read({"env": "FLEET_SECRET_PG"}, store) == "pw"
    with pytest.raises(Unresolved, match="does not begin with 'FLEET_SECRET_'"):
        read({"env": "DATABASE_URL"}, store)
    with pytest.raises(Unresolved, match="is not set in the control plane's environment"):
        read({"env": "FLEET_SECRET_NONE"}, store)
    assert check("hunter2", store).startswith("must be a reference")
    assert check({"env": "X", "file": "y"}, store).startswith("must be a reference")
    assert check({"file": "x"}, store) == (
        "file: this control plane has no secret store (CONTROLPLANE_FLEET_SECRETS_DIR)"
    )


def test_files_of_a_mounted_secret_volume_are_read_and_nothing_outside_it(tmp_path):
    store_dir = tmp_path / "store"
    (store_dir / "..data").mkdir(parents=True)
    (store_dir / "..data" / "pg-password").write_text("s3cret\n")
    os.symlink("..data/pg-password", store_dir / "pg-password")  # as Kubernetes mounts them
    (tmp_path / "outside").write_text("not yours")
    os.symlink(tmp_path / "outside", store_dir / "escape")
    os.mkfifo(store_dir / "fifo")
    store = Store(environ={}, prefix="FLEET_SECRET_", directory=str(store_dir))
    assert read({"file": "pg-password"}, store) == "s3cret"  # one trailing line break dropped
    with pytest.raises(Unresolved, match="leads outside the secret store"):
        read({"file": "escape"}, store)
    with pytest.raises(Unresolved, match="is not a file"):
        read({"file": "fifo"}, store)  # never waits on a writer
    with pytest.raises(Unresolved, match="is not a secret's name"):
        read({"file": "../outside"}, store)
    with pytest.raises(Unresolved, match="is not in the secret store"):
        read({"file": "missing"}, store)
    assert fingerprint({}) == "" and fingerprint({"a": "1"}) != fingerprint({"a": "2"})
