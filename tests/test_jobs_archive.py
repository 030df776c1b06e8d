"""What a driver on a cluster master ships to its executors: jobs/ as a zip (--py-files)."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from controlplane.supervision import launcher


def test_cluster_drivers_ship_the_job_code_as_one_importable_archive(settings, tmp_path):
    settings.CONTROLPLANE_RUNS_ROOT = tmp_path / "runs"
    archive = launcher.jobs_archive()
    assert launcher.jobs_archive() == archive  # built once per content
    names = zipfile.ZipFile(archive).namelist()
    assert {"jobs/__init__.py", "jobs/run.py", "jobs/kafka/__init__.py"} <= set(names)
    assert not [n for n in names if "__pycache__" in n or not n.endswith(".py")]
    # Importable from the archive alone, as an executor's Python worker does (elsewhere):
    # no site-packages (whose .pth may name this checkout), only the archive on the path.
    found = subprocess.run(
        [sys.executable, "-S", "-c", "import jobs.files; print(jobs.files.__file__)"],
        env={"PYTHONPATH": str(archive)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert found.strip() == f"{archive}/jobs/files.py"

    assert launcher._python_files("local[2,4]") == []  # Python workers find it as the driver
    assert launcher._python_files("spark://127.0.0.1:7077") == ["--py-files", str(archive)]
