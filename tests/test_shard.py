"""``--shard I/N`` (conftest.py): the selected tests split into N interleaved parts, each run
once, for a GPU suite longer than one call of a lent machine; ``I,J/N`` runs several parts."""
import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.fusion_independent  # the shard option, no fusion

PROGRAM = '''
import pytest


@pytest.mark.parametrize("i", range(7))
def test_case(i):
    pass

@pytest.mark.gpu
def test_on_gpu():
    pass
'''


def run(tmp_path, *options, keep=False):
    if not keep:   # the test's own program otherwise
        (tmp_path / "test_program.py").write_text(PROGRAM)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(__file__))  # shard_parts.py, loaded as a plugin
    return subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "shard_parts",
                           "-m", "not gpu", *options, "test_program.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_the_parts_run_every_selected_test_once(tmp_path):
    ran = []
    for index in range(3):
        done = run(tmp_path, "--shard", f"{index}/3")
        assert done.returncode == 0, done.stdout + done.stderr
        ran += re.findall(r"test_program.py::(\S+) PASSED", done.stdout)
    assert sorted(ran) == sorted(f"test_case[{i}]" for i in range(7))  # the gpu-marked test deselected first


def test_several_parts_run_together_are_their_union(tmp_path):
    """``--shard 0,2/3``: the first and third parts in one run (.ci/run's split over two cores)."""
    done = run(tmp_path, "--shard", "0,2/3")
    assert done.returncode == 0, done.stdout + done.stderr
    ran = re.findall(r"test_program.py::(\S+) PASSED", done.stdout)
    assert sorted(ran) == sorted(f"test_case[{i}]" for i in range(7) if i % 3 != 1)


def test_a_module_that_asks_to_stay_whole_runs_in_one_part(tmp_path):
    """A module with ``SHARD_WHOLE = True`` (its tests read what earlier ones recorded) runs in the
    part of its first test."""
    (tmp_path / "test_program.py").write_text(PROGRAM + "\nSHARD_WHOLE = True\n")
    counts = []
    for index in range(3):
        done = run(tmp_path, "--shard", f"{index}/3", keep=True)
        assert done.returncode in (0, 5), done.stdout + done.stderr   # 5: no test selected
        counts.append(len(re.findall(r"test_program.py::\S+ PASSED", done.stdout)))
    assert counts == [7, 0, 0]


def test_a_malformed_shard_says_what_it_takes(tmp_path):
    for shard, message in (("3/3", "0 <= I < N"), ("0,3/3", "0 <= I < N"), ("two", "takes I/N")):
        done = run(tmp_path, "--shard", shard)
        assert done.returncode != 0 and message in done.stdout + done.stderr
