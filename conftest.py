"""Test-suite policy: a skipped test is a check that did not run, so it fails the run unless the test is marked
`@pytest.mark.allow_skip` (for a reason the README names, e.g. needing a GPU). A missing package of
requirements-dev.txt therefore fails the suite instead of quietly switching a check off. A test that leaves a file
in the repository's folder (a default output path in the working directory) fails the run too."""
import os

import pytest
import torch


def assert_close_ulps(actual, expected, ulps=16):
    """actual equals expected up to `ulps` units in the last place of their dtype at expected's largest magnitude.
    For the same numbers computed by different kernels (other shapes, another code path, thread count or CPU), which
    may round differently in the last bits; the same kernels on the same shapes are compared with torch.equal."""
    tol = ulps * torch.finfo(expected.dtype).eps * expected.detach().abs().max().item()
    torch.testing.assert_close(actual, expected, rtol=0, atol=tol)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread, and do not fight other processes for the cores
    (a test module opts in with `pytestmark = pytest.mark.usefixtures("one_thread")`)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_configure(config):
    config.addinivalue_line("markers", "allow_skip: this test may skip (e.g. it needs a GPU)")


def pytest_sessionstart(session):
    session.config.files_before = set(os.listdir(session.config.rootpath))


def pytest_sessionfinish(session, exitstatus):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    left = set(os.listdir(session.config.rootpath)) - session.config.files_before - {".pytest_cache", "__pycache__"}
    if left and exitstatus == pytest.ExitCode.OK:
        reporter.write_line(f"FAILED: the tests left {', '.join(sorted(left))} in {session.config.rootpath}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    skipped = [r for r in (reporter.stats.get("skipped", []) if reporter else [])
               if "allow_skip" not in getattr(r, "keywords", {})]
    if skipped and exitstatus == pytest.ExitCode.OK:
        reporter.write_line(f"FAILED: {len(skipped)} test(s) skipped without @pytest.mark.allow_skip:", red=True)
        for r in skipped:
            reporter.write_line(f"  {r.nodeid}: {r.longrepr[-1] if isinstance(r.longrepr, tuple) else r.longrepr}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
