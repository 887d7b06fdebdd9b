"""python -m fxflash explain script.py:function, on the example script."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "attention_variants.py")


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "fxflash", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)


@pytest.mark.parametrize("name", ["vanilla", "sliding_window", "GatedAttention"])
def test_explain_prints_the_fused_region_and_its_transformations(name):
    result = _cli("explain", f"{EXAMPLE}:{name}")
    assert result.returncode == 0, result.stderr
    assert "1 candidate region(s), 1 fused" in result.stdout
    for step in ("1. dimension demotion", "2. algebraic rewriting: passes over", "3. dimension elimination",
                 "memory traffic (estimate)"):
        assert step in result.stdout


@pytest.mark.fusion_independent
def test_explain_names_the_rule_that_refused_a_candidate():
    result = _cli("explain", f"{EXAMPLE}:softmax_over_queries")
    assert result.returncode == 0, result.stderr
    assert "0 fused" in result.stdout and "refused: chain discovery: amax reduces an axis other than the demoted" in result.stdout


def test_render_and_source(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "graph.svg"
    result = _cli("explain", f"{EXAMPLE}:vanilla", "--render", str(out), "--engine", "matplotlib", "--source")
    assert result.returncode == 0, result.stderr
    assert "@triton.jit" in result.stdout and out.stat().st_size > 0


@pytest.mark.parametrize("target, message", [
    (f"{EXAMPLE}:nope", "defines no 'nope'; it defines: GatedAttention"),
    (f"{EXAMPLE}:main", "no example inputs for 'main'"),
    ("missing.py:f", "no such script"),
    (EXAMPLE, "expected path/to/script.py:function"),
])
@pytest.mark.fusion_independent
def test_mistakes_exit_2_with_what_to_do(target, message):
    result = _cli("explain", target)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.fusion_independent
@pytest.mark.parametrize("render, message", [("graph.jpg", "written as .svg or .png, not .jpg"),
                                             ("no/such/folder/graph.svg", "--render no/such/folder/graph.svg")])
def test_a_drawing_that_cannot_be_written_exits_2(render, message):
    """An unknown format is refused before anything is traced; a file that cannot be written
    (no such folder) is said in one line: exit status 2, no traceback."""
    pytest.importorskip("matplotlib")
    result = _cli("explain", f"{EXAMPLE}:vanilla", "--render", render, "--engine", "matplotlib")
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
